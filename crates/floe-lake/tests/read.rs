//! `floe_lake::read` against what the table holds: deletes of an unpartitioned spec applying
//! everywhere, upserts within one commit, position deletes, a column added after the first
//! files, a file filter by partition and an older snapshot. Every read is also compared with
//! iceberg-rust's reader (the model test compares both on random histories).

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{Array, Int32Array, Int64Array, RecordBatch, StringArray};
use floe_lake::read::{ReadRequest, read_live};
use floe_lake::rest::{CatalogClient, LoadedTable};
use floe_lake::snapshot::Delta;
use floe_lake::tables::{Wanted, ensure_table};
use floe_lake::writer::{
    DataWriter, EqualityDeleteWriter, PositionDeletes, WriterOptions, equality_delete_input,
    write_position_deletes,
};
use futures::TryStreamExt;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{Literal, NestedField, PrimitiveType, Schema, Type};
use support::common::{Harness, backends};
use support::{commit, create_table, locate, scan_batches, write_data};

/// A row as read back: id, name, extra.
type Row = (i64, Option<String>, Option<i32>);

fn schema(with_extra: bool) -> Schema {
    let mut fields = vec![
        NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
        NestedField::optional(2, "name", Type::Primitive(PrimitiveType::String)).into(),
    ];
    if with_extra {
        fields.push(NestedField::optional(3, "extra", Type::Primitive(PrimitiveType::Int)).into());
    }
    Schema::builder()
        .with_fields(fields)
        .with_identifier_field_ids(vec![1])
        .build()
        .unwrap()
}

async fn flat_table(client: &CatalogClient, with_extra: bool) -> LoadedTable {
    let schema = schema(with_extra);
    let none = BTreeMap::new();
    ensure_table(
        client,
        "read",
        &Wanted {
            name: "flat",
            schema: &schema,
            partition: &[],
            properties: &none,
            maintained: &none,
        },
    )
    .await
    .unwrap()
}

/// Rows of the table's current schema for `ids`.
fn rows(table: &LoadedTable, ids: &[i64], name: &str, extra: Option<i32>) -> RecordBatch {
    let arrow = Arc::new(schema_to_arrow_schema(table.metadata.current_schema()).unwrap());
    let mut columns: Vec<Arc<dyn Array>> = vec![
        Arc::new(Int64Array::from(ids.to_vec())),
        Arc::new(StringArray::from_iter_values(ids.iter().map(|_| name))),
    ];
    if arrow.fields().len() == 3 {
        columns.push(Arc::new(Int32Array::from(vec![extra; ids.len()])));
    }
    RecordBatch::try_new(arrow, columns).unwrap()
}

async fn data(table: &LoadedTable, ids: &[i64], name: &str, extra: Option<i32>) -> Delta {
    let mut writer = DataWriter::data(table, &WriterOptions::default()).unwrap();
    writer.write(&rows(table, ids, name, extra)).await.unwrap();
    Delta {
        data_files: writer.close().await.unwrap(),
        ..Delta::default()
    }
}

async fn deletes(table: &LoadedTable, ids: &[i64]) -> Vec<iceberg::spec::DataFile> {
    let (_, input) = equality_delete_input(table, &["id"]).unwrap();
    let arrow = Arc::new(schema_to_arrow_schema(&input).unwrap());
    let batch =
        RecordBatch::try_new(arrow, vec![Arc::new(Int64Array::from(ids.to_vec()))]).unwrap();
    let mut writer =
        EqualityDeleteWriter::equality(table, &WriterOptions::default(), &["id"]).unwrap();
    writer.write(&batch).await.unwrap();
    writer.close().await.unwrap()
}

fn to_rows(batches: &[RecordBatch]) -> Vec<Row> {
    let mut out = Vec::new();
    for b in batches {
        let id = b.column_by_name("id").unwrap();
        let id = id.as_any().downcast_ref::<Int64Array>().unwrap();
        let name = b.column_by_name("name").unwrap();
        let name = name.as_any().downcast_ref::<StringArray>().unwrap();
        let extra = b.column_by_name("extra");
        let extra = extra.map(|e| e.as_any().downcast_ref::<Int32Array>().unwrap().clone());
        for i in 0..b.num_rows() {
            out.push((
                id.value(i),
                name.is_valid(i).then(|| name.value(i).to_string()),
                extra
                    .as_ref()
                    .and_then(|e| e.is_valid(i).then(|| e.value(i))),
            ));
        }
    }
    out.sort();
    out
}

