//! The Postgres side of the CDC tests: a fresh database per test on the test cluster, the
//! job file that follows it, and the comparison of every table in Postgres with what DuckDB
//! reads from Iceberg (`EXCEPT ALL` both ways).

use std::path::{Path, PathBuf};
use std::process::Child;
use std::str::FromStr;
use std::time::{Duration, Instant};

use floe_lake::rest::CatalogClient;
use futures::StreamExt;

use super::{
    PgAddress, committed, pg_connect, python, service, slot_confirmed, start_catalog, temp_dir,
};

/// One text line per row, the same in Postgres and DuckDB (NULL = ∅).
pub(crate) fn canonical(table: &str, duckdb: bool) -> String {
    let c = |pg: &str, duck: &str| format!("coalesce(({}), '∅')", if duckdb { duck } else { pg });
    let cols: Vec<String> = match table {
        "accounts" => vec![
            c("id::text", "id::varchar"),
            c("owner", "owner"),
            c("balance::text", "balance::varchar"),
            c("md5(note)", "md5(note)"),
            c(
                "array_to_string(tags, ',', '∅')",
                "array_to_string(list_transform(tags, x -> coalesce(x, '∅')), ',')",
            ),
            c(
                "array_to_string(scores, ',')",
                "array_to_string(scores, ',')",
            ),
            c("opened::text", "opened::varchar"),
            c(
                "(extract(epoch from seen) * 1000000)::bigint::text",
                "epoch_us(seen)::varchar",
            ),
            c(
                "(extract(epoch from local_ts) * 1000000)::bigint::text",
                "epoch_us(local_ts)::varchar",
            ),
            c(
                "(extract(epoch from at_time) * 1000000)::bigint::text",
                "round(extract(epoch FROM at_time) * 1000000)::bigint::varchar",
            ),
            c("flag::text", "flag::varchar"),
            c("u::text", "u::varchar"),
            c("encode(blob, 'hex')", "lower(hex(blob))"),
            c("(ratio * 4)::bigint::text", "(ratio * 4)::bigint::varchar"),
            c("small::text", "small::varchar"),
            c("(f4 * 4)::int::text", "(f4 * 4)::int::varchar"),
            c("doc::text", "doc"),
            c("feeling::text", "feeling"),
            c("code", "code"),
        ],
        "wallets" => vec![
            c("id::text", "id::varchar"),
            c("balance::text", "balance::varchar"),
        ],
        "ledger" => vec![
            c("id::text", "id::varchar"),
            c("wallet_id::text", "wallet_id::varchar"),
            c("amount::text", "amount::varchar"),
        ],
        "scratch" => vec![c("k::text", "k::varchar"), c("v::text", "v::varchar")],
        "orders" => vec![c("id::text", "id::varchar"), c("note", "note")],
        "items" => vec![
            c("id::text", "id::varchar"),
            c("qty::text", "qty::varchar"),
            c("label", "label"),
        ],
        "big" => vec![
            c("id::text", "id::varchar"),
            c("v::text", "v::varchar"),
            c("label", "label"),
        ],
        other => panic!("no canonical form for {other}"),
    };
    cols.join(" || '|' || ")
}

/// A fresh database on the test cluster, and how to reach it.
pub(crate) struct Database {
    pub(crate) admin: tokio_postgres::Client,
    pub(crate) name: String,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) user: String,
    pub(crate) client: tokio_postgres::Client,
}

impl Database {
    pub(crate) async fn create(url: &str, tag: &str) -> Self {
        let mut config = tokio_postgres::Config::from_str(url).unwrap();
        let admin = pg_connect(&config).await;
        let name = format!("{tag}_{}", uuid::Uuid::new_v4().simple());
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        config.dbname(&name);
        let PgAddress { host, port, user } = PgAddress::of(&config);
        Self {
            host,
            port,
            user,
            client: pg_connect(&config).await,
            admin,
            name,
        }
    }

