//! iceberg-rust's own `RestCatalog` against floe-catalog: namespaces, a partitioned table,
//! appends written with iceberg's Parquet writers, scans, schema evolution, rename, and drop
//! with purge — on every configured store × warehouse.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use common::{Harness, backends};
use futures::TryStreamExt;
use iceberg::arrow::{RecordBatchPartitionSplitter, schema_to_arrow_schema};
use iceberg::spec::{
    DataFileFormat, NestedField, PrimitiveType, Schema, Transform, Type, UnboundPartitionSpec,
};
use iceberg::table::Table;
use iceberg::transaction::{AddColumn, ApplyTransactionAction, Transaction};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::partitioning::PartitioningWriter;
use iceberg::writer::partitioning::fanout_writer::FanoutWriter;
use iceberg::{Catalog, CatalogBuilder, NamespaceIdent, TableCreation, TableIdent};
use iceberg_catalog_rest::{RestCatalog, RestCatalogBuilder};
use iceberg_storage_opendal::OpenDalResolvingStorageFactory;
use parquet::file::properties::WriterProperties;

async fn client(h: &Harness) -> RestCatalog {
    let mut props = HashMap::from([
        ("uri".to_string(), h.catalog.uri()),
        ("warehouse".to_string(), h.config.name.clone()),
    ]);
    if let Some(endpoint) = &h.config.s3.endpoint {
        props.insert("s3.endpoint".into(), endpoint.clone());
        props.insert("s3.path-style-access".into(), "true".into());
        props.insert("s3.region".into(), "us-east-1".into());
        props.insert("s3.access-key-id".into(), "test".into());
        props.insert("s3.secret-access-key".into(), "test".into());
    }
    RestCatalogBuilder::default()
        .with_storage_factory(Arc::new(OpenDalResolvingStorageFactory::new()))
        .load("floe", props)
        .await
        .expect("rest catalog client")
}

async fn append(catalog: &RestCatalog, table: &Table, ids: &[i64], regions: &[&str]) -> Table {
    let schema = table.metadata().current_schema().clone();
    let arrow_schema = Arc::new(schema_to_arrow_schema(&schema).unwrap());
    let mut columns: Vec<arrow_array::ArrayRef> = vec![
        Arc::new(Int64Array::from(ids.to_vec())),
        Arc::new(StringArray::from(regions.to_vec())),
    ];
    // Columns added by schema evolution are written as NULL.
    for _ in 2..arrow_schema.fields().len() {
        columns.push(Arc::new(StringArray::from(vec![None::<&str>; ids.len()])));
    }
    let batch = RecordBatch::try_new(arrow_schema, columns).unwrap();
    let writer = DataFileWriterBuilder::new(RollingFileWriterBuilder::new_with_default_file_size(
        ParquetWriterBuilder::new(WriterProperties::default(), schema.clone()),
        table.file_io().clone(),
        DefaultLocationGenerator::new(table.metadata()).unwrap(),
        DefaultFileNameGenerator::new(
            "test".into(),
            Some(uuid::Uuid::new_v4().to_string()),
            DataFileFormat::Parquet,
        ),
    ));
    let mut fanout = FanoutWriter::new(writer);
    let splitter = RecordBatchPartitionSplitter::try_new_with_computed_values(
        schema.clone(),
        table.metadata().default_partition_spec().clone(),
    )
    .unwrap();
    for (key, part) in splitter.split(&batch).unwrap() {
        fanout.write(key, part).await.unwrap();
    }
    let files = fanout.close().await.unwrap();
    let tx = Transaction::new(table);
    let tx = tx.fast_append().add_data_files(files).apply(tx).unwrap();
    tx.commit(catalog).await.expect("append commits")
}

/// Table `name` of (id long, region string), partitioned by region.
fn clicks_creation(name: &str) -> TableCreation {
    let schema = Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::optional(2, "region", Type::Primitive(PrimitiveType::String)).into(),
        ])
        .build()
        .unwrap();
    let spec = UnboundPartitionSpec::builder()
        .add_partition_field(2, "region", Transform::Identity)
        .unwrap()
        .build();
    TableCreation::builder()
        .name(name.into())
        .schema(schema)
        .partition_spec(spec)
        .build()
}

