//! The compaction benchmark and acceptance run: `cargo bench -p floe --bench compaction`.
//!
//! Needs `FLOE_TEST_PYTHON` (DuckDB, from `tests/services/up`) and the release binaries
//! (`cargo build --release --bins`). In one run, on one table:
//!
//! 1. an OTLP spans table (`otel.otel_spans`, the job's schema, partitioning and writer
//!    settings, recorded as table properties as the job records them) gets `FLOE_BENCH_FILES` small files (default 2,000) holding
//!    `FLOE_BENCH_COMPACT_SPANS` spans (default 1,000,000) from the built-in generator,
//!    committed through a release floe-catalog in commits of 100 files;
//! 2. DuckDB reads it: a full-table checksum (count and the sum of every row's hash), and the
//!    time of a `COUNT(*)` and of a `GROUP BY` (median of 5);
//! 3. the baseline: a bare arrow-rs read of the same files and rewrite into 128 MiB files
//!    with the same Parquet settings, one thread;
//! 4. `floe-maintenance run-once --task compact` (release), timed as a user runs it: process
//!    start, planning, reading, writing and committing;
//! 5. DuckDB again: the checksum must be identical, the data files ≥ 10× fewer.
//!
//! Targets: compaction ≥ 70% of the baseline's MB/s; DuckDB ≥ 5× faster after compaction.
//! `FLOE_BENCH_KEEP=1` keeps the warehouse (its path is printed) for a closer look.

mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use common::{connect, cpu_seconds, decode_otlp, release_bin, start_catalog};
use floe_core::Format;
use floe_lake::commit::{RetryPolicy, commit_checkpoint};
use floe_lake::marker::CommitMarker;
use floe_lake::rest::{CatalogClient, LoadedTable};
use floe_lake::snapshot::{Delta, current_manifests};
use floe_lake::tables::{PartitionField, Wanted, conform, ensure_table};
use floe_lake::writer::{DataWriter, WriterOptions};
use floe_otlp::OtlpFormat;
use floe_otlp::generate::Generator;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::DataContentType;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const FILES_PER_COMMIT: usize = 100;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Live data files, live delete files, and the data files' total bytes.
async fn live(table: &LoadedTable) -> (Vec<String>, usize, u64) {
    let (mut data, mut deletes, mut bytes) = (Vec::new(), 0, 0);
    for manifest in current_manifests(table).await.unwrap() {
        for entry in manifest.load_manifest(&table.io).await.unwrap().entries() {
            if !entry.is_alive() {
                continue;
            }
            if entry.content_type() == DataContentType::Data {
                data.push(entry.file_path().to_string());
                bytes += entry.data_file().file_size_in_bytes();
            } else {
                deletes += 1;
            }
        }
    }
    (data, deletes, bytes)
}

/// What DuckDB sees: row count, checksum, and the median seconds of the two queries.
#[derive(Debug, PartialEq)]
struct Duck {
    count: u64,
    checksum: String,
    count_seconds: f64,
    group_seconds: f64,
}

fn duckdb(metadata: &str) -> Duck {
    let script = format!(
        "import json, statistics, time, duckdb_offline\n\
         con = duckdb_offline.connect()\n\
         src = \"iceberg_scan('{metadata}')\"\n\
         count, checksum = con.sql(f'SELECT count(*), sum(hash(t)::HUGEINT) FROM {{src}} t').fetchone()\n\
         def timed(q):\n\
         \x20   runs = []\n\
         \x20   for _ in range(5):\n\
         \x20       began = time.perf_counter(); con.sql(q).fetchall(); runs.append(time.perf_counter() - began)\n\
         \x20   return statistics.median(runs)\n\
         c = timed(f'SELECT count(*) FROM {{src}}')\n\
         g = timed(f'SELECT service_name, span_name, count(*), avg(duration_ns) FROM {{src}} GROUP BY ALL')\n\
         print(json.dumps([count, str(checksum), c, g]))"
    );
    let stdout = common::support::python(&script);
    let last = stdout.lines().last().unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("unreadable DuckDB answer {stdout:?}: {e}"));
    Duck {
        count: v[0].as_u64().unwrap(),
        checksum: v[1].as_str().unwrap().to_string(),
        count_seconds: v[2].as_f64().unwrap(),
        group_seconds: v[3].as_f64().unwrap(),
    }
}

fn local(path: &str) -> &str {
    path.strip_prefix("file://").unwrap_or(path)
}

