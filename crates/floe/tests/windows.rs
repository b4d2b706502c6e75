//! Stateful windows end to end: the `floe` binary reading OTLP spans from a real Kafka topic
//! (four partitions, event times out of order within the bound and some far behind it) with a
//! filter, a tumbling, a sliding and a session window and a tail sampler (errors, slow
//! traces and an event-time rate limit), committing through a real floe-catalog. Determinism is the oracle: the same input is run
//!
//! 1. uninterrupted,
//! 2. killed (-9) at random instants `FLOE_CHAOS_KILLS` times (default 20),
//! 3. rescaled from one replica to three, then to two and back to one mid-stream,
//! 4. stopped with SIGTERM, savepointed, run past the savepoint and killed, then resumed
//!    with `--from-savepoint` by a rebuilt binary: `FLOE_UPGRADE_BIN`, a second build of
//!    `floe` from these sources stamped with another `FLOE_BUILD_TAG` (`tests/run` builds
//!    it; its `--version` and its bytes must differ from the first binary's),
//! 5. killed with its local state directory deleted before every restart,
//!
//! and DuckDB must find the rollup and late tables of every run identical to the first, row
//! for row (`EXCEPT ALL` both ways empty; only the topic name in `source_partition` and the
//! processing-time lineage `ingested_at` differ by construction).
//!
//! The first run's tumbling and sliding rollups are also checked against a reference DuckDB
//! computes from the raw landed spans with the documented semantics (per-partition
//! watermark, firing, allowed lateness), quantiles within the sketch's 1 % and distinct
//! counts within HyperLogLog's error; its sessions and their late rows against a replay of
//! the documented session semantics over the same rows (Python over DuckDB's result: merging
//! sessions have no SQL form); then `floe-maintenance`'s merge task folds its closed
//! partials and the documented `GROUP BY` (crates/floe-sketch/SQL.md) gives the same answers
//! from fewer rows.
//!
//! Needs `FLOE_TEST_KAFKA_BROKERS` and `FLOE_TEST_PYTHON` (from `tests/services/up`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use floe_lake::rest::CatalogClient;
use floe_otlp::generate::Generator;
use rand::{Rng, SeedableRng};
use rdkafka::producer::FutureProducer;

mod support;
use support::{
    anchor_writers, kills, python, service, spawn_floe, start_catalog, temp_dir, terminate,
    wait_for_another_writer,
};

const PARTITIONS: i32 = 4;
/// Traces records in the input; each holds [`REQUESTS`] requests of five spans.
const RECORDS: usize = 960;
const REQUESTS: usize = 4;
const START_NS: u64 = 1_750_000_000_000_000_000;

/// The pipeline under test (appended to each scenario's job file).
const PIPELINE: &str = r#"
[streams.spans]
out_of_orderness = "2s"

[[operators]]
id = "kept"
kind = "filter"
input = "spans"
where = "span_name <> 'UPDATE stock'"

[[operators]]
id = "per_10s"
kind = "window"
input = "kept"
window = { type = "tumbling", size = "10s" }
key = ["service_name", "span_name", "status_code"]
allowed_lateness = "3s"
aggregates = { spans = "count()", total_ns = "sum(duration_ns)", fastest_ns = "min(duration_ns)", slowest_ns = "max(duration_ns)", mean_ns = "avg(duration_ns)", traces = "count_distinct(trace_id)", p50_ns = "quantile(duration_ns, 0.5)", p99_ns = "quantile(duration_ns, 0.99)" }

[[operators]]
id = "sliding"
kind = "window"
input = "kept"
window = { type = "sliding", size = "20s", slide = "5s" }
key = ["service_name"]
allowed_lateness = "2s"
aggregates = { spans = "count()", p90_ns = "quantile(duration_ns, 0.9)" }

[[operators]]
id = "sessions"
kind = "window"
input = "kept"
window = { type = "session", gap = "3s" }
key = ["service_name"]
aggregates = { spans = "count()", slowest_ns = "max(duration_ns)" }

[[operators]]
id = "sampled"
kind = "tail_sampling"
input = "spans"
sampling = { decision_wait = "2s", root_grace = "500ms", decision_ttl = "20s" }

[[operators.policies]]
name = "errors"
type = "status_code"
status_codes = ["ERROR"]

[[operators.policies]]
name = "slow"
type = "latency"
threshold = "60ms"

