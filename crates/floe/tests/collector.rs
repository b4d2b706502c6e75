//! The OpenTelemetry Collector as the producer: the distribution built from Go modules by
//! `tests/services/up` (`tests/services/collector`), run with the config compose ships
//! (`docker/otel-collector/config.yaml`), receives OTLP over HTTP and writes every signal to
//! Kafka with its own Kafka exporter — one Collector with `otlp_proto`, one with `otlp_json`,
//! both with `partition_traces_by_id` and profiles enabled (`service.profilesSupport`).
//! `floe run` lands the eight topics while it is killed -9 again and again (its local state
//! directory deleted at every other restart); afterwards
//! DuckDB must count every span, log record, data point and profile sample Kafka holds exactly
//! once per encoding (the Collector's exporter is at least once: an export it retries lands in
//! Kafka twice, and so in the table), find every span sent and the sampled values (and every
//! service's stacks) as they were sent, keep every trace in one partition, and hold no dead
//! letter.
//!
//! Needs `FLOE_TEST_OTELCOL`, `FLOE_TEST_KAFKA_BROKERS` and `FLOE_TEST_PYTHON` (from
//! `tests/services/up`): ignored without `--include-ignored`, which `tests/run` passes.
//! `FLOE_CHAOS_KILLS` sets the number of kills (default 20, at least 10 here).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::time::{Duration, Instant};

use floe_core::position_of;
use floe_otlp::generate::{Generator, Record};
use floe_otlp::profiles::{Dictionary, stack_hash};
use floe_otlp::{Decoded, Signal, decode};
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use rand::Rng;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};

mod support;
use support::otelcol::Collector;
use support::{
    OtlpKafkaJob, anchor_writers, committed, kills, python, read_topic, service, spawn_floe,
    start_catalog, temp_dir, terminate,
};

const PARTITIONS: i32 = 3;
const ENCODINGS: [&str; 2] = ["otlp_proto", "otlp_json"];
/// The data-point tables of the metrics signal.
const METRIC_TABLES: [&str; 5] = [
    "otel_metrics_gauge",
    "otel_metrics_sum",
    "otel_metrics_histogram",
    "otel_metrics_exponential_histogram",
    "otel_metrics_summary",
];

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A string `AnyValue`'s text.
fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        other => panic!("not a string: {other:?}"),
    }
}

/// The topics one Collector writes: spans, logs, metrics, profiles.
fn topics(run: &str, encoding: &str) -> [String; 4] {
    ["spans", "logs", "metrics", "profiles"].map(|signal| format!("{signal}_{encoding}_{run}"))
}

/// A Collector with one encoding, on the config compose ships.
fn start_collector(dir: &Path, brokers: &str, encoding: &str, topics: &[String; 4]) -> Collector {
    let config =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docker/otel-collector/config.yaml");
    Collector::start(
        &config,
        &["--feature-gates=service.profilesSupport"],
        &[
            ("KAFKA_BROKERS", brokers),
            ("OTLP_ENCODING", encoding),
            ("TRACES_TOPIC", &topics[0]),
            ("LOGS_TOPIC", &topics[1]),
            ("METRICS_TOPIC", &topics[2]),
            ("PROFILES_TOPIC", &topics[3]),
            ("BATCH_TIMEOUT", "200ms"),
        ],
        &dir.join(format!("collector-{encoding}.log")),
    )
}

/// What was sent through one Collector.
#[derive(Default)]
struct Sent {
    spans: u64,
    logs: u64,
    /// Data points per metrics table.
    points: BTreeMap<&'static str, u64>,
    /// The first span of each traces export: (span id, trace id, name, service, duration).
    span_samples: Vec<serde_json::Value>,
    /// The first log record of each logs export: (time, severity number, body).
    log_samples: Vec<serde_json::Value>,
    /// Profile samples, and how many link to a span.
    samples: u64,
    linked: u64,
    /// Summed sample values per (service, stack hash).
    stacks: BTreeMap<(String, String), i64>,
}

impl Sent {
    /// Notes one export sent to a Collector.
    fn note(&mut self, record: &Record) {
        self.note_decoded(decode(record.signal, &record.bytes).unwrap());
    }

