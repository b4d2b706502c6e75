//! Spark's table maintenance beside Floe's writers: while a Postgres CDC job and an OTLP job
//! commit, Spark runs `rewrite_data_files` and `expire_snapshots(retain_last => 1)` on their
//! tables — the anchors with the jobs' checkpoint markers included — for five rounds, and one
//! of the jobs is killed -9 in each, while Spark works. Afterwards the CDC table equals
//! Postgres (`EXCEPT ALL` both ways), every span is in `otel_spans` exactly once, and every
//! restart resumed from the job's own committed positions.
//!
//! Without the jobs' checkpoint tags ([`floe_lake::marker::checkpoint_tag`]), Spark's expiry
//! removed the snapshot holding a job's newest marker whenever its own rewrite was the
//! table's head, and the restarted job read its sources from the start again.
//!
//! Needs the test services and `tests/readers/setup` (`FLOE_TEST_KAFKA_BROKERS`,
//! `FLOE_TEST_PG_URL`, `FLOE_TEST_PYTHON` with PySpark, `FLOE_SPARK_JARS`); ignored without
//! `--include-ignored`, which `tests/run` passes.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use floe_otlp::generate::Generator;

mod support;
use support::pg::{Fixture, compare, job_file, wait_caught_up};
use support::{
    OtlpKafkaJob, create_topic, producer, python, service, spawn_floe, terminate, wait_committed,
};

const ROUNDS: usize = 5;

