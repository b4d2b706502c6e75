//! Record formats: records → rows of the streams a format declares.

use arrow_array::RecordBatch;

use crate::error::SourceError;
use crate::source::{Positions, SourceRecord};
use crate::stream::StreamSpec;

/// What one record did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Its rows (none or more) were appended.
    Rows,
    /// It empties stream `.0` (a table truncate): rows appended before it must be handed over
    /// first. It appended no rows.
    Truncate(usize),
}

/// Why a record was not appended.
#[derive(Debug)]
pub enum Refused {
    /// This record cannot be decoded (the reason); the job dead-letters it and goes on.
    Record(String),
    /// Nothing after this record can be applied correctly (e.g. a table whose type the format
    /// cannot follow): the job stops before committing anything after it.
    Stop(SourceError),
}

impl From<String> for Refused {
    fn from(reason: String) -> Self {
        Self::Record(reason)
    }
}

impl From<&str> for Refused {
    fn from(reason: &str) -> Self {
        Self::Record(reason.to_string())
    }
}

/// Records → rows of the streams a format declares.
pub trait Format: Send {
    /// The streams, in a fixed order (a stream's schema may become known, or gain columns,
    /// as records arrive: see [`streams_version`](Self::streams_version)).
    fn streams(&self) -> Vec<StreamSpec>;

    /// Changes whenever [`streams`](Self::streams) would return something else.
    fn streams_version(&self) -> u64 {
        0
    }

    /// Decodes one record and appends its rows; when refused, no rows were appended.
    fn append(&mut self, record: &SourceRecord, ingested_at_us: i64) -> Result<Appended, Refused>;

    /// Whether a refused record's raw bytes may be kept in the dead-letter table (a format
    /// that redacts personal data says no: what it could not decode it could not redact).
    fn keeps_raw(&self) -> bool {
        true
    }

    /// Rows appended since the last take, in all streams.
    fn buffered_rows(&self) -> usize;

    /// Rows appended to one stream since the last take.
    fn stream_rows(&self, stream: usize) -> usize;

    /// The appended rows per stream index (streams without rows left out); the format starts
    /// empty again.
    fn take(&mut self) -> Vec<(usize, RecordBatch)>;

    /// Position entries of the format's own, beyond the offsets (`"{topic}/{p}#…"`), after
    /// every record appended so far.
    fn positions(&self) -> Positions {
        Positions::new()
    }

    /// Restores the format's own position entries from a commit (and forgets everything
    /// appended since).
    fn seek(&mut self, _positions: &Positions) {}

    /// Event-time clocks that moved since the last call: `(stream, topic, partition, max
    /// event time µs)` — a stream read back from an exchange advances with its sources'
    /// clocks, not with its rows (see `floe_core::exchange`).
    fn take_clocks(&mut self) -> Vec<(usize, std::sync::Arc<str>, i32, i64)> {
        Vec::new()
    }

    /// The format's own gauges (e.g. counts of what it repaired while decoding), published
    /// with the source's as `floe_source_status{measure}`.
    fn status(&self) -> Vec<(&'static str, i64)> {
        Vec::new()
    }
}