    /// Notes one decoded export (or Kafka record).
    fn note_decoded(&mut self, decoded: Decoded) {
        match decoded {
            Decoded::Traces(data) => {
                self.spans += data
                    .resource_spans
                    .iter()
                    .flat_map(|r| &r.scope_spans)
                    .map(|s| s.spans.len() as u64)
                    .sum::<u64>();
                let resource = &data.resource_spans[0];
                let service = resource
                    .resource
                    .as_ref()
                    .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
                    .map(|a| text(a.value.as_ref()))
                    .unwrap();
                let span = &resource.scope_spans[0].spans[0];
                self.span_samples.push(serde_json::json!([
                    hex(&span.span_id),
                    hex(&span.trace_id),
                    span.name,
                    service,
                    span.end_time_unix_nano - span.start_time_unix_nano,
                ]));
            }
            Decoded::Logs(data) => {
                self.logs += data
                    .resource_logs
                    .iter()
                    .flat_map(|r| &r.scope_logs)
                    .map(|s| s.log_records.len() as u64)
                    .sum::<u64>();
                let log = &data.resource_logs[0].scope_logs[0].log_records[0];
                self.log_samples.push(serde_json::json!([
                    log.time_unix_nano,
                    log.severity_number,
                    text(log.body.as_ref()),
                ]));
            }
            Decoded::Profiles(data) => {
                let d = Dictionary::of(&data);
                for rp in &data.resource_profiles {
                    let service = rp
                        .resource
                        .as_ref()
                        .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
                        .map(|a| text(a.value.as_ref()))
                        .unwrap();
                    for p in rp.scope_profiles.iter().flat_map(|s| &s.profiles) {
                        for sample in &p.samples {
                            let hash = stack_hash(d.frames(sample.stack_index));
                            *self.stacks.entry((service.clone(), hash)).or_default() +=
                                sample.values.iter().sum::<i64>();
                            self.samples += 1;
                            self.linked += u64::from(d.link(sample.link_index).is_some());
                        }
                    }
                }
            }
            Decoded::Metrics(data) => {
                use opentelemetry_proto::tonic::metrics::v1::metric::Data;
                for metric in data
                    .resource_metrics
                    .iter()
                    .flat_map(|r| &r.scope_metrics)
                    .flat_map(|s| &s.metrics)
                {
                    let (table, n) = match metric.data.as_ref().unwrap() {
                        Data::Gauge(g) => (METRIC_TABLES[0], g.data_points.len()),
                        Data::Sum(s) => (METRIC_TABLES[1], s.data_points.len()),
                        Data::Histogram(h) => (METRIC_TABLES[2], h.data_points.len()),
                        Data::ExponentialHistogram(e) => (METRIC_TABLES[3], e.data_points.len()),
                        Data::Summary(s) => (METRIC_TABLES[4], s.data_points.len()),
                    };
                    *self.points.entry(table).or_default() += n as u64;
                }
            }
        }
    }
}

/// What Kafka holds of one Collector's `topics` (spans, logs, metrics, profiles). The
/// Collector's Kafka exporter is at least once — an export retried after a timeout writes again
/// what it had already written — so Floe's exactly once is measured against this, and what was
/// sent must be in it.
fn held(brokers: &str, topics: &[String; 4]) -> Sent {
    use rdkafka::message::Message;
    let mut held = Sent::default();
    let signals = [
        Signal::Traces,
        Signal::Logs,
        Signal::Metrics,
        Signal::Profiles,
    ];
    for (topic, signal) in topics.iter().zip(signals) {
        for record in read_topic(brokers, topic) {
            held.note_decoded(decode(signal, record.payload().unwrap_or_default()).unwrap());
        }
    }
    held
}

fn job_file(dir: &Path, brokers: &str, uri: &str, run: &str) -> PathBuf {
    let topics = ENCODINGS
        .iter()
        .flat_map(|e| {
            let [spans, logs, metrics, profiles] = topics(run, e);
            [
                (spans, "traces"),
                (logs, "logs"),
                (metrics, "metrics"),
                (profiles, "profiles"),
            ]
        })
        .collect();
    OtlpKafkaJob {
        name: "collector",
        brokers,
        topics,
        run,
        catalog: uri,
        namespace: "collector",
        instance: Some("collector"),
        state_dir: dir.join("state"),
    }
    .write(&dir.join("job.toml"))
}

