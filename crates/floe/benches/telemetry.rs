//! The telemetry recipe's benchmark harness: `cargo bench -p floe --bench telemetry`.
//!
//! With services from `tests/services/up` (Kafka, the Collector for (e), Prometheus for the
//! recipe's sinks when `FLOE_TEST_PROMETHEUS_URL` is set), the release
//! `floe` and `floe-catalog` (`cargo build --release -p floe -p floe-catalog`), on the same
//! produced spans (two partitions, 10 s checkpoints, each job in its own namespace and
//! consumer group), each job timed from a tenth of the input read to nine tenths (its
//! `/metrics`) — the rate it sustains, `steady/s`, barrier pauses included —, from its start
//! until it has read the whole input (`read/s`, start-up included), until its
//! committed positions reach the end of the input (`spans/s`: up to one checkpoint interval
//! more), and until they reach the end of every exchange topic it writes too (`drained/s`:
//! about one interval more again, since the clock records a checkpoint sends through the
//! exchange at its barrier are committed by the reading side in the next checkpoint).
//! `paused` is the seconds its loop stopped reading at barriers:
//!
//! * (a) the OTLP job landing spans, no operators — the baseline;
//! * (b) the shipped RED recipe, `jobs/otlp-red.toml` as users run it: spans landed, RED per
//!   minute, two SLOs, deploy regressions and anomaly scores behind an exchange by service,
//!   the service map behind a second exchange by trace id, and the alerts behind a third of
//!   one partition, with their Kafka and Prometheus sinks; target (b)/(a) ≥ 0.5 (issue 27);
//! * (c) the exchange alone: (a) plus every span re-keyed by trace id through a 12-partition
//!   topic and read back — rows and records through the topic per second and per CPU-second,
//!   and (c)/(a);
//! * (d) Floe's RED alone (the recipe's requests, exchange and 1-minute window; spans not
//!   landed) against (e) the OpenTelemetry Collector's span metrics connector counting the
//!   same spans, received over OTLP/HTTP: spans per CPU-second of each process (Kafka's and
//!   the sender's CPU not counted on either side).
//!
//! * (f) (c) and the service map operator on the exchanged spans: the map's own cost.
//! * (g) (a) and the shipped tail sampler (`jobs/otlp-tail-sampling.toml`: errors, slow
//!   traces, a deterministic tenth) on the spans as read, no exchange: (g)/(a) (issue 28).
//!
//! * (h) the Collector's contrib tail_sampling processor with (g)'s policies and decision
//!   wait, over OTLP/HTTP: spans per CPU-second and peak RSS, run twice — `num_traces` large
//!   enough to hold every trace in flight, and its default 50,000 — with the traces it
//!   dropped before their decision (which Floe, holding them in RocksDB, keeps whole).
//!
//! * (i) (a) with `jobs/otlp-pii.toml`'s `[source.redaction]`: every string of every span
//!   scanned by every detector before it is written: (i)/(a), target ≥ 0.8 (issue 29);
//! * (j) the Collector's contrib redaction processor with Floe's detectors' patterns as
//!   `blocked_values`, over OTLP/HTTP: spans per CPU-second against (i).
//!
//! `FLOE_BENCH_SPANS` sets the volume (default 2,000,000); `FLOE_BENCH_JOBS` the jobs that
//! run, by letter (default `abcdefghij`). (e), (h) and (j) need `FLOE_TEST_OTELCOL`; they
//! are skipped without it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use floe_lake::rest::CatalogClient;

mod common;
use common::support::{ExchangeJob, terminate, topic_ends, wait_through_exchange};
use common::{
    connect, cpu_seconds, peak_rss_mib, produce_spans, spans_job_file, spawn_release_floe,
    start_catalog, wait_committed,
};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SPANS_PER_RECORD: usize = 1000;
const PARTITIONS: i32 = 2;

/// (c): every span through an exchange by trace id, read back, not landed again.
const EXCHANGE_ONLY: &str = r#"
[[operators]]
id = "edge_spans"
kind = "select"
input = "spans"
columns = ["ts", "trace_id", "span_id", "parent_span_id", "service_name", "duration_ns", "CASE WHEN status_code = 'ERROR' THEN 1 ELSE 0 END AS error", "kafka_offset", "kafka_item"]

[[operators]]
id = "by_trace"
kind = "exchange"
input = "edge_spans"
key = ["trace_id"]
partitions = 12
topic = "${FLOE_EDGES_TOPIC}"

