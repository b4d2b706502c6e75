//! A Debezium JSON value → the tuple value of its column: typed ([`Native`]) where the
//! encoding gives Arrow's form directly — Connect decimals, Debezium dates, times and integer
//! timestamps — else the Postgres text form of the column's type (arrays, zoned timestamps,
//! bytes, variable-scale decimals, plain values), parsed by the same column builder as the
//! Postgres source's. The TOAST placeholder becomes [`Value::Unchanged`].
//!
//! Errors are a `String` naming the value only: the caller adds the column and the fault (a
//! value that cannot be read refuses its record).

use base64::Engine;
use bytes::Bytes;
use chrono::{DateTime, NaiveTime, Timelike, Utc};
use serde_json::Value as Json;

use super::UNAVAILABLE;
use super::schema::DbzColumn;
use crate::pgoutput::Value;
use crate::types::{Native, Scalar};

/// How a column's JSON values are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Encoding {
    /// As the JSON value reads.
    Plain,
    /// Days since 1970-01-01.
    EpochDays,
    /// Since midnight, in this many units per second.
    TimeOfDay(i64),
    /// Since the epoch, in this many units per second.
    Epoch(i64),
    /// ISO-8601 with offset.
    Zoned,
    /// Base64 of a big-endian two's-complement unscaled integer.
    ConnectDecimal(i8),
    /// `{"scale": s, "value": base64}`.
    VariableDecimal,
    /// Base64 bytes.
    Base64,
}

/// A JSON value as the tuple value of `column` (`Null` for null).
pub(super) fn encode(column: &DbzColumn, value: &Json) -> Result<Value, String> {
    if value.is_null() {
        return Ok(Value::Null);
    }
    if value.as_str().is_some_and(|s| {
        s == UNAVAILABLE
            || (column.encoding == Encoding::Base64
                && base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .is_ok_and(|b| b == UNAVAILABLE.as_bytes()))
    }) {
        return Ok(Value::Unchanged);
    }
    let text = if column.column.ty.array {
        let items = value
            .as_array()
            .ok_or_else(|| format!("{value} is not an array"))?;
        let mut out = String::from("{");
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            if item.is_null() {
                out.push_str("NULL");
            } else {
                let text = encode_scalar(column.column.ty.scalar, column.encoding, item)?;
                out.push('"');
                out.push_str(&text.replace('\\', "\\\\").replace('"', "\\\""));
                out.push('"');
            }
        }
        out.push('}');
        out
    } else if let Some(native) = native(column.column.ty.scalar, column.encoding, value)? {
        return Ok(Value::Native(native));
    } else {
        encode_scalar(column.column.ty.scalar, column.encoding, value)?
    };
    Ok(Value::Text(Bytes::from(text)))
}

/// The typed form of a scalar value, where its column's encoding has one (`None`: use the
/// text form). Each is exactly what the text form would parse to, and is refused where that
/// would be.
fn native(scalar: Scalar, encoding: Encoding, value: &Json) -> Result<Option<Native>, String> {
    let int = || {
        value
            .as_i64()
            .ok_or_else(|| format!("{value} is not an integer"))
    };
    let bad = || format!("{value} is not a valid value");
    Ok(Some(match (scalar, encoding) {
        (Scalar::Date, Encoding::EpochDays) => {
            let midnight = epoch_date(int()?).ok_or_else(bad)?;
            Native::Date(midnight.timestamp().div_euclid(86_400) as i32)
        }
        (Scalar::Time, Encoding::TimeOfDay(per_second)) => {
            let t = time_of_day(int()?, per_second).ok_or_else(bad)?;
            Native::Time(
                t.num_seconds_from_midnight() as i64 * 1_000_000 + (t.nanosecond() / 1_000) as i64,
            )
        }
        (Scalar::Timestamp, Encoding::Epoch(per_second)) => Native::Timestamp(
            epoch_timestamp(int()?, per_second)
                .ok_or_else(bad)?
                .timestamp_micros(),
        ),
        (Scalar::Decimal { .. }, Encoding::ConnectDecimal(scale)) => match value {
            Json::String(b64) => {
                let unscaled = connect_unscaled(b64).ok_or_else(bad)?;
                if unscaled == i128::MIN {
                    // Its text form has 39 digits, which the text path refuses as it reads.
                    return Err(format!(
                        "{:?} is not a decimal of scale {scale}",
                        format_decimal(unscaled, scale)
                    ));
                }
                Native::Decimal(unscaled)
            }
            // A number is decimal text already.
            _ => return Ok(None),
        },
        _ => return Ok(None),
    }))
}

