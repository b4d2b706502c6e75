//! The shipped job files as a user runs them, several replicas on one host: two replicas of
//! `jobs/otlp.toml` and two of the stateful `jobs/otlp-rollups.toml` (metrics on
//! `FLOE_METRICS_LISTEN=127.0.0.1:0`, one free port each), the latter sharing one
//! `FLOE_STATE_DIR` (each claims its own RocksDB directory in it), each job with its own catalog, fed OTLP spans on the Collector's
//! topic names. Every replica commits, the spans land exactly once (DuckDB counts them), and
//! the replicas' metrics ports and state directories differ.
//!
//! Needs `FLOE_TEST_KAFKA_BROKERS` and `FLOE_TEST_PYTHON` (from `tests/services/up`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use floe_core::position_of;
use floe_otlp::generate::Generator;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::FutureProducer;

mod support;
use support::{
    anchor_writers, committed, python, service, spawn_floe_with, start_catalog, temp_dir, terminate,
};

const PARTITIONS: i32 = 4;
const TOPICS: [&str; 3] = ["otlp_spans", "otlp_logs", "otlp_metrics"];

/// A shipped job file by name.
fn shipped(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../jobs")
        .join(name)
}

/// Fresh Collector-named topics (earlier runs on the same broker left theirs).
async fn fresh_topics(brokers: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let _ = admin.delete_topics(&TOPICS, &AdminOptions::new()).await;
    let began = Instant::now();
    loop {
        let topics: Vec<NewTopic> = TOPICS
            .iter()
            .map(|t| NewTopic::new(t, PARTITIONS, TopicReplication::Fixed(1)))
            .collect();
        let created = admin
            .create_topics(&topics, &AdminOptions::new())
            .await
            .unwrap();
        if created.iter().all(|r| r.is_ok()) {
            return;
        }
        // A deletion finishes in the background; try again until the names are free.
        assert!(began.elapsed() < Duration::from_secs(60), "{created:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Log lines of `log` carrying `message`, each reduced to the value of `field`.
fn logged(log: &Path, message: &str, field: &str) -> BTreeSet<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(message))
        .filter_map(|l| {
            let start = l.find(&format!("{field}="))? + field.len() + 1;
            Some(l[start..].split_whitespace().next()?.to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn shipped_job_files_run_as_replicas_on_one_host() {
    let brokers = service("FLOE_TEST_KAFKA_BROKERS");
    service("FLOE_TEST_PYTHON");
    fresh_topics(&brokers).await;
    let dir = temp_dir("shipped");
    let jobs = [("otlp.toml", "otlp"), ("otlp-rollups.toml", "otlp-rollups")];
    let mut catalogs = Vec::new();
    let mut children = Vec::new();
    for (file, name) in jobs {
        let (catalog, client) = start_catalog(&dir.join(name)).await;
        let log = dir.join(format!("{name}.log"));
        let state = dir.join(format!("{name}-state"));
        let uri = catalog.uri();
        let env = [
            ("KAFKA_BROKERS", brokers.as_str()),
            ("KAFKA_SESSION_TIMEOUT_MS", "6000"),
            ("FLOE_CATALOG_URI", uri.as_str()),
            // Shared by the job's replicas, as the default `.floe/<job>` would be.
            ("FLOE_STATE_DIR", state.to_str().unwrap()),
            ("FLOE_METRICS_LISTEN", "127.0.0.1:0"),
        ];
        for _ in 0..2 {
            children.push(spawn_floe_with(&shipped(file), &log, &env));
        }
        catalogs.push((catalog, client, name, log));
    }

    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("message.max.bytes", "10000000")
        .create()
        .unwrap();
    let mut ends: BTreeMap<i32, i64> = BTreeMap::new();
    let mut spans = 0usize;
    let mut next = 0u64;
    let began = Instant::now();
    // Feed until every replica of both jobs has committed, then wait until both jobs hold
    // everything (feeding on while waiting would need a checkpoint to land in the two
    // seconds after each produce, in both jobs at once).
    loop {
        for _ in 0..8 {
            let [traces, _] =
                Generator::new(next, 1_750_000_000_000_000_000 + next * 1_000_000_000).requests(4);
            let partition = (next % PARTITIONS as u64) as i32;
            let end = support::send_to(&producer, "otlp_spans", partition, &traces.bytes).await;
            ends.insert(partition, end);
            spans += traces.items;
            next += 1;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut committed_by_all = true;
        for (_, client, _, _) in &catalogs {
            committed_by_all &= anchor_writers(client, "otel").await >= 2;
        }
        if committed_by_all {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(180),
            "not every replica committed: see {}",
            dir.display()
        );
    }
    loop {
        let mut done = true;
        for (_, client, name, _) in &catalogs {
            let positions = committed(client, "otel", name).await;
            done &= ends
                .iter()
                .all(|(p, end)| position_of(&positions, "otlp_spans", *p) == Some(*end));
        }
        if done {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(300),
            "the jobs did not commit everything: see {}",
            dir.display()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    for child in children {
        terminate(child);
    }

    for (_, client, name, log) in &catalogs {
        let ident = iceberg::TableIdent::from_strs(["otel", "otel_spans"]).unwrap();
        let location = client
            .load_table(&ident)
            .await
            .unwrap()
            .metadata_location
            .unwrap();
        let out = python(&format!(
            "import duckdb_offline\ncon = duckdb_offline.connect()\n\
             print(con.sql(\"SELECT count(*), count(DISTINCT (kafka_partition, kafka_offset, kafka_item)) \
             FROM iceberg_scan('{location}')\").fetchone())"
        ));
        assert_eq!(
            out.trim(),
            format!("({spans}, {spans})"),
            "{name}: every span once"
        );
        let text = std::fs::read_to_string(log).unwrap();
        assert!(!text.contains(" ERROR "), "{name}: {text}");
        let ports = logged(log, "metrics at /metrics", "addr");
        assert_eq!(
            ports.len(),
            2,
            "{name}: one metrics port per replica: {ports:?}"
        );
        if *name == "otlp-rollups" {
            let dirs = logged(log, "local operator state", "dir");
            assert_eq!(
                dirs.len(),
                2,
                "{name}: one state directory per replica: {dirs:?}"
            );
        }
    }
    eprintln!(
        "shipped jobs: 2 replicas each of otlp.toml and otlp-rollups.toml, {spans} spans once"
    );
}
