//! The exchange end to end: the `floe` binary reading OTLP spans from a real Kafka topic
//! (four partitions), re-keying them by service through an exchange topic of three
//! partitions it creates, and landing both the raw spans and the exchanged stream, through a
//! real floe-catalog. Each scenario is run
//!
//! 1. uninterrupted,
//! 2. killed (-9) at random instants `FLOE_CHAOS_KILLS` times (default 20) while the input is
//!    produced,
//! 3. stopped, savepointed, run past the savepoint and killed, then resumed from the savepoint
//!    by a rebuilt binary (`FLOE_UPGRADE_BIN`, as in `windows.rs`),
//! 4. rescaled from one replica to three and then to two mid-stream,
//!
//! and then, read back by DuckDB, the exchanged table holds exactly the landed spans (`EXCEPT
//! ALL` both ways empty, every generated span once) — so no row was lost or doubled across
//! the exchange — and, read straight from the exchange topic, every service's rows went to one
//! partition. The killed run must also have sent rows twice (replays after kills), which the
//! reading side dropped: the dedup was exercised, not just possible.
//!
//! A 1-second window per service reads the exchange. Its table must hold one row per (window,
//! service) — no partial rows — equal to DuckDB's count of the landed spans that are not in its
//! late table, for every window the final clock (the slowest source partition's newest span)
//! closed; the late table must hold exactly the spans of the records sent 5 s back in time,
//! judged by their own source partition however the exchange interleaved them. Two SLOs read
//! the exchange too (a `select` before it adds the error column): their per-minute good and total must be DuckDB's
//! over the landed spans not in their late table; a deploy-regression operator must flag the
//! generated bad `payments` deploy by both metrics. A second exchange, by trace id, feeds a
//! service-map operator, whose edges must be DuckDB's join of spans with their parents in
//! another service, less at most the few the records sent back made late. An anomaly
//! operator scores each service's minutes (error rate and p99): each score's error rate and
//! count must be DuckDB's over the landed spans not in its late table, and its anomalies the
//! scores past the threshold. A union of two selects of the same spans (failed, slow) goes
//! through a third exchange of one partition to a 1-second window keyed by stream: its counts
//! must be DuckDB's — rows of both streams from one source partition all taken, none twice.
//! The anomaly scores, rows derived behind the first exchange, go through a second exchange
//! of one partition and must come out as exactly the scores table; the anomalies — a few
//! rows — through another, where a window must count every one: the clock behind it follows
//! the anomaly operator's progress, not its rows. The window's, the SLOs',
//! the verdicts, the edges', the anomaly scores, the union's, the second exchange's and the
//! late tables must be the same in every scenario. The alerts over all of it go to a Kafka
//! topic through a sink: read `read_committed`, the topic must hold each row of the alerts
//! table once — killed or rescaled — and at least once after a savepoint resume; the SLO
//! status goes to Prometheus, where each row must be one sample per value.
//!
//! Needs `FLOE_TEST_KAFKA_BROKERS`, `FLOE_TEST_PROMETHEUS_URL` and `FLOE_TEST_PYTHON` (from
//! `tests/services/up`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use floe_lake::rest::CatalogClient;
use floe_otlp::generate::{Deploy, Generator};
use rand::Rng;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureProducer;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

mod support;
use support::{
    anchor_writers, kills, python, service, spawn_floe, start_catalog, temp_dir, terminate,
    wait_for_another_writer,
};

const PARTITIONS: i32 = 4;
const EXCHANGE_PARTITIONS: i32 = 3;
const RECORDS: usize = 1200;
const REQUESTS: usize = 4;
const START_NS: u64 = 1_760_000_000_000_000_000;

/// Whether record `j` is sent 5 s back in the time of its partition: late for the window.
fn sent_back(j: usize) -> bool {
    j % PARTITIONS as usize == 1 && (j / PARTITIONS as usize) % 30 == 29
}

fn record(j: usize) -> (i32, Vec<u8>) {
    let mut start = START_NS + j as u64 * 200_000_000;
    if sent_back(j) {
        start -= 5_000_000_000;
    }
    let [traces, _logs] = Generator::new(j as u64, start)
        .with_deploy(Deploy {
            service: "payments".into(),
            version: "1.1.0".into(),
            at_unix_nano: START_NS + 90_000_000_000,
            error_factor: 4.0,
            latency_factor: 1.5,
        })
        .requests(REQUESTS);
    ((j % PARTITIONS as usize) as i32, traces.bytes)
}

/// What the window behind the exchange made of a scenario, as digests DuckDB computed.
#[derive(Debug, PartialEq)]
struct Windowed {
    /// (rows, digest) of the window table.
    rows: (u64, i64),
    /// (rows, digest) of its late table.
    late: (u64, i64),
    /// (rows, digest) of the SLO status table.
    slo: (u64, i64),
    /// (rows, digest) of the SLO's late table.
    slo_late: (u64, i64),
    /// (rows, digest) of the deploy verdicts.
    deploys: (u64, i64),
    /// (rows, digest) of the service edges, summed over partitions.
    edges: (u64, i64),
    /// (rows, digest) of the anomaly scores, the anomalies and the anomaly operator's late
    /// rows.
    anomalies: [(u64, i64); 3],
    /// (rows, digest) of the per-second counts of the union behind the one-partition exchange.
    notable: (u64, i64),
    /// (rows, digest) of the anomaly scores through a second, one-partition exchange.
    scores_global: (u64, i64),
    /// (rows, digest) of a window over the (sparse) anomalies through another one.
    flagged: (u64, i64),
    /// (rows, digest) of the alerts over the union of every derived stream, in one partition.
    alerts: (u64, i64),
}

