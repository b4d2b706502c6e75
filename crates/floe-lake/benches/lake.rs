//! floe-lake benchmarks — `cargo bench -p floe-lake --bench lake`.
//!
//! 1. **Writer throughput** on the same batches, in one run: floe-lake's `DataWriter` (through
//!    iceberg's Parquet writer: statistics, rolling, partition fan-out) against a bare arrow-rs
//!    `ArrowWriter` with the same zstd settings writing one local file — the floor any Iceberg
//!    writer stands on. Reported as rows/s, MB/s of Parquet, and the ratio (target ≥ 0.85).
//! 2. **Commit latency as a table ages**: 1,000 checkpoint commits of one small file each,
//!    through a local floe-catalog; p50 of the first 100, of commits 101–200 (after the metadata
//!    log has filled to its bound of 100) and of the last 100 commits: never
//!    maintained, with manifest merging every 16 commits, and with merging plus snapshot expiry
//!    (keep 50) every 100 commits. Without expiry every commit still reads and rewrites a
//!    metadata file that lists every snapshot — Iceberg's own O(snapshots) cost, paid by any
//!    client; with both kinds of maintenance nothing grows.
//!
//! `FLOE_BENCH_ROWS` sets the rows of (1) (default 2,000,000), `FLOE_BENCH_COMMITS` those of
//! (2) (default 1000).

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use floe_lake::commit::{RetryPolicy, commit_checkpoint, commit_operation};
use floe_lake::expire::{ExpireSnapshots, expire_snapshots};
use floe_lake::manifests::RewriteManifests;
use floe_lake::marker::CommitMarker;
use floe_lake::rest::LoadedTable;
use floe_lake::snapshot::Delta;
use floe_lake::writer::{DataWriter, WriterOptions};
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use iceberg_catalog_rest::CreateTableRequest;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use support::common::{Harness, backends};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Span-like rows: ids, a low-cardinality service, a timestamp advancing 150 ms per row (2M
/// rows cover about 3.5 days, so 4–5 day partitions), a duration and a medium-length string.
fn batches(table: &LoadedTable, rows: usize) -> Vec<RecordBatch> {
    let arrow = Arc::new(schema_to_arrow_schema(table.metadata.current_schema()).unwrap());
    let services = ["checkout", "cart", "payments", "search", "frontend", "ads"];
    (0..rows)
        .step_by(8192)
        .map(|start| {
            let n = 8192.min(rows - start);
            let ids: Vec<i64> = (start as i64..(start + n) as i64).collect();
            RecordBatch::try_new(
                arrow.clone(),
                vec![
                    Arc::new(Int64Array::from(ids.clone())),
                    Arc::new(StringArray::from_iter_values(
                        ids.iter().map(|i| services[(*i as usize * 7) % 6]),
                    )),
                    Arc::new(
                        TimestampMicrosecondArray::from_iter_values(
                            ids.iter().map(|i| 1_760_000_000_000_000 + i * 150_000),
                        )
                        .with_timezone("+00:00"),
                    ),
                    Arc::new(Float64Array::from_iter_values(
                        ids.iter().map(|i| (*i % 1000) as f64 * 1.7),
                    )),
                    Arc::new(StringArray::from_iter_values(ids.iter().map(|i| {
                        format!("GET /api/v1/items/{}?page={}", i % 5000, i % 7)
                    }))),
                ],
            )
            .unwrap()
        })
        .collect()
}

async fn bench_table(
    client: &floe_lake::rest::CatalogClient,
    name: &str,
    partitioned: bool,
) -> LoadedTable {
    client.ensure_namespace(&["bench"]).await.unwrap();
    let schema = Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::optional(2, "service", Type::Primitive(PrimitiveType::String)).into(),
            NestedField::optional(3, "ts", Type::Primitive(PrimitiveType::Timestamptz)).into(),
            NestedField::optional(4, "duration", Type::Primitive(PrimitiveType::Double)).into(),
            NestedField::optional(5, "name", Type::Primitive(PrimitiveType::String)).into(),
        ])
        .build()
        .unwrap();
    let spec = partitioned.then(|| {
        iceberg::spec::UnboundPartitionSpec::builder()
            .add_partition_field(3, "ts_day", iceberg::spec::Transform::Day)
            .unwrap()
            .build()
    });
    let ident = iceberg::TableIdent::new(iceberg::NamespaceIdent::new("bench".into()), name.into());
    client
        .create_table(
            &ident,
            &CreateTableRequest {
                name: name.into(),
                location: None,
                schema,
                partition_spec: spec,
                write_order: None,
                stage_create: None,
                properties: [("format-version".to_string(), "2".to_string())].into(),
            },
        )
        .await
        .unwrap()
}

fn zstd() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).unwrap()))
        .build()
}

async fn ours(table: &LoadedTable, input: &[RecordBatch]) -> (Duration, u64) {
    let started = Instant::now();
    let mut writer = DataWriter::data(table, &WriterOptions::default()).unwrap();
    for batch in input {
        writer.write(batch).await.unwrap();
    }
    let files = writer.close().await.unwrap();
    (
        started.elapsed(),
        files.iter().map(|f| f.file_size_in_bytes()).sum(),
    )
}

