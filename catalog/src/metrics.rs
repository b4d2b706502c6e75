//! Prometheus metrics of the catalog, served at `/metrics`.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry};

/// The catalog's counters and histograms, registered in their own registry.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// Requests by method, route and status.
    pub requests: IntCounterVec,
    /// Latency of successful commits (all tables of one request).
    pub commit_seconds: Histogram,
    /// Commits that lost to another writer or failed a requirement.
    pub commit_conflicts: IntCounter,
}

impl Metrics {
    /// Creates and registers the metrics.
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new("floe_catalog_requests_total", "HTTP requests served"),
            &["method", "route", "status"],
        )
        .expect("valid metric");
        let commit_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "floe_catalog_commit_duration_seconds",
                "Time to commit a table or transaction, from request to pointer swap",
            )
            .buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
        )
        .expect("valid metric");
        let commit_conflicts = IntCounter::new(
            "floe_catalog_commit_conflicts_total",
            "Commits answered 409 or retried because another writer won",
        )
        .expect("valid metric");
        for collector in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(commit_seconds.clone()),
            Box::new(commit_conflicts.clone()),
        ] {
            registry
                .register(collector)
                .expect("metric registered once");
        }
        Self {
            registry,
            requests,
            commit_seconds,
            commit_conflicts,
        }
    }

    /// The metrics as gathered now (for the status page).
    pub fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.registry.gather()
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        floe_process::render(&self.registry)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
