//! The stateful job's benchmark harness: `cargo bench -p floe --bench windows`.
//!
//! With services from `tests/services/up` (Kafka), the release `floe run` and `floe-catalog`
//! (`cargo build --release -p floe -p floe-catalog`), on the same produced spans (two
//! partitions, 10 s checkpoints, each job in its own namespace and consumer group):
//!
//! * **rollup cost** — (a) the OTLP job landing spans, no operators; (b) the same job with a
//!   1-minute tumbling rollup of spans per (service, span name, status) — count, mean and
//!   p99 duration, distinct traces — landed as a second table. Both timed from start until
//!   the committed positions reach the end of the topic; target (b) ≥ 0.8 × (a).
//! * **against Flink** — (c) the rollup alone (spans not landed) in `floe run`; (d) the same
//!   rollup in Apache Flink 1.20: Flink SQL `TUMBLE` over its Kafka source, RocksDB state
//!   backend with incremental checkpoints every 10 s, into Iceberg through the same catalog
//!   (`benches/flink/`, `run.sh --rollup`). Flink SQL has no quantile aggregate, so its rollup
//!   has count, mean, max and an exact distinct count, Floe's p99 too. Both timed until the
//!   committed positions (Flink: the offsets its source commits on each checkpoint) reach the
//!   end of the topic; compared per core-second (process CPU time from `/proc`).
//!   `FLOE_BENCH_SKIP_FLINK=1` skips (d).
//! * **checkpoints vs state size** — the job with a 1-hour tumbling window (nothing fires
//!   during the run, so the state only grows) keyed by a derived column with `K` distinct
//!   values, for each `K` of `FLOE_BENCH_STATE_KEYS` (default `10000,1000000`; needs
//!   `FLOE_BENCH_SPANS ≥ K`): the checkpoint durations (from the job's
//!   log) and the state-table bytes and keys each checkpoint wrote (from the snapshot
//!   summaries). Then a few records touching few keys: that checkpoint's bytes must track the
//!   keys it changed, not the keys held.
//! * **restore** — the same job stopped (SIGTERM) and started again: the time it takes to
//!   restore its partitions' state from the state table (its log's `operator state
//!   restored`), the path a rebalance takes for the partitions a replica gains.
//!
//! `FLOE_BENCH_SPANS` sets the volume (default 4,000,000 spans: with 10 s checkpoints, a
//! smaller backlog is over before the first checkpoint and every job times the same 10 s),
//! `FLOE_BENCH_STATE_MEMORY_MIB` the keyed jobs' RocksDB budget (default 32 MiB), and
//! `FLOE_BENCH_SKIP_THROUGHPUT=1` runs only the state part.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use floe_lake::rest::CatalogClient;

mod common;
use common::{
    connect, cpu_seconds, peak_rss_mib, produce_spans, spans_job_file, spawn_release_floe,
    start_catalog, stop, wait_committed,
};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SPANS_PER_RECORD: usize = 1000;
const PARTITIONS: i32 = 2;
/// The keyed jobs' RocksDB memory budget, unless `FLOE_BENCH_STATE_MEMORY_MIB` sets one.
const STATE_MEMORY_MIB: usize = 32;

const ROLLUP: &str = r#"
[[operators]]
id = "rollup_1m"
kind = "window"
input = "spans"
window = { type = "tumbling", size = "1m" }
key = ["service_name", "span_name", "status_code"]
allowed_lateness = "10s"
aggregates = { spans = "count()", mean_ns = "avg(duration_ns)", p99_ns = "quantile(duration_ns, 0.99)", traces = "count_distinct(trace_id)" }
"#;

/// A window holding `keys` keys per partition at most, that does not fire during the run.
fn keyed(keys: usize, memory_mib: usize) -> String {
    format!(
        r#"
[[operators]]
id = "with_key"
kind = "select"
input = "spans"
columns = ["duration_ns", "ts", "(kafka_offset * {SPANS_PER_RECORD} + kafka_item) % {per_partition} AS k"]

[[operators]]
id = "per_key"
kind = "window"
input = "with_key"
window = {{ type = "tumbling", size = "1h" }}
key = ["k"]
aggregates = {{ spans = "count()", total_ns = "sum(duration_ns)" }}

[tables.with_key]
land = false

[tables.spans]
land = false

[state]
memory = "{memory_mib}MiB"
"#,
        per_partition = (keys / PARTITIONS as usize).max(1)
    )
}

struct Job {
    name: String,
    path: PathBuf,
    log: PathBuf,
}

