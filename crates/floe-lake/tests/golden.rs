//! The delete-file conformance scenario (shared/reference/test-tools.md §7), committed through a
//! real floe-catalog and read back by our own scan (iceberg-rust) and by DuckDB 1.5.5:
//!
//! | snapshot | change | live ids |
//! |---|---|---|
//! | s1 | append 1–5 | 1 2 3 4 5 |
//! | s2 | position delete of id 2 | 1 3 4 5 |
//! | s3 | equality delete id=3 | 1 4 5 |
//! | s4 | equality delete id=4 and a new row 4 in the same snapshot | 1 4(new) 5 |
//! | s5 | insert 6 and 7 and a position delete of 6 in the same snapshot | 1 4 5 7 |

#[path = "../../../catalog/tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{
    Array, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use floe_lake::marker::{CommitMarker, newest_marker};
use floe_lake::rest::{CatalogClient, CatalogSettings, LoadedTable};
use floe_lake::snapshot::{Delta, prepare_row_delta};
use floe_lake::writer::{
    DataWriter, EqualityDeleteWriter, PositionDeletes, WriterOptions, equality_delete_input,
    write_position_deletes,
};
use futures::TryStreamExt;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{
    DataFile, NestedField, PrimitiveType, Schema, SchemaRef, Transform, Type, UnboundPartitionSpec,
};
use iceberg::{NamespaceIdent, TableIdent};
use iceberg_catalog_rest::CreateTableRequest;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

const DAY_US: i64 = 86_400_000_000;

fn table_schema() -> Schema {
    Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::optional(2, "region", Type::Primitive(PrimitiveType::String)).into(),
            NestedField::optional(3, "ts", Type::Primitive(PrimitiveType::Timestamptz)).into(),
            NestedField::optional(4, "amount", Type::Primitive(PrimitiveType::Double)).into(),
        ])
        .with_identifier_field_ids(vec![1])
        .build()
        .unwrap()
}

fn region(id: i64) -> &'static str {
    if id % 2 == 0 { "us" } else { "eu" }
}

/// Rows of `schema` (the table's, or an equality-delete input) for `ids`; `amount` tells
/// versions of a row apart.
fn batch(schema: &SchemaRef, ids: &[i64], amount: f64) -> RecordBatch {
    let arrow = Arc::new(schema_to_arrow_schema(schema).unwrap());
    let columns: Vec<Arc<dyn Array>> = arrow
        .fields()
        .iter()
        .map(|f| -> Arc<dyn Array> {
            match f.name().as_str() {
                "id" => Arc::new(Int64Array::from(ids.to_vec())),
                "region" => Arc::new(StringArray::from_iter_values(
                    ids.iter().map(|i| region(*i)),
                )),
                "ts" => Arc::new(
                    TimestampMicrosecondArray::from_iter_values(
                        ids.iter().map(|i| 19_700 * DAY_US + i),
                    )
                    .with_timezone("+00:00"),
                ),
                "amount" => Arc::new(Float64Array::from(vec![amount; ids.len()])),
                other => panic!("unexpected column {other}"),
            }
        })
        .collect();
    RecordBatch::try_new(arrow, columns).unwrap()
}

async fn write_data(table: &LoadedTable, ids: &[i64], amount: f64) -> Vec<DataFile> {
    let mut writer = DataWriter::data(table, &WriterOptions::default()).unwrap();
    writer
        .write(&batch(table.metadata.current_schema(), ids, amount))
        .await
        .unwrap();
    writer.close().await.unwrap()
}

async fn write_equality_deletes(table: &LoadedTable, ids: &[i64]) -> Vec<DataFile> {
    let (_, input) = equality_delete_input(table, &["id"]).unwrap();
    let mut writer =
        EqualityDeleteWriter::equality(table, &WriterOptions::default(), &["id"]).unwrap();
    writer.write(&batch(&input, ids, 0.0)).await.unwrap();
    writer.close().await.unwrap()
}

/// The file holding `id` among `files`, and its row position there.
async fn locate(table: &LoadedTable, files: &[DataFile], id: i64) -> (DataFile, i64) {
    for file in files {
        let bytes = table
            .io
            .new_input(file.file_path())
            .unwrap()
            .read()
            .await
            .unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .unwrap()
            .build()
            .unwrap();
        let mut position = 0i64;
        for batch in reader {
            let batch = batch.unwrap();
            let ids = batch
                .column_by_name("id")
                .unwrap()
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            for value in ids.values() {
                if *value == id {
                    return (file.clone(), position);
                }
                position += 1;
            }
        }
    }
    panic!("id {id} is in none of the files");
}

async fn commit(client: &CatalogClient, ident: &TableIdent, delta: Delta) -> LoadedTable {
    let table = client.load_table(ident).await.unwrap();
    let prepared = prepare_row_delta(&table, &delta).await.unwrap();
    client.commit_table(&prepared.commit).await.unwrap();
    let after = client.load_table(ident).await.unwrap();
    assert_eq!(
        after.metadata.current_snapshot_id(),
        Some(prepared.snapshot_id)
    );
    after
}

