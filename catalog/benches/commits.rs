//! Commit throughput and latency of floe-catalog over HTTP.
//!
//! `cargo bench -p floe-catalog --bench commits` — for each store (SQLite always; Postgres when
//! `FLOE_TEST_PG_URL` is set, as `tests/services/up` exports it) and for 1, 8 and 32 concurrent
//! clients, on distinct tables and on one hot table, clients commit snapshots for a fixed time
//! the way a writer does (load, commit with `assert-ref-snapshot-id`, on 409 reload and retry).
//! Reported: successful commits/s, p50/p99 latency of a successful commit (including the
//! retries it needed), and conflicts.
//!
//! The baseline, measured in the same run on the same store: the bare pointer swap
//! (`CatalogStore::swap_pointers`, no HTTP, no metadata file), i.e. what the database alone
//! allows. `ratio` = catalog commits/s ÷ bare swaps/s at the same concurrency.
//!
//! `FLOE_BENCH_SECONDS` sets the duration of each cell (default 5).

use std::sync::Arc;
use std::time::{Duration, Instant};

use floe_catalog::config::{CatalogConfig, Overrides};
use floe_catalog::ident::{Namespace, TableName};
use floe_catalog::store::PointerSwap;
use serde_json::{Value, json};

fn seconds() -> Duration {
    Duration::from_secs_f64(
        std::env::var("FLOE_BENCH_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(5.0),
    )
}

fn config(store: &str, dir: &std::path::Path) -> CatalogConfig {
    CatalogConfig::from_toml(
        None,
        "max_db_connections = 40",
        &Overrides {
            name: Some(format!(
                "bench{}",
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            )),
            listen: Some("127.0.0.1:0".into()),
            warehouse: Some(format!("file://{}", dir.join("warehouse").display())),
            store: Some(store.to_string()),
            allow_anonymous: false,
        },
    )
    .expect("bench config")
}

#[path = "../tests/common/mod.rs"]
mod common;

/// A writer's commit: one more snapshot on `main`, dropping the previous one so the metadata
/// stays small and constant-size, as a streaming writer with maintenance keeps it.
fn append(metadata: &Value, snapshot_id: i64) -> Value {
    let mut commit = common::append_commit(metadata, snapshot_id, "bench");
    let parent = metadata["current-snapshot-id"]
        .as_i64()
        .filter(|id| *id >= 0);
    commit["updates"].as_array_mut().unwrap().push(json!({
        "action": "remove-snapshots",
        "snapshot-ids": parent.map(|p| vec![p]).unwrap_or_default()
    }));
    commit
}

struct Cell {
    commits: usize,
    conflicts: usize,
    latencies: Vec<Duration>,
    elapsed: Duration,
}

impl Cell {
    /// Waits for the clients, each returning (commits, conflicts, latencies), and adds them up.
    async fn collect(
        clients: Vec<tokio::task::JoinHandle<(usize, usize, Vec<Duration>)>>,
        started: Instant,
    ) -> Self {
        let mut cell = Cell {
            commits: 0,
            conflicts: 0,
            latencies: Vec::new(),
            elapsed: Duration::ZERO,
        };
        for client in clients {
            let (commits, conflicts, latencies) = client.await.unwrap();
            cell.commits += commits;
            cell.conflicts += conflicts;
            cell.latencies.extend(latencies);
        }
        cell.elapsed = started.elapsed();
        cell
    }

    fn rate(&self) -> f64 {
        self.commits as f64 / self.elapsed.as_secs_f64()
    }

    fn quantile(&mut self, q: f64) -> f64 {
        self.latencies.sort();
        let i = ((self.latencies.len() as f64 - 1.0) * q).round() as usize;
        self.latencies
            .get(i)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    }
}

async fn run_http(base: &str, tables: &[String], clients: usize) -> Cell {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap();
    let deadline = Instant::now() + seconds();
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (http, url) = (http.clone(), format!("{base}/{}", tables[c % tables.len()]));
            tokio::spawn(async move {
                let mut out = (0usize, 0usize, Vec::new());
                let mut id = (c as i64 + 1) * 1_000_000_000;
                while Instant::now() < deadline {
                    let began = Instant::now();
                    loop {
                        let loaded: Value =
                            http.get(&url).send().await.unwrap().json().await.unwrap();
                        id += 1;
                        let r = http
                            .post(&url)
                            .json(&append(&loaded["metadata"], id))
                            .send()
                            .await
                            .unwrap();
                        match r.status().as_u16() {
                            200 => break,
                            409 => out.1 += 1,
                            other => panic!("commit answered {other}: {}", r.text().await.unwrap()),
                        }
                    }
                    out.0 += 1;
                    out.2.push(began.elapsed());
                }
                out
            })
        })
        .collect();
    Cell::collect(tasks, started).await
}

