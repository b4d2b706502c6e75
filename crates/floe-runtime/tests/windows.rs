//! Windows in the one job loop, with an in-memory broker and an in-process catalog:
//! determinism is the oracle. The same input gives the same rollup, late and dead-letter rows
//! when the job runs uninterrupted, when it is killed at random instants (its commit in
//! flight landing or not) and restarted, when its local state directory is lost between
//! restarts, and when its partitions move between two writers.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, TimestampMicrosecondType};
use floe_lake::marker::newest_marker;
use floe_lake::rest::CatalogClient;
use floe_runtime::{Job, JobMetrics, RecordReader};
use iceberg::{NamespaceIdent, TableIdent};
use rand::{Rng, SeedableRng};
use support::{
    Broker, EventFormat, MemorySource, Shared, assign, event_job, produce, produced, scan,
    start_catalog, temp_dir,
};
use tokio_util::sync::CancellationToken;

const PARTITIONS: usize = 3;

const OPERATORS: &str = r#"
[streams.events]
out_of_orderness = "2s"

[[operators]]
id = "kept"
kind = "filter"
input = "events"
where = "k <> 'skip'"

[[operators]]
id = "tumbling"
kind = "window"
input = "kept"
window = { type = "tumbling", size = "10s" }
key = ["k"]
allowed_lateness = "5s"
aggregates = { n = "count()", first = "min(ts)", last = "max(ts)", offsets = "count_distinct(offset)", p90 = "quantile(offset, 0.9)" }

[[operators]]
id = "sliding"
kind = "window"
input = "kept"
window = { type = "sliding", size = "20s", slide = "10s" }
aggregates = { n = "count()" }

[[operators]]
id = "sessions"
kind = "window"
input = "kept"
window = { type = "session", gap = "3s" }
key = ["k"]
allowed_lateness = "4s"
aggregates = { n = "count()", mean = "avg(offset)" }

[tables.kept]
land = false
"#;

/// The events of every partition: times mostly in order with disorder within 2 s, some far
/// behind (late), some skipped by the filter, some without a key or a time (dead letters).
fn workload(seed: u64) -> Vec<Vec<String>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..PARTITIONS)
        .map(|p| {
            let mut clock: i64 = 1_700_000_000_000 + p as i64 * 777;
            (0..400)
                .map(|_| {
                    clock += rng.random_range(0..250);
                    let key = ["a", "b", "c", "skip", ""][match rng.random_range(0..100) {
                        0..30 => 0,
                        30..60 => 1,
                        60..90 => 2,
                        90..97 => 3,
                        _ => 4,
                    }];
                    let t = match rng.random_range(0..100) {
                        0..3 => (clock - 30_000).to_string(),
                        3..4 => String::new(),
                        _ => (clock - rng.random_range(0..1_800)).to_string(),
                    };
                    // A session gap now and then.
                    if rng.random_range(0..40) == 0 {
                        clock += 5_000;
                    }
                    format!("{key},{t}")
                })
                .collect()
        })
        .collect()
}

fn spawn(
    broker: &Shared,
    member: usize,
    client: &CatalogClient,
    uri: &str,
    state_dir: &Path,
) -> (tokio::task::JoinHandle<()>, CancellationToken) {
    let config = event_job("win", uri, state_dir, OPERATORS);
    let reader = RecordReader::new(
        MemorySource::new(broker, member, true),
        EventFormat::default(),
        None,
    );
    let stop = CancellationToken::new();
    let (client, token) = (client.clone(), stop.clone());
    let task = tokio::spawn(async move {
        let job = Job::open(config, client, reader, JobMetrics::new())
            .await
            .unwrap();
        job.run(token).await.unwrap();
    });
    (task, stop)
}

async fn committed(client: &CatalogClient) -> BTreeMap<String, String> {
    let anchor = client
        .load_table(&TableIdent::new(
            NamespaceIdent::new("t".into()),
            "floe_dead_letters".into(),
        ))
        .await;
    anchor
        .ok()
        .and_then(|a| newest_marker(&a.metadata, "win").map(|m| m.marker.positions))
        .unwrap_or_default()
}

