//! `floe-ops`: the operators of a job's pipeline, and the small interface they share.
//!
//! An [`Operator`] reads one stream and produces named output streams. The runtime calls it
//! with the input's rows (a [`StreamBatch`], whose runs say which source partition each row
//! came from), at every checkpoint barrier, and on a processing-time tick; the operator
//! answers through its [`Context`]: rows for its outputs, rows it refuses (dead letters with a
//! reason), and — for stateful operators — reads and writes of **keyed state per source
//! partition** (in `floe-state`; the runtime commits it with the outputs in one catalog
//! commit, and restores a partition's state wherever the partition goes).
//!
//! Rules every operator keeps, so that a job's output is a function of its input (kill -9,
//! rescaling, savepoints and a lost local disk give the same rows):
//! * what it emits and keeps depends only on the rows of each partition in order, never on
//!   wall-clock time or on how rows were batched — except behind an explicit processing-time
//!   setting (`idle_after`, processing-time timers), which is documented as such;
//! * everything it must remember across batches lives in keyed state (or, for per-partition
//!   watermarks, is restored from the committed checkpoint);
//! * its stored encodings are stable across versions, and [`Operator::fingerprint`] changes
//!   when a change to its configuration makes older state unreadable.
//!
//! Operators here: [`sql::Filter`] and [`sql::Select`] (DataFusion expressions, stateless),
//! [`window::Window`] (tumbling, sliding and session windows over event time, with
//! mergeable aggregates and allowed lateness), [`slo::Slo`] (error budgets and burn-rate
//! alerts per objective, on a window of its own), [`regression::Regression`] (deploys judged
//! against the version they replace), [`edges::Edges`] (the service map) and
//! [`series::SeriesOperator`] (per-series minutes judged by a model: anomalies against a
//! robust baseline, saturation forecasts by a linear trend), [`union::Union`] (several
//! streams as one, the only operator with several inputs) and [`alerts::Alerts`] (facts of
//! every service in one partition become alerts with a lifecycle and root-cause candidates).

pub mod aggregate;
pub mod alerts;
pub mod anomaly;
pub mod codec;
pub mod config;
pub mod edges;
pub mod forecast;
mod minutes;
pub mod regression;
pub mod sampling;
pub mod series;
pub mod slo;
pub mod sql;
pub mod timers;
pub mod union;
pub mod window;

use std::ops::ControlFlow;

use arrow_array::RecordBatch;
use floe_core::{PartitionRun, StreamBatch, StreamSpec};
use floe_state::StateStore;

/// An operator's failure: the job stops (bad rows are dead letters, not errors).
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// The keyed state failed.
    #[error(transparent)]
    State(#[from] floe_state::StateError),
    /// The rows or the state are not what the operator can work with.
    #[error("operator {operator}: {message}")]
    Invalid {
        /// The operator's id.
        operator: String,
        /// What is wrong.
        message: String,
    },
}

/// The result type of operators.
pub type OpResult<T> = Result<T, OpError>;

/// The hasher of the maps an operator builds per batch from row values (a batch's traces, a
/// window's groups): seeded per map, and several times cheaper than the standard SipHash,
/// which was a visible share of the operators' time.
pub(crate) type FastHash = foldhash::fast::RandomState;

/// A row an operator refused.
#[derive(Debug, Clone)]
pub struct DeadRow {
    /// The source partition it came from.
    pub partition: u32,
    /// Why.
    pub reason: String,
    /// The row, rendered `column=value, …`.
    pub row: String,
    /// The source offset of the row when it has one (`kafka_offset`), else -1.
    pub offset: i64,
}

/// What an operator works with while the runtime calls it.
pub struct Context<'a> {
    state: Option<&'a mut StateStore>,
    operator: u16,
    emitted: Vec<(usize, StreamBatch)>,
    dead: Vec<DeadRow>,
    names: &'a dyn Fn(u32) -> String,
}

impl std::fmt::Debug for Context<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("operator", &self.operator)
            .field("emitted", &self.emitted.len())
            .finish_non_exhaustive()
    }
}

impl<'a> Context<'a> {
    /// A context for operator number `operator`, with the job's state (stateful operators)
    /// and the names of source partitions.
    pub fn new(
        state: Option<&'a mut StateStore>,
        operator: u16,
        names: &'a dyn Fn(u32) -> String,
    ) -> Self {
        Self {
            state,
            operator,
            emitted: Vec::new(),
            dead: Vec::new(),
            names,
        }
    }

