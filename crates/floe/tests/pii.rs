//! PII never reaches the lake. A generated corpus — every built-in detector's values
//! injected at known places of spans, logs and data points (attributes, event attributes,
//! status messages, log bodies as strings and as kvlists, resource attributes), decoys that
//! must not match beside them (Luhn-invalid card numbers, CPFs with a wrong check digit,
//! UUIDs, hex ids, versions, dates, routes), and malformed records quoting PII — goes
//! through Kafka into `floe run` with `[source.redaction]`, once uninterrupted and once
//! killed -9 ten times. Then:
//!
//! * every string of every Parquet file Floe wrote (data, findings, dead letters; committed
//!   or not, but for those a kill cut short, which no engine can read), read with pyarrow,
//!   and the job's log hold none of the injected values;
//! * the decoys landed as sent;
//! * `otel_pii_findings` counts exactly what was injected per signal, field and detector,
//!   and the killed run's findings equal the uninterrupted run's, row for row;
//! * spans with a finding whose action is `drop_record` did not land, all others did;
//! * the dead letters keep their place and reason, not their bytes.
//!
//! The same corpus then goes through the Collector's contrib `redaction` processor
//! (`tests/services/collector`), configured with Floe's detectors' own patterns as
//! `blocked_values` and every key allowed: what it caught and what it masked that was no PII
//! are counted per detector for docs/pii.md's side-by-side table.
//!
//! Needs `FLOE_TEST_KAFKA_BROKERS`, `FLOE_TEST_PYTHON` and, for the comparison,
//! `FLOE_TEST_OTELCOL` (from `tests/services/up`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use floe_pii::Detector;
use floe_pii::corpus::{Corpus, found_part};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, KeyValueList, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, LogsData, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Metric, MetricsData, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric,
    number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    ResourceSpans, ScopeSpans, Span, Status, TracesData, span,
};
use prost::Message;
use rand::Rng;
use rand::SeedableRng;

mod support;
use support::{
    OtlpKafkaJob, kills, python, service, spawn_floe_with, start_catalog, temp_dir, terminate,
};

const RECORDS: usize = 120;
const ITEMS: usize = 8;
const PARTITIONS: i32 = 2;
const T0: u64 = 1_765_000_000_000_000_000;
const KEY: (&str, &str) = ("FLOE_PII_HASH_KEY", "test-only-key");

/// The job's rules: the test's actions per detector.
const REDACTION: &str = r#"
[source.redaction]
action = "mask"
actions = { email = "hash", private_key = "drop_attribute", jwt = "drop_record" }
"#;

fn s(text: &str) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(text.into())),
    }
}

fn kv(key: &str, value: AnyValue) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(value),
        ..Default::default()
    }
}

/// The two tests load the machine: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What was sent: injected values per (signal, field, detector), their texts (and each one's
/// detector, malformed records' as `None`), decoys, and the spans that must not land.
#[derive(Default)]
struct Truth {
    counts: BTreeMap<(String, String, String), u64>,
    values: Vec<String>,
    detectors: Vec<Option<Detector>>,
    decoys: Vec<String>,
    spans: u64,
    dropped_spans: u64,
}

impl Truth {
    fn inject(
        &mut self,
        corpus: &mut Corpus,
        detector: Detector,
        signal: &str,
        field: &str,
    ) -> String {
        let value = corpus.value(detector);
        self.values.push(found_part(detector, &value).to_string());
        self.detectors.push(Some(detector));
        *self
            .counts
            .entry((signal.into(), field.into(), detector.name().into()))
            .or_default() += 1;
        value
    }
}

