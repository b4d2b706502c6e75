//! Prometheus metrics of a job, served at `/metrics` when `[metrics] listen` is set.

use std::net::SocketAddr;

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// The job's metrics.
#[derive(Debug, Clone)]
pub struct JobMetrics {
    registry: Registry,
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
    /// Seconds from barrier to committed.
    pub checkpoint_seconds: Histogram,
    /// Seconds of the catalog commit alone.
    pub commit_seconds: Histogram,
    /// Unix time of the last commit.
    pub last_commit: IntGauge,
    /// Records behind the end of each partition, as the source last reported.
    pub lag: IntGaugeVec,
    /// The source's own gauges (a change source's replication slot), by name.
    pub source_status: IntGaugeVec,
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
            registry,
        };
        for c in [
            Box::new(m.rows.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(m.bytes.clone()),
            Box::new(m.dead_letters.clone()),
            Box::new(m.checkpoints.clone()),
            Box::new(m.aborted_checkpoints.clone()),
            Box::new(m.checkpoint_seconds.clone()),
            Box::new(m.commit_seconds.clone()),
            Box::new(m.last_commit.clone()),
            Box::new(m.lag.clone()),
            Box::new(m.source_status.clone()),
        ] {
            m.registry.register(c).expect("unique metric names");
        }
        m
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        floe_process::render(&self.registry)
    }

    /// Serves `/metrics` on `listen` in the background; returns the bound address.
    pub async fn serve(&self, listen: &str) -> std::io::Result<SocketAddr> {
        floe_process::serve_metrics(self.registry.clone(), listen).await
    }
}
