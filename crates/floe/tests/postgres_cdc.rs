//! The Postgres CDC job against a real PostgreSQL 15 and a real floe-catalog:
//!
//! * **chaos** — a random workload (inserts, updates of every mapped type, key changes,
//!   deletes, NULLs, large TOASTed text left unchanged by later updates, TRUNCATE, and
//!   transactions spanning two tables) runs while `floe run` is killed -9 at random instants,
//!   the first kills landing in the initial snapshot; afterwards the Iceberg tables read by
//!   DuckDB equal the Postgres tables (EXCEPT both ways is empty), and every committed
//!   snapshot of the two-table pair shows whole transactions only (an invariant summed over
//!   both tables, at every checkpoint);
//! * **snapshot boundary** — a 1,000,000-row table copied while changes keep coming: no gap
//!   and no duplicate where the copy ends and the stream begins;
//! * **bad input** — a table without a primary key and a column of an unsupported type stop
//!   the job at start with errors naming them.
//!
//! Needs `FLOE_TEST_PG_URL` and `FLOE_TEST_PYTHON` (from `tests/services/up`): the
//! tests are ignored without `--include-ignored`, which `tests/run` passes. `FLOE_CHAOS_KILLS` sets the number of kills
//! (default 20).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floe_lake::marker::CommitMarker;
use floe_lake::rest::CatalogClient;
use iceberg::{NamespaceIdent, TableIdent};
use rand::Rng;

mod support;
use support::metadata_location;
use support::pg::{Fixture, compare, job_file, wait_caught_up};
use support::{free_port, http_get, http_request, kills, python, spawn_floe, terminate};

const SCHEMA: &str = "
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE SEQUENCE ids START 1000000;
CREATE TABLE accounts (
  id bigint PRIMARY KEY, owner text, balance numeric(12,2), note text, tags text[], scores int[],
  opened date, seen timestamptz, local_ts timestamp, at_time time, flag boolean, u uuid,
  blob bytea, ratio double precision, small smallint, f4 real, doc jsonb, feeling mood,
  code varchar(8));
CREATE TABLE wallets (id int PRIMARY KEY, balance numeric(14,2) NOT NULL);
CREATE TABLE ledger (id bigint PRIMARY KEY, wallet_id int NOT NULL, amount numeric(14,2) NOT NULL);
CREATE TABLE scratch (k int PRIMARY KEY, v int);
";

/// A new account row's values, computed by the server (`$1` = id).
const ACCOUNT_VALUES: &str = "
  $1, 'owner ' || $1, round((random() * 1000)::numeric, 2),
  CASE WHEN random() < 0.3 THEN (SELECT string_agg(md5(random()::text || g), '') FROM generate_series(1, 200) g)
       WHEN random() < 0.5 THEN NULL ELSE 'short note' END,
  CASE WHEN random() < 0.2 THEN NULL ELSE ARRAY['a', NULL, 'c,d', 'say \"hi\"'] END,
  ARRAY[1, ($1 % 7)::int], DATE '2020-01-01' + (random() * 1000)::int,
  now() - random() * interval '1000 days', localtimestamp(3), TIME '12:34:56.5' + random() * interval '1 hour',
  random() < 0.5, gen_random_uuid(), decode(md5(random()::text), 'hex'),
  floor(random() * 400) / 4, ($1 % 100)::smallint, 1.25, jsonb_build_object('k', $1, 'arr', jsonb_build_array(1, 'two')),
  (ARRAY['sad', 'ok', 'happy'])[1 + ($1 % 3)::int]::mood, 'c' || ($1 % 1000)";

