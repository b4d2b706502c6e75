//! The OTLP job against a real Kafka broker and a real floe-catalog, with the `floe` binary
//! killed (-9) at random instants while records are produced; afterwards DuckDB must read
//! every produced span and log record exactly once, and every bad record in the dead-letter
//! table — with the job's local state directory deleted at every other restart. The same with
//! two replicas of the job in one consumer group, one of them killed and
//! restarted (rebalances both ways). And with floe-maintenance compacting and expiring every
//! table of the job (the dead-letter anchor included) while it commits, the job killed right
//! after each expiry.
//!
//! Needs `FLOE_TEST_KAFKA_BROKERS` and `FLOE_TEST_PYTHON` (from `tests/services/up`): the
//! tests are ignored without `--include-ignored`, which `tests/run` passes. `FLOE_CHAOS_KILLS` sets the number of kills
//! (default 20).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use floe_core::position_of;
use floe_lake::rest::CatalogClient;
use floe_otlp::generate::{Generator, string_attribute as kv};
use floe_otlp::{Decoded, Signal, decode};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, TracesData};
use prost::Message as _;
use rand::Rng;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

mod support;
use support::{
    OtlpKafkaJob, anchor_writers, committed, kills, python, service, spawn_floe, start_catalog,
    temp_dir, terminate, wait_for_another_writer,
};

struct Produced {
    spans: u64,
    logs: u64,
    bad: u64,
    /// Spans with repeated attribute keys.
    duplicate_spans: u64,
    /// Records sent.
    records: u64,
    /// Next offset per "topic/partition".
    ends: std::collections::BTreeMap<String, i64>,
}

/// Produces one record. Every other one carries what the Collector's exporter may add — a
/// trace-id key (`partition_traces_by_id`) and a header (`record_headers`) — which Floe must
/// neither need nor mind.
async fn produce(
    producer: &FutureProducer,
    topic: &str,
    partition: i32,
    payload: &[u8],
    produced: &mut Produced,
) {
    let mut record = FutureRecord::<str, [u8]>::to(topic)
        .partition(partition)
        .payload(payload);
    produced.records += 1;
    if produced.records.is_multiple_of(2) {
        record =
            record
                .key("5b8efff798038103d269b633813fc60c")
                .headers(OwnedHeaders::new().insert(Header {
                    key: "source",
                    value: Some("collector"),
                }));
    }
    let delivery = producer
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    let end = produced
        .ends
        .entry(format!("{topic}/{}", delivery.partition))
        .or_insert(0);
    *end = (*end).max(delivery.offset + 1);
}