fn job_file(dir: &Path, name: &str, brokers: &str, topic: &str, uri: &str, extra: &str) -> Job {
    Job {
        name: name.to_string(),
        path: spans_job_file(dir, name, name, (brokers, topic), uri, extra),
        log: dir.join(format!("{name}.log")),
    }
}

fn spawn(job: &Job) -> Child {
    spawn_release_floe(&job.path, &job.log, &[]).into_child()
}

/// Runs `job` until it committed `ends`: (seconds, CPU seconds, peak RSS MiB), and the
/// still running process.
async fn run_to(
    client: &CatalogClient,
    job: &Job,
    topic: &str,
    ends: &[i64],
) -> (f64, f64, f64, Child) {
    let began = Instant::now();
    let child = spawn(job);
    wait_committed(client, &job.name, &job.name, topic, ends).await;
    let took = began.elapsed().as_secs_f64();
    (
        took,
        cpu_seconds(child.id()),
        peak_rss_mib(child.id()),
        child,
    )
}

/// `field=` of every line of `log` containing `what`.
fn logged(log: &Path, what: &str, field: &str) -> Vec<u64> {
    let prefix = format!("{field}=");
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(what))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix(prefix.as_str()))
                .and_then(|v| v.parse().ok())
        })
        .collect()
}