[tables.edge_spans]
land = false

[tables.by_trace]
land = false
"#;

/// (f): (c) and the service map on the exchanged spans.
const EDGES: &str = r#"
[streams.by_trace]
out_of_orderness = "5s"

[[operators]]
id = "service_edges"
kind = "edges"
input = "by_trace"
allowed_lateness = "1m"

[tables.service_edges]
name = "otel_service_edges"
"#;

/// (d): the recipe's RED alone.
const RED_ONLY: &str = r#"
[[operators]]
id = "requests"
kind = "select"
input = "spans"
where = "span_kind IN ('SERVER', 'CONSUMER') OR is_root"
columns = ["ts", "service_name", "span_name", "coalesce(service_version, '') AS service_version", "coalesce(team, '') AS team", "duration_ns", "CASE WHEN status_code = 'ERROR' THEN 1 ELSE 0 END AS error", "kafka_offset", "kafka_item"]

[[operators]]
id = "by_service"
kind = "exchange"
input = "requests"
key = ["service_name"]
partitions = 12
topic = "${FLOE_EXCHANGE_TOPIC}"

[streams.by_service]
out_of_orderness = "5s"

[[operators]]
id = "red_1m"
kind = "window"
input = "by_service"
window = { type = "tumbling", size = "1m" }
key = ["service_name", "span_name", "service_version", "team"]
allowed_lateness = "1m"
aggregates = { requests = "count()", errors = "sum(error)", p50_ns = "quantile(duration_ns, 0.5)", p95_ns = "quantile(duration_ns, 0.95)", p99_ns = "quantile(duration_ns, 0.99)" }

[tables.spans]
land = false

[tables.requests]
land = false

[tables.by_service]
land = false
"#;

/// The Collector for (e): OTLP/HTTP in, the span metrics connector, its metrics to the debug
/// exporter (counted, not printed).
const COLLECTOR: &str = r#"
receivers:
  otlp:
    protocols:
      http:
        endpoint: ${env:OTLP_HTTP_ENDPOINT}
connectors:
  span_metrics:
    metrics_flush_interval: 15s
exporters:
  debug:
    verbosity: basic
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [span_metrics]
    metrics:
      receivers: [span_metrics]
      exporters: [debug]
"#;

/// (h): the Collector's tail_sampling processor with the shipped sampler's policies
/// (`jobs/otlp-tail-sampling.toml`) and its `decision_wait`, which the Collector counts in
/// wall-clock time; `NUM_TRACES` is how many traces it holds (its default 50,000, or enough for
/// every trace in flight); its kept spans to the debug exporter (counted, not printed).
const COLLECTOR_SAMPLING: &str = r#"
receivers:
  otlp:
    protocols:
      http:
        endpoint: ${env:OTLP_HTTP_ENDPOINT}
processors:
  tail_sampling:
    decision_wait: 10s
    num_traces: ${env:NUM_TRACES}
    policies:
      - {name: errors, type: status_code, status_code: {status_codes: [ERROR]}}
      - {name: slow, type: latency, latency: {threshold_ms: 500}}
      - {name: baseline, type: probabilistic, probabilistic: {sampling_percentage: 10}}
exporters:
  debug:
    verbosity: basic
service:
  telemetry:
    metrics:
      readers:
        - pull:
            exporter:
              prometheus:
                host: ${env:COLLECTOR_METRICS_HOST}
                port: ${env:COLLECTOR_METRICS_PORT}
  pipelines:
    traces:
      receivers: [otlp]
      processors: [tail_sampling]
      exporters: [debug]
"#;

/// What one run of a job took.
struct Run {
    /// From a tenth of the input read to nine tenths: the rate the job sustains, start-up
    /// and the last checkpoint left out, barrier pauses in.
    steady_seconds: f64,
    /// Until the job had read every byte of the input (its `floe_source_bytes_total`): the
    /// rate it consumes at, barrier pauses included, the last checkpoint's wait not.
    read_seconds: f64,
    /// Until the input's positions were committed: that plus up to one checkpoint interval.
    input_seconds: f64,
    /// Until the exchanges were drained too: that rate, and the last checkpoint's latency.
    seconds: f64,
    cpu: f64,
    rss: f64,
    /// Seconds the job's loop stopped reading at barriers (`floe_checkpoint_barrier_seconds`).
    paused: f64,
}

