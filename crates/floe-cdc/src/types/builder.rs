//! [`ColumnBuilder`]: one Arrow column of a mapped Postgres type, built from values in
//! Postgres' text format, its binary format, or already typed ([`Native`], as a Debezium event
//! carries them — no text round trip).
//!
//! Errors are a `String` naming the value only: the caller adds the table, column and fault.

use arrow_array::ArrayRef;
use arrow_array::builder::{
    ArrayBuilder, BooleanBuilder, Date32Builder, Decimal128Builder, FixedSizeBinaryBuilder,
    Float32Builder, Float64Builder, Int32Builder, Int64Builder, LargeBinaryBuilder, ListBuilder,
    StringBuilder, Time64MicrosecondBuilder, TimestampMicrosecondBuilder,
};

use super::text::{self, split_array, utf8};
use super::{PgType, Scalar, binary};

/// A scalar value already in its column's Arrow representation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Native {
    /// A `decimal(p,s)` value, unscaled (`12.50` at scale 2 is 1250).
    Decimal(i128),
    /// A `date`: days since 1970-01-01.
    Date(i32),
    /// A `time`: microseconds since midnight.
    Time(i64),
    /// A `timestamp` or `timestamptz`: microseconds since 1970-01-01 00:00:00 (UTC).
    Timestamp(i64),
}

/// Builds one Arrow column from text, binary or native values.
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
            return text::append_scalar(self.ty.scalar, self.inner.as_mut(), text);
        }
        let list = downcast!(self.inner, ListBuilder<Box<dyn ArrayBuilder>>);
        match text {
            None => list.append_null(),
            Some(t) => {
                for element in split_array(utf8(t)?)? {
                    text::append_scalar(
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
    /// [`copy_expression`](super::copy_expression) sends it.
    pub fn append_binary(&mut self, value: Option<&[u8]>) -> Result<(), String> {
        if !self.ty.array {
            return binary::append_scalar(self.ty.scalar, self.inner.as_mut(), value);
        }
        let list = downcast!(self.inner, ListBuilder<Box<dyn ArrayBuilder>>);
        let Some(v) = value else {
            list.append_null();
            return Ok(());
        };
        binary::each_array_element(v, |element| {
            binary::append_scalar(self.ty.scalar, list.values().as_mut(), element)
        })?;
        list.append(true);
        Ok(())
    }

    /// Appends one typed value to a scalar column of its type (a decimal at the column's
    /// scale; a date to a `date` column; …). No range is checked beyond the text path's: the
    /// value is what the text form of it would have parsed to.
    pub fn append_native(&mut self, value: Native) -> Result<(), String> {
        let builder = self.inner.as_mut();
        match (self.ty, value) {
            (
                PgType {
                    scalar: Scalar::Decimal { .. },
                    array: false,
                },
                Native::Decimal(unscaled),
            ) => downcast!(builder, Decimal128Builder).append_value(unscaled),
            (
                PgType {
                    scalar: Scalar::Date,
                    array: false,
                },
                Native::Date(days),
            ) => downcast!(builder, Date32Builder).append_value(days),
            (
                PgType {
                    scalar: Scalar::Time,
                    array: false,
                },
                Native::Time(micros),
            ) => downcast!(builder, Time64MicrosecondBuilder).append_value(micros),
            (
                PgType {
                    scalar: Scalar::Timestamp | Scalar::Timestamptz,
                    array: false,
                },
                Native::Timestamp(micros),
            ) => downcast!(builder, TimestampMicrosecondBuilder).append_value(micros),
            (ty, value) => return Err(format!("{value:?} is not a value of a {ty:?} column")),
        }
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
    use arrow_array::types::{
        Date32Type, Decimal128Type, Int32Type, Time64MicrosecondType, TimestampMicrosecondType,
    };

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
    }

    #[test]
    fn text_arrays_and_booleans() {
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
        assert!(build(scalar(Scalar::Bool), &[Some("t"), Some("x")]).is_err());
    }

    #[test]
    fn binary_dates_and_arrays() {
        let mut d = ColumnBuilder::new(scalar(Scalar::Date), 1);
        d.append_binary(Some(&1i32.to_be_bytes())).unwrap();
        assert!(d.append_binary(Some(&i32::MAX.to_be_bytes())).is_err());
        let d = d.finish();
        assert_eq!(d.as_primitive::<Date32Type>().value(0), 10_958);

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

    /// The typed path gives what the text path parses the same value's text form to.
    #[test]
    fn native_decimals_equal_their_text_form() {
        let ty = scalar(Scalar::Decimal {
            precision: 38,
            scale: 2,
        });
        let max = 10i128.pow(38) - 1;
        let cases: [(&str, i128); 5] = [
            ("12.50", 1250),
            ("-0.05", -5),
            ("0.00", 0),
            ("999999999999999999999999999999999999.99", max),
            ("-999999999999999999999999999999999999.99", -max),
        ];
        let mut typed = ColumnBuilder::new(ty, cases.len());
        for (_, unscaled) in cases {
            typed.append_native(Native::Decimal(unscaled)).unwrap();
        }
        let typed = typed.finish();
        let text = build(ty, &cases.map(|(text, _)| Some(text))).unwrap();
        assert_eq!(typed.as_ref(), text.as_ref());
        assert_eq!(
            typed.data_type(),
            &arrow_schema::DataType::Decimal128(38, 2)
        );
        assert_eq!(typed.as_primitive::<Decimal128Type>().value(3), max);
        assert_eq!(typed.as_primitive::<Decimal128Type>().value(4), -max);
    }

    #[test]
    fn native_dates_times_and_timestamps_equal_their_text_form() {
        let mut date = ColumnBuilder::new(scalar(Scalar::Date), 1);
        date.append_native(Native::Date(19_723)).unwrap();
        assert_eq!(
            date.finish().as_ref(),
            build(scalar(Scalar::Date), &[Some("2024-01-01")])
                .unwrap()
                .as_ref()
        );

        let mut time = ColumnBuilder::new(scalar(Scalar::Time), 1);
        time.append_native(Native::Time(1_500_000)).unwrap();
        let time = time.finish();
        assert_eq!(
            time.as_primitive::<Time64MicrosecondType>().value(0),
            1_500_000
        );
        assert_eq!(
            time.as_ref(),
            build(scalar(Scalar::Time), &[Some("00:00:01.500000")])
                .unwrap()
                .as_ref()
        );

        for s in [Scalar::Timestamp, Scalar::Timestamptz] {
            let mut ts = ColumnBuilder::new(scalar(s), 1);
            ts.append_native(Native::Timestamp(1_704_067_200_123_456))
                .unwrap();
            let text = if s == Scalar::Timestamp {
                "2024-01-01 00:00:00.123456"
            } else {
                "2024-01-01 00:00:00.123456+00"
            };
            assert_eq!(
                ts.finish().as_ref(),
                build(scalar(s), &[Some(text)]).unwrap().as_ref()
            );
        }
    }

    #[test]
    fn a_native_value_of_another_type_is_refused() {
        let mut b = ColumnBuilder::new(scalar(Scalar::Long), 1);
        assert!(b.append_native(Native::Decimal(1)).is_err());
        let mut list = ColumnBuilder::new(
            PgType {
                scalar: Scalar::Date,
                array: true,
            },
            1,
        );
        assert!(list.append_native(Native::Date(1)).is_err());
        assert_eq!(b.finish().len(), 0);
    }
}
