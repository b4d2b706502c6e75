//! The OTLP job's benchmark harness: `cargo bench -p floe --bench otlp`.
//!
//! With services from `tests/services/up` (Kafka, the Python venv), on the same produced spans:
//!
//! * (a) raw consume — rdkafka, no decode;
//! * (b) decode + Parquet encode in memory — floe-otlp's decoder and Arrow builders, then
//!   parquet's ArrowWriter with the spans table's writer settings, one thread;
//! * (c) the full job — the release `floe run` binary to committed Iceberg tables through a
//!   release `floe-catalog`, 10 s checkpoints, timed from start until the committed positions
//!   reach the end of the topic; peak RSS read from `/proc`; (c') the rows of every commit
//!   after the first over the time between the first and the last commit; (c'') the same over
//!   the full checkpoint intervals only (first commit to the one before the last: neither
//!   start-up nor the idle end of the last interval);
//! * (d) a PyIceberg consumer (confluent-kafka + `table.append` every 10 s);
//! * (e) Apache Flink 1.20 — its Kafka source and the Iceberg Flink sink, 10 s checkpoints,
//!   through the same catalog (`benches/flink/`, built with Maven before timing);
//! * (f) freshness — records produced at a steady rate while the job runs; for each, the time
//!   from produce until a committed snapshot covers it.
//!
//! `FLOE_BENCH_SPANS` sets the volume (default 1,000,000 spans); `FLOE_BENCH_SKIP_PYTHON=1`
//! skips (d), `FLOE_BENCH_SKIP_FLINK=1` skips (e). For (c) and (e) the CPU time of the process
//! is read from `/proc` too, to compare spans per core-second.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use floe_core::position_of;
use floe_lake::rest::CatalogClient;
use parquet::arrow::ArrowWriter;
use rdkafka::ClientConfig;
use rdkafka::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};

mod common;

use common::{
    committed, connect, cpu_seconds, decode_otlp, peak_rss_mib, produce_spans, release_bin,
    spans_job_file, spans_parquet_properties, start_catalog,
};

// The allocator the `floe` binary uses, so (b) measures the same code.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SPANS_PER_RECORD: usize = 1000;
const PARTITIONS: i32 = 2;