impl Run {
    fn row(&self, label: &str, spans: usize) {
        println!(
            "{label:<62} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>12.0} {:>9.0} {:>7.1}",
            0.8 * spans as f64 / self.steady_seconds,
            spans as f64 / self.read_seconds,
            spans as f64 / self.input_seconds,
            spans as f64 / self.seconds,
            spans as f64 / self.cpu.max(0.01),
            self.rss,
            self.paused
        );
    }
}

/// The value of the series `series` (name and labels, as exposed) on the `/metrics` of the
/// job listening on `port`; `None` while it does not answer or has no such series.
async fn scrape(http: &reqwest::Client, port: u16, series: &str) -> Option<f64> {
    let text = http
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}

/// Part of shipped job `file`: from its `from` section to its `until` section (or the end)
/// — its pipeline, or its redaction; the bench's own job gives the source, catalog and
/// checkpoints.
fn shipped(file: &str, from: &str, until: Option<&str>) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../jobs")
        .join(file);
    let text = std::fs::read_to_string(path).unwrap();
    let at = text
        .find(from)
        .unwrap_or_else(|| panic!("{file} has no {from}"));
    let end = until.map_or(text.len(), |u| {
        at + text[at..]
            .find(u)
            .unwrap_or_else(|| panic!("{file} has no {u} after {from}"))
    });
    text[at..end].to_string()
}

/// (j): the Collector's redaction processor with Floe's detectors' patterns as
/// `blocked_values`, every key allowed, to the debug exporter.
fn collector_redaction() -> String {
    format!(
        r#"receivers:
  otlp:
    protocols:
      http:
        endpoint: ${{env:OTLP_HTTP_ENDPOINT}}
{}exporters:
  debug:
    verbosity: basic
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      processors: [redaction]
      exporters: [debug]
"#,
        common::support::otelcol::redaction_processor()
    )
}

/// Which jobs run: `FLOE_BENCH_JOBS` (their letters, e.g. `ab`), all by default — to time or
/// profile one job without the others.
struct Only(Option<String>);

impl Only {
    fn from_env() -> Self {
        Self(std::env::var("FLOE_BENCH_JOBS").ok())
    }

    fn wants(&self, job: char) -> bool {
        self.0.as_ref().is_none_or(|jobs| jobs.contains(job))
    }
}