#[tokio::main]
async fn main() {
    if std::env::var_os("FLOE_TEST_PYTHON").is_none() {
        eprintln!("compaction bench: needs FLOE_TEST_PYTHON (tests/services/up)");
        return;
    }
    let files = env_usize("FLOE_BENCH_FILES", 2000);
    let spans = env_usize("FLOE_BENCH_COMPACT_SPANS", 1_000_000);
    let dir = std::env::temp_dir().join(format!("floe-bench-compact-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let catalog = start_catalog(&dir);
    let client = connect(&catalog).await;

    // 1. The spans, decoded as the job decodes them.
    let mut generator = Generator::new(11, 1_700_000_000_000_000_000);
    let payloads: Vec<Vec<u8>> = (0..spans.div_ceil(1000))
        .map(|_| generator.requests(200)[0].bytes.clone())
        .collect();
    let mut batches = Vec::new();
    decode_otlp("otlp_spans", &payloads, |taken| {
        batches.extend(taken.into_iter().map(|(_, b)| b))
    });
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();

    let spec = OtlpFormat::new(Default::default())
        .streams()
        .into_iter()
        .find(|t| t.name == "spans")
        .unwrap();
    let options = WriterOptions {
        zstd_level: 1,
        bloom_filter_columns: spec.bloom_filter_columns.clone(),
        plain_columns: spec.plain_columns.clone(),
        file_prefix: "bench".into(),
        ..WriterOptions::default()
    };
    client.ensure_namespace(&["otel"]).await.unwrap();
    let table = ensure_table(
        &client,
        "otel",
        &Wanted {
            name: "otel_spans",
            schema: spec.schema.as_ref().unwrap(),
            partition: &[PartitionField::day("ts")],
            properties: &options.to_table_properties(),
            maintained: &Default::default(),
        },
    )
    .await
    .unwrap();
    let ident = table.ident.clone();
    let target = Arc::new(schema_to_arrow_schema(table.metadata.current_schema()).unwrap());
    let rows_per_file = rows.div_ceil(files).max(1);
    let mut pending = Vec::new();
    let mut checkpoint = 0;
    let began = Instant::now();
    for batch in &batches {
        let mut start = 0;
        while start < batch.num_rows() {
            let len = rows_per_file.min(batch.num_rows() - start);
            let slice = conform(&batch.slice(start, len), &target).unwrap();
            let mut writer = DataWriter::data(&table, &options).unwrap();
            writer.write(&slice).await.unwrap();
            pending.extend(writer.close().await.unwrap());
            start += len;
            if pending.len() >= FILES_PER_COMMIT {
                checkpoint += 1;
                commit(&client, &ident, checkpoint, std::mem::take(&mut pending)).await;
            }
        }
    }
    if !pending.is_empty() {
        commit(&client, &ident, checkpoint + 1, pending).await;
    }
    let before = client.load_table(&ident).await.unwrap();
    let (data_before, _, bytes) = live(&before).await;
    println!(
        "wrote {rows} spans in {} small files ({:.1} MiB, {:.1} KiB each) in {:.1} s",
        data_before.len(),
        bytes as f64 / 1048576.0,
        bytes as f64 / 1024.0 / data_before.len() as f64,
        began.elapsed().as_secs_f64()
    );

    // 2. DuckDB before.
    let duck_before = duckdb(before.metadata_location.as_deref().unwrap());
    assert_eq!(duck_before.count as usize, rows);

    // 3. The baseline: bare arrow-rs, read every file and rewrite into 128 MiB files with the
    // table's Parquet settings (which compaction takes from the table's properties).
    let baseline_dir = dir.join("baseline");
    std::fs::create_dir_all(&baseline_dir).unwrap();
    let props = options.parquet_properties().unwrap();
    let began = Instant::now();
    let cpu_before = cpu_seconds(std::process::id());
    let mut out_files = 0;
    let mut writer: Option<ArrowWriter<std::fs::File>> = None;
    for path in &data_before {
        let reader =
            ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(local(path)).unwrap())
                .unwrap()
                .build()
                .unwrap();
        for batch in reader {
            let batch = batch.unwrap();
            let w = writer.get_or_insert_with(|| {
                out_files += 1;
                let file =
                    std::fs::File::create(baseline_dir.join(format!("part-{out_files}.parquet")))
                        .unwrap();
                ArrowWriter::try_new(file, batch.schema(), Some(props.clone())).unwrap()
            });
            w.write(&batch).unwrap();
            if w.bytes_written() + w.in_progress_size() >= 128 << 20 {
                writer.take().unwrap().close().unwrap();
            }
        }
    }
    if let Some(w) = writer {
        w.close().unwrap();
    }
    let baseline_seconds = began.elapsed().as_secs_f64();
    let baseline_cpu = cpu_seconds(std::process::id()) - cpu_before;

    // 4. floe-maintenance run-once, as a user runs it.
    let config = dir.join("maintenance.toml");
    std::fs::write(
        &config,
        format!(
            "version = 1\n[catalog]\nuri = \"{}\"\n[[policy]]\ntables = \"otel.*\"\n\
             [policy.compact]\nschedule = \"0 0 * * * *\"\n",
            catalog.uri
        ),
    )
    .unwrap();
    let began = Instant::now();
    let mut child = Command::new(release_bin("floe-maintenance"))
        .args([
            "run-once",
            "--config",
            config.to_str().unwrap(),
            "--table",
            "otel.otel_spans",
            "--task",
            "compact",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cargo build --release -p floe-maintenance first");
    // Its CPU time, sampled until it exits (the last 20 ms may be missed).
    let mut compact_cpu = 0.0;
    while child.try_wait().unwrap().is_none() {
        compact_cpu = cpu_seconds(child.id()).max(compact_cpu);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let compact_seconds = began.elapsed().as_secs_f64();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "run-once failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{}", String::from_utf8_lossy(&out.stdout).trim());

    // 5. DuckDB after, and the files.
    let after = client.load_table(&ident).await.unwrap();
    let (data_after, deletes_after, _) = live(&after).await;
    let duck_after = duckdb(after.metadata_location.as_deref().unwrap());
    assert_eq!(
        (duck_after.count, &duck_after.checksum),
        (duck_before.count, &duck_before.checksum),
        "DuckDB reads different rows after compaction"
    );
    assert!(
        data_before.len() >= 10 * data_after.len(),
        "{} -> {} data files",
        data_before.len(),
        data_after.len()
    );
    assert_eq!(deletes_after, 0);

    let mib = bytes as f64 / 1048576.0;
    let compact_rate = mib / compact_seconds;
    let baseline_rate = mib / baseline_seconds;
    println!();
    println!(
        "data files: {} -> {} ({:.0}x fewer), DuckDB checksum identical ({} rows)",
        data_before.len(),
        data_after.len(),
        data_before.len() as f64 / data_after.len() as f64,
        duck_after.count
    );
    println!(
        "{:<58} {:>8.1} MiB/s ({out_files} files, {baseline_seconds:.1} s, {baseline_cpu:.1} CPU s)",
        "bare arrow-rs read + rewrite, 1 thread", baseline_rate
    );
    println!(
        "{:<58} {:>8.1} MiB/s ({compact_seconds:.1} s, {compact_cpu:.1} CPU s) = {:.2} x baseline  [target >= 0.70]",
        "floe-maintenance run-once --task compact",
        compact_rate,
        compact_rate / baseline_rate
    );
    for (what, b, a) in [
        (
            "DuckDB COUNT(*)",
            duck_before.count_seconds,
            duck_after.count_seconds,
        ),
        (
            "DuckDB GROUP BY service, span name",
            duck_before.group_seconds,
            duck_after.group_seconds,
        ),
    ] {
        println!(
            "{what:<58} {:>8.3} s -> {:.3} s = {:.1}x faster  [target >= 5]",
            b,
            a,
            b / a
        );
    }
    drop(catalog);
    if std::env::var("FLOE_BENCH_KEEP").is_ok() {
        println!("kept {}", dir.display());
    } else {
        std::fs::remove_dir_all(&dir).ok();
    }
}

async fn commit(
    client: &CatalogClient,
    ident: &iceberg::TableIdent,
    checkpoint: u64,
    data_files: Vec<iceberg::spec::DataFile>,
) {
    let marker = CommitMarker {
        job_id: "bench-writer".into(),
        writer: None,
        checkpoint_id: checkpoint,
        positions: Default::default(),
        operators: Default::default(),
        streams: Default::default(),
    };
    let delta = Delta {
        data_files,
        ..Delta::default()
    };
    commit_checkpoint(
        client,
        &marker,
        &[(ident.clone(), delta)],
        &RetryPolicy::default(),
    )
    .await
    .unwrap();
}