struct Scenario {
    name: &'static str,
    topic: String,
    exchange_topic: String,
    trace_topic: String,
    notable_topic: String,
    scores_topic: String,
    flagged_topic: String,
    facts_topic: String,
    /// The alerts sink's topic.
    alerts_topic: String,
    /// Prometheus, and the metric prefix of this scenario's SLO series there.
    prometheus: String,
    slo_metric: String,
    dir: PathBuf,
    produced: usize,
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
        let dir = temp_dir("exchange");
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
        let topic = format!("xin-{}-{name}", self.run_id);
        support::create_topic(&self.brokers, &topic, PARTITIONS).await;
        let dir = self.dir.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        Scenario {
            name,
            exchange_topic: format!("xout-{}-{name}", self.run_id),
            trace_topic: format!("xtrace-{}-{name}", self.run_id),
            notable_topic: format!("xnotable-{}-{name}", self.run_id),
            scores_topic: format!("xscores-{}-{name}", self.run_id),
            facts_topic: format!("xfacts-{}-{name}", self.run_id),
            flagged_topic: format!("xflagged-{}-{name}", self.run_id),
            alerts_topic: format!("xalerts-{}-{name}", self.run_id),
            prometheus: service("FLOE_TEST_PROMETHEUS_URL"),
            slo_metric: format!("x{}_{name}_slo", self.run_id),
            topic,
            dir,
            produced: 0,
            ends: BTreeMap::new(),
        }
    }

    async fn produce(&self, s: &mut Scenario, upto: usize) {
        for (partition, bytes) in &self.input[s.produced..upto.min(RECORDS)] {
            let sent = support::send_to(&self.producer, &s.topic, *partition, bytes).await;
            let end = s.ends.entry(*partition).or_insert(0);
            *end = (*end).max(sent);
        }
        s.produced = upto.min(RECORDS);
    }

    async fn wait_caught_up(&self, s: &Scenario) {
        let log = s.log();
        let job = support::ExchangeJob {
            brokers: &self.brokers,
            namespace: s.name,
            job: "xjob",
            topic: &s.topic,
            ends: &s.ends,
            exchange: &s.exchange_topic,
            log: &log,
        };
        // In the order they are fed: once the input is committed whole, each next exchange's
        // ends are final too.
        for exchange in [
            &s.exchange_topic,
            &s.trace_topic,
            &s.notable_topic,
            &s.scores_topic,
            &s.flagged_topic,
            &s.facts_topic,
        ] {
            let job = support::ExchangeJob { exchange, ..job };
            support::wait_through_exchange(&self.client, &job).await;
        }
    }

    fn consumer(&self) -> BaseConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", format!("xcheck-{}", uuid::Uuid::new_v4()))
            .set("enable.auto.commit", "false")
            .create()
            .unwrap()
    }

    /// Every row of the exchange topic: (partition, service) pairs, and the row count.
    fn exchanged_rows(&self, topic: &str) -> (BTreeMap<String, BTreeSet<i32>>, usize) {
        let ends = support::topic_ends(&self.brokers, topic);
        let consumer = self.consumer();
        let mut assignment = TopicPartitionList::new();
        for p in 0..EXCHANGE_PARTITIONS {
            assignment
                .add_partition_offset(topic, p, Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&assignment).unwrap();
        let mut services: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
        let mut rows = 0;
        let mut clocks = 0;
        let mut read: BTreeMap<i32, i64> = BTreeMap::new();
        let began = Instant::now();
        while ends
            .iter()
            .any(|(p, end)| read.get(p).copied().unwrap_or(0) < *end)
        {
            assert!(began.elapsed() < Duration::from_secs(60), "reading {topic}");
            let Some(message) = consumer.poll(Duration::from_millis(500)) else {
                continue;
            };
            let message = message.unwrap();
            read.insert(message.partition(), message.offset() + 1);
            let key = std::str::from_utf8(message.key().unwrap()).unwrap();
            assert!(key.contains('/'), "the key names a source partition: {key}");
            let payload = message.payload().unwrap();
            if floe_core::exchange::decode_clock(payload).is_some() {
                clocks += 1;
                continue;
            }
            let reader =
                arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(payload), None)
                    .unwrap();
            for batch in reader {
                let batch = batch.unwrap();
                rows += batch.num_rows();
                let column = batch.column_by_name("service_name").unwrap();
                let column = arrow_cast::cast(column, &arrow_schema::DataType::Utf8).unwrap();
                for service in column.as_string::<i32>().iter().flatten() {
                    services
                        .entry(service.to_string())
                        .or_default()
                        .insert(message.partition());
                }
            }
        }
        assert!(clocks > 0, "the sources' clocks went through the topic");
        (services, rows)
    }

    async fn location(&self, namespace: &str, table: &str) -> String {
        support::metadata_location(&self.client, namespace, table).await
    }

    /// DuckDB: (spans landed, exchanged rows, spans not exchanged, exchanged rows not in the
    /// spans), as multisets without the processing-time column.
    async fn compare(&self, namespace: &str) -> [u64; 4] {
        let spans = self.location(namespace, "otel_spans").await;
        let exchanged = self.location(namespace, "by_service").await;
        let a = format!("SELECT * EXCLUDE (ingested_at) FROM iceberg_scan('{spans}')");
        let b = format!("SELECT * EXCLUDE (ingested_at, error) FROM iceberg_scan('{exchanged}')");
        let out = python(&format!(
            "import duckdb_offline\n\
             con = duckdb_offline.connect()\n\
             print(*con.sql(\"SELECT (SELECT count(*) FROM ({a})), (SELECT count(*) FROM ({b})), \
             (SELECT count(*) FROM ({a} EXCEPT ALL {b})), (SELECT count(*) FROM ({b} EXCEPT ALL {a}))\").fetchone())\n"
        ));
        support::numbers(&out)
    }

    /// [`Self::check`] and [`Self::check_window`] of a run that must equal the uninterrupted
    /// one (`windowed`); returns the rows sent through the exchange.
    async fn check_again(&self, s: &Scenario, windowed: &Windowed) -> usize {
        let sent = self.check(s).await;
        assert_eq!(
            &self.check_window(s).await,
            windowed,
            "{}: the window as uninterrupted",
            s.name
        );
        sent
    }

    /// The window behind the exchange against DuckDB's own count of the landed spans.
    async fn check_window(&self, s: &Scenario) -> Windowed {
        let spans = self.location(s.name, "otel_spans").await;
        let rollup = self.location(s.name, "per_service").await;
        let late = self.location(s.name, "per_service_late").await;
        let out = python(&format!(
            r#"import duckdb_offline
con = duckdb_offline.connect()
con.sql("CREATE TABLE spans AS SELECT * FROM iceberg_scan('{spans}')")
con.sql("CREATE TABLE late AS SELECT * FROM iceberg_scan('{late}')")
con.sql("CREATE TABLE got AS SELECT epoch_us(window_start) AS start_us, service_name, spans AS n FROM iceberg_scan('{rollup}')")
con.sql("CREATE TABLE expected AS SELECT (epoch_us(ts) // 1000000) * 1000000 AS start_us, service_name, count(*) AS n FROM spans ANTI JOIN late USING (trace_id, span_id) GROUP BY ALL")
clock = con.sql("SELECT min(m) FROM (SELECT max(epoch_us(ts)) AS m FROM spans GROUP BY kafka_partition)").fetchone()[0]
one = lambda q: con.sql(q).fetchone()[0]
print(one("SELECT count(*) FROM got"), one("SELECT count(*) FROM (SELECT DISTINCT start_us, service_name FROM got)"),
      one(f"SELECT count(*) FROM (SELECT * FROM expected WHERE start_us + 1000000 <= {{clock}} - 1000000 EXCEPT ALL SELECT * FROM got)"),
      one("SELECT count(*) FROM (SELECT * FROM got EXCEPT ALL SELECT * FROM expected)"),
      one("SELECT coalesce(sum(hash(start_us, service_name, n)), 0) FROM got"),
      one("SELECT count(*) FROM late"),
      one("SELECT coalesce(sum(hash(trace_id, span_id, late_watermark)), 0) FROM late"),
      one("SELECT count(*) FROM late ANTI JOIN spans USING (trace_id, span_id)"))
"#
        ));
        let [
            rows,
            keys,
            missing,
            extra,
            digest,
            late,
            late_digest,
            unknown,
        ] = support::numbers::<i128, _>(&out);
        assert!(rows > 0, "{}: the window emitted nothing", s.name);
        assert_eq!(rows, keys, "{}: one row per (window, service)", s.name);
        assert_eq!(
            (missing, extra),
            (0, 0),
            "{}: the window's counts are DuckDB's over the landed spans",
            s.name
        );
        let sent_back = (0..RECORDS).filter(|j| sent_back(*j)).count() * REQUESTS * 5;
        assert_eq!(
            (late, unknown),
            (sent_back as i128, 0),
            "{}: the late rows are the spans sent back in time",
            s.name
        );
        eprintln!(
            "{}: {rows} window rows, {late} late spans (of {sent_back} sent back)",
            s.name
        );
        let (slo, slo_late) = self.check_slo(s, &spans).await;
        let deploys = self.check_deploys(s).await;
        let edges = self.check_edges(s, &spans).await;
        let anomalies = self.check_anomalies(s, &spans).await;
        let notable = self.check_union(s, &spans).await;
        let scores_global = self.check_derived(s).await;
        let flagged = self.check_sparse(s).await;
        let alerts = self.check_alerts(s).await;
        Windowed {
            rows: (rows as u64, digest as i64),
            late: (late as u64, late_digest as i64),
            slo,
            slo_late,
            deploys,
            edges,
            anomalies,
            notable,
            scores_global,
            flagged,
            alerts,
        }
    }

    /// The alerts over the union of the SLO status, deploy verdicts, anomalies, scores and
    /// final edges behind a one-partition exchange: every anomaly alert fires in a minute with
    /// an anomaly of its service and measure, and resolves `keep_firing_for` after the last
    /// one of its run. Returns (rows, digest).
    async fn check_alerts(&self, s: &Scenario) -> (u64, i64) {
        let anomalies = self.location(s.name, "anomalies").await;
        let alerts = self.location(s.name, "alerts").await;
        let out = python(&format!(
            r#"import duckdb_offline
con = duckdb_offline.connect()
con.sql("CREATE TABLE a AS SELECT epoch_us(window_start) // 60000000 AS m, 'service_name=' || service_name || ',measure=' || measure AS key FROM iceberg_scan('{anomalies}')")
con.sql("CREATE TABLE got AS SELECT * FROM iceberg_scan('{alerts}')")
con.sql("CREATE TABLE fired AS SELECT epoch_us(window_start) // 60000000 AS m, key, state FROM got WHERE rule = 'anomaly'")
one = lambda q: con.sql(q).fetchone()[0]
print(one("SELECT count(*) FROM got"),
      one("SELECT count(*) FROM fired WHERE state = 'firing'"),
      one("SELECT count(*) FROM fired f WHERE state = 'firing' AND NOT EXISTS (SELECT 1 FROM a WHERE a.m = f.m AND a.key = f.key)"),
      one("SELECT count(*) FROM fired f WHERE state = 'resolved' AND NOT EXISTS (SELECT 1 FROM a WHERE a.m = f.m - 3 AND a.key = f.key)"),
      one("SELECT count(*) FROM fired f WHERE state = 'resolved' AND EXISTS (SELECT 1 FROM a WHERE a.m BETWEEN f.m - 2 AND f.m AND a.key = f.key)"),
      one("SELECT coalesce(sum(hash(got)), 0) FROM got"))
"#
        ));
        let [rows, fired, unfounded, early, held, digest] = support::numbers::<i128, _>(&out);
        assert!(fired > 0, "{}: no anomaly raised an alert", s.name);
        assert_eq!(
            (unfounded, early, held),
            (0, 0, 0),
            "{}: anomaly alerts fire on an anomaly and resolve 3 minutes after the last",
            s.name
        );
        eprintln!("{}: {rows} alert transitions", s.name);
        (rows as u64, digest as i64)
    }

    /// The alerts sink's topic against `alerts`: each row once (`exact`), or at least once (a
    /// run resumed from a savepoint delivers again what was committed after it, as Flink's
    /// Kafka sink does). Returns the records.
    async fn check_mirror(&self, s: &Scenario, exact: bool) -> u64 {
        let alerts = self.location(s.name, "alerts").await;
        let [records, rows, extra, missing] =
            support::compare_mirrored(&self.brokers, &s.alerts_topic, &alerts, "*", &s.dir);
        assert!(rows > 0, "{}: no alert transitions", s.name);
        assert_eq!(
            missing, 0,
            "{}: rows of the alerts table not in the topic",
            s.name
        );
        if exact {
            assert_eq!(
                (records, extra),
                (rows, 0),
                "{}: the alerts topic holds each transition once (log {})",
                s.name,
                s.log().display()
            );
        }
        eprintln!(
            "{}: {records} alert records in the topic, {rows} in the table",
            s.name
        );
        // The SLO series in Prometheus: one sample per value of each row (a savepoint resume
        // sends again what followed the savepoint; Prometheus holds a sample once anyway), and
        // the progress marker at the table's newest snapshot.
        let slo = self.location(s.name, "slo_status").await;
        let (rows, samples, wrong) = support::compare_prometheus(
            &s.prometheus,
            &slo,
            &s.slo_metric,
            &["slo"],
            &["total", "good", "burn_rate_1h"],
        );
        assert!(rows > 0, "{}: no SLO rows", s.name);
        assert_eq!(
            (samples, wrong),
            (3 * rows, 0),
            "{}: each SLO row is one sample per value in Prometheus",
            s.name
        );
        let (uuid, newest) =
            support::newest_sequence(&self.client, s.name, "slo_status", "xjob").await;
        assert_eq!(
            support::prometheus_progress(&s.prometheus, "xjob.slo_series", &uuid),
            newest,
            "{}: the progress marker names the SLO table's newest snapshot",
            s.name
        );
        eprintln!("{}: {samples} SLO samples in Prometheus", s.name);
        records
    }

    /// A window over the anomalies — a few rows — behind a one-partition exchange counts every
    /// one of them: the exchange's clock follows the anomaly operator's progress, not its
    /// rows, so the windows of the last anomalies fire too. Returns (rows, digest).
    async fn check_sparse(&self, s: &Scenario) -> (u64, i64) {
        let flagged = self.location(s.name, "anomalies").await;
        let counts = self.location(s.name, "flagged_1m").await;
        let out = python(&format!(
            r#"import duckdb_offline
con = duckdb_offline.connect()
con.sql("CREATE TABLE expected AS SELECT epoch_us(window_start) AS start_us, measure, count(*) AS n FROM iceberg_scan('{flagged}') GROUP BY ALL")
con.sql("CREATE TABLE got AS SELECT epoch_us(window_start) AS start_us, measure, n FROM iceberg_scan('{counts}')")
one = lambda q: con.sql(q).fetchone()[0]
print(one("SELECT count(*) FROM expected"),
      one("SELECT count(*) FROM (SELECT * FROM expected EXCEPT ALL SELECT * FROM got)"),
      one("SELECT count(*) FROM (SELECT * FROM got EXCEPT ALL SELECT * FROM expected)"),
      one("SELECT coalesce(sum(hash(start_us, measure, n)), 0) FROM got"))
"#
        ));
        let [rows, missing, extra, digest] = support::numbers::<i128, _>(&out);
        assert!(rows > 0, "{}: no anomalies to count", s.name);
        assert_eq!(
            (missing, extra),
            (0, 0),
            "{}: every anomaly counted behind the exchange, once",
            s.name
        );
        (rows as u64, digest as i64)
    }

    /// The anomaly scores — rows an operator derived behind the first exchange — through a
    /// second exchange of one partition: exactly the scores table, each row once. Returns
    /// (rows, digest).
    async fn check_derived(&self, s: &Scenario) -> (u64, i64) {
        let scores = self.location(s.name, "anomalies_scores").await;
        let global = self.location(s.name, "scores_global").await;
        let out = python(&format!(
            r#"import duckdb_offline
con = duckdb_offline.connect()
con.sql("CREATE TABLE scores AS SELECT * FROM iceberg_scan('{scores}')")
con.sql("CREATE TABLE global AS SELECT * EXCLUDE (kafka_offset, kafka_item) FROM iceberg_scan('{global}')")
one = lambda q: con.sql(q).fetchone()[0]
print(one("SELECT count(*) FROM global"),
      one("SELECT count(*) FROM (SELECT * FROM scores EXCEPT ALL SELECT * FROM global)"),
      one("SELECT count(*) FROM (SELECT * FROM global EXCEPT ALL SELECT * FROM scores)"),
      one("SELECT coalesce(sum(hash(global)), 0) FROM global"))
"#
        ));
        let [rows, missing, extra, digest] = support::numbers::<i128, _>(&out);
        assert!(
            rows > 0,
            "{}: nothing came through the second exchange",
            s.name
        );
        assert_eq!(
            (missing, extra),
            (0, 0),
            "{}: the scores through the second exchange are the scores table",
            s.name
        );
        eprintln!("{}: {rows} scores through a second exchange", s.name);
        (rows as u64, digest as i64)
    }

    /// The union of two selects of the same spans (failed ones, slow ones) through a
    /// one-partition exchange: its per-second counts per stream are DuckDB's over the landed
    /// spans not in its late table — rows of both streams from one source partition are all
    /// taken, none twice. Returns (rows, digest).
    async fn check_union(&self, s: &Scenario, spans: &str) -> (u64, i64) {
        let counts = self.location(s.name, "notable_1s").await;
        let late = self.location(s.name, "notable_1s_late").await;
        let out = python(&format!(
            r#"import duckdb_offline
con = duckdb_offline.connect()
con.sql("CREATE TABLE spans AS SELECT * FROM iceberg_scan('{spans}')")
con.sql("CREATE TABLE late AS SELECT * FROM iceberg_scan('{late}')")
con.sql("CREATE TABLE got AS SELECT epoch_us(window_start) AS start_us, stream, n FROM iceberg_scan('{counts}')")
con.sql("""CREATE TABLE rows AS
  SELECT ts, kafka_partition, trace_id, span_id, 'failed' AS stream FROM spans WHERE status_code = 'ERROR'
  UNION ALL SELECT ts, kafka_partition, trace_id, span_id, 'slow' FROM spans WHERE duration_ns > 20000000""")
con.sql("CREATE TABLE expected AS SELECT (epoch_us(ts) // 1000000) * 1000000 AS start_us, stream, count(*) AS n FROM rows ANTI JOIN late USING (trace_id, span_id, stream) GROUP BY ALL")
# Each stream of the union is a source of its own: the clock is the smallest over (partition, stream).
clock = con.sql("SELECT min(m) FROM (SELECT max(epoch_us(ts)) AS m FROM rows GROUP BY kafka_partition, stream)").fetchone()[0]
one = lambda q: con.sql(q).fetchone()[0]
print(one("SELECT count(*) FROM got"), one("SELECT count(DISTINCT stream) FROM got"),
      one(f"SELECT count(*) FROM (SELECT * FROM expected WHERE start_us + 1000000 <= {{clock}} - 1000000 EXCEPT ALL SELECT * FROM got)"),
      one("SELECT count(*) FROM (SELECT * FROM got EXCEPT ALL SELECT * FROM expected)"),
      one("SELECT coalesce(sum(hash(start_us, stream, n)), 0) FROM got"),
      one("SELECT count(*) FROM late"))
"#
        ));
        let [rows, streams, missing, extra, digest, late] = support::numbers::<i128, _>(&out);
        assert!(rows > 0, "{}: the union's window emitted nothing", s.name);
        assert_eq!(streams, 2, "{}: both streams of the union counted", s.name);
        assert_eq!(
            (missing, extra),
            (0, 0),
            "{}: the union's counts are DuckDB's over the landed spans",
            s.name
        );
        eprintln!("{}: {rows} union window rows, {late} late", s.name);
        (rows as u64, digest as i64)
    }

    /// The anomaly scores behind the exchange: each scored minute's error rate and count are
    /// DuckDB's over the landed spans not in the operator's late table; anomalies are the
    /// scores past the threshold. Returns (rows, digest) of the scores, anomalies and late
    /// tables.
    async fn check_anomalies(&self, s: &Scenario, spans: &str) -> [(u64, i64); 3] {
        let scores = self.location(s.name, "anomalies_scores").await;
        let flagged = self.location(s.name, "anomalies").await;
        let late = self.location(s.name, "anomalies_late").await;
        let out = python(&format!(
            r#"import duckdb_offline
con = duckdb_offline.connect()
con.sql("CREATE TABLE spans AS SELECT * FROM iceberg_scan('{spans}')")
con.sql("CREATE TABLE scores AS SELECT * FROM iceberg_scan('{scores}')")
con.sql("CREATE TABLE flagged AS SELECT * FROM iceberg_scan('{flagged}')")
con.sql("CREATE TABLE late AS SELECT * FROM iceberg_scan('{late}')")
con.sql("CREATE TABLE got AS SELECT epoch_us(window_start) AS start_us, service_name, observed, \"values\" FROM scores WHERE measure = 'error_rate'")
con.sql("""CREATE TABLE expected AS
  SELECT (epoch_us(ts) // 60000000) * 60000000 AS start_us, service_name,
         avg(CASE WHEN status_code = 'ERROR' THEN 1.0 ELSE 0.0 END) AS observed, count(*) AS \"values\"
  FROM spans ANTI JOIN late USING (trace_id, span_id) GROUP BY ALL""")
one = lambda q: con.sql(q).fetchone()[0]
print(one("SELECT count(*) FROM got"),
      one("SELECT count(*) FROM got ANTI JOIN expected USING (start_us, service_name, \"values\") "),
      one("SELECT count(*) FROM got JOIN expected e USING (start_us, service_name) WHERE abs(got.observed - e.observed) > 1e-9"),
      one("SELECT count(*) FROM (SELECT * EXCLUDE (direction) FROM flagged EXCEPT ALL SELECT * EXCLUDE (direction) FROM scores WHERE score >= 4)"),
      one("SELECT count(*) FROM (SELECT * EXCLUDE (direction) FROM scores WHERE score >= 4 EXCEPT ALL SELECT * EXCLUDE (direction) FROM flagged)"),
      one("SELECT count(*) FROM scores"), one("SELECT coalesce(sum(hash(scores)), 0) FROM scores"),
      one("SELECT count(*) FROM flagged"), one("SELECT coalesce(sum(hash(flagged)), 0) FROM flagged"),
      one("SELECT count(*) FROM late"), one("SELECT coalesce(sum(hash(trace_id, span_id, late_watermark)), 0) FROM late"))
"#
        ));
        let [
            error_minutes,
            unknown,
            wrong,
            extra_flags,
            missing_flags,
            rows,
            digest,
            flags,
            flags_digest,
            late,
            late_digest,
        ] = support::numbers::<i128, _>(&out);
        assert!(
            error_minutes >= 3,
            "{}: {error_minutes} error-rate scores",
            s.name
        );
        assert_eq!(
            (unknown, wrong),
            (0, 0),
            "{}: each score's error rate and count are DuckDB's over the landed spans",
            s.name
        );
        assert_eq!(
            (extra_flags, missing_flags),
            (0, 0),
            "{}: the anomalies are the scores past the threshold",
            s.name
        );
        eprintln!(
            "{}: {rows} anomaly scores, {flags} anomalies, {late} late",
            s.name
        );
        [
            (rows as u64, digest as i64),
            (flags as u64, flags_digest as i64),
            (late as u64, late_digest as i64),
        ]
    }

    /// The service map behind the exchange by trace id: every edge is one of DuckDB's join of
    /// the landed spans with their parents in another service, and all but those the records
    /// sent back made late are there. Returns (rows, digest) of the summed partial rows.
    async fn check_edges(&self, s: &Scenario, spans: &str) -> (u64, i64) {
        let edges = self.location(s.name, "edges").await;
        let out = python(&format!(
            r#"import duckdb_offline
con = duckdb_offline.connect()
con.sql("CREATE TABLE spans AS SELECT * FROM iceberg_scan('{spans}')")
con.sql("CREATE TABLE got AS SELECT epoch_us(window_start) AS start_us, caller_service, callee_service, sum(requests) AS n, sum(errors) AS e FROM iceberg_scan('{edges}') GROUP BY ALL")
con.sql("""CREATE TABLE expected AS SELECT (epoch_us(c.ts) // 60000000) * 60000000 AS start_us,
    p.service_name AS caller_service, c.service_name AS callee_service, count(*) AS n,
    count(*) FILTER (WHERE c.status_code = 'ERROR') AS e
  FROM spans c JOIN spans p ON c.trace_id = p.trace_id AND c.parent_span_id = p.span_id
  WHERE c.service_name <> p.service_name GROUP BY ALL""")
clock = con.sql("SELECT min(m) FROM (SELECT max(epoch_us(ts)) AS m FROM spans GROUP BY kafka_partition)").fetchone()[0]
one = lambda q: con.sql(q).fetchone()[0]
print(one("SELECT count(*) FROM got"),
      one("SELECT count(*) FROM got LEFT JOIN expected USING (start_us, caller_service, callee_service) WHERE expected.n IS NULL OR got.n > expected.n OR got.e > expected.e"),
      one("SELECT coalesce(sum(n), 0) FROM got"),
      one(f"SELECT coalesce(sum(n), 0) FROM expected WHERE start_us + 60000000 <= {{clock}} - 1000000"),
      one("SELECT coalesce(sum(hash(start_us, caller_service, callee_service, n, e)), 0) FROM got"))
"#
        ));
        let [rows, wrong, got, expected, digest] = support::numbers::<i128, _>(&out);
        assert!(rows > 0, "{}: no service edges", s.name);
        assert_eq!(wrong, 0, "{}: edges DuckDB's join does not have", s.name);
        // Records sent 5 s back (1 in 120) can make their edges late for a closed minute.
        let sent_back = (0..RECORDS).filter(|j| sent_back(*j)).count() * REQUESTS * 5;
        assert!(
            got >= expected - sent_back as i128,
            "{}: {got} edges of {expected} in closed minutes",
            s.name
        );
        eprintln!(
            "{}: {rows} edge rows, {got} edges ({expected} in closed minutes)",
            s.name
        );
        (rows as u64, digest as i64)
    }

    /// The deploy verdicts behind the exchange: the bad payments deploy 90 s in, flagged by
    /// both metrics. Returns (rows, digest).
    async fn check_deploys(&self, s: &Scenario) -> (u64, i64) {
        let verdicts = self.location(s.name, "deploys").await;
        let out = python(&format!(
            r#"import duckdb_offline
con = duckdb_offline.connect()
con.sql("CREATE TABLE got AS SELECT * FROM iceberg_scan('{verdicts}')")
rows = con.sql("SELECT service_name, old_version, new_version, metric, verdict FROM got ORDER BY metric").fetchall()
assert rows == [('payments', '1.0.0', '1.1.0', 'error_rate', 'regression'), ('payments', '1.0.0', '1.1.0', 'latency_p99', 'regression')], rows
print(con.sql("SELECT count(*), coalesce(sum(hash(got)), 0) FROM got").fetchone()[0:2])
"#
        ));
        let cells: Vec<i128> = out
            .trim_matches(|c| c == '(' || c == ')' || c == '\n')
            .split(", ")
            .map(|c| c.trim().parse().unwrap())
            .collect();
        (cells[0] as u64, cells[1] as i64)
    }

    /// The SLO status behind the exchange: every minute the final clock closed has, per
    /// objective, DuckDB's good and total over the landed spans not in the SLO's late table,
    /// and no other minute has requests. Returns (rows, digest) of the status and late tables.
    async fn check_slo(&self, s: &Scenario, spans: &str) -> ((u64, i64), (u64, i64)) {
        let status = self.location(s.name, "slo_status").await;
        let late = self.location(s.name, "slo_status_late").await;
        let out = python(&format!(
            r#"import duckdb_offline
con = duckdb_offline.connect()
con.sql("CREATE TABLE spans AS SELECT * FROM iceberg_scan('{spans}')")
con.sql("CREATE TABLE status AS SELECT * FROM iceberg_scan('{status}')")
con.sql("CREATE TABLE late AS SELECT * FROM iceberg_scan('{late}')")
con.sql("CREATE TABLE got AS SELECT slo, epoch_us(window_start) AS start_us, good, total FROM status WHERE total > 0")
con.sql("""CREATE TABLE expected AS
  SELECT 'frontend-availability' AS slo, (epoch_us(ts) // 60000000) * 60000000 AS start_us,
         count(*) FILTER (WHERE status_code <> 'ERROR') AS good, count(*) AS total
  FROM spans ANTI JOIN late USING (trace_id, span_id) WHERE service_name = 'frontend' GROUP BY ALL
  UNION ALL
  SELECT 'checkout-latency', (epoch_us(ts) // 60000000) * 60000000,
         count(*) FILTER (WHERE duration_ns <= 30000000), count(*)
  FROM spans ANTI JOIN late USING (trace_id, span_id)
  WHERE service_name = 'checkout' AND span_name = 'PlaceOrder' GROUP BY ALL""")
clock = con.sql("SELECT min(m) FROM (SELECT max(epoch_us(ts)) AS m FROM spans GROUP BY kafka_partition)").fetchone()[0]
one = lambda q: con.sql(q).fetchone()[0]
print(one("SELECT count(*) FROM got"), one("SELECT count(DISTINCT slo) FROM got"),
      one(f"SELECT count(*) FROM (SELECT * FROM expected WHERE start_us + 60000000 <= {{clock}} - 2000000 EXCEPT ALL SELECT * FROM got)"),
      one("SELECT count(*) FROM (SELECT * FROM got EXCEPT ALL SELECT * FROM expected)"),
      one("SELECT count(*) FROM status"), one("SELECT coalesce(sum(hash(status)), 0) FROM status"),
      one("SELECT count(*) FROM late"), one("SELECT coalesce(sum(hash(trace_id, span_id, late_watermark)), 0) FROM late"),
      one("SELECT count(*) FROM late ANTI JOIN spans USING (trace_id, span_id)"))
"#
        ));
        let [
            evaluated,
            objectives,
            missing,
            extra,
            rows,
            digest,
            late,
            late_digest,
            unknown,
        ] = support::numbers::<i128, _>(&out);
        assert!(
            evaluated >= 4,
            "{}: {evaluated} SLO minutes with requests",
            s.name
        );
        assert_eq!(objectives, 2, "{}: both objectives evaluated", s.name);
        assert_eq!(
            (missing, extra, unknown),
            (0, 0, 0),
            "{}: SLO good and total are DuckDB's over the landed spans",
            s.name
        );
        eprintln!(
            "{}: {rows} SLO status rows ({evaluated} minutes with requests), {late} late",
            s.name
        );
        (
            (rows as u64, digest as i64),
            (late as u64, late_digest as i64),
        )
    }

    /// The checks every scenario must pass; returns the rows the exchange topic holds.
    async fn check(&self, s: &Scenario) -> usize {
        let spans = (RECORDS * REQUESTS * 5) as u64;
        let [landed, exchanged, missing, extra] = self.compare(s.name).await;
        assert_eq!(landed, spans, "{}: every span landed once", s.name);
        assert_eq!(
            (exchanged, missing, extra),
            (spans, 0, 0),
            "{}: the exchanged table holds exactly the spans (log {})",
            s.name,
            s.log().display()
        );
        let (services, rows) = self.exchanged_rows(&s.exchange_topic);
        assert!(services.len() >= 3, "{services:?}");
        for (service, partitions) in &services {
            assert_eq!(
                partitions.len(),
                1,
                "{}: service {service} went to partitions {partitions:?}",
                s.name
            );
        }
        assert!(
            rows >= spans as usize,
            "{}: {rows} rows in the topic",
            s.name
        );
        eprintln!(
            "{}: {landed} spans, {rows} rows sent through the exchange, {} services in {} partitions",
            s.name,
            services.len(),
            services.values().flatten().collect::<BTreeSet<_>>().len()
        );
        rows
    }
}