async fn wait_for_end(client: &CatalogClient, broker: &Shared) {
    let ends = produced(broker);
    let began = Instant::now();
    loop {
        let positions = committed(client).await;
        if ends
            .iter()
            .enumerate()
            .all(|(p, n)| positions.get(&format!("events/{p}")) == Some(&n.to_string()))
        {
            return;
        }
        assert!(
            began.elapsed() < Duration::from_secs(90),
            "not all committed: {positions:?} of {ends:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every table of the job, as sorted lines (deletes applied; sketch columns by their
/// estimates; the dead letters without their ingestion time).
async fn tables(client: &CatalogClient) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for name in [
        "tumbling",
        "tumbling_late",
        "sliding",
        "sliding_late",
        "sessions",
        "sessions_late",
        "floe_dead_letters",
    ] {
        let ident = TableIdent::new(NamespaceIdent::new("t".into()), name.into());
        let Ok(table) = client.load_table(&ident).await else {
            out.insert(name.to_string(), Vec::new());
            continue;
        };
        let mut lines = Vec::new();
        for b in scan(&table).await {
            for row in 0..b.num_rows() {
                let mut cells = Vec::new();
                for (field, column) in b.schema().fields().iter().zip(b.columns()) {
                    let name = field.name();
                    if name == "ts" && table.ident.name() == "floe_dead_letters"
                        || name.ends_with("_hll")
                        || name.ends_with("_sketch")
                    {
                        continue;
                    }
                    let cell = if column.is_null(row) {
                        "∅".to_string()
                    } else if let Some(ts) = column.as_primitive_opt::<TimestampMicrosecondType>() {
                        ts.value(row).to_string()
                    } else if let Some(n) = column.as_primitive_opt::<Int64Type>() {
                        n.value(row).to_string()
                    } else {
                        arrow_cast::display::ArrayFormatter::try_new(
                            column.as_ref(),
                            &Default::default(),
                        )
                        .unwrap()
                        .value(row)
                        .to_string()
                    };
                    cells.push(format!("{name}={cell}"));
                }
                lines.push(cells.join(" "));
            }
        }
        lines.sort();
        out.insert(name.to_string(), lines);
    }
    out
}

fn feed(broker: &Shared, events: &[Vec<String>], upto: usize) {
    for (p, partition) in events.iter().enumerate() {
        let have = produced(broker)[p];
        for e in partition.iter().take(upto).skip(have) {
            produce(broker, p, e.clone().into_bytes());
        }
    }
}

struct Run {
    dir: PathBuf,
    catalog: floe_catalog::RunningCatalog,
    client: CatalogClient,
    broker: Shared,
}

impl Run {
    async fn new(tag: &str) -> Self {
        let dir = temp_dir(tag);
        let (catalog, client) = start_catalog(&dir).await;
        let broker = Broker::new("events", PARTITIONS);
        Self {
            dir,
            catalog,
            client,
            broker,
        }
    }

    async fn finish(self) -> BTreeMap<String, Vec<String>> {
        let out = tables(&self.client).await;
        self.catalog.stop().await.unwrap();
        let _ = std::fs::remove_dir_all(&self.dir);
        out
    }
}

async fn uninterrupted(events: &[Vec<String>]) -> BTreeMap<String, Vec<String>> {
    let run = Run::new("win-once").await;
    assign(&run.broker, &[Some(0); PARTITIONS]);
    feed(&run.broker, events, usize::MAX);
    let (task, stop) = spawn(
        &run.broker,
        0,
        &run.client,
        &run.catalog.uri(),
        &run.dir.join("state"),
    );
    wait_for_end(&run.client, &run.broker).await;
    stop.cancel();
    task.await.unwrap();
    run.finish().await
}

fn assert_same(
    name: &str,
    got: &BTreeMap<String, Vec<String>>,
    want: &BTreeMap<String, Vec<String>>,
) {
    for (table, rows) in want {
        let other = &got[table];
        let missing: Vec<&String> = rows.iter().filter(|r| !other.contains(r)).take(3).collect();
        let extra: Vec<&String> = other.iter().filter(|r| !rows.contains(r)).take(3).collect();
        assert!(
            other == rows,
            "{name}: {table} differs ({} rows, uninterrupted {}): missing {missing:?}, extra {extra:?}",
            other.len(),
            rows.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_give_the_same_rows_through_crashes_lost_state_and_rebalances() {
    let events = workload(7);
    let want = uninterrupted(&events).await;
    let rollups = &want["tumbling"];
    assert!(
        rollups.len() > 20,
        "the workload fills windows: {}",
        rollups.len()
    );
    assert!(!want["tumbling_late"].is_empty(), "some rows are late");
    assert!(!want["sessions"].is_empty() && !want["sliding"].is_empty());
    assert!(
        want["floe_dead_letters"]
            .iter()
            .any(|r| r.contains("is null")),
        "rows without a key or a time are dead letters"
    );

    // Killed at random instants (a commit in flight may land), the local state directory
    // lost every other restart.
    let run = Run::new("win-crash").await;
    assign(&run.broker, &[Some(0); PARTITIONS]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    for round in 0..8 {
        feed(&run.broker, &events, (round + 1) * 50);
        let state = run.dir.join(format!("state-{}", round / 2));
        let (task, _stop) = spawn(&run.broker, 0, &run.client, &run.catalog.uri(), &state);
        tokio::time::sleep(Duration::from_millis(rng.random_range(150..700))).await;
        task.abort();
        let _ = task.await;
    }
    feed(&run.broker, &events, usize::MAX);
    let (task, stop) = spawn(
        &run.broker,
        0,
        &run.client,
        &run.catalog.uri(),
        &run.dir.join("state-last"),
    );
    wait_for_end(&run.client, &run.broker).await;
    stop.cancel();
    task.await.unwrap();
    assert_same("killed", &run.finish().await, &want);

    // Two writers; partitions move between them three times.
    let run = Run::new("win-rebalance").await;
    assign(&run.broker, &[Some(0); PARTITIONS]);
    let (a, stop_a) = spawn(
        &run.broker,
        0,
        &run.client,
        &run.catalog.uri(),
        &run.dir.join("a"),
    );
    let (b, stop_b) = spawn(
        &run.broker,
        1,
        &run.client,
        &run.catalog.uri(),
        &run.dir.join("b"),
    );
    let plans = [
        [Some(0), Some(1), Some(0)],
        [Some(1), Some(1), Some(0)],
        [Some(1), Some(0), Some(1)],
        [Some(0), Some(0), Some(0)],
    ];
    for (round, plan) in plans.iter().enumerate() {
        feed(&run.broker, &events, (round + 1) * 100);
        tokio::time::sleep(Duration::from_millis(400)).await;
        assign(&run.broker, plan);
    }
    feed(&run.broker, &events, usize::MAX);
    wait_for_end(&run.client, &run.broker).await;
    stop_a.cancel();
    stop_b.cancel();
    a.await.unwrap();
    b.await.unwrap();
    assert_same("rebalanced", &run.finish().await, &want);
}

/// Rollup rows of partition `events/{partition}` in the `tumbling` table.
async fn rollups_of(client: &CatalogClient, partition: usize) -> usize {
    tables(client).await["tumbling"]
        .iter()
        .filter(|r| r.contains(&format!("source_partition=events/{partition} ")))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_partition_stops_holding_the_clock_with_idle_after() {
    for idle in [true, false] {
        let run = Run::new("win-idle").await;
        assign(&run.broker, &[Some(0), Some(0)]);
        // Partition 1 gets three rows early on, then nothing; partition 0 keeps going.
        for (i, t) in [1_000i64, 2_000, 3_000].iter().enumerate() {
            produce(&run.broker, 1, format!("k{i},{t}").into_bytes());
        }
        let extra = if idle {
            "[streams.events]\nidle_after = \"300ms\"\n"
        } else {
            ""
        };
        let config = event_job(
            "idle",
            &run.catalog.uri(),
            &run.dir.join("state"),
            &format!(
                "{extra}[[operators]]\nid = \"tumbling\"\nkind = \"window\"\ninput = \"events\"\n\
                 window = {{ type = \"tumbling\", size = \"10s\" }}\nkey = [\"k\"]\n\
                 aggregates = {{ n = \"count()\" }}\n"
            ),
        );
        let reader = RecordReader::new(
            MemorySource::new(&run.broker, 0, true),
            EventFormat::default(),
            None,
        );
        let stop = CancellationToken::new();
        let (client, token) = (run.client.clone(), stop.clone());
        let task = tokio::spawn(async move {
            Job::open(config, client, reader, JobMetrics::new())
                .await
                .unwrap()
                .run(token)
                .await
                .unwrap();
        });
        let began = Instant::now();
        let mut t = 0i64;
        while began.elapsed() < Duration::from_secs(4) {
            t += 1_000;
            produce(&run.broker, 0, format!("k,{t}").into_bytes());
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let moving = rollups_of(&run.client, 0).await;
        let quiet = rollups_of(&run.client, 1).await;
        stop.cancel();
        task.await.unwrap();
        run.finish().await;
        assert!(moving > 5, "the busy partition's windows fire ({moving})");
        if idle {
            assert_eq!(
                quiet, 3,
                "the idle partition's window fired: one row per key"
            );
        } else {
            assert_eq!(
                quiet, 0,
                "without idle_after the quiet partition holds its window open"
            );
        }
    }
}
