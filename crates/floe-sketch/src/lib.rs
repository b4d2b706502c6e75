//! Mergeable sketches whose partial states are plain Iceberg/Parquet columns.
//!
//! A window operator writes one *partial row* per (window, key, source partition). Two of
//! its aggregates cannot be stored as a single number and are stored as a sketch instead:
//!
//! * `count_distinct` as a [`HyperLogLog`] (module [`hll`]): precision 14, xxh3-64 hashes,
//!   standard error about 0.81 %;
//! * quantiles as a [`QuantileSketch`] (module [`quantile`]): DDSketch-style logarithmic
//!   buckets with relative accuracy 1 %.
//!
//! Both are stored as a `list<struct<..>>` column (Arrow `List<Struct<..>>`, item field named
//! `element`) holding only the sketch's non-empty cells, sorted by their key. Merging partial
//! rows is *exact* — merging partial sketches gives the sketch of the union of their inputs —
//! and it is simple enough to express as a `GROUP BY` over the unnested cells:
//!
//! * HyperLogLog: per register index the **maximum** rank;
//! * quantiles: per bucket key the **sum** of the counts.
//!
//! The estimate functions ([`HyperLogLog::estimate`], [`QuantileSketch::quantile`]) are
//! defined precisely enough that the same computation in SQL (DuckDB, Trino; see `SQL.md`
//! next to this crate's `Cargo.toml`) gives the same answer: the identical integer for
//! HyperLogLog, the same value up to floating-point rounding of `power` (far below 1e-9
//! relative) for quantiles.
//!
//! The stored layout, the hash and the canonical bytes of values are a compatibility
//! contract: sketches written today must merge with sketches written by any later version.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::fmt;

use arrow_schema::DataType;

pub mod hll;
mod layout;
pub mod quantile;

pub use hll::HyperLogLog;
pub use quantile::QuantileSketch;

/// Errors of sketch construction, decoding and value ingestion.
#[derive(Debug, Clone, PartialEq)]
pub enum SketchError {
    /// An Arrow array of a data type that the sketch cannot ingest.
    UnsupportedType(DataType),
    /// An Arrow array whose type is not the sketch's stored layout.
    InvalidSchema(String),
    /// Stored sketch data that violates the layout's invariants (out-of-range index, rank,
    /// key or count, or a null inside a sketch).
    InvalidData(String),
    /// A value a quantile sketch refuses: NaN, an infinity, or a magnitude above
    /// [`quantile::MAX_MAGNITUDE`].
    RefusedValue(f64),
    /// A row index past the end of the array.
    RowOutOfBounds {
        /// The requested row.
        row: usize,
        /// The array's length.
        len: usize,
    },
}

impl fmt::Display for SketchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SketchError::UnsupportedType(t) => write!(f, "unsupported data type for a sketch: {t}"),
            SketchError::InvalidSchema(s) => write!(f, "invalid sketch column type: {s}"),
            SketchError::InvalidData(s) => write!(f, "invalid sketch data: {s}"),
            SketchError::RefusedValue(x) => write!(f, "value refused by the quantile sketch: {x}"),
            SketchError::RowOutOfBounds { row, len } => {
                write!(f, "row {row} out of bounds for an array of length {len}")
            }
        }
    }
}

impl std::error::Error for SketchError {}
