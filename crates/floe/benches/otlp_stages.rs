//! Where the OTLP path's time goes, stage by stage, on one thread and with no
//! services: `cargo bench -p floe --bench otlp_stages` (issue 33's first step).
//!
//! On generated traces (1,000 spans per record, the generator of the `otlp` bench), each
//! stage timed on its own in the same run:
//!
//! 1. **prost** — `TracesData::decode`, the floor any decoder pays;
//! 2. **decode → Arrow** — floe-otlp's `OtlpFormat::append`, batches taken every 64k rows
//!    (the job loop's flush), i.e. prost plus building the spans table's columns;
//! 3. **Arrow → Parquet** — those batches through parquet's `ArrowWriter` in memory with the
//!    settings `floe run` writes `otel_spans` with (zstd 1, a bloom filter on `trace_id`,
//!    floe-otlp's plain columns);
//!
//! then each column of the spans table written to Parquet alone: its share of the encoding
//! time and of the bytes. (Allocations are not counted: the workspace forbids the `unsafe`
//! a counting allocator needs; `perf` on this bench shows where the cycles go inside a
//! stage.) `FLOE_BENCH_SPANS` sets the volume (default 1,000,000).

use std::time::Instant;

use arrow_array::RecordBatch;
use opentelemetry_proto::tonic::trace::v1::TracesData;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use prost::Message;

mod common;

// The allocator the `floe` binary uses.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs `work`: what it returned and its seconds.
fn measure<T>(work: impl FnOnce() -> T) -> (T, f64) {
    let began = Instant::now();
    let out = work();
    (out, began.elapsed().as_secs_f64())
}

/// `batches` as one Parquet file in memory: its size.
fn encode(batches: &[RecordBatch], props: &WriterProperties) -> usize {
    let mut out = Vec::new();
    let mut writer =
        ArrowWriter::try_new(&mut out, batches[0].schema(), Some(props.clone())).unwrap();
    for batch in batches {
        writer.write(batch).unwrap();
    }
    writer.close().unwrap();
    out.len()
}

fn main() {
    let spans: usize = std::env::var("FLOE_BENCH_SPANS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let mut generator = floe_otlp::generate::Generator::new(3, 1_700_000_000_000_000_000);
    let payloads: Vec<Vec<u8>> = (0..spans.div_ceil(1000))
        .map(|_| generator.requests(200)[0].bytes.clone())
        .collect();
    let spans = payloads.len() * 1000;
    let input: usize = payloads.iter().map(Vec::len).sum();

    let (decoded, prost) = measure(|| {
        payloads
            .iter()
            .map(|p| {
                TracesData::decode(p.as_slice())
                    .unwrap()
                    .resource_spans
                    .len()
            })
            .sum::<usize>()
    });
    assert!(decoded > 0);

    // Timed with each take dropped, as the job hands its batches on (memory is reused); then
    // once more, untimed, keeping them for the Parquet stage.
    let (rows, arrow) = measure(|| {
        let mut rows = 0;
        common::decode_otlp("otlp_spans", &payloads, |taken| {
            rows += taken.iter().map(|(_, b)| b.num_rows()).sum::<usize>();
        });
        rows
    });
    assert_eq!(rows, spans);
    let mut batches = Vec::new();
    common::decode_otlp("otlp_spans", &payloads, |taken| {
        batches.extend(taken.into_iter().map(|(_, b)| b));
    });

    let props = common::spans_parquet_properties();
    let (parquet_bytes, parquet) = measure(|| encode(&batches, &props));

    println!(
        "{spans} spans in {} records, {:.0} MiB of protobuf; Parquet {:.0} MiB\n",
        payloads.len(),
        input as f64 / 1048576.0,
        parquet_bytes as f64 / 1048576.0
    );
    println!("{:<44} {:>12} {:>14}", "stage", "spans/s", "share of time");
    let total = arrow + parquet;
    for (label, seconds) in [
        ("1. prost decode", prost),
        ("   building the Arrow columns (2. - 1.)", arrow - prost),
        ("2. decode → Arrow (floe-otlp)", arrow),
        ("3. Arrow → Parquet (spans table settings)", parquet),
    ] {
        println!(
            "{label:<44} {:>12.0} {:>13.0} %",
            spans as f64 / seconds,
            100.0 * seconds / total
        );
    }
    println!(
        "{:<44} {:>12.0}",
        "decode → Parquet, one thread",
        spans as f64 / total
    );

    // Each column alone: which ones the encoding time goes to.
    let schema = batches[0].schema();
    let mut columns: Vec<(String, f64, usize)> = Vec::new();
    for (i, field) in schema.fields().iter().enumerate() {
        let alone: Vec<RecordBatch> = batches.iter().map(|b| b.project(&[i]).unwrap()).collect();
        let (bytes, seconds) = measure(|| encode(&alone, &props));
        columns.push((field.name().clone(), seconds, bytes));
    }
    let time: f64 = columns.iter().map(|(_, seconds, _)| seconds).sum();
    let size: usize = columns.iter().map(|(_, _, b)| b).sum();
    columns.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!(
        "\n{:<28} {:>14} {:>10} {:>12}",
        "column written alone", "share of time", "MiB", "share of MiB"
    );
    for (name, took, bytes) in &columns {
        println!(
            "{name:<28} {:>13.1} % {:>10.1} {:>11.1} %",
            100.0 * took / time,
            *bytes as f64 / 1048576.0,
            100.0 * *bytes as f64 / size as f64
        );
    }
}
