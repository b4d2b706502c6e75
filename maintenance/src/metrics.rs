//! Prometheus metrics of the daemon, served at `/metrics` when `[daemon] metrics_listen` is set.

use prometheus::{
    HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::tasks::TaskReport;

/// The daemon's metrics.
#[derive(Debug, Clone)]
pub struct DaemonMetrics {
    /// The registry holding them.
    pub registry: Registry,
    /// Runs by task and outcome (`ok`, `failed`, `skipped`).
    pub runs: IntCounterVec,
    /// Run durations by task.
    pub run_seconds: HistogramVec,
    /// Data files replaced by compaction, per table.
    pub files_rewritten: IntCounterVec,
    /// Input bytes of the replaced files, per table.
    pub bytes_rewritten: IntCounterVec,
    /// Data files written by compaction, per table.
    pub files_written: IntCounterVec,
    /// Delete files removed by compaction, per table.
    pub delete_files_removed: IntCounterVec,
    /// Compaction groups that conflicted with a writer, per table.
    pub groups_conflicted: IntCounterVec,
    /// Snapshots expired, per table.
    pub snapshots_expired: IntCounterVec,
    /// Orphan files removed, per table.
    pub orphans_removed: IntCounterVec,
    /// Unix time of the last successful run, per table and task.
    pub last_success: IntGaugeVec,
    /// Tasks running now.
    pub running: IntGauge,
    /// Tables the policies match.
    pub tables: IntGauge,
    /// The status page's schedule and latest runs.
    pub page: crate::page::DaemonPage,
}

impl Default for DaemonMetrics {
    fn default() -> Self {
        Self::new()
    }
}

fn per_table(name: &str, help: &str) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), &["table"]).expect("valid metric")
}

impl DaemonMetrics {
    /// Fresh metrics in their own registry.
    pub fn new() -> Self {
        let m = Self {
            registry: Registry::new(),
            runs: IntCounterVec::new(
                Opts::new(
                    "floe_maintenance_runs_total",
                    "Task runs by task and outcome (ok, failed, skipped)",
                ),
                &["task", "outcome"],
            )
            .expect("valid metric"),
            run_seconds: HistogramVec::new(
                HistogramOpts::new("floe_maintenance_run_seconds", "Task run durations")
                    .buckets(vec![0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0]),
                &["task"],
            )
            .expect("valid metric"),
            files_rewritten: per_table(
                "floe_maintenance_files_rewritten_total",
                "Data files replaced by compaction",
            ),
            bytes_rewritten: per_table(
                "floe_maintenance_bytes_rewritten_total",
                "Input bytes of the data files replaced by compaction",
            ),
            files_written: per_table(
                "floe_maintenance_files_written_total",
                "Data files written by compaction",
            ),
            delete_files_removed: per_table(
                "floe_maintenance_delete_files_removed_total",
                "Delete files removed by compaction",
            ),
            groups_conflicted: per_table(
                "floe_maintenance_compaction_conflicts_total",
                "Compaction partition groups that conflicted with a writer",
            ),
            snapshots_expired: per_table(
                "floe_maintenance_snapshots_expired_total",
                "Snapshots expired",
            ),
            orphans_removed: per_table(
                "floe_maintenance_orphans_removed_total",
                "Unreferenced files removed",
            ),
            last_success: IntGaugeVec::new(
                Opts::new(
                    "floe_maintenance_last_success_timestamp_seconds",
                    "Unix time of the last successful run",
                ),
                &["table", "task"],
            )
            .expect("valid metric"),
            running: IntGauge::new("floe_maintenance_running", "Tasks running now")
                .expect("valid metric"),
            tables: IntGauge::new("floe_maintenance_tables", "Tables the policies match")
                .expect("valid metric"),
            page: crate::page::DaemonPage::default(),
        };
        for c in [
            Box::new(m.runs.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(m.run_seconds.clone()),
            Box::new(m.files_rewritten.clone()),
            Box::new(m.bytes_rewritten.clone()),
            Box::new(m.files_written.clone()),
            Box::new(m.delete_files_removed.clone()),
            Box::new(m.groups_conflicted.clone()),
            Box::new(m.snapshots_expired.clone()),
            Box::new(m.orphans_removed.clone()),
            Box::new(m.last_success.clone()),
            Box::new(m.running.clone()),
            Box::new(m.tables.clone()),
        ] {
            m.registry.register(c).expect("unique metric names");
        }
        m
    }

    /// Counts fires of `task` that got no run of their own.
    pub fn skip(&self, task: crate::tasks::Task, fires: usize) {
        self.runs
            .with_label_values(&[&task.to_string(), "skipped"])
            .inc_by(fires as u64);
    }

    /// Counts what a successful run of `task` on `table` did.
    pub fn record(&self, table: &str, task: &str, report: &TaskReport, seconds: f64) {
        self.runs.with_label_values(&[task, "ok"]).inc();
        self.run_seconds.with_label_values(&[task]).observe(seconds);
        for (counter, value) in [
            (&self.files_rewritten, report.files_rewritten),
            (&self.bytes_rewritten, report.bytes_rewritten),
            (&self.files_written, report.files_written),
            (&self.delete_files_removed, report.delete_files_removed),
            (&self.groups_conflicted, report.groups_conflicted),
            (&self.snapshots_expired, report.snapshots_expired),
        ] {
            counter.with_label_values(&[table]).inc_by(value);
        }
        if task == "orphans" {
            self.orphans_removed
                .with_label_values(&[table])
                .inc_by(report.files_deleted);
        }
        self.last_success
            .with_label_values(&[table, task])
            .set(crate::state::now_ms() / 1000);
    }
}
