//! Profiles into Iceberg: `cargo bench -p floe --bench profiles` (after
//! `cargo build --release -p floe -p floe-catalog`), with Kafka from `tests/services/up`.
//!
//! On the same generated profile records (five services' CPU profiles per record, samples on
//! shared stacks, half linked to spans; protobuf, as the Collector's `otlp_proto` writes):
//!
//! * (a) decode only — floe-otlp's `decode` (prost, then the check against the dictionary
//!   and the attribute rule), in memory, one thread;
//! * (b) decode → Arrow — `OtlpFormat::append` and `take` every 64k rows, every dictionary
//!   index resolved into the `otel_profiles` columns, one thread;
//! * (c) into Iceberg — the release `floe run` to committed `otel_profiles` through a release
//!   `floe-catalog`, 10 s checkpoints, timed from start until the committed positions reach
//!   the end of the topic, with the job's CPU seconds.
//!
//! Reported as samples/s and as ratios to (a) measured in the same run. `FLOE_BENCH_SAMPLES`
//! sets the volume (default 2,000,000 samples).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use floe_otlp::generate::Generator;
use floe_otlp::{Signal, decode};

mod common;

use common::{
    connect, cpu_seconds, decode_otlp, otlp_job_file, peak_rss_mib, produce, release_bin,
    start_catalog, wait_committed,
};

// The allocator the `floe` binary uses, so (a) and (b) measure the same code.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Samples per service per record: five services make 10,000 samples a record.
const SAMPLES_PER_PROFILE: usize = 2000;
const PARTITIONS: i32 = 2;

#[tokio::main]
async fn main() {
    let Ok(brokers) = std::env::var("FLOE_TEST_KAFKA_BROKERS") else {
        eprintln!("profiles bench: needs FLOE_TEST_KAFKA_BROKERS (tests/services/up)");
        return;
    };
    let wanted: usize = std::env::var("FLOE_BENCH_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000);
    let mut generator = Generator::new(9, 1_700_000_000_000_000_000);
    generator.requests(100); // spans for the samples to link to
    let mut payloads = Vec::new();
    let mut samples = 0;
    while samples < wanted {
        let record = generator.profiles(SAMPLES_PER_PROFILE);
        samples += record.items;
        payloads.push(record.bytes);
    }
    let bytes: usize = payloads.iter().map(Vec::len).sum();
    let dir = std::env::temp_dir().join(format!("floe-bench-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let topic = format!("bench_profiles_{}", uuid::Uuid::new_v4().simple());
    produce(&brokers, &topic, PARTITIONS, &payloads).await;
    println!(
        "produced {samples} samples in {} records ({:.1} MiB of OTLP protobuf) on {PARTITIONS} partitions",
        payloads.len(),
        bytes as f64 / 1048576.0
    );

    // (a) decode only.
    let began = Instant::now();
    let mut decoded = 0;
    for p in &payloads {
        decoded += usize::from(decode(Signal::Profiles, p).is_ok());
    }
    let decode_only = samples as f64 / began.elapsed().as_secs_f64();
    assert_eq!(decoded, payloads.len());

    // (b) decode → Arrow.
    let began = Instant::now();
    let mut rows = 0;
    decode_otlp("otlp_profiles", &payloads, |taken| {
        rows += taken.iter().map(|(_, b)| b.num_rows()).sum::<usize>();
    });
    let to_arrow = samples as f64 / began.elapsed().as_secs_f64();
    assert_eq!(rows, samples);

    // (c) into Iceberg.
    let catalog = start_catalog(&dir);
    let client = connect(&catalog).await;
    let job = otlp_job_file(
        &dir,
        "floe",
        "bench",
        (&brokers, &topic, "profiles"),
        &catalog.uri,
        "",
    );
    let began = Instant::now();
    let mut child = Command::new(release_bin("floe"))
        .args(["run", job.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("cargo build --release -p floe first");
    // Records went round-robin: partition p holds every PARTITIONS-th one from p.
    let records = payloads.len() as i64;
    let ends: Vec<i64> = (0..PARTITIONS as i64)
        .map(|p| (records + (PARTITIONS as i64 - 1 - p)) / PARTITIONS as i64)
        .collect();
    tokio::time::timeout(
        Duration::from_secs(900),
        wait_committed(&client, "bench", "floe", &topic, &ends),
    )
    .await
    .expect("the job committed everything within 15 minutes");
    let into_iceberg = samples as f64 / began.elapsed().as_secs_f64();
    let rss = peak_rss_mib(child.id());
    let cpu = cpu_seconds(child.id());
    child.kill().unwrap();
    child.wait().unwrap();
    drop(catalog);
    let _ = std::fs::remove_dir_all(&dir);

    println!("(a) decode only           {decode_only:>10.0} samples/s");
    println!(
        "(b) decode → Arrow        {to_arrow:>10.0} samples/s   ({:.2} of a)",
        to_arrow / decode_only
    );
    println!(
        "(c) into Iceberg (floe)   {into_iceberg:>10.0} samples/s   ({:.2} of a; {:.0} samples per CPU-second, peak RSS {rss:.0} MiB)",
        into_iceberg / decode_only,
        samples as f64 / cpu
    );
}