/// (id, amount) pairs our own scan returns.
async fn scan(table: &LoadedTable) -> Vec<(i64, f64)> {
    let batches: Vec<RecordBatch> = table
        .to_table()
        .unwrap()
        .scan()
        .select(["id", "amount"])
        .build()
        .unwrap()
        .to_arrow()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let mut rows = Vec::new();
    for b in batches {
        let ids = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        let amounts = b.column(1).as_any().downcast_ref::<Float64Array>().unwrap();
        rows.extend(
            ids.values()
                .iter()
                .zip(amounts.values())
                .map(|(i, a)| (*i, *a)),
        );
    }
    rows.sort_by(|a, b| a.partial_cmp(b).unwrap());
    rows
}

/// (id, amount) pairs DuckDB 1.5.5 reads from a metadata file, or `None` without the venv.
fn duckdb(metadata_location: &str, s3: bool) -> Option<Vec<(i64, f64)>> {
    let python = match std::env::var("FLOE_TEST_PYTHON") {
        Ok(p) => p,
        Err(_) => {
            assert!(
                std::env::var("FLOE_REQUIRE_SERVICES").as_deref() != Ok("1"),
                "FLOE_REQUIRE_SERVICES=1 but FLOE_TEST_PYTHON is not set"
            );
            eprintln!("note: FLOE_TEST_PYTHON unset, skipping the DuckDB read-back");
            return None;
        }
    };
    let helpers = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/services/python");
    let script = format!(
        "import json, duckdb_offline\n\
         con = duckdb_offline.connect()\n\
         {secret}\n\
         rows = con.sql(\"SELECT id, amount FROM iceberg_scan('{metadata_location}') ORDER BY id, amount\").fetchall()\n\
         print(json.dumps(rows))",
        secret = if s3 {
            "duckdb_offline.create_s3_secret(con)"
        } else {
            ""
        }
    );
    let out = std::process::Command::new(python)
        .args(["-c", &script])
        .env("PYTHONPATH", helpers)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "duckdb failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<(i64, f64)> = serde_json::from_slice(&out.stdout).unwrap();
    Some(rows)
}

async fn check(table: &LoadedTable, s3: bool, expected: &[(i64, f64)], step: &str) {
    assert_eq!(scan(table).await, expected, "{step}: our scan");
    if let Some(rows) = duckdb(table.metadata_location.as_deref().unwrap(), s3) {
        assert_eq!(rows, expected, "{step}: DuckDB");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_conformance_scenario() {
    for backend in common::backends() {
        let h = common::Harness::start(&backend).await;
        let s3 = h.config.warehouse.starts_with("s3://");
        let mut io_properties = HashMap::new();
        if s3 {
            io_properties.insert("s3.access-key-id".into(), "test".into());
            io_properties.insert("s3.secret-access-key".into(), "test".into());
        }
        let client = CatalogClient::connect(CatalogSettings {
            uri: h.catalog.uri(),
            io_properties,
            ..CatalogSettings::default()
        })
        .await
        .unwrap();
        assert!(client.supports_transactions());
        client.ensure_namespace(&["golden"]).await.unwrap();
        let ident = TableIdent::new(NamespaceIdent::new("golden".into()), "orders".into());
        let spec = UnboundPartitionSpec::builder()
            .add_partition_field(3, "ts_day", Transform::Day)
            .unwrap()
            .add_partition_field(2, "region", Transform::Identity)
            .unwrap()
            .build();
        let table = client
            .create_table(
                &ident,
                &CreateTableRequest {
                    name: "orders".into(),
                    location: None,
                    schema: table_schema(),
                    partition_spec: Some(spec),
                    write_order: None,
                    stage_create: None,
                    properties: HashMap::from([("format-version".into(), "2".into())]),
                },
            )
            .await
            .unwrap();
        let marker = |checkpoint: u64| CommitMarker {
            job_id: "golden".into(),
            checkpoint_id: checkpoint,
            positions: [("src/0".to_string(), (checkpoint * 10).to_string())].into(),
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
        let (file, pos) = locate(&table, &s1_files, 2).await;
        let deletes = write_position_deletes(
            &table,
            &WriterOptions::default(),
            &[PositionDeletes {
                data_file: &file,
                positions: vec![pos],
            }],
        )
        .await
        .unwrap();
        assert_eq!(
            deletes[0].referenced_data_file().as_deref(),
            Some(file.file_path())
        );
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
            },
        )
        .await;
        check(&table, s3, &[(1, 1.0), (4, 2.0), (5, 1.0)], "s4 upsert").await;

        // s5: insert 6 and 7 and delete 6 by position in the same commit.
        let data = write_data(&table, &[6, 7], 3.0).await;
        let (file, pos) = locate(&table, &data, 6).await;
        let deletes = write_position_deletes(
            &table,
            &WriterOptions::default(),
            &[PositionDeletes {
                data_file: &file,
                positions: vec![pos],
            }],
        )
        .await
        .unwrap();
        let table = commit(
            &client,
            &ident,
            Delta {
                data_files: data,
                delete_files: deletes,
                properties: marker(5).to_properties(),
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

        // The newest marker of the job is found again, with its positions.
        let found = newest_marker(&table.metadata, "golden").unwrap();
        assert_eq!(found.marker, marker(5));
        assert_eq!(
            Some(found.snapshot_id),
            table.metadata.current_snapshot_id()
        );
        assert_eq!(newest_marker(&table.metadata, "other-job"), None);
        eprintln!("[{}] conformance scenario ok", backend.label);
        h.catalog.stop().await.unwrap();
    }
}
