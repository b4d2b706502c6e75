//! Postgres' binary send format (what the initial binary `COPY` sends) → one scalar appended
//! to its Arrow builder; the elements of a binary one-dimensional array; and the select list
//! that makes a `COPY` send every column in a form read here ([`copy_expression`]).
//!
//! Errors are a `String` naming the value only: the caller adds the table, column and fault.

use arrow_array::builder::{
    ArrayBuilder, BooleanBuilder, Date32Builder, Decimal128Builder, FixedSizeBinaryBuilder,
    Float32Builder, Float64Builder, Int32Builder, Int64Builder, LargeBinaryBuilder, StringBuilder,
    Time64MicrosecondBuilder, TimestampMicrosecondBuilder,
};

use super::text::{self, utf8};
use super::{PgType, Scalar};

/// Microseconds from the Unix epoch to Postgres' epoch (2000-01-01).
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;
/// Days from the Unix epoch to Postgres' epoch.
const PG_EPOCH_DAYS: i32 = 10_957;

fn be<const N: usize>(value: &[u8]) -> Result<[u8; N], String> {
    value.try_into().map_err(|_| {
        format!(
            "a binary value of {} bytes where {N} were expected",
            value.len()
        )
    })
}

/// A binary `numeric` as an unscaled integer at `scale`.
fn binary_numeric(value: &[u8], scale: i8) -> Result<i128, String> {
    if value.len() < 8 {
        return Err("a truncated binary numeric".into());
    }
    let ndigits = i16::from_be_bytes(be(&value[0..2])?) as i32;
    let weight = i16::from_be_bytes(be(&value[2..4])?) as i32;
    let sign = u16::from_be_bytes(be(&value[4..6])?);
    if sign & 0xC000 == 0xC000 {
        return Err("NaN or infinity cannot be a decimal".into());
    }
    if value.len() != 8 + 2 * ndigits as usize {
        return Err("a binary numeric of the wrong length".into());
    }
    let too_big = || "a numeric too large for its decimal column".to_string();
    let mut acc: i128 = 0;
    for i in 0..ndigits as usize {
        let digit = i16::from_be_bytes(be(&value[8 + 2 * i..10 + 2 * i])?) as i128;
        acc = acc
            .checked_mul(10_000)
            .and_then(|a| a.checked_add(digit))
            .ok_or_else(too_big)?;
    }
    // acc × 10000^(weight − ndigits + 1) × 10^scale
    let exponent = 4 * (weight - ndigits + 1) + scale as i32;
    if ndigits > 0 {
        if exponent >= 0 {
            for _ in 0..exponent {
                acc = acc.checked_mul(10).ok_or_else(too_big)?;
            }
        } else {
            for _ in 0..-exponent {
                if acc % 10 != 0 {
                    return Err("a numeric with more fractional digits than its scale".into());
                }
                acc /= 10;
            }
        }
    }
    Ok(if sign == 0x4000 { -acc } else { acc })
}

