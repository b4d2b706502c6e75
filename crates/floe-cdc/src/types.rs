//! Postgres column types → Iceberg types, and Postgres text-format values → Arrow arrays.
//!
//! | Postgres | Iceberg | notes |
//! |---|---|---|
//! | `boolean` | boolean | |
//! | `smallint`, `integer` | int | |
//! | `bigint`, `oid` | long | |
//! | `real` / `double precision` | float / double | `NaN`, `±Infinity` kept |
//! | `numeric(p,s)`, p ≤ 38 | decimal(p,s) | |
//! | `numeric` without precision, or p > 38 | string | exact text; a decimal would round |
//! | `text`, `varchar`, `char`, `name`, `citext`, enums, `json`, `jsonb`, `xml`, `inet`, `cidr`, `macaddr`, `interval`, `money` | string | Postgres' text output |
//! | `bytea` | binary | |
//! | `date` | date | |
//! | `time` | time (µs) | |
//! | `timestamp` | timestamp (µs) | |
//! | `timestamptz` | timestamptz (µs, UTC) | |
//! | `uuid` | uuid | |
//! | one-dimensional arrays of the above | list | |
//! | domains | their base type | |
//!
//! Anything else is refused at start, naming the column. Values Iceberg cannot hold
//! (`infinity` dates and timestamps, `NaN` numerics in a decimal column) are refused when they
//! arrive, naming the table, column and value; the job stops before committing them.
//!
//! Sessions run with `DateStyle=ISO`, `TimeZone=UTC`, `bytea_output=hex` and
//! `extra_float_digits=3`, so the text forms parsed here are the only ones that arrive.

use std::sync::Arc;

use arrow_array::ArrayRef;
use arrow_array::builder::{
    ArrayBuilder, BooleanBuilder, Date32Builder, Decimal128Builder, FixedSizeBinaryBuilder,
    Float32Builder, Float64Builder, Int32Builder, Int64Builder, LargeBinaryBuilder, ListBuilder,
    StringBuilder, Time64MicrosecondBuilder, TimestampMicrosecondBuilder,
};
use chrono::{DateTime, NaiveDate, NaiveDateTime, NaiveTime, Timelike};
use iceberg::spec::{ListType, NestedField, PrimitiveType, Type};

/// The session settings the parsers rely on (`-c` options of a connection).
pub const SESSION_OPTIONS: &str = "-c DateStyle=ISO -c TimeZone=UTC -c bytea_output=hex -c extra_float_digits=3 -c IntervalStyle=postgres";

/// A supported scalar column type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scalar {
    /// boolean
    Bool,
    /// smallint, integer
    Int,
    /// bigint, oid
    Long,
    /// real
    Float,
    /// double precision
    Double,
    /// numeric(p,s)
    Decimal {
        /// Precision.
        precision: u8,
        /// Scale.
        scale: i8,
    },
    /// Text-like types, kept as Postgres prints them.
    Text,
    /// bytea
    Bytes,
    /// date
    Date,
    /// time
    Time,
    /// timestamp
    Timestamp,
    /// timestamptz
    Timestamptz,
    /// uuid
    Uuid,
}

/// A column's type: a scalar, or a one-dimensional array of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PgType {
    /// The element type.
    pub scalar: Scalar,
    /// An array of `scalar`.
    pub array: bool,
}

/// What the catalog says about a column's type (after resolving domains).
#[derive(Debug, Clone)]
pub struct TypeInfo<'a> {
    /// `pg_type.typname` of the type (of the element for arrays).
    pub name: &'a str,
    /// `pg_type.typtype` (`e` enum, `b` base, ...).
    pub kind: u8,
    /// Whether the column is an array.
    pub array: bool,
    /// `atttypmod`.
    pub modifier: i32,
}