/// The corpus as OTLP protobuf records: (signal, bytes).
fn corpus(truth: &mut Truth) -> Vec<(&'static str, Vec<u8>)> {
    let mut corpus = Corpus::new(29);
    let mut rng = rand::rngs::StdRng::seed_from_u64(29);
    let detectors = Detector::ALL;
    let mut next = 0usize;
    let mut pick = || {
        next += 1;
        detectors[next % detectors.len()]
    };
    let mut records = Vec::new();
    for r in 0..RECORDS {
        let minute = T0 + (r as u64 / 10) * 60_000_000_000;
        let service = format!("svc-{}", r % 5);
        // Every fifth record's resource carries an e-mail address.
        let mut resource_attributes = vec![kv("service.name", s(&service))];
        let owner = r % 5 == 0;
        match r % 3 {
            0 => {
                let mut spans = Vec::new();
                if owner {
                    let v = truth.inject(
                        &mut corpus,
                        Detector::Email,
                        "traces",
                        "resource.attributes",
                    );
                    resource_attributes.push(kv("owner", s(&v)));
                }
                for i in 0..ITEMS {
                    let d = pick();
                    let dropped = d == Detector::Jwt;
                    let decoy = corpus.decoy();
                    if !dropped {
                        truth.decoys.push(decoy.clone());
                    }
                    let mut span = Span {
                        trace_id: rng.random::<[u8; 16]>().to_vec(),
                        span_id: rng.random::<[u8; 8]>().to_vec(),
                        name: "GET /checkout".into(),
                        start_time_unix_nano: minute + i as u64 * 1_000_000,
                        end_time_unix_nano: minute + i as u64 * 1_000_000 + 500_000,
                        attributes: vec![kv("http.method", s("GET")), kv("decoy", s(&decoy))],
                        ..Default::default()
                    };
                    match i % 3 {
                        0 => {
                            let v = truth.inject(&mut corpus, d, "traces", "span.attributes");
                            span.attributes
                                .push(kv("note", s(&format!("contact {v} now"))));
                        }
                        1 => {
                            let v =
                                truth.inject(&mut corpus, d, "traces", "span.events.attributes");
                            span.events.push(span::Event {
                                name: "exception".into(),
                                time_unix_nano: span.start_time_unix_nano,
                                attributes: vec![kv(
                                    "exception.message",
                                    s(&format!("failed for {v}")),
                                )],
                                ..Default::default()
                            });
                        }
                        _ => {
                            let v = truth.inject(&mut corpus, d, "traces", "span.status_message");
                            span.status = Some(Status {
                                message: format!("declined: {v}"),
                                code: 2,
                            });
                        }
                    }
                    truth.spans += 1;
                    truth.dropped_spans += u64::from(dropped);
                    spans.push(span);
                }
                let data = TracesData {
                    resource_spans: vec![ResourceSpans {
                        resource: Some(Resource {
                            attributes: resource_attributes,
                            ..Default::default()
                        }),
                        scope_spans: vec![ScopeSpans {
                            spans,
                            ..Default::default()
                        }],
                        ..Default::default()
                    }],
                };
                records.push(("traces", data.encode_to_vec()));
            }
            1 => {
                let mut logs = Vec::new();
                for i in 0..ITEMS {
                    let d = match pick() {
                        // A dropped record would take its decoy along: no JWTs in logs.
                        Detector::Jwt => Detector::Email,
                        d => d,
                    };
                    let decoy = corpus.decoy();
                    truth.decoys.push(decoy.clone());
                    let mut log = LogRecord {
                        time_unix_nano: minute + i as u64 * 1_000_000,
                        attributes: vec![kv("decoy", s(&decoy))],
                        ..Default::default()
                    };
                    match i % 3 {
                        0 => {
                            let v = truth.inject(&mut corpus, d, "logs", "log.body");
                            log.body = Some(s(&format!("user {v} signed in")));
                        }
                        1 => {
                            let v = truth.inject(&mut corpus, d, "logs", "log.body");
                            log.body = Some(AnyValue {
                                value: Some(any_value::Value::KvlistValue(KeyValueList {
                                    values: vec![kv("event", s("signup")), kv("detail", s(&v))],
                                })),
                            });
                        }
                        _ => {
                            let v = truth.inject(&mut corpus, d, "logs", "log.attributes");
                            log.body = Some(s("payment refused"));
                            log.attributes.push(kv("customer", s(&v)));
                        }
                    }
                    logs.push(log);
                }
                let data = LogsData {
                    resource_logs: vec![ResourceLogs {
                        resource: Some(Resource {
                            attributes: resource_attributes,
                            ..Default::default()
                        }),
                        scope_logs: vec![ScopeLogs {
                            log_records: logs,
                            ..Default::default()
                        }],
                        ..Default::default()
                    }],
                };
                records.push(("logs", data.encode_to_vec()));
            }
            _ => {
                let mut points = Vec::new();
                for i in 0..ITEMS {
                    let d = match pick() {
                        Detector::Jwt => Detector::Ipv4,
                        d => d,
                    };
                    let v = truth.inject(&mut corpus, d, "metrics", "metric.attributes");
                    let decoy = corpus.decoy();
                    truth.decoys.push(decoy.clone());
                    points.push(NumberDataPoint {
                        time_unix_nano: minute + i as u64 * 1_000_000,
                        attributes: vec![kv("client", s(&v)), kv("decoy", s(&decoy))],
                        value: Some(number_data_point::Value::AsInt(i as i64)),
                        ..Default::default()
                    });
                }
                let data = MetricsData {
                    resource_metrics: vec![ResourceMetrics {
                        resource: Some(Resource {
                            attributes: resource_attributes,
                            ..Default::default()
                        }),
                        scope_metrics: vec![ScopeMetrics {
                            metrics: vec![Metric {
                                name: "requests.in_flight".into(),
                                data: Some(metric::Data::Gauge(Gauge {
                                    data_points: points,
                                })),
                                ..Default::default()
                            }],
                            ..Default::default()
                        }],
                        ..Default::default()
                    }],
                };
                records.push(("metrics", data.encode_to_vec()));
            }
        }
        // Now and then a malformed record that quotes PII: it is dead-lettered, redacted.
        if r % 40 == 7 {
            let v = corpus.value(Detector::Email);
            truth.values.push(v.clone());
            truth.detectors.push(None);
            let bad = format!(r#"{{"resourceSpans": [{{"resource": {{"attributes": "{v}"}}}}]}}"#);
            records.push(("traces", bad.into_bytes()));
        }
    }
    records
}

/// A run of the job over the corpus in its own namespace: `kills` kill -9 on the way.
async fn run_job(
    dir: &Path,
    client: &floe_lake::rest::CatalogClient,
    (brokers, catalog, run): (&str, &str, &str),
    topics: &[(String, &'static str)],
    namespace: &str,
    kills: usize,
) -> PathBuf {
    let job = OtlpKafkaJob {
        name: "pii",
        brokers,
        topics: topics.iter().map(|(t, s)| (t.clone(), *s)).collect(),
        run: &format!("{run}-{namespace}"),
        catalog,
        namespace,
        instance: Some(namespace),
        state_dir: dir.join(format!("state-{namespace}")),
    }
    .write(&dir.join(format!("{namespace}.toml")));
    let mut text = std::fs::read_to_string(&job).unwrap();
    text.push_str(REDACTION);
    std::fs::write(&job, text).unwrap();
    let log = dir.join(format!("{namespace}.log"));
    let mut rng = rand::rng();
    let mut child = spawn_floe_with(&job, &log, &[KEY]);
    for _ in 0..kills {
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..2500))).await;
        child.kill().unwrap();
        child.wait().unwrap();
        child = spawn_floe_with(&job, &log, &[KEY]);
    }
    for (topic, _) in topics {
        let ends = support::topic_ends(brokers, topic);
        support::wait_committed(client, (namespace, "pii"), topic, &ends, &log).await;
    }
    terminate(child);
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn pii_never_reaches_the_lake_and_is_counted_exactly_once() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let brokers = service("FLOE_TEST_KAFKA_BROKERS");
    service("FLOE_TEST_PYTHON");
    let dir = temp_dir("pii");
    let (catalog, client) = start_catalog(&dir).await;
    let uri = catalog.uri();
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let topics: Vec<(String, &'static str)> = ["traces", "logs", "metrics"]
        .into_iter()
        .map(|signal| (format!("pii-{signal}-{run}"), signal))
        .collect();
    for (topic, _) in &topics {
        support::create_topic(&brokers, topic, PARTITIONS).await;
    }
    let mut truth = Truth::default();
    let records = corpus(&mut truth);
    let producer = support::producer(&brokers);
    for (i, (signal, bytes)) in records.iter().enumerate() {
        let topic = &topics.iter().find(|(_, s)| s == signal).unwrap().0;
        support::send_to(&producer, topic, i as i32 % PARTITIONS, bytes).await;
    }

    let kills = kills().clamp(10, 12);
    let clean_log = run_job(&dir, &client, (&brokers, &uri, &run), &topics, "clean", 0).await;
    let chaos_log = run_job(
        &dir,
        &client,
        (&brokers, &uri, &run),
        &topics,
        "chaos",
        kills,
    )
    .await;

    // The job's logs name no value.
    for log in [&clean_log, &chaos_log] {
        let text = std::fs::read_to_string(log).unwrap();
        let leaked: Vec<&String> = truth
            .values
            .iter()
            .filter(|v| text.contains(v.as_str()))
            .collect();
        assert!(leaked.is_empty(), "{} printed {leaked:?}", log.display());
    }

    let location = async |namespace: &str, table: &str| {
        support::metadata_location(&client, namespace, table).await
    };
    let mut tables = BTreeMap::new();
    for namespace in ["clean", "chaos"] {
        for table in [
            "otel_spans",
            "otel_logs",
            "otel_metrics_gauge",
            "otel_pii_findings",
            "floe_dead_letters",
        ] {
            tables.insert(
                format!("{namespace}.{table}"),
                location(namespace, table).await,
            );
        }
    }
    std::fs::write(
        dir.join("values.json"),
        serde_json::to_string(&truth.values).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.join("decoys.json"),
        serde_json::to_string(&truth.decoys).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.join("tables.json"),
        serde_json::to_string(&tables).unwrap(),
    )
    .unwrap();
    let out = python(&format!(
        r#"import json, os, duckdb_offline, pyarrow, pyarrow.parquet as pq
values = json.load(open('{dir}/values.json'))
decoys = set(json.load(open('{dir}/decoys.json')))
tables = json.load(open('{dir}/tables.json'))
# Every string of every Parquet file under the warehouse.
def strings(array):
    t = array.type
    if pyarrow.types.is_string(t) or pyarrow.types.is_large_string(t):
        return [x for x in array.to_pylist() if x is not None]
    if pyarrow.types.is_binary(t) or pyarrow.types.is_large_binary(t):
        return [x.decode('utf-8', 'replace') for x in array.to_pylist() if x is not None]
    if pyarrow.types.is_map(t):
        return strings(array.keys) + strings(array.items)
    if pyarrow.types.is_list(t) or pyarrow.types.is_large_list(t):
        return strings(array.flatten())
    if pyarrow.types.is_struct(t):
        return [s for i in range(t.num_fields) for s in strings(array.field(i))]
    return []
files, texts, leaks, unreadable = 0, 0, [], 0
for root, _, names in os.walk('{dir}/warehouse'):
    for name in names:
        if not name.endswith('.parquet'):
            continue
        try:
            table = pq.read_table(os.path.join(root, name))
        except pyarrow.ArrowInvalid:
            # A file a killed incarnation was writing: never committed, unreadable by any
            # engine (and what went into it was redacted before).
            unreadable += 1
            continue
        files += 1
        blob = '\n'.join(s for column in table.columns for chunk in column.chunks for s in strings(chunk))
        texts += len(blob)
        leaks += [v for v in values if v in blob]
con = duckdb_offline.connect()
def one(q): return con.sql(q).fetchone()[0]
out = {{"files": files, "unreadable": unreadable, "chars": texts, "leaks": leaks[:5], "leaked": len(leaks)}}
f = tables["clean.otel_pii_findings"]
out["findings"] = con.sql(f"SELECT signal, field, detector, sum(count)::BIGINT FROM iceberg_scan('{{f}}') GROUP BY ALL ORDER BY ALL").fetchall()
cols = "ts, service_name, signal, field, detector, action, count, kafka_topic, kafka_partition, kafka_offset, kafka_item"
g = tables["chaos.otel_pii_findings"]
out["chaos_diff"] = [one(f"SELECT count(*) FROM (SELECT {{cols}} FROM iceberg_scan('{{f}}') EXCEPT ALL SELECT {{cols}} FROM iceberg_scan('{{g}}'))"),
                     one(f"SELECT count(*) FROM (SELECT {{cols}} FROM iceberg_scan('{{g}}') EXCEPT ALL SELECT {{cols}} FROM iceberg_scan('{{f}}'))")]
out["rows"] = one(f"SELECT count(*) FROM iceberg_scan('{{f}}')")
landed = set()
for t in ["otel_spans", "otel_logs", "otel_metrics_gauge"]:
    for (d,) in con.sql(f"SELECT {{'span_attributes' if t == 'otel_spans' else 'log_attributes' if t == 'otel_logs' else 'attributes'}}['decoy'] FROM iceberg_scan('{{tables['clean.' + t]}}')").fetchall():
        landed.add(d)
out["decoys_changed"] = len(decoys - landed)
out["spans"] = one(f"SELECT count(*) FROM iceberg_scan('{{tables['clean.otel_spans']}}')")
d = tables["clean.floe_dead_letters"]
out["dead"] = con.sql(f"SELECT count(*), count(raw) FROM iceberg_scan('{{d}}')").fetchone()
print(json.dumps(out, default=str))
"#,
        dir = dir.display()
    ));
    let out: serde_json::Value = serde_json::from_str(out.trim().lines().last().unwrap()).unwrap();
    eprintln!("pii: {out}");
    assert_eq!(
        out["leaked"], 0,
        "injected values in Parquet: {}",
        out["leaks"]
    );
    // Every table of both runs was read: five tables, two namespaces.
    assert!(out["files"].as_u64().unwrap() >= 10);
    let findings: BTreeMap<(String, String, String), u64> = out["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                (
                    r[0].as_str().unwrap().to_string(),
                    r[1].as_str().unwrap().to_string(),
                    r[2].as_str().unwrap().to_string(),
                ),
                r[3].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        findings, truth.counts,
        "findings count exactly what was injected"
    );
    assert_eq!(
        out["chaos_diff"],
        serde_json::json!([0, 0]),
        "killed run's findings differ"
    );
    assert_eq!(out["decoys_changed"], 0, "decoys redacted");
    assert_eq!(
        out["spans"].as_u64().unwrap(),
        truth.spans - truth.dropped_spans
    );
    assert_eq!(
        out["dead"][0].as_u64().unwrap(),
        (RECORDS as u64).div_ceil(40)
    );
    assert_eq!(out["dead"][1], 0, "dead letters keep no bytes");
    catalog.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Collector's redaction processor: OTLP/HTTP in, every key allowed, Floe's detectors'
/// patterns as `blocked_values`, each signal to its Kafka topic.
fn redaction_config(dir: &Path) -> PathBuf {
    let text = format!(
        r#"receivers:
  otlp:
    protocols:
      http:
        endpoint: ${{env:OTLP_HTTP_ENDPOINT}}
{processors}exporters:
  kafka:
    brokers: ["${{env:KAFKA_BROKERS}}"]
    timeout: 30s
    traces: {{topic: "${{env:OUT}}-traces", encoding: otlp_proto}}
    logs: {{topic: "${{env:OUT}}-logs", encoding: otlp_proto}}
    metrics: {{topic: "${{env:OUT}}-metrics", encoding: otlp_proto}}
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    traces: {{receivers: [otlp], processors: [redaction], exporters: [kafka]}}
    logs: {{receivers: [otlp], processors: [redaction], exporters: [kafka]}}
    metrics: {{receivers: [otlp], processors: [redaction], exporters: [kafka]}}
"#,
        processors = support::otelcol::redaction_processor()
    );
    let path = dir.join("redaction.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn the_collectors_redaction_processor_on_the_same_corpus() {
    use floe_otlp::Signal;
    use floe_otlp::generate::Record;
    use rdkafka::message::Message as _;
    let _alone = ONE_AT_A_TIME.lock().await;
    let brokers = service("FLOE_TEST_KAFKA_BROKERS");
    service("FLOE_TEST_OTELCOL");
    let dir = temp_dir("pii-collector");
    let out = format!(
        "pii-otelcol-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    for signal in ["traces", "logs", "metrics"] {
        support::create_topic(&brokers, &format!("{out}-{signal}"), 1).await;
    }
    let mut truth = Truth::default();
    let records = corpus(&mut truth);
    let mut collector = support::otelcol::Collector::start(
        &redaction_config(&dir),
        &[],
        &[("KAFKA_BROKERS", &brokers), ("OUT", &out)],
        &dir.join("collector.log"),
    );
    let http = reqwest::Client::new();
    collector.ready(&http).await;
    let mut sent = 0;
    for (signal, bytes) in &records {
        let signal = Signal::parse(signal).unwrap();
        if floe_otlp::decode(signal, bytes).is_err() {
            continue; // the malformed ones: the Collector's receiver would refuse them
        }
        let record = Record {
            signal,
            bytes: bytes.clone(),
            items: 0,
        };
        collector.send(&http, &record).await;
        sent += 1;
    }
    collector.stop();

    // Everything it wrote, as text: the Debug form holds every string, escaped.
    let mut written = String::new();
    let mut records_out = 0;
    for signal in ["traces", "logs", "metrics"] {
        for m in support::read_topic(&brokers, &format!("{out}-{signal}")) {
            let decoded =
                floe_otlp::decode(Signal::parse(signal).unwrap(), m.payload().unwrap()).unwrap();
            written.push_str(&format!("{decoded:?}\n"));
            records_out += 1;
        }
    }
    assert!(records_out > 0 && sent > 0);
    let escaped = |v: &str| {
        let e = format!("{v:?}");
        e[1..e.len() - 1].to_string()
    };
    // Per detector: injected, and left as they were.
    let mut per: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for (value, detector) in truth.values.iter().zip(&truth.detectors) {
        let Some(d) = detector else { continue };
        let entry = per.entry(d.name()).or_default();
        entry.0 += 1;
        entry.1 += u64::from(written.contains(&escaped(value)));
    }
    let decoys_masked = truth
        .decoys
        .iter()
        .filter(|d| !written.contains(&escaped(d)))
        .count();
    let mut table = String::from(
        "| detector | injected | Collector caught | Floe caught |\n|---|---|---|---|\n",
    );
    let (mut all, mut caught) = (0, 0);
    for (name, (injected, left)) in &per {
        table += &format!(
            "| `{name}` | {injected} | {} | {injected} |\n",
            injected - left
        );
        all += injected;
        caught += injected - left;
    }
    table += &format!(
        "| all | {all} | {caught} ({:.1} %) | {all} (100 %) |\n| decoys masked (of {}) | | {decoys_masked} ({:.1} %) | 0 |\n",
        100.0 * caught as f64 / all as f64,
        truth.decoys.len(),
        100.0 * decoys_masked as f64 / truth.decoys.len() as f64
    );
    eprintln!("the Collector's redaction processor, Floe's patterns:\n{table}");
    // What the processor does not scan leaks: span status messages.
    let status_left = truth
        .values
        .iter()
        .zip(&truth.detectors)
        .filter(|(v, d)| d.is_some() && written.contains(&escaped(&format!("declined: {v}"))))
        .count();
    assert!(
        status_left > 0,
        "the Collector now redacts status messages: update docs/pii.md"
    );
    assert!(caught < all);
    let _ = std::fs::remove_dir_all(&dir);
}