struct Bench {
    client: CatalogClient,
    /// Payload bytes of the input.
    input_bytes: f64,
    dir: PathBuf,
    brokers: String,
    topic: String,
    uri: String,
    ends: BTreeMap<i32, i64>,
    /// Environment of every job besides its exchanges'.
    env: Vec<(&'static str, String)>,
}

impl Bench {
    /// Runs job `name` (the spans job with `extra`) until it committed the input and the end of
    /// each of `exchanges` (set in its environment as the topics' variables, in the order
    /// they are fed), then stops it.
    async fn run(&self, name: &str, extra: &str, exchanges: &[(&str, String)]) -> Run {
        let port = common::free_port();
        let job = spans_job_file(
            &self.dir,
            name,
            name,
            (&self.brokers, &self.topic),
            &self.uri,
            &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n{extra}"),
        );
        let log = self.dir.join(format!("{name}.log"));
        let env: Vec<(&str, &str)> = exchanges
            .iter()
            .chain(&self.env)
            .map(|(k, v)| (*k, v.as_str()))
            .collect();
        let began = Instant::now();
        let floe = spawn_release_floe(&job, &log, &env);
        let http = reqwest::Client::new();
        let read_series = format!("floe_source_bytes_total{{topic=\"{}\"}}", self.topic);
        // When a tenth, nine tenths and all of the input had been read.
        let read = async {
            let mut marks = [None, None];
            loop {
                let bytes = scrape(&http, port, &read_series).await.unwrap_or(0.0);
                let at = began.elapsed().as_secs_f64();
                for (mark, share) in marks.iter_mut().zip([0.1, 0.9]) {
                    if mark.is_none() && bytes >= share * self.input_bytes {
                        *mark = Some(at);
                    }
                }
                if bytes >= self.input_bytes {
                    let [Some(tenth), Some(nine)] = marks else {
                        unreachable!("set above")
                    };
                    return (at, nine - tenth);
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        };
        let ends: Vec<i64> = self.ends.values().copied().collect();
        let committed = wait_committed(&self.client, name, name, &self.topic, &ends);
        let ((read_seconds, steady_seconds), ()) = tokio::join!(read, committed);
        let input_seconds = began.elapsed().as_secs_f64();
        for (_, exchange) in exchanges {
            let watched = ExchangeJob {
                brokers: &self.brokers,
                namespace: name,
                job: name,
                topic: &self.topic,
                ends: &self.ends,
                exchange,
                log: &log,
            };
            wait_through_exchange(&self.client, &watched).await;
        }
        let paused = scrape(&http, port, "floe_checkpoint_barrier_seconds_sum").await;
        let run = Run {
            steady_seconds,
            read_seconds,
            input_seconds,
            seconds: began.elapsed().as_secs_f64(),
            cpu: cpu_seconds(floe.id()),
            rss: peak_rss_mib(floe.id()),
            paused: paused.unwrap_or(0.0),
        };
        terminate(floe);
        run
    }
}

/// What the Collector's tail_sampling processor counted in a run of (h).
struct Sampled {
    /// Traces it received.
    traces: f64,
    /// Traces evicted before their decision (`num_traces` full): their spans are lost.
    dropped: f64,
    /// Traces that arrived again after their decision (late spans), decided anew.
    late: f64,
}

/// A Collector on `config` (`env` set) fed `payloads` over OTLP/HTTP one record at a time,
/// `settle` given to finish after the last; with its tail sampler's counts when
/// `sampler`. `None` without `FLOE_TEST_OTELCOL`.
async fn collector(
    dir: &Path,
    (name, config, env): (&str, &str, &[(&str, &str)]),
    payloads: &[Vec<u8>],
    settle: std::time::Duration,
    sampler: bool,
) -> Option<(Run, Option<Sampled>)> {
    use common::support::otelcol::Collector;
    std::env::var("FLOE_TEST_OTELCOL").ok()?;
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, config).unwrap();
    let mut collector = Collector::start(&path, &[], env, &dir.join(format!("{name}.log")));
    let http = reqwest::Client::new();
    collector.ready(&http).await;
    let pid = collector.pid();
    let (cpu_before, began) = (cpu_seconds(pid), Instant::now());
    for payload in payloads {
        let record = floe_otlp::generate::Record {
            signal: floe_otlp::Signal::Traces,
            bytes: payload.clone(),
            items: SPANS_PER_RECORD,
        };
        collector.send(&http, &record).await;
    }
    let seconds = began.elapsed().as_secs_f64();
    tokio::time::sleep(settle).await;
    let metric =
        |name: &str| collector.metric(&format!("otelcol_processor_tail_sampling_{name}"), "");
    let sampled = sampler.then(|| Sampled {
        traces: metric("new_trace_id_received").unwrap_or(0.0),
        dropped: metric("sampling_trace_dropped_too_early").unwrap_or(0.0),
        // A histogram, its unit a suffix or not.
        late: metric("sampling_late_span_age_count")
            .or_else(|| metric("sampling_late_span_age_seconds_count"))
            .unwrap_or(0.0),
    });
    // Fed as fast as it takes them: its steady rate is its whole run's.
    let run = Run {
        steady_seconds: seconds * 0.8,
        read_seconds: seconds,
        input_seconds: seconds,
        seconds,
        cpu: cpu_seconds(pid) - cpu_before,
        rss: peak_rss_mib(pid),
        paused: 0.0,
    };
    collector.stop();
    Some((run, sampled))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Ok(brokers) = std::env::var("FLOE_TEST_KAFKA_BROKERS") else {
        eprintln!("telemetry bench: needs FLOE_TEST_KAFKA_BROKERS (tests/services/up)");
        return;
    };
    let spans = std::env::var("FLOE_BENCH_SPANS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000usize);
    let records = spans.div_ceil(SPANS_PER_RECORD);
    let spans = records * SPANS_PER_RECORD;
    let dir = std::env::temp_dir().join(format!("floe-bench-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let topic = format!("bench_telemetry_{run_id}");
    let payloads = produce_spans(&brokers, &topic, PARTITIONS, records, SPANS_PER_RECORD).await;
    println!("produced {spans} spans in {records} records on {PARTITIONS} partitions");
    let catalog = start_catalog(&dir);
    let bench = Bench {
        client: connect(&catalog).await,
        input_bytes: payloads.iter().map(|p| p.len() as f64).sum(),
        ends: topic_ends(&brokers, &topic),
        dir: dir.clone(),
        brokers: brokers.clone(),
        topic,
        uri: catalog.uri.clone(),
        // The recipe's sinks: a topic of this run's, and Prometheus when the services have
        // one (else a closed port: each delivery fails, is counted and retried).
        env: vec![
            ("FLOE_ALERTS_TOPIC", format!("bench_alerts_{run_id}")),
            // jobs/otlp-pii.toml hashes e-mail addresses.
            ("FLOE_PII_HASH_KEY", "bench-only-key".to_string()),
            (
                "FLOE_PROMETHEUS_URL",
                std::env::var("FLOE_TEST_PROMETHEUS_URL")
                    .unwrap_or_else(|_| "http://127.0.0.1:1".into()),
            ),
        ],
    };
    let exchange = |name: &str| format!("bench_{name}_{run_id}");
    let recipe_text = shipped("otlp-red.toml", "[[operators]]", None);
    let sampling_text = shipped("otlp-tail-sampling.toml", "[streams.spans]", None);
    let redaction_text = shipped("otlp-pii.toml", "[source.redaction]", Some("[catalog]"));
    let edges_text = format!("{EXCHANGE_ONLY}{EDGES}");

    let only = Only::from_env();
    let plain = match only.wants('a') {
        true => Some(bench.run("plain", "", &[]).await),
        false => None,
    };
    let recipe = match only.wants('b') {
        true => Some(
            bench
                .run(
                    "recipe",
                    &recipe_text,
                    &[
                        ("FLOE_EXCHANGE_TOPIC", exchange("recipe_service")),
                        ("FLOE_ROLLUP_TOPIC", exchange("recipe_rollup")),
                        ("FLOE_EDGES_TOPIC", exchange("recipe_trace")),
                        ("FLOE_FACTS_TOPIC", exchange("recipe_facts")),
                    ],
                )
                .await,
        ),
        false => None,
    };
    let through = exchange("through");
    let exchanged = match only.wants('c') {
        true => Some(
            bench
                .run(
                    "exchanged",
                    EXCHANGE_ONLY,
                    &[("FLOE_EDGES_TOPIC", through.clone())],
                )
                .await,
        ),
        false => None,
    };
    let edges = match only.wants('f') {
        true => Some(
            bench
                .run(
                    "edges",
                    &edges_text,
                    &[("FLOE_EDGES_TOPIC", exchange("edges_trace"))],
                )
                .await,
        ),
        false => None,
    };
    let red = match only.wants('d') {
        true => Some(
            bench
                .run(
                    "red",
                    RED_ONLY,
                    &[("FLOE_EXCHANGE_TOPIC", exchange("red_service"))],
                )
                .await,
        ),
        false => None,
    };
    let sampling = match only.wants('g') {
        true => Some(bench.run("sampling", &sampling_text, &[]).await),
        false => None,
    };
    let redacted = match only.wants('i') {
        true => Some(bench.run("redacted", &redaction_text, &[]).await),
        false => None,
    };
    let none = std::time::Duration::ZERO;
    let collector_red = match only.wants('e') {
        true => {
            collector(
                &dir,
                ("span-metrics", COLLECTOR, &[]),
                &payloads,
                none,
                false,
            )
            .await
        }
        false => None,
    };
    let span_metrics = collector_red.map(|(run, _)| run);
    let redaction_config = collector_redaction();
    let collector_redacting = match only.wants('j') {
        true => collector(
            &dir,
            ("redaction", &redaction_config, &[]),
            &payloads,
            none,
            false,
        )
        .await
        .map(|(run, _)| run),
        false => None,
    };
    // (h) twice: every trace in flight held (its cost), then its default bound (what it
    // loses). Past the decision_wait before its counts are read.
    let wait = std::time::Duration::from_secs(11);
    let mut collector_sampling = Vec::new();
    for (label, num_traces) in [("all held", "2000000"), ("default", "50000")] {
        if !only.wants('h') {
            break;
        }
        let env = [("NUM_TRACES", num_traces)];
        let setup = ("tail-sampling", COLLECTOR_SAMPLING, &env[..]);
        if let Some(run) = collector(&dir, setup, &payloads, wait, true).await {
            collector_sampling.push((label, num_traces, run));
        }
    }

    println!(
        "\n{:<62} {:>10} {:>10} {:>10} {:>10} {:>12} {:>9} {:>7}",
        "job", "steady/s", "read/s", "spans/s", "drained/s", "spans/cpu-s", "RSS MiB", "paused"
    );
    let rows = [
        (&plain, "(a) OTLP job, spans landed, no operators"),
        (
            &recipe,
            "(b) jobs/otlp-red.toml: RED, SLOs, regressions, map, anomalies, alerts, sinks",
        ),
        (
            &exchanged,
            "(c) (a) + every span through an exchange by trace id",
        ),
        (&red, "(d) Floe's RED alone (spans not landed)"),
        (&edges, "(f) (c) + the service map on the exchanged spans"),
        (
            &sampling,
            "(g) (a) + tail sampling, jobs/otlp-tail-sampling.toml",
        ),
        (
            &span_metrics,
            "(e) Collector span metrics connector, OTLP/HTTP",
        ),
        (
            &redacted,
            "(i) (a) + redaction, jobs/otlp-pii.toml's [source.redaction]",
        ),
        (
            &collector_redacting,
            "(j) Collector redaction processor, Floe's patterns, OTLP/HTTP",
        ),
    ];
    for (run, label) in rows {
        if let Some(run) = run {
            run.row(label, spans);
        }
    }
    for (label, num_traces, (run, _)) in &collector_sampling {
        run.row(
            &format!("(h) Collector tail_sampling, num_traces {num_traces} ({label})"),
            spans,
        );
    }
    for (_, num_traces, (_, sampled)) in &collector_sampling {
        if let Some(s) = sampled {
            println!(
                "(h) num_traces {num_traces}: {:.0} traces received, {:.0} dropped before \
                 their decision, {:.0} late spans decided anew",
                s.traces, s.dropped, s.late
            );
        }
    }
    if let (Some(sampling), Some((_, _, (held, _)))) = (&sampling, collector_sampling.first()) {
        println!(
            "spans per CPU-second (g)/(h) = {:.2} (Floe's job with tail sampling, spans landed \
             too, over the Collector's sampler holding every trace)",
            held.cpu / sampling.cpu.max(0.01)
        );
    }
    if let (Some(plain), Some(recipe)) = (&plain, &recipe) {
        println!(
            "(b)/(a) = {:.2} steady (target ≥ 0.50), {:.2} read, {:.2} committed, {:.2} drained, \
             {:.2} per CPU-second",
            plain.steady_seconds / recipe.steady_seconds,
            plain.read_seconds / recipe.read_seconds,
            plain.input_seconds / recipe.input_seconds,
            plain.seconds / recipe.seconds,
            plain.cpu / recipe.cpu.max(0.01),
        );
    }
    if let (Some(plain), Some(sampling)) = (&plain, &sampling) {
        println!(
            "(g)/(a) = {:.2} sustained, {:.2} per CPU-second",
            plain.input_seconds / sampling.input_seconds,
            plain.cpu / sampling.cpu.max(0.01)
        );
    }
    if let (Some(plain), Some(redacted)) = (&plain, &redacted) {
        println!(
            "(i)/(a) = {:.2} sustained (target ≥ 0.80), {:.2} per CPU-second",
            plain.input_seconds / redacted.input_seconds,
            plain.cpu / redacted.cpu.max(0.01)
        );
    }
    if let (Some(redacted), Some(c)) = (&redacted, &collector_redacting) {
        println!(
            "spans per CPU-second (i)/(j) = {:.2} (Floe's job redacting, spans landed too, over \
             the Collector's redaction processor)",
            c.cpu / redacted.cpu.max(0.01)
        );
    }
    if let (Some(plain), Some(exchanged)) = (&plain, &exchanged) {
        println!(
            "(c)/(a) = {:.2} sustained, {:.2} drained",
            plain.input_seconds / exchanged.input_seconds,
            plain.seconds / exchanged.seconds
        );
    }
    if let Some(exchanged) = &exchanged {
        let exchange_records: i64 = topic_ends(&brokers, &through).values().sum();
        println!(
            "exchange (c): {spans} rows in {exchange_records} records, {:.0} rows/s, {:.0} rows \
             per CPU-second of the job",
            spans as f64 / exchanged.seconds,
            spans as f64 / exchanged.cpu.max(0.01)
        );
    }
    match (&span_metrics, &red) {
        (Some(c), Some(red)) => println!(
            "spans per CPU-second (d)/(e) = {:.2} (Floe's RED over the Collector's)",
            c.cpu / red.cpu.max(0.01)
        ),
        (None, Some(_)) if only.wants('e') => {
            println!("(e) skipped: FLOE_TEST_OTELCOL is not set")
        }
        _ => {}
    }
    let _ = std::fs::remove_dir_all(&dir);
}
