//! RewriteFiles: a compaction that applies deletes keeps exactly the live rows; racing an
//! equality delete keeps the row deleted; racing a position delete on a replaced file fails
//! validation instead of resurrecting the row; a file can be replaced only once.

mod support;

use floe_lake::ErrorKind;
use floe_lake::commit::{RetryPolicy, commit_operation};
use floe_lake::rest::{CatalogClient, LoadedTable};
use floe_lake::rewrite::Rewrite;
use floe_lake::snapshot::Delta;
use iceberg::TableIdent;
use support::common::{Harness, backends};
use support::{
    check, commit, create_table, live_files, plan_full_rewrite, position_delete, scan, write_data,
    write_equality_deletes,
};

/// A table with several small files and every kind of delete: rows 1..=8 at amount 1.0,
/// id 2 deleted by position, id 3 by equality, id 4 upserted to 2.0.
async fn messy_table(client: &CatalogClient, name: &str) -> (TableIdent, LoadedTable) {
    let (ident, table) = create_table(client, "compact", name).await;
    let first = write_data(&table, &[1, 2, 3, 4], 1.0).await;
    let table = commit(
        client,
        &ident,
        Delta {
            data_files: first.clone(),
            ..Delta::default()
        },
    )
    .await;
    let table = commit(
        client,
        &ident,
        Delta {
            data_files: write_data(&table, &[5, 6, 7, 8], 1.0).await,
            ..Delta::default()
        },
    )
    .await;
    let pos_deletes = position_delete(&table, &first, 2).await;
    let table = commit(
        client,
        &ident,
        Delta {
            delete_files: pos_deletes,
            ..Delta::default()
        },
    )
    .await;
    let table = commit(
        client,
        &ident,
        Delta {
            delete_files: write_equality_deletes(&table, &[3]).await,
            ..Delta::default()
        },
    )
    .await;
    let upsert = Delta {
        data_files: write_data(&table, &[4], 2.0).await,
        delete_files: write_equality_deletes(&table, &[4]).await,
        ..Delta::default()
    };
    let table = commit(client, &ident, upsert).await;
    (ident, table)
}

const AFTER_MESS: &[(i64, f64)] = &[(1, 1.0), (4, 2.0), (5, 1.0), (6, 1.0), (7, 1.0), (8, 1.0)];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrite_applies_deletes_and_keeps_every_live_row() {
    for backend in backends() {
        let h = Harness::start(&backend).await;
        let s3 = h.config.warehouse.starts_with("s3://");
        let client = support::client(&h, &h.catalog.uri()).await;
        let (ident, table) = messy_table(&client, "full").await;
        check(&table, s3, AFTER_MESS, "before").await;
        let (data_before, deletes_before) = live_files(&table).await;
        let rewrite = plan_full_rewrite(&table).await;
        let snapshot = commit_operation(&client, &ident, &rewrite, &RetryPolicy::default())
            .await
            .unwrap()
            .unwrap();
        let table = client.load_table(&ident).await.unwrap();
        assert_eq!(table.metadata.current_snapshot_id(), Some(snapshot));
        check(&table, s3, AFTER_MESS, "after rewrite").await;
        let (data_after, deletes_after) = live_files(&table).await;
        assert!(
            deletes_after.is_empty(),
            "[{}] delete files remain",
            backend.label
        );
        assert!(
            data_after.len() < data_before.len(),
            "[{}] {} -> {}",
            backend.label,
            data_before.len(),
            data_after.len()
        );
        assert!(!deletes_before.is_empty());
        h.catalog.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewrite_racing_an_equality_delete_keeps_the_row_deleted() {
    let h = Harness::start(&backends()[0]).await;
    let client = support::client(&h, &h.catalog.uri()).await;
    let (ident, table) = messy_table(&client, "race_eq").await;
    let rewrite = plan_full_rewrite(&table).await;
    // While the compactor works: delete 1 and upsert 5 by key.
    let concurrent = Delta {
        data_files: write_data(&table, &[5], 3.0).await,
        delete_files: write_equality_deletes(&table, &[1, 5]).await,
        ..Delta::default()
    };
    commit(&client, &ident, concurrent).await;
    commit_operation(&client, &ident, &rewrite, &RetryPolicy::default())
        .await
        .unwrap();
    let table = client.load_table(&ident).await.unwrap();
    check(
        &table,
        false,
        &[(4, 2.0), (5, 3.0), (6, 1.0), (7, 1.0), (8, 1.0)],
        "rewrite after a concurrent delete",
    )
    .await;
    h.catalog.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewrite_racing_a_position_delete_fails_validation() {
    let h = Harness::start(&backends()[0]).await;
    let client = support::client(&h, &h.catalog.uri()).await;
    let (ident, table) = messy_table(&client, "race_pos").await;
    let rewrite = plan_full_rewrite(&table).await;
    let (data, _) = live_files(&table).await;
    let deletes = position_delete(&table, &data, 7).await;
    commit(
        &client,
        &ident,
        Delta {
            delete_files: deletes,
            ..Delta::default()
        },
    )
    .await;
    let error = commit_operation(&client, &ident, &rewrite, &RetryPolicy::default())
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Conflict, "{error}");
    let expected: Vec<(i64, f64)> = AFTER_MESS
        .iter()
        .copied()
        .filter(|(id, _)| *id != 7)
        .collect();
    let table = client.load_table(&ident).await.unwrap();
    check(&table, false, &expected, "failed rewrite changed nothing").await;
    // Planned again on the new state, it goes through.
    let rewrite = plan_full_rewrite(&table).await;
    commit_operation(&client, &ident, &rewrite, &RetryPolicy::default())
        .await
        .unwrap();
    let table = client.load_table(&ident).await.unwrap();
    check(&table, false, &expected, "second plan").await;
    // The same plan cannot be applied twice over: its input files are gone.
    let stale = Rewrite {
        id: uuid::Uuid::new_v4(),
        ..rewrite
    };
    let error = commit_operation(&client, &ident, &stale, &RetryPolicy::default())
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Conflict, "{error}");
    assert_eq!(
        scan(&client.load_table(&ident).await.unwrap()).await,
        expected
    );
    h.catalog.stop().await.unwrap();
}