/// Maps a column type; `Err` names what is not supported.
pub fn map_type(info: &TypeInfo<'_>) -> Result<PgType, String> {
    let scalar = match info.name {
        _ if info.kind == b'e' => Scalar::Text,
        "bool" => Scalar::Bool,
        "int2" | "int4" => Scalar::Int,
        "int8" | "oid" => Scalar::Long,
        "float4" => Scalar::Float,
        "float8" => Scalar::Double,
        "numeric" => {
            // typmod = ((precision << 16) | scale) + 4; -1 when unconstrained.
            if info.modifier >= 4 {
                let m = info.modifier - 4;
                let (precision, scale) = ((m >> 16) & 0xffff, m & 0xffff);
                if precision <= 38 && scale <= precision {
                    Scalar::Decimal {
                        precision: precision as u8,
                        scale: scale as i8,
                    }
                } else {
                    Scalar::Text
                }
            } else {
                Scalar::Text
            }
        }
        "text" | "varchar" | "bpchar" | "name" | "citext" | "json" | "jsonb" | "xml" | "inet"
        | "cidr" | "macaddr" | "macaddr8" | "interval" | "money" | "char" => Scalar::Text,
        "bytea" => Scalar::Bytes,
        "date" => Scalar::Date,
        "time" => Scalar::Time,
        "timestamp" => Scalar::Timestamp,
        "timestamptz" => Scalar::Timestamptz,
        "uuid" => Scalar::Uuid,
        other => {
            return Err(format!(
                "type {}{other} is not supported",
                if info.array { "array of " } else { "" }
            ));
        }
    };
    Ok(PgType {
        scalar,
        array: info.array,
    })
}

impl Scalar {
    fn iceberg(self) -> PrimitiveType {
        match self {
            Scalar::Bool => PrimitiveType::Boolean,
            Scalar::Int => PrimitiveType::Int,
            Scalar::Long => PrimitiveType::Long,
            Scalar::Float => PrimitiveType::Float,
            Scalar::Double => PrimitiveType::Double,
            Scalar::Decimal { precision, scale } => PrimitiveType::Decimal {
                precision: precision as u32,
                scale: scale as u32,
            },
            Scalar::Text => PrimitiveType::String,
            Scalar::Bytes => PrimitiveType::Binary,
            Scalar::Date => PrimitiveType::Date,
            Scalar::Time => PrimitiveType::Time,
            Scalar::Timestamp => PrimitiveType::Timestamp,
            Scalar::Timestamptz => PrimitiveType::Timestamptz,
            Scalar::Uuid => PrimitiveType::Uuid,
        }
    }
}

impl PgType {
    /// The Iceberg type; list elements get `element_id`.
    pub fn iceberg(self, element_id: i32) -> Type {
        let primitive = Type::Primitive(self.scalar.iceberg());
        if self.array {
            Type::List(ListType::new(Arc::new(NestedField::list_element(
                element_id, primitive, false,
            ))))
        } else {
            primitive
        }
    }
}

/// Builds one Arrow column from text values.
pub struct ColumnBuilder {
    ty: PgType,
    inner: Box<dyn ArrayBuilder>,
}

impl std::fmt::Debug for ColumnBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ColumnBuilder")
            .field("ty", &self.ty)
            .field("len", &self.inner.len())
            .finish()
    }
}

fn scalar_builder(scalar: Scalar, capacity: usize) -> Box<dyn ArrayBuilder> {
    match scalar {
        Scalar::Bool => Box::new(BooleanBuilder::with_capacity(capacity)),
        Scalar::Int => Box::new(Int32Builder::with_capacity(capacity)),
        Scalar::Long => Box::new(Int64Builder::with_capacity(capacity)),
        Scalar::Float => Box::new(Float32Builder::with_capacity(capacity)),
        Scalar::Double => Box::new(Float64Builder::with_capacity(capacity)),
        Scalar::Decimal { precision, scale } => Box::new(
            Decimal128Builder::with_capacity(capacity)
                .with_precision_and_scale(precision, scale)
                .expect("precision ≤ 38 checked by map_type"),
        ),
        Scalar::Text => Box::new(StringBuilder::with_capacity(capacity, capacity * 16)),
        Scalar::Bytes => Box::new(LargeBinaryBuilder::with_capacity(capacity, capacity * 16)),
        Scalar::Date => Box::new(Date32Builder::with_capacity(capacity)),
        Scalar::Time => Box::new(Time64MicrosecondBuilder::with_capacity(capacity)),
        Scalar::Timestamp => Box::new(TimestampMicrosecondBuilder::with_capacity(capacity)),
        Scalar::Timestamptz => {
            Box::new(TimestampMicrosecondBuilder::with_capacity(capacity).with_timezone("+00:00"))
        }
        Scalar::Uuid => Box::new(FixedSizeBinaryBuilder::with_capacity(capacity, 16)),
    }
}

