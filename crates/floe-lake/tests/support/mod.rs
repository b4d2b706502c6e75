//! Helpers shared by floe-lake's integration tests: a catalog per backend, a client, a
//! partitioned v2 test table, writers of rows and deletes, our scan and DuckDB's.

#![allow(dead_code, unreachable_pub)]

#[path = "../../../../catalog/tests/common/mod.rs"]
pub mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow_array::{
    Array, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use floe_lake::rest::{CatalogClient, CatalogSettings, LoadedTable};
use floe_lake::rewrite::Rewrite;
use floe_lake::snapshot::{Delta, current_manifests, prepare_row_delta};
use floe_lake::writer::{
    DataWriter, EqualityDeleteWriter, PositionDeletes, WriterOptions, equality_delete_input,
    write_position_deletes,
};
use futures::TryStreamExt;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{
    DataContentType, DataFile, NestedField, PrimitiveType, Schema, SchemaRef, Transform, Type,
    UnboundPartitionSpec,
};
use iceberg::{NamespaceIdent, TableIdent};
use iceberg_catalog_rest::CreateTableRequest;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

/// A client of the harness's catalog (reached at `uri`, which may be a proxy in front of it).
pub async fn client(h: &common::Harness, uri: &str) -> CatalogClient {
    let mut io_properties = HashMap::new();
    if h.config.warehouse.starts_with("s3://") {
        io_properties.insert("s3.access-key-id".into(), "test".into());
        io_properties.insert("s3.secret-access-key".into(), "test".into());
    }
    CatalogClient::connect(CatalogSettings {
        uri: uri.to_string(),
        io_properties,
        ..CatalogSettings::default()
    })
    .await
    .unwrap()
}

/// Creates `ns.name`: id (identifier), region, ts, amount; partitioned by day(ts), region.
pub async fn create_table(
    client: &CatalogClient,
    ns: &str,
    name: &str,
) -> (TableIdent, LoadedTable) {
    client.ensure_namespace(&[ns]).await.unwrap();
    let ident = TableIdent::new(NamespaceIdent::new(ns.into()), name.into());
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
                name: name.into(),
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
    (ident, table)
}

const DAY_US: i64 = 86_400_000_000;

pub fn table_schema() -> Schema {
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

pub fn region(id: i64) -> &'static str {
    if id % 2 == 0 { "us" } else { "eu" }
}

/// Rows of `schema` (the table's, or an equality-delete input) for `ids`; `amount` tells
/// versions of a row apart.
pub fn batch(schema: &SchemaRef, ids: &[i64], amount: f64) -> RecordBatch {
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

pub async fn write_data(table: &LoadedTable, ids: &[i64], amount: f64) -> Vec<DataFile> {
    let mut writer = DataWriter::data(table, &WriterOptions::default()).unwrap();
    writer
        .write(&batch(table.metadata.current_schema(), ids, amount))
        .await
        .unwrap();
    writer.close().await.unwrap()
}

pub async fn write_equality_deletes(table: &LoadedTable, ids: &[i64]) -> Vec<DataFile> {
    let (_, input) = equality_delete_input(table, &["id"]).unwrap();
    let mut writer =
        EqualityDeleteWriter::equality(table, &WriterOptions::default(), &["id"]).unwrap();
    writer.write(&batch(&input, ids, 0.0)).await.unwrap();
    writer.close().await.unwrap()
}

/// The `id` column of one data file, in file order.
pub async fn file_ids(table: &LoadedTable, file: &DataFile) -> Vec<i64> {
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
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        let ids = batch
            .column_by_name("id")
            .unwrap()
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        out.extend(ids.values().iter().copied());
    }
    out
}

/// The file holding `id` among `files`, and its row position there.
pub async fn locate(table: &LoadedTable, files: &[DataFile], id: i64) -> (DataFile, i64) {
    for file in files {
        if let Some(position) = file_ids(table, file).await.iter().position(|v| *v == id) {
            return (file.clone(), position as i64);
        }
    }
    panic!("id {id} is in none of the files");
}

pub async fn commit(client: &CatalogClient, ident: &TableIdent, delta: Delta) -> LoadedTable {
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

/// The live rows of the current snapshot (deletes applied) by our scan, all columns or some.
///
/// iceberg-rust 0.10.1's scan can hang forever on a table with delete files: its delete loaders
/// wait on a `Notify` whose wake-up may come before they listen (fixed upstream after 0.10.1:
/// apache/iceberg-rust#2696, #2859, #2873). It hung floe-lake's model test twice in CI. Floe's
/// own reader (`floe_lake::read`) does not use it; this reference scan is bounded and retried.
///
/// Its equality deletes become one predicate, nested a level deeper per deleted key, which it
/// walks recursively: ~800 deleted keys overflowed a test thread's 2 MiB stack (the racing
/// compaction test, whose writer runs longer on a loaded machine). So the scan runs on a
/// thread of its own with a large stack.
pub async fn scan_batches(table: &LoadedTable, columns: Option<&[&str]>) -> Vec<RecordBatch> {
    let (table, columns) = (
        table.clone(),
        columns.map(|c| c.iter().map(|c| c.to_string()).collect::<Vec<_>>()),
    );
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("iceberg-rust scan".into())
        .stack_size(256 << 20)
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let columns: Option<Vec<&str>> = columns
                .as_ref()
                .map(|c| c.iter().map(String::as_str).collect());
            let _ = tx.send(runtime.block_on(iceberg_scan(&table, columns.as_deref())));
        })
        .unwrap();
    rx.await.expect("the iceberg-rust scan's thread panicked")
}

