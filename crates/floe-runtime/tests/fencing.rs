//! Fencing and rebalances of the one job loop, with an in-memory broker and an in-process
//! catalog: two writers that both believe they own a partition (a zombie that missed a
//! rebalance) never commit a record twice or move a position back, and writers whose
//! assignment changes hand partitions over without loss.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use floe_lake::marker::CommitMarker;
use floe_lake::rest::CatalogClient;
use floe_runtime::{Job, JobMetrics, RecordReader};
use iceberg::{NamespaceIdent, TableIdent};
use support::{
    Broker, MemorySource, Shared, ValueFormat, assign, events, job_config, produce, produced,
    start_catalog, temp_dir,
};
use tokio_util::sync::CancellationToken;

/// Starts a writer of job `name` as group member `member`.
fn spawn_writer(
    broker: &Shared,
    member: usize,
    notices: bool,
    name: &str,
    client: &CatalogClient,
    uri: &str,
) -> (
    tokio::task::JoinHandle<floe_runtime::RunSummary>,
    CancellationToken,
    JobMetrics,
) {
    let config = job_config(name, uri, "");
    let reader = RecordReader::new(
        MemorySource::new(broker, member, notices),
        ValueFormat::default(),
        None,
    );
    let metrics = JobMetrics::new();
    let stop = CancellationToken::new();
    let (client, token, m) = (client.clone(), stop.clone(), metrics.clone());
    let task = tokio::spawn(async move {
        Job::open(config, client, reader, m)
            .await
            .unwrap()
            .run(token)
            .await
            .unwrap()
    });
    (task, stop, metrics)
}

/// Every commit's positions of job `name` in the anchor, in commit order.
async fn committed_positions(client: &CatalogClient, name: &str) -> Vec<BTreeMap<String, String>> {
    let anchor = client
        .load_table(&TableIdent::new(
            NamespaceIdent::new("t".into()),
            "floe_dead_letters".into(),
        ))
        .await
        .unwrap();
    let mut snapshots: Vec<_> = anchor.metadata.snapshots().collect();
    snapshots.sort_by_key(|s| s.sequence_number());
    snapshots
        .iter()
        .filter_map(|s| CommitMarker::from_properties(&s.summary().additional_properties))
        .filter(|m| m.job_id == name)
        .map(|m| m.positions)
        .collect()
}

fn assert_positions_never_go_back(history: &[BTreeMap<String, String>]) {
    let mut seen: BTreeMap<String, i64> = BTreeMap::new();
    for (i, positions) in history.iter().enumerate() {
        for (partition, next) in positions {
            let next: i64 = next.parse().unwrap();
            if let Some(before) = seen.insert(partition.clone(), next) {
                assert!(
                    next >= before,
                    "commit {i} moved {partition} back from {before} to {next}"
                );
            }
        }
    }
}

async fn wait_for_commits(client: &CatalogClient, name: &str, ends: &[usize]) {
    let began = Instant::now();
    loop {
        let last = committed_positions(client, name)
            .await
            .pop()
            .unwrap_or_default();
        let done = ends
            .iter()
            .enumerate()
            .all(|(p, end)| last.get(&format!("events/{p}")) == Some(&end.to_string()));
        if done {
            return;
        }
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "not everything was committed: {last:?}, produced {ends:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn events_table(client: &CatalogClient) -> floe_lake::rest::LoadedTable {
    client
        .load_table(&TableIdent::new(
            NamespaceIdent::new("t".into()),
            "events".into(),
        ))
        .await
        .unwrap()
}

/// Every produced record is in the table exactly once (and nothing else is).
fn assert_exactly_once(rows: &[(i32, i64, i64)], counts: &[usize]) {
    let mut seen: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    for (p, o, v) in rows {
        assert_eq!(
            *v,
            *p as i64 * 1_000_000 + o,
            "row {p}/{o} has the wrong value"
        );
        *seen.entry((*p, *o)).or_default() += 1;
    }
    let twice: Vec<_> = seen
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, _)| k)
        .collect();
    let missing: Vec<(usize, usize)> = counts
        .iter()
        .enumerate()
        .flat_map(|(p, n)| (0..*n).map(move |o| (p, o)))
        .filter(|(p, o)| !seen.contains_key(&(*p as i32, *o as i64)))
        .collect();
    assert!(
        twice.is_empty() && missing.is_empty() && seen.len() == counts.iter().sum::<usize>(),
        "{} rows for {} records: {} records twice (first {:?}), {} missing (first {:?})",
        rows.len(),
        counts.iter().sum::<usize>(),
        twice.len(),
        twice.first(),
        missing.len(),
        missing.first()
    );
}