/// The end offset of every partition of `topics`, once the Collectors have stopped.
fn high_watermarks(brokers: &str, topics: &[String]) -> BTreeMap<(String, i32), i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "floe-test-watermarks")
        .create()
        .unwrap();
    let mut ends = BTreeMap::new();
    for topic in topics {
        for partition in 0..PARTITIONS {
            let (_, high) = consumer
                .fetch_watermarks(topic, partition, Duration::from_secs(10))
                .unwrap();
            ends.insert((topic.clone(), partition), high);
        }
    }
    ends
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn the_collectors_kafka_exporter_feeds_floe_exactly_once_through_kill_9() {
    let brokers = service("FLOE_TEST_KAFKA_BROKERS");
    service("FLOE_TEST_PYTHON");
    let dir = temp_dir("collector");
    let (catalog, client) = start_catalog(&dir).await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let all_topics: Vec<String> = ENCODINGS.iter().flat_map(|e| topics(&run, e)).collect();
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    let new_topics: Vec<NewTopic> = all_topics
        .iter()
        .map(|t| NewTopic::new(t, PARTITIONS, TopicReplication::Fixed(1)))
        .collect();
    for result in admin
        .create_topics(&new_topics, &AdminOptions::new())
        .await
        .unwrap()
    {
        result.unwrap();
    }

    let http = reqwest::Client::new();
    let mut collectors = Vec::new();
    for encoding in ENCODINGS {
        let mut collector = start_collector(&dir, &brokers, encoding, &topics(&run, encoding));
        collector.ready(&http).await;
        collectors.push(collector);
    }

    let job = job_file(&dir, &brokers, &catalog.uri(), &run);
    let log = dir.join("floe.log");
    let mut child = spawn_floe(&job, &log);
    let mut generator = Generator::new(23, 1_700_000_000_000_000_000);
    let mut sent: [Sent; 2] = Default::default();
    let kills = kills().max(10);
    let mut rng = rand::rng();
    let send_round = async |generator: &mut Generator, sent: &mut [Sent; 2], round: usize| {
        for i in 0..4 {
            let which = (round + i) % 2;
            let [traces, logs] = generator.requests(10);
            let metrics = generator.metrics();
            let profiles = generator.profiles(10);
            for record in [traces, logs, metrics, profiles] {
                collectors[which].send(&http, &record).await;
                sent[which].note(&record);
            }
        }
    };
    for round in 0..kills {
        send_round(&mut generator, &mut sent, round).await;
        // A job of eight tables and eighteen partitions takes a second or two to start and
        // take its partitions: lives long enough that most of them commit.
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..4000))).await;
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        if round % 2 == 0 {
            let _ = std::fs::remove_dir_all(dir.join("state"));
        }
        child = spawn_floe(&job, &log);
    }
    send_round(&mut generator, &mut sent, kills).await;
    for collector in collectors {
        collector.stop();
    }

    // Everything the Collectors wrote, committed.
    let ends = high_watermarks(&brokers, &all_topics);
    let began = Instant::now();
    loop {
        let positions = committed(&client, "collector", "collector").await;
        if ends.iter().all(|((topic, partition), end)| {
            position_of(&positions, topic, *partition) == Some(*end)
        }) {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(120),
            "the job did not catch up: {positions:?} vs {ends:?}; log: {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    terminate(child);
    let writers = anchor_writers(&client, "collector").await;
    assert!(
        writers > kills / 3,
        "only {writers} of {} incarnations committed",
        kills + 1
    );

    // DuckDB reads every table back; the expectations travel as JSON.
    let mut locations = BTreeMap::new();
    for table in [
        "otel_spans",
        "otel_logs",
        "otel_profiles",
        "floe_dead_letters",
    ]
    .into_iter()
    .chain(METRIC_TABLES)
    {
        let ident = iceberg::TableIdent::from_strs(["collector", table]).unwrap();
        if let Ok(loaded) = client.load_table(&ident).await {
            locations.insert(table, loaded.metadata_location.unwrap());
        }
    }
    let out = python(&format!(
        r#"import duckdb_offline, json
con = duckdb_offline.connect()
where = json.loads('{locations}')
def rows(q): return con.sql(q).fetchall()
out = {{}}
for name, loc in where.items():
    if name == "floe_dead_letters":
        out[name] = rows(f"SELECT kafka_topic, error FROM iceberg_scan('{{loc}}')")
    else:
        out[name] = rows(f"SELECT kafka_topic, count(*), count(DISTINCT (kafka_topic, kafka_partition, kafka_offset, kafka_item)) FROM iceberg_scan('{{loc}}') GROUP BY 1")
spans = where["otel_spans"]
out["span_ids"] = rows(f"SELECT kafka_topic, count(DISTINCT span_id) FROM iceberg_scan('{{spans}}') GROUP BY 1")
out["split_traces"] = rows(f"SELECT count(*) FROM (SELECT kafka_topic, trace_id FROM iceberg_scan('{{spans}}') GROUP BY ALL HAVING count(DISTINCT kafka_partition) > 1)")[0][0]
out["spans"] = rows(f"SELECT kafka_topic, span_id, trace_id, span_name, service_name, duration_ns FROM iceberg_scan('{{spans}}')")
out["logs"] = rows(f"SELECT kafka_topic, time_unix_nano, severity_number, body FROM iceberg_scan('{{where['otel_logs']}}')")
out["stacks"] = rows(f"SELECT kafka_topic, service_name, stack_hash, sum(value), count(trace_id) FROM iceberg_scan('{{where['otel_profiles']}}') GROUP BY ALL")
print(json.dumps(out, default=str))"#,
        locations = serde_json::to_string(&locations).unwrap(),
    ));
    let out: serde_json::Value = serde_json::from_str(out.trim().lines().last().unwrap()).unwrap();
    let per_topic = |table: &str, topic: &str| -> (u64, u64) {
        out[table]
            .as_array()
            .into_iter()
            .flatten()
            .find(|row| row[0] == topic)
            .map_or((0, 0), |row| {
                (row[1].as_u64().unwrap(), row[2].as_u64().unwrap())
            })
    };
    assert!(
        out["floe_dead_letters"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "the Collector's records are all valid: {}",
        out["floe_dead_letters"]
    );
    assert_eq!(out["split_traces"], 0, "one trace, one partition");
    let mut repeated = 0;
    for (e, encoding) in ENCODINGS.iter().enumerate() {
        let [spans, logs, metrics, profiles] = topics(&run, encoding);
        let sent = &sent[e];
        // Exactly once against what Kafka holds; all that was sent is in it.
        let held = held(&brokers, &topics(&run, encoding));
        assert!(
            held.spans >= sent.spans && held.logs >= sent.logs && held.samples >= sent.samples,
            "{encoding}: Kafka holds what was sent"
        );
        repeated += held.spans - sent.spans + held.logs - sent.logs + held.samples - sent.samples;
        assert_eq!(
            per_topic("otel_spans", &spans),
            (held.spans, held.spans),
            "{encoding}: every span exactly once"
        );
        let ids = out["span_ids"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row[0] == spans.as_str())
            .map(|row| row[1].as_u64().unwrap());
        assert_eq!(
            ids,
            Some(sent.spans),
            "{encoding}: every span sent, and no other"
        );
        assert_eq!(
            per_topic("otel_logs", &logs),
            (held.logs, held.logs),
            "{encoding}: every log record exactly once"
        );
        for table in METRIC_TABLES {
            let want = held.points.get(table).copied().unwrap_or(0);
            assert!(want >= sent.points.get(table).copied().unwrap_or(0));
            assert_eq!(
                per_topic(table, &metrics),
                (want, want),
                "{encoding}: every {table} data point exactly once"
            );
        }
        // Sampled values as sent.
        let landed = |key: &str, topic: &str| -> std::collections::HashSet<String> {
            out[key]
                .as_array()
                .unwrap()
                .iter()
                .filter(|row| row[0] == topic)
                .map(|row| {
                    serde_json::Value::from(row.as_array().unwrap()[1..].to_vec()).to_string()
                })
                .collect()
        };
        let landed_spans = landed("spans", &spans);
        for sample in &sent.span_samples {
            assert!(
                landed_spans.contains(&sample.to_string()),
                "{encoding}: span {sample} landed as sent"
            );
        }
        let landed_logs = landed("logs", &logs);
        for sample in &sent.log_samples {
            assert!(
                landed_logs.contains(&sample.to_string()),
                "{encoding}: log record {sample} landed as sent"
            );
        }
        // Profiles: every sample once, each stack's value per service as sent, the links kept.
        assert_eq!(
            per_topic("otel_profiles", &profiles),
            (held.samples, held.samples),
            "{encoding}: every profile sample exactly once"
        );
        let mut stacks = BTreeMap::new();
        let mut linked = 0;
        for row in out["stacks"].as_array().unwrap() {
            if row[0] == profiles.as_str() {
                let key = (
                    row[1].as_str().unwrap().to_string(),
                    row[2].as_str().unwrap().to_string(),
                );
                stacks.insert(key, row[3].as_i64().unwrap());
                linked += row[4].as_u64().unwrap();
            }
        }
        assert_eq!(
            stacks, held.stacks,
            "{encoding}: each service's stacks and their values"
        );
        assert!(sent.stacks.keys().all(|k| stacks.contains_key(k)));
        assert_eq!(linked, held.linked, "{encoding}: samples linked to spans");
    }
    eprintln!(
        "collector chaos: {kills} kills, {writers} incarnations committed; sent {} spans, {} logs, {} data points, {} profile samples — exactly once ({repeated} spans, log records and samples written twice by a retrying Collector)",
        sent[0].spans + sent[1].spans,
        sent[0].logs + sent[1].logs,
        sent.iter().flat_map(|s| s.points.values()).sum::<u64>(),
        sent[0].samples + sent[1].samples
    );
    catalog.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