/// Per process of a job (its `writer` id, in start order), the positions it last said it
/// reads from: each process logs "reading from the committed positions" when it starts and
/// again when its source partitions are assigned.
fn starts(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text
        .lines()
        .filter(|l| l.contains("reading from the committed positions"))
    {
        // `… writer=ID positions={…}`: the positions run to the end of the line.
        let field = |name: &str| Some(&line[line.find(&format!(" {name}="))? + name.len() + 2..]);
        let (Some(writer), Some(positions)) = (field("writer"), field("positions")) else {
            continue;
        };
        let writer = writer.split(' ').next().unwrap_or_default().to_string();
        let positions = positions.to_string();
        match out.last_mut() {
            Some((last, at)) if *last == writer => *at = positions,
            _ => out.push((writer, positions)),
        }
    }
    out.into_iter().map(|(_, positions)| positions).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn spark_compaction_and_expiry_beside_the_jobs_lose_and_resurrect_nothing() {
    let brokers = service("FLOE_TEST_KAFKA_BROKERS");
    let python_bin = service("FLOE_TEST_PYTHON");
    service("FLOE_SPARK_JARS");
    let f = Fixture::new("spark").await;
    let uri = f.catalog.uri();

    // The CDC side: a table and its job.
    f.db.client
        .batch_execute(
            "CREATE TABLE items (id bigint PRIMARY KEY, qty int NOT NULL, label text);
             INSERT INTO items SELECT g, g % 10, 'item ' || g FROM generate_series(1, 400) g;",
        )
        .await
        .unwrap();
    let cdc_job = job_file(&f.dir, &f.db, &uri, "replica_identity_full = true");
    let cdc_log = f.dir.join("cdc.log");
    let mut cdc = spawn_floe(&cdc_job, &cdc_log);
    wait_caught_up(&f.db, &f.client, &mut cdc, &cdc_log).await;

    // The OTLP side: spans and a bad record (so its anchor has files too) per round.
    let run = uuid::Uuid::new_v4().simple().to_string();
    let topic = format!("spark_spans_{run}");
    create_topic(&brokers, &topic, 1).await;
    let otlp_job = OtlpKafkaJob {
        name: "otlp",
        brokers: &brokers,
        topics: vec![(topic.clone(), "traces")],
        run: &run,
        catalog: &uri,
        namespace: "otel",
        instance: None,
        state_dir: f.dir.join("otlp-state"),
    }
    .write(&f.dir.join("otlp.toml"));
    let otlp_log = f.dir.join("otlp.log");
    let mut otlp = spawn_floe(&otlp_job, &otlp_log);
    let producer = producer(&brokers);
    let mut generator = Generator::new(7, 1_700_000_000_000_000_000);
    let (mut spans, mut bad, mut end) = (0usize, 0usize, 0i64);
    let produce = async |payload: &[u8]| support::send_to(&producer, &topic, 0, payload).await;
    for _ in 0..3 {
        let [traces, _] = generator.requests(50);
        spans += traces.items;
        end = produce(&traces.bytes).await;
    }
    wait_committed(
        &f.client,
        ("otel", "otlp"),
        &topic,
        &BTreeMap::from([(0, end)]),
        &otlp_log,
    )
    .await;

    // Spark, one session for every round.
    let tables = [
        "app.items",
        "app.floe_dead_letters",
        "otel.otel_spans",
        "otel.floe_dead_letters",
    ];
    let mut spark = Command::new(&python_bin)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/readers/spark_maintenance.py"))
        .args(["--catalog", &uri])
        .args(tables)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut to_spark = spark.stdin.take().unwrap();
    let mut from_spark = BufReader::new(spark.stdout.take().unwrap()).lines();
    let ready = tokio::task::block_in_place(|| from_spark.next());
    assert_eq!(ready.unwrap().unwrap(), "ready");

    let mut rewritten: BTreeMap<&str, u64> = BTreeMap::new();
    for round in 0..ROUNDS {
        // Changes on both sides, committed by the jobs in a few checkpoints.
        f.db.client
            .batch_execute(&format!(
                "UPDATE items SET qty = qty + 1 WHERE id % 7 = {r};
                 DELETE FROM items WHERE id % 23 = {r};
                 INSERT INTO items SELECT g, 0, 'new ' || g FROM generate_series({a}, {b}) g;",
                r = round,
                a = 1000 + round * 20,
                b = 1019 + round * 20,
            ))
            .await
            .unwrap();
        for _ in 0..2 {
            let [traces, _] = generator.requests(50);
            spans += traces.items;
            produce(&traces.bytes).await;
        }
        bad += 1;
        end = produce(&[0x0f; 24]).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;

        // Spark works; one job is killed -9 meanwhile, the other keeps committing.
        writeln!(to_spark, "round {round}").unwrap();
        tokio::time::sleep(Duration::from_millis(300 + 500 * round as u64)).await;
        let victim = if round % 2 == 0 { &mut cdc } else { &mut otlp };
        victim.kill().unwrap();
        victim.wait().unwrap();
        let line = tokio::task::block_in_place(|| from_spark.next())
            .expect("spark answers")
            .unwrap();
        let report: serde_json::Value = serde_json::from_str(&line).unwrap();
        eprintln!("round {round}: {report}");
        for table in tables {
            *rewritten.entry(table).or_default() +=
                report[table]["rewritten"].as_u64().unwrap_or(0);
        }
        if round % 2 == 0 {
            cdc = spawn_floe(&cdc_job, &cdc_log);
            wait_caught_up(&f.db, &f.client, &mut cdc, &cdc_log).await;
        } else {
            otlp = spawn_floe(&otlp_job, &otlp_log);
            let ends = BTreeMap::from([(0, end)]);
            wait_committed(&f.client, ("otel", "otlp"), &topic, &ends, &otlp_log).await;
        }
    }
    drop(to_spark);
    let _ = spark.wait();
    assert!(
        rewritten["app.items"] > 0 && rewritten["otel.otel_spans"] > 0,
        "Spark rewrote the tables' files: {rewritten:?}"
    );

    wait_caught_up(&f.db, &f.client, &mut cdc, &cdc_log).await;
    let ends = BTreeMap::from([(0, end)]);
    wait_committed(&f.client, ("otel", "otlp"), &topic, &ends, &otlp_log).await;
    terminate(cdc);
    terminate(otlp);

    // Nothing lost, nothing resurrected.
    for (table, rows, missing, unexpected) in compare(&f.db, &f.client, &f.dir, &["items"]).await {
        assert_eq!((missing, unexpected), (0, 0), "{table}: {rows} rows");
    }
    let spans_at = support::metadata_location(&f.client, "otel", "otel_spans").await;
    let dead_at = support::metadata_location(&f.client, "otel", "floe_dead_letters").await;
    let out = python(&format!(
        "import duckdb_offline\ncon = duckdb_offline.connect()\n\
         print(*con.sql(\"SELECT count(*), count(DISTINCT (kafka_offset, kafka_item)) FROM iceberg_scan('{spans_at}')\").fetchone(),\n\
               con.sql(\"SELECT count(*) FROM iceberg_scan('{dead_at}')\").fetchone()[0])\n"
    ));
    let [rows, distinct, dead] = support::numbers::<usize, 3>(&out);
    assert_eq!(
        (rows, distinct, dead),
        (spans, spans, bad),
        "every span and bad record once"
    );

    // Every restart read on from the job's own checkpoint, none from the beginning.
    for (log, restarts) in [(&cdc_log, ROUNDS.div_ceil(2)), (&otlp_log, ROUNDS / 2)] {
        let starts = starts(log);
        assert_eq!(starts.len(), restarts + 1, "{}", log.display());
        assert!(
            starts[1..].iter().all(|positions| positions != "{}"),
            "a restart began from nothing: {starts:?} ({})",
            log.display()
        );
    }
    f.finish().await;
}