/// One span whose span and resource attributes repeat keys, which protobuf and JSON let a
/// producer send: Floe keeps the last value of each.
fn duplicate_keys_span(round: u64) -> TracesData {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut trace_id = vec![0xd0; 16];
    trace_id[..8].copy_from_slice(&round.to_be_bytes());
    let span_id = (0xd1u64 << 56 | round).to_be_bytes().to_vec();
    TracesData {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", "duplicates"),
                    kv("host.name", "first"),
                    kv("host.name", "last"),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: vec![Span {
                    trace_id,
                    span_id,
                    name: "duplicate-keys".into(),
                    start_time_unix_nano: now,
                    end_time_unix_nano: now + 1_000,
                    attributes: vec![
                        kv("dup.key", "first"),
                        kv("http.request.method", "GET"),
                        kv("dup.key", "middle"),
                        kv("dup.key", "last"),
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// Produces a mix of protobuf, JSON and bad records; returns what it produced.
async fn produce_round(
    producer: &FutureProducer,
    topics: &(String, String),
    generator: &mut Generator,
    round: u64,
    produced: &mut Produced,
) {
    let mut rng = rand::rng();
    for _ in 0..5 {
        let [traces, logs] = generator.requests(20);
        let partition = rng.random_range(0..3);
        // Every other record as OTLP JSON, the Collector's otlp_json encoding.
        let traces_bytes = if round.is_multiple_of(2) {
            let Decoded::Traces(data) = decode(Signal::Traces, &traces.bytes).unwrap() else {
                unreachable!()
            };
            serde_json::to_vec(&data).unwrap()
        } else {
            traces.bytes
        };
        produce(producer, &topics.0, partition, &traces_bytes, produced).await;
        produce(producer, &topics.1, partition, &logs.bytes, produced).await;
        produced.spans += traces.items as u64;
        produced.logs += logs.items as u64;
    }
    // A span with repeated attribute keys, as protobuf and as JSON in turn.
    let duplicates = duplicate_keys_span(round);
    let bytes = if round.is_multiple_of(2) {
        duplicates.encode_to_vec()
    } else {
        serde_json::to_vec(&duplicates).unwrap()
    };
    produce(producer, &topics.0, (round % 3) as i32, &bytes, produced).await;
    produced.spans += 1;
    produced.duplicate_spans += 1;
    // Bad input: random bytes, truncated protobuf, JSON with wrong types.
    let [traces, _] = generator.requests(2);
    let mut junk: Vec<u8> = (0..64).map(|_| rng.random::<u8>()).collect();
    junk[0] = 0x0f; // field 1 with wire type 7: never valid protobuf
    let bad: [Vec<u8>; 3] = [
        junk,
        traces.bytes[..10].to_vec(), // cut inside the first ResourceSpans
        br#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"name":5,"kind":"x"}]}]}]}"#.to_vec(),
    ];
    let which = (round % 3) as usize;
    produce(
        producer,
        &topics.0,
        (round % 3) as i32,
        &bad[which],
        produced,
    )
    .await;
    produced.bad += 1;
}

/// A catalog, two fresh topics (3 partitions each), a producer and job files.
struct Fixture {
    dir: PathBuf,
    brokers: String,
    catalog: floe_catalog::RunningCatalog,
    client: CatalogClient,
    topics: (String, String),
    producer: FutureProducer,
    generator: Generator,
    produced: Produced,
    run_id: String,
}

impl Fixture {
    async fn new(tag: &str) -> Self {
        let brokers = service("FLOE_TEST_KAFKA_BROKERS");
        service("FLOE_TEST_PYTHON");
        let dir = temp_dir(tag);
        let (catalog, client) = start_catalog(&dir).await;
        let run_id = uuid::Uuid::new_v4().simple().to_string();
        let topics = (format!("spans_{run_id}"), format!("logs_{run_id}"));
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .unwrap();
        let new_topics = [
            NewTopic::new(&topics.0, 3, TopicReplication::Fixed(1)),
            NewTopic::new(&topics.1, 3, TopicReplication::Fixed(1)),
        ];
        for result in admin
            .create_topics(&new_topics, &AdminOptions::new())
            .await
            .unwrap()
        {
            result.unwrap();
        }
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("linger.ms", "5")
            .create()
            .unwrap();
        Self {
            dir,
            brokers,
            catalog,
            client,
            topics,
            producer,
            generator: Generator::new(11, 1_700_000_000_000_000_000),
            produced: Produced {
                spans: 0,
                logs: 0,
                bad: 0,
                duplicate_spans: 0,
                records: 0,
                ends: Default::default(),
            },
            run_id,
        }
    }

    /// A job file for one replica (`instance` becomes its static group membership).
    fn job(&self, instance: &str) -> PathBuf {
        OtlpKafkaJob {
            name: "chaos",
            brokers: &self.brokers,
            topics: vec![
                (self.topics.0.clone(), "traces"),
                (self.topics.1.clone(), "logs"),
            ],
            run: &self.run_id,
            catalog: &self.catalog.uri(),
            namespace: "chaos",
            instance: Some(instance),
            state_dir: self.dir.join(format!("state-{instance}")),
        }
        .write(&self.dir.join(format!("job-{instance}.toml")))
    }

    fn log(&self) -> PathBuf {
        self.dir.join("floe.log")
    }

    async fn produce_round(&mut self, round: u64) {
        produce_round(
            &self.producer,
            &self.topics,
            &mut self.generator,
            round,
            &mut self.produced,
        )
        .await;
    }

    /// Waits until the anchor's committed positions reach the end of every partition.
    async fn wait_caught_up(&self) {
        let began = Instant::now();
        loop {
            let positions = committed(&self.client, "chaos", "chaos").await;
            let caught_up = self.produced.ends.iter().all(|(key, end)| {
                let (topic, partition) = key.rsplit_once('/').unwrap();
                position_of(&positions, topic, partition.parse().unwrap()) == Some(*end)
            });
            if caught_up {
                return;
            }
            assert!(
                began.elapsed() < Duration::from_secs(120),
                "the job did not catch up: {positions:?} vs {:?}; log: {}",
                self.produced.ends,
                self.log().display()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// Checks with DuckDB that every span and log record landed exactly once and every bad
    /// record was dead-lettered once; returns how many writers committed.
    async fn verify(&self) -> usize {
        let location =
            async |name: &str| support::metadata_location(&self.client, "chaos", name).await;
        let writers = anchor_writers(&self.client, "chaos").await;
        let spans = location("otel_spans").await;
        let logs = location("otel_logs").await;
        let dead = location("floe_dead_letters").await;
        let out = python(&format!(
            "import duckdb_offline\n\
             con = duckdb_offline.connect()\n\
             def one(q): return con.sql(q).fetchone()\n\
             s = one(\"SELECT count(*), count(DISTINCT (kafka_topic, kafka_partition, kafka_offset, kafka_item)), count(DISTINCT span_id) FROM iceberg_scan('{spans}')\")\n\
             l = one(\"SELECT count(*), count(DISTINCT (kafka_topic, kafka_partition, kafka_offset, kafka_item)) FROM iceberg_scan('{logs}')\")\n\
             d = one(\"SELECT count(*), count(DISTINCT (kafka_partition, kafka_offset)), min(length(error)) FROM iceberg_scan('{dead}')\")\n\
             v = one(\"SELECT count(*) FROM iceberg_scan('{spans}') WHERE length(trace_id) = 32 AND length(span_id) = 16 AND service_name IS NOT NULL AND span_attributes['http.request.method'] IN ('GET', 'POST') AND ts IS NOT NULL\")\n\
             u = one(\"SELECT count(*), count(*) FILTER (WHERE span_attributes['dup.key'] = 'last' AND cardinality(span_attributes) = 2 AND resource_attributes['host.name'] = 'last') FROM iceberg_scan('{spans}') WHERE span_name = 'duplicate-keys'\")\n\
             whole = con.sql(\"SELECT span_attributes, resource_attributes FROM iceberg_scan('{spans}') WHERE span_name = 'duplicate-keys'\").fetchall()\n\
             assert all(a == {{'dup.key': 'last', 'http.request.method': 'GET'}} and r['host.name'] == 'last' for a, r in whole), whole[:3]\n\
             print(*s, *l, *d, *v, *u)"
        ));
        let n: Vec<u64> = out.split_whitespace().map(|v| v.parse().unwrap()).collect();
        let produced = &self.produced;
        assert_eq!(n[0], produced.spans, "every span exactly once");
        assert_eq!(n[1], produced.spans);
        assert_eq!(n[2], produced.spans, "span ids survive JSON and protobuf");
        assert_eq!(n[3], produced.logs, "every log record exactly once");
        assert_eq!(n[4], produced.logs);
        assert_eq!(n[5], produced.bad, "every bad record dead-lettered once");
        assert_eq!(n[6], produced.bad);
        assert!(n[7] > 10, "dead letters say why");
        assert_eq!(n[8], produced.spans, "sampled values are well-formed");
        assert_eq!(
            n[9], produced.duplicate_spans,
            "spans with repeated keys land"
        );
        assert_eq!(
            n[10], produced.duplicate_spans,
            "each repeated key keeps its last value, once"
        );
        writers
    }

    async fn finish(self) {
        self.catalog.stop().await.unwrap();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The three chaos tests run one at a time: each checks that killed jobs had time to commit,
/// which two others killing jobs on the same two cores can starve.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn otlp_from_kafka_lands_exactly_once_through_kill_9() {
    let _one_at_a_time = SERIAL.lock().await;
    let mut f = Fixture::new("otlp-kafka").await;
    let kills = kills();
    let job = f.job("0");
    let mut child = spawn_floe(&job, &f.log());
    let mut rng = rand::rng();
    for round in 0..kills as u64 {
        let before = anchor_writers(&f.client, "chaos").await;
        f.produce_round(round).await;
        wait_for_another_writer(&f.client, "chaos", before, Duration::from_secs(30)).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..1500))).await;
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Losing the local state directory loses and duplicates nothing either.
        if round % 2 == 0 {
            let _ = std::fs::remove_dir_all(f.dir.join("state-0"));
        }
        child = spawn_floe(&job, &f.log());
    }
    f.produce_round(kills as u64).await;
    f.wait_caught_up().await;
    terminate(child);
    let writers = f.verify().await;
    // The kills hit incarnations that had committed: many writers left snapshots.
    assert!(
        writers > kills / 3,
        "only {writers} of {} incarnations committed",
        kills + 1
    );
    eprintln!(
        "chaos: {kills} kills, {writers} incarnations committed, {} spans, {} logs, {} dead letters — exactly once",
        f.produced.spans, f.produced.logs, f.produced.bad
    );
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn two_replicas_share_the_partitions_and_survive_a_kill() {
    let _one_at_a_time = SERIAL.lock().await;
    let mut f = Fixture::new("otlp-replicas").await;
    let rounds = (kills() / 2).max(4);
    let (job_a, job_b) = (f.job("a"), f.job("b"));
    let a = spawn_floe(&job_a, &f.log());
    let mut b = spawn_floe(&job_b, &f.log());
    let mut rng = rand::rng();
    for round in 0..rounds as u64 {
        f.produce_round(round).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(500..3000))).await;
        if round % 2 == 1 {
            // Replica b dies; a takes over its partitions once the session times out, then
            // b comes back and the group rebalances again.
            b.kill().unwrap();
            b.wait().unwrap();
            f.produce_round(round + 1000).await;
            tokio::time::sleep(Duration::from_millis(rng.random_range(6500..8000))).await;
            b = spawn_floe(&job_b, &f.log());
        }
    }
    // b's last incarnation may still be joining the group on a busy machine: feed both
    // replicas until one of b's restarts has committed too (every check holds each time).
    let mut writers = 0;
    for extra in 0..5 {
        f.produce_round(rounds as u64 + extra).await;
        f.wait_caught_up().await;
        writers = f.verify().await;
        if writers >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    terminate(a);
    terminate(b);
    assert!(
        writers >= 3,
        "both replicas and b's restarts committed ({writers} writers)"
    );
    eprintln!(
        "replicas: {rounds} rounds, {writers} writers committed, {} spans, {} logs — exactly once",
        f.produced.spans, f.produced.logs
    );
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn compaction_and_expiry_while_the_job_commits_and_dies_lose_nothing() {
    let _one_at_a_time = SERIAL.lock().await;
    let mut f = Fixture::new("otlp-maintenance").await;
    // Expire everything but the newest snapshot (and what recovery needs), compact anything.
    let config = floe_maintenance::config::MaintenanceConfig::from_toml(
        None,
        &format!(
            "version = 1\n[catalog]\nuri = \"{}\"\n[[policy]]\ntables = \"chaos.*\"\n\
             [policy.compact]\nschedule = \"* * * * * *\"\nmin_input_files = 2\n\
             [policy.expire]\nschedule = \"* * * * * *\"\nolder_than = \"1ms\"\nretain_last = 1\n",
            f.catalog.uri()
        ),
    )
    .unwrap();
    let rounds = (kills() / 3).max(5);
    let job = f.job("0");
    let mut child = spawn_floe(&job, &f.log());
    let mut rng = rand::rng();
    let (mut compacted, mut expired) = (0, 0);
    // Every round first lets the job commit what it was given (so the tables always hold
    // small files and old snapshots to work on — a restarted consumer may take longer than
    // any fixed sleep to rejoin), then hands it a new round and runs maintenance while the
    // job is committing that one.
    f.produce_round(0).await;
    for round in 1..=rounds as u64 {
        f.wait_caught_up().await;
        f.produce_round(round).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..1500))).await;
        for table in ["otel_spans", "otel_logs", "floe_dead_letters"] {
            let ident = iceberg::TableIdent::from_strs(["chaos", table]).unwrap();
            let policy = config.policy_for(&format!("chaos.{table}"));
            for task in [
                floe_maintenance::tasks::Task::Compact,
                floe_maintenance::tasks::Task::Expire,
            ] {
                let report = floe_maintenance::tasks::run_task(
                    &f.client,
                    &ident,
                    policy,
                    task,
                    false,
                    &|_| {},
                )
                .await
                .unwrap();
                compacted += report.files_rewritten;
                expired += report.snapshots_expired;
            }
        }
        // Right after the expiry: recovery must still find the job's positions.
        child.kill().unwrap();
        child.wait().unwrap();
        child = spawn_floe(&job, &f.log());
    }
    f.produce_round(rounds as u64 + 1).await;
    f.wait_caught_up().await;
    terminate(child);
    f.verify().await;
    assert!(
        compacted > 0 && expired > 0,
        "{compacted} files compacted, {expired} snapshots expired"
    );
    eprintln!(
        "maintenance: {rounds} kills after expiry, {compacted} files compacted, {expired} snapshots expired, {} spans — exactly once",
        f.produced.spans
    );
    f.finish().await;
}
