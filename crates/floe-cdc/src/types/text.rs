//! Postgres text-format values (pgoutput tuples, Debezium's text forms) → one scalar
//! appended to its Arrow builder; and one-dimensional array literals split into elements.
//!
//! Errors are a `String` naming the value only: the caller adds the table, column and fault.

use arrow_array::builder::{
    ArrayBuilder, BooleanBuilder, Date32Builder, Decimal128Builder, FixedSizeBinaryBuilder,
    Float32Builder, Float64Builder, Int32Builder, Int64Builder, LargeBinaryBuilder, StringBuilder,
    Time64MicrosecondBuilder, TimestampMicrosecondBuilder,
};
use chrono::{DateTime, Datelike, NaiveDate, NaiveDateTime, NaiveTime, Timelike};

use super::Scalar;

pub(super) fn utf8(text: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(text).map_err(|_| "not UTF-8".to_string())
}

fn parse<T: std::str::FromStr>(text: &[u8]) -> Result<T, String> {
    let s = utf8(text)?;
    s.parse().map_err(|_| format!("{s:?} is not a valid value"))
}

const UNIX_EPOCH_DAYS_CE: i32 = 719_163;

fn parse_date(s: &str) -> Result<i32, String> {
    let (s, bc) = match s.strip_suffix(" BC") {
        Some(rest) => (rest, true),
        None => (s, false),
    };
    let mut date = NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .map_err(|_| format!("{s:?} is not a date Iceberg can hold"))?;
    if bc {
        // 1 BC is year 0 in the proleptic calendar.
        date = date
            .with_year(1 - date.year())
            .ok_or_else(|| format!("{s:?} BC is out of range"))?;
    }
    Ok(date.num_days_from_ce() - UNIX_EPOCH_DAYS_CE)
}

fn parse_time(s: &str) -> Result<i64, String> {
    let t =
        NaiveTime::parse_from_str(s, "%H:%M:%S%.f").map_err(|_| format!("{s:?} is not a time"))?;
    Ok(t.num_seconds_from_midnight() as i64 * 1_000_000 + (t.nanosecond() / 1_000) as i64)
}

fn parse_timestamp(s: &str) -> Result<i64, String> {
    if s.ends_with(" BC") || s.contains("infinity") {
        return Err(format!("{s:?} is not a timestamp Iceberg can hold"));
    }
    NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f")
        .map(|t| t.and_utc().timestamp_micros())
        .map_err(|_| format!("{s:?} is not a timestamp"))
}

fn parse_timestamptz(s: &str) -> Result<i64, String> {
    if s.ends_with(" BC") || s.contains("infinity") {
        return Err(format!("{s:?} is not a timestamp Iceberg can hold"));
    }
    DateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f%#z")
        .map(|t| t.timestamp_micros())
        .map_err(|_| format!("{s:?} is not a timestamp with time zone"))
}

/// `123.45` at scale 2 → 12345; more fractional digits than the scale are refused (Postgres
/// already rounded to the column's scale, so they never arrive).
fn parse_decimal(s: &str, scale: i8) -> Result<i128, String> {
    let bad = || format!("{s:?} is not a decimal of scale {scale}");
    let (negative, digits) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    if whole.is_empty() && fraction.is_empty()
        || fraction.len() > scale.max(0) as usize
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let mut value: i128 = 0;
    for b in whole.bytes().chain(fraction.bytes()) {
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add((b - b'0') as i128))
            .ok_or_else(bad)?;
    }
    for _ in fraction.len()..scale.max(0) as usize {
        value = value.checked_mul(10).ok_or_else(bad)?;
    }
    Ok(if negative { -value } else { value })
}

fn parse_hex(s: &str) -> Result<Vec<u8>, String> {
    let hex = s
        .strip_prefix("\\x")
        .ok_or_else(|| "bytea is not in hex output format".to_string())?;
    if hex.len() % 2 != 0 {
        return Err("odd number of hex digits".into());
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|_| "bad hex digit".to_string()))
        .collect()
}

fn parse_uuid(s: &str) -> Result<[u8; 16], String> {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    let bytes = parse_hex(&format!("\\x{hex}")).map_err(|_| format!("{s:?} is not a uuid"))?;
    bytes.try_into().map_err(|_| format!("{s:?} is not a uuid"))
}