impl Scenario {
    fn job(&self, brokers: &str, catalog: &str, instance: usize) -> PathBuf {
        let job = self.dir.join(format!("job-{instance}.toml"));
        std::fs::write(
            &job,
            format!(
                r#"version = 1
name = "xjob"
[source.kafka]
brokers = "{brokers}"
topics = ["{topic}"]
group_id = "floe-{topic}"
signals = {{ "{topic}" = "traces" }}
[source.kafka.properties]
"group.instance.id" = "{topic}-{instance}"
"session.timeout.ms" = "6000"
[catalog]
uri = "{catalog}"
namespace = "{namespace}"
[checkpoint]
interval = "500ms"
state_dir = "{state}"

[[operators]]
id = "requests"
kind = "select"
input = "spans"
columns = ["*", "CASE WHEN status_code = 'ERROR' THEN 1 ELSE 0 END AS error"]

[[operators]]
id = "by_service"
kind = "exchange"
input = "requests"
key = ["service_name"]
partitions = {EXCHANGE_PARTITIONS}
topic = "{exchange}"
retention = "1d"

[streams.by_service]
out_of_orderness = "1s"

[[operators]]
id = "per_service"
kind = "window"
input = "by_service"
window = {{ type = "tumbling", size = "1s" }}
key = ["service_name"]
allowed_lateness = "1s"
aggregates = {{ spans = "count()" }}

[[operators]]
id = "slo_status"
kind = "slo"
input = "by_service"
allowed_lateness = "1s"

[[operators]]
id = "deploys"
kind = "regression"
input = "by_service"
allowed_lateness = "1s"
regression = {{ baseline = "2m", after = "2m", max_wait = "3m", min_requests = 50 }}

[[operators]]
id = "anomalies"
kind = "anomaly"
input = "by_service"
key = ["service_name"]
allowed_lateness = "1s"
measures = {{ latency_p99 = "quantile(duration_ns, 0.99)", error_rate = "ratio(error)" }}
anomaly = {{ warmup = 1, direction = "up" }}

[[operators]]
id = "scores_global"
kind = "exchange"
input = "anomalies_scores"
key = ["service_name"]
partitions = 1
topic = "{scores_topic}"
retention = "1d"

[[operators]]
id = "flagged_global"
kind = "exchange"
input = "anomalies"
key = ["service_name"]
partitions = 1
topic = "{flagged_topic}"
retention = "1d"

[[operators]]
id = "flagged_1m"
kind = "window"
input = "flagged_global"
window = {{ type = "tumbling", size = "1m" }}
key = ["measure"]
aggregates = {{ n = "count()" }}

[[operators]]
id = "failed"
kind = "select"
input = "spans"
where = "status_code = 'ERROR'"
columns = ["ts", "trace_id", "span_id", "service_name", "kafka_offset", "kafka_item"]

[[operators]]
id = "slow"
kind = "select"
input = "spans"
where = "duration_ns > 20000000"
columns = ["ts", "trace_id", "span_id", "service_name", "kafka_offset", "kafka_item"]

[[operators]]
id = "notable"
kind = "union"
inputs = ["failed", "slow"]

[[operators]]
id = "notable_global"
kind = "exchange"
input = "notable"
key = ["stream"]
partitions = 1
topic = "{notable_topic}"
retention = "1d"

[streams.notable_global]
out_of_orderness = "1s"

[[operators]]
id = "notable_1s"
kind = "window"
input = "notable_global"
window = {{ type = "tumbling", size = "1s" }}
key = ["stream"]
allowed_lateness = "1s"
aggregates = {{ n = "count()" }}

[tables.failed]
land = false

[tables.slow]
land = false

[tables.notable]
land = false

[tables.notable_global]
land = false

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
partitions = {EXCHANGE_PARTITIONS}
topic = "{trace_topic}"
retention = "1d"

[streams.by_trace]
out_of_orderness = "1s"

[[operators]]
id = "edges"
kind = "edges"
input = "by_trace"
allowed_lateness = "1s"
join_window = "1m"

[tables.edge_spans]
land = false

[[operators]]
id = "facts"
kind = "union"
inputs = ["slo_status", "deploys", "anomalies", "anomalies_scores", "edges_final"]

[[operators]]
id = "facts_global"
kind = "exchange"
input = "facts"
key = ["stream"]
partitions = 1
topic = "{facts_topic}"
retention = "1d"

[[operators]]
id = "alerts"
kind = "alerts"
input = "facts_global"
alerts = {{ topology = "edges_final", health = "anomalies_scores", keep_firing_for = "2m" }}
rules = [
  {{ name = "slo", stream = "slo_status", when = "page_1h", key = ["slo"] }},
  {{ name = "deploy", stream = "deploys", when = "verdict = 'regression'", key = ["service_name", "metric"], for = "0m" }},
  {{ name = "anomaly", stream = "anomalies", key = ["service_name", "measure"], value = "score", for = "0m" }},
]

[sinks.slo_series]
kind = "prometheus"
stream = "slo_status"
url = "{prometheus}/api/v1/write"
metric = "{slo_metric}"
labels = ["slo"]
values = ["total", "good", "burn_rate_1h"]

[sinks.alerts_out]
kind = "kafka"
stream = "alerts"
topic = "{alerts_topic}"
key = "alert_id"
partitions = 3

[tables.facts]
land = false

[tables.facts_global]
land = false

[tables.by_trace]
land = false

[[slos]]
name = "frontend-availability"
service = "frontend"
objective = "availability"
target = 99
period = "1h"

[[slos]]
name = "checkout-latency"
service = "checkout"
endpoint = "PlaceOrder"
objective = "latency"
threshold = "30ms"
target = 90
period = "1h"
"#,
                topic = self.topic,
                exchange = self.exchange_topic,
                trace_topic = self.trace_topic,
                notable_topic = self.notable_topic,
                scores_topic = self.scores_topic,
                flagged_topic = self.flagged_topic,
                facts_topic = self.facts_topic,
                alerts_topic = self.alerts_topic,
                prometheus = self.prometheus,
                slo_metric = self.slo_metric,
                namespace = self.name,
                state = self.dir.join(format!("state-{instance}")).display(),
            ),
        )
        .unwrap();
        job
    }

