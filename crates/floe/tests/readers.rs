//! Every engine reads what Floe writes: one catalog gets every kind of table Floe writes —
//! OTLP spans, logs, metrics of every kind and profiles (maps, lists of structs, timestamps,
//! promoted columns), the dead-letter table, a window's rollup whose rows were upserted by
//! late spans (equality deletes), a Postgres CDC table after inserts, updates and deletes, and
//! a table compacted by floe-maintenance — then DuckDB, Trino, Spark and Iceberg Java each
//! read every table through floe-catalog, and every table's rows must be the same multiset in
//! all four (`tests/readers/compare.py`, which also says the canonical form). Trino's
//! `$entries` and `$all_entries` metadata tables must list what PyIceberg lists.
//!
//! Needs the test services (Kafka, Postgres, the Python readers), Trino (`tests/trino/setup`,
//! run by `tests/trino/start`) and the JVM readers (`tests/readers/setup`):
//! `FLOE_TEST_KAFKA_BROKERS`, `FLOE_TEST_PG_URL`, `FLOE_TEST_PYTHON`, `FLOE_READERS_JAVA_CP`,
//! `FLOE_SPARK_JARS`. Ignored without `--include-ignored`, which `tests/run` passes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use floe_otlp::generate::{Generator, profiles_json};

mod support;
use support::pg::{Database, job_file, wait_caught_up};
use support::{
    OtlpKafkaJob, create_topic, producer, service, spawn_floe, start_catalog, temp_dir, terminate,
    wait_committed,
};

/// The CDC tables: `kinds` has a column of each kind the Postgres source maps; `orders` has
/// none of type `time`, which Spark cannot read (Iceberg's Spark runtime has no time type).
const CDC_SCHEMA: &str = "
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE kinds (
  id bigint PRIMARY KEY, label text, amount numeric(12,2), tags text[], scores int[],
  day date, seen timestamptz, local_ts timestamp, at_time time, flag boolean, u uuid,
  blob bytea, ratio double precision, small smallint, f4 real, doc jsonb, feeling mood);
INSERT INTO kinds SELECT g, 'row ' || g, g * 1.25, ARRAY['a', NULL, 'c,d'], ARRAY[g, g % 7],
  DATE '2024-01-01' + g, TIMESTAMPTZ '2024-01-01 00:00:00.123456+00' + g * interval '1 hour',
  TIMESTAMP '2024-01-01 12:00:00' + g * interval '1 minute', TIME '12:34:56.5',
  g % 2 = 0, md5(g::text)::uuid, decode(md5(g::text), 'hex'), g / 4.0, (g % 100)::smallint,
  1.25, jsonb_build_object('k', g, 'arr', jsonb_build_array(1, 'two')),
  (ARRAY['sad', 'ok', 'happy'])[1 + g % 3]::mood
FROM generate_series(1, 300) g;
CREATE TABLE orders (id bigint PRIMARY KEY, customer text, amount numeric(12,2), placed timestamptz);
INSERT INTO orders SELECT g, 'c' || g % 13, g * 0.5, TIMESTAMPTZ '2024-01-01 00:00:00+00' + g * interval '1 minute'
FROM generate_series(1, 200) g;
";

/// After the snapshot: updates (some changing the key), deletes and new rows.
const CDC_CHANGES: &str = "
UPDATE kinds SET label = 'changed ' || id, amount = amount * 2, tags = NULL WHERE id % 5 = 0;
UPDATE kinds SET id = id + 1000 WHERE id % 17 = 0;
DELETE FROM kinds WHERE id % 7 = 0;
INSERT INTO kinds (id, label, seen) SELECT g, 'late ' || g, now() FROM generate_series(2001, 2050) g;
DELETE FROM kinds WHERE id BETWEEN 2001 AND 2010;
UPDATE orders SET amount = amount + 1, customer = NULL WHERE id % 3 = 0;
DELETE FROM orders WHERE id % 11 = 0;
";

/// A window on the spans, so that late spans upsert rows the window already wrote.
const ROLLUP: &str = r#"
[[operators]]
id = "per_minute"
kind = "window"
input = "spans"
window = { type = "tumbling", size = "1m" }
key = ["service_name", "span_name"]
allowed_lateness = "1h"
aggregates = { spans = "count()", longest_ns = "max(duration_ns)", p99_ns = "quantile(duration_ns, 0.99)", slowest = "max_by(trace_id, duration_ns)", traces = "count_distinct(trace_id)", mean_ns = "avg(duration_ns)" }