    /// Drops the database and its replication slots (slots outlive a database's sessions and
    /// count against the cluster's `max_replication_slots`).
    pub(crate) async fn remove(self) {
        self.admin
            .execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE database = $1 AND NOT active",
                &[&self.name],
            )
            .await
            .unwrap();
        drop(self.client);
        self.admin
            .batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .await
            .unwrap();
    }

    /// The job files' slot.
    pub(crate) fn slot(&self) -> String {
        format!("floe_{}", self.name)
    }

    pub(crate) async fn data_directory(&self) -> String {
        self.admin
            .query_one("SHOW data_directory", &[])
            .await
            .unwrap()
            .get(0)
    }

    pub(crate) async fn session(&self) -> tokio_postgres::Client {
        let mut config = tokio_postgres::Config::new();
        config
            .host(&self.host)
            .port(self.port)
            .user(&self.user)
            .dbname(&self.name);
        pg_connect(&config).await
    }

    /// The rows of `table` in canonical form, one per line, into `file`.
    pub(crate) async fn export(&self, table: &str, file: &Path) -> usize {
        let stream = self
            .client
            .copy_out(&format!(
                "COPY (SELECT {} FROM {table}) TO STDOUT",
                canonical(table.rsplit('.').next().unwrap_or(table), false)
            ))
            .await
            .unwrap();
        futures::pin_mut!(stream);
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            out.extend_from_slice(&chunk.unwrap());
        }
        std::fs::write(file, &out).unwrap();
        out.iter().filter(|b| **b == b'\n').count()
    }

    pub(crate) async fn wal_lsn(&self) -> String {
        self.client
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await
            .unwrap()
            .get(0)
    }

    /// Whether the slot has confirmed everything up to `lsn`.
    pub(crate) async fn slot_reached(&self, slot: &str, lsn: &str) -> bool {
        slot_confirmed(&self.client, slot, lsn).await
    }
}

pub(crate) fn job_file(dir: &Path, db: &Database, catalog: &str, extra: &str) -> PathBuf {
    let path = dir.join("job.toml");
    std::fs::write(
        &path,
        format!(
            "version = 1\nname = \"cdc\"\n\n[source.postgres]\nhost = \"{}\"\nport = {}\n\
             user = \"{}\"\ndatabase = \"{}\"\nslot = \"floe_{}\"\n{extra}\n\n\
             [catalog]\nuri = \"{catalog}\"\nnamespace = \"app\"\n\n\
             [checkpoint]\ninterval = \"1s\"\nstate_dir = \"{}\"\n",
            db.host,
            db.port,
            db.user,
            db.name,
            db.name,
            dir.join("state").display()
        ),
    )
    .unwrap();
    path
}

/// Compares each table in Postgres and in Iceberg (DuckDB): returns `(rows, missing,
/// unexpected)` per table — the EXCEPT both ways.
pub(crate) async fn compare(
    db: &Database,
    client: &CatalogClient,
    dir: &Path,
    tables: &[&str],
) -> Vec<(String, u64, u64, u64)> {
    let pairs: Vec<(&str, &str)> = tables.iter().map(|t| (*t, *t)).collect();
    compare_as(db, client, dir, &pairs).await
}

/// [`compare`] for Postgres tables (`schema.table` outside `public`) that land in Iceberg
/// tables of other names: `(postgres, iceberg)` pairs.
pub(crate) async fn compare_as(
    db: &Database,
    client: &CatalogClient,
    dir: &Path,
    tables: &[(&str, &str)],
) -> Vec<(String, u64, u64, u64)> {
    differences(db, client, dir, tables)
        .await
        .into_iter()
        .map(|(table, rows, missing, unexpected, iceberg_rows)| {
            assert_eq!(
                rows,
                iceberg_rows,
                "{table}: same number of rows ({missing} missing, {unexpected} unexpected; \
                 samples in {})",
                dir.join(format!("{table}.diff")).display()
            );
            (table, rows, missing, unexpected)
        })
        .collect()
}