[[operators.policies]]
name = "budget"
type = "rate_limiting"
spans_per_second = 3

[tables.kept]
land = false
"#;

/// The tables every run must agree on.
const COMPARED: [&str; 9] = [
    "per_10s",
    "per_10s_late",
    "sliding",
    "sliding_late",
    "sessions",
    "sessions_late",
    "sampled",
    "sampled_late",
    "sampled_decisions",
];

/// Record `j` of the input: its partition and its protobuf bytes. Bursts of twelve records
/// 250 ms apart every 9 s of event time, each moved up to 1.5 s later (disorder within the
/// 2 s bound); one in seventeen 6 s behind (within the windows' lateness or just past it) and
/// one in thirteen 40 s behind (late for every window).
fn record(j: usize) -> (i32, Vec<u8>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(j as u64);
    let mut at_ms = (j / 12) as i64 * 9_000 + (j % 12) as i64 * 250 + rng.random_range(0..1_500);
    if j % 17 == 5 {
        at_ms -= 6_000;
    }
    if j % 13 == 7 {
        at_ms -= 40_000;
    }
    let start = (START_NS as i64 + at_ms * 1_000_000) as u64;
    let [traces, _logs] = Generator::new(j as u64, start).requests(REQUESTS);
    ((j % PARTITIONS as usize) as i32, traces.bytes)
}

/// One run of the job: its topic, namespace, consumer group and replicas' files.
struct Scenario {
    name: &'static str,
    topic: String,
    dir: PathBuf,
    brokers: String,
    catalog_uri: String,
    /// Records produced so far.
    produced: usize,
    /// Next offset per partition.
    ends: BTreeMap<i32, i64>,
}

struct Fixture {
    dir: PathBuf,
    brokers: String,
    run_id: String,
    catalog: floe_catalog::RunningCatalog,
    client: CatalogClient,
    producer: FutureProducer,
    input: Vec<(i32, Vec<u8>)>,
}

impl Fixture {
    async fn new() -> Self {
        let brokers = service("FLOE_TEST_KAFKA_BROKERS");
        service("FLOE_TEST_PYTHON");
        let dir = temp_dir("windows");
        let (catalog, client) = start_catalog(&dir).await;
        let producer = support::producer(&brokers);
        Self {
            dir,
            brokers,
            run_id: uuid::Uuid::new_v4().simple().to_string()[..8].to_string(),
            catalog,
            client,
            producer,
            input: (0..RECORDS).map(record).collect(),
        }
    }

    async fn scenario(&self, name: &'static str) -> Scenario {
        let topic = format!("win-{}-{name}", self.run_id);
        support::create_topic(&self.brokers, &topic, PARTITIONS).await;
        let dir = self.dir.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        Scenario {
            name,
            topic,
            dir,
            brokers: self.brokers.clone(),
            catalog_uri: self.catalog.uri(),
            produced: 0,
            ends: BTreeMap::new(),
        }
    }

    /// Produces the input up to record `upto` (exclusive) to the scenario's topic.
    async fn produce(&self, s: &mut Scenario, upto: usize) {
        for (partition, bytes) in &self.input[s.produced..upto.min(RECORDS)] {
            let sent = support::send_to(&self.producer, &s.topic, *partition, bytes).await;
            let end = s.ends.entry(*partition).or_insert(0);
            *end = (*end).max(sent);
        }
        s.produced = upto.min(RECORDS);
    }

    /// Waits until the scenario's committed positions reach the end of every partition.
    async fn wait_caught_up(&self, s: &Scenario) {
        support::wait_committed(&self.client, (s.name, "win"), &s.topic, &s.ends, &s.log()).await;
    }