/// Midnight (UTC) `days` after 1970-01-01 (`None` past chrono's range, never an overflow).
fn epoch_date(days: i64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(days.checked_mul(86_400)?, 0)
}

/// `n` units (this many per second) after midnight.
fn time_of_day(n: i64, per_second: i64) -> Option<NaiveTime> {
    let micros = n as i128 * 1_000_000 / per_second as i128;
    NaiveTime::from_num_seconds_from_midnight_opt(
        (micros / 1_000_000) as u32,
        ((micros % 1_000_000) * 1_000) as u32,
    )
}

/// `n` units (this many per second) after the epoch, at microsecond precision.
fn epoch_timestamp(n: i64, per_second: i64) -> Option<DateTime<Utc>> {
    let micros = (n as i128 * 1_000_000 / per_second as i128) as i64;
    DateTime::from_timestamp_micros(micros)
}

/// A Connect decimal's base64 big-endian two's-complement bytes as an unscaled integer.
fn connect_unscaled(b64: &str) -> Option<i128> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    if bytes.len() > 16 {
        return None;
    }
    let mut unscaled: i128 = if bytes.first().is_some_and(|b| b & 0x80 != 0) {
        -1
    } else {
        0
    };
    for b in bytes {
        unscaled = (unscaled << 8) | b as i128;
    }
    Some(unscaled)
}

/// A scalar value as the Postgres text form of `scalar`.
fn encode_scalar(scalar: Scalar, encoding: Encoding, value: &Json) -> Result<String, String> {
    let int = || {
        value
            .as_i64()
            .ok_or_else(|| format!("{value} is not an integer"))
    };
    let bad = || format!("{value} is not a valid value");
    Ok(match encoding {
        Encoding::EpochDays => epoch_date(int()?)
            .ok_or_else(bad)?
            .format("%Y-%m-%d")
            .to_string(),
        Encoding::TimeOfDay(per_second) => time_of_day(int()?, per_second)
            .ok_or_else(bad)?
            .format("%H:%M:%S%.6f")
            .to_string(),
        Encoding::Epoch(per_second) => epoch_timestamp(int()?, per_second)
            .ok_or_else(bad)?
            .format("%Y-%m-%d %H:%M:%S%.6f")
            .to_string(),
        Encoding::Zoned => {
            let s = value.as_str().ok_or_else(bad)?;
            DateTime::parse_from_rfc3339(s)
                .map_err(|_| bad())?
                .with_timezone(&Utc)
                .format("%Y-%m-%d %H:%M:%S%.6f+00")
                .to_string()
        }
        Encoding::ConnectDecimal(scale) => match value {
            Json::String(b64) => format_decimal(connect_unscaled(b64).ok_or_else(bad)?, scale),
            Json::Number(n) => n.to_string(),
            _ => return Err(bad()),
        },
        Encoding::VariableDecimal => {
            let scale = value.get("scale").and_then(Json::as_i64).ok_or_else(bad)?;
            let inner = value.get("value").cloned().unwrap_or(Json::Null);
            encode_scalar(Scalar::Text, Encoding::ConnectDecimal(scale as i8), &inner)?
        }
        Encoding::Base64 => {
            let b64 = value.as_str().ok_or_else(bad)?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| bad())?;
            let mut out = String::with_capacity(2 + bytes.len() * 2);
            out.push_str("\\x");
            for b in bytes {
                out.push_str(&format!("{b:02x}"));
            }
            out
        }
        Encoding::Plain => match (scalar, value) {
            (Scalar::Bool, Json::Bool(b)) => if *b { "t" } else { "f" }.to_string(),
            (_, Json::String(s)) => s.clone(),
            (_, v) => v.to_string(),
        },
    })
}

fn format_decimal(unscaled: i128, scale: i8) -> String {
    if scale <= 0 {
        return unscaled.to_string();
    }
    let negative = unscaled < 0;
    let digits = unscaled.unsigned_abs().to_string();
    let scale = scale as usize;
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (whole, fraction) = padded.split_at(padded.len() - scale);
    format!("{}{whole}.{fraction}", if negative { "-" } else { "" })
}

#[cfg(test)]
mod tests {
    use arrow_array::Array;

    use super::*;
    use crate::changelog::Column;
    use crate::types::{ColumnBuilder, PgType};

