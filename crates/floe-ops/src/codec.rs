//! Stable byte encodings of what operators keep in state: group keys made of column values,
//! times that sort as bytes, and a small writer/reader for values.
//!
//! State outlives the binary that wrote it (it is restored after an upgrade), so these
//! encodings are a compatibility contract: never change one, add a new one.

use std::sync::Arc;

use arrow_array::builder::{
    ArrayBuilder, BinaryBuilder, BooleanBuilder, Date32Builder, Float64Builder, Int64Builder,
    StringBuilder, TimestampMicrosecondBuilder, TimestampNanosecondBuilder,
};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, TimeUnit};

/// `t` as 8 bytes that sort like the numbers (sign bit flipped, big-endian).
pub fn sortable(t: i64) -> [u8; 8] {
    ((t as u64) ^ (1 << 63)).to_be_bytes()
}

/// The number of [`sortable`] bytes.
pub fn unsortable(bytes: &[u8]) -> i64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[..8]);
    (u64::from_be_bytes(b) ^ (1 << 63)) as i64
}

/// `batch` as one Arrow IPC stream (schema, then the batch): what an exchange record and a
/// stored segment of rows hold.
pub fn ipc_bytes(batch: &arrow_array::RecordBatch) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(batch.get_array_memory_size() / 2 + 1024);
    let mut writer = arrow_ipc::writer::StreamWriter::try_new(&mut out, &batch.schema())
        .map_err(|e| e.to_string())?;
    writer.write(batch).map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())?;
    drop(writer);
    Ok(out)
}

/// Appends values to a byte buffer.
#[derive(Debug, Default, Clone)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    /// A `u8`.
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    /// A `u64`.
    pub fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// An `i64`.
    pub fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// An `f64`.
    pub fn f64(&mut self, v: f64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// Length-prefixed bytes.
    pub fn bytes(&mut self, v: &[u8]) {
        self.u64(v.len() as u64);
        self.0.extend_from_slice(v);
    }
    /// A `u64` in 1 to 10 bytes, 7 bits each (LEB128): small values small.
    pub fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    /// An `i64` as a [`Self::varint`], zigzagged so that small magnitudes of either sign are small.
    pub fn zigzag(&mut self, v: i64) {
        self.varint(((v << 1) ^ (v >> 63)) as u64);
    }
    /// Bytes prefixed by their length as a [`Self::varint`].
    pub fn short_bytes(&mut self, v: &[u8]) {
        self.varint(v.len() as u64);
        self.0.extend_from_slice(v);
    }
}

/// Reads what a [`Writer`] wrote.
#[derive(Debug)]
pub struct Reader<'a>(pub &'a [u8]);

impl<'a> Reader<'a> {
    /// The next `n` bytes as they are.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("state value ends too early".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    /// A `u8`.
    pub fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    /// A `u64`.
    pub fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    /// An `i64`.
    pub fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    /// An `f64`.
    pub fn f64(&mut self) -> Result<f64, String> {
        Ok(f64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    /// Length-prefixed bytes.
    pub fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.u64()? as usize;
        self.take(n)
    }
    /// What [`Writer::varint`] wrote.
    pub fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7F) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err("a variable-length integer longer than 10 bytes".into())
    }
    /// What [`Writer::zigzag`] wrote.
    pub fn zigzag(&mut self) -> Result<i64, String> {
        let v = self.varint()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }
    /// What [`Writer::short_bytes`] wrote.
    pub fn short_bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.varint()? as usize;
        self.take(n)
    }
}

/// How one key column's values are encoded (fixed per column type).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyType {
    /// Strings (`Utf8`, `LargeUtf8`): length-prefixed UTF-8.
    Text,
    /// Integers of any width: 8 bytes.
    Integer,
    /// `Boolean`: 1 byte.
    Boolean,
    /// `Date32`: 8 bytes of days.
    Date,
    /// Timestamps: 8 bytes in the column's unit, with its time zone.
    Timestamp(TimeUnit, Option<Arc<str>>),
    /// Binary: length-prefixed bytes.
    Binary,
    /// Floats: the 8 bytes of the `f64`.
    Float,
}