macro_rules! downcast {
    ($builder:expr, $ty:ty) => {
        $builder
            .as_any_mut()
            .downcast_mut::<$ty>()
            .expect("builder made for this scalar")
    };
}

fn utf8(text: &[u8]) -> Result<&str, String> {
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
        use chrono::Datelike;
        date = date
            .with_year(1 - date.year())
            .ok_or_else(|| format!("{s:?} BC is out of range"))?;
    }
    use chrono::Datelike;
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

/// Appends one scalar value (`None` = NULL).
fn append_scalar(
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

/// Appends one scalar value in Postgres' binary format (`None` = NULL).
fn append_scalar_binary(
    scalar: Scalar,
    builder: &mut dyn ArrayBuilder,
    value: Option<&[u8]>,
) -> Result<(), String> {
    let Some(v) = value else {
        return append_scalar(scalar, builder, None);
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

/// The expression that selects a column for a binary `COPY`, so that its binary form is one
/// [`ColumnBuilder::append_binary`] reads: types kept as text whose binary form is not their
/// text (`jsonb`, `numeric` without a decimal, `inet`, `interval`, …) are cast to `text`.
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

impl ColumnBuilder {
    /// A builder of a column of `ty`.
    pub fn new(ty: PgType, capacity: usize) -> Self {
        let inner: Box<dyn ArrayBuilder> = if ty.array {
            Box::new(ListBuilder::new(scalar_builder(ty.scalar, capacity)))
        } else {
            scalar_builder(ty.scalar, capacity)
        };
        Self { ty, inner }
    }

    /// Appends one value in Postgres text format (`None` = NULL).
    pub fn append(&mut self, text: Option<&[u8]>) -> Result<(), String> {
        if !self.ty.array {
            return append_scalar(self.ty.scalar, self.inner.as_mut(), text);
        }
        let list = downcast!(self.inner, ListBuilder<Box<dyn ArrayBuilder>>);
        match text {
            None => list.append_null(),
            Some(t) => {
                for element in split_array(utf8(t)?)? {
                    append_scalar(
                        self.ty.scalar,
                        list.values().as_mut(),
                        element.as_deref().map(str::as_bytes),
                    )?;
                }
                list.append(true);
            }
        }
        Ok(())
    }

    /// Appends one value in Postgres' binary format (`None` = NULL), as a binary `COPY` of
    /// [`copy_expression`] sends it.
    pub fn append_binary(&mut self, value: Option<&[u8]>) -> Result<(), String> {
        if !self.ty.array {
            return append_scalar_binary(self.ty.scalar, self.inner.as_mut(), value);
        }
        let list = downcast!(self.inner, ListBuilder<Box<dyn ArrayBuilder>>);
        let Some(v) = value else {
            list.append_null();
            return Ok(());
        };
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
            let element = if len < 0 {
                None
            } else {
                let e = v.get(at..at + len as usize).ok_or_else(truncated)?;
                at += len as usize;
                Some(e)
            };
            append_scalar_binary(self.ty.scalar, list.values().as_mut(), element)?;
        }
        list.append(true);
        Ok(())
    }

    /// The column built so far.
    pub fn finish(&mut self) -> ArrayRef {
        self.inner.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Decimal128Type, Int32Type, TimestampMicrosecondType};

    fn build(ty: PgType, values: &[Option<&str>]) -> Result<ArrayRef, String> {
        let mut b = ColumnBuilder::new(ty, values.len());
        for v in values {
            b.append(v.map(str::as_bytes))?;
        }
        Ok(b.finish())
    }

    fn scalar(s: Scalar) -> PgType {
        PgType {
            scalar: s,
            array: false,
        }
    }

    #[test]
    fn numeric_typmod_maps_to_decimal_or_text() {
        let numeric = |modifier| TypeInfo {
            name: "numeric",
            kind: b'b',
            array: false,
            modifier,
        };
        assert_eq!(
            map_type(&numeric(((12 << 16) | 2) + 4)).unwrap().scalar,
            Scalar::Decimal {
                precision: 12,
                scale: 2
            }
        );
        assert_eq!(map_type(&numeric(-1)).unwrap().scalar, Scalar::Text);
        let err = map_type(&TypeInfo {
            name: "tsvector",
            kind: b'b',
            array: false,
            modifier: -1,
        })
        .unwrap_err();
        assert!(err.contains("tsvector"), "{err}");
    }

    #[test]
    fn decimals_and_timestamps_parse_exactly() {
        let d = build(
            scalar(Scalar::Decimal {
                precision: 12,
                scale: 2,
            }),
            &[Some("-12.5"), Some("0.01"), None, Some("7")],
        )
        .unwrap();
        let d = d.as_primitive::<Decimal128Type>();
        assert_eq!(d.value(0), -1250);
        assert_eq!(d.value(1), 1);
        assert!(d.is_null(2));
        assert_eq!(d.value(3), 700);
        assert!(
            build(
                scalar(Scalar::Decimal {
                    precision: 12,
                    scale: 2
                }),
                &[Some("NaN")]
            )
            .is_err()
        );

        let t = build(
            scalar(Scalar::Timestamptz),
            &[
                Some("2024-03-01 12:00:00.123456+00"),
                Some("1999-12-31 23:00:00-01:30"),
            ],
        )
        .unwrap();
        let t = t.as_primitive::<TimestampMicrosecondType>();
        assert_eq!(t.value(0), 1_709_294_400_123_456);
        assert_eq!(t.value(1), 946_686_600_000_000);
        assert!(build(scalar(Scalar::Timestamp), &[Some("infinity")]).is_err());
        assert_eq!(parse_date("1970-01-02").unwrap(), 1);
        assert_eq!(parse_time("00:00:01.5").unwrap(), 1_500_000);
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
        let a = build(
            PgType {
                scalar: Scalar::Int,
                array: true,
            },
            &[Some("{1,2,NULL}"), None, Some("{}")],
        )
        .unwrap();
        let list = a.as_list::<i32>();
        assert_eq!(list.value_length(0), 3);
        assert!(list.is_null(1));
        assert_eq!(list.value_length(2), 0);
        assert_eq!(list.value(0).as_primitive::<Int32Type>().value(1), 2);
    }

    #[test]
    fn binary_numerics_dates_and_arrays() {
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

        let mut d = ColumnBuilder::new(scalar(Scalar::Date), 1);
        d.append_binary(Some(&1i32.to_be_bytes())).unwrap();
        assert!(d.append_binary(Some(&i32::MAX.to_be_bytes())).is_err());
        let d = d.finish();
        assert_eq!(
            d.as_primitive::<arrow_array::types::Date32Type>().value(0),
            10_958
        );

        // int4[] {7, NULL}
        let mut a = Vec::new();
        for part in [1i32, 1, 23, 2, 1, 4, 7, -1] {
            a.extend_from_slice(&part.to_be_bytes());
        }
        let mut list = ColumnBuilder::new(
            PgType {
                scalar: Scalar::Int,
                array: true,
            },
            1,
        );
        list.append_binary(Some(&a)).unwrap();
        let list = list.finish();
        let values = list.as_list::<i32>().value(0);
        assert_eq!(values.as_primitive::<Int32Type>().value(0), 7);
        assert!(values.is_null(1));
    }

    #[test]
    fn bytea_uuid_bool() {
        assert_eq!(parse_hex("\\x00ff").unwrap(), vec![0, 255]);
        assert_eq!(
            parse_uuid("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11").unwrap()[0],
            0xa0
        );
        assert!(build(scalar(Scalar::Bool), &[Some("t"), Some("x")]).is_err());
    }
}