/// Appends one scalar value in text format (`None` = NULL) to the builder made for `scalar`.
pub(super) fn append_scalar(
    scalar: Scalar,
    builder: &mut dyn ArrayBuilder,
    text: Option<&[u8]>,
) -> Result<(), String> {
    match scalar {
        Scalar::Bool => {
            let b = downcast!(builder, BooleanBuilder);
            match text {
                None => b.append_null(),
                Some(b"t") => b.append_value(true),
                Some(b"f") => b.append_value(false),
                Some(other) => return Err(format!("{:?} is not a boolean", utf8(other)?)),
            }
        }
        Scalar::Int => {
            let b = downcast!(builder, Int32Builder);
            b.append_option(text.map(parse::<i32>).transpose()?)
        }
        Scalar::Long => {
            let b = downcast!(builder, Int64Builder);
            b.append_option(text.map(parse::<i64>).transpose()?)
        }
        Scalar::Float => {
            let b = downcast!(builder, Float32Builder);
            b.append_option(text.map(parse::<f32>).transpose()?)
        }
        Scalar::Double => {
            let b = downcast!(builder, Float64Builder);
            b.append_option(text.map(parse::<f64>).transpose()?)
        }
        Scalar::Decimal { scale, .. } => {
            let b = downcast!(builder, Decimal128Builder);
            b.append_option(
                text.map(|t| utf8(t).and_then(|s| parse_decimal(s, scale)))
                    .transpose()?,
            )
        }
        Scalar::Text => {
            let b = downcast!(builder, StringBuilder);
            b.append_option(text.map(utf8).transpose()?)
        }
        Scalar::Bytes => {
            let b = downcast!(builder, LargeBinaryBuilder);
            b.append_option(text.map(|t| utf8(t).and_then(parse_hex)).transpose()?)
        }
        Scalar::Date => {
            let b = downcast!(builder, Date32Builder);
            b.append_option(text.map(|t| utf8(t).and_then(parse_date)).transpose()?)
        }
        Scalar::Time => {
            let b = downcast!(builder, Time64MicrosecondBuilder);
            b.append_option(text.map(|t| utf8(t).and_then(parse_time)).transpose()?)
        }
        Scalar::Timestamp => {
            let b = downcast!(builder, TimestampMicrosecondBuilder);
            b.append_option(
                text.map(|t| utf8(t).and_then(parse_timestamp))
                    .transpose()?,
            )
        }
        Scalar::Timestamptz => {
            let b = downcast!(builder, TimestampMicrosecondBuilder);
            b.append_option(
                text.map(|t| utf8(t).and_then(parse_timestamptz))
                    .transpose()?,
            )
        }
        Scalar::Uuid => {
            let b = downcast!(builder, FixedSizeBinaryBuilder);
            match text {
                None => b.append_null(),
                Some(t) => b
                    .append_value(parse_uuid(utf8(t)?)?)
                    .map_err(|e| e.to_string())?,
            }
        }
    }
    Ok(())
}

/// Splits a one-dimensional array literal (`{1,NULL,"a,b"}`) into its elements; `None` is a
/// NULL element.
pub fn split_array(text: &str) -> Result<Vec<Option<String>>, String> {
    let bad = || format!("{text:?} is not a one-dimensional array");
    let inner = text
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .ok_or_else(bad)?;
    let mut out = Vec::new();
    if inner.is_empty() {
        return Ok(out);
    }
    let mut chars = inner.chars().peekable();
    loop {
        let mut element = String::new();
        let quoted = chars.peek() == Some(&'"');
        if quoted {
            chars.next();
            loop {
                match chars.next() {
                    Some('\\') => element.push(chars.next().ok_or_else(bad)?),
                    Some('"') => break,
                    Some(c) => element.push(c),
                    None => return Err(bad()),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ',' {
                    break;
                }
                if c == '{' {
                    return Err(bad());
                }
                element.push(c);
                chars.next();
            }
        }
        out.push((quoted || element != "NULL").then_some(element));
        match chars.next() {
            Some(',') => continue,
            None => break,
            Some(_) => return Err(bad()),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_times_and_decimals() {
        assert_eq!(parse_date("1970-01-02").unwrap(), 1);
        assert_eq!(parse_time("00:00:01.5").unwrap(), 1_500_000);
        assert_eq!(parse_decimal("-12.5", 2).unwrap(), -1250);
        assert!(parse_decimal("0.001", 2).is_err());
    }

    #[test]
    fn arrays_with_nulls_quotes_and_commas() {
        assert_eq!(
            split_array(r#"{1,NULL,"a,b","say \"hi\"","NULL"}"#).unwrap(),
            vec![
                Some("1".into()),
                None,
                Some("a,b".into()),
                Some("say \"hi\"".into()),
                Some("NULL".into())
            ]
        );
        assert!(split_array("{{1,2},{3,4}}").is_err());
    }

    #[test]
    fn bytea_and_uuid() {
        assert_eq!(parse_hex("\\x00ff").unwrap(), vec![0, 255]);
        assert_eq!(
            parse_uuid("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11").unwrap()[0],
            0xa0
        );
    }
}