impl KeyType {
    /// The encoding of a column of `ty`, if it can be a key.
    pub fn of(ty: &DataType) -> Option<Self> {
        Some(match ty {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Self::Text,
            DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64 => Self::Integer,
            DataType::Boolean => Self::Boolean,
            DataType::Date32 => Self::Date,
            DataType::Timestamp(unit, tz) => Self::Timestamp(*unit, tz.clone()),
            DataType::Binary | DataType::LargeBinary => Self::Binary,
            DataType::Float32 | DataType::Float64 => Self::Float,
            _ => return None,
        })
    }

    /// The Arrow type the decoded column has.
    pub fn data_type(&self) -> DataType {
        match self {
            Self::Text => DataType::Utf8,
            Self::Integer => DataType::Int64,
            Self::Boolean => DataType::Boolean,
            Self::Date => DataType::Date32,
            Self::Timestamp(unit, tz) => DataType::Timestamp(*unit, tz.clone()),
            Self::Binary => DataType::Binary,
            Self::Float => DataType::Float64,
        }
    }
}

/// An integer value of an integer, date or timestamp column (`None`: null or not integral).
pub fn integer_at(array: &dyn Array, row: usize) -> Option<i64> {
    if array.is_null(row) {
        return None;
    }
    Some(match array.data_type() {
        DataType::Int8 => array.as_primitive::<Int8Type>().value(row) as i64,
        DataType::Int16 => array.as_primitive::<Int16Type>().value(row) as i64,
        DataType::Int32 => array.as_primitive::<Int32Type>().value(row) as i64,
        DataType::Int64 => array.as_primitive::<Int64Type>().value(row),
        DataType::UInt8 => array.as_primitive::<UInt8Type>().value(row) as i64,
        DataType::UInt16 => array.as_primitive::<UInt16Type>().value(row) as i64,
        DataType::UInt32 => array.as_primitive::<UInt32Type>().value(row) as i64,
        DataType::UInt64 => array.as_primitive::<UInt64Type>().value(row) as i64,
        DataType::Date32 => array.as_primitive::<Date32Type>().value(row) as i64,
        DataType::Timestamp(TimeUnit::Second, _) => {
            array.as_primitive::<TimestampSecondType>().value(row)
        }
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            array.as_primitive::<TimestampMillisecondType>().value(row)
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            array.as_primitive::<TimestampMicrosecondType>().value(row)
        }
        DataType::Timestamp(TimeUnit::Nanosecond, _) => {
            array.as_primitive::<TimestampNanosecondType>().value(row)
        }
        _ => return None,
    })
}

/// A numeric value as `f64` (`None`: null or not numeric).
pub fn float_at(array: &dyn Array, row: usize) -> Option<f64> {
    if array.is_null(row) {
        return None;
    }
    match array.data_type() {
        DataType::Float64 => Some(array.as_primitive::<Float64Type>().value(row)),
        DataType::Float32 => Some(array.as_primitive::<Float32Type>().value(row) as f64),
        _ => integer_at(array, row).map(|v| v as f64),
    }
}

