//! A CDC job edited as a user edits one over months, each edit checked against Postgres
//! (DuckDB `EXCEPT ALL` both ways):
//!
//! * **edits that keep or fork a table** — a `[tables."shop.orders"]` section that only sets a
//!   writer option keeps the table (`shop_orders`, the naming rule); one that renames it is
//!   refused with `file:line:col` until `--rename-table`, which renames it with its history;
//!   a table taken out of `tables` is refused until `--stop-following`; a renamed job or
//!   another publication is refused; put back, a table is
//!   copied anew by an incremental snapshot; changed behind the job's back, it is made equal
//!   again by `floe cdc resnapshot`;
//! * **a table added to a running job** — a large table added to `tables` is copied by an
//!   incremental snapshot under a random write workload on it and on the other table, killed
//!   -9 again and again while it copies (each life at most one short checkpoint long, so the
//!   kills land during the copy however fast it runs); the other table's changes keep landing
//!   during the copy (freshness measured against two-second checkpoints first), and at the end
//!   both tables equal Postgres.
//!
//! Needs `FLOE_TEST_PG_URL` and `FLOE_TEST_PYTHON` (from `tests/services/up`): ignored
//! without `--include-ignored`, which `tests/run` passes. `FLOE_ADD_TABLE_ROWS` sets the
//! added table's size (default 5,000,000); `FLOE_CHAOS_KILLS` the kills while it is copied
//! (default and least 10).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;

mod support;
use support::pg::{Fixture, compare_as, differences, job_file, wait_caught_up};
use support::{committed, spawn_floe, spawn_floe_run, terminate};

/// The tests run one at a time: the freshness bound is about the job, not about another
/// test's load on the same two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Rewrites the job file's `tables = …` line and appends `sections`.
fn edit_job(job: &Path, tables: &str, sections: &str) {
    let text = std::fs::read_to_string(job).unwrap();
    let mut out: Vec<String> = text
        .lines()
        .filter(|l| {
            !l.starts_with("[tables.")
                && !l.starts_with("target_file_size")
                && !l.starts_with("name = \"orders")
        })
        .map(|l| {
            if l.starts_with("tables = ") {
                format!("tables = {tables}")
            } else {
                l.to_string()
            }
        })
        .collect();
    out.push(sections.to_string());
    std::fs::write(job, out.join("\n") + "\n").unwrap();
}