    fn column(scalar: Scalar, array: bool, encoding: Encoding) -> DbzColumn {
        DbzColumn {
            column: Column {
                name: "c".into(),
                ty: PgType { scalar, array },
                key: false,
            },
            encoding,
        }
    }

    /// A Connect decimal's bytes: the unscaled value, big-endian two's complement (all 16
    /// bytes; Connect sends the shortest form, which `BOI=` below is).
    fn connect(unscaled: i128) -> Json {
        Json::String(base64::engine::general_purpose::STANDARD.encode(unscaled.to_be_bytes()))
    }

    #[test]
    fn connect_decimals_and_times_become_postgres_text() {
        // 12.50 at scale 2: unscaled 1250 = 0x04e2.
        assert_eq!(
            encode_scalar(
                Scalar::Decimal {
                    precision: 10,
                    scale: 2
                },
                Encoding::ConnectDecimal(2),
                &Json::String("BOI=".into())
            )
            .unwrap(),
            "12.50"
        );
        // -1 at scale 3.
        assert_eq!(
            encode_scalar(
                Scalar::Text,
                Encoding::ConnectDecimal(3),
                &Json::String("/w==".into())
            )
            .unwrap(),
            "-0.001"
        );
        assert_eq!(
            encode_scalar(Scalar::Date, Encoding::EpochDays, &Json::from(19_723)).unwrap(),
            "2024-01-01"
        );
        // A day count no calendar holds is refused, not overflowed.
        assert!(encode_scalar(Scalar::Date, Encoding::EpochDays, &Json::from(i64::MAX)).is_err());
        assert_eq!(
            encode_scalar(
                Scalar::Timestamp,
                Encoding::Epoch(1_000_000),
                &Json::from(1_704_067_200_123_456i64)
            )
            .unwrap(),
            "2024-01-01 00:00:00.123456"
        );
        assert_eq!(
            encode_scalar(
                Scalar::Timestamptz,
                Encoding::Zoned,
                &Json::String("2024-01-01T01:00:00.5+01:00".into())
            )
            .unwrap(),
            "2024-01-01 00:00:00.500000+00"
        );
        assert_eq!(
            encode_scalar(
                Scalar::Bytes,
                Encoding::Base64,
                &Json::String("AQI=".into())
            )
            .unwrap(),
            "\\x0102"
        );
    }