/// Appends `row` of `array` (a column of key type `ty`) to `out`; `false` when it is null.
pub fn encode_key_value(ty: &KeyType, array: &dyn Array, row: usize, out: &mut Vec<u8>) -> bool {
    if array.is_null(row) {
        return false;
    }
    let mut w = Writer(std::mem::take(out));
    match ty {
        KeyType::Text => match array.data_type() {
            DataType::LargeUtf8 => w.bytes(array.as_string::<i64>().value(row).as_bytes()),
            DataType::Utf8View => w.bytes(array.as_string_view().value(row).as_bytes()),
            _ => w.bytes(array.as_string::<i32>().value(row).as_bytes()),
        },
        KeyType::Binary => match array.data_type() {
            DataType::LargeBinary => w.bytes(array.as_binary::<i64>().value(row)),
            _ => w.bytes(array.as_binary::<i32>().value(row)),
        },
        KeyType::Boolean => w.u8(array.as_boolean().value(row) as u8),
        KeyType::Float => w.f64(float_at(array, row).unwrap_or_default()),
        KeyType::Integer | KeyType::Date | KeyType::Timestamp(..) => {
            w.i64(integer_at(array, row).unwrap_or_default())
        }
    }
    *out = w.0;
    true
}

/// Builds key columns back from encoded keys.
pub struct KeyColumns {
    builders: Vec<(KeyType, Box<dyn ArrayBuilder>)>,
}

impl std::fmt::Debug for KeyColumns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyColumns")
            .field("columns", &self.builders.len())
            .finish()
    }
}

impl KeyColumns {
    /// Builders for keys of `types`.
    pub fn new(types: &[KeyType]) -> Self {
        let builders = types
            .iter()
            .map(|t| {
                let b: Box<dyn ArrayBuilder> = match t {
                    KeyType::Text => Box::new(StringBuilder::new()),
                    KeyType::Integer => Box::new(Int64Builder::new()),
                    KeyType::Boolean => Box::new(BooleanBuilder::new()),
                    KeyType::Date => Box::new(Date32Builder::new()),
                    KeyType::Timestamp(TimeUnit::Nanosecond, _) => {
                        Box::new(TimestampNanosecondBuilder::new())
                    }
                    KeyType::Timestamp(..) => Box::new(TimestampMicrosecondBuilder::new()),
                    KeyType::Binary => Box::new(BinaryBuilder::new()),
                    KeyType::Float => Box::new(Float64Builder::new()),
                };
                (t.clone(), b)
            })
            .collect();
        Self { builders }
    }

    /// Decodes one key; returns the bytes after it.
    pub fn push<'a>(&mut self, mut key: Reader<'a>) -> Result<Reader<'a>, String> {
        for (ty, builder) in &mut self.builders {
            let any = builder.as_any_mut();
            match ty {
                KeyType::Text => {
                    let text = std::str::from_utf8(key.bytes()?).map_err(|e| e.to_string())?;
                    down::<StringBuilder>(any)?.append_value(text);
                }
                KeyType::Binary => down::<BinaryBuilder>(any)?.append_value(key.bytes()?),
                KeyType::Boolean => down::<BooleanBuilder>(any)?.append_value(key.u8()? != 0),
                KeyType::Float => down::<Float64Builder>(any)?.append_value(key.f64()?),
                KeyType::Integer => down::<Int64Builder>(any)?.append_value(key.i64()?),
                KeyType::Date => down::<Date32Builder>(any)?.append_value(key.i64()? as i32),
                KeyType::Timestamp(TimeUnit::Nanosecond, _) => {
                    down::<TimestampNanosecondBuilder>(any)?.append_value(key.i64()?)
                }
                KeyType::Timestamp(unit, _) => {
                    let v = key.i64()?;
                    let micros = match unit {
                        TimeUnit::Second => v * 1_000_000,
                        TimeUnit::Millisecond => v * 1_000,
                        _ => v,
                    };
                    down::<TimestampMicrosecondBuilder>(any)?.append_value(micros)
                }
            }
        }
        Ok(key)
    }

    /// The columns built, with their time zones.
    pub fn finish(&mut self) -> Vec<ArrayRef> {
        self.builders
            .iter_mut()
            .map(|(ty, b)| {
                let array = b.finish();
                match ty {
                    KeyType::Timestamp(TimeUnit::Nanosecond, tz) => Arc::new(
                        array
                            .as_primitive::<TimestampNanosecondType>()
                            .clone()
                            .with_timezone_opt(tz.clone()),
                    )
                        as ArrayRef,
                    KeyType::Timestamp(_, tz) => Arc::new(
                        array
                            .as_primitive::<TimestampMicrosecondType>()
                            .clone()
                            .with_timezone_opt(tz.clone()),
                    ) as ArrayRef,
                    _ => array,
                }
            })
            .collect()
    }
}