/// (added-files-size, added-records) of every snapshot of the state table, oldest first.
async fn state_commits(client: &CatalogClient, job: &str) -> Vec<(u64, u64)> {
    let ident = iceberg::TableIdent::from_strs([job, &format!("floe_state_{job}")]).unwrap();
    let table = client.load_table(&ident).await.unwrap();
    let mut snapshots: Vec<_> = table.metadata.snapshots().collect();
    snapshots.sort_by_key(|s| s.sequence_number());
    let number = |s: &iceberg::spec::SnapshotRef, key: &str| {
        s.summary()
            .additional_properties
            .get(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    snapshots
        .iter()
        .map(|s| (number(s, "added-files-size"), number(s, "added-records")))
        .collect()
}

/// Resident memory of a process now (MiB).
fn rss_now_mib(pid: u32) -> f64 {
    common::status_mib(pid, "VmRSS")
}

/// Bytes of the files under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Rows of a table as a reader sees them (deletes applied).
async fn live_rows(client: &CatalogClient, namespace: &str, table: &str) -> u64 {
    use futures::TryStreamExt;
    let ident = iceberg::TableIdent::from_strs([namespace, table]).unwrap();
    let loaded = client.load_table(&ident).await.unwrap();
    let request = floe_lake::read::ReadRequest::current();
    let stream = floe_lake::read::read_live(&loaded, request).await.unwrap();
    let batches: Vec<arrow_array::RecordBatch> = stream.try_collect().await.unwrap();
    batches.iter().map(|b| b.num_rows() as u64).sum()
}

/// The offsets consumer group `group` committed on `topic`'s partitions (-1: none).
fn group_offsets(brokers: &str, group: &str, topic: &str) -> Vec<i64> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create()
        .unwrap();
    let mut wanted = rdkafka::TopicPartitionList::new();
    for p in 0..PARTITIONS {
        wanted.add_partition(topic, p);
    }
    let committed = consumer
        .committed_offsets(wanted, Duration::from_secs(10))
        .unwrap_or_default();
    (0..PARTITIONS)
        .map(
            |p| match committed.find_partition(topic, p).map(|e| e.offset()) {
                Some(rdkafka::Offset::Offset(o)) => o,
                _ => -1,
            },
        )
        .collect()
}

/// Runs the Flink rollup until its source committed `ends`: (seconds, CPU seconds, peak RSS).
async fn flink_rollup(brokers: &str, topic: &str, uri: &str, ends: &[i64]) -> (f64, f64, f64) {
    let run = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/flink/run.sh");
    let built = Command::new(&run).arg("--build").status().unwrap();
    assert!(built.success(), "building the Flink baseline failed");
    let group = format!("flink-rollup-{}", uuid::Uuid::new_v4().simple());
    let table = format!("rollup_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let began = Instant::now();
    let mut flink = Command::new(&run)
        .args(["--rollup", brokers, topic, uri, &table, &group])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (mut cpu, mut rss) = (0.0, 0.0);
    loop {
        let offsets = group_offsets(brokers, &group, topic);
        if offsets.iter().zip(ends).all(|(o, e)| o >= e) {
            break;
        }
        assert!(flink.try_wait().unwrap().is_none(), "Flink exited early");
        assert!(
            began.elapsed() < Duration::from_secs(1800),
            "Flink did not finish"
        );
        cpu = cpu_seconds(flink.id());
        rss = peak_rss_mib(flink.id());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = began.elapsed().as_secs_f64();
    stop(flink);
    (took, cpu, rss)
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// (a)–(d): the rollup's cost against the plain job, and against Flink.
async fn rollup_cost(
    client: &CatalogClient,
    dir: &Path,
    brokers: &str,
    topic: &str,
    uri: &str,
    ends: &[i64],
    spans: usize,
) {
    let plain = job_file(dir, "plain", brokers, topic, uri, "");
    let (plain_s, plain_cpu, plain_rss, child) = run_to(client, &plain, topic, ends).await;
    stop(child);
    let rollup = job_file(dir, "rollup", brokers, topic, uri, ROLLUP);
    let (rollup_s, rollup_cpu, rollup_rss, child) = run_to(client, &rollup, topic, ends).await;
    stop(child);
    let rollup_rows = live_rows(client, "rollup", "rollup_1m").await;
    // Against Flink: the rollup alone.
    let alone = format!("{ROLLUP}\n[tables.spans]\nland = false\n");
    let floe_alone = job_file(dir, "alone", brokers, topic, uri, &alone);
    let (alone_s, alone_cpu, alone_rss, child) = run_to(client, &floe_alone, topic, ends).await;
    stop(child);
    let flink = if std::env::var("FLOE_BENCH_SKIP_FLINK").as_deref() == Ok("1") {
        None
    } else {
        Some(flink_rollup(brokers, topic, uri, ends).await)
    };

    let plain_rate = spans as f64 / plain_s;
    let rollup_rate = spans as f64 / rollup_s;
    println!(
        "\n{:<58} {:>10} {:>12} {:>9}",
        "job", "spans/s", "spans/cpu-s", "RSS MiB"
    );
    println!(
        "{:<58} {plain_rate:>10.0} {:>12.0} {plain_rss:>9.0}",
        "(a) OTLP job, spans landed, no operators",
        spans as f64 / plain_cpu.max(0.01)
    );
    println!(
        "{:<58} {rollup_rate:>10.0} {:>12.0} {rollup_rss:>9.0}",
        "(b) + 1-min tumbling rollup per (service, name, status)",
        spans as f64 / rollup_cpu.max(0.01)
    );
    println!(
        "(b)/(a) = {:.2} (target ≥ 0.80); the rollup table holds {rollup_rows} rows",
        rollup_rate / plain_rate
    );
    println!(
        "{:<58} {:>10.0} {:>12.0} {alone_rss:>9.0}",
        "(c) the rollup alone (spans not landed)",
        spans as f64 / alone_s,
        spans as f64 / alone_cpu.max(0.01)
    );
    if let Some((flink_s, flink_cpu, flink_rss)) = flink {
        println!(
            "{:<58} {:>10.0} {:>12.0} {flink_rss:>9.0}",
            "(d) Flink 1.20 SQL TUMBLE, RocksDB, 10 s checkpoints",
            spans as f64 / flink_s,
            spans as f64 / flink_cpu.max(0.01)
        );
        println!(
            "per core-second (c)/(d) = {:.1}x; wall clock {:.1}x",
            flink_cpu / alone_cpu.max(0.01),
            flink_s / alone_s
        );
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Ok(brokers) = std::env::var("FLOE_TEST_KAFKA_BROKERS") else {
        eprintln!("windows bench: needs FLOE_TEST_KAFKA_BROKERS (tests/services/up)");
        return;
    };
    let spans = env_usize("FLOE_BENCH_SPANS", 4_000_000);
    let memory_mib = env_usize("FLOE_BENCH_STATE_MEMORY_MIB", STATE_MEMORY_MIB);
    let throughput = std::env::var("FLOE_BENCH_SKIP_THROUGHPUT").as_deref() != Ok("1");
    let state_keys_list: Vec<usize> = std::env::var("FLOE_BENCH_STATE_KEYS")
        .unwrap_or_else(|_| "10000,1000000".into())
        .split(',')
        .filter_map(|k| k.trim().parse().ok())
        .collect();
    let records = spans.div_ceil(SPANS_PER_RECORD);
    let spans = records * SPANS_PER_RECORD;
    let dir = std::env::temp_dir().join(format!("floe-bench-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let topic = format!("bench_windows_{}", uuid::Uuid::new_v4().simple());
    let payloads = produce_spans(&brokers, &topic, PARTITIONS, records, SPANS_PER_RECORD).await;
    let mut ends: Vec<i64> = (0..PARTITIONS)
        .map(|p| ((records as i64) + (PARTITIONS - 1 - p) as i64) / PARTITIONS as i64)
        .collect();
    println!("produced {spans} spans in {records} records on {PARTITIONS} partitions");

    let catalog = start_catalog(&dir);
    let client = connect(&catalog).await;

    if throughput {
        rollup_cost(&client, &dir, &brokers, &topic, &catalog.uri, &ends, spans).await;
    }
    // Checkpoints vs state size, then restore.
    println!("\ncheckpoints vs state size (1-hour window keyed by K values, 10 s checkpoints):");
    for keys in state_keys_list {
        let name = format!("keys_{keys}");
        let job = job_file(
            &dir,
            &name,
            &brokers,
            &topic,
            &catalog.uri,
            &keyed(keys, memory_mib),
        );
        let (took, _, rss, child) = run_to(&client, &job, &topic, &ends).await;
        let local = dir_bytes(&dir.join(&name));
        let commits = state_commits(&client, &name).await;
        let loaded = commits.len();
        let durations = logged(&job.log, "checkpoint committed", "millis");
        // A few records more: their checkpoint writes what they changed.
        let extra = 4;
        let topic_more = payloads[..extra].to_vec();
        let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("message.max.bytes", "10000000")
            .create()
            .unwrap();
        for (i, p) in topic_more.iter().enumerate() {
            producer
                .send(
                    rdkafka::producer::FutureRecord::<(), [u8]>::to(&topic)
                        .partition(i as i32 % PARTITIONS)
                        .payload(p),
                    Duration::from_secs(30),
                )
                .await
                .map_err(|(e, _)| e)
                .unwrap();
        }
        for e in &mut ends {
            *e += extra as i64 / PARTITIONS as i64;
        }
        wait_committed(&client, &name, &name, &topic, &ends).await;
        let after = state_commits(&client, &name).await;
        let rss_after = rss_now_mib(child.id());
        let small: (u64, u64) = after[loaded..]
            .iter()
            .fold((0, 0), |a, c| (a.0 + c.0, a.1 + c.1));
        stop(child);
        // Restore: the next start reads the partitions' state back.
        let restores = |field| logged(&job.log, "operator state restored", field);
        let before_restart = restores("millis").len();
        let child = spawn(&job);
        // The first restore of the owned partitions (one runs before Kafka assigns any); it
        // gets two minutes.
        let waited = Instant::now();
        let restored = loop {
            let (partitions, rows, millis) =
                (restores("partitions"), restores("rows"), restores("millis"));
            if let Some(i) = (before_restart..partitions.len()).find(|&i| partitions[i] > 0) {
                break Some((millis[i], rows[i]));
            }
            if waited.elapsed() > Duration::from_secs(120) {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let restore = match restored {
            Some((ms, keys)) => format!(
                "restore {keys} keys in {ms} ms ({:.0} keys/s)",
                keys as f64 / (ms.max(1) as f64 / 1000.0)
            ),
            None => "restore not done after 120 s".to_string(),
        };
        stop(child);
        let (bytes, written): (u64, u64) =
            commits.iter().fold((0, 0), |a, c| (a.0 + c.0, a.1 + c.1));
        let mean_ms = durations.iter().sum::<u64>() as f64 / durations.len().max(1) as f64;
        println!(
            "{keys:>9} keys | {loaded:>3} checkpoints in {took:>6.1} s, {mean_ms:>6.0} ms mean, {:>6} ms max, {:>8.1} MiB / {written} keys written ({:.1} B/key) | +{extra} records: {} keys, {:.1} KiB ({:.1} B/key) | {restore} | RocksDB {:.0} MiB on disk ({:.1}x its {memory_mib} MiB budget) | RSS peak {rss:.0} MiB, {rss_after:.0} MiB after the small checkpoint",
            durations.iter().max().unwrap_or(&0),
            bytes as f64 / 1048576.0,
            bytes as f64 / written.max(1) as f64,
            small.1,
            small.0 as f64 / 1024.0,
            small.0 as f64 / small.1.max(1) as f64,
            local as f64 / 1048576.0,
            local as f64 / (memory_mib as f64 * 1048576.0),
        );
    }

    drop(catalog);
    let _ = std::fs::remove_dir_all(&dir);
}