async fn ours(table: &LoadedTable, request: ReadRequest) -> Vec<RecordBatch> {
    read_live(table, request)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_rows_follow_every_delete_rule() {
    let h = Harness::start(&backends()[0]).await;
    let client = support::client(&h, &h.catalog.uri()).await;
    client.ensure_namespace(&["read"]).await.unwrap();
    let table = flat_table(&client, false).await;
    let ident = table.ident.clone();

    // 1: ids 0..1000.
    let all: Vec<i64> = (0..1000).collect();
    let first = data(&table, &all, "a", None).await;
    let first_files = first.data_files.clone();
    let table = commit(&client, &ident, first).await;
    let first_snapshot = table.metadata.current_snapshot_id().unwrap();

    // 2: delete 0..100 and insert 50..100 anew in the same commit (an upsert: the commit's
    // own deletes do not reach its rows).
    let mut upsert = data(&table, &(50..100).collect::<Vec<_>>(), "b", None).await;
    upsert.delete_files = deletes(&table, &(0..100).collect::<Vec<_>>()).await;
    commit(&client, &ident, upsert).await;

    // 3: a column is added; new rows carry it; 900..910 are deleted.
    let table = flat_table(&client, true).await;
    let mut later = data(&table, &(2000..2010).collect::<Vec<_>>(), "c", Some(7)).await;
    later.delete_files = deletes(&table, &(900..910).collect::<Vec<_>>()).await;
    let table = commit(&client, &ident, later).await;

    // 4: id 500 is deleted by position.
    let (file, position) = locate(&table, &first_files, 500).await;
    let pos = write_position_deletes(
        &table,
        &WriterOptions::default(),
        &[PositionDeletes {
            data_file: &file,
            positions: vec![position],
        }],
    )
    .await
    .unwrap();
    let table = commit(
        &client,
        &ident,
        Delta {
            delete_files: pos,
            ..Delta::default()
        },
    )
    .await;

    let mut expected: Vec<Row> = Vec::new();
    expected.extend((50..100).map(|i| (i, Some("b".to_string()), None)));
    expected.extend(
        (100..1000)
            .filter(|i| !(900..910).contains(i) && *i != 500)
            .map(|i| (i, Some("a".to_string()), None)),
    );
    expected.extend((2000..2010).map(|i| (i, Some("c".to_string()), Some(7))));
    expected.sort();

    let read = to_rows(&ours(&table, ReadRequest::current()).await);
    assert_eq!(read.len(), expected.len());
    assert_eq!(read, expected, "floe_lake::read");
    assert_eq!(
        to_rows(&scan_batches(&table, None).await),
        expected,
        "iceberg-rust"
    );

    // Some columns, in the order asked for.
    let some = ours(&table, ReadRequest::current().columns(&["extra", "id"])).await;
    let names: Vec<String> = some[0]
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["extra", "id"]);
    assert_eq!(
        some.iter().map(RecordBatch::num_rows).sum::<usize>(),
        expected.len()
    );

    // An older snapshot: the deletes committed after it do not apply.
    let old = to_rows(&ours(&table, ReadRequest::current().snapshot(first_snapshot)).await);
    assert_eq!(old.len(), 1000);
    assert!(
        old.iter()
            .all(|(_, name, extra)| name.as_deref() == Some("a") && extra.is_none())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_filter_reads_one_partition_with_its_deletes() {
    let h = Harness::start(&backends()[0]).await;
    let client = support::client(&h, &h.catalog.uri()).await;
    let (ident, table) = create_table(&client, "read", "regions").await;
    let ids: Vec<i64> = (0..200).collect();
    let table = commit(
        &client,
        &ident,
        Delta {
            data_files: write_data(&table, &ids, 1.0).await,
            ..Delta::default()
        },
    )
    .await;
    let table = commit(
        &client,
        &ident,
        Delta {
            delete_files: support::write_equality_deletes(&table, &[0, 1, 2, 3]).await,
            ..Delta::default()
        },
    )
    .await;
    // Partition field 1 is region (field 0 is the day of ts).
    let us = ReadRequest::current().columns(&["id"]).files(|spec, file| {
        let region = spec.fields().iter().position(|f| f.name == "region");
        region.is_some_and(|i| file.partition().fields()[i] == Some(Literal::string("us")))
    });
    let batches = ours(&table, us).await;
    let mut read: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            let ids = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            ids.values().to_vec()
        })
        .collect();
    read.sort();
    let expected: Vec<i64> = (4..200).filter(|i| i % 2 == 0).collect();
    assert_eq!(read, expected);
}