/// `floe run` that must fail; its stderr.
fn refused(job: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_floe"))
        .args(["run", job.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success(), "the edit must be refused");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

async fn equal(f: &Fixture, pairs: &[(&str, &str)]) {
    for (table, rows, missing, unexpected) in compare_as(&f.db, &f.client, &f.dir, pairs).await {
        assert_eq!(
            (missing, unexpected),
            (0, 0),
            "{table}: {rows} rows in Postgres"
        );
    }
}

async fn table_exists(f: &Fixture, name: &str) -> bool {
    f.client
        .load_table(&iceberg::TableIdent::new(
            iceberg::NamespaceIdent::new("app".into()),
            name.into(),
        ))
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn edits_that_would_fork_a_table_are_refused_and_deliberate_ones_apply() {
    let _serial = SERIAL.lock().await;
    let f = Fixture::new("edits").await;
    let db = &f.db;
    db.client
        .batch_execute(
            "CREATE SCHEMA shop;
             CREATE TABLE shop.orders (id int PRIMARY KEY, note text);
             CREATE TABLE items (id int PRIMARY KEY, qty int, label text);
             INSERT INTO shop.orders SELECT g, 'order ' || g FROM generate_series(1, 100) g;
             INSERT INTO items SELECT g, g, 'item ' || g FROM generate_series(1, 50) g;",
        )
        .await
        .unwrap();
    let job = job_file(
        &f.dir,
        db,
        &f.catalog.uri(),
        "tables = [\"shop.orders\", \"public.items\"]\nreplica_identity_full = true",
    );
    let log = f.dir.join("floe.log");
    let writes = |round: i32| {
        format!(
            "UPDATE shop.orders SET note = 'round {round}' WHERE id % 7 = {m};
             DELETE FROM shop.orders WHERE id = {round};
             INSERT INTO shop.orders VALUES (1000 + {round}, 'new');
             UPDATE items SET qty = qty + 1 WHERE id % 5 = {m};
             INSERT INTO items VALUES (1000 + {round}, 1, 'new');",
            m = round % 7
        )
    };
    let mut child = spawn_floe(&job, &log);
    wait_caught_up(db, &f.client, &mut child, &log).await;
    db.client.batch_execute(&writes(1)).await.unwrap();
    wait_caught_up(db, &f.client, &mut child, &log).await;
    terminate(child);
    equal(&f, &[("shop.orders", "shop_orders"), ("items", "items")]).await;

    // A section that only sets a writer option keeps the table's name.
    edit_job(
        &job,
        "[\"shop.orders\", \"public.items\"]",
        "\n[tables.\"shop.orders\"]\ntarget_file_size = \"64MiB\"",
    );
    let mut child = spawn_floe(&job, &log);
    db.client.batch_execute(&writes(2)).await.unwrap();
    wait_caught_up(db, &f.client, &mut child, &log).await;
    terminate(child);
    equal(&f, &[("shop.orders", "shop_orders")]).await;
    assert!(!table_exists(&f, "orders").await, "no second table");

    // A new name would fork the table: refused at the section, with the way to do it.
    edit_job(
        &job,
        "[\"shop.orders\", \"public.items\"]",
        "\n[tables.\"shop.orders\"]\nname = \"orders_v2\"",
    );
    let stderr = refused(&job);
    let section = std::fs::read_to_string(&job)
        .unwrap()
        .lines()
        .position(|l| l.starts_with("[tables.\"shop.orders\"]"))
        .unwrap()
        + 1;
    assert!(
        stderr.contains(&format!("{}:{section}:", job.display()))
            && stderr.contains("landed in table shop_orders")
            && stderr.contains("--rename-table shop.orders"),
        "{stderr}"
    );
    assert!(!table_exists(&f, "orders_v2").await, "nothing created");

    // Deliberately: the table is renamed with its history and goes on.
    let mut child = spawn_floe_run(&job, &log, &[], &["--rename-table", "shop.orders"]);
    db.client.batch_execute(&writes(3)).await.unwrap();
    wait_caught_up(db, &f.client, &mut child, &log).await;
    terminate(child);
    equal(&f, &[("shop.orders", "orders_v2")]).await;
    assert!(
        !table_exists(&f, "shop_orders").await,
        "renamed, not copied"
    );
    let section_tail = "\n[tables.\"shop.orders\"]\nname = \"orders_v2\"";

    // A table taken out of the job: refused, then stopped deliberately.
    edit_job(&job, "[\"shop.orders\"]", section_tail);
    let stderr = refused(&job);
    assert!(stderr.contains("--stop-following public.items"), "{stderr}");
    let mut child = spawn_floe_run(&job, &log, &[], &["--stop-following", "public.items"]);
    db.client.batch_execute(&writes(4)).await.unwrap();
    wait_caught_up(db, &f.client, &mut child, &log).await;
    terminate(child);
    equal(&f, &[("shop.orders", "orders_v2")]).await;

    // Put back, it is copied anew (its table had stopped at round 3) while changes go on.
    edit_job(&job, "[\"shop.orders\", \"public.items\"]", section_tail);
    let mut child = spawn_floe(&job, &log);
    db.client.batch_execute(&writes(5)).await.unwrap();
    wait_caught_up(db, &f.client, &mut child, &log).await;
    wait_backfilled(&f, &mut child, &log).await;
    db.client.batch_execute(&writes(6)).await.unwrap();
    wait_caught_up(db, &f.client, &mut child, &log).await;
    equal(&f, &[("shop.orders", "orders_v2"), ("items", "items")]).await;

    // Changed behind the job's back (the table left the publication for a while, as after a
    // restore from a backup): `floe cdc resnapshot` makes it equal again, the job running.
    for sql in [
        "ALTER PUBLICATION floe_cdc DROP TABLE items",
        "UPDATE items SET qty = -qty WHERE id % 2 = 0",
        "DELETE FROM items WHERE id < 10",
        "ALTER PUBLICATION floe_cdc ADD TABLE items",
    ] {
        db.client.batch_execute(sql).await.unwrap();
    }
    db.client.batch_execute(&writes(7)).await.unwrap();
    wait_caught_up(db, &f.client, &mut child, &log).await;
    let diverged = differences(db, &f.client, &f.dir, &[("items", "items")]).await;
    assert!(diverged[0].2 > 0, "the table diverged: {diverged:?}");
    let completed = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("incremental snapshot complete table=public.items")
            .count()
    };
    let before = completed();
    let out = Command::new(env!("CARGO_BIN_EXE_floe"))
        .args(["cdc", "resnapshot", job.to_str().unwrap(), "public.items"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let began = Instant::now();
    while completed() == before {
        assert!(began.elapsed() < Duration::from_secs(120), "no re-snapshot");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    db.client.batch_execute(&writes(8)).await.unwrap();
    wait_caught_up(db, &f.client, &mut child, &log).await;
    terminate(child);
    equal(&f, &[("shop.orders", "orders_v2"), ("items", "items")]).await;
    // A table the job does not follow is refused by name.
    let out = Command::new(env!("CARGO_BIN_EXE_floe"))
        .args(["cdc", "resnapshot", job.to_str().unwrap(), "public.nope"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not follow public.nope"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The job renamed in its file would start over and land every row twice: refused, and
    // nothing is landed or copied.
    let original = std::fs::read_to_string(&job).unwrap();
    std::fs::write(
        &job,
        original.replacen("name = \"cdc\"", "name = \"cdc-renamed\"", 1),
    )
    .unwrap();
    let stderr = refused(&job);
    assert!(
        stderr.contains("is landed by job \"cdc\"") && stderr.contains("Keep name = \"cdc\""),
        "{stderr}"
    );
    // Another publication would follow other tables from the same slot: refused by name.
    std::fs::write(
        &job,
        original.replacen(
            "[source.postgres]\n",
            "[source.postgres]\npublication = \"floe_other\"\n",
            1,
        ),
    )
    .unwrap();
    let stderr = refused(&job);
    assert!(
        stderr.contains("follow publication floe_cdc") && stderr.contains("floe_other"),
        "{stderr}"
    );
    // As it was, the job goes on where it stopped.
    std::fs::write(&job, &original).unwrap();
    let mut child = spawn_floe(&job, &log);
    db.client.batch_execute(&writes(9)).await.unwrap();
    wait_caught_up(db, &f.client, &mut child, &log).await;
    terminate(child);
    equal(&f, &[("shop.orders", "orders_v2"), ("items", "items")]).await;
    f.finish().await;
}

/// The job's committed incremental snapshots, as its marker says (`{}` when none).
async fn pending_backfill(f: &Fixture) -> String {
    committed(&f.client, "app", "cdc")
        .await
        .get("pg.backfill")
        .cloned()
        .unwrap_or_else(|| "{}".into())
}

async fn wait_backfilled(f: &Fixture, child: &mut support::Floe, log: &Path) {
    let began = Instant::now();
    while pending_backfill(f).await != "{}" {
        assert!(
            child.try_wait().unwrap().is_none(),
            "floe stopped: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        assert!(
            began.elapsed() < Duration::from_secs(600),
            "no end to the copy"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn lsn(text: &str) -> u64 {
    let (hi, lo) = text.split_once('/').unwrap();
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

/// Random writes to both tables until `stop`.
async fn workload(
    session: tokio_postgres::Client,
    rows: i64,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
) {
    let mut next = rows + 1;
    while !stop.load(Ordering::Relaxed) {
        let id = rand::rng().random_range(1..=rows);
        let sql = match rand::rng().random_range(0..10) {
            0..=2 => format!("UPDATE big SET v = v + 1, label = 'u' || v WHERE id = {id}"),
            3 => format!("DELETE FROM big WHERE id = {id}"),
            4 => {
                next += 1;
                format!("INSERT INTO big VALUES ({next}, 1, 'new') ON CONFLICT DO NOTHING")
            }
            5 => {
                next += 1;
                format!("UPDATE big SET id = {next} WHERE id = {id}")
            }
            6 => format!(
                "BEGIN; UPDATE big SET v = -v WHERE id = {id}; \
                 UPDATE scratch SET v = v + 1 WHERE k = {}; COMMIT",
                id % 10
            ),
            _ => format!("UPDATE scratch SET v = v + 1 WHERE k = {}", id % 10),
        };
        if session.batch_execute(&sql).await.is_ok() {
            count.fetch_add(1, Ordering::Relaxed);
        } else {
            let _ = session.batch_execute("ROLLBACK").await;
        }
        let pause = rand::rng().random_range(0..10);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn a_table_added_to_a_running_job_is_copied_while_the_stream_flows_and_the_job_dies() {
    let _serial = SERIAL.lock().await;
    let rows: i64 = std::env::var("FLOE_ADD_TABLE_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000_000);
    let f = Fixture::new("addtable").await;
    let db = &f.db;
    db.client
        .batch_execute(&format!(
            "CREATE TABLE scratch (k int PRIMARY KEY, v int);
             INSERT INTO scratch SELECT g, 0 FROM generate_series(0, 9) g;
             CREATE TABLE big (id bigint PRIMARY KEY, v int, label text);
             INSERT INTO big SELECT g, g % 1000, 'row ' || g FROM generate_series(1, {rows}) g;
             ANALYZE big;"
        ))
        .await
        .unwrap();
    let job = job_file(
        &f.dir,
        db,
        &f.catalog.uri(),
        // Small chunks, spaced: the copy runs at most 10,000 rows per 50 ms (200,000 rows/s)
        // however fast the machine, so the freshness probes and the kills below all land
        // while it runs.
        "tables = [\"public.scratch\"]\nreplica_identity_full = true\n\
         snapshot_chunk_rows = 10000\nsnapshot_chunk_delay = \"50ms\"",
    );
    // Two-second checkpoints: freshness is measured against two of them.
    let interval = Duration::from_secs(2);
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace("interval = \"1s\"", "interval = \"2s\"");
    std::fs::write(&job, text).unwrap();
    let log = f.dir.join("floe.log");
    let mut child = spawn_floe(&job, &log);
    wait_caught_up(db, &f.client, &mut child, &log).await;

    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let load = {
        let session = db.session().await;
        let (stop, count) = (stop.clone(), count.clone());
        tokio::spawn(workload(session, rows, stop, count))
    };

    // The table is added: the job restarts with it and copies it while changes flow.
    terminate(child);
    edit_job(&job, "[\"public.scratch\", \"public.big\"]", "");
    let mut child = spawn_floe(&job, &log);
    let began = Instant::now();
    while pending_backfill(&f).await == "{}" {
        assert!(
            began.elapsed() < Duration::from_secs(120),
            "the copy never began"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Freshness of the other table while the copy runs: a change of `scratch` is committed
    // within two checkpoint intervals. Three probes, so that as much of the copy as possible
    // is left for the kills.
    const PROBES: usize = 3;
    let probe = db.session().await;
    let mut worst = Duration::ZERO;
    let mut probes = 0;
    while probes < PROBES && pending_backfill(&f).await != "{}" {
        probe
            .batch_execute("UPDATE scratch SET v = v + 1 WHERE k = 0")
            .await
            .unwrap();
        let target: String = probe
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await
            .unwrap()
            .get(0);
        let sent = Instant::now();
        loop {
            let positions = committed(&f.client, "app", "cdc").await;
            if positions
                .get("pg.lsn")
                .is_some_and(|l| lsn(l) >= lsn(&target))
            {
                break;
            }
            assert!(
                sent.elapsed() < Duration::from_secs(60),
                "scratch stopped landing"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!("scratch change committed after {:?}", sent.elapsed());
        worst = worst.max(sent.elapsed());
        probes += 1;
    }
    eprintln!("freshness of scratch during the copy: worst {worst:?} over {probes} probes");
    assert_eq!(
        probes, PROBES,
        "the copy ended before freshness could be measured; raise FLOE_ADD_TABLE_ROWS"
    );
    assert!(
        worst <= 2 * interval,
        "scratch lagged {worst:?}, more than two checkpoint intervals"
    );

    // Killed -9 while it copies, again and again; each life goes on from the last chunk. With
    // short checkpoints, a life ends either at a random instant (often before it commits) or
    // just after its first commit moved the copy on, so no life copies more than one short
    // checkpoint's worth however fast the copy runs: the kills land during the copy.
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace("interval = \"2s\"", "interval = \"300ms\"");
    std::fs::write(&job, text).unwrap();
    let mut killed_copying = 0;
    // Ten, the count the feature was specified with; FLOE_CHAOS_KILLS may ask for more (with
    // a larger FLOE_ADD_TABLE_ROWS).
    let wanted = std::env::var("FLOE_CHAOS_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
        .max(10);
    let mut rng = rand::rng();
    loop {
        assert!(
            child.try_wait().unwrap().is_none(),
            "floe stopped: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        let copying = pending_backfill(&f).await != "{}";
        child.kill().unwrap();
        child.wait().unwrap();
        killed_copying += usize::from(copying);
        child = spawn_floe(&job, &log);
        let at_start = pending_backfill(&f).await;
        if killed_copying >= wanted || at_start == "{}" {
            break;
        }
        let lived = Instant::now();
        if rng.random_bool(0.6) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(100..600))).await;
        } else {
            while pending_backfill(&f).await == at_start {
                assert!(
                    lived.elapsed() < Duration::from_secs(60),
                    "no chunk committed in a minute"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..100))).await;
        }
    }
    eprintln!("killed -9 {killed_copying} times while copying");
    assert!(
        killed_copying >= wanted,
        "the copy ended after {killed_copying} kills; raise FLOE_ADD_TABLE_ROWS"
    );
    wait_backfilled(&f, &mut child, &log).await;
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    wait_caught_up(db, &f.client, &mut child, &log).await;
    terminate(child);
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        log_text.contains("incremental snapshot complete"),
        "{log_text}"
    );
    eprintln!(
        "{} workload transactions; {}",
        count.load(Ordering::Relaxed),
        log_text
            .lines()
            .rfind(|l| l.contains("incremental snapshot complete"))
            .unwrap_or_default()
    );
    equal(&f, &[("scratch", "scratch"), ("big", "big")]).await;
    // Checkpoints that copied rows and also changed the table committed the copied files a
    // snapshot before their changes (that first snapshot carries no marker), so the changes'
    // equality deletes reached them: the path was taken, and the tables are still equal.
    let big = f
        .client
        .load_table(&iceberg::TableIdent::from_strs(["app", "big"]).unwrap())
        .await
        .unwrap();
    let first_files = big
        .metadata
        .snapshots()
        .filter(|s| {
            !s.summary()
                .additional_properties
                .contains_key(floe_lake::marker::JOB_ID)
        })
        .count();
    eprintln!("{first_files} snapshots of copied rows committed before their checkpoint's changes");
    assert!(
        first_files > 0,
        "no checkpoint mixed copied rows and changes"
    );
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn a_table_created_under_a_for_all_tables_publication_is_followed_from_its_first_row() {
    let _serial = SERIAL.lock().await;
    let f = Fixture::new("created").await;
    let db = &f.db;
    db.client
        .batch_execute(
            "CREATE TABLE scratch (k int PRIMARY KEY, v int);
             INSERT INTO scratch SELECT g, g FROM generate_series(0, 9) g;",
        )
        .await
        .unwrap();
    let job = job_file(&f.dir, db, &f.catalog.uri(), "replica_identity_full = true");
    let log = f.dir.join("floe.log");
    let mut child = spawn_floe(&job, &log);
    wait_caught_up(db, &f.client, &mut child, &log).await;
    // Created with rows in one transaction, then changed while the job follows it.
    db.client
        .batch_execute(
            "BEGIN;
             CREATE TABLE items (id int PRIMARY KEY, qty int, label text);
             INSERT INTO items SELECT g, g, 'item ' || g FROM generate_series(1, 120000) g;
             COMMIT;",
        )
        .await
        .unwrap();
    for round in 0..5 {
        db.client
            .batch_execute(&format!(
                "UPDATE items SET qty = qty + 1 WHERE id % 1000 = {round};
                 DELETE FROM items WHERE id % 997 = {round};
                 INSERT INTO items VALUES (200000 + {round}, 0, 'later');
                 UPDATE scratch SET v = v + 1;"
            ))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let began = Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("incremental snapshot complete table=public.items")
    {
        assert!(
            child.try_wait().unwrap().is_none(),
            "floe stopped: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(
            began.elapsed() < Duration::from_secs(180),
            "items was never copied"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_caught_up(db, &f.client, &mut child, &log).await;
    terminate(child);
    equal(&f, &[("scratch", "scratch"), ("items", "items")]).await;
    f.finish().await;
}
