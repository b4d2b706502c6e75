//! A generator of realistic OTLP data: what `floe quickstart` ingests and what the benchmarks
//! and tests produce.
//!
//! A small shop of services calls each other: `frontend` → `checkout` → `payments` →
//! `inventory` → `postgres`. Every request is one trace: a SERVER span per service, each the
//! child of its caller's, with log-normal latencies. Errors originate in one service (each has
//! its own rate, [`ERROR_ORIGINS`]) and propagate to its caller with probability
//! [`PROPAGATION`], and so on up; the origin records the exception, its callers only fail.
//! [`Deploy`]s roll a new `service.version` out at a known event time, optionally with more
//! errors and slower responses. Logs go along the way (with trace context, more severe on
//! errors), and every tick each service reports metrics of every kind: a CPU
//! gauge, a monotonic request counter, a latency histogram and exponential histogram, and a GC
//! pause summary, and CPU profiles whose samples link to recent spans. Records are
//! protobuf-encoded exactly as the Collector's Kafka exporter writes
//! them, so the pipeline decodes real bytes. The sequence is deterministic for a seed.

use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, LogsData, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, ExponentialHistogram, ExponentialHistogramDataPoint, Gauge, Histogram,
    HistogramDataPoint, Metric, MetricsData, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
    Summary, SummaryDataPoint, exponential_histogram_data_point, metric, number_data_point,
    summary_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    ResourceSpans, ScopeSpans, Span, Status, TracesData, span,
};
use std::collections::BTreeMap;

use prost::Message as _;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::decode::Signal;

/// Spans per service that profile samples may link to.
const RECENT_SPANS: usize = 32;

/// Frames every service's stacks share, root first (`main` calls the runtime's scheduler,
/// which calls the request handler), and the leaves stacks end in.
const SHARED_FRAMES: &[(&str, &str)] = &[
    ("main", "main.go"),
    ("runtime.schedule", "runtime/proc.go"),
    ("net/http.(*conn).serve", "net/http/server.go"),
];
const LEAF_FRAMES: &[(&str, &str)] = &[
    ("encoding/json.Marshal", "encoding/json/encode.go"),
    ("database/sql.(*DB).QueryContext", "database/sql/sql.go"),
    ("crypto/sha256.block", "crypto/sha256/sha256block.go"),
    ("runtime.mallocgc", "runtime/malloc.go"),
];

const SERVICES: &[(&str, &[&str])] = &[
    (
        "frontend",
        &["GET /", "GET /product", "POST /cart", "POST /checkout"],
    ),
    ("checkout", &["PlaceOrder", "GetCart"]),
    ("payments", &["Charge", "Refund"]),
    ("inventory", &["Reserve", "Lookup"]),
    (
        "postgres",
        &["SELECT orders", "INSERT orders", "UPDATE stock"],
    ),
];

/// Per service (in [`SERVICES`] order), the probability that a request's error originates
/// there: 2.4 % of requests fail somewhere.
pub const ERROR_ORIGINS: [f64; 5] = [0.002, 0.004, 0.008, 0.004, 0.006];

/// The probability that a failed call fails its caller too (the rest are retried or
/// degraded gracefully).
pub const PROPAGATION: f64 = 0.7;

/// The version every service runs before its first [`Deploy`].
pub const FIRST_VERSION: &str = "1.0.0";

/// A new version of one service, live from an event time on: from `at_unix_nano`, `service`
/// reports `service.version = version`, its errors originate `error_factor` times as often
/// and it responds `latency_factor` times slower. Factors of 1 make an incident-free deploy.
#[derive(Debug, Clone, PartialEq)]
pub struct Deploy {
    /// A service of [`SERVICES`].
    pub service: String,
    /// The version it reports from `at_unix_nano` on.
    pub version: String,
    /// Event time of the rollout, ns since the epoch.
    pub at_unix_nano: u64,
    /// Multiplies the rate of errors originating in the service.
    pub error_factor: f64,
    /// Multiplies the service's latencies.
    pub latency_factor: f64,
}

/// Something going wrong in one service between two event times, for alerting to find.
#[derive(Debug, Clone, PartialEq)]
pub struct Incident {
    /// A service of [`SERVICES`].
    pub service: String,
    /// What goes wrong.
    pub kind: IncidentKind,
    /// Event time it starts, ns since the epoch.
    pub from_unix_nano: u64,
    /// Event time it ends (exclusive).
    pub until_unix_nano: u64,
}

/// What an [`Incident`] does.
#[derive(Debug, Clone, PartialEq)]
pub enum IncidentKind {
    /// Errors originate `factor` times as often in the service; they propagate to its callers
    /// as any error does ([`PROPAGATION`]) — a failing dependency.
    Errors {
        /// Multiplies the rate of errors originating in the service.
        factor: f64,
    },
    /// One endpoint (span name) of the service responds `factor` times slower.
    Slow {
        /// The span name.
        endpoint: String,
        /// Multiplies its latency.
        factor: f64,
    },
    /// The service's connection pool ([`POOL_GAUGE`], reported in every metrics record once
    /// the service has such an incident) climbs from its usual level to full over the
    /// incident, then drops back.
    Saturation,
}

/// The gauge a [`IncidentKind::Saturation`] drives: the share of the pool in use.
pub const POOL_GAUGE: &str = "db.client.connection.usage";

/// The pool gauge's usual level (± 0.03 of noise).
pub const POOL_LEVEL: f64 = 0.35;

/// Produces OTLP records (protobuf bytes) of all three signals.
#[derive(Debug)]
pub struct Generator {
    rng: StdRng,
    /// Nanoseconds since the epoch of the next request.
    clock: u64,
    requests: u64,
    /// Recent spans per service (trace id, span id), which profile samples link to.
    recent: Vec<Vec<(Vec<u8>, Vec<u8>)>>,
    /// Rollouts, by event time.
    deploys: Vec<Deploy>,
    /// Incidents.
    incidents: Vec<Incident>,
    /// The gap between requests' starts (ns), drawn uniformly.
    gap: std::ops::Range<u64>,
}

/// One generated record.
#[derive(Debug, Clone)]
pub struct Record {
    /// Its signal.
    pub signal: Signal,
    /// Protobuf bytes of `TracesData` / `LogsData` / `MetricsData`.
    pub bytes: Vec<u8>,
    /// Items (spans, log records, data points) in it.
    pub items: usize,
}