async fn scan_ids(table: &Table) -> Vec<i64> {
    let batches: Vec<RecordBatch> = table
        .scan()
        .select_all()
        .build()
        .unwrap()
        .to_arrow()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let mut ids: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .values()
                .to_vec()
        })
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iceberg_rust_rest_catalog_round_trip() {
    for backend in backends() {
        let h = Harness::start(&backend).await;
        let catalog = client(&h).await;
        let ns = NamespaceIdent::from_strs(["rust", "events"]).unwrap();
        catalog
            .create_namespace(&NamespaceIdent::new("rust".into()), HashMap::new())
            .await
            .unwrap();
        catalog
            .create_namespace(&ns, HashMap::from([("owner".into(), "rust".into())]))
            .await
            .unwrap();
        assert!(catalog.namespace_exists(&ns).await.unwrap());
        assert_eq!(
            catalog.get_namespace(&ns).await.unwrap().properties()["owner"],
            "rust"
        );

        let table = catalog
            .create_table(&ns, clicks_creation("clicks"))
            .await
            .unwrap();
        let ident = TableIdent::new(ns.clone(), "clicks".into());
        assert!(catalog.table_exists(&ident).await.unwrap());

        let table = append(&catalog, &table, &[1, 2, 3], &["eu", "us", "eu"]).await;
        let table = append(&catalog, &table, &[4], &["ap"]).await;
        assert_eq!(
            scan_ids(&table).await,
            vec![1, 2, 3, 4],
            "[{}]",
            backend.label
        );
        assert_eq!(table.metadata().snapshots().len(), 2);

        // Schema evolution: add a column, write with it, read everything back.
        let tx = Transaction::new(&table);
        let tx = tx
            .update_schema()
            .add_column(AddColumn::optional(
                "note",
                Type::Primitive(PrimitiveType::String),
            ))
            .apply(tx)
            .unwrap();
        let table = tx.commit(&catalog).await.unwrap();
        assert!(
            table
                .metadata()
                .current_schema()
                .field_by_name("note")
                .is_some()
        );
        append(&catalog, &table, &[5], &["eu"]).await;
        let reloaded = catalog.load_table(&ident).await.unwrap();
        assert_eq!(
            scan_ids(&reloaded).await,
            vec![1, 2, 3, 4, 5],
            "[{}]",
            backend.label
        );

        // Rename, then drop with purge: the files go too.
        let renamed = TableIdent::new(ns.clone(), "clicks_v2".into());
        catalog.rename_table(&ident, &renamed).await.unwrap();
        assert!(!catalog.table_exists(&ident).await.unwrap());
        let moved = catalog.load_table(&renamed).await.unwrap();
        assert_eq!(scan_ids(&moved).await, vec![1, 2, 3, 4, 5]);
        let metadata_file = moved.metadata_location().unwrap().to_string();
        catalog.purge_table(&renamed).await.unwrap();
        assert!(!catalog.table_exists(&renamed).await.unwrap());
        let io = h.warehouse_io();
        assert!(
            !io.io().exists(&metadata_file).await.unwrap(),
            "[{}] purge kept metadata",
            backend.label
        );
        assert_eq!(
            catalog.list_tables(&ns).await.unwrap(),
            Vec::<TableIdent>::new()
        );
        catalog.drop_namespace(&ns).await.unwrap();
        h.catalog.stop().await.unwrap();
    }
}

/// The sequence numbers of a metadata JSON's `snapshots`, in listed order.
fn listed_sequence_numbers(metadata: &serde_json::Value) -> Vec<i64> {
    metadata["snapshots"]
        .as_array()
        .expect("snapshots")
        .iter()
        .map(|s| s["sequence-number"].as_i64().unwrap())
        .collect()
}

/// Readers that take the last listed snapshot as the newest (scripts, some tools) need the
/// metadata file and the REST responses to list snapshots in commit order, as Iceberg Java
/// does; iceberg-rust keeps them in a map.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_listed_in_commit_order() {
    let h = Harness::start(&backends()[0]).await;
    let catalog = client(&h).await;
    let ns = NamespaceIdent::new("ordered".into());
    catalog.create_namespace(&ns, HashMap::new()).await.unwrap();
    let mut table = catalog
        .create_table(&ns, clicks_creation("many"))
        .await
        .unwrap();
    let commits = 24;
    for i in 0..commits {
        table = append(&catalog, &table, &[i], &["eu"]).await;
    }
    let in_order: Vec<i64> = (1..=commits).collect();

    let (status, body) = h.get("namespaces/ordered/tables/many").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        listed_sequence_numbers(&body["metadata"]),
        in_order,
        "the load response"
    );
    let location = body["metadata-location"].as_str().unwrap();
    let bytes = table
        .file_io()
        .new_input(location)
        .unwrap()
        .read()
        .await
        .unwrap();
    let file: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        listed_sequence_numbers(&file),
        in_order,
        "the metadata file"
    );
    assert_eq!(
        file["current-snapshot-id"],
        file["snapshots"][commits as usize - 1]["snapshot-id"],
        "the last listed snapshot is the current one"
    );

    // A table asking for gzipped metadata gets it, in the same order.
    let creation = TableCreation::builder()
        .name("zipped".into())
        .schema(table.metadata().current_schema().as_ref().clone())
        .partition_spec(
            table
                .metadata()
                .default_partition_spec()
                .as_ref()
                .clone()
                .into_unbound(),
        )
        .properties(HashMap::from([(
            "write.metadata.compression-codec".to_string(),
            "gzip".to_string(),
        )]))
        .build();
    let mut zipped = catalog.create_table(&ns, creation).await.unwrap();
    for i in 0..3 {
        zipped = append(&catalog, &zipped, &[i], &["us"]).await;
    }
    let location = zipped.metadata_location().unwrap().to_string();
    assert!(location.ends_with(".gz.metadata.json"), "{location}");
    let bytes = zipped
        .file_io()
        .new_input(&location)
        .unwrap()
        .read()
        .await
        .unwrap();
    let mut json = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut json).unwrap();
    let file: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(
        listed_sequence_numbers(&file),
        [1, 2, 3],
        "the gzipped file"
    );
}