/// Per table: rows in Postgres, rows missing from Iceberg, rows only in Iceberg, rows in
/// Iceberg — without asserting anything (a test that expects a difference). Up to 50 rows of
/// each difference are written to `dir/<table>.diff`.
pub(crate) async fn differences(
    db: &Database,
    client: &CatalogClient,
    dir: &Path,
    tables: &[(&str, &str)],
) -> Vec<(String, u64, u64, u64, u64)> {
    let mut script = String::from(
        "import duckdb_offline\ncon = duckdb_offline.connect()\n\
         def one(q): return con.sql(q).fetchone()[0]\n",
    );
    for (table, iceberg) in tables {
        let file = dir.join(format!("{table}.pg"));
        db.export(table, &file).await;
        let location = super::metadata_location(client, "app", iceberg).await;
        script.push_str(&format!(
            "con.sql(\"CREATE OR REPLACE TABLE pg AS SELECT r FROM read_csv('{}', header=false, \
             columns={{'r': 'VARCHAR'}}, delim='\\x01', quote='', escape='')\")\n\
             con.sql(\"CREATE OR REPLACE TABLE ice AS SELECT {} AS r FROM iceberg_scan('{location}')\")\n\
             print('{table}', one('SELECT count(*) FROM pg'), one('SELECT count(*) FROM (SELECT r FROM pg EXCEPT ALL SELECT r FROM ice)'), \
             one('SELECT count(*) FROM (SELECT r FROM ice EXCEPT ALL SELECT r FROM pg)'), one('SELECT count(*) FROM ice'))\n\
             con.sql(\"COPY (SELECT * FROM (SELECT 'missing' AS side, r FROM (SELECT r FROM pg EXCEPT ALL SELECT r FROM ice) LIMIT 50) \
             UNION ALL SELECT * FROM (SELECT 'unexpected', r FROM (SELECT r FROM ice EXCEPT ALL SELECT r FROM pg) LIMIT 50)) TO '{}' (HEADER false)\")\n",
            file.display(),
            canonical(table.rsplit('.').next().unwrap_or(table), true).replace('"', "\\\""),
            dir.join(format!("{table}.diff")).display(),
        ));
    }
    python(&script)
        .lines()
        .map(|line| {
            let v: Vec<&str> = line.split_whitespace().collect();
            let n = |i: usize| v[i].parse::<u64>().unwrap();
            (v[0].to_string(), n(1), n(2), n(3), n(4))
        })
        .collect()
}

/// Waits until the job's initial snapshot is committed and its slot has confirmed everything
/// written so far (a slot created after `target` confirms it at once); fails if `child` (the
/// job) exits first. The snapshot counts as committed once the job's marker holds an LSN: a
/// kill between that commit and its log line leaves no line, yet later runs stream on.
pub(crate) async fn wait_caught_up(
    db: &Database,
    client: &CatalogClient,
    child: &mut Child,
    log: &Path,
) {
    let target = db.wal_lsn().await;
    let began = Instant::now();
    while !(committed(client, "app", "cdc").await.contains_key("pg.lsn")
        && db.slot_reached(&db.slot(), &target).await)
    {
        let log_text = || std::fs::read_to_string(log).unwrap_or_default();
        assert!(
            child.try_wait().unwrap().is_none(),
            "floe stopped: {}",
            log_text()
        );
        assert!(
            began.elapsed() < Duration::from_secs(240),
            "the job did not catch up: {}",
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A catalog in this process, a fresh database, a temp dir.
pub(crate) struct Fixture {
    pub(crate) dir: PathBuf,
    pub(crate) catalog: floe_catalog::RunningCatalog,
    pub(crate) client: CatalogClient,
    pub(crate) db: Database,
}

impl Fixture {
    pub(crate) async fn new(tag: &str) -> Self {
        let url = service("FLOE_TEST_PG_URL");
        service("FLOE_TEST_PYTHON");
        let dir = temp_dir(&format!("pg-{tag}"));
        let (catalog, client) = start_catalog(&dir).await;
        let db = Database::create(&url, tag).await;
        Self {
            dir,
            catalog,
            client,
            db,
        }
    }

    pub(crate) async fn finish(self) {
        self.db.remove().await;
        self.catalog.stop().await.unwrap();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