    /// A context for an operator inside this one (a part it is built from): the same state,
    /// its own outputs and dead letters, which the outer operator takes with
    /// [`finish`](Self::finish). The inner operator's state keys share the outer's.
    pub(crate) fn nested(&mut self) -> Context<'_> {
        Context {
            state: self.state.as_deref_mut(),
            operator: self.operator,
            emitted: Vec::new(),
            dead: Vec::new(),
            names: self.names,
        }
    }

    /// What the operator emitted (output index, rows) and refused, in order.
    pub fn finish(self) -> (Vec<(usize, StreamBatch)>, Vec<DeadRow>) {
        (self.emitted, self.dead)
    }

    /// Rows for output `output` (an index into [`Operator::outputs`]).
    pub fn emit(&mut self, output: usize, batch: StreamBatch) {
        if batch.batch.num_rows() > 0 {
            self.emitted.push((output, batch));
        }
    }

    /// Refuses row `row` of `batch` (from `partition`).
    pub fn dead_letter(&mut self, partition: u32, reason: String, batch: &RecordBatch, row: usize) {
        let offset = batch
            .column_by_name("kafka_offset")
            .and_then(|c| codec::integer_at(c.as_ref(), row))
            .unwrap_or(-1);
        self.dead.push(DeadRow {
            partition,
            reason,
            row: render_row(batch, row),
            offset,
        });
    }

    /// The name of a source partition (its position key, e.g. `otlp_spans/3`).
    pub fn partition_name(&self, partition: u32) -> String {
        (self.names)(partition)
    }

    fn store(&self) -> OpResult<&StateStore> {
        self.state.as_deref().ok_or_else(|| OpError::Invalid {
            operator: self.operator.to_string(),
            message: "a stateless operator used state".into(),
        })
    }

    fn store_mut(&mut self) -> OpResult<&mut StateStore> {
        let operator = self.operator;
        self.state.as_deref_mut().ok_or_else(|| OpError::Invalid {
            operator: operator.to_string(),
            message: "a stateless operator used state".into(),
        })
    }

    /// A key's value in a partition's state.
    pub fn get(&self, partition: u32, key: &[u8]) -> OpResult<Option<Vec<u8>>> {
        Ok(self.store()?.get(self.operator, partition, key)?)
    }

    /// The values of many keys of a partition's state, in their order (one batched lookup).
    pub fn get_many(&self, partition: u32, keys: &[&[u8]]) -> OpResult<Vec<Option<Vec<u8>>>> {
        Ok(self.store()?.get_many(self.operator, partition, keys)?)
    }

    /// Sets a key in a partition's state.
    pub fn put(&mut self, partition: u32, key: &[u8], value: &[u8]) -> OpResult<()> {
        let operator = self.operator;
        Ok(self.store_mut()?.put(operator, partition, key, value)?)
    }

    /// Removes a key from a partition's state.
    pub fn delete(&mut self, partition: u32, key: &[u8]) -> OpResult<()> {
        let operator = self.operator;
        Ok(self.store_mut()?.delete(operator, partition, key)?)
    }

    /// Calls `each(key, value)` for a partition's keys in `[from, to)`, in order, until it
    /// breaks.
    pub fn scan(
        &mut self,
        partition: u32,
        from: &[u8],
        to: Option<&[u8]>,
        each: impl FnMut(&[u8], &[u8]) -> ControlFlow<()>,
    ) -> OpResult<()> {
        let operator = self.operator;
        Ok(self
            .store_mut()?
            .scan(operator, partition, from, to, each)?)
    }
}