async fn iceberg_scan(table: &LoadedTable, columns: Option<&[&str]>) -> Vec<RecordBatch> {
    const ATTEMPTS: usize = 5;
    for attempt in 1..=ATTEMPTS {
        let iceberg_table = table.to_table().unwrap();
        let builder = iceberg_table.scan();
        let builder = match columns {
            Some(columns) => builder.select(columns.iter().copied()),
            None => builder.select_all(),
        };
        let scan = async {
            builder
                .build()
                .unwrap()
                .to_arrow()
                .await
                .unwrap()
                .try_collect::<Vec<RecordBatch>>()
                .await
                .unwrap()
        };
        match tokio::time::timeout(std::time::Duration::from_secs(30), scan).await {
            Ok(batches) => return batches,
            Err(_) => eprintln!(
                "iceberg-rust's scan hung (a lost wake-up in its delete loader); attempt \
                 {attempt} of {ATTEMPTS}"
            ),
        }
    }
    panic!("iceberg-rust's scan hung {ATTEMPTS} times");
}

/// (id, amount) pairs of a table's live rows, sorted.
pub fn id_amounts(batches: &[RecordBatch]) -> Vec<(i64, f64)> {
    let mut rows = Vec::new();
    for b in batches {
        let column = |name: &str| b.column_by_name(name).unwrap().clone();
        let (ids, amounts) = (column("id"), column("amount"));
        let ids = ids.as_any().downcast_ref::<Int64Array>().unwrap();
        let amounts = amounts.as_any().downcast_ref::<Float64Array>().unwrap();
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

/// (id, amount) pairs our own scans return: iceberg-rust's reader and `floe_lake::read`,
/// which must agree.
pub async fn scan(table: &LoadedTable) -> Vec<(i64, f64)> {
    let by_iceberg = id_amounts(&scan_batches(table, Some(&["id", "amount"])).await);
    let ours: Vec<RecordBatch> = floe_lake::read::read_live(
        table,
        floe_lake::read::ReadRequest::current().columns(&["id", "amount"]),
    )
    .await
    .unwrap()
    .try_collect()
    .await
    .unwrap();
    assert_eq!(
        id_amounts(&ours),
        by_iceberg,
        "floe_lake::read and iceberg-rust's reader disagree"
    );
    by_iceberg
}

/// Runs a Python snippet in the test venv that prints `(id, amount)` rows as JSON; `None`
/// without the venv (a failure when FLOE_REQUIRE_SERVICES=1).
fn python_rows(script: &str) -> Option<Vec<(i64, f64)>> {
    let python = match std::env::var("FLOE_TEST_PYTHON") {
        Ok(p) => p,
        Err(_) => {
            assert!(
                std::env::var("FLOE_REQUIRE_SERVICES").as_deref() != Ok("1"),
                "FLOE_REQUIRE_SERVICES=1 but FLOE_TEST_PYTHON is not set"
            );
            common::skipped("FLOE_TEST_PYTHON is not set: the Python read-back");
            return None;
        }
    };
    // The test helpers live at the workspace root, whichever crate includes this module.
    let helpers = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join("tests/services/python"))
        .find(|dir| dir.is_dir())
        .expect("tests/services/python above the crate");
    let out = std::process::Command::new(python)
        .args(["-c", script])
        .env("PYTHONPATH", helpers)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "python read-back failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

/// (id, amount) pairs DuckDB 1.5.5 reads from a metadata file.
pub fn duckdb(metadata_location: &str, s3: bool) -> Option<Vec<(i64, f64)>> {
    python_rows(&format!(
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
    ))
}

/// (id, amount) pairs PyIceberg 0.12 reads from a metadata file (it applies position deletes
/// and refuses equality deletes).
pub fn pyiceberg(metadata_location: &str, s3: bool) -> Option<Vec<(i64, f64)>> {
    let props = if s3 {
        "{'s3.endpoint': os.environ['FLOE_TEST_S3_ENDPOINT'], 's3.access-key-id': 'test', \
         's3.secret-access-key': 'test', 's3.region': 'us-east-1'}"
    } else {
        "{}"
    };
    python_rows(&format!(
        "import json, os\n\
         from pyiceberg.table import StaticTable\n\
         t = StaticTable.from_metadata('{metadata_location}', properties={props})\n\
         a = t.scan(selected_fields=('id', 'amount')).to_arrow()\n\
         print(json.dumps(sorted(zip(a['id'].to_pylist(), a['amount'].to_pylist()))))"
    ))
}

pub async fn check(table: &LoadedTable, s3: bool, expected: &[(i64, f64)], step: &str) {
    assert_eq!(scan(table).await, expected, "{step}: our scan");
    if let Some(rows) = duckdb(table.metadata_location.as_deref().unwrap(), s3) {
        assert_eq!(rows, expected, "{step}: DuckDB");
    }
}

/// Live data files and delete files of the current snapshot.
pub async fn live_files(table: &LoadedTable) -> (Vec<DataFile>, Vec<DataFile>) {
    let (mut data, mut deletes) = (Vec::new(), Vec::new());
    for manifest in current_manifests(table).await.unwrap() {
        for entry in manifest.load_manifest(&table.io).await.unwrap().entries() {
            if entry.is_alive() {
                match entry.content_type() {
                    DataContentType::Data => data.push(entry.data_file().clone()),
                    _ => deletes.push(entry.data_file().clone()),
                }
            }
        }
    }
    (data, deletes)
}

/// The `total-*` properties of the current snapshot's summary.
pub fn summary_totals(table: &LoadedTable) -> BTreeMap<String, u64> {
    let snapshot = table.metadata.current_snapshot().expect("a snapshot");
    snapshot
        .summary()
        .additional_properties
        .iter()
        .filter(|(k, _)| k.starts_with("total-"))
        .map(|(k, v)| (k.clone(), v.parse().unwrap()))
        .collect()
}

/// What the `total-*` properties must say: the live files of the current snapshot, counted.
pub async fn live_totals(table: &LoadedTable) -> BTreeMap<String, u64> {
    let (data, deletes) = live_files(table).await;
    let rows = |files: &[DataFile], content: DataContentType| -> u64 {
        files
            .iter()
            .filter(|f| f.content_type() == content)
            .map(DataFile::record_count)
            .sum()
    };
    let size: u64 = data
        .iter()
        .chain(&deletes)
        .map(DataFile::file_size_in_bytes)
        .sum();
    [
        ("total-data-files", data.len() as u64),
        ("total-records", rows(&data, DataContentType::Data)),
        ("total-delete-files", deletes.len() as u64),
        (
            "total-position-deletes",
            rows(&deletes, DataContentType::PositionDeletes),
        ),
        (
            "total-equality-deletes",
            rows(&deletes, DataContentType::EqualityDeletes),
        ),
        ("total-files-size", size),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Appends ids `first..` in `commits` separate commits of `per_commit` rows each (small files,
/// one per partition touched).
pub async fn append_in_commits(
    client: &CatalogClient,
    ident: &TableIdent,
    first: i64,
    commits: i64,
    per_commit: i64,
) {
    for c in 0..commits {
        let table = client.load_table(ident).await.unwrap();
        let start = first + c * per_commit;
        let ids: Vec<i64> = (start..start + per_commit).collect();
        let data_files = write_data(&table, &ids, 1.0).await;
        commit(
            client,
            ident,
            Delta {
                data_files,
                ..Delta::default()
            },
        )
        .await;
    }
}

/// Commits `delta` as checkpoint `checkpoint` of the job `writer`, retrying on conflicts with
/// other writers (maintenance) as a job does.
pub async fn commit_as_writer(
    client: &CatalogClient,
    ident: &TableIdent,
    checkpoint: u64,
    delta: Delta,
) {
    let marker = floe_lake::marker::CommitMarker {
        job_id: "writer".into(),
        writer: None,
        checkpoint_id: checkpoint,
        positions: Default::default(),
        operators: Default::default(),
        streams: Default::default(),
    };
    floe_lake::commit::commit_checkpoint(
        client,
        &marker,
        &[(ident.clone(), delta)],
        &floe_lake::commit::RetryPolicy::default(),
    )
    .await
    .unwrap();
}

/// Position-delete files removing the row of `id` found in `files`.
pub async fn position_delete(table: &LoadedTable, files: &[DataFile], id: i64) -> Vec<DataFile> {
    let (file, position) = locate(table, files, id).await;
    write_position_deletes(
        table,
        &WriterOptions::default(),
        &[PositionDeletes {
            data_file: &file,
            positions: vec![position],
        }],
    )
    .await
    .unwrap()
}

/// Plans a compaction of the whole table: read the live rows, write them anew, replace every
/// data and delete file.
pub async fn plan_full_rewrite(table: &LoadedTable) -> Rewrite {
    let (data, deletes) = live_files(table).await;
    let arrow = Arc::new(schema_to_arrow_schema(table.metadata.current_schema()).unwrap());
    let batches = scan_batches(table, None).await;
    let mut writer = DataWriter::data(table, &WriterOptions::default()).unwrap();
    for batch in batches {
        writer
            .write(&RecordBatch::try_new(arrow.clone(), batch.columns().to_vec()).unwrap())
            .await
            .unwrap();
    }
    Rewrite {
        id: uuid::Uuid::new_v4(),
        starting_snapshot_id: table.metadata.current_snapshot_id().unwrap(),
        removed_data_files: data,
        removed_delete_files: deletes,
        added_data_files: writer.close().await.unwrap(),
        properties: Default::default(),
    }
}
