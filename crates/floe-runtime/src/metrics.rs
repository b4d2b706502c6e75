//! Prometheus metrics of a job, served at `/metrics` (with the probes `/healthz` and
//! `/readyz`, and the status page at `/`) when `[metrics] listen` is set.

use std::net::SocketAddr;

use prometheus::{
    Counter, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

/// The job's metrics.
#[derive(Debug, Clone)]
pub struct JobMetrics {
    registry: Registry,
    /// Set once the job has recovered and reads its sources: `/readyz`.
    pub ready: floe_process::Readiness,
    /// What the status page at `/` shows beyond these metrics.
    pub page: crate::page::JobPage,
    /// Rows written, per table.
    pub rows: IntCounterVec,
    /// Payload bytes read, per topic.
    pub bytes: IntCounterVec,
    /// Records sent to the dead-letter table.
    pub dead_letters: IntCounter,
    /// Checkpoints committed.
    pub checkpoints: IntCounter,
    /// Checkpoints dropped (rebalance, fencing).
    pub aborted_checkpoints: IntCounter,
    /// Records written to exchange topics and confirmed before their checkpoint committed.
    pub exchange_records: IntCounter,
    /// Rows each mirror (`[sinks.<id>]`) delivered.
    pub mirror_rows: IntCounterVec,
    /// Failed delivery rounds per mirror (retried after the next commit).
    pub mirror_errors: IntCounterVec,
    /// Seconds from barrier to committed.
    pub checkpoint_seconds: Histogram,
    /// Seconds of the catalog commit alone.
    pub commit_seconds: Histogram,
    /// Seconds the loop stopped reading at a barrier (the previous commit, the operators and
    /// the writers closing their files), as Flink's synchronous checkpoint part.
    pub barrier_seconds: Histogram,
    /// Unix time of the last commit.
    pub last_commit: IntGauge,
    /// Records behind the end of each partition, as the source last reported.
    pub lag: IntGaugeVec,
    /// The source's own gauges (a change source's replication slot), by name.
    pub source_status: IntGaugeVec,
    /// Event time behind the wall clock per operator and partition (ms).
    pub watermark_lag: IntGaugeVec,
    /// Windows (and sessions) open per operator.
    pub open_windows: IntGaugeVec,
    /// Rows later than their window's lateness per operator (since the start).
    pub late_rows: IntGaugeVec,
    /// Timers waiting per operator.
    pub timers: IntGaugeVec,
    /// Traces whose spans came on two partitions (tail sampling), since the start.
    pub split_traces: IntGaugeVec,
    /// Keys in the local state store (RocksDB's estimate).
    pub state_keys: IntGauge,
    /// Bytes of the local state store (RocksDB's estimate).
    pub state_bytes: IntGauge,
    /// Bytes of keys and values the last checkpoint wrote to the state table.
    pub state_checkpoint_bytes: IntGauge,
    /// Keys the last checkpoint wrote to the state table.
    pub state_checkpoint_keys: IntGauge,
    /// Seconds to restore the owned partitions' state.
    pub state_restore_seconds: Histogram,
    /// Seconds the writer task spent writing (encoding Parquet, uploading, closing files).
    pub writer_busy: Counter,
    /// Seconds the job loop waited for room in the writer's queue: backpressure.
    pub writer_backpressure: Counter,
}

impl Default for JobMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl JobMetrics {
    /// Fresh metrics in their own registry.
    pub fn new() -> Self {
        let registry = Registry::new();
        let buckets = vec![0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
        let m = Self {
            ready: floe_process::Readiness::default(),
            page: crate::page::JobPage::default(),
            rows: IntCounterVec::new(
                Opts::new("floe_rows_total", "Rows committed, per table"),
                &["table"],
            )
            .expect("valid metric"),
            bytes: IntCounterVec::new(
                Opts::new("floe_source_bytes_total", "Payload bytes read, per topic"),
                &["topic"],
            )
            .expect("valid metric"),
            dead_letters: IntCounter::new(
                "floe_dead_letters_total",
                "Records written to the dead-letter table",
            )
            .expect("valid metric"),
            checkpoints: IntCounter::new("floe_checkpoints_total", "Checkpoints committed")
                .expect("valid metric"),
            aborted_checkpoints: IntCounter::new(
                "floe_checkpoints_aborted_total",
                "Checkpoints dropped before committing (rebalance, fenced)",
            )
            .expect("valid metric"),
            exchange_records: IntCounter::new(
                "floe_exchange_records_total",
                "Records written to exchange topics, confirmed at their checkpoint's barrier",
            )
            .expect("valid metric"),
            mirror_rows: IntCounterVec::new(
                Opts::new(
                    "floe_mirror_rows_total",
                    "Rows a sink delivered from its committed table, per sink",
                ),
                &["sink"],
            )
            .expect("valid metric"),
            mirror_errors: IntCounterVec::new(
                Opts::new(
                    "floe_mirror_errors_total",
                    "Failed delivery rounds per sink (retried after the next commit)",
                ),
                &["sink"],
            )
            .expect("valid metric"),
            checkpoint_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "floe_checkpoint_duration_seconds",
                    "From the barrier to the committed snapshot",
                )
                .buckets(buckets.clone()),
            )
            .expect("valid metric"),
            commit_seconds: Histogram::with_opts(
                HistogramOpts::new("floe_commit_duration_seconds", "The catalog commit alone")
                    .buckets(buckets.clone()),
            )
            .expect("valid metric"),
            barrier_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "floe_checkpoint_barrier_seconds",
                    "Reading paused at a barrier: the previous commit, the operators and the \
                     writers closing their files",
                )
                .buckets(buckets),
            )
            .expect("valid metric"),
            last_commit: IntGauge::new(
                "floe_last_commit_timestamp_seconds",
                "Unix time of the last committed checkpoint (age: time() - this)",
            )
            .expect("valid metric"),
            lag: IntGaugeVec::new(
                Opts::new(
                    "floe_consumer_lag_records",
                    "Records between the committed position and the end of each partition",
                ),
                &["partition"],
            )
            .expect("valid metric"),
            source_status: IntGaugeVec::new(
                Opts::new(
                    "floe_source_status",
                    "The source's own gauges, e.g. postgres_slot_retained_wal_bytes",
                ),
                &["measure"],
            )
            .expect("valid metric"),
            watermark_lag: IntGaugeVec::new(
                Opts::new(
                    "floe_watermark_lag_milliseconds",
                    "Wall clock minus the watermark, per operator and source partition",
                ),
                &["operator", "partition"],
            )
            .expect("valid metric"),
            open_windows: IntGaugeVec::new(
                Opts::new(
                    "floe_open_windows",
                    "Windows and sessions open, per operator",
                ),
                &["operator"],
            )
            .expect("valid metric"),
            late_rows: IntGaugeVec::new(
                Opts::new(
                    "floe_late_rows",
                    "Rows later than their window's allowed lateness since the start, per operator",
                ),
                &["operator"],
            )
            .expect("valid metric"),
            split_traces: IntGaugeVec::new(
                Opts::new(
                    "floe_sampling_split_traces",
                    "Traces whose spans came on more than one partition of this process since \
                     its start, per tail-sampling operator (each part is decided alone)",
                ),
                &["operator"],
            )
            .expect("valid metric"),
            timers: IntGaugeVec::new(
                Opts::new(
                    "floe_timers_pending",
                    "Timers waiting to fire, per operator",
                ),
                &["operator"],
            )
            .expect("valid metric"),
            state_keys: IntGauge::new(
                "floe_state_keys",
                "Keys in the local state store (estimate)",
            )
            .expect("valid metric"),
            state_bytes: IntGauge::new(
                "floe_state_bytes",
                "Bytes of the local state store (estimate)",
            )
            .expect("valid metric"),
            state_checkpoint_bytes: IntGauge::new(
                "floe_state_checkpoint_bytes",
                "Bytes of keys and values the last checkpoint wrote to the state table",
            )
            .expect("valid metric"),
            state_checkpoint_keys: IntGauge::new(
                "floe_state_checkpoint_keys",
                "Keys the last checkpoint wrote to the state table",
            )
            .expect("valid metric"),
            state_restore_seconds: Histogram::with_opts(HistogramOpts::new(
                "floe_state_restore_seconds",
                "Restoring the owned partitions' state from the state table",
            ))
            .expect("valid metric"),
            writer_busy: Counter::new(
                "floe_writer_busy_seconds_total",
                "Time the table writer task spent writing: encoding Parquet, uploading, closing",
            )
            .expect("valid metric"),
            writer_backpressure: Counter::new(
                "floe_writer_backpressure_seconds_total",
                "Time the job loop waited for room in the table writer's queue",
            )
            .expect("valid metric"),
            registry,
        };
        for c in [
            Box::new(m.rows.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(m.bytes.clone()),
            Box::new(m.dead_letters.clone()),
            Box::new(m.checkpoints.clone()),
            Box::new(m.aborted_checkpoints.clone()),
            Box::new(m.exchange_records.clone()),
            Box::new(m.mirror_rows.clone()),
            Box::new(m.mirror_errors.clone()),
            Box::new(m.checkpoint_seconds.clone()),
            Box::new(m.commit_seconds.clone()),
            Box::new(m.barrier_seconds.clone()),
            Box::new(m.last_commit.clone()),
            Box::new(m.lag.clone()),
            Box::new(m.source_status.clone()),
            Box::new(m.watermark_lag.clone()),
            Box::new(m.open_windows.clone()),
            Box::new(m.late_rows.clone()),
            Box::new(m.timers.clone()),
            Box::new(m.split_traces.clone()),
            Box::new(m.state_keys.clone()),
            Box::new(m.state_bytes.clone()),
            Box::new(m.state_checkpoint_bytes.clone()),
            Box::new(m.state_checkpoint_keys.clone()),
            Box::new(m.state_restore_seconds.clone()),
            Box::new(m.writer_busy.clone()),
            Box::new(m.writer_backpressure.clone()),
        ] {
            m.registry.register(c).expect("unique metric names");
        }
        m
    }

    /// Lists checkpoint `id` (0 for one that never committed), which just ended with
    /// `outcome`, on the status page, stamped with the time and the writer's clocks;
    /// `positions` are the committed ones after it (none when it was dropped).
    pub fn show_checkpoint(
        &self,
        id: u64,
        (took, commit_took): (std::time::Duration, std::time::Duration),
        rows: u64,
        outcome: String,
        positions: Option<&std::collections::BTreeMap<String, String>>,
    ) {
        let row = crate::page::CheckpointRow {
            id,
            at_ms: floe_process::now_ms(),
            took,
            commit_took,
            rows,
            outcome,
            writer_busy: self.writer_busy.get(),
            writer_backpressure: self.writer_backpressure.get(),
        };
        self.page.checkpoint(row, positions);
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        floe_process::render(&self.registry)
    }

    /// Serves the status page at `/`, `/metrics`, `/healthz` and `/readyz` on `listen` in the
    /// background; returns the bound address.
    pub async fn serve(&self, listen: &str) -> std::io::Result<SocketAddr> {
        let (registry, ready, page) =
            (self.registry.clone(), self.ready.clone(), self.page.clone());
        let render: floe_process::Page =
            std::sync::Arc::new(move || page.render(&registry.gather(), ready.is_ready()));
        floe_process::serve_metrics(
            self.registry.clone(),
            listen,
            self.ready.clone(),
            Some(render),
        )
        .await
    }
}
