//! The Postgres CDC job's benchmark harness: `cargo bench -p floe --bench cdc`.
//!
//! With a Postgres from `tests/services/up --only pg`, on one table of `FLOE_BENCH_ROWS` rows
//! (default 2,000,000) and then `FLOE_BENCH_CHANGES` changed rows (default 1,000,000: inserts,
//! updates and deletes in transactions of 1,000):
//!
//! * **snapshot** — (s-a) `COPY (SELECT …) TO STDOUT (FORMAT binary)` read to nothing by one
//!   client; (s-b) the release `floe run` from start until the initial snapshot is committed
//!   to Iceberg (slot creation, the copy, Parquet, the commit); (s-c) the same table's rows in
//!   a second table added to the job (once the slot's confirmed and restart points have
//!   passed the table's load), from start until its incremental snapshot is committed (chunks
//!   interleaved with the stream, committed with the checkpoints); its rate is over the time
//!   the job logs from planning the copy to the commit that holds its last chunk (`incremental
//!   snapshot committed … seconds=`), so, like (s-b), it includes the Parquet and the commit;
//! * **streaming** — the same WAL decoded twice, from two slots created at the same LSN:
//!   (a) `pg_recvlogical` with pgoutput writing to /dev/null until the end LSN; (b) the release
//!   `floe run` from start until the slot's confirmed LSN (moved only after the Iceberg
//!   commit) reaches the end LSN, 2 s checkpoints.
//!
//! Rates are changed rows per second; the targets are (b) ≥ 0.5 × (a), (s-b) ≥ 0.5 × (s-a)
//! and (s-c) ≥ 0.7 × (s-b). `FLOE_BENCH_KEEP=1` keeps the job logs and tables;
//! `FLOE_BENCH_LOG` sets the jobs' `RUST_LOG` (default `info`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use futures::StreamExt;

mod common;
use common::support::{PgAddress, pg_connect, slot_confirmed, slot_restarts_after};
use common::{cpu_seconds, peak_rss_mib, release_bin, start_catalog};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn job(dir: &Path, server: &PgAddress, db: &str, catalog: &str) -> std::path::PathBuf {
    let path = dir.join("job.toml");
    std::fs::write(
        &path,
        format!(
            "version = 1\nname = \"bench\"\n[source.postgres]\nhost = \"{}\"\nport = {}\n\
             user = \"{}\"\ndatabase = \"{db}\"\nslot = \"floe_bench\"\npublication = \"bench\"\n\
             tables = [\"public.orders\"]\n\
             [catalog]\nuri = \"{catalog}\"\nnamespace = \"bench\"\n\
             [checkpoint]\ninterval = \"2s\"\nstate_dir = \"{}\"\n",
            server.host,
            server.port,
            server.user,
            dir.join("state").display()
        ),
    )
    .unwrap();
    path
}

struct Run {
    seconds: f64,
    cpu: f64,
    rss: f64,
}