fn bare(dir: &std::path::Path, input: &[RecordBatch]) -> (Duration, u64) {
    let path = dir.join(format!("bare-{}.parquet", uuid::Uuid::new_v4()));
    let started = Instant::now();
    let file = std::fs::File::create(&path).unwrap();
    let mut writer = ArrowWriter::try_new(file, input[0].schema(), Some(zstd())).unwrap();
    for batch in input {
        writer.write(batch).unwrap();
    }
    writer.close().unwrap();
    let elapsed = started.elapsed();
    let bytes = std::fs::metadata(&path).unwrap().len();
    std::fs::remove_file(&path).ok();
    (elapsed, bytes)
}

fn p50(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let rows = env_usize("FLOE_BENCH_ROWS", 2_000_000);
    let commits = env_usize("FLOE_BENCH_COMMITS", 1000);
    let h = Harness::start(&backends()[0]).await;
    let client = support::client(&h, &h.catalog.uri()).await;
    let scratch = std::env::temp_dir().join(format!("floe-lake-bench-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&scratch).unwrap();

    println!("writer throughput, {rows} span-like rows, zstd(3), best of 5");
    println!(
        "{:<28} {:>12} {:>10} {:>10}",
        "writer", "rows/s", "MB/s", "ratio"
    );
    for partitioned in [false, true] {
        let table = bench_table(
            &client,
            if partitioned { "by_day" } else { "flat" },
            partitioned,
        )
        .await;
        let input = batches(&table, rows);
        let mut best_ours = (Duration::MAX, 0);
        let mut best_bare = (Duration::MAX, 0);
        for _ in 0..5 {
            best_bare = best_bare.min(bare(&scratch, &input));
            best_ours = best_ours.min(ours(&table, &input).await);
        }
        let rate = |d: Duration| rows as f64 / d.as_secs_f64();
        let mbs = |(d, b): (Duration, u64)| b as f64 / 1e6 / d.as_secs_f64();
        println!(
            "{:<28} {:>12.0} {:>10.1} {:>10}",
            "arrow-rs ArrowWriter (bare)",
            rate(best_bare.0),
            mbs(best_bare),
            "1.00"
        );
        let label = if partitioned {
            "floe-lake, day-partitioned"
        } else {
            "floe-lake, unpartitioned"
        };
        println!(
            "{:<28} {:>12.0} {:>10.1} {:>10.2}",
            label,
            rate(best_ours.0),
            mbs(best_ours),
            best_bare.0.as_secs_f64() / best_ours.0.as_secs_f64()
        );
    }

    println!("\ncommit latency over {commits} checkpoint commits (one small file each)");
    println!(
        "{:<24} {:>14} {:>14} {:>14} {:>10} {:>10}",
        "maintenance", "p50 first 100", "p50 101-200", "p50 last 100", "last/101-200", "snapshots"
    );
    for (label, merge, expire) in [
        ("never maintained", false, false),
        ("manifests merged", true, false),
        ("merged + expired", true, true),
    ] {
        let table = bench_table(&client, &label.replace([' ', '+'], "_"), false).await;
        let ident = table.ident.clone();
        let small = batches(&table, 10);
        let mut latencies = Vec::with_capacity(commits);
        for checkpoint in 1..=commits as u64 {
            let table = client.load_table(&ident).await.unwrap();
            let mut writer = DataWriter::data(&table, &WriterOptions::default()).unwrap();
            writer.write(&small[0]).await.unwrap();
            let delta = Delta {
                data_files: writer.close().await.unwrap(),
                ..Delta::default()
            };
            let marker = CommitMarker {
                job_id: "bench".into(),
                writer: None,
                checkpoint_id: checkpoint,
                positions: Default::default(),
                operators: Default::default(),
                streams: Default::default(),
            };
            let started = Instant::now();
            commit_checkpoint(
                &client,
                &marker,
                &[(ident.clone(), delta)],
                &RetryPolicy::default(),
            )
            .await
            .unwrap();
            latencies.push(started.elapsed());
            if merge && checkpoint % 16 == 0 {
                let op = RewriteManifests {
                    target_bytes: 8 << 20,
                    min_manifests: 16,
                };
                commit_operation(&client, &ident, &op, &RetryPolicy::default())
                    .await
                    .unwrap();
            }
            if expire && checkpoint % 100 == 0 {
                let keep = ExpireSnapshots {
                    older_than_ms: i64::MAX,
                    retain_last: 50,
                    protect: vec![],
                };
                expire_snapshots(&client, &ident, &keep, &RetryPolicy::default())
                    .await
                    .unwrap();
            }
        }
        let first = p50(latencies[..100.min(commits)].to_vec());
        // Commits 101–200: past the warm-up in which the metadata log fills to its bound (100).
        let warm = p50(latencies
            [100.min(commits)..200.min(commits).max(100.min(commits) + 1).min(commits)]
            .to_vec());
        let last = p50(latencies[commits.saturating_sub(100)..].to_vec());
        let snapshots = client
            .load_table(&ident)
            .await
            .unwrap()
            .metadata
            .snapshots()
            .count();
        println!(
            "{:<24} {:>11.2} ms {:>11.2} ms {:>11.2} ms {:>14.2} {:>10}",
            label,
            first,
            warm,
            last,
            last / warm,
            snapshots
        );
    }
    std::fs::remove_dir_all(&scratch).ok();
    h.catalog.stop().await.unwrap();
}