    /// Waits until `writers` writers (replicas or incarnations) have committed to `s`.
    async fn wait_for_writers(&self, s: &Scenario, writers: usize) {
        let began = Instant::now();
        loop {
            let committed = anchor_writers(&self.client, s.name).await;
            if committed >= writers {
                return;
            }
            assert!(
                began.elapsed() < Duration::from_secs(120),
                "{}: only {committed} of {writers} writers committed; log: {}",
                s.name,
                s.log().display()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    async fn location(&self, namespace: &str, table: &str) -> String {
        let ident = iceberg::TableIdent::from_strs([namespace, table]).unwrap();
        self.client
            .load_table(&ident)
            .await
            .unwrap()
            .metadata_location
            .unwrap()
    }

    /// The DuckDB expression of `table` in `namespace` with what differs between runs by
    /// construction normalized away.
    async fn comparable(&self, namespace: &str, table: &str) -> String {
        let location = self.location(namespace, table).await;
        if table.ends_with("_late") || table == "sampled" {
            format!("SELECT * EXCLUDE (ingested_at, kafka_topic) FROM iceberg_scan('{location}')")
        } else {
            format!(
                "SELECT * REPLACE (regexp_replace(source_partition, '^.*/', '') AS source_partition) \
                 FROM iceberg_scan('{location}')"
            )
        }
    }

    /// Rows of every compared table of `namespace` that are not in `baseline`'s, and the
    /// other way round, as "table: a-b/b-a (rows)" where they differ.
    async fn differences(&self, baseline: &str, namespace: &str) -> Vec<String> {
        let mut queries = Vec::new();
        for table in COMPARED {
            let (a, b) = (
                self.comparable(baseline, table).await,
                self.comparable(namespace, table).await,
            );
            queries.push(format!(
                "('{table}', \"SELECT (SELECT count(*) FROM ({a} EXCEPT ALL {b})), \
                 (SELECT count(*) FROM ({b} EXCEPT ALL {a})), (SELECT count(*) FROM ({a}))\")"
            ));
        }
        let out = python(&format!(
            "import duckdb_offline\n\
             con = duckdb_offline.connect()\n\
             for name, q in [{}]:\n\
             \x20   print(name, *con.sql(q).fetchone())\n",
            queries.join(", ")
        ));
        let mut differences = Vec::new();
        for line in out.lines() {
            let cells: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(cells.len(), 4, "{line}");
            assert!(
                cells[3].parse::<u64>().unwrap() > 0 || cells[0].ends_with("_late"),
                "{baseline}.{} has rows",
                cells[0]
            );
            if cells[1] != "0" || cells[2] != "0" {
                differences.push(format!(
                    "{}: {} missing, {} extra (of {} rows)",
                    cells[0], cells[1], cells[2], cells[3]
                ));
            }
        }
        differences
    }
}

impl Scenario {
    /// The job file of replica `instance` (its static group membership and state directory).
    fn job(&self, instance: usize) -> PathBuf {
        let job = self.dir.join(format!("job-{instance}.toml"));
        std::fs::write(
            &job,
            format!(
                r#"version = 1
name = "win"
[source.kafka]
brokers = "{brokers}"
topics = ["{topic}"]
group_id = "floe-{topic}"
signals = {{ "{topic}" = "traces" }}
[source.kafka.properties]
"group.instance.id" = "{topic}-{instance}"
"session.timeout.ms" = "6000"
[catalog]
uri = "{uri}"
namespace = "{namespace}"
[checkpoint]
interval = "500ms"
state_dir = "{state}"
{PIPELINE}"#,
                brokers = self.brokers,
                topic = self.topic,
                uri = self.catalog_uri,
                namespace = self.name,
                state = self.state_dir(instance).display(),
            ),
        )
        .unwrap();
        job
    }

    fn state_dir(&self, instance: usize) -> PathBuf {
        self.dir.join(format!("state-{instance}"))
    }

    fn log(&self) -> PathBuf {
        self.dir.join("floe.log")
    }

    fn spawn(&self, instance: usize) -> support::Floe {
        spawn_floe(&self.job(instance), &self.log())
    }
}

/// How many times the replicas sharing `log` were assigned partitions so far.
fn assignments(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches("partitions assigned")
        .count()
}

fn kill(mut child: support::Floe) {
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The runs, each ending with every record committed.
async fn uninterrupted(f: &Fixture) -> Scenario {
    let mut s = f.scenario("uninterrupted").await;
    f.produce(&mut s, RECORDS).await;
    let child = s.spawn(0);
    f.wait_caught_up(&s).await;
    terminate(child);
    s
}

async fn killed(f: &Fixture) -> Scenario {
    let mut s = f.scenario("killed").await;
    let kills = kills();
    let mut rng = rand::rng();
    let mut child = s.spawn(0);
    for round in 0..kills {
        let before = anchor_writers(&f.client, s.name).await;
        f.produce(&mut s, (round + 1) * RECORDS / (kills + 1)).await;
        wait_for_another_writer(&f.client, s.name, before, Duration::from_secs(30)).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..1_500))).await;
        kill(child);
        child = s.spawn(0);
    }
    f.produce(&mut s, RECORDS).await;
    f.wait_caught_up(&s).await;
    terminate(child);
    let writers = anchor_writers(&f.client, s.name).await;
    assert!(
        writers > kills / 3,
        "the kills hit incarnations that had committed: only {writers} of {} did",
        kills + 1
    );
    eprintln!("killed: {kills} kills, {writers} incarnations committed");
    s
}

async fn rescaled(f: &Fixture) -> Scenario {
    let mut s = f.scenario("rescaled").await;
    let first = s.spawn(0);
    f.produce(&mut s, RECORDS / 3).await;
    f.wait_for_writers(&s, 1).await;
    // 1 → 3: two more members join; the group rebalances the partitions (and their state).
    // The next third is produced once the new members have partitions, and in slices: had the
    // first replica read all of it before the rebalance, the new ones would have nothing to
    // commit (on a loaded machine they joined seconds late).
    let assigned = assignments(&s.log());
    let (second, third) = (s.spawn(1), s.spawn(2));
    let began = Instant::now();
    while assignments(&s.log()) < assigned + 3 {
        assert!(
            began.elapsed() < Duration::from_secs(120),
            "rescaled: the new replicas were assigned no partitions; log: {}",
            s.log().display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for slice in 1..=8 {
        f.produce(&mut s, RECORDS / 3 + slice * RECORDS / 24).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The third replica stops only once all three have committed: how long the rebalance and
    // the first commits take depends on the machine, the point of the run does not.
    f.wait_for_writers(&s, 3).await;
    // 3 → 2: one stops; its partitions (and their state) move to the other two.
    terminate(third);
    f.produce(&mut s, 5 * RECORDS / 6).await;
    f.wait_caught_up(&s).await;
    // 2 → 1: the first replica takes every partition back.
    terminate(second);
    f.produce(&mut s, RECORDS).await;
    f.wait_caught_up(&s).await;
    terminate(first);
    s
}

async fn savepointed(f: &Fixture) -> Scenario {
    let mut s = f.scenario("savepointed").await;
    let job = s.job(0);
    let job = job.to_str().unwrap();
    let child = s.spawn(0);
    f.produce(&mut s, RECORDS / 2).await;
    f.wait_caught_up(&s).await;
    terminate(child); // the final checkpoint
    let out = support::floe_command(&["savepoint", job, "before-upgrade"]);
    assert!(out.contains("--from-savepoint before-upgrade"), "{out}");
    // Run past the savepoint, then go back to it: what came after is produced again.
    let child = s.spawn(0);
    f.produce(&mut s, 3 * RECORDS / 4).await;
    f.wait_caught_up(&s).await;
    kill(child);
    let listed = support::floe_command(&["savepoint", job, "--list"]);
    assert!(listed.contains("before-upgrade"), "{listed}");
    let child = support::resume_upgraded(Path::new(job), &s.log(), "before-upgrade");
    f.produce(&mut s, RECORDS).await;
    f.wait_caught_up(&s).await;
    terminate(child);
    support::assert_went_back(&s.log());
    // Done with it: deleted, it is listed no more (the tables keep their rows).
    let deleted = support::floe_command(&["savepoint", job, "before-upgrade", "--delete"]);
    assert!(deleted.contains("deleted"), "{deleted}");
    let listed = support::floe_command(&["savepoint", job, "--list"]);
    assert!(!listed.contains("before-upgrade"), "{listed}");
    s
}

async fn stateless_restarts(f: &Fixture) -> Scenario {
    let mut s = f.scenario("stateless").await;
    let mut rng = rand::rng();
    let rounds = 6;
    let mut child = s.spawn(0);
    for round in 0..rounds {
        f.produce(&mut s, (round + 1) * RECORDS / (rounds + 1))
            .await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(1_500..4_000))).await;
        kill(child);
        std::fs::remove_dir_all(s.state_dir(0)).unwrap_or_default();
        child = s.spawn(0);
    }
    f.produce(&mut s, RECORDS).await;
    f.wait_caught_up(&s).await;
    terminate(child);
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn windows_give_the_same_rows_through_kills_rescales_savepoints_and_lost_state() {
    let f = Fixture::new().await;
    let baseline = uninterrupted(&f).await;
    check_against_reference(&f, baseline.name).await;
    check_sampling(&f, baseline.name).await;

    let mut failures = Vec::new();
    for s in [
        killed(&f).await,
        rescaled(&f).await,
        savepointed(&f).await,
        stateless_restarts(&f).await,
    ] {
        let differences = f.differences(baseline.name, s.name).await;
        if !differences.is_empty() {
            failures.push(format!(
                "{}: {} (log: {})",
                s.name,
                differences.join("; "),
                s.log().display()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    check_merge(&f, baseline.name).await;
    f.catalog.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(&f.dir);
}

/// The tail sampler of `namespace` against the landed spans: every trace whose last span's
/// end plus the 2 s `decision_wait` the final watermark passed is decided once, on all its
/// spans (they come in one record), or sent to the late table; every kept trace whole in
/// `sampled`, each span once, with the deciding policy; every trace with an error span and
/// every trace of 60 ms or more kept; and the rate limit both keeping and refusing traces.
async fn check_sampling(f: &Fixture, namespace: &str) {
    let (spans, sampled, decisions, late) = (
        f.location(namespace, "otel_spans").await,
        f.location(namespace, "sampled").await,
        f.location(namespace, "sampled_decisions").await,
        f.location(namespace, "sampled_late").await,
    );
    let out = python(&format!(
        r#"import duckdb_offline
con = duckdb_offline.connect()
con.sql("CREATE TABLE spans AS SELECT * FROM iceberg_scan('{spans}')")
con.sql("CREATE TABLE sampled AS SELECT * FROM iceberg_scan('{sampled}')")
con.sql("CREATE TABLE decisions AS SELECT * FROM iceberg_scan('{decisions}')")
con.sql("CREATE TABLE late AS SELECT DISTINCT trace_id FROM iceberg_scan('{late}')")
con.sql('''CREATE TABLE traces AS SELECT trace_id, count(*) AS n, bool_or(status_code = 'ERROR') AS failed,
  (max(end_time_unix_nano) - min(start_time_unix_nano)) // 1000000 AS ms,
  max(end_time_unix_nano) // 1000 + 2000000 AS quiet_us, any_value(kafka_partition) AS p FROM spans GROUP BY 1''')
con.sql("CREATE TABLE final AS SELECT kafka_partition AS p, max(epoch_us(ts)) - 2000000 AS wm FROM spans GROUP BY 1")
one = lambda q: con.sql(q).fetchone()[0]
print(
  one("SELECT count(*) FROM traces"),
  one("SELECT count(*) FROM decisions"),
  one("SELECT count(*) FROM late"),
  one('''SELECT count(*) FROM traces JOIN final USING (p) WHERE quiet_us <= wm
    AND trace_id NOT IN (SELECT trace_id FROM decisions) AND trace_id NOT IN (SELECT trace_id FROM late)'''),
  one("SELECT count(*) - count(DISTINCT trace_id) FROM decisions"),
  one("SELECT count(*) FROM decisions d JOIN traces t USING (trace_id) WHERE d.span_count <> t.n"),
  one('''SELECT count(*) FROM (SELECT trace_id, span_id, sampling_policy FROM sampled
    EXCEPT ALL SELECT s.trace_id, s.span_id, d.policy FROM spans s JOIN decisions d USING (trace_id) WHERE d.sampled)'''),
  one('''SELECT count(*) FROM (SELECT s.trace_id, s.span_id, d.policy FROM spans s JOIN decisions d USING (trace_id) WHERE d.sampled
    EXCEPT ALL SELECT trace_id, span_id, sampling_policy FROM sampled)'''),
  one("SELECT count(*) FROM traces t JOIN decisions d USING (trace_id) WHERE (t.failed OR t.ms >= 60) AND NOT d.sampled"),
  one("SELECT count(*) FROM decisions WHERE policy = 'budget'"),
  one("SELECT count(*) FROM decisions WHERE NOT sampled"),
)
"#
    ));
    let [
        traces,
        decided,
        late,
        unaccounted,
        twice,
        miscounted,
        extra,
        missing,
        lost,
        budget,
        dropped,
    ] = support::numbers::<i64, _>(&out);
    eprintln!(
        "sampling: {traces} traces, {decided} decided ({budget} by the rate limit, {dropped} \
         not kept), {late} late"
    );
    assert!(decided > 0 && late > 0, "{out}");
    assert_eq!(
        (unaccounted, twice, miscounted),
        (0, 0, 0),
        "every trace due by the final watermark decided once, on all its spans, or late"
    );
    assert_eq!(
        (extra, missing),
        (0, 0),
        "the kept traces' spans, each once, with their policy"
    );
    assert_eq!(lost, 0, "a failed or slow trace was not kept");
    assert!(
        budget > 0 && dropped > 0,
        "the rate limit keeps some and refuses others"
    );
}

/// The tumbling and sliding rollups of `namespace` against DuckDB's own computation over the
/// raw landed spans, with the documented semantics: per partition, in offset order, the
/// watermark is the largest event time of the filtered rows so far minus 2 s; a row counts
/// in a window unless the watermark at its arrival was already past the window's end plus
/// the allowed lateness; a window is in the table once the partition's final watermark
/// passed its end.
async fn check_against_reference(f: &Fixture, namespace: &str) {
    let spans = f.location(namespace, "otel_spans").await;
    let tumbling = f.location(namespace, "per_10s").await;
    let sliding = f.location(namespace, "sliding").await;
    let tumbling_late = f.location(namespace, "per_10s_late").await;
    let sessions = f.location(namespace, "sessions").await;
    let sessions_late = f.location(namespace, "sessions_late").await;
    let script = format!(
        r#"import duckdb_offline
con = duckdb_offline.connect()
con.sql("""CREATE TABLE arrivals AS
  SELECT kafka_partition::VARCHAR AS p, epoch_us(ts) AS t, service_name, span_name, status_code,
         duration_ns, trace_id, kafka_offset, kafka_item,
         max(epoch_us(ts)) OVER (PARTITION BY kafka_partition ORDER BY kafka_offset, kafka_item
                                 ROWS UNBOUNDED PRECEDING) - 2000000 AS wm
  FROM iceberg_scan('{spans}') WHERE span_name <> 'UPDATE stock'""")
con.sql("CREATE TABLE final AS SELECT p, max(t) - 2000000 AS wm FROM arrivals GROUP BY p")
con.sql("""CREATE TABLE ref_tumbling AS
  SELECT a.p, w, w + 10000000 AS we, service_name, span_name, status_code,
         count(*) AS spans, sum(duration_ns) AS total_ns, min(duration_ns) AS fastest_ns,
         max(duration_ns) AS slowest_ns, avg(duration_ns) AS mean_ns,
         count(DISTINCT trace_id) AS traces, list_sort(list(duration_ns)) AS d
  FROM (SELECT *, t // 10000000 * 10000000 AS w FROM arrivals) a
  WHERE wm < w + 10000000 + 3000000
  GROUP BY ALL""")
con.sql("""CREATE TABLE got_tumbling AS
  SELECT regexp_replace(source_partition, '^.*/', '') AS p, epoch_us(window_start) AS w,
         epoch_us(window_end) AS we, service_name, span_name, status_code, spans, total_ns,
         fastest_ns, slowest_ns, mean_ns, traces, p50_ns, p99_ns
  FROM iceberg_scan('{tumbling}')""")
keys = "p, w, we, service_name, span_name, status_code"
exact = keys + ", spans, total_ns, fastest_ns, slowest_ns"
fired = "SELECT r.* FROM ref_tumbling r JOIN final f USING (p) WHERE r.we <= f.wm"
def one(q): return con.sql(q).fetchone()
print("tumbling_rows", one("SELECT count(*) FROM got_tumbling")[0])
print("tumbling_missing", one(f"SELECT count(*) FROM (SELECT {{exact}} FROM ({{fired}}) EXCEPT SELECT {{exact}} FROM got_tumbling)")[0])
print("tumbling_extra", one(f"SELECT count(*) FROM (SELECT {{exact}} FROM got_tumbling EXCEPT SELECT {{exact}} FROM ({{fired}}))")[0])
j = f"FROM got_tumbling g JOIN ({{fired}}) r USING ({{keys}})"
print("mean_off", one(f"SELECT count(*) {{j}} WHERE abs(g.mean_ns - r.mean_ns) > 1e-6 * r.mean_ns")[0])
# The sketch's quantile is the value at rank floor(q * (n - 1)), within 1 %.
print("p50_off", one(f"SELECT count(*) {{j}} WHERE abs(g.p50_ns - r.d[floor(0.5 * (len(r.d) - 1))::INT + 1]) > 0.0100001 * r.d[floor(0.5 * (len(r.d) - 1))::INT + 1]")[0])
print("p99_off", one(f"SELECT count(*) {{j}} WHERE abs(g.p99_ns - r.d[floor(0.99 * (len(r.d) - 1))::INT + 1]) > 0.0100001 * r.d[floor(0.99 * (len(r.d) - 1))::INT + 1]")[0])
print("traces_off", one(f"SELECT count(*) {{j}} WHERE abs(g.traces - r.traces) > greatest(1, 0.03 * r.traces)")[0])
print("traces_exact", one(f"SELECT count(*) {{j}} WHERE g.traces = r.traces")[0])
print("late_rows", one("SELECT count(*) FROM iceberg_scan('{tumbling_late}')")[0])
# A row is late for the tumbling window exactly when the reference left it out.
print("late_mismatch", one("""SELECT count(*) FROM (
  (SELECT p, kafka_offset, kafka_item FROM arrivals WHERE wm >= t // 10000000 * 10000000 + 13000000
   EXCEPT ALL SELECT kafka_partition::VARCHAR, kafka_offset, kafka_item FROM iceberg_scan('{tumbling_late}'))
  UNION ALL
  (SELECT kafka_partition::VARCHAR, kafka_offset, kafka_item FROM iceberg_scan('{tumbling_late}')
   EXCEPT ALL SELECT p, kafka_offset, kafka_item FROM arrivals WHERE wm >= t // 10000000 * 10000000 + 13000000))""")[0])
# Sliding windows of 20 s every 5 s, lateness 2 s: a row is in the four windows that hold it.
con.sql("""CREATE TABLE ref_sliding AS
  SELECT a.p, w, w + 20000000 AS we, service_name, count(*) AS spans
  FROM (SELECT *, t // 5000000 * 5000000 - k * 5000000 AS w
        FROM arrivals, (SELECT unnest(range(4)) AS k)) a
  WHERE wm < w + 20000000 + 2000000
  GROUP BY ALL""")
sfired = "SELECT r.p, r.w, r.we, r.service_name, r.spans FROM ref_sliding r JOIN final f USING (p) WHERE r.we <= f.wm"
sgot = "SELECT regexp_replace(source_partition, '^.*/', ''), epoch_us(window_start), epoch_us(window_end), service_name, spans FROM iceberg_scan('{sliding}')"
print("sliding_rows", one(f"SELECT count(*) FROM ({{sgot}})")[0])
print("sliding_missing", one(f"SELECT count(*) FROM ({{sfired}} EXCEPT {{sgot}})")[0])
print("sliding_extra", one(f"SELECT count(*) FROM ({{sgot}} EXCEPT {{sfired}})")[0])
# Sessions (gap 3 s, no lateness) have no SQL form: replay the documented semantics over the
# arrivals in order, per partition. A row's watermark is its partition's before it; a row
# whose merged session already ended at that watermark is late; touching sessions merge; a
# session fires once the watermark reaches its end and is then purged.
GAP = 3000000
table, late = {{}}, set()
rows = con.sql("""SELECT p, t, service_name, duration_ns, kafka_offset, kafka_item FROM arrivals
                  ORDER BY p, kafka_offset, kafka_item""").fetchall()
by_partition = {{}}
for r in rows:
    by_partition.setdefault(r[0], []).append(r)
for p, arrivals in by_partition.items():
    open_, maxt = {{}}, None
    for _, t, key, d, off, item in arrivals:
        wm = None if maxt is None else maxt - 2000000
        mine = open_.setdefault(key, [])
        m = [t, t + GAP, 1, d]
        absorbed = [x for x in mine if x[0] <= m[1] and m[0] <= x[1]]
        for x in absorbed:
            m = [min(m[0], x[0]), max(m[1], x[1]), m[2] + x[2], max(m[3], x[3])]
        if wm is not None and m[1] <= wm:
            late.add((p, off, item))
        else:
            open_[key] = [x for x in mine if x not in absorbed] + [m]
        maxt = t if maxt is None else max(maxt, t)
        wm = maxt - 2000000
        for k, sessions in open_.items():
            for x in [x for x in sessions if x[1] <= wm]:
                table[(p, x[0], x[1], k)] = (x[2], x[3])
            open_[k] = [x for x in sessions if x[1] > wm]
got = con.sql("""SELECT regexp_replace(source_partition, '^.*/', ''), epoch_us(window_start),
                        epoch_us(window_end), service_name, spans, slowest_ns
                 FROM iceberg_scan('{sessions}')""").fetchall()
print("session_rows", len(got))
print("session_duplicates", len(got) - len({{r[:4] for r in got}}))
got = {{(r[0], r[1], r[2], r[3]): (r[4], r[5]) for r in got}}
print("session_mismatch", len(set(got.items()) ^ set(table.items())))
got_late = con.sql("""SELECT kafka_partition::VARCHAR, kafka_offset, kafka_item
                      FROM iceberg_scan('{sessions_late}')""").fetchall()
print("session_late_rows", len(got_late))
print("session_late_mismatch", len(set(got_late) ^ late))
"#
    );
    let out = python(&script);
    let n: BTreeMap<&str, u64> = out
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k, v.trim().parse().unwrap())
        })
        .collect();
    eprintln!("reference: {n:?}");
    assert!(n["tumbling_rows"] > 500, "{n:?}");
    assert!(n["sliding_rows"] > 500, "{n:?}");
    assert!(n["late_rows"] > 50, "the input has late rows: {n:?}");
    assert!(n["session_rows"] > 100, "{n:?}");
    assert!(
        n["session_late_rows"] > 10,
        "sessions refused late rows: {n:?}"
    );
    for zero in [
        "tumbling_missing",
        "tumbling_extra",
        "mean_off",
        "p50_off",
        "p99_off",
        "traces_off",
        "late_mismatch",
        "sliding_missing",
        "sliding_extra",
        "session_duplicates",
        "session_mismatch",
        "session_late_mismatch",
    ] {
        assert_eq!(n[zero], 0, "{zero}: {n:?}");
    }
    assert!(
        n["traces_exact"] * 10 >= n["tumbling_rows"] * 9,
        "small distinct counts are (almost always) exact: {n:?}"
    );
}

/// The documented merge (crates/floe-sketch/SQL.md's DuckDB query, over the tumbling rollup's
/// sketches) and the plain `GROUP BY` of counts, sums and extremes give the same answers
/// before and after floe-maintenance merged the closed partials, from fewer rows.
async fn check_merge(f: &Fixture, namespace: &str) {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../floe-sketch/SQL.md"),
    )
    .unwrap();
    let merge_sql = doc
        .split("```sql\n-- test: duckdb\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("SQL.md has the DuckDB merge query");
    let answers = |location: String| {
        let script = format!(
            r#"import duckdb_offline, hashlib
con = duckdb_offline.connect()
con.sql("""CREATE VIEW partials AS
  SELECT concat_ws('|', window_start, service_name, span_name, status_code) AS g,
         traces_hll AS hll, p99_ns_sketch AS qs
  FROM iceberg_scan('{location}')""")
merged = con.sql('''{merge_sql}''').order("g").fetchall()
plain = con.sql("""SELECT window_start, service_name, span_name, status_code, sum(spans),
  sum(total_ns), min(fastest_ns), max(slowest_ns), sum(total_ns) / sum(spans)
  FROM iceberg_scan('{location}') GROUP BY ALL ORDER BY ALL""").fetchall()
print(con.sql("SELECT count(*) FROM partials").fetchone()[0], len(plain),
      hashlib.sha256(repr((merged, plain)).encode()).hexdigest())
"#
        );
        let out = python(&script);
        let cells: Vec<String> = out.split_whitespace().map(str::to_string).collect();
        (
            cells[0].parse::<u64>().unwrap(),
            cells[1].parse::<u64>().unwrap(),
            cells[2].clone(),
        )
    };
    let before = answers(f.location(namespace, "per_10s").await);
    let ident = iceberg::TableIdent::from_strs([namespace, "per_10s"]).unwrap();
    let report = floe_maintenance::tasks::run_task(
        &f.client,
        &ident,
        None,
        floe_maintenance::tasks::Task::Merge,
        false,
        &|_| {},
    )
    .await
    .unwrap();
    eprintln!("{}", report.summary);
    let after = answers(f.location(namespace, "per_10s").await);
    assert_eq!(before.2, after.2, "the documented queries answer the same");
    assert_eq!(before.1, after.1, "the same groups");
    assert!(
        after.0 < before.0 && after.0 >= after.1,
        "partials merged: {} rows before, {} after, {} groups",
        before.0,
        after.0,
        after.1
    );
}
