//! The delete-file conformance scenario (shared/reference/test-tools.md §7), committed through a
//! real floe-catalog and read back by our own scan (iceberg-rust) and by DuckDB 1.5.5 (and by
//! PyIceberg 0.12 for the position deletes it supports):
//!
//! | snapshot | change | live ids |
//! |---|---|---|
//! | s1 | append 1–5 | 1 2 3 4 5 |
//! | s2 | position delete of id 2 | 1 3 4 5 |
//! | s3 | equality delete id=3 | 1 4 5 |
//! | s4 | equality delete id=4 and a new row 4 in the same snapshot | 1 4(new) 5 |
//! | s5 | insert 6 and 7 and a position delete of 6 in the same snapshot | 1 4 5 7 |
//! | s6 | truncate (every file removed) and a new row 8 in the same snapshot | 8 |
//! | s7 | first 9 and 10 in a snapshot of their own, then an equality delete id=9 and a new row 9 in the next, one commit | 8 9(new) 10 |

mod support;

use floe_lake::marker::{CommitMarker, newest_marker};
use floe_lake::snapshot::Delta;
use support::{
    check, commit, create_table, live_totals, position_delete, summary_totals, write_data,
    write_equality_deletes,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_conformance_scenario() {
    for backend in support::common::backends() {
        let h = support::common::Harness::start(&backend).await;
        let s3 = h.config.warehouse.starts_with("s3://");
        let client = support::client(&h, &h.catalog.uri()).await;
        assert!(client.supports_transactions());
        let (ident, table) = create_table(&client, "golden", "orders").await;
        let marker = |checkpoint: u64| CommitMarker {
            job_id: "golden".into(),
            writer: None,
            checkpoint_id: checkpoint,
            positions: [("src/0".to_string(), (checkpoint * 10).to_string())].into(),
            operators: Default::default(),
            streams: Default::default(),
        };

        // s1: append 1..5
        let s1_files = write_data(&table, &[1, 2, 3, 4, 5], 1.0).await;
        let table = commit(
            &client,
            &ident,
            Delta {
                data_files: s1_files.clone(),
                properties: marker(1).to_properties(),
                ..Delta::default()
            },
        )
        .await;
        check(
            &table,
            s3,
            &[(1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0), (5, 1.0)],
            "s1 append",
        )
        .await;

        // s2: position delete of id 2
        let deletes = position_delete(&table, &s1_files, 2).await;
        // One data file is targeted, so the delete file names it (readers can prune by it).
        let target = deletes[0].referenced_data_file().unwrap();
        assert!(s1_files.iter().any(|f| f.file_path() == target));
        let table = commit(
            &client,
            &ident,
            Delta {
                delete_files: deletes,
                properties: marker(2).to_properties(),
                ..Delta::default()
            },
        )
        .await;
        check(
            &table,
            s3,
            &[(1, 1.0), (3, 1.0), (4, 1.0), (5, 1.0)],
            "s2 position delete",
        )
        .await;
        // PyIceberg reads position deletes (it refuses equality deletes, s3 onwards).
        if let Some(rows) = support::pyiceberg(table.metadata_location.as_deref().unwrap(), s3) {
            assert_eq!(
                rows,
                vec![(1, 1.0), (3, 1.0), (4, 1.0), (5, 1.0)],
                "s2: PyIceberg"
            );
        }

        // s3: equality delete id=3
        let deletes = write_equality_deletes(&table, &[3]).await;
        let table = commit(
            &client,
            &ident,
            Delta {
                delete_files: deletes,
                properties: marker(3).to_properties(),
                ..Delta::default()
            },
        )
        .await;
        check(
            &table,
            s3,
            &[(1, 1.0), (4, 1.0), (5, 1.0)],
            "s3 equality delete",
        )
        .await;

        // s4: upsert id 4 — the equality delete and the new row share the snapshot's sequence
        // number, so only the old row goes.
        let deletes = write_equality_deletes(&table, &[4]).await;
        let data = write_data(&table, &[4], 2.0).await;
        let table = commit(
            &client,
            &ident,
            Delta {
                data_files: data,
                delete_files: deletes,
                properties: marker(4).to_properties(),
                ..Delta::default()
            },
        )
        .await;
        check(&table, s3, &[(1, 1.0), (4, 2.0), (5, 1.0)], "s4 upsert").await;

        // s5: insert 6 and 7 and delete 6 by position in the same commit.
        let data = write_data(&table, &[6, 7], 3.0).await;
        let deletes = position_delete(&table, &data, 6).await;
        let table = commit(
            &client,
            &ident,
            Delta {
                data_files: data,
                delete_files: deletes,
                properties: marker(5).to_properties(),
                ..Delta::default()
            },
        )
        .await;
        check(
            &table,
            s3,
            &[(1, 1.0), (4, 2.0), (5, 1.0), (7, 3.0)],
            "s5 insert + position delete",
        )
        .await;

        // s6: TRUNCATE, then insert 8 in the same commit: data and delete files of the past
        // leave the table, the new row stays.
        let data = write_data(&table, &[8], 4.0).await;
        let table = commit(
            &client,
            &ident,
            Delta {
                data_files: data,
                delete_files: Vec::new(),
                properties: marker(6).to_properties(),
                truncate: true,
                ..Delta::default()
            },
        )
        .await;
        check(&table, s3, &[(8, 4.0)], "s6 truncate + insert").await;
        assert_eq!(
            summary_totals(&table),
            live_totals(&table).await,
            "s6: the truncate's total-* properties count what is left"
        );

        // s7: rows copied from a database (9, 10) and a change of 9 before the checkpoint: the
        // copied rows go first, in a snapshot of their own, so the change's equality delete —
        // one sequence number later, in the same commit — reaches the copied 9.
        let before = table.metadata.current_snapshot().unwrap().clone();
        let copied = write_data(&table, &[9, 10], 5.0).await;
        let deletes = write_equality_deletes(&table, &[9]).await;
        let changed = write_data(&table, &[9], 6.0).await;
        let table = commit(
            &client,
            &ident,
            Delta {
                first_data_files: copied,
                data_files: changed,
                delete_files: deletes,
                properties: marker(7).to_properties(),
                ..Delta::default()
            },
        )
        .await;
        check(
            &table,
            s3,
            &[(8, 4.0), (9, 6.0), (10, 5.0)],
            "s7 first files + upsert",
        )
        .await;
        let head = table.metadata.current_snapshot().unwrap();
        let first = table
            .metadata
            .snapshot_by_id(head.parent_snapshot_id().unwrap())
            .unwrap();
        assert_eq!(first.parent_snapshot_id(), Some(before.snapshot_id()));
        assert_eq!(first.sequence_number(), before.sequence_number() + 1);
        assert_eq!(head.sequence_number(), first.sequence_number() + 1);
        assert_eq!(
            newest_marker(&table.metadata, "golden")
                .unwrap()
                .snapshot_id,
            head.snapshot_id(),
            "the marker is on the second snapshot"
        );

        // The newest marker of the job is found again, with its positions.
        let found = newest_marker(&table.metadata, "golden").unwrap();
        assert_eq!(found.marker, marker(7));
        assert_eq!(
            Some(found.snapshot_id),
            table.metadata.current_snapshot_id()
        );
        assert_eq!(newest_marker(&table.metadata, "other-job"), None);
        eprintln!("[{}] conformance scenario ok", backend.label);
        h.catalog.stop().await.unwrap();
    }
}
