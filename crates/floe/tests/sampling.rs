//! Floe's tail sampling against the OpenTelemetry Collector's on the same traces. One
//! Collector (`tests/services/collector`, config `tailsampling.yaml`) receives the generator's
//! shop traffic over OTLP/HTTP, writes every span to Kafka partitioned by trace id — the
//! topic Floe's `tail_sampling` job reads, with no load-balancing tier — and runs the same
//! spans through its contrib `tail_sampling` processor to a second topic.
//!
//! The same policies on both sides: a string and a numeric attribute under `and`, errors
//! (`status_code`), slow traces (`latency`) and `probabilistic`. Read back by DuckDB, Floe's
//! decisions (`otel_trace_decisions`) must keep exactly the traces the Collector kept; every
//! kept trace must land whole in `otel_spans_sampled` (its spans in `otel_spans`, counted);
//! every trace with an error span and every trace at least the latency threshold must be
//! kept, and the probabilistic policy's share of the traces it judged must be within one
//! point of its setting. Spans far later in event time (a service of their own) close every
//! trace in Floe; the comparison leaves them out.
//!
//! Needs `FLOE_TEST_OTELCOL`, `FLOE_TEST_KAFKA_BROKERS` and `FLOE_TEST_PYTHON` (from
//! `tests/services/up`).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use floe_otlp::generate::Generator;
use opentelemetry_proto::tonic::trace::v1::TracesData;
use prost::Message as _;
use rdkafka::message::Message as _;

mod support;
use support::otelcol::{CLOCK_SERVICE, Collector, clock_spans};
use support::{python, service, spawn_floe, start_catalog, temp_dir, terminate};

const PARTITIONS: i32 = 4;
const EXPORTS: usize = 2_500;
const REQUESTS: usize = 8;
/// 2025-10-09T08:53:20Z.
const START_NS: u64 = 1_760_000_000_000_000_000;
/// The latency policy's threshold: the shop's slowest ~5 % of requests.
const SLOW_MS: u64 = 100;
const PERCENT: u64 = 5;