fn produce_some(broker: &Shared, partitions: usize, per_partition: usize) {
    for p in 0..partitions {
        for _ in 0..per_partition {
            let next = produced(broker)[p];
            produce(broker, p, (p * 1_000_000 + next).to_string().into_bytes());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_writer_is_fenced_and_nothing_is_committed_twice() {
    let dir = temp_dir("zombie");
    let (catalog, client) = start_catalog(&dir).await;
    let uri = catalog.uri();
    let broker = Broker::new("events", 2);
    assign(&broker, &[Some(0), Some(0)]);
    // A owns both partitions and will never notice a rebalance.
    let (a, stop_a, metrics_a) = spawn_writer(&broker, 0, false, "zombie", &client, &uri);
    for _ in 0..10 {
        produce_some(&broker, 2, 20);
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    // The group gives partition 0 to B; A keeps reading it too.
    assign(&broker, &[Some(1), Some(0)]);
    let (b, stop_b, metrics_b) = spawn_writer(&broker, 1, true, "zombie", &client, &uri);
    for _ in 0..20 {
        produce_some(&broker, 2, 20);
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    let counts = produced(&broker);
    wait_for_commits(&client, "zombie", &counts).await;
    stop_a.cancel();
    stop_b.cancel();
    a.await.unwrap();
    b.await.unwrap();

    // Both read partition 0: whichever commits it second is fenced, every time.
    assert!(
        metrics_a.aborted_checkpoints.get() + metrics_b.aborted_checkpoints.get() > 0,
        "no writer was ever fenced, though both read partition 0"
    );
    assert_exactly_once(&events(&events_table(&client).await).await, &counts);
    assert_positions_never_go_back(&committed_positions(&client, "zombie").await);
    catalog.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_move_between_writers_in_rebalances_without_loss() {
    let dir = temp_dir("rebalance");
    let (catalog, client) = start_catalog(&dir).await;
    let uri = catalog.uri();
    let broker = Broker::new("events", 3);
    assign(&broker, &[Some(0), Some(0), Some(0)]);
    let (a, stop_a, _) = spawn_writer(&broker, 0, true, "moves", &client, &uri);
    let (b, stop_b, _) = spawn_writer(&broker, 1, true, "moves", &client, &uri);
    let plans: [[Option<usize>; 3]; 5] = [
        [Some(0), Some(1), Some(0)],
        [Some(1), Some(1), Some(0)],
        [Some(1), Some(0), Some(1)],
        [None, Some(0), Some(1)],
        [Some(0), Some(0), Some(0)],
    ];
    for plan in plans {
        for _ in 0..5 {
            produce_some(&broker, 3, 15);
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        assign(&broker, &plan);
    }
    let counts = produced(&broker);
    wait_for_commits(&client, "moves", &counts).await;
    stop_a.cancel();
    stop_b.cancel();
    let (sa, sb) = (a.await.unwrap(), b.await.unwrap());
    assert!(
        sa.checkpoints > 0 && sb.checkpoints > 0,
        "both writers committed"
    );
    assert_exactly_once(&events(&events_table(&client).await).await, &counts);
    assert_positions_never_go_back(&committed_positions(&client, "moves").await);
    catalog.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
