//! Streams: the named flows of rows a job carries from its reader, through its operators, to
//! the tables that land them.
//!
//! A stream is either **append** (every row is new) or a **changelog**: each row carries an
//! [`Op`] in the Int8 column [`OP_COLUMN`], Flink's row kinds — `+I` a row whose key did not
//! exist, `-U` / `+U` the old and new image of an update (`+U` alone is an upsert: the key may
//! or may not exist), `-D` a removed key. A changelog stream has key columns; the upsert sink
//! collapses its rows per key within a checkpoint. A changelog row may leave some values
//! untouched (a TOASTed Postgres value): their names, comma-separated, are in
//! [`UNCHANGED_COLUMN`], and the sink takes them from the key's previous image.
//!
//! Rows keep the source partition they were read from: a [`StreamBatch`] covers its rows with
//! [`PartitionRun`]s, in row order. Keyed state, watermarks and positions are all per source
//! partition.

use arrow_array::RecordBatch;

/// The Int8 column holding each changelog row's [`Op`].
pub const OP_COLUMN: &str = "__op";

/// The Utf8 column naming (comma-separated) the columns a changelog row left unchanged.
pub const UNCHANGED_COLUMN: &str = "__unchanged";

/// What a changelog row does to its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i8)]
pub enum Op {
    /// `+I`: a new key (it did not exist before).
    Insert = 0,
    /// `-U`: the image before an update (its key goes, unless the `+U` brings it back).
    UpdateBefore = 1,
    /// `+U`: the image after an update, or an upsert (the key may exist).
    UpdateAfter = 2,
    /// `-D`: the key is removed.
    Delete = 3,
}

impl Op {
    /// The op of a stored code.
    pub fn from_code(code: i8) -> Option<Self> {
        Some(match code {
            0 => Self::Insert,
            1 => Self::UpdateBefore,
            2 => Self::UpdateAfter,
            3 => Self::Delete,
            _ => return None,
        })
    }

    /// The stored code.
    pub fn code(self) -> i8 {
        self as i8
    }

    /// Flink's notation: `+I`, `-U`, `+U`, `-D`.
    pub fn symbol(self) -> &'static str {
        match self {
            Self::Insert => "+I",
            Self::UpdateBefore => "-U",
            Self::UpdateAfter => "+U",
            Self::Delete => "-D",
        }
    }

    /// Whether the row's image is the key's new content (`+I`, `+U`).
    pub fn is_image(self) -> bool {
        matches!(self, Self::Insert | Self::UpdateAfter)
    }
}

/// A stream a reader or an operator produces.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSpec {
    /// The stream's name in job files (`spans`, `public.orders`).
    pub name: String,
    /// The Iceberg table that lands it unless the job file names another.
    pub table: String,
    /// Its columns, once known (a Debezium topic's are known from its first event); they may
    /// gain columns over time. Changelog streams leave out [`OP_COLUMN`] and
    /// [`UNCHANGED_COLUMN`].
    pub schema: Option<iceberg::spec::Schema>,
    /// Whether rows carry an [`Op`].
    pub changelog: bool,
    /// Key columns (the identifier fields of a changelog stream's table).
    pub key: Vec<String>,
    /// The event-time column, if the stream has one.
    pub time_column: Option<String>,
    /// Partition fields of a new table (`(column, transform)`), unless the job file says.
    pub partition: Vec<(String, iceberg::spec::Transform)>,
    /// Columns that get a Parquet bloom filter.
    pub bloom_filter_columns: Vec<String>,
    /// Columns whose values rarely repeat (ids, nanosecond times): written without a
    /// dictionary.
    pub plain_columns: Vec<String>,
    /// Table properties the stream's table must carry (set when it is created and kept
    /// current at every start), e.g. a rollup's merge rules ([`crate::rollup`]).
    pub properties: Vec<(String, String)>,
}

impl StreamSpec {
    /// An append stream with no extras.
    pub fn append(name: &str, table: &str, schema: iceberg::spec::Schema) -> Self {
        Self {
            name: name.to_string(),
            table: table.to_string(),
            schema: Some(schema),
            changelog: false,
            key: Vec::new(),
            time_column: None,
            partition: Vec::new(),
            bloom_filter_columns: Vec::new(),
            plain_columns: Vec::new(),
            properties: Vec::new(),
        }
    }
}

/// Consecutive rows of a batch that came from one source partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionRun {
    /// The partition (an index the reader names, see `Reader::partition_name`).
    pub partition: u32,
    /// How many rows.
    pub rows: usize,
}

/// Rows of one stream, with the source partition of each.
#[derive(Debug, Clone)]
pub struct StreamBatch {
    /// The stream (an index into the job's streams).
    pub stream: usize,
    /// The rows.
    pub batch: RecordBatch,
    /// The rows' partitions, in row order; the runs cover the batch.
    pub runs: Vec<PartitionRun>,
}

impl StreamBatch {
    /// A batch whose rows all come from one partition.
    pub fn single(stream: usize, batch: RecordBatch, partition: u32) -> Self {
        let rows = batch.num_rows();
        Self {
            stream,
            batch,
            runs: vec![PartitionRun { partition, rows }],
        }
    }

    /// The rows of each run, as zero-copy slices: `(partition, rows)`.
    pub fn slices(&self) -> impl Iterator<Item = (u32, RecordBatch)> + '_ {
        let mut offset = 0;
        self.runs.iter().map(move |run| {
            let slice = self.batch.slice(offset, run.rows);
            offset += run.rows;
            (run.partition, slice)
        })
    }
}

/// Extends `runs` with `rows` more rows from `partition` (merging with the last run).
pub fn extend_runs(runs: &mut Vec<PartitionRun>, partition: u32, rows: usize) {
    if rows == 0 {
        return;
    }
    match runs.last_mut() {
        Some(last) if last.partition == partition => last.rows += rows,
        _ => runs.push(PartitionRun { partition, rows }),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Int64Array};

    use super::*;

    #[test]
    fn runs_merge_and_slice_in_row_order() {
        let mut runs = Vec::new();
        extend_runs(&mut runs, 1, 2);
        extend_runs(&mut runs, 1, 1);
        extend_runs(&mut runs, 0, 0);
        extend_runs(&mut runs, 2, 2);
        assert_eq!(
            runs,
            vec![
                PartitionRun {
                    partition: 1,
                    rows: 3
                },
                PartitionRun {
                    partition: 2,
                    rows: 2
                }
            ]
        );
        let column: ArrayRef = Arc::new(Int64Array::from(vec![10, 11, 12, 20, 21]));
        let batch = StreamBatch {
            stream: 0,
            batch: RecordBatch::try_from_iter([("v", column)]).unwrap(),
            runs,
        };
        let slices: Vec<(u32, Vec<i64>)> = batch
            .slices()
            .map(|(p, b)| {
                let v = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                (p, v.values().to_vec())
            })
            .collect();
        assert_eq!(slices, vec![(1, vec![10, 11, 12]), (2, vec![20, 21])]);
    }

    #[test]
    fn op_codes_round_trip() {
        for op in [Op::Insert, Op::UpdateBefore, Op::UpdateAfter, Op::Delete] {
            assert_eq!(Op::from_code(op.code()), Some(op));
        }
        assert_eq!(Op::from_code(9), None);
        assert!(Op::UpdateAfter.is_image() && !Op::Delete.is_image());
    }
}
