//! Compaction on real tables committed through floe-catalog: identical results in DuckDB (a
//! full-table checksum), at least 10× fewer data files, no delete files left in compacted
//! partitions — and no lost or resurrected row while a writer keeps committing.

#[path = "../../crates/floe-lake/tests/support/mod.rs"]
mod support;

use floe_lake::rest::LoadedTable;
use floe_lake::snapshot::Delta;
use floe_maintenance::compact::{CompactionSettings, compact, plan_compaction};
use support::common::{Harness, backends};
use support::{check, commit, create_table, live_files, scan, write_data, write_equality_deletes};

async fn counts(table: &LoadedTable) -> (usize, usize) {
    let (data, deletes) = live_files(table).await;
    (data.len(), deletes.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_keeps_every_row_and_merges_small_files() {
    for backend in backends() {
        // A stall anywhere (catalog, storage, reader) fails with the backend's name.
        tokio::time::timeout(
            std::time::Duration::from_secs(300),
            compact_one_backend(&backend),
        )
        .await
        .unwrap_or_else(|_| panic!("[{}] compaction test stalled for 5 minutes", backend.label));
    }
}

async fn compact_one_backend(backend: &support::common::Backend) {
    let h = Harness::start(backend).await;
    let s3 = h.config.warehouse.starts_with("s3://");
    let client = support::client(&h, &h.catalog.uri()).await;
    let (ident, _) = create_table(&client, "compact", "small").await;
    // 40 commits of 3 rows in both regions: 80 small files in 2 partitions, then 10 CDC-style
    // commits that upsert two keys and delete two more by key (equality deletes).
    support::append_in_commits(&client, &ident, 1, 40, 3).await;
    let mut before = client.load_table(&ident).await.unwrap();
    for k in 0..10 {
        let base = 5 + 10 * k;
        let upsert = Delta {
            data_files: write_data(&before, &[base, base + 2], 2.0).await,
            delete_files: write_equality_deletes(&before, &[base, base + 2, base + 4, base + 6])
                .await,
            ..Delta::default()
        };
        before = commit(&client, &ident, upsert).await;
    }
    let rows_before = scan(&before).await;
    assert_eq!(rows_before.len(), 100);
    let (data_before, deletes_before) = counts(&before).await;
    assert!(data_before >= 80 && deletes_before >= 10);
    // Partitions written just now are not sealed yet.
    let sealed = CompactionSettings {
        sealed_after: std::time::Duration::from_secs(3600),
        ..CompactionSettings::default()
    };
    assert!(plan_compaction(&before, &sealed).await.unwrap().is_none());

    // Rows come out sorted by the configured order.
    let settings = CompactionSettings {
        sort_by: vec!["id DESC".into()],
        ..CompactionSettings::default()
    };
    let plan = plan_compaction(&before, &settings)
        .await
        .unwrap()
        .expect("work to do");
    let report = compact(&client, &ident, &plan, &settings, &|_| {})
        .await
        .unwrap();
    assert_eq!(report.groups_conflicted, 0);
    let after = client.load_table(&ident).await.unwrap();
    check(&after, s3, &rows_before, "after compaction").await;
    let (data_after, deletes_after) = counts(&after).await;
    assert!(
        data_before >= 10 * data_after,
        "[{}] {data_before} -> {data_after} data files",
        backend.label
    );
    assert_eq!(
        deletes_after, 0,
        "[{}] delete files remain in compacted partitions",
        backend.label
    );
    assert_eq!(report.delete_files_removed, deletes_before);
    for file in live_files(&after).await.0 {
        let ids = support::file_ids(&after, &file).await;
        assert!(
            ids.windows(2).all(|w| w[0] >= w[1]),
            "[{}] not sorted by id DESC: {ids:?}",
            backend.label
        );
    }
    // Nothing left to do.
    assert!(plan_compaction(&after, &settings).await.unwrap().is_none());
    h.catalog.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_rounds_racing_a_writer_lose_and_resurrect_nothing() {
    let h = Harness::start(&backends()[0]).await;
    let client = support::client(&h, &h.catalog.uri()).await;
    let (ident, _) = create_table(&client, "compact", "race").await;
    // The writer: checkpoints that append new keys and upsert and delete older ones by key —
    // at least 40, and on until two compaction rounds raced it (a loaded machine slows the
    // rounds, not the writer).
    let rounds = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = {
        let client = support::client(&h, &h.catalog.uri()).await;
        let ident = ident.clone();
        let rounds = rounds.clone();
        tokio::spawn(async move {
            let mut model = std::collections::BTreeMap::new();
            let raced = || rounds.load(std::sync::atomic::Ordering::SeqCst) >= 2;
            for checkpoint in (1..=400u64).take_while(|c| *c <= 40 || !raced()) {
                let table = client.load_table(&ident).await.unwrap();
                let base = checkpoint as i64 * 10;
                let amount = checkpoint as f64;
                let mut delta = Delta {
                    data_files: write_data(&table, &[base, base + 1, base + 2], amount).await,
                    ..Delta::default()
                };
                for id in [base, base + 1, base + 2] {
                    model.insert(id, amount);
                }
                if checkpoint > 2 {
                    // Upsert a key from two checkpoints ago, delete another.
                    let (upsert, gone) = (base - 20, base - 19);
                    delta
                        .data_files
                        .extend(write_data(&table, &[upsert], amount).await);
                    delta.delete_files = write_equality_deletes(&table, &[upsert, gone]).await;
                    model.insert(upsert, amount);
                    model.remove(&gone);
                }
                // A checkpoint interval (short, but long enough for rewrites to land between).
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                support::commit_as_writer(&client, &ident, checkpoint, delta).await;
            }
            model
        })
    };
    let settings = CompactionSettings {
        min_input_files: 3,
        ..CompactionSettings::default()
    };
    while !writer.is_finished() {
        let table = client.load_table(&ident).await.unwrap();
        if let Some(plan) = plan_compaction(&table, &settings).await.unwrap() {
            let report = compact(&client, &ident, &plan, &settings, &|_| {})
                .await
                .unwrap();
            let round = rounds.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            eprintln!("compaction round {round}: {report:?}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let model = writer.await.unwrap();
    let expected: Vec<(i64, f64)> = model.into_iter().collect();
    let table = client.load_table(&ident).await.unwrap();
    let rounds = rounds.load(std::sync::atomic::Ordering::SeqCst);
    assert!(rounds >= 2, "compaction ran only {rounds} rounds");
    check(&table, false, &expected, "after racing compactions").await;
    h.catalog.stop().await.unwrap();
}
