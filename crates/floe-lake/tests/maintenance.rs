//! Expiry with file GC, orphan removal, and manifest rewriting under a long stream of commits.

mod support;

use std::time::Duration;

use floe_lake::commit::{RetryPolicy, commit_checkpoint, commit_operation};
use floe_lake::expire::{ExpireSnapshots, expire_snapshots};
use floe_lake::manifests::RewriteManifests;
use floe_lake::marker::{CommitMarker, newest_marker};
use floe_lake::orphans::{RemoveOrphans, remove_orphan_files};
use floe_lake::rest::LoadedTable;
use floe_lake::snapshot::{Delta, current_manifests};
use floe_lake::writer::{DataWriter, WriterOptions};
use support::common::{Harness, backends};
use support::{batch, check, create_table, scan, write_data, write_equality_deletes};

fn marker(job: &str, checkpoint: u64) -> CommitMarker {
    CommitMarker {
        job_id: job.into(),
        writer: None,
        checkpoint_id: checkpoint,
        positions: [("p/0".to_string(), checkpoint.to_string())].into(),
        operators: Default::default(),
        streams: Default::default(),
    }
}

async fn exists(table: &LoadedTable, path: &str) -> bool {
    table.io.exists(path).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_deletes_only_unreferenced_files_and_keeps_recovery_working() {
    for backend in backends() {
        let h = Harness::start(&backend).await;
        let s3 = h.config.warehouse.starts_with("s3://");
        let client = support::client(&h, &h.catalog.uri()).await;
        let (ident, table) = create_table(&client, "maint", "expire").await;
        let policy = RetryPolicy::default();
        // Checkpoints 1..=3 of job "ingest", then an upsert by another writer (no marker).
        let first = write_data(&table, &[1, 2], 1.0).await;
        let first_path = first[0].file_path().to_string();
        commit_checkpoint(
            &client,
            &marker("ingest", 1),
            &[(
                ident.clone(),
                Delta {
                    data_files: first,
                    ..Delta::default()
                },
            )],
            &policy,
        )
        .await
        .unwrap();
        for checkpoint in 2..=3u64 {
            let table = client.load_table(&ident).await.unwrap();
            let delta = Delta {
                data_files: write_data(&table, &[checkpoint as i64 * 10], 1.0).await,
                ..Delta::default()
            };
            commit_checkpoint(
                &client,
                &marker("ingest", checkpoint),
                &[(ident.clone(), delta)],
                &policy,
            )
            .await
            .unwrap();
        }
        let table = client.load_table(&ident).await.unwrap();
        let other = Delta {
            data_files: write_data(&table, &[1], 5.0).await,
            delete_files: write_equality_deletes(&table, &[1]).await,
            ..Delta::default()
        };
        support::commit(&client, &ident, other).await;
        let before = client.load_table(&ident).await.unwrap();
        let expected = vec![(1, 5.0), (2, 1.0), (20, 1.0), (30, 1.0)];
        assert_eq!(scan(&before).await, expected);
        let mut snapshots: Vec<_> = before.metadata.snapshots().collect();
        snapshots.sort_by_key(|s| s.sequence_number());
        let old_list: Vec<String> = snapshots
            .iter()
            .map(|s| s.manifest_list().to_string())
            .collect();

        // Everything is old; keep one snapshot — but the newest "ingest" marker stays reachable.
        let report = expire_snapshots(
            &client,
            &ident,
            &ExpireSnapshots {
                older_than_ms: i64::MAX,
                retain_last: 1,
                protect: vec![],
            },
            &policy,
        )
        .await
        .unwrap();
        let after = client.load_table(&ident).await.unwrap();
        assert_eq!(
            report.expired.len(),
            2,
            "[{}] checkpoints 1 and 2 go",
            backend.label
        );
        assert_eq!(after.metadata.snapshots().count(), 2);
        assert_eq!(
            newest_marker(&after.metadata, "ingest").unwrap().marker,
            marker("ingest", 3)
        );
        check(&after, s3, &expected, "after expiry").await;
        // The expired snapshots' manifest lists are gone; data files still live are not.
        assert!(!report.deleted_files.is_empty());
        for list in &old_list[..2] {
            assert!(
                !exists(&after, list).await,
                "[{}] {list} survived",
                backend.label
            );
        }
        assert!(
            exists(&after, &first_path).await,
            "a live data file was deleted"
        );

        // Orphans: a file written but never committed. Too young at the default age.
        let mut writer = DataWriter::data(&after, &WriterOptions::default()).unwrap();
        writer
            .write(&batch(after.metadata.current_schema(), &[99], 9.0))
            .await
            .unwrap();
        let stray = writer.close().await.unwrap()[0].file_path().to_string();
        let young = remove_orphan_files(&client, &ident, &RemoveOrphans::default())
            .await
            .unwrap();
        assert!(
            young.orphans.is_empty(),
            "[{}] an in-flight file would be deleted: {young:?}",
            backend.label
        );
        let dry = remove_orphan_files(
            &client,
            &ident,
            &RemoveOrphans {
                older_than: Duration::ZERO,
                dry_run: true,
            },
        )
        .await
        .unwrap();
        assert_eq!(dry.orphans, vec![stray.clone()], "[{}]", backend.label);
        assert!(exists(&after, &stray).await);
        let swept = remove_orphan_files(
            &client,
            &ident,
            &RemoveOrphans {
                older_than: Duration::ZERO,
                dry_run: false,
            },
        )
        .await
        .unwrap();
        assert_eq!(swept.orphans, vec![stray.clone()]);
        assert!(!exists(&after, &stray).await);
        check(
            &client.load_table(&ident).await.unwrap(),
            s3,
            &expected,
            "after orphan removal",
        )
        .await;
        h.catalog.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_streaming_commits_keep_the_manifest_count_bounded() {
    let h = Harness::start(&backends()[0]).await;
    let client = support::client(&h, &h.catalog.uri()).await;
    let (ident, _) = create_table(&client, "maint", "stream").await;
    let policy = RetryPolicy::default();
    let merge = RewriteManifests {
        target_bytes: 8 * 1024 * 1024,
        min_manifests: 16,
    };
    let mut most = 0;
    for checkpoint in 1..=1000u64 {
        let table = client.load_table(&ident).await.unwrap();
        let delta = Delta {
            data_files: write_data(&table, &[checkpoint as i64], 1.0).await,
            ..Delta::default()
        };
        commit_checkpoint(
            &client,
            &marker("stream", checkpoint),
            &[(ident.clone(), delta)],
            &policy,
        )
        .await
        .unwrap();
        if checkpoint % 16 == 0 {
            commit_operation(&client, &ident, &merge, &policy)
                .await
                .unwrap();
        }
        if checkpoint % 100 == 0 {
            expire_snapshots(
                &client,
                &ident,
                &ExpireSnapshots {
                    older_than_ms: i64::MAX,
                    retain_last: 5,
                    protect: vec![],
                },
                &policy,
            )
            .await
            .unwrap();
        }
        let manifests = current_manifests(&client.load_table(&ident).await.unwrap())
            .await
            .unwrap()
            .len();
        most = most.max(manifests);
    }
    assert!(most <= 17, "manifest count grew to {most}");
    let table = client.load_table(&ident).await.unwrap();
    let rows = scan(&table).await;
    assert_eq!(rows.len(), 1000);
    assert_eq!(
        rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        (1..=1000).collect::<Vec<i64>>()
    );
    assert_eq!(
        newest_marker(&table.metadata, "stream")
            .unwrap()
            .marker
            .checkpoint_id,
        1000
    );
    check(&table, false, &rows, "after 1000 commits").await;
    h.catalog.stop().await.unwrap();
}

/// A mirror's bookkeeping: the rows each of a job's snapshots added are read back from that
/// snapshot alone (a compaction's or another writer's snapshots are no job's), and expiry keeps
/// every snapshot newer than what the job's newest marker says its mirror delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_reads_each_snapshots_rows_and_expiry_keeps_the_undelivered() {
    use floe_lake::marker::{job_snapshots, mirrored_value};
    use floe_lake::read::read_added;
    let h = Harness::start(&backends()[0]).await;
    let client = support::client(&h, &h.catalog.uri()).await;
    let (ident, table) = create_table(&client, "maint", "mirrored").await;
    let uuid = table.metadata.uuid().to_string();
    let policy = RetryPolicy::default();
    let mut delivered = None;
    for checkpoint in 1..=4u64 {
        let table = client.load_table(&ident).await.unwrap();
        let mut m = marker("alerts", checkpoint);
        // The fourth checkpoint records that the mirror delivered the first one.
        if checkpoint == 4 {
            m.positions.insert(
                "p/0#sink:out".into(),
                mirrored_value(&uuid, delivered.unwrap()),
            );
        }
        let delta = Delta {
            data_files: write_data(&table, &[checkpoint as i64, 100 + checkpoint as i64], 1.0)
                .await,
            ..Delta::default()
        };
        commit_checkpoint(&client, &m, &[(ident.clone(), delta)], &policy)
            .await
            .unwrap();
        if checkpoint == 1 {
            let table = client.load_table(&ident).await.unwrap();
            delivered = Some(table.metadata.current_snapshot().unwrap().sequence_number());
        }
    }
    // Another writer's snapshot on top: no job's.
    let table = client.load_table(&ident).await.unwrap();
    let other = Delta {
        data_files: write_data(&table, &[999], 2.0).await,
        ..Delta::default()
    };
    support::commit(&client, &ident, other).await;

    let table = client.load_table(&ident).await.unwrap();
    let mine = job_snapshots(&table.metadata, "alerts");
    assert_eq!(mine.len(), 4, "{mine:?}");
    assert!(
        mine.windows(2).all(|w| w[0].1 > w[1].1),
        "newest first: {mine:?}"
    );
    for (i, (id, _)) in mine.iter().rev().enumerate() {
        let rows = support::id_amounts(&read_added(&table, *id).await.unwrap());
        let c = i as i64 + 1;
        assert_eq!(rows, vec![(c, 1.0), (100 + c, 1.0)], "snapshot {id}");
    }

    let report = expire_snapshots(
        &client,
        &ident,
        &ExpireSnapshots {
            older_than_ms: i64::MAX,
            retain_last: 1,
            protect: vec![],
        },
        &policy,
    )
    .await
    .unwrap();
    // Only the delivered first checkpoint may go; the other three wait for the mirror.
    assert_eq!(report.expired, vec![mine[3].0]);
    let after = client.load_table(&ident).await.unwrap();
    assert_eq!(job_snapshots(&after.metadata, "alerts").len(), 3);
    let err = read_added(&after, mine[3].0).await.unwrap_err();
    assert!(err.to_string().contains("not in the table"), "{err}");
    h.catalog.stop().await.unwrap();
}