/// `column=value, …` of one row, for a dead letter.
pub fn render_row(batch: &RecordBatch, row: usize) -> String {
    let options = arrow_cast::display::FormatOptions::default().with_null("NULL");
    batch
        .schema()
        .fields()
        .iter()
        .zip(batch.columns())
        .filter(|(f, _)| !f.name().starts_with("__"))
        .map(|(f, c)| {
            let value = arrow_cast::display::ArrayFormatter::try_new(c.as_ref(), &options)
                .map(|fmt| fmt.value(row).to_string())
                .unwrap_or_default();
            format!("{}={value}", f.name())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What an operator tells about itself for `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct OperatorStats {
    /// Windows (or sessions) open, over all partitions.
    pub open_windows: u64,
    /// Rows that arrived after their window closed, since the start.
    pub late_rows: u64,
    /// Timers waiting to fire.
    pub timers: u64,
    /// Tail sampling: traces seen on a second partition of this process since its start.
    pub split_traces: Option<u64>,
}

/// A step of a job's pipeline.
pub trait Operator: Send {
    /// Its stable id (state and watermarks are stored under it).
    fn id(&self) -> &str;

    /// The streams it produces, its main output first.
    fn outputs(&self) -> &[StreamSpec];

    /// Rows of its input.
    fn on_batch(&mut self, input: &StreamBatch, ctx: &mut Context<'_>) -> OpResult<()>;

    /// Rows of its input number `index` (an operator with several inputs, `inputs = [...]`).
    fn on_batch_of(
        &mut self,
        _index: usize,
        input: &StreamBatch,
        ctx: &mut Context<'_>,
    ) -> OpResult<()> {
        self.on_batch(input, ctx)
    }

    /// The input stream's columns changed (a change stream gained one): `outputs` may change
    /// too. `Err` says why the operator cannot read the stream any more.
    fn on_input(&mut self, _input: &StreamSpec) -> Result<(), String> {
        Ok(())
    }

    /// The event-time clock of `partition` moved to `watermark` without rows (an idle
    /// partition no longer holds the job's clock).
    fn on_watermark(
        &mut self,
        _partition: u32,
        _watermark: i64,
        _ctx: &mut Context<'_>,
    ) -> OpResult<()> {
        Ok(())
    }

    /// The event-time clock of `partition` of an exchanged input reached `max_time` (µs, the
    /// largest event time all its sources passed, before out-of-orderness); see
    /// `floe_core::exchange`.
    fn on_event_clock(
        &mut self,
        _partition: u32,
        _max_time: i64,
        _ctx: &mut Context<'_>,
    ) -> OpResult<()> {
        Ok(())
    }

    /// Processing time passed (`now_ms`, Unix ms): processing-time timers and idleness.
    fn on_tick(&mut self, _now_ms: i64, _ctx: &mut Context<'_>) -> OpResult<()> {
        Ok(())
    }

    /// A checkpoint barrier: anything pending goes to outputs or state now.
    fn on_barrier(&mut self, _ctx: &mut Context<'_>) -> OpResult<()> {
        Ok(())
    }

    /// The state of `partition` was just restored (or is empty): rebuild what is kept in
    /// memory from it.
    fn on_restore(&mut self, _partition: u32, _ctx: &mut Context<'_>) -> OpResult<()> {
        Ok(())
    }

    /// Forgets everything held in memory (the state is about to be restored).
    fn forget(&mut self) {}

    /// The event-time watermark of each partition it has seen (µs since the epoch).
    fn watermarks(&self) -> Vec<(u32, i64)> {
        Vec::new()
    }

    /// For an operator with outputs final per minute (`floe.final-per-minute`): per
    /// partition, a time before which every row of them was emitted (µs). An exchange
    /// carrying such an output gives it this clock when there are no rows to carry one
    /// (ADR 0010): a sparse stream — anomalies — must not hold the clock behind it.
    fn final_frontiers(&self) -> Vec<(u32, i64)> {
        Vec::new()
    }

    /// `Some` for a stateful operator: a digest of everything its stored state depends on.
    /// Resuming with another fingerprint under the same id means the old state cannot be
    /// read.
    fn fingerprint(&self) -> Option<String> {
        None
    }

    /// Gauges for `/metrics`.
    fn stats(&self) -> OperatorStats {
        OperatorStats::default()
    }
}

/// `runs` of a batch filtered by `keep` (true rows survive): the surviving rows' runs.
pub fn filter_runs(runs: &[PartitionRun], keep: &arrow_array::BooleanArray) -> Vec<PartitionRun> {
    let mut out = Vec::with_capacity(runs.len());
    let mut offset = 0;
    for run in runs {
        let kept = keep.slice(offset, run.rows).true_count();
        floe_core::extend_runs(&mut out, run.partition, kept);
        offset += run.rows;
    }
    out
}