/// A string attribute, for tests and tools that build their own requests.
pub fn string_attribute(key: &str, value: &str) -> KeyValue {
    kv(key, value)
}

fn kv(key: &str, value: impl Into<Val>) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(match value.into() {
                Val::S(s) => any_value::Value::StringValue(s),
                Val::I(i) => any_value::Value::IntValue(i),
                Val::B(b) => any_value::Value::BoolValue(b),
            }),
        }),
        ..Default::default()
    }
}

enum Val {
    S(String),
    I(i64),
    B(bool),
}
impl From<&str> for Val {
    fn from(s: &str) -> Self {
        Val::S(s.to_string())
    }
}
impl From<String> for Val {
    fn from(s: String) -> Self {
        Val::S(s)
    }
}
impl From<i64> for Val {
    fn from(i: i64) -> Self {
        Val::I(i)
    }
}
impl From<bool> for Val {
    fn from(b: bool) -> Self {
        Val::B(b)
    }
}

/// The team every generated service belongs to (resource attribute `team`).
const TEAM: &str = "shop-core";

fn resource(service: &str, version: &str, instance: usize) -> Resource {
    Resource {
        attributes: vec![
            kv("service.name", service),
            kv("service.namespace", "shop"),
            kv("service.instance.id", format!("{service}-{instance}")),
            kv("service.version", version),
            kv("team", TEAM),
            kv("deployment.environment.name", "quickstart"),
            kv("host.name", format!("node-{}", instance % 3)),
        ],
        ..Default::default()
    }
}

fn scope() -> Option<InstrumentationScope> {
    Some(InstrumentationScope {
        name: "floe.quickstart".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        ..Default::default()
    })
}

