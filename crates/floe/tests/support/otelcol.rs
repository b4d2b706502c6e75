//! A Collector of `tests/services/collector` (`FLOE_TEST_OTELCOL`) run by a test: started with
//! a config file and its environment, fed OTLP/HTTP protobuf exports, stopped with SIGTERM
//! (which flushes what it holds to its exporters).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use floe_otlp::Signal;
use floe_otlp::generate::Record;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, TracesData};
use prost::Message;
use rand::Rng;

use super::{free_port, service};

/// A running Collector.
pub(crate) struct Collector {
    child: Child,
    http: u16,
    metrics: u16,
    log: PathBuf,
}

impl Collector {
    /// Starts the Collector on `config` with `env` (besides the receiver's and its own
    /// telemetry's endpoints, on free ports: `OTLP_GRPC_ENDPOINT`, `OTLP_HTTP_ENDPOINT`,
    /// `COLLECTOR_METRICS_HOST`, `COLLECTOR_METRICS_PORT`), logging to `log`.
    pub(crate) fn start(config: &Path, args: &[&str], env: &[(&str, &str)], log: &Path) -> Self {
        let (http, metrics) = (free_port(), free_port());
        let child = Command::new(service("FLOE_TEST_OTELCOL"))
            .arg("--config")
            .arg(config)
            .args(args)
            .env("OTLP_GRPC_ENDPOINT", format!("127.0.0.1:{}", free_port()))
            .env("OTLP_HTTP_ENDPOINT", format!("127.0.0.1:{http}"))
            .env("COLLECTOR_METRICS_HOST", "127.0.0.1")
            .env("COLLECTOR_METRICS_PORT", metrics.to_string())
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        Self {
            child,
            http,
            metrics,
            log: log.to_path_buf(),
        }
    }

    /// The value of the Collector's own metric `name` (its Prometheus exposition, counters
    /// without a `_total` suffix) summed over the series whose labels contain `labels`;
    /// `None` when it has no such series yet.
    pub(crate) fn metric(&self, name: &str, labels: &str) -> Option<f64> {
        let values: Vec<f64> = super::http_get(self.metrics, "/metrics")
            .lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter(|l| l.contains(labels))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .collect();
        (!values.is_empty()).then(|| values.iter().sum())
    }

    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until the OTLP/HTTP receiver answers an empty export.
    pub(crate) async fn ready(&mut self, http: &reqwest::Client) {
        let began = Instant::now();
        loop {
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "the Collector exited: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            let answer = http
                .post(format!("http://127.0.0.1:{}/v1/traces", self.http))
                .header("content-type", "application/x-protobuf")
                .body(Vec::new())
                .send()
                .await;
            if answer.is_ok_and(|a| a.status().is_success()) {
                return;
            }
            assert!(
                began.elapsed() < Duration::from_secs(60),
                "the Collector did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends one OTLP/HTTP protobuf export (a `TracesData` is wire-compatible with an
    /// `ExportTraceServiceRequest`, and so on), which the Collector must accept.
    pub(crate) async fn send(&self, http: &reqwest::Client, record: &Record) {
        let path = match record.signal {
            Signal::Traces => "v1/traces",
            Signal::Logs => "v1/logs",
            Signal::Metrics => "v1/metrics",
            Signal::Profiles => "v1development/profiles",
        };
        let answer = http
            .post(format!("http://127.0.0.1:{}/{path}", self.http))
            .header("content-type", "application/x-protobuf")
            .body(record.bytes.clone())
            .send()
            .await
            .unwrap();
        assert!(answer.status().is_success(), "{:?}", answer.text().await);
    }

    /// SIGTERM: the Collector flushes to its exporters and exits.
    pub(crate) fn stop(mut self) {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(
            self.child.wait().unwrap().success(),
            "the Collector stops cleanly: {}",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }
}

/// The `processors:` section of a Collector with the contrib redaction processor configured
/// as Floe's tests and benchmark compare it: every key allowed, no summary attributes, and
/// Floe's own detectors' patterns as `blocked_values` — so what differs is what each does
/// with a match and where it looks.
pub(crate) fn redaction_processor() -> String {
    let patterns: Vec<String> = floe_pii::Detector::ALL
        .iter()
        .map(|d| format!("      - '{}'", d.pattern().replace('\'', "''")))
        .collect();
    format!(
        "processors:\n  redaction:\n    allow_all_keys: true\n    summary: silent\n    \
         blocked_values:\n{}\n",
        patterns.join("\n")
    )
}

/// The service of [`clock_spans`]: tests leave it out of what they compare.
pub(crate) const CLOCK_SERVICE: &str = "floe-clock";

/// `count` root SERVER spans of [`CLOCK_SERVICE`] at `at_ns`, each its own trace (so that
/// `partition_traces_by_id` spreads them over every partition): they move every partition's
/// event-time clock past what came before, closing its minutes and due traces.
pub(crate) fn clock_spans(at_ns: u64, count: usize) -> Record {
    let mut rng = rand::rng();
    let spans = (0..count)
        .map(|_| Span {
            trace_id: rng.random::<[u8; 16]>().to_vec(),
            span_id: rng.random::<[u8; 8]>().to_vec(),
            name: "tick".into(),
            kind: 2,
            start_time_unix_nano: at_ns,
            end_time_unix_nano: at_ns + 1_000_000,
            ..Default::default()
        })
        .collect();
    let data = TracesData {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue(CLOCK_SERVICE.into())),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    Record {
        signal: Signal::Traces,
        bytes: data.encode_to_vec(),
        items: count,
    }
}