/// Every committed checkpoint that touched `ledger` also touched `wallets` in the same
/// checkpoint, and at each `sum(wallets.balance) + sum(ledger.amount)` is the initial total:
/// no snapshot shows part of a transfer.
async fn check_whole_transactions(client: &CatalogClient, total: &str) -> usize {
    let ident = |name: &str| TableIdent::new(NamespaceIdent::new("app".into()), name.into());
    let wallets = client.load_table(&ident("wallets")).await.unwrap();
    let ledger = client.load_table(&ident("ledger")).await.unwrap();
    let markers = |t: &floe_lake::rest::LoadedTable| -> Vec<((Option<String>, u64), i64)> {
        t.metadata
            .snapshots()
            .filter_map(|s| {
                CommitMarker::from_properties(&s.summary().additional_properties)
                    .map(|m| ((m.writer, m.checkpoint_id), s.snapshot_id()))
            })
            .collect()
    };
    let wallet_snapshots = markers(&wallets);
    let mut pairs = Vec::new();
    for (marker, ledger_snapshot) in markers(&ledger) {
        let wallet_snapshot = wallet_snapshots
            .iter()
            .find(|(m, _)| *m == marker)
            .map(|(_, s)| *s)
            .unwrap_or_else(|| panic!("checkpoint {marker:?} committed ledger without wallets"));
        pairs.push((wallet_snapshot, ledger_snapshot));
    }
    let (w, l) = (
        wallets.metadata_location.unwrap(),
        ledger.metadata_location.unwrap(),
    );
    let mut script = String::from(
        "import duckdb_offline\ncon = duckdb_offline.connect()\n\
         def one(q): return con.sql(q).fetchone()[0]\n",
    );
    for (ws, ls) in &pairs {
        script.push_str(&format!(
            "print(one(\"SELECT (SELECT coalesce(sum(balance), 0) FROM iceberg_scan('{w}', snapshot_from_id={ws})) + \
             (SELECT coalesce(sum(amount), 0) FROM iceberg_scan('{l}', snapshot_from_id={ls}))\"))\n"
        ));
    }
    let sums = python(&script);
    for (line, pair) in sums.lines().zip(&pairs) {
        assert_eq!(
            line.trim().parse::<f64>().unwrap(),
            total.parse::<f64>().unwrap(),
            "snapshots {pair:?} show part of a transfer"
        );
    }
    pairs.len()
}