async fn run_bare_swaps(
    store: Arc<dyn floe_catalog::store::CatalogStore>,
    ns: &Namespace,
    clients: usize,
) -> Cell {
    for c in 0..clients {
        let table = TableName::new(ns.clone(), format!("bare{c}")).unwrap();
        let swap = PointerSwap {
            table,
            expected: None,
            new: "v0".into(),
        };
        store.swap_pointers(&[swap], None).await.unwrap();
    }
    let deadline = Instant::now() + seconds();
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let store = store.clone();
            let table = TableName::new(ns.clone(), format!("bare{c}")).unwrap();
            tokio::spawn(async move {
                let mut version = 0u64;
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let began = Instant::now();
                    let swap = PointerSwap {
                        table: table.clone(),
                        expected: Some(format!("v{version}")),
                        new: format!("v{}", version + 1),
                    };
                    store.swap_pointers(&[swap], None).await.unwrap();
                    version += 1;
                    latencies.push(began.elapsed());
                }
                (latencies.len(), 0, latencies)
            })
        })
        .collect();
    Cell::collect(tasks, started).await
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let dir = std::env::temp_dir().join(format!("floe-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut stores = vec![(
        "sqlite",
        format!("sqlite://{}", dir.join("catalog.db").display()),
    )];
    match std::env::var("FLOE_TEST_PG_URL") {
        Ok(pg) => stores.push(("postgres", pg)),
        Err(_) => eprintln!("note: FLOE_TEST_PG_URL unset; benchmarking SQLite only"),
    }
    println!(
        "floe-catalog commit benchmark, {} s per cell, {} cores",
        seconds().as_secs_f64(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "{:<9} {:<9} {:>7} {:>10} {:>9} {:>9} {:>10} {:>12} {:>7}",
        "store",
        "tables",
        "clients",
        "commits/s",
        "p50 ms",
        "p99 ms",
        "conflicts",
        "bare swaps/s",
        "ratio"
    );
    for (label, store_url) in &stores {
        let config = config(store_url, &dir);
        let catalog = floe_catalog::start(&config).await.unwrap();
        let store = floe_catalog::open_store(&config).await.unwrap();
        let http = reqwest::Client::new();
        let base = format!("{}/v1/{}", catalog.uri(), config.name);
        http.post(format!("{base}/namespaces"))
            .json(&json!({"namespace": ["bench"]}))
            .send()
            .await
            .unwrap();
        for clients in [1usize, 8, 32] {
            let ns = Namespace::from_url(&format!("bare{clients}")).unwrap();
            store
                .create_namespace(&ns, &Default::default())
                .await
                .unwrap();
            let mut bare = run_bare_swaps(store.clone(), &ns, clients).await;
            let _ = bare.quantile(0.5);
            for hot in [false, true] {
                let count = if hot { 1 } else { clients };
                let mut tables = Vec::new();
                for t in 0..count {
                    let name = format!("c{clients}h{hot}t{t}");
                    let body = json!({"name": name, "schema": {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "required": true, "type": "long"}]}});
                    let r = http
                        .post(format!("{base}/namespaces/bench/tables"))
                        .json(&body)
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status().as_u16(), 200);
                    tables.push(format!("namespaces/bench/tables/{name}"));
                }
                let mut cell = run_http(&base, &tables, clients).await;
                println!(
                    "{:<9} {:<9} {:>7} {:>10.0} {:>9.2} {:>9.2} {:>10} {:>12.0} {:>7.2}",
                    label,
                    if hot { "one hot" } else { "distinct" },
                    clients,
                    cell.rate(),
                    cell.quantile(0.5),
                    cell.quantile(0.99),
                    cell.conflicts,
                    bare.rate(),
                    cell.rate() / bare.rate()
                );
            }
        }
        catalog.stop().await.unwrap();
    }
    std::fs::remove_dir_all(&dir).ok();
}