impl Generator {
    /// A generator starting at `start_unix_nano`, deterministic for `seed`.
    pub fn new(seed: u64, start_unix_nano: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            clock: start_unix_nano,
            requests: 0,
            recent: vec![Vec::new(); SERVICES.len()],
            deploys: Vec::new(),
            incidents: Vec::new(),
            gap: 100_000..2_000_000,
        }
    }

    /// The generator with `requests_per_second` requests a second of event time on average
    /// (default: about 950).
    pub fn with_rate(mut self, requests_per_second: u64) -> Self {
        let mean = 1_000_000_000 / requests_per_second.max(1);
        self.gap = (mean / 10).max(1)..(mean * 19 / 10).max(2);
        self
    }

    /// The generator with `deploy` rolled out at its time. Panics if its service is not one
    /// of [`SERVICES`] or its factors are not positive.
    pub fn with_deploy(mut self, deploy: Deploy) -> Self {
        assert!(
            SERVICES.iter().any(|(s, _)| *s == deploy.service),
            "no service {}",
            deploy.service
        );
        assert!(deploy.error_factor > 0.0 && deploy.latency_factor > 0.0);
        self.deploys.push(deploy);
        self.deploys.sort_by_key(|d| d.at_unix_nano);
        self
    }

    /// The generator with `incident`. Panics if its service is not one of [`SERVICES`], its
    /// factor is not positive or it ends before it starts.
    pub fn with_incident(mut self, incident: Incident) -> Self {
        let tier = SERVICES
            .iter()
            .position(|(s, _)| *s == incident.service)
            .unwrap_or_else(|| panic!("no service {}", incident.service));
        match &incident.kind {
            IncidentKind::Errors { factor } => assert!(*factor > 0.0),
            IncidentKind::Slow { endpoint, factor } => {
                assert!(*factor > 0.0);
                assert!(
                    SERVICES[tier].1.contains(&endpoint.as_str()),
                    "no endpoint {endpoint} of {}",
                    incident.service
                );
            }
            IncidentKind::Saturation => {}
        }
        assert!(incident.from_unix_nano < incident.until_unix_nano);
        self.incidents.push(incident);
        self
    }

    /// The incidents of `tier` going on at `time`.
    fn incidents_at(&self, tier: usize, time: u64) -> impl Iterator<Item = &IncidentKind> {
        self.incidents
            .iter()
            .filter(move |i| {
                i.service == SERVICES[tier].0
                    && i.from_unix_nano <= time
                    && time < i.until_unix_nano
            })
            .map(|i| &i.kind)
    }

    /// The pool gauge of `tier` at `time`, if an incident ever saturates it.
    fn pool_usage(&mut self, tier: usize, time: u64) -> Option<f64> {
        let mut saturations = self
            .incidents
            .iter()
            .filter(|i| i.service == SERVICES[tier].0 && i.kind == IncidentKind::Saturation)
            .peekable();
        saturations.peek()?;
        let climb = saturations
            .filter(|i| i.from_unix_nano <= time && time < i.until_unix_nano)
            .map(|i| {
                (time - i.from_unix_nano) as f64 / (i.until_unix_nano - i.from_unix_nano) as f64
            })
            .fold(0.0, f64::max);
        let noise = self.rng.random_range(-0.03..0.03);
        Some((POOL_LEVEL + (1.0 - POOL_LEVEL) * climb + noise).clamp(0.0, 1.0))
    }

    /// The endpoints (span names) of generated service `service`.
    pub fn endpoints(service: &str) -> Option<Vec<&'static str>> {
        SERVICES
            .iter()
            .find(|(s, _)| *s == service)
            .map(|(_, e)| e.to_vec())
    }

    /// The names of the generated services, callers first.
    pub fn services() -> impl Iterator<Item = &'static str> {
        SERVICES.iter().map(|(s, _)| *s)
    }

    /// The version `tier` runs at `time`.
    fn version(&self, tier: usize, time: u64) -> String {
        self.deployed(tier, time)
            .map_or(FIRST_VERSION.to_string(), |d| d.version.clone())
    }

    /// The deploy `tier` runs at `time`, if any.
    fn deployed(&self, tier: usize, time: u64) -> Option<&Deploy> {
        self.deploys
            .iter()
            .rev()
            .find(|d| d.at_unix_nano <= time && d.service == SERVICES[tier].0)
    }

    fn id<const N: usize>(&mut self) -> Vec<u8> {
        let mut bytes = [0u8; N];
        self.rng.fill(&mut bytes[..]);
        bytes[0] |= 1; // never all zero
        bytes.to_vec()
    }

    /// Log-normal latency in ns around `median_ms`.
    fn latency(&mut self, median_ms: f64) -> u64 {
        let normal: f64 = (0..6).map(|_| self.rng.random::<f64>()).sum::<f64>() - 3.0;
        (median_ms * (0.6 * normal).exp() * 1e6) as u64
    }

    /// `requests` traces with their logs, as one traces record and one logs record. Each
    /// service's spans and logs share a resource per version it ran (two across a deploy).
    pub fn requests(&mut self, requests: usize) -> [Record; 2] {
        type ByResource<T> = BTreeMap<(usize, String), Vec<T>>;
        let mut spans: ByResource<Span> = BTreeMap::new();
        let mut logs: ByResource<LogRecord> = BTreeMap::new();
        for _ in 0..requests {
            self.requests += 1;
            self.clock += self.rng.random_range(self.gap.clone());
            let trace_id = self.id::<16>();
            let now = self.clock;
            let deployed: Vec<Option<Deploy>> = (0..SERVICES.len())
                .map(|tier| self.deployed(tier, now).cloned())
                .collect();
            // Where an error originates, and how far up it propagates: the deepest callee
            // first, so a service fails when its own error originates or its callee's reaches it.
            let mut origin = [false; SERVICES.len()];
            let mut failed = [false; SERVICES.len()];
            for tier in (0..SERVICES.len()).rev() {
                let incidents: f64 = self
                    .incidents_at(tier, now)
                    .map(|i| match i {
                        IncidentKind::Errors { factor } => *factor,
                        _ => 1.0,
                    })
                    .product();
                let factor = deployed[tier].as_ref().map_or(1.0, |d| d.error_factor) * incidents;
                origin[tier] = self
                    .rng
                    .random_bool((ERROR_ORIGINS[tier] * factor).min(1.0));
                let propagated = tier + 1 < SERVICES.len()
                    && failed[tier + 1]
                    && self.rng.random_bool(PROPAGATION);
                failed[tier] = origin[tier] || propagated;
            }
            let mut parent: Vec<u8> = Vec::new();
            let mut start = now;
            // One SERVER span per service, each a child of its caller's.
            for (tier, (service, operations)) in SERVICES.iter().enumerate() {
                let span_id = self.id::<8>();
                let slower = deployed[tier].as_ref().map_or(1.0, |d| d.latency_factor);
                let mut duration = (self.latency(40.0 / (tier + 1) as f64) as f64 * slower) as u64;
                let name = operations[self.rng.random_range(0..operations.len())];
                for incident in self.incidents_at(tier, now) {
                    if let IncidentKind::Slow { endpoint, factor } = incident
                        && endpoint == name
                    {
                        duration = (duration as f64 * factor) as u64;
                    }
                }
                let version = self.version(tier, now);
                let mut events = Vec::new();
                let message = if origin[tier] {
                    events.push(span::Event {
                        time_unix_nano: start + duration / 2,
                        name: "exception".into(),
                        attributes: vec![
                            kv("exception.type", "TimeoutError"),
                            kv("exception.message", "upstream timed out"),
                        ],
                        ..Default::default()
                    });
                    "upstream timed out".to_string()
                } else if failed[tier] {
                    format!("{} failed", SERVICES[tier + 1].0)
                } else {
                    String::new()
                };
                let recent = &mut self.recent[tier];
                if recent.len() == RECENT_SPANS {
                    recent.remove(0);
                }
                recent.push((trace_id.clone(), span_id.clone()));
                spans
                    .entry((tier, version.clone()))
                    .or_default()
                    .push(Span {
                        trace_id: trace_id.clone(),
                        span_id: span_id.clone(),
                        parent_span_id: parent.clone(),
                        name: name.into(),
                        kind: 2, // SERVER
                        start_time_unix_nano: start,
                        end_time_unix_nano: start + duration,
                        attributes: vec![
                            kv(
                                "http.request.method",
                                if name.starts_with("GET") {
                                    "GET"
                                } else {
                                    "POST"
                                },
                            ),
                            kv(
                                "http.response.status_code",
                                if failed[tier] { 500i64 } else { 200i64 },
                            ),
                            kv("shop.request", self.requests as i64),
                        ],
                        events,
                        status: Some(Status {
                            code: if failed[tier] { 2 } else { 0 },
                            message: message.clone(),
                        }),
                        flags: 1,
                        ..Default::default()
                    });
                let (severity, text, body) = if failed[tier] {
                    (17, "ERROR", format!("{name} failed: {message}"))
                } else {
                    (
                        9,
                        "INFO",
                        format!("{name} done in {} ms ({service})", duration / 1_000_000),
                    )
                };
                logs.entry((tier, version)).or_default().push(LogRecord {
                    time_unix_nano: start + duration,
                    observed_time_unix_nano: start + duration + 1_000,
                    severity_number: severity,
                    severity_text: text.into(),
                    body: Some(AnyValue {
                        value: Some(any_value::Value::StringValue(body)),
                    }),
                    attributes: vec![kv("operation", name), kv("retry", false)],
                    trace_id: trace_id.clone(),
                    span_id: span_id.clone(),
                    flags: 1,
                    ..Default::default()
                });
                parent = span_id;
                start += duration / 10;
            }
        }
        let instance = self.rng.random_range(0..3);
        let traces = TracesData {
            resource_spans: spans
                .into_iter()
                .map(|((i, version), spans)| ResourceSpans {
                    resource: Some(resource(SERVICES[i].0, &version, instance)),
                    scope_spans: vec![ScopeSpans {
                        scope: scope(),
                        spans,
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect(),
        };
        let logs = LogsData {
            resource_logs: logs
                .into_iter()
                .map(|((i, version), log_records)| ResourceLogs {
                    resource: Some(resource(SERVICES[i].0, &version, instance)),
                    scope_logs: vec![ScopeLogs {
                        scope: scope(),
                        log_records,
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect(),
        };
        let n = requests * SERVICES.len();
        [
            Record {
                signal: Signal::Traces,
                bytes: traces.encode_to_vec(),
                items: n,
            },
            Record {
                signal: Signal::Logs,
                bytes: logs.encode_to_vec(),
                items: n,
            },
        ]
    }

    /// One metrics record: every service reports one data point of every metric kind.
    pub fn metrics(&mut self) -> Record {
        let time = self.clock;
        let start = time.saturating_sub(60_000_000_000);
        let mut resource_metrics = Vec::new();
        let mut items = 0;
        for (i, (service, _)) in SERVICES.iter().enumerate() {
            let attrs = vec![kv("http.route", "/"), kv("region", "eu-west-1")];
            let bounds = vec![5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0];
            let buckets: Vec<u64> = (0..=bounds.len())
                .map(|_| self.rng.random_range(0..200))
                .collect();
            let count: u64 = buckets.iter().sum();
            let point = |value| NumberDataPoint {
                attributes: attrs.clone(),
                start_time_unix_nano: start,
                time_unix_nano: time,
                value: Some(value),
                ..Default::default()
            };
            let mut metrics = vec![
                Metric {
                    name: "process.cpu.utilization".into(),
                    unit: "1".into(),
                    description: "CPU in use".into(),
                    data: Some(metric::Data::Gauge(Gauge {
                        data_points: vec![point(number_data_point::Value::AsDouble(
                            self.rng.random_range(0.05..0.95),
                        ))],
                    })),
                    ..Default::default()
                },
                Metric {
                    name: "http.server.requests".into(),
                    unit: "{request}".into(),
                    data: Some(metric::Data::Sum(Sum {
                        data_points: vec![point(number_data_point::Value::AsInt(
                            (self.requests * (i as u64 + 1)) as i64,
                        ))],
                        aggregation_temporality: AggregationTemporality::Cumulative as i32,
                        is_monotonic: true,
                    })),
                    ..Default::default()
                },
                Metric {
                    name: "http.server.request.duration".into(),
                    unit: "ms".into(),
                    data: Some(metric::Data::Histogram(Histogram {
                        data_points: vec![HistogramDataPoint {
                            attributes: attrs.clone(),
                            start_time_unix_nano: start,
                            time_unix_nano: time,
                            count,
                            sum: Some(count as f64 * 37.5),
                            bucket_counts: buckets.clone(),
                            explicit_bounds: bounds,
                            min: Some(0.4),
                            max: Some(812.0),
                            ..Default::default()
                        }],
                        aggregation_temporality: AggregationTemporality::Delta as i32,
                    })),
                    ..Default::default()
                },
                Metric {
                    name: "http.server.request.duration.exp".into(),
                    unit: "ms".into(),
                    data: Some(metric::Data::ExponentialHistogram(ExponentialHistogram {
                        data_points: vec![ExponentialHistogramDataPoint {
                            attributes: attrs.clone(),
                            start_time_unix_nano: start,
                            time_unix_nano: time,
                            count,
                            sum: Some(count as f64 * 37.5),
                            scale: 3,
                            zero_count: 1,
                            positive: Some(exponential_histogram_data_point::Buckets {
                                offset: 10,
                                bucket_counts: buckets,
                            }),
                            min: Some(0.4),
                            max: Some(812.0),
                            ..Default::default()
                        }],
                        aggregation_temporality: AggregationTemporality::Delta as i32,
                    })),
                    ..Default::default()
                },
                Metric {
                    name: "runtime.gc.pause".into(),
                    unit: "ms".into(),
                    data: Some(metric::Data::Summary(Summary {
                        data_points: vec![SummaryDataPoint {
                            attributes: attrs.clone(),
                            start_time_unix_nano: start,
                            time_unix_nano: time,
                            count: 120,
                            sum: 360.0,
                            quantile_values: [(0.5, 2.0), (0.9, 5.5), (0.99, 12.0)]
                                .into_iter()
                                .map(|(quantile, value)| summary_data_point::ValueAtQuantile {
                                    quantile,
                                    value,
                                })
                                .collect(),
                            ..Default::default()
                        }],
                    })),
                    ..Default::default()
                },
            ];
            if let Some(usage) = self.pool_usage(i, time) {
                metrics.push(Metric {
                    name: POOL_GAUGE.into(),
                    unit: "1".into(),
                    description: "The share of the connection pool in use".into(),
                    data: Some(metric::Data::Gauge(Gauge {
                        data_points: vec![NumberDataPoint {
                            attributes: vec![kv("db.client.connection.pool.name", "main")],
                            start_time_unix_nano: start,
                            time_unix_nano: time,
                            value: Some(number_data_point::Value::AsDouble(usage)),
                            ..Default::default()
                        }],
                    })),
                    ..Default::default()
                });
            }
            items += metrics.len();
            resource_metrics.push(ResourceMetrics {
                resource: Some(resource(service, &self.version(i, time), 0)),
                scope_metrics: vec![ScopeMetrics {
                    scope: scope(),
                    metrics,
                    ..Default::default()
                }],
                ..Default::default()
            });
        }
        Record {
            signal: Signal::Metrics,
            bytes: MetricsData { resource_metrics }.encode_to_vec(),
            items,
        }
    }

    /// One profiles record: every service reports one CPU profile of `samples` samples, on
    /// stacks that share their root frames across services and their leaves within one; about
    /// half the samples link to one of the service's recent spans (from [`Self::requests`]).
    /// The dictionary is shared by the whole record, as the protocol has it.
    pub fn profiles(&mut self, samples: usize) -> Record {
        use opentelemetry_proto::tonic::profiles::v1development::{
            Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile, ProfilesData,
            ProfilesDictionary, ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType,
        };
        let mut d = ProfilesDictionary {
            string_table: vec![String::new()],
            mapping_table: vec![Mapping::default()],
            location_table: vec![Location::default()],
            function_table: vec![Function::default()],
            link_table: vec![Link::default()],
            attribute_table: vec![KeyValueAndUnit::default()],
            stack_table: vec![Stack::default()],
        };
        fn string(d: &mut ProfilesDictionary, text: &str) -> i32 {
            match d.string_table.iter().position(|s| s == text) {
                Some(i) => i as i32,
                None => {
                    d.string_table.push(text.to_string());
                    (d.string_table.len() - 1) as i32
                }
            }
        }
        // One location (and function) per frame, at an address in the service's binary.
        fn location(
            d: &mut ProfilesDictionary,
            mapping: i32,
            frame: (&str, &str),
            line: i64,
        ) -> i32 {
            let name = string(d, frame.0);
            let file = string(d, frame.1);
            d.function_table.push(Function {
                name_strindex: name,
                system_name_strindex: name,
                filename_strindex: file,
                start_line: line - 3,
            });
            d.location_table.push(Location {
                mapping_index: mapping,
                address: 0x40_0000 + 0x40 * d.location_table.len() as u64,
                lines: vec![Line {
                    function_index: (d.function_table.len() - 1) as i32,
                    line,
                    column: 0,
                }],
                attribute_indices: Vec::new(),
            });
            (d.location_table.len() - 1) as i32
        }
        let cpu = string(&mut d, "cpu");
        let nanoseconds = string(&mut d, "nanoseconds");
        let thread = string(&mut d, "thread.name");
        let workers: Vec<i32> = (0..4)
            .map(|w| {
                d.attribute_table.push(KeyValueAndUnit {
                    key_strindex: thread,
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue(format!("worker-{w}"))),
                    }),
                    unit_strindex: 0,
                });
                (d.attribute_table.len() - 1) as i32
            })
            .collect();
        let time = self.clock;
        let mut resource_profiles = Vec::new();
        let mut total = 0;
        for (i, (service, operations)) in SERVICES.iter().enumerate() {
            let binary = string(&mut d, &format!("/usr/bin/{service}"));
            d.mapping_table.push(Mapping {
                memory_start: 0x40_0000,
                memory_limit: 0x80_0000,
                file_offset: 0,
                filename_strindex: binary,
                attribute_indices: Vec::new(),
            });
            let mapping = (d.mapping_table.len() - 1) as i32;
            let shared: Vec<i32> = SHARED_FRAMES
                .iter()
                .enumerate()
                .map(|(n, f)| location(&mut d, mapping, *f, 10 + n as i64))
                .collect();
            // A stack per (operation, leaf): leaf first.
            let mut stacks = Vec::new();
            for (o, operation) in operations.iter().enumerate() {
                let handler = location(&mut d, mapping, (operation, "handlers.go"), 40 + o as i64);
                for (l, leaf) in LEAF_FRAMES.iter().enumerate() {
                    let leaf = location(&mut d, mapping, *leaf, 100 + l as i64);
                    let mut frames = vec![leaf, handler];
                    frames.extend(shared.iter().rev());
                    d.stack_table.push(Stack {
                        location_indices: frames,
                    });
                    stacks.push((d.stack_table.len() - 1) as i32);
                }
            }
            let mut profile_samples = Vec::with_capacity(samples);
            for n in 0..samples {
                // Skewed: low stack numbers are hot.
                let pick = self.rng.random_range(0..stacks.len());
                let stack = stacks[pick.min(self.rng.random_range(0..stacks.len()))];
                let link_index = match self.recent[i].len() {
                    0 => 0,
                    len if self.rng.random_bool(0.5) => {
                        let (trace_id, span_id) =
                            self.recent[i][self.rng.random_range(0..len)].clone();
                        d.link_table.push(Link { trace_id, span_id });
                        (d.link_table.len() - 1) as i32
                    }
                    _ => 0,
                };
                // Four worker threads, each attribute once in the dictionary.
                let worker = workers[n % workers.len()];
                profile_samples.push(Sample {
                    stack_index: stack,
                    attribute_indices: vec![worker],
                    link_index,
                    values: vec![10_000_000 * self.rng.random_range(1..5)],
                    timestamps_unix_nano: vec![time + n as u64 * 1_000_000],
                });
            }
            total += profile_samples.len();
            let mut id = [0u8; 16];
            self.rng.fill(&mut id[..]);
            resource_profiles.push(ResourceProfiles {
                resource: Some(resource(service, &self.version(i, time), 0)),
                scope_profiles: vec![ScopeProfiles {
                    scope: scope(),
                    profiles: vec![Profile {
                        sample_type: Some(ValueType {
                            type_strindex: cpu,
                            unit_strindex: nanoseconds,
                        }),
                        samples: profile_samples,
                        time_unix_nano: time,
                        duration_nano: 10_000_000_000,
                        period_type: Some(ValueType {
                            type_strindex: cpu,
                            unit_strindex: nanoseconds,
                        }),
                        period: 10_000_000,
                        profile_id: id.to_vec(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            });
        }
        Record {
            signal: Signal::Profiles,
            bytes: ProfilesData {
                resource_profiles,
                dictionary: Some(d),
            }
            .encode_to_vec(),
            items: total,
        }
    }
}

/// A profiles record as OTLP JSON, the way the Collector's `otlp_json` encoding writes it:
/// lowerCamelCase names, 64-bit integers as decimal strings, ids as hex, bytes as base64.
pub fn profiles_json(protobuf: &[u8]) -> Vec<u8> {
    use base64::Engine as _;
    use opentelemetry_proto::tonic::profiles::v1development::ProfilesData;
    use serde_json::Value;
    fn fix(value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, inner) in map.iter_mut() {
                    match key.as_str() {
                        "traceId" | "spanId" => {
                            if let Value::Array(bytes) = inner {
                                let hex: String = bytes
                                    .iter()
                                    .map(|b| format!("{:02x}", b.as_u64().unwrap_or(0)))
                                    .collect();
                                *inner = Value::String(hex);
                            }
                        }
                        "originalPayload" => {
                            if let Value::Array(bytes) = inner {
                                let raw: Vec<u8> = bytes
                                    .iter()
                                    .map(|b| b.as_u64().unwrap_or(0) as u8)
                                    .collect();
                                *inner = Value::String(
                                    base64::engine::general_purpose::STANDARD.encode(raw),
                                );
                            }
                        }
                        "timeUnixNano" | "durationNano" | "period" | "address" | "memoryStart"
                        | "memoryLimit" | "fileOffset" | "line" | "startLine" | "values"
                        | "timestampsUnixNano" => stringify_numbers(inner),
                        _ => fix(inner),
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(fix),
            _ => {}
        }
    }
    fn stringify_numbers(value: &mut Value) {
        match value {
            Value::Number(n) => *value = Value::String(n.to_string()),
            Value::Array(items) => items.iter_mut().for_each(stringify_numbers),
            _ => {}
        }
    }
    let data = ProfilesData::decode(protobuf).expect("generated protobuf");
    let mut value = serde_json::to_value(&data).expect("serialisable");
    fix(&mut value);
    serde_json::to_vec(&value).expect("serialisable")
}

/// The generator as a [`floe_core::Source`]: records on `otlp_spans/0`, `otlp_logs/0` and
/// `otlp_metrics/0`, paced at `requests_per_second`; with a `duration`, exactly `duration ×
/// requests_per_second` requests (taking longer when polled slower). Event time follows the
/// request count at `speed` times the rate, and ends about now: it starts `(speed − 1) ×
/// duration` back. Offsets count records per topic; seeking continues the count (with fresh
/// data) so a restarted quickstart appends rather than repeats.
#[derive(Debug)]
pub struct GeneratorSource {
    generator: Generator,
    config: crate::config::GeneratorConfig,
    /// Requests a bounded run makes in all: `duration × requests_per_second`.
    total: Option<u64>,
    started: std::time::Instant,
    requests_sent: u64,
    /// Metric records sent: one per `requests_per_second` requests.
    metric_ticks: u64,
    offsets: [i64; 3],
}

const TOPICS: [&str; 3] = ["otlp_spans", "otlp_logs", "otlp_metrics"];

impl GeneratorSource {
    /// A paced generator.
    pub fn new(config: &crate::config::GeneratorConfig) -> Self {
        let now = std::time::Instant::now();
        let mut config = config.clone();
        config.requests_per_second = config.requests_per_second.max(1);
        Self {
            generator: fresh(&config, config.seed),
            total: config
                .duration
                .map(|d| (d.as_secs_f64() * config.requests_per_second as f64) as u64),
            config,
            started: now,
            requests_sent: 0,
            metric_ticks: 0,
            offsets: [0; 3],
        }
    }

    fn emit(&mut self, out: &mut Vec<floe_core::SourceRecord>, topic: usize, bytes: Vec<u8>) {
        out.push(floe_core::SourceRecord {
            topic: std::sync::Arc::from(TOPICS[topic]),
            partition: 0,
            offset: self.offsets[topic],
            payload: bytes,
            key: None,
        });
        self.offsets[topic] += 1;
    }
}

/// A generator for `config` with `seed`, its event time starting at `start`, else now (less
/// the head start `speed` gives), and its deploy and incidents placed after that start.
fn fresh(config: &crate::config::GeneratorConfig, seed: u64) -> Generator {
    let speed = config.speed.max(1);
    let head_start = config
        .duration
        .map_or(0, |d| d.as_nanos() as u64 * (speed - 1));
    let start = config
        .start_unix_nano
        .unwrap_or_else(|| now_unix_nano().saturating_sub(head_start));
    let mut generator =
        Generator::new(seed, start).with_rate((config.requests_per_second / speed).max(1));
    if let Some(d) = &config.deploy {
        generator = generator.with_deploy(Deploy {
            service: d.service.clone(),
            version: d.version.clone(),
            at_unix_nano: start + d.at.as_nanos() as u64,
            error_factor: d.error_factor,
            latency_factor: d.latency_factor,
        });
    }
    for i in &config.incidents {
        let from = start + i.at.as_nanos() as u64;
        generator = generator.with_incident(Incident {
            service: i.service.clone(),
            kind: i.kind.clone(),
            from_unix_nano: from,
            until_unix_nano: from + i.lasts.as_nanos() as u64,
        });
    }
    generator
}

/// Requests per record at most.
const CHUNK: u64 = 100;

/// How many requests the next record holds, after `sent` of them with `due` due by now:
/// the rest of the current cell of a fixed grid, cut at every `CHUNK` and every `rps`
/// requests, and only once all of it is due (or the bounded run ends inside it).
///
/// The grid makes the output a function of the seed alone: every run makes the same
/// records, and the metrics after every `rps` requests draw on the shared random numbers at
/// the same point, however the wall clock spaced the polls.
fn chunk(sent: u64, due: u64, rps: u64, total: Option<u64>) -> Option<u64> {
    let mut end = (sent / CHUNK + 1) * CHUNK;
    end = end.min((sent / rps + 1) * rps);
    if let Some(total) = total {
        end = end.min(total);
    }
    (end > sent && due >= end).then_some(end - sent)
}

fn now_unix_nano() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default()
}

impl floe_core::Source for GeneratorSource {
    async fn poll(
        &mut self,
        out: &mut Vec<floe_core::SourceRecord>,
        limit: floe_core::PollLimit,
        timeout: std::time::Duration,
    ) -> Result<floe_core::Polled, floe_core::SourceError> {
        let now = std::time::Instant::now();
        let rps = self.config.requests_per_second;
        if self.total.is_some_and(|total| self.requests_sent >= total) {
            return Ok(floe_core::Polled::Finished);
        }
        // Requests due by now at the configured rate. A bounded run makes all its requests
        // however slowly it is polled: event time follows the count, so the run always covers
        // `duration × speed` of event time.
        let mut due = (now.duration_since(self.started).as_secs_f64() * rps as f64) as u64;
        if let Some(total) = self.total {
            due = due.min(total);
        }
        let mut bytes = 0;
        while out.len() + 4 <= limit.records && bytes < limit.bytes {
            let Some(n) = chunk(self.requests_sent, due, rps, self.total) else {
                break;
            };
            let [traces, logs] = self.generator.requests(n as usize);
            bytes += traces.bytes.len() + logs.bytes.len();
            self.emit(out, 0, traces.bytes);
            self.emit(out, 1, logs.bytes);
            self.requests_sent += n;
            // Metrics after every `rps` requests (by count, like event time).
            if self.requests_sent / rps > self.metric_ticks {
                self.metric_ticks = self.requests_sent / rps;
                let metrics = self.generator.metrics();
                self.emit(out, 2, metrics.bytes);
            }
        }
        if out.is_empty() {
            tokio::time::sleep(timeout.min(std::time::Duration::from_millis(20))).await;
        }
        Ok(floe_core::Polled::Records)
    }

    fn assignment(&self) -> Vec<String> {
        TOPICS
            .iter()
            .map(|t| floe_core::position_key(t, 0))
            .collect()
    }

    fn seek(&mut self, positions: &floe_core::Positions) -> Result<(), floe_core::SourceError> {
        for (i, topic) in TOPICS.iter().enumerate() {
            self.offsets[i] = floe_core::position_of(positions, topic, 0).unwrap_or(0);
        }
        // Fresh data for a continued run: another seed per starting offset.
        self.generator = fresh(&self.config, self.config.seed ^ self.offsets[0] as u64);
        Ok(())
    }

    fn acknowledge(&mut self, _positions: &floe_core::Positions) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (service, version, failed, has exception, failed child, duration ns, start ns) of
    /// every span in `records`, with each span's child looked up in its trace.
    fn spans(records: &[Record]) -> Vec<(String, String, bool, bool, bool, u64, u64)> {
        let mut all = Vec::new();
        for record in records {
            let data = TracesData::decode(record.bytes.as_slice()).unwrap();
            for rs in data.resource_spans {
                let attr = |key: &str| {
                    let r = rs.resource.as_ref().unwrap();
                    let v = r.attributes.iter().find(|a| a.key == key).unwrap();
                    match &v.value.as_ref().unwrap().value {
                        Some(any_value::Value::StringValue(s)) => s.clone(),
                        other => panic!("{other:?}"),
                    }
                };
                let (service, version) = (attr("service.name"), attr("service.version"));
                for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                    all.push((service.clone(), version.clone(), span));
                }
            }
        }
        let failed: BTreeMap<Vec<u8>, bool> = all
            .iter()
            .map(|(_, _, s)| (s.span_id.clone(), s.status.as_ref().unwrap().code == 2))
            .collect();
        let child_failed: BTreeMap<Vec<u8>, bool> = all
            .iter()
            .filter(|(_, _, s)| !s.parent_span_id.is_empty())
            .map(|(_, _, s)| (s.parent_span_id.clone(), failed[&s.span_id]))
            .collect();
        all.into_iter()
            .map(|(service, version, s)| {
                (
                    service,
                    version,
                    failed[&s.span_id],
                    !s.events.is_empty(),
                    child_failed.get(&s.span_id).copied().unwrap_or(false),
                    s.end_time_unix_nano - s.start_time_unix_nano,
                    s.start_time_unix_nano,
                )
            })
            .collect()
    }

    #[test]
    fn errors_originate_in_one_service_and_propagate_to_its_callers() {
        let mut g = Generator::new(11, 1_700_000_000_000_000_000);
        let records: Vec<Record> = (0..200).map(|_| g.requests(100)[0].clone()).collect();
        let spans = spans(&records);
        assert_eq!(spans.len(), 200 * 100 * SERVICES.len());
        let mut errors: BTreeMap<&str, usize> = BTreeMap::new();
        for (service, _, failed, exception, child_failed, ..) in &spans {
            assert!(!exception || *failed, "an origin fails");
            assert!(
                !failed || *exception || *child_failed,
                "{service} failed without a cause"
            );
            *errors.entry(service.as_str()).or_default() += *failed as usize;
        }
        // A service fails when its own error originates or its callee's propagates:
        // P(t) = o(t) + (1 − o(t)) · PROPAGATION · P(t + 1).
        let requests = 200.0 * 100.0;
        let mut expected = 0.0;
        for (tier, (service, _)) in SERVICES.iter().enumerate().rev() {
            expected = ERROR_ORIGINS[tier] + (1.0 - ERROR_ORIGINS[tier]) * PROPAGATION * expected;
            let rate = errors[*service] as f64 / requests;
            assert!(
                (rate - expected).abs() < 0.003,
                "{service}: {rate} vs {expected}"
            );
        }
    }

    #[test]
    fn a_deploy_changes_version_errors_and_latency_from_its_time_on() {
        let start = 1_700_000_000_000_000_000;
        let mut g = Generator::new(5, start);
        let requests: usize = 40_000;
        // Requests are ~1 ms apart: the deploy lands about halfway.
        let at = start + requests as u64 / 2 * 1_050_000;
        g = g.with_deploy(Deploy {
            service: "payments".into(),
            version: "1.1.0".into(),
            at_unix_nano: at,
            error_factor: 5.0,
            latency_factor: 1.5,
        });
        let records: Vec<Record> = (0..requests / 100)
            .map(|_| g.requests(100)[0].clone())
            .collect();
        let mut before = (0, 0, Vec::new());
        let mut after = (0, 0, Vec::new());
        for (service, version, _, exception, _, duration, span_start) in spans(&records) {
            if service != "payments" {
                assert_eq!(version, FIRST_VERSION);
                continue;
            }
            // A trace's spans start a little after its request: the version is the request's.
            let side = if version == "1.1.0" {
                assert!(span_start >= at);
                &mut after
            } else {
                assert_eq!(version, FIRST_VERSION);
                assert!(span_start < at + 1_000_000_000);
                &mut before
            };
            side.0 += 1;
            side.1 += exception as usize;
            side.2.push(duration);
        }
        assert!(before.0 > requests / 3 && after.0 > requests / 3);
        let rate = |s: &(usize, usize, Vec<u64>)| s.1 as f64 / s.0 as f64;
        let ratio = rate(&after) / rate(&before);
        assert!((3.5..7.0).contains(&ratio), "origin rate ×{ratio}");
        let median = |s: &mut (usize, usize, Vec<u64>)| {
            s.2.sort();
            s.2[s.2.len() / 2] as f64
        };
        let slower = median(&mut after) / median(&mut before);
        assert!((1.35..1.65).contains(&slower), "median ×{slower}");
    }

    #[test]
    fn incidents_raise_errors_slow_an_endpoint_and_fill_a_pool_in_their_window() {
        let start = 1_700_000_000_000_000_000;
        // Requests ~1.05 ms apart: 40,000 make 42 s; the incidents take 10 s to 30 s.
        let (from, until) = (start + 10_000_000_000, start + 30_000_000_000);
        let incident = |service: &str, kind| Incident {
            service: service.into(),
            kind,
            from_unix_nano: from,
            until_unix_nano: until,
        };
        let mut g = Generator::new(9, start)
            .with_incident(incident("inventory", IncidentKind::Errors { factor: 20.0 }))
            .with_incident(incident(
                "checkout",
                IncidentKind::Slow {
                    endpoint: "PlaceOrder".into(),
                    factor: 3.0,
                },
            ))
            .with_incident(incident("payments", IncidentKind::Saturation));
        let mut pool = Vec::new();
        let mut spans = Vec::new();
        for _ in 0..400 {
            let traces = g.requests(100)[0].clone();
            let data = TracesData::decode(traces.bytes.as_slice()).unwrap();
            for rs in data.resource_spans {
                let service = rs
                    .resource
                    .as_ref()
                    .unwrap()
                    .attributes
                    .iter()
                    .find(|a| a.key == "service.name")
                    .and_then(|a| match &a.value.as_ref()?.value {
                        Some(any_value::Value::StringValue(s)) => Some(s.clone()),
                        _ => None,
                    })
                    .unwrap();
                for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                    spans.push((service.clone(), span));
                }
            }
            let metrics = MetricsData::decode(g.metrics().bytes.as_slice()).unwrap();
            for rm in metrics.resource_metrics {
                for m in rm.scope_metrics.iter().flat_map(|s| &s.metrics) {
                    if m.name != POOL_GAUGE {
                        continue;
                    }
                    let Some(metric::Data::Gauge(gauge)) = &m.data else {
                        panic!("{m:?}")
                    };
                    let p = &gauge.data_points[0];
                    let Some(number_data_point::Value::AsDouble(v)) = p.value else {
                        panic!("{p:?}")
                    };
                    pool.push((p.time_unix_nano, v));
                }
            }
        }
        let inside = |t: u64| (from..until).contains(&t);
        // Errors originating in inventory: 20 times as often inside the window.
        let origins = |within: bool| {
            let side: Vec<_> = spans
                .iter()
                .filter(|(s, span)| s == "inventory" && inside(span.start_time_unix_nano) == within)
                .collect();
            side.iter()
                .filter(|(_, span)| !span.events.is_empty())
                .count() as f64
                / side.len() as f64
        };
        let ratio = origins(true) / origins(false);
        assert!((12.0..30.0).contains(&ratio), "origin rate ×{ratio}");
        // Their callers fail more too (propagation), without exceptions of their own.
        let failed = |service: &str, within: bool| {
            let side: Vec<_> = spans
                .iter()
                .filter(|(s, span)| s == service && inside(span.start_time_unix_nano) == within)
                .collect();
            let n = side
                .iter()
                .filter(|(_, span)| span.status.as_ref().unwrap().code == 2)
                .count();
            n as f64 / side.len() as f64
        };
        assert!(failed("frontend", true) > 3.0 * failed("frontend", false));
        // Only checkout's PlaceOrder is slower, three times.
        let median = |service: &str, endpoint: &str, within: bool| {
            let mut d: Vec<u64> = spans
                .iter()
                .filter(|(s, span)| {
                    s == service
                        && span.name == endpoint
                        && inside(span.start_time_unix_nano) == within
                })
                .map(|(_, span)| span.end_time_unix_nano - span.start_time_unix_nano)
                .collect();
            d.sort();
            d[d.len() / 2] as f64
        };
        let slower =
            median("checkout", "PlaceOrder", true) / median("checkout", "PlaceOrder", false);
        assert!((2.5..3.5).contains(&slower), "PlaceOrder ×{slower}");
        let same = median("checkout", "GetCart", true) / median("checkout", "GetCart", false);
        assert!((0.85..1.15).contains(&same), "GetCart ×{same}");
        // Only payments reports the pool, at its level outside and climbing to full inside.
        assert_eq!(pool.len(), 400);
        for (t, v) in &pool {
            if inside(*t) {
                let climb = (*t - from) as f64 / (until - from) as f64;
                let expected = POOL_LEVEL + (1.0 - POOL_LEVEL) * climb;
                assert!((v - expected).abs() <= 0.031, "{v} at {climb}");
            } else {
                assert!((v - POOL_LEVEL).abs() <= 0.031, "{v}");
            }
        }
    }

    #[test]
    fn records_are_cut_on_a_grid_of_chunks_and_metric_ticks() {
        // Nothing before a whole cell is due; a cell ends at 100 requests or a metric tick.
        assert_eq!(chunk(0, 99, 150, None), None);
        assert_eq!(chunk(0, 100, 150, None), Some(100));
        assert_eq!(chunk(100, 180, 150, None), Some(50));
        assert_eq!(chunk(150, 260, 150, None), Some(50));
        assert_eq!(chunk(200, 1_000, 150, None), Some(100));
        // A bounded run ends inside a cell.
        assert_eq!(chunk(300, 320, 150, Some(320)), Some(20));
        assert_eq!(chunk(320, 320, 150, Some(320)), None);
    }

    /// Every payload of a bounded run, polled `records` at a time.
    async fn bounded_run(records: usize) -> Vec<(String, Vec<u8>)> {
        use floe_core::Source;
        let config = crate::config::GeneratorConfig {
            requests_per_second: 1_550,
            duration: Some(std::time::Duration::from_millis(1_400)),
            seed: 3,
            speed: 60,
            start_unix_nano: Some(1_767_225_600_000_000_000),
            deploy: None,
            incidents: Vec::new(),
        };
        let mut source = GeneratorSource::new(&config);
        let limit = floe_core::PollLimit {
            records,
            bytes: usize::MAX,
        };
        let (mut all, mut out) = (Vec::new(), Vec::new());
        let timeout = std::time::Duration::from_millis(5);
        while let floe_core::Polled::Records = source.poll(&mut out, limit, timeout).await.unwrap()
        {
            all.extend(out.drain(..).map(|r| (r.topic.to_string(), r.payload)));
        }
        all
    }

    #[tokio::test]
    async fn a_bounded_run_is_the_same_however_it_is_polled() {
        let (few, many) = (bounded_run(4).await, bounded_run(10_000).await);
        assert!(few == many, "{} records against {}", few.len(), many.len());
        // 2 170 requests: one metrics record, right after the 1 550th.
        let requests = |records: &[(String, Vec<u8>)]| -> usize {
            records
                .iter()
                .filter(|(t, _)| t == "otlp_spans")
                .map(|(_, b)| {
                    let data = TracesData::decode(b.as_slice()).unwrap();
                    data.resource_spans
                        .iter()
                        .flat_map(|r| &r.scope_spans)
                        .flat_map(|s| &s.spans)
                        .filter(|s| s.parent_span_id.is_empty())
                        .count()
                })
                .sum()
        };
        assert_eq!(requests(&few), 2_170);
        let ticks: Vec<usize> = (0..few.len())
            .filter(|&i| few[i].0 == "otlp_metrics")
            .collect();
        assert_eq!(ticks.len(), 1);
        assert_eq!(requests(&few[..ticks[0]]), 1_550);
    }
}