/// Random transactions until `stop`; returns how many committed.
async fn workload(session: tokio_postgres::Client, stop: Arc<AtomicBool>, count: Arc<AtomicU64>) {
    // One nextval per row, so `currval` is the new row's id.
    let insert = format!(
        "INSERT INTO accounts SELECT {} FROM (SELECT nextval('ids') AS n) s",
        ACCOUNT_VALUES.replace("$1", "n")
    );
    let random_id = "(SELECT id FROM accounts TABLESAMPLE SYSTEM (5) LIMIT 1)";
    while !stop.load(Ordering::Relaxed) {
        let op = rand::rng().random_range(0..100);
        let amount = format!(
            "{}.{:02}",
            rand::rng().random_range(1..50),
            rand::rng().random_range(0..100)
        );
        let wallet = rand::rng().random_range(1..=20);
        let sql = match op {
            0..=19 => insert.clone(),
            20..=34 => format!(
                "UPDATE accounts SET balance = balance + 1, flag = NOT flag WHERE id = {random_id}"
            ),
            35..=41 => format!(
                "UPDATE accounts SET note = (SELECT string_agg(md5(random()::text || g), '') \
                 FROM generate_series(1, 150) g) WHERE id = {random_id}"
            ),
            42..=47 => format!(
                "UPDATE accounts SET owner = NULL, tags = NULL, doc = NULL, seen = NULL \
                 WHERE id = {random_id}"
            ),
            48..=55 => format!("DELETE FROM accounts WHERE id = {random_id}"),
            56..=61 => format!("UPDATE accounts SET id = nextval('ids') WHERE id = {random_id}"),
            62..=84 => format!(
                "BEGIN; UPDATE wallets SET balance = balance - {amount} WHERE id = {wallet}; \
                 INSERT INTO ledger VALUES (nextval('ids'), {wallet}, {amount}); COMMIT"
            ),
            85..=92 => {
                // Insert, update and delete of fresh keys in one transaction, plus an update
                // that leaves a TOASTed note unchanged.
                let id = "currval('ids')";
                format!(
                    "BEGIN; {insert}; UPDATE accounts SET small = 7 WHERE id = {id}; \
                     {insert}; DELETE FROM accounts WHERE id = {id}; \
                     UPDATE accounts SET code = 'toast' WHERE id = {random_id}; COMMIT"
                )
            }
            93..=97 => format!(
                "UPDATE scratch SET v = v + 1 WHERE k = {}",
                rand::rng().random_range(0..10)
            ),
            _ => "BEGIN; TRUNCATE scratch; INSERT INTO scratch SELECT g, g * 10 FROM \
                  generate_series(0, 9) g; COMMIT"
                .to_string(),
        };
        if session.batch_execute(&sql).await.is_ok() {
            count.fetch_add(1, Ordering::Relaxed);
        } else {
            let _ = session.batch_execute("ROLLBACK").await;
        }
        let pause = rand::rng().random_range(0..15);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// The kill -9 test and the million-row test run one at a time: the first checks that killed
/// jobs had time to commit, which the other's load on the same two cores can starve.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn postgres_changes_land_exactly_once_through_kill_9() {
    let _one_at_a_time = SERIAL.lock().await;
    let f = Fixture::new("chaos").await;
    let Fixture {
        dir, client, db, ..
    } = &f;
    db.client.batch_execute(SCHEMA).await.unwrap();
    db.client
        .batch_execute(&format!(
            "INSERT INTO accounts SELECT {} FROM generate_series(1, 3000) AS s(id);
             INSERT INTO wallets SELECT g, 1000 FROM generate_series(1, 20) g;
             INSERT INTO scratch SELECT g, g FROM generate_series(0, 9) g;",
            ACCOUNT_VALUES.replace("$1", "id")
        ))
        .await
        .unwrap();
    let total = "20000";
    let job = job_file(dir, db, &f.catalog.uri(), "replica_identity_full = true");
    let log = dir.join("floe.log");

    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let load = tokio::spawn(workload(db.session().await, stop.clone(), count.clone()));
    let kills = kills();
    for round in 0..kills {
        let mut child = spawn_floe(&job, &log);
        // The first rounds die early, some inside the initial snapshot.
        let life = if round < 3 {
            rand::rng().random_range(50..600)
        } else {
            rand::rng().random_range(300..3000)
        };
        tokio::time::sleep(Duration::from_millis(life)).await;
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    let mut child = spawn_floe(&job, &log);
    wait_caught_up(db, client, &mut child, &log).await;
    terminate(child);

    let tables = ["accounts", "wallets", "ledger", "scratch"];
    for (table, rows, missing, unexpected) in compare(db, client, dir, &tables).await {
        assert_eq!(
            (missing, unexpected),
            (0, 0),
            "{table}: {rows} rows in Postgres, {missing} missing from Iceberg, {unexpected} \
             not in Postgres"
        );
        assert!(rows > 0, "{table} has rows");
    }
    let checkpoints = check_whole_transactions(client, total).await;
    assert!(
        checkpoints >= kills / 3,
        "checkpoints were committed across the kills ({checkpoints})"
    );
    eprintln!(
        "chaos: {kills} kills, {} transactions, {checkpoints} two-table checkpoints whole; \
         DuckDB equals Postgres on {tables:?}",
        count.load(Ordering::Relaxed)
    );
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn a_million_row_snapshot_meets_the_stream_without_gap_or_duplicate() {
    let _one_at_a_time = SERIAL.lock().await;
    let f = Fixture::new("boundary").await;
    let Fixture {
        dir, client, db, ..
    } = &f;
    db.client
        .batch_execute(
            "CREATE TABLE big (id bigint PRIMARY KEY, v int NOT NULL, label varchar(20));
             INSERT INTO big SELECT g, 0, 'row ' || g FROM generate_series(1, 1000000) g;",
        )
        .await
        .unwrap();
    let job = job_file(dir, db, &f.catalog.uri(), "");
    let log = dir.join("floe.log");
    let mut child = spawn_floe(&job, &log);
    // Changes while the copy runs and after: updates across the key range, inserts after it,
    // deletes.
    let session = db.session().await;
    let began = Instant::now();
    let mut changes = 0;
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("initial snapshot committed")
        || changes < 200
    {
        assert!(
            began.elapsed() < Duration::from_secs(300),
            "snapshot too slow"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "floe stopped: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        let id = rand::rng().random_range(1..=1_000_000);
        session
            .batch_execute(&format!(
                "UPDATE big SET v = v + 1 WHERE id = {id};
                 INSERT INTO big VALUES ({}, 1, 'new');
                 DELETE FROM big WHERE id = {};",
                1_000_000 + changes + 1,
                rand::rng().random_range(1..=1_000_000)
            ))
            .await
            .unwrap();
        changes += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    wait_caught_up(db, client, &mut child, &log).await;
    terminate(child);
    let result = compare(db, client, dir, &["big"]).await;
    let (_, rows, missing, unexpected) = &result[0];
    assert_eq!(
        (*missing, *unexpected),
        (0, 0),
        "{rows} rows: {missing} missing, {unexpected} unexpected"
    );
    eprintln!(
        "boundary: {rows} rows equal after {changes} rounds of changes during and after the copy"
    );
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn added_columns_and_broken_sessions_are_followed_and_a_type_change_stops_the_job() {
    let f = Fixture::new("schema").await;
    let Fixture {
        dir, client, db, ..
    } = &f;
    db.client
        .batch_execute(
            "CREATE TABLE items (id int PRIMARY KEY, qty int);
             INSERT INTO items SELECT g, g FROM generate_series(1, 100) g;",
        )
        .await
        .unwrap();
    let job = job_file(dir, db, &f.catalog.uri(), "");
    let metrics_port = free_port();
    let text = std::fs::read_to_string(&job).unwrap();
    std::fs::write(
        &job,
        format!("{text}\n[metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n"),
    )
    .unwrap();
    let log = dir.join("floe.log");
    let mut child = spawn_floe(&job, &log);
    let slot = db.slot();
    let wait_for = |what: &'static str| {
        let log = log.clone();
        async move {
            let began = Instant::now();
            while !std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains(what)
            {
                assert!(
                    began.elapsed() < Duration::from_secs(60),
                    "no {what:?} in the log"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    wait_for("initial snapshot committed").await;
    let first_page = http_request(metrics_port, "/");
    // The walsender is terminated three times while changes come in.
    for round in 0..3 {
        db.client
            .batch_execute(&format!(
                "UPDATE items SET qty = qty + 1 WHERE id % 3 = {round};
                 INSERT INTO items VALUES ({}, 0);
                 DELETE FROM items WHERE id = {};",
                200 + round,
                10 + round
            ))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        db.client
            .batch_execute(&format!(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                 WHERE slot_name = '{slot}' AND active_pid IS NOT NULL"
            ))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    // A column is added and filled.
    db.client
        .batch_execute(
            "ALTER TABLE items ADD COLUMN label varchar(20);
             UPDATE items SET label = 'item ' || id WHERE id <= 20;
             INSERT INTO items VALUES (300, 3, 'new');",
        )
        .await
        .unwrap();
    wait_caught_up(db, client, &mut child, &log).await;
    let began = Instant::now();
    let (_, rows, missing, unexpected) = compare(db, client, dir, &["items"]).await.remove(0);
    assert_eq!((missing, unexpected), (0, 0), "{rows} rows");
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("replication session lost; reconnecting"),
        "the job reconnected"
    );
    // The status page: what the job did, moving on as it works, and nothing from elsewhere.
    let (status, page) = http_request(metrics_port, "/");
    assert_eq!((first_page.0, status), (200, 200));
    let checkpoints = |page: &str| -> u64 {
        let at = page
            .find("</b>checkpoints</div>")
            .expect("a checkpoints tile");
        let start = page[..at].rfind("<b>").unwrap() + 3;
        page[start..at].replace(',', "").parse().unwrap()
    };
    assert!(
        checkpoints(&page) > checkpoints(&first_page.1),
        "the page moved on:\n{page}"
    );
    for shown in [
        "<h2>Pipeline</h2>",
        "<td>items</td>",
        "<td>committed</td>",
        "<svg",
    ] {
        assert!(page.contains(shown), "no {shown} in\n{page}");
    }
    for elsewhere in ["http://", "https://", "src=", "@import"] {
        assert!(!page.contains(elsewhere), "{elsewhere} in\n{page}");
    }
    // The probes a deployment uses: alive, and ready (it recovered and reads).
    assert_eq!(http_request(metrics_port, "/healthz"), (200, "ok\n".into()));
    assert_eq!(
        http_request(metrics_port, "/readyz"),
        (200, "ready\n".into())
    );
    // The slot's health is served with the job's metrics.
    let metrics = http_get(metrics_port, "/metrics");
    for name in [
        "floe_source_status{measure=\"postgres_slot_retained_wal_bytes\"}",
        "floe_source_status{measure=\"postgres_slot_lag_bytes\"}",
        "floe_source_status{measure=\"postgres_slot_active\"} 1",
        "floe_rows_total{table=\"items\"}",
    ] {
        assert!(metrics.contains(name), "no {name} in\n{metrics}");
    }

    // A type change cannot be followed: the job stops, naming it, and commits nothing after.
    db.client
        .batch_execute(
            "ALTER TABLE items ALTER COLUMN qty TYPE bigint;
             UPDATE items SET qty = 1000 WHERE id = 1;",
        )
        .await
        .unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            began.elapsed() < Duration::from_secs(180),
            "the job did not stop"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(!status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("column qty of public.items changed type"),
        "{text}"
    );
    let (_, _, missing, _) = compare(db, client, dir, &["items"]).await.remove(0);
    assert_eq!(
        missing, 1,
        "the row changed after the type change is not in Iceberg"
    );
    assert!(
        !db.slot_reached(&slot, &db.wal_lsn().await).await,
        "the slot still holds the change"
    );
    f.finish().await;
}

/// Runs `openssl` with `args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`{name}.crt`, `{name}.key`) in `dir`.
fn certificate_authority(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn tls_sessions_verify_the_server_certificate() {
    let f = Fixture::new("tls").await;
    let Fixture {
        dir, client, db, ..
    } = &f;
    // A CA, a server certificate for 127.0.0.1 signed by it, and an unrelated CA.
    certificate_authority(dir, "ca");
    certificate_authority(dir, "other");
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            "server.crt",
        ],
    );
    // The server writes the files itself (owned by its user, mode 0600), then turns TLS on.
    for (file, target) in [
        ("server.crt", "floe_test_server.crt"),
        ("server.key", "floe_test_server.key"),
    ] {
        let pem = std::fs::read_to_string(dir.join(file)).unwrap();
        // COPY takes no parameters; a PEM holds no `$`, so it fits a dollar-quoted literal.
        assert!(!pem.contains('$'));
        db.admin
            .batch_execute(&format!(
                "COPY (SELECT line FROM unnest(string_to_array(rtrim($pem${pem}$pem$, E'\\n'), \
                 E'\\n')) AS line) TO '{}'",
                db.data_directory().await + "/" + target
            ))
            .await
            .unwrap_or_else(|e| panic!("writing {target}: {e}"));
    }
    // The server refuses a key others may read; COPY wrote it 0644 (the test runs as root or
    // as the server's user, so it may change that).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        Path::new(&db.data_directory().await).join("floe_test_server.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    // One statement per call: ALTER SYSTEM refuses a multi-statement (implicit) transaction.
    for sql in [
        "ALTER SYSTEM SET ssl_cert_file = 'floe_test_server.crt'",
        "ALTER SYSTEM SET ssl_key_file = 'floe_test_server.key'",
        "ALTER SYSTEM SET ssl = on",
        "SELECT pg_reload_conf()",
    ] {
        db.admin.batch_execute(sql).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    db.client
        .batch_execute(
            "CREATE TABLE notes (id int PRIMARY KEY, body varchar(100));
             INSERT INTO notes SELECT g, 'note ' || g FROM generate_series(1, 500) g;",
        )
        .await
        .unwrap();

    // The wrong CA: refused before anything is read.
    let wrong = job_file(
        dir,
        db,
        &f.catalog.uri(),
        &format!(
            "ssl_mode = \"verify-full\"\nssl_root_cert = \"{}\"",
            dir.join("other.crt").display()
        ),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_floe"))
        .args(["run", wrong.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.to_lowercase().contains("certificate"), "{stderr}");

    // The right CA: every session of the job is encrypted.
    let job = job_file(
        dir,
        db,
        &f.catalog.uri(),
        &format!(
            "ssl_mode = \"verify-full\"\nssl_root_cert = \"{}\"",
            dir.join("ca.crt").display()
        ),
    );
    // verify-full checks the name the job connects to: a host name (the replication client
    // accepts no IP address there).
    let text = std::fs::read_to_string(&job).unwrap();
    std::fs::write(
        &job,
        text.replace("host = \"127.0.0.1\"", "host = \"localhost\""),
    )
    .unwrap();
    let log = dir.join("floe.log");
    let mut child = spawn_floe(&job, &log);
    let began = Instant::now();
    loop {
        assert!(
            child.try_wait().unwrap().is_none(),
            "floe stopped: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(began.elapsed() < Duration::from_secs(60), "not streaming");
        let row = db
            .admin
            .query_one(
                "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl), \
                   count(*) FILTER (WHERE a.backend_type = 'walsender' AND s.ssl) \
                 FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
                 WHERE a.application_name = 'floe' AND a.datname = $1",
                &[&db.name],
            )
            .await
            .unwrap();
        let (tls, plain, walsenders): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
        // Streaming (the copy committed), so the walsender is the one that stays.
        let streaming = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("initial snapshot committed");
        if walsenders == 1 && streaming {
            assert_eq!(plain, 0, "a session without TLS");
            assert!(tls >= 2, "the catalog session and the walsender use TLS");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    db.client
        .batch_execute("UPDATE notes SET body = 'changed' WHERE id <= 10")
        .await
        .unwrap();
    wait_caught_up(db, client, &mut child, &log).await;
    terminate(child);
    let location = metadata_location(client, "app", "notes").await;
    let out = python(&format!(
        "import duckdb_offline\ncon = duckdb_offline.connect()\n\
         print(*con.sql(\"SELECT count(*), count(*) FILTER (WHERE body = 'changed') FROM iceberg_scan('{location}')\").fetchone())"
    ));
    assert_eq!(out.trim(), "500 10");
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn tables_floe_cannot_follow_are_refused_by_name() {
    let f = Fixture::new("refuse").await;
    let Fixture { dir, db, .. } = &f;
    db.client
        .batch_execute(
            "CREATE TABLE keyless (a int, b text);
             CREATE TABLE searchable (id int PRIMARY KEY, doc tsvector);
             CREATE TABLE toasty (id int PRIMARY KEY, body text);",
        )
        .await
        .unwrap();
    let job = job_file(dir, db, &f.catalog.uri(), "");
    let out = Command::new(env!("CARGO_BIN_EXE_floe"))
        .args(["run", job.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("table public.keyless has no primary key"),
        "{stderr}"
    );
    assert!(
        stderr.contains("table public.searchable, column doc: type tsvector is not supported"),
        "{stderr}"
    );
    assert!(
        stderr.contains("ALTER TABLE public.toasty REPLICA IDENTITY FULL"),
        "{stderr}"
    );
    f.finish().await;
}

/// A slot has one reader: a second replica of a running CDC job is refused with the reason,
/// and the first goes on undisturbed (issue 18).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn a_second_replica_of_a_cdc_job_is_refused_while_the_first_streams() {
    let f = Fixture::new("replica2").await;
    let Fixture {
        dir, client, db, ..
    } = &f;
    db.client
        .batch_execute(
            "CREATE TABLE scratch (k int PRIMARY KEY, v int);
             INSERT INTO scratch SELECT g, g FROM generate_series(1, 100) g;",
        )
        .await
        .unwrap();
    let job = job_file(dir, db, &f.catalog.uri(), "");
    let log = dir.join("floe.log");
    let mut first = spawn_floe(&job, &log);
    wait_caught_up(db, client, &mut first, &log).await;

    let second_log = dir.join("second.log");
    let mut second = spawn_floe(&job, &second_log);
    let began = Instant::now();
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break status;
        }
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "the second replica was not refused: {}",
            std::fs::read_to_string(&second_log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let refused = std::fs::read_to_string(&second_log).unwrap();
    assert!(!status.success(), "the second replica must fail");
    assert!(
        refused.contains("is being read by another session")
            && refused.contains("runs as one replica"),
        "{refused}"
    );

    db.client
        .batch_execute(
            "UPDATE scratch SET v = v + 1 WHERE k <= 50; DELETE FROM scratch WHERE k > 90;
             INSERT INTO scratch VALUES (1000, 1);",
        )
        .await
        .unwrap();
    wait_caught_up(db, client, &mut first, &log).await;
    for (table, rows, missing, unexpected) in compare(db, client, dir, &["scratch"]).await {
        assert_eq!((missing, unexpected), (0, 0), "{table}: {rows} rows");
    }
    terminate(first);
    f.finish().await;
}
