//! Postgres column types → Iceberg types: the mapping ([`map_type`]), and the Arrow column
//! builder ([`ColumnBuilder`]) that takes a column's values in Postgres' text or binary format.
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
//! `extra_float_digits=3` ([`SESSION_OPTIONS`]), so the text forms parsed here are the only
//! ones that arrive.
//!
//! * `text` — values in Postgres' text format (pgoutput, Debezium's text forms);
//! * `binary` — values in Postgres' binary send format (the initial binary `COPY`) and the
//!   select list that makes a `COPY` send them ([`copy_expression`]);
//! * `builder` — [`ColumnBuilder`]: one Arrow column from text, binary or [`Native`] values.
//!
//! Errors are a `String` naming the value only: the caller adds the table and column and
//! decides the fault ([`floe_core::SourceError`]: the user's, an external system's, or ours).

use std::sync::Arc;

use iceberg::spec::{ListType, NestedField, PrimitiveType, Type};

// The concrete builder of a scalar, downcast from the `dyn ArrayBuilder` made for it (defined
// before the submodules so that they see it).
macro_rules! downcast {
    ($builder:expr, $ty:ty) => {
        $builder
            .as_any_mut()
            .downcast_mut::<$ty>()
            .expect("builder made for this scalar")
    };
}

mod binary;
mod builder;
mod text;

pub use binary::copy_expression;
pub use builder::{ColumnBuilder, Native};
pub use text::split_array;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