    fn log(&self) -> PathBuf {
        self.dir.join("floe.log")
    }
}

fn kill(mut child: support::Floe) {
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn an_exchange_re_keys_every_row_exactly_once_through_kills_savepoints_and_rescales() {
    let f = Fixture::new().await;
    let (brokers, uri) = (f.brokers.clone(), f.catalog.uri());
    let spawn = |s: &Scenario, i: usize| spawn_floe(&s.job(&brokers, &uri, i), &s.log());

    // Uninterrupted.
    let mut s = f.scenario("uninterrupted").await;
    f.produce(&mut s, RECORDS).await;
    let child = spawn(&s, 0);
    f.wait_caught_up(&s).await;
    terminate(child);
    f.check(&s).await;
    let windowed = f.check_window(&s).await;
    f.check_mirror(&s, true).await;

    // Killed -9 at random instants while the input is produced.
    let mut s = f.scenario("killed").await;
    let kills = kills();
    let mut rng = rand::rng();
    let mut child = spawn(&s, 0);
    for round in 0..kills {
        // Each incarnation commits once first, then gets the rest of the round and dies at a
        // random instant, mostly while those records are being read, sent and committed.
        let before = anchor_writers(&f.client, s.name).await;
        let end = (round + 1) * RECORDS / (kills + 1);
        let half = (s.produced + end) / 2;
        f.produce(&mut s, half).await;
        wait_for_another_writer(&f.client, s.name, before, Duration::from_secs(30)).await;
        f.produce(&mut s, end).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..1_500))).await;
        kill(child);
        child = spawn(&s, 0);
    }
    f.produce(&mut s, RECORDS).await;
    f.wait_caught_up(&s).await;
    terminate(child);
    let writers = anchor_writers(&f.client, s.name).await;
    assert!(writers > kills / 3, "only {writers} incarnations committed");
    let sent = f.check_again(&s, &windowed).await;
    f.check_mirror(&s, true).await;
    assert!(
        sent > RECORDS * REQUESTS * 5,
        "kills replayed rows into the exchange ({sent} sent), which the reading side dropped"
    );

    // Stopped, savepointed, run past the savepoint and killed, then resumed from it by a
    // rebuilt binary: the exchange topic still holds what was sent after the savepoint, and
    // the replay sends it again; the reading side, back at the savepoint's marks, takes each
    // row once.
    let mut s = f.scenario("savepointed").await;
    let job = s.job(&brokers, &uri, 0);
    let job_path = job.to_str().unwrap();
    let child = spawn(&s, 0);
    f.produce(&mut s, RECORDS / 2).await;
    f.wait_caught_up(&s).await;
    terminate(child);
    let out = support::floe_command(&["savepoint", job_path, "before-upgrade"]);
    assert!(out.contains("--from-savepoint before-upgrade"), "{out}");
    let child = spawn(&s, 0);
    f.produce(&mut s, 3 * RECORDS / 4).await;
    f.wait_caught_up(&s).await;
    kill(child);
    let child = support::resume_upgraded(&job, &s.log(), "before-upgrade");
    f.produce(&mut s, RECORDS).await;
    f.wait_caught_up(&s).await;
    terminate(child);
    support::assert_went_back(&s.log());
    f.check_again(&s, &windowed).await;
    f.check_mirror(&s, false).await;

    // Rescaled 1 → 3 → 2.
    let mut s = f.scenario("rescaled").await;
    let first = spawn(&s, 0);
    f.produce(&mut s, RECORDS / 3).await;
    let began = Instant::now();
    while anchor_writers(&f.client, s.name).await < 1 {
        assert!(began.elapsed() < Duration::from_secs(120), "no commit");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (second, third) = (spawn(&s, 1), spawn(&s, 2));
    f.produce(&mut s, 2 * RECORDS / 3).await;
    let began = Instant::now();
    while anchor_writers(&f.client, s.name).await < 3 {
        assert!(
            began.elapsed() < Duration::from_secs(120),
            "not all three replicas committed; log {}",
            s.log().display()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    terminate(third);
    f.produce(&mut s, RECORDS).await;
    f.wait_caught_up(&s).await;
    terminate(first);
    terminate(second);
    f.check_again(&s, &windowed).await;
    f.check_mirror(&s, true).await;

    f.catalog.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(&f.dir);
}