[tables.per_minute]
name = "spans_per_minute"
partition = ["identity(service_name)"]
"#;

/// Trino on the catalog at `uri`, its state under `dir`; stopped on drop.
struct Trino {
    url: String,
    dir: PathBuf,
}

impl Trino {
    fn script(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/trino/{name}"))
    }

    fn start(uri: &str, dir: &Path) -> Self {
        let out = Command::new(Self::script("start"))
            .env("FLOE_CATALOG_URI", uri)
            .env("FLOE_TRINO_DIR", dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tests/trino/start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let url = String::from_utf8(out.stdout).unwrap();
        Self {
            url: url.trim().lines().last().unwrap().to_string(),
            dir: dir.to_path_buf(),
        }
    }
}

impl Drop for Trino {
    fn drop(&mut self) {
        let _ = Command::new(Self::script("stop"))
            .env("FLOE_TRINO_DIR", &self.dir)
            .output();
    }
}

/// Lands the OTLP signals from Kafka: spans in three rounds (the third late, upserting the
/// rollup's rows), logs, metrics, profiles as protobuf and JSON, and bad records.
async fn land_otlp(
    brokers: &str,
    catalog: &str,
    client: &floe_lake::rest::CatalogClient,
    dir: &Path,
) {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let topics: Vec<(String, &str)> = ["traces", "logs", "metrics", "profiles"]
        .into_iter()
        .map(|s| (format!("readers_{s}_{run}"), s))
        .collect();
    for (topic, _) in &topics {
        create_topic(brokers, topic, 1).await;
    }
    let producer = producer(brokers);
    let mut ends: BTreeMap<String, i64> = BTreeMap::new();
    let topic_of = |signal: &str| topics.iter().find(|(_, s)| *s == signal).unwrap().0.clone();
    let send = async |ends: &mut BTreeMap<String, i64>, signal: &str, payload: &[u8]| {
        let topic = topic_of(signal);
        let end = support::send_to(&producer, &topic, 0, payload).await;
        ends.insert(topic, end);
    };
    let job = OtlpKafkaJob {
        name: "otlp",
        brokers,
        topics: topics.clone(),
        run: &run,
        catalog,
        namespace: "otel",
        instance: None,
        state_dir: dir.join("otlp-state"),
    }
    .write(&dir.join("otlp.toml"));
    let mut text = std::fs::read_to_string(&job).unwrap();
    text.push_str(ROLLUP);
    std::fs::write(&job, text).unwrap();
    let log = dir.join("otlp.log");
    let floe = spawn_floe(&job, &log);
    // Each round committed before the next, so every table has a file per round: on time,
    // ten minutes later (the first round's windows fire), then late, upserting their rows.
    let t0: u64 = 1_700_000_000_000_000_000;
    for (seed, start) in [(1, t0), (2, t0 + 600_000_000_000), (3, t0 + 5_000_000_000)] {
        let mut generator = Generator::new(seed, start);
        for _ in 0..2 {
            let [traces, logs] = generator.requests(40);
            send(&mut ends, "traces", &traces.bytes).await;
            send(&mut ends, "logs", &logs.bytes).await;
        }
        send(&mut ends, "metrics", &generator.metrics().bytes).await;
        let profiles = generator.profiles(60).bytes;
        let payload = if seed == 2 {
            profiles_json(&profiles)
        } else {
            profiles
        };
        send(&mut ends, "profiles", &payload).await;
        if seed == 3 {
            // Dead letters: not protobuf, and JSON of the wrong shape.
            send(&mut ends, "traces", &[0x0f; 40]).await;
            send(&mut ends, "logs", br#"{"resourceLogs":"many"}"#).await;
        }
        for (topic, end) in &ends {
            let end = BTreeMap::from([(0, *end)]);
            wait_committed(client, ("otel", "otlp"), topic, &end, &log).await;
        }
    }
    terminate(floe);
}

/// Lands a Postgres table through its initial snapshot, then updates and deletes.
async fn land_cdc(catalog: &str, client: &floe_lake::rest::CatalogClient, dir: &Path) -> Database {
    let db = Database::create(&service("FLOE_TEST_PG_URL"), "readers").await;
    db.client.batch_execute(CDC_SCHEMA).await.unwrap();
    let job = job_file(dir, &db, catalog, "replica_identity_full = true");
    let log = dir.join("cdc.log");
    let mut floe = spawn_floe(&job, &log);
    wait_caught_up(&db, client, &mut floe, &log).await;
    db.client.batch_execute(CDC_CHANGES).await.unwrap();
    wait_caught_up(&db, client, &mut floe, &log).await;
    terminate(floe);
    db
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn duckdb_trino_spark_and_iceberg_java_read_every_table_alike() {
    let brokers = service("FLOE_TEST_KAFKA_BROKERS");
    let python = service("FLOE_TEST_PYTHON");
    service("FLOE_READERS_JAVA_CP");
    service("FLOE_SPARK_JARS");
    let dir = temp_dir("readers");
    let (catalog, client) = start_catalog(&dir).await;
    let uri = catalog.uri();

    land_otlp(&brokers, &uri, &client, &dir).await;
    let db = land_cdc(&uri, &client, &dir).await;
    // floe-maintenance compacts the spans' files (one per round) into one.
    let spans = iceberg::TableIdent::from_strs(["otel", "otel_spans"]).unwrap();
    let settings = floe_maintenance::compact::CompactionSettings {
        min_input_files: 2,
        ..Default::default()
    };
    let loaded = client.load_table(&spans).await.unwrap();
    let plan = floe_maintenance::compact::plan_compaction(&loaded, &settings)
        .await
        .unwrap()
        .expect("the spans have files to compact");
    let report = floe_maintenance::compact::compact(&client, &spans, &plan, &settings, &|_| {})
        .await
        .unwrap();
    assert!(
        report.groups_committed > 0 && report.files_rewritten >= 3,
        "the spans were compacted: {report:?}"
    );

    let mut tables = Vec::new();
    for namespace in ["otel", "app"] {
        let ns = iceberg::NamespaceIdent::new(namespace.into());
        for t in client.list_tables(&ns).await.unwrap() {
            tables.push(format!("{namespace}.{}", t.name()));
        }
    }
    tables.sort();
    let kinds = [
        "otel.otel_spans",
        "otel.otel_logs",
        "otel.otel_profiles",
        "otel.spans_per_minute",
        "otel.floe_dead_letters",
        "app.kinds",
        "app.orders",
    ];
    for kind in kinds {
        assert!(tables.contains(&kind.to_string()), "{kind} in {tables:?}");
    }
    let metrics: Vec<&String> = tables
        .iter()
        .filter(|t| t.starts_with("otel.otel_metrics"))
        .collect();
    assert!(metrics.len() >= 4, "every metric kind: {tables:?}");

    // The tables whose deletes the readers must apply have some.
    for (namespace, table) in [
        ("otel", "spans_per_minute"),
        ("app", "kinds"),
        ("app", "orders"),
    ] {
        let ident = iceberg::TableIdent::from_strs([namespace, table]).unwrap();
        let loaded = client.load_table(&ident).await.unwrap();
        let deletes: u64 = loaded
            .metadata
            .snapshots()
            .filter_map(|s| {
                s.summary()
                    .additional_properties
                    .get("added-equality-deletes")
            })
            .map(|n| n.parse::<u64>().unwrap())
            .sum();
        assert!(deletes > 0, "{namespace}.{table} has equality deletes");
    }

    let trino = Trino::start(&uri, &dir.join("trino"));
    let out = Command::new(&python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/readers/compare.py"))
        .args(["--catalog", &uri, "--trino", &trino.url, "--metadata"])
        .args(&tables)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "the engines disagree:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every kind of table was read, and none of them empty.
    for table in kinds.into_iter().chain(metrics.iter().map(|t| t.as_str())) {
        let line = stdout
            .lines()
            .find(|l| l.contains(&format!("\"table\": \"{table}\"")))
            .unwrap_or_else(|| panic!("no result for {table}"));
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(
            v["rows"]["duckdb"].as_u64().unwrap() > 0,
            "{table} is empty: {line}"
        );
    }
    // Only Spark skips a table, and only the one with a time column.
    let skipped: Vec<String> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["skipped"].as_object().is_some_and(|m| !m.is_empty()))
        .map(|v| format!("{} {}", v["table"], v["skipped"]))
        .collect();
    assert!(
        skipped.len() == 1 && skipped[0].starts_with("\"app.kinds\" {\"spark\""),
        "{skipped:?}"
    );
    drop(trino);
    db.remove().await;
    catalog.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