/// Runs `floe run` until `done` says so; then stops it.
async fn run_floe(job: &Path, log: &Path, mut done: impl AsyncFnMut() -> bool) -> Run {
    let began = Instant::now();
    let mut child = Command::new(release_bin("floe"))
        .args(["run", job.to_str().unwrap()])
        .env(
            "RUST_LOG",
            std::env::var("FLOE_BENCH_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("cargo build --release -p floe first");
    let pid = child.id();
    let (mut cpu, mut rss) = (0.0, 0.0);
    while !done().await {
        assert!(
            child.try_wait().unwrap().is_none(),
            "floe stopped: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        cpu = cpu_seconds(pid);
        rss = peak_rss_mib(pid);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seconds = began.elapsed().as_secs_f64();
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = child.wait();
    Run { seconds, cpu, rss }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let (Ok(url), Ok(pg_bin)) = (
        std::env::var("FLOE_TEST_PG_URL"),
        std::env::var("FLOE_TEST_PG_BIN"),
    ) else {
        eprintln!(
            "cdc bench: FLOE_TEST_PG_URL / FLOE_TEST_PG_BIN unset (tests/services/up --only pg); skipped"
        );
        return;
    };
    let rows = env_usize("FLOE_BENCH_ROWS", 2_000_000);
    let changes = env_usize("FLOE_BENCH_CHANGES", 1_000_000);
    let dir = std::env::temp_dir().join(format!("floe-bench-cdc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let catalog = start_catalog(&dir);

    let mut config = tokio_postgres::Config::from_str(&url).unwrap();
    let admin = pg_connect(&config).await;
    let db = format!("bench_{}", std::process::id());
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
    config.dbname(&db);
    let client = pg_connect(&config).await;
    let began = Instant::now();
    let create = |table: &str| {
        format!(
            "CREATE TABLE {table} (id bigint PRIMARY KEY, customer int NOT NULL, \
               amount numeric(12,2), status varchar(16), created timestamptz, note varchar(64));
             INSERT INTO {table} SELECT g, g % 10000, (g % 100000) / 100.0, 'new', \
               TIMESTAMPTZ '2026-01-01' + g * interval '1 second', 'order number ' || g \
               FROM generate_series(1, {rows}) g;"
        )
    };
    client.batch_execute(&create("orders")).await.unwrap();
    client.batch_execute("VACUUM ANALYZE orders").await.unwrap();
    eprintln!(
        "cdc bench: {rows} rows loaded in {:.1} s",
        began.elapsed().as_secs_f64()
    );

    // (s-a) COPY binary to nothing.
    let began = Instant::now();
    let stream = client
        .copy_out("COPY (SELECT id, customer, amount, status, created, note FROM orders) TO STDOUT (FORMAT binary)")
        .await
        .unwrap();
    futures::pin_mut!(stream);
    let mut bytes = 0usize;
    while let Some(chunk) = stream.next().await {
        bytes += chunk.unwrap().len();
    }
    let copy_seconds = began.elapsed().as_secs_f64();

    // (s-b) floe's initial snapshot.
    let server = PgAddress::of(&config);
    let job = job(&dir, &server, &db, &catalog.uri);
    let log = dir.join("floe.log");
    let snapshot = run_floe(&job, &log, async || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("initial snapshot committed")
    })
    .await;

    // A second slot at the same point for pg_recvlogical, then the changes.
    client
        .batch_execute("SELECT pg_create_logical_replication_slot('bench_recv', 'pgoutput')")
        .await
        .unwrap();
    let began = Instant::now();
    let per_txn = 1000usize;
    client
        .batch_execute(&format!(
            "DO $$ DECLARE n bigint := {rows}; BEGIN
               FOR t IN 0..{} LOOP
                 -- 500 inserts, 400 updates, 100 deletes per transaction
                 INSERT INTO orders SELECT n + g, g % 10000, g / 100.0, 'new', now(), 'later ' || g
                   FROM generate_series(1, 500) g;
                 UPDATE orders SET status = 'paid', amount = amount + 1
                   WHERE id > t * 400 AND id <= t * 400 + 400;
                 DELETE FROM orders WHERE id > {rows} / 2 + t * 100 AND id <= {rows} / 2 + t * 100 + 100;
                 n := n + 500;
                 COMMIT;
               END LOOP;
             END $$",
            changes / per_txn - 1
        ))
        .await
        .unwrap();
    let end: String = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    eprintln!(
        "cdc bench: {changes} changes in {} transactions written in {:.1} s, WAL end {end}",
        changes / per_txn,
        began.elapsed().as_secs_f64()
    );

    // (a) pg_recvlogical decoding the same WAL to /dev/null.
    let began = Instant::now();
    let status = Command::new(Path::new(&pg_bin).join("pg_recvlogical"))
        .args([
            "-h",
            &server.host,
            "-p",
            &server.port.to_string(),
            "-U",
            &server.user,
            "-d",
            &db,
            "--slot",
            "bench_recv",
            "--start",
            "--endpos",
            &end,
            "-o",
            "proto_version=1",
            "-o",
            "publication_names=bench",
            "--no-loop",
            "-f",
            "/dev/null",
        ])
        .status()
        .unwrap();
    assert!(status.success(), "pg_recvlogical failed");
    let recv_seconds = began.elapsed().as_secs_f64();

    // (b) floe streaming the same WAL to committed Iceberg.
    let stream_log = dir.join("floe-stream.log");
    let streaming = run_floe(&job, &stream_log, async || {
        slot_confirmed(&client, "floe_bench", &end).await
    })
    .await;
    let committed = std::fs::read_to_string(&stream_log)
        .unwrap_or_default()
        .matches("checkpoint committed")
        .count();

    // (s-c) the same rows in a table added to the running job.
    client.batch_execute(&create("orders_added")).await.unwrap();
    client
        .batch_execute("VACUUM ANALYZE orders_added")
        .await
        .unwrap();
    // The stream passes the new table's load first (unmeasured), as it would have long
    // before a user adds an existing table to a job; a change of a followed table after it
    // moves the job's committed position past it, as other traffic would.
    client
        .batch_execute("UPDATE orders SET status = 'seen' WHERE id = 1")
        .await
        .unwrap();
    let loaded: String = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    // And the slot's restart point too: a restarted walsender decodes from it, and one
    // before the load would spend seconds re-decoding it ahead of the first watermark (a
    // restart's cost, not the copy's). Postgres moves it on a running-transactions record,
    // which a CHECKPOINT writes, once the client confirms past it; small updates give the
    // job commits to confirm. Bounded: after 60 s the bench goes on and says so.
    let catch_up_began = Instant::now();
    let mut nudged: Option<Instant> = None;
    run_floe(&job, &dir.join("floe-catch-up.log"), async || {
        if catch_up_began.elapsed() > Duration::from_secs(60) {
            return slot_confirmed(&client, "floe_bench", &loaded).await;
        }
        if slot_restarts_after(&client, "floe_bench", &loaded).await {
            return true;
        }
        if nudged.is_none_or(|at| at.elapsed() > Duration::from_secs(2)) {
            nudged = Some(Instant::now());
            client
                .batch_execute("CHECKPOINT; UPDATE orders SET status = 'seen' WHERE id = 1")
                .await
                .unwrap();
        }
        false
    })
    .await;
    let restarts_after_load = slot_restarts_after(&client, "floe_bench", &loaded).await;
    eprintln!(
        "cdc bench: the job's slot caught up past the added table's load in {:.1} s{}",
        catch_up_began.elapsed().as_secs_f64(),
        if restarts_after_load {
            ""
        } else {
            " (its restart point did not pass the load in 60 s)"
        }
    );
    let text = std::fs::read_to_string(&job).unwrap().replace(
        "tables = [\"public.orders\"]",
        "tables = [\"public.orders\", \"public.orders_added\"]",
    );
    std::fs::write(&job, text).unwrap();
    let added_log = dir.join("floe-added.log");
    let added = run_floe(&job, &added_log, async || {
        std::fs::read_to_string(&added_log)
            .unwrap_or_default()
            .contains("incremental snapshot committed")
    })
    .await;

    // The copy itself, as the job logs it: until its last chunk was read, and until the
    // commit holding it.
    let added_log_text = std::fs::read_to_string(&added_log).unwrap_or_default();
    let logged_seconds = |message: &str| {
        added_log_text
            .lines()
            .find(|l| l.contains(message))
            .and_then(|l| l.split("seconds=").nth(1))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("the {message:?} line gives the seconds"))
    };
    let copying = logged_seconds("incremental snapshot complete");
    let committing = logged_seconds("incremental snapshot committed");
    let copy_rate = rows as f64 / copy_seconds;
    let added_rate = rows as f64 / committing;
    let snapshot_rate = rows as f64 / snapshot.seconds;
    let recv_rate = changes as f64 / recv_seconds;
    let floe_rate = changes as f64 / streaming.seconds;
    println!("\n== Postgres CDC benchmark: {rows} rows, then {changes} changed rows ==");
    println!(
        "(s-a) COPY … (FORMAT binary) to nothing          {copy_rate:>12.0} rows/s  ({copy_seconds:.2} s, {:.0} MiB)",
        bytes as f64 / 1048576.0
    );
    println!(
        "(s-b) floe initial snapshot → committed Iceberg  {snapshot_rate:>12.0} rows/s  ({:.2} s, {:.1} CPU s, {:.0} MiB RSS) = {:.2} × (s-a)",
        snapshot.seconds,
        snapshot.cpu,
        snapshot.rss,
        snapshot_rate / copy_rate
    );
    println!(
        "(s-c) floe incremental snapshot of an added table {added_rate:>11.0} rows/s  ({committing:.2} s to committed, {copying:.2} s reading, {:.2} s from start, {:.1} CPU s, {:.0} MiB RSS) = {:.2} × (s-b)",
        added.seconds,
        added.cpu,
        added.rss,
        added_rate / snapshot_rate
    );
    println!(
        "(a)   pg_recvlogical (pgoutput) to /dev/null      {recv_rate:>12.0} changes/s ({recv_seconds:.2} s)"
    );
    println!(
        "(b)   floe WAL → committed Iceberg, 2 s checkpoints {floe_rate:>10.0} changes/s ({:.2} s incl. start, {committed} checkpoints, {:.1} CPU s, {:.0} MiB RSS) = {:.2} × (a)",
        streaming.seconds,
        streaming.cpu,
        streaming.rss,
        floe_rate / recv_rate
    );
    drop(catalog);
    let _ = client
        .batch_execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
             WHERE slot_name IN ('bench_recv', 'floe_bench')",
        )
        .await;
    let _ = admin
        .batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)"))
        .await;
    if std::env::var("FLOE_BENCH_KEEP").is_ok_and(|v| v == "1") {
        println!("kept the job logs and tables in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