/// Appends one scalar value in Postgres' binary format (`None` = NULL) to the builder made
/// for `scalar`.
pub(super) fn append_scalar(
    scalar: Scalar,
    builder: &mut dyn ArrayBuilder,
    value: Option<&[u8]>,
) -> Result<(), String> {
    let Some(v) = value else {
        // A NULL is the same in either format.
        return text::append_scalar(scalar, builder, None);
    };
    match scalar {
        Scalar::Bool => downcast!(builder, BooleanBuilder).append_value(v == [1]),
        Scalar::Int => {
            let n = match v.len() {
                2 => i16::from_be_bytes(be(v)?) as i32,
                _ => i32::from_be_bytes(be(v)?),
            };
            downcast!(builder, Int32Builder).append_value(n)
        }
        Scalar::Long => {
            let n = match v.len() {
                4 => u32::from_be_bytes(be(v)?) as i64, // oid
                _ => i64::from_be_bytes(be(v)?),
            };
            downcast!(builder, Int64Builder).append_value(n)
        }
        Scalar::Float => {
            downcast!(builder, Float32Builder).append_value(f32::from_be_bytes(be(v)?))
        }
        Scalar::Double => {
            downcast!(builder, Float64Builder).append_value(f64::from_be_bytes(be(v)?))
        }
        Scalar::Decimal { scale, .. } => {
            downcast!(builder, Decimal128Builder).append_value(binary_numeric(v, scale)?)
        }
        Scalar::Text => downcast!(builder, StringBuilder).append_value(utf8(v)?),
        Scalar::Bytes => downcast!(builder, LargeBinaryBuilder).append_value(v),
        Scalar::Date => {
            let days = i32::from_be_bytes(be(v)?);
            if days == i32::MAX || days == i32::MIN {
                return Err("an infinite date cannot be held".into());
            }
            downcast!(builder, Date32Builder).append_value(days + PG_EPOCH_DAYS)
        }
        Scalar::Time => {
            downcast!(builder, Time64MicrosecondBuilder).append_value(i64::from_be_bytes(be(v)?))
        }
        Scalar::Timestamp | Scalar::Timestamptz => {
            let micros = i64::from_be_bytes(be(v)?);
            if micros == i64::MAX || micros == i64::MIN {
                return Err("an infinite timestamp cannot be held".into());
            }
            downcast!(builder, TimestampMicrosecondBuilder).append_value(micros + PG_EPOCH_MICROS)
        }
        Scalar::Uuid => downcast!(builder, FixedSizeBinaryBuilder)
            .append_value(v)
            .map_err(|e| e.to_string())?,
    }
    Ok(())
}

/// Calls `element` with each element of a binary one-dimensional array (`None` = a NULL
/// element), in order.
pub(super) fn each_array_element(
    v: &[u8],
    mut element: impl FnMut(Option<&[u8]>) -> Result<(), String>,
) -> Result<(), String> {
    let truncated = || "a truncated binary array".to_string();
    let int = |at: usize| -> Result<i32, String> {
        Ok(i32::from_be_bytes(be(v
            .get(at..at + 4)
            .ok_or_else(truncated)?)?))
    };
    let ndim = int(0)?;
    if ndim > 1 {
        return Err(format!(
            "a {ndim}-dimensional array (only one dimension is supported)"
        ));
    }
    let (mut at, count) = if ndim == 0 { (12, 0) } else { (20, int(12)?) };
    for _ in 0..count {
        let len = int(at)?;
        at += 4;
        let value = if len < 0 {
            None
        } else {
            let e = v.get(at..at + len as usize).ok_or_else(truncated)?;
            at += len as usize;
            Some(e)
        };
        element(value)?;
    }
    Ok(())
}

/// The expression that selects a column for a binary `COPY`, so that its binary form is one
/// [`ColumnBuilder::append_binary`] reads: types kept as text whose binary form is not their
/// text (`jsonb`, `numeric` without a decimal, `inet`, `interval`, …) are cast to `text`.
///
/// [`ColumnBuilder::append_binary`]: super::ColumnBuilder::append_binary
pub fn copy_expression(quoted_column: &str, ty: PgType, type_name: &str) -> String {
    let textual = matches!(
        type_name,
        "text" | "varchar" | "bpchar" | "name" | "citext" | "json" | "xml"
    );
    if ty.scalar == Scalar::Text && !textual {
        // Enums send their label, but a cast costs little and keeps one rule.
        format!("{quoted_column}::text{}", if ty.array { "[]" } else { "" })
    } else {
        quoted_column.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_numerics() {
        // 1234.5 at scale 2: digits [1234, 5000], weight 0, dscale 1.
        let mut n = Vec::new();
        for part in [2i16, 0, 0, 1, 1234, 5000] {
            n.extend_from_slice(&part.to_be_bytes());
        }
        assert_eq!(binary_numeric(&n, 2).unwrap(), 123_450);
        // -0.05: digits [500], weight -1, negative.
        let mut m = Vec::new();
        for part in [1i16, -1, 0x4000, 2, 500] {
            m.extend_from_slice(&part.to_be_bytes());
        }
        assert_eq!(binary_numeric(&m, 2).unwrap(), -5);
        assert!(binary_numeric(&m, 1).is_err());
        // Zero has no digits.
        let z: Vec<u8> = [0i16, 0, 0, 0]
            .iter()
            .flat_map(|p| p.to_be_bytes())
            .collect();
        assert_eq!(binary_numeric(&z, 2).unwrap(), 0);
    }
}