/// The Floe job: the Collector's topic, the same policies in Floe's words; `sampling` is the
/// operator's timing, `land_spans` whether `otel_spans` lands, `extra` more TOML.
fn job(
    dir: &Path,
    (brokers, topic, catalog, run): (&str, &str, &str, &str),
    sampling: &str,
    land_spans: bool,
    extra: &str,
) -> std::path::PathBuf {
    let text = format!(
        r#"version = 1
name = "sampling"
[source.kafka]
brokers = "{brokers}"
topics = ["{topic}"]
signals = {{ "{topic}" = "traces" }}
group_id = "floe-sampling-{run}"
start = "earliest"
[catalog]
uri = "{catalog}"
namespace = "ts"
[checkpoint]
interval = "1s"
state_dir = "{state}"
[streams.spans]
out_of_orderness = "1s"

[[operators]]
id = "sampled"
kind = "tail_sampling"
input = "spans"
sampling = {sampling}

[[operators.policies]]
name = "node1-server-errors"
type = "and"
[[operators.policies.sub_policies]]
name = "node1"
type = "string_attribute"
key = "host.name"
values = ["node-1"]
[[operators.policies.sub_policies]]
name = "server-errors"
type = "numeric_attribute"
key = "http.response.status_code"
min_value = 500
max_value = 599

[[operators.policies]]
name = "errors"
type = "status_code"
status_codes = ["ERROR"]

[[operators.policies]]
name = "slow"
type = "latency"
threshold = "{SLOW_MS}ms"

[[operators.policies]]
name = "baseline"
type = "probabilistic"
sampling_percentage = {PERCENT}

[tables.spans]
name = "otel_spans"
land = {land_spans}
[tables.sampled]
name = "otel_spans_sampled"
[tables.sampled_decisions]
name = "otel_trace_decisions"
[tables.sampled_late]
name = "otel_spans_sampled_late"
{extra}
"#,
        state = dir.join("state").display(),
    );
    let path = dir.join("sampling.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The trace ids (hex) of the spans on `topic`, but the clock's.
fn kept_by_the_collector(brokers: &str, topic: &str) -> (BTreeSet<String>, usize) {
    let mut traces = BTreeSet::new();
    let mut spans = 0;
    for m in support::read_topic(brokers, topic) {
        let data = TracesData::decode(m.payload().unwrap_or_default()).unwrap();
        for rs in data.resource_spans {
            let clock = rs.resource.as_ref().is_some_and(|r| {
                r.attributes.iter().any(|kv| {
                    kv.key == "service.name"
                        && kv.value.as_ref().and_then(|v| v.value.as_ref())
                            == Some(
                                &opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(
                                    CLOCK_SERVICE.into(),
                                ),
                            )
                })
            });
            if clock {
                continue;
            }
            for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                spans += 1;
                traces.insert(span.trace_id.iter().map(|b| format!("{b:02x}")).collect());
            }
        }
    }
    (traces, spans)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn floe_keeps_the_traces_the_collectors_tail_sampling_keeps() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let brokers = service("FLOE_TEST_KAFKA_BROKERS");
    service("FLOE_TEST_PYTHON");
    let dir = temp_dir("sampling");
    let (catalog, client) = start_catalog(&dir).await;
    let uri = catalog.uri();
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let (all_topic, kept_topic) = (format!("ts-all-{run}"), format!("ts-kept-{run}"));
    support::create_topic(&brokers, &all_topic, PARTITIONS).await;
    support::create_topic(&brokers, &kept_topic, 1).await;

    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tailsampling.yaml");
    let (slow, percent) = (SLOW_MS.to_string(), PERCENT.to_string());
    let mut collector = Collector::start(
        &config,
        &[],
        &[
            ("KAFKA_BROKERS", &brokers),
            ("ALL_TOPIC", &all_topic),
            ("KEPT_TOPIC", &kept_topic),
            ("SLOW_MS", &slow),
            ("PERCENT", &percent),
        ],
        &dir.join("collector.log"),
    );
    let http = reqwest::Client::new();
    collector.ready(&http).await;

    // Forty minutes of the shop's traffic, a second apart per export; then the clock's spans
    // an hour on, which close every trace in Floe's event time.
    let mut spans = 0;
    for j in 0..EXPORTS {
        let start = START_NS + j as u64 * 1_000_000_000;
        let [traces, _logs] = Generator::new(j as u64, start).requests(REQUESTS);
        spans += traces.items;
        collector.send(&http, &traces).await;
    }
    collector
        .send(&http, &clock_spans(START_NS + 3_600_000_000_000, 64))
        .await;
    // Past the processor's decision_wait (1 s, on a 1 s tick); SIGTERM decides the rest.
    tokio::time::sleep(Duration::from_secs(4)).await;
    // Its own counts: every trace seen, none evicted before its decision.
    let metric = |name: &str, labels: &str| {
        collector.metric(&format!("otelcol_processor_tail_sampling_{name}"), labels)
    };
    let received = metric("new_trace_id_received", "").expect("the processor counts traces");
    let too_early = metric("sampling_trace_dropped_too_early", "").unwrap_or(0.0);
    let counted = metric("global_count_traces_sampled", "sampled=\"true\"").unwrap_or(0.0);
    collector.stop();
    assert_eq!(
        too_early, 0.0,
        "the Collector evicted traces before deciding them"
    );

    let ends = support::topic_ends(&brokers, &all_topic);
    assert_eq!(
        ends.values().filter(|end| **end > 0).count(),
        PARTITIONS as usize,
        "traces reached every partition"
    );
    let floe_dir = dir.join("floe");
    std::fs::create_dir_all(&floe_dir).unwrap();
    let job = job(
        &floe_dir,
        (&brokers, &all_topic, &uri, &run),
        r#"{ decision_wait = "5s", decision_ttl = "1m" }"#,
        true,
        "",
    );
    let log = floe_dir.join("floe.log");
    let floe = spawn_floe(&job, &log);
    support::wait_committed(&client, ("ts", "sampling"), &all_topic, &ends, &log).await;
    terminate(floe);

    let (collector_kept, collector_spans) = kept_by_the_collector(&brokers, &kept_topic);
    let location = async |table: &str| support::metadata_location(&client, "ts", table).await;
    let (all, sampled, decisions) = (
        location("otel_spans").await,
        location("otel_spans_sampled").await,
        location("otel_trace_decisions").await,
    );
    let kept_list: Vec<String> = collector_kept.iter().map(|t| format!("'{t}'")).collect();
    std::fs::write(dir.join("collector_kept.txt"), kept_list.join("\n")).unwrap();
    let out = python(&format!(
        r#"import duckdb_offline
con = duckdb_offline.connect()
con.sql("CREATE TABLE spans AS SELECT * FROM iceberg_scan('{all}') WHERE service_name <> '{CLOCK_SERVICE}'")
con.sql("CREATE TABLE sampled AS SELECT * FROM iceberg_scan('{sampled}') WHERE service_name <> '{CLOCK_SERVICE}'")
con.sql("CREATE TABLE decisions AS SELECT * FROM iceberg_scan('{decisions}') WHERE service_name <> '{CLOCK_SERVICE}'")
con.sql("CREATE TABLE collector (trace_id VARCHAR)")
ids = [l.strip().strip("'") for l in open('{kept}') if l.strip()]
con.executemany("INSERT INTO collector VALUES (?)", [[i] for i in ids])
one = lambda q: con.sql(q).fetchone()[0]
traces = one("SELECT count(DISTINCT trace_id) FROM spans")
decided = one("SELECT count(*) FROM decisions")
twice = one("SELECT count(*) FROM (SELECT trace_id FROM decisions GROUP BY 1 HAVING count(*) > 1)")
only_floe = one("SELECT count(*) FROM (SELECT trace_id FROM decisions WHERE sampled EXCEPT SELECT trace_id FROM collector)")
only_collector = one("SELECT count(*) FROM (SELECT trace_id FROM collector EXCEPT SELECT trace_id FROM decisions WHERE sampled)")
# Whole traces: every kept trace's spans, each once, with the deciding policy.
partial = one('''SELECT count(*) FROM (SELECT d.trace_id FROM decisions d JOIN spans s USING (trace_id)
  WHERE d.sampled GROUP BY d.trace_id, d.span_count HAVING count(*) <> d.span_count)''')
wrong = one('''SELECT count(*) FROM (SELECT trace_id, span_id, sampling_policy FROM sampled
  EXCEPT SELECT s.trace_id, s.span_id, d.policy FROM spans s JOIN decisions d USING (trace_id) WHERE d.sampled)''')
extra = one("SELECT count(*) - count(DISTINCT (trace_id, span_id)) FROM sampled")
missing = one('''SELECT count(*) FROM (SELECT s.trace_id, s.span_id FROM spans s JOIN decisions d USING (trace_id) WHERE d.sampled
  EXCEPT SELECT trace_id, span_id FROM sampled)''')
# Every error and every slow trace kept.
errors_lost = one('''SELECT count(*) FROM (SELECT DISTINCT trace_id FROM spans WHERE status_code = 'ERROR')
  JOIN decisions USING (trace_id) WHERE NOT sampled''')
slow_lost = one('''SELECT count(*) FROM (SELECT trace_id FROM spans GROUP BY 1
  HAVING (max(end_time_unix_nano) - min(start_time_unix_nano)) // 1000000 >= {SLOW_MS})
  JOIN decisions USING (trace_id) WHERE NOT sampled''')
# The probabilistic share of the traces no earlier policy kept.
judged = one("SELECT count(*) FROM decisions WHERE policy IS NULL OR policy = 'baseline'")
share = one("SELECT count(*) FROM decisions WHERE policy = 'baseline'") / judged
by_policy = con.sql("SELECT coalesce(policy, '-'), count(*) FROM decisions GROUP BY 1 ORDER BY 1").fetchall()
print(traces, decided, twice, only_floe, only_collector, partial, wrong, extra, missing, errors_lost, slow_lost,
      judged, round(share * 1e6), one("SELECT count(*) FROM decisions WHERE sampled"), one("SELECT count(*) FROM sampled"))
print(by_policy)
"#,
        kept = dir.join("collector_kept.txt").display(),
    ));
    eprintln!(
        "{spans} spans sent; the Collector received {received} trace ids, kept {} traces \
         ({collector_spans} spans; {counted} by its own count)",
        collector_kept.len()
    );
    eprintln!("Floe: {out}");
    let first = out.lines().next().unwrap();
    let [
        traces,
        decided,
        twice,
        only_floe,
        only_collector,
        partial,
        wrong,
        extra,
        missing,
        errors_lost,
        slow_lost,
        judged,
        share_ppm,
        kept,
        kept_spans,
    ] = support::numbers::<i64, _>(first);
    assert!(
        traces >= (EXPORTS * REQUESTS) as i64,
        "{traces} traces landed"
    );
    assert_eq!(decided, traces, "every trace decided");
    assert_eq!(twice, 0, "a trace decided twice");
    assert_eq!(
        (only_floe, only_collector),
        (0, 0),
        "the kept traces are the Collector's"
    );
    assert_eq!(kept, collector_kept.len() as i64);
    // Its count includes the clock's traces it kept.
    assert!(
        counted >= kept as f64,
        "the Collector counted {counted} kept traces"
    );
    assert!(received >= traces as f64);
    assert_eq!(
        (partial, wrong, extra, missing),
        (0, 0, 0, 0),
        "every kept trace lands whole, each span once, with its policy"
    );
    assert_eq!(kept_spans as usize, collector_spans, "the same spans kept");
    assert_eq!((errors_lost, slow_lost), (0, 0));
    let share = share_ppm as f64 / 1e6;
    assert!(
        (share - PERCENT as f64 / 100.0).abs() <= 0.01,
        "probabilistic kept {:.2} % of {judged} traces",
        share * 100.0
    );
    // Each policy decided some traces.
    let policies = out.lines().nth(1).unwrap();
    for policy in ["errors", "slow", "node1-server-errors", "baseline"] {
        assert!(
            policies.contains(&format!("('{policy}', ")),
            "no trace kept by {policy}: {policies}"
        );
    }
}

/// The spill test's state budget (the store's least).
const BUDGET_MIB: u64 = 8;
/// What the spill test holds undecided, in OTLP protobuf bytes (the most compact form the
/// spans take; as rows they are larger): this many times the budget.
const HELD_TIMES_BUDGET: u64 = 8;

/// The two tests load the machine: one at a time, so that neither's timing is the other's.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Undecided traces worth several times `[state] memory` live in RocksDB on disk, not in
/// memory: the job holds them all (its `decision_wait` is longer than the traffic); its peak
/// RSS holding eight budgets' worth is at most one budget (and a quarter of the difference)
/// above its peak holding two; and once a later clock closes them every trace is
/// decided and every kept trace lands whole — nothing evicted, nothing dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn undecided_traces_beyond_the_memory_budget_spill_and_nothing_is_dropped() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let brokers = service("FLOE_TEST_KAFKA_BROKERS");
    service("FLOE_TEST_PYTHON");
    let dir = temp_dir("sampling-spill");
    let (catalog, client) = start_catalog(&dir).await;
    let uri = catalog.uri();
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let topic = format!("ts-spill-{run}");
    support::create_topic(&brokers, &topic, 2).await;
    let job = job(
        &dir,
        (&brokers, &topic, &uri, &run),
        r#"{ decision_wait = "1h", decision_ttl = "1m" }"#,
        false,
        // librdkafka prefetches up to 64 MiB per partition by default: capped, so that what
        // the RSS shows is the job's own.
        &format!(
            "[state]\nmemory = \"{BUDGET_MIB}MiB\"\n[source.kafka.properties]\n\
             \"queued.max.messages.kbytes\" = \"4096\"\n"
        ),
    );
    let log = dir.join("floe.log");
    let floe = spawn_floe(&job, &log);
    let pid = floe.id();
    let producer = support::producer(&brokers);
    let mut generator = Generator::new(7, START_NS);
    let (mut sent, mut spans, mut exports) = (0u64, 0u64, 0i32);
    let send = async |bytes: &[u8], partition: i32| {
        support::send_to(&producer, &topic, partition % 2, bytes).await;
    };

    // Two budgets' worth, then the rest: the peak RSS after each. Had the job kept the
    // traces in memory, the second peak would exceed the first by what came in between (and
    // more: as rows they are larger than as protobuf); spilled, only the budget may be added.
    let kib = |field| {
        support::proc_status(pid, field)
            .and_then(|v| v.trim_end_matches(" kB").parse::<u64>().ok())
            .expect("the job runs")
    };
    let mut peaks = Vec::new();
    let mut held = Vec::new();
    for goal in [
        (2 * BUDGET_MIB) << 20,
        (BUDGET_MIB * HELD_TIMES_BUDGET) << 20,
    ] {
        while sent < goal {
            let [traces, _] = generator.requests(REQUESTS);
            send(&traces.bytes, exports).await;
            exports += 1;
            (sent, spans) = (
                sent + traces.bytes.len() as u64,
                spans + traces.items as u64,
            );
        }
        let ends = support::topic_ends(&brokers, &topic);
        support::wait_committed(&client, ("ts", "sampling"), &topic, &ends, &log).await;
        peaks.push(kib("VmHWM") << 10);
        held.push(sent);
    }
    let on_disk: u64 = walk(&dir.join("state"));
    let (grew, more) = (peaks[1].saturating_sub(peaks[0]), held[1] - held[0]);
    eprintln!(
        "spill: {spans} spans in {exports} exports, {} MiB as protobuf, held undecided with a \
         {BUDGET_MIB} MiB budget: peak RSS {} MiB holding {} MiB, {} MiB holding {} MiB; state \
         on disk {} MiB",
        sent >> 20,
        peaks[0] >> 20,
        held[0] >> 20,
        peaks[1] >> 20,
        held[1] >> 20,
        on_disk >> 20
    );
    assert!(
        grew < (BUDGET_MIB << 20) + more / 4,
        "peak RSS grew by {} MiB while {} MiB more spans were held",
        grew >> 20,
        more >> 20
    );
    let decisions = support::metadata_location(&client, "ts", "otel_trace_decisions").await;
    let early = python(&format!(
        "import duckdb_offline\nprint(duckdb_offline.connect().sql(\"SELECT count(*) FROM iceberg_scan('{decisions}')\").fetchone()[0])"
    ));
    assert_eq!(
        early.trim(),
        "0",
        "a trace was decided before its decision_wait"
    );

    // The clock an hour and a half on closes every trace.
    let clock = clock_spans(START_NS + 5_400_000_000_000, 16);
    for partition in 0..2 {
        send(&clock.bytes, partition).await;
    }
    let ends = support::topic_ends(&brokers, &topic);
    support::wait_committed(&client, ("ts", "sampling"), &topic, &ends, &log).await;
    terminate(floe);
    let (sampled, decisions) = (
        support::metadata_location(&client, "ts", "otel_spans_sampled").await,
        support::metadata_location(&client, "ts", "otel_trace_decisions").await,
    );
    let out = python(&format!(
        r#"import duckdb_offline
con = duckdb_offline.connect()
con.sql("CREATE TABLE sampled AS SELECT * FROM iceberg_scan('{sampled}') WHERE service_name <> '{CLOCK_SERVICE}'")
con.sql("CREATE TABLE decisions AS SELECT * FROM iceberg_scan('{decisions}') WHERE service_name <> '{CLOCK_SERVICE}'")
one = lambda q: con.sql(q).fetchone()[0]
print(one("SELECT count(*) FROM decisions"), one("SELECT count(DISTINCT trace_id) FROM decisions"),
      one("SELECT sum(span_count) FROM decisions"), one("SELECT sum(span_count) FROM decisions WHERE sampled"),
      one("SELECT count(*) FROM sampled"), one("SELECT count(DISTINCT (trace_id, span_id)) FROM sampled"),
      one("SELECT count(*) FROM (SELECT trace_id FROM sampled EXCEPT SELECT trace_id FROM decisions WHERE sampled)"))
"#
    ));
    let [
        decided,
        distinct,
        counted,
        kept_spans,
        landed,
        landed_distinct,
        stray,
    ] = support::numbers::<u64, _>(out.trim());
    let traces = exports as u64 * REQUESTS as u64;
    assert_eq!(
        (decided, distinct),
        (traces, traces),
        "every trace decided once"
    );
    assert_eq!(counted, spans, "every span counted in its trace's decision");
    assert_eq!(
        (landed, landed_distinct, stray),
        (kept_spans, kept_spans, 0),
        "every kept trace lands whole"
    );
    assert!(kept_spans > 0);
}

/// The bytes of the files under `dir`.
fn walk(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => walk(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}