fn down<T: 'static>(any: &mut dyn std::any::Any) -> Result<&mut T, String> {
    any.downcast_mut::<T>()
        .ok_or_else(|| "key builder of another type".to_string())
}

/// The Arrow type a decoded key column of `ty` has (timestamps in µs unless ns).
pub fn decoded_type(ty: &KeyType) -> DataType {
    match ty {
        KeyType::Timestamp(TimeUnit::Nanosecond, tz) => {
            DataType::Timestamp(TimeUnit::Nanosecond, tz.clone())
        }
        KeyType::Timestamp(_, tz) => DataType::Timestamp(TimeUnit::Microsecond, tz.clone()),
        other => other.data_type(),
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::{BooleanArray, Int32Array, StringArray};

    use super::*;

    #[test]
    fn times_sort_as_bytes() {
        let mut times = vec![-5i64, 0, 7, i64::MIN, i64::MAX, -1];
        let mut bytes: Vec<[u8; 8]> = times.iter().map(|t| sortable(*t)).collect();
        times.sort();
        bytes.sort();
        let back: Vec<i64> = bytes.iter().map(|b| unsortable(b)).collect();
        assert_eq!(back, times);
    }

    #[test]
    fn variable_length_integers_round_trip_small_ones_short() {
        let values = [0i64, 1, -1, 63, -64, 64, 1 << 40, i64::MIN, i64::MAX];
        let mut w = Writer::default();
        for v in values {
            w.zigzag(v);
        }
        w.varint(u64::MAX);
        w.short_bytes(b"span");
        let mut r = Reader(&w.0);
        for v in values {
            assert_eq!(r.zigzag().unwrap(), v);
        }
        assert_eq!(r.varint().unwrap(), u64::MAX);
        assert_eq!(r.short_bytes().unwrap(), b"span");
        assert!(r.0.is_empty());
        let mut small = Writer::default();
        small.zigzag(-64);
        small.zigzag(63);
        assert_eq!(small.0.len(), 2, "one byte each");
        let mut big = Writer::default();
        big.varint(u64::MAX);
        assert_eq!(big.0.len(), 10);
        assert!(Reader(&[0x80; 11]).varint().is_err(), "no end in 10 bytes");
        assert!(Reader(&[0x80]).varint().is_err(), "cut short");
    }

    #[test]
    fn keys_round_trip_and_nulls_are_refused() {
        let names = StringArray::from(vec![Some("a"), None, Some("ü")]);
        let codes = Int32Array::from(vec![1, 2, -3]);
        let flags = BooleanArray::from(vec![true, false, true]);
        let types = [
            KeyType::of(names.data_type()).unwrap(),
            KeyType::of(codes.data_type()).unwrap(),
            KeyType::of(flags.data_type()).unwrap(),
        ];
        let columns: [&dyn Array; 3] = [&names, &codes, &flags];
        let mut out = KeyColumns::new(&types);
        for row in 0..3 {
            let mut key = Vec::new();
            let complete = types
                .iter()
                .zip(columns)
                .all(|(t, c)| encode_key_value(t, c, row, &mut key));
            assert_eq!(complete, row != 1);
            if complete {
                let rest = out.push(Reader(&key)).unwrap();
                assert!(rest.0.is_empty());
            }
        }
        let built = out.finish();
        assert_eq!(built[0].as_string::<i32>().value(1), "ü");
        assert_eq!(built[1].as_primitive::<Int64Type>().value(1), -3);
        assert!(built[2].as_boolean().value(1));
    }
}