    #[test]
    fn connect_decimals_go_in_typed() {
        let decimal = |precision, scale| {
            column(
                Scalar::Decimal { precision, scale },
                false,
                Encoding::ConnectDecimal(scale),
            )
        };
        // 12.50 at scale 2, in Connect's shortest form.
        assert_eq!(
            encode(&decimal(10, 2), &Json::String("BOI=".into())).unwrap(),
            Value::Native(Native::Decimal(1250))
        );
        // -0.001 at scale 3 (one byte, sign-extended).
        assert_eq!(
            encode(&decimal(10, 3), &Json::String("/w==".into())).unwrap(),
            Value::Native(Native::Decimal(-1))
        );
        // The 38-digit edge, both signs.
        let max = 10i128.pow(38) - 1;
        for unscaled in [max, -max] {
            assert_eq!(
                encode(&decimal(38, 2), &connect(unscaled)).unwrap(),
                Value::Native(Native::Decimal(unscaled))
            );
        }
        // Refused as the text path refuses it: its text form overflows as it is read.
        let err = encode(&decimal(38, 2), &connect(i128::MIN)).unwrap_err();
        assert!(err.contains("is not a decimal of scale 2"), "{err}");
        // More than 16 bytes, and not base64.
        assert!(
            encode(
                &decimal(38, 0),
                &Json::String("AAAAAAAAAAAAAAAAAAAAAAAA".into())
            )
            .is_err()
        );
        assert!(encode(&decimal(38, 0), &Json::String("?".into())).is_err());
        // A number is decimal text already; a variable-scale decimal is a text column.
        assert_eq!(
            encode(&decimal(10, 2), &Json::from(12.5)).unwrap(),
            Value::Text(Bytes::from_static(b"12.5"))
        );
        let variable = column(Scalar::Text, false, Encoding::VariableDecimal);
        assert_eq!(
            encode(&variable, &serde_json::json!({"scale": 2, "value": "BOI="})).unwrap(),
            Value::Text(Bytes::from_static(b"12.50"))
        );
        // Arrays keep the text path.
        let Value::Text(t) = encode(
            &column(
                Scalar::Decimal {
                    precision: 10,
                    scale: 2,
                },
                true,
                Encoding::ConnectDecimal(2),
            ),
            &serde_json::json!(["BOI=", null]),
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(&t[..], b"{\"12.50\",NULL}");
    }

    /// The typed path appends exactly what the text path parses the same value's text form
    /// to, and refuses exactly what it refuses.
    #[test]
    fn typed_values_equal_what_their_text_forms_parse_to() {
        let max = 10i128.pow(38) - 1;
        let cases: Vec<(Scalar, Encoding, Vec<Json>)> = vec![
            (
                Scalar::Decimal {
                    precision: 38,
                    scale: 2,
                },
                Encoding::ConnectDecimal(2),
                vec![
                    Json::String("BOI=".into()),
                    Json::String("/w==".into()),
                    Json::String(String::new()),
                    connect(0),
                    connect(max),
                    connect(-max),
                    connect(i128::MAX),
                    connect(i128::MIN),
                    connect(i128::MIN + 1),
                ],
            ),
            (
                Scalar::Decimal {
                    precision: 10,
                    scale: 0,
                },
                Encoding::ConnectDecimal(0),
                vec![connect(-7), connect(1_234_567_890)],
            ),
            (
                Scalar::Date,
                Encoding::EpochDays,
                [
                    0i64, 1, -1, 19_723, -719_162, -719_163, 2_932_897, 95_000_000,
                ]
                .map(Json::from)
                .to_vec(),
            ),
            (
                Scalar::Time,
                Encoding::TimeOfDay(1_000),
                [0i64, 1, 86_399_999, 86_400_000, -1]
                    .map(Json::from)
                    .to_vec(),
            ),
            (
                Scalar::Time,
                Encoding::TimeOfDay(1_000_000),
                [1_500_000i64, 86_399_999_999].map(Json::from).to_vec(),
            ),
            (
                Scalar::Time,
                Encoding::TimeOfDay(1_000_000_000),
                [1_500_000_999i64, 86_399_999_999_999]
                    .map(Json::from)
                    .to_vec(),
            ),
            (
                Scalar::Timestamp,
                Encoding::Epoch(1_000),
                [0i64, -1, 1_704_067_200_123, 253_402_300_800_000]
                    .map(Json::from)
                    .to_vec(),
            ),
            (
                Scalar::Timestamp,
                Encoding::Epoch(1_000_000),
                [
                    1_704_067_200_123_456i64,
                    -1,
                    -62_135_596_800_000_001,
                    8_210_266_876_799_999_999,
                    8_210_266_876_800_000_000,
                    i64::MIN,
                ]
                .map(Json::from)
                .to_vec(),
            ),
            (
                Scalar::Timestamp,
                Encoding::Epoch(1_000_000_000),
                [-1i64, 1_704_067_200_123_456_789, i64::MAX]
                    .map(Json::from)
                    .to_vec(),
            ),
        ];
        for (scalar, encoding, values) in cases {
            let ty = PgType {
                scalar,
                array: false,
            };
            for value in values {
                let mut typed = ColumnBuilder::new(ty, 1);
                let mut text = ColumnBuilder::new(ty, 1);
                let typed_ok = native(scalar, encoding, &value)
                    .map(|n| n.expect("a typed form"))
                    .and_then(|n| typed.append_native(n))
                    .is_ok();
                let text_ok = encode_scalar(scalar, encoding, &value)
                    .and_then(|t| text.append(Some(t.as_bytes())))
                    .is_ok();
                assert_eq!(typed_ok, text_ok, "{scalar:?} {encoding:?} {value}");
                let (typed, text) = (typed.finish(), text.finish());
                assert_eq!(
                    typed.as_ref(),
                    text.as_ref(),
                    "{scalar:?} {encoding:?} {value}"
                );
                assert_eq!(typed.len(), usize::from(typed_ok));
            }
        }
    }

    #[test]
    fn placeholder_is_unchanged_and_arrays_quote() {
        let text = column(Scalar::Text, false, Encoding::Plain);
        assert_eq!(
            encode(&text, &Json::String(UNAVAILABLE.into())).unwrap(),
            Value::Unchanged
        );
        let list = column(Scalar::Text, true, Encoding::Plain);
        let Value::Text(t) = encode(&list, &serde_json::json!(["a,b", null, "q\"x"])).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            crate::types::split_array(std::str::from_utf8(&t).unwrap()).unwrap(),
            vec![Some("a,b".into()), None, Some("q\"x".into())]
        );
    }
}