async fn total_records(client: &CatalogClient, namespace: &str, table: &str) -> u64 {
    let ident = iceberg::TableIdent::from_strs([namespace, table]).unwrap();
    client
        .load_table(&ident)
        .await
        .ok()
        .and_then(|t| {
            t.metadata.current_snapshot().and_then(|s| {
                s.summary()
                    .additional_properties
                    .get("total-records")
                    .cloned()
            })
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let (Ok(brokers), Ok(python)) = (
        std::env::var("FLOE_TEST_KAFKA_BROKERS"),
        std::env::var("FLOE_TEST_PYTHON"),
    ) else {
        eprintln!(
            "otlp bench: needs FLOE_TEST_KAFKA_BROKERS and FLOE_TEST_PYTHON (tests/services/up)"
        );
        return;
    };
    let total_spans: usize = std::env::var("FLOE_BENCH_SPANS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let records = total_spans.div_ceil(SPANS_PER_RECORD);
    let spans = records * SPANS_PER_RECORD;
    let dir = std::env::temp_dir().join(format!("floe-bench-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let topic = format!("bench_spans_{}", uuid::Uuid::new_v4().simple());

    // Produce.
    let payloads = produce_spans(&brokers, &topic, PARTITIONS, records, SPANS_PER_RECORD).await;
    let bytes: usize = payloads.iter().map(Vec::len).sum();
    // For the freshness phase.
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("linger.ms", "20")
        .set("message.max.bytes", "10000000")
        .create()
        .unwrap();
    println!(
        "produced {spans} spans in {records} records ({:.1} MiB of OTLP protobuf) on {PARTITIONS} partitions",
        bytes as f64 / 1048576.0
    );

    // (a) raw consume.
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", format!("raw-{}", uuid::Uuid::new_v4()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[&topic]).unwrap();
    let began = Instant::now();
    let mut got = 0;
    let mut consumed_bytes = 0;
    while got < records {
        let m = consumer.recv().await.unwrap();
        consumed_bytes += m.payload().map_or(0, <[u8]>::len);
        got += 1;
    }
    let raw = spans as f64 / began.elapsed().as_secs_f64();
    assert_eq!(consumed_bytes, bytes);
    drop(consumer);

    // (b) decode + Parquet encode in memory.
    let began = Instant::now();
    let props = spans_parquet_properties();
    let mut parquet_bytes = 0;
    let mut encode_time = Duration::ZERO;
    let mut encode = |batches: Vec<(usize, arrow_array::RecordBatch)>| {
        let began = Instant::now();
        for (_, batch) in batches {
            let mut out = Vec::new();
            let mut w =
                ArrowWriter::try_new(&mut out, batch.schema(), Some(props.clone())).unwrap();
            w.write(&batch).unwrap();
            w.close().unwrap();
            parquet_bytes += out.len();
        }
        encode_time += began.elapsed();
    };
    decode_otlp("otlp_spans", &payloads, &mut encode);
    let decode_encode = spans as f64 / began.elapsed().as_secs_f64();
    let encode_share = encode_time.as_secs_f64() / began.elapsed().as_secs_f64();

    // (c) the full job.
    let catalog = start_catalog(&dir);
    let client = connect(&catalog).await;
    let job = spans_job_file(&dir, "floe", "bench", (&brokers, &topic), &catalog.uri, "");
    let began = Instant::now();
    let mut child = Command::new(release_bin("floe"))
        .args(["run", job.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("cargo build --release -p floe first");
    // Records went round-robin: partition p holds every PARTITIONS-th one from p.
    let end = |p: i32| ((records as i64) + (PARTITIONS - 1 - p) as i64) / PARTITIONS as i64;
    loop {
        let positions = committed(&client, "bench", "floe").await;
        if (0..PARTITIONS).all(|p| position_of(&positions, &topic, p).unwrap_or(0) >= end(p)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let full = spans as f64 / began.elapsed().as_secs_f64();
    let rss = peak_rss_mib(child.id());
    let floe_cpu = cpu_seconds(child.id());
    // Steady state: rows committed after the first checkpoint over the time between the first
    // and the last commit (no start-up, no wait for the last interval).
    let spans_table = client
        .load_table(&iceberg::TableIdent::from_strs(["bench", "otel_spans"]).unwrap())
        .await
        .unwrap();
    let mut snapshots: Vec<(i64, u64)> = spans_table
        .metadata
        .snapshots()
        .map(|s| {
            let added = s
                .summary()
                .additional_properties
                .get("added-records")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            (s.timestamp_ms(), added)
        })
        .collect();
    snapshots.sort();
    let steady_rate = match (snapshots.first(), snapshots.last()) {
        (Some(first), Some(last)) if last.0 > first.0 => {
            let rows: u64 = snapshots[1..].iter().map(|(_, n)| n).sum();
            Some(rows as f64 / ((last.0 - first.0) as f64 / 1000.0))
        }
        _ => None,
    };
    // Sustained: only the full checkpoint intervals — from the first commit to the one before
    // the last (the last interval ends when the backlog does, part of it idle).
    let sustained_rate = (snapshots.len() >= 3).then(|| {
        let n = snapshots.len();
        let rows: u64 = snapshots[1..n - 1].iter().map(|(_, r)| r).sum();
        rows as f64 / ((snapshots[n - 2].0 - snapshots[0].0) as f64 / 1000.0)
    });

    // (f) freshness: produce at a steady rate while the job runs.
    let rate_records_per_s = 50;
    let mut sent: Vec<(i32, i64, Instant)> = Vec::new();
    let mut visible: Vec<Option<Duration>> = Vec::new();
    let steady = Instant::now();
    let mut next = Instant::now();
    let mut i = 0;
    while steady.elapsed() < Duration::from_secs(25) {
        if Instant::now() >= next {
            let payload = &payloads[i % payloads.len()];
            let d = producer
                .send(
                    FutureRecord::<(), [u8]>::to(&topic)
                        .partition(i as i32 % PARTITIONS)
                        .payload(payload),
                    Duration::from_secs(30),
                )
                .await
                .map_err(|(e, _)| e)
                .unwrap();
            sent.push((d.partition, d.offset, Instant::now()));
            visible.push(None);
            i += 1;
            next += Duration::from_millis(1000 / rate_records_per_s);
        }
        let positions = committed(&client, "bench", "floe").await;
        for (k, (p, o, at)) in sent.iter().enumerate() {
            if visible[k].is_none() && position_of(&positions, &topic, *p).unwrap_or(0) > *o {
                visible[k] = Some(at.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Wait for the rest to land.
    let waited = Instant::now();
    while visible.iter().any(Option::is_none) && waited.elapsed() < Duration::from_secs(30) {
        let positions = committed(&client, "bench", "floe").await;
        for (k, (p, o, at)) in sent.iter().enumerate() {
            if visible[k].is_none() && position_of(&positions, &topic, *p).unwrap_or(0) > *o {
                visible[k] = Some(at.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut lat: Vec<f64> = visible
        .iter()
        .map(|v| v.map_or(f64::INFINITY, |d| d.as_secs_f64()))
        .collect();
    lat.sort_by(f64::total_cmp);
    let p99 = lat[(lat.len() * 99 / 100).min(lat.len() - 1)];
    let rss_steady = peak_rss_mib(child.id());
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();

    // (d) the PyIceberg consumer.
    let pyiceberg = if std::env::var("FLOE_BENCH_SKIP_PYTHON").as_deref() == Ok("1") {
        None
    } else {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/pyiceberg_consumer.py");
        let began = Instant::now();
        let out = Command::new(&python)
            .args([
                script.to_str().unwrap(),
                &brokers,
                &topic,
                &catalog.uri,
                &spans.to_string(),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pyiceberg consumer: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(spans as f64 / began.elapsed().as_secs_f64())
    };

    // (e) Apache Flink with the Iceberg sink.
    let flink = if std::env::var("FLOE_BENCH_SKIP_FLINK").as_deref() == Ok("1") {
        None
    } else {
        let run = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/flink/run.sh");
        let built = Command::new(&run).arg("--build").status().unwrap();
        assert!(built.success(), "building the Flink baseline failed");
        let table = format!("spans_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let began = Instant::now();
        let mut flink = Command::new(&run)
            .args([&brokers, &topic, &catalog.uri, &table])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // The topic also holds the freshness phase's records: wait for all of them.
        let expected = (records + sent.len()) as u64 * SPANS_PER_RECORD as u64;
        let mut cpu = 0.0;
        let mut rss = 0.0;
        while total_records(&client, "flinkbench", &table).await < expected {
            assert!(
                began.elapsed() < Duration::from_secs(1800),
                "Flink did not finish"
            );
            assert!(flink.try_wait().unwrap().is_none(), "Flink exited early");
            cpu = cpu_seconds(flink.id());
            rss = peak_rss_mib(flink.id());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let rate = expected as f64 / began.elapsed().as_secs_f64();
        let _ = Command::new("kill")
            .args(["-TERM", &flink.id().to_string()])
            .status();
        let _ = flink.wait();
        Some((rate, expected as f64 / cpu.max(0.01), rss))
    };

    let base = raw.min(decode_encode);
    println!("\n{:<52} {:>12} {:>8}", "pipeline", "spans/s", "ratio");
    println!(
        "{:<52} {:>12.0} {:>8}",
        "(a) raw consume (rdkafka, no decode)", raw, ""
    );
    println!(
        "{:<52} {:>12.0} {:>8}",
        "(b) decode + Parquet encode in memory (1 thread)", decode_encode, ""
    );
    println!(
        "{:<52} {:>12.0} {:>7.2}x",
        "(c) floe run → committed Iceberg, 10 s checkpoints",
        full,
        full / base
    );
    if let Some(steady) = steady_rate {
        println!(
            "{:<52} {:>12.0} {:>7.2}x",
            "(c') the same, steady state between first and last commit",
            steady,
            steady / base
        );
    }
    if let Some(sustained) = sustained_rate {
        println!(
            "{:<52} {:>12.0} {:>7.2}x",
            "(c'') the same, sustained over full checkpoint intervals",
            sustained,
            sustained / base
        );
    }
    if let Some(py) = pyiceberg {
        println!(
            "{:<52} {:>12.0} {:>7.2}x",
            "(d) PyIceberg consumer, append every 10 s",
            py,
            py / base
        );
        println!("(c)/(d) = {:.1}x (target ≥ 10x)", full / py);
    }
    if let Some((rate, per_cpu, rss)) = flink {
        println!(
            "{:<52} {:>12.0} {:>7.2}x",
            "(e) Flink 1.20 + Iceberg sink, 10 s checkpoints",
            rate,
            rate / base
        );
        let floe_per_cpu = spans as f64 / floe_cpu.max(0.01);
        println!(
            "per core-second: floe {floe_per_cpu:.0} spans, Flink {per_cpu:.0} spans ({:.1}x); Flink peak RSS {rss:.0} MiB",
            floe_per_cpu / per_cpu
        );
    }
    println!("(c)/min(a,b) = {:.2} (target ≥ 0.60)", full / base);
    println!(
        "peak RSS of floe run: {rss:.0} MiB during the backlog, {rss_steady:.0} MiB overall (target ≤ 512)"
    );
    println!(
        "freshness at {} spans/s: p50 {:.2} s, p99 {:.2} s (target ≤ 12 s with 10 s checkpoints)",
        rate_records_per_s as usize * SPANS_PER_RECORD,
        lat[lat.len() / 2],
        p99
    );
    println!(
        "(b) wrote {:.1} MiB of Parquet; Parquet encoding took {:.0}% of its time, decoding the rest",
        parquet_bytes as f64 / 1048576.0,
        encode_share * 100.0
    );
    drop(catalog);
    let _ = std::fs::remove_dir_all(&dir);
}
