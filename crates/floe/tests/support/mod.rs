//! What the `floe` tests share: service variables, temp dirs, an in-process catalog, and the
//! Python (DuckDB) read-back.

#![allow(dead_code)] // each test binary uses a part

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use floe_lake::rest::{CatalogClient, CatalogSettings};

pub(crate) mod otelcol;
pub(crate) mod pg;

/// The value of a service variable from `tests/services/up`, for a test that cannot run
/// without it: such tests are `#[ignore]`d (reported as ignored by a plain `cargo test`) and
/// run by `tests/run` with `--include-ignored`; asked for without the variable, they fail.
pub(crate) fn service(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: start the test services (tests/services/up) or run tests/run")
    })
}

/// The value of a service variable that extends a test which also runs without it (e.g. a
/// DuckDB read-back after our own checks): `None` with a note on the terminal — the harness
/// does not capture it, so the skipped part is visible — and a failure when
/// `FLOE_REQUIRE_SERVICES=1`.
pub(crate) fn optional_service(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(v) => Some(v),
        Err(_) => {
            assert!(
                std::env::var("FLOE_REQUIRE_SERVICES").as_deref() != Ok("1"),
                "FLOE_REQUIRE_SERVICES=1 but {name} is not set"
            );
            skipped(&format!("{name} is not set"));
            None
        }
    }
}

/// Says on the real stderr (not the captured one) that part of a test did not run.
pub(crate) fn skipped(why: &str) {
    use std::io::Write;
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let _ = writeln!(std::io::stderr(), "SKIPPED part of {test}: {why}");
}

/// A fresh directory under the system temp dir.
pub(crate) fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("floe-{tag}-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A floe-catalog in this process on a SQLite store and a local warehouse under `dir`, and a
/// client of it.
pub(crate) async fn start_catalog(dir: &Path) -> (floe_catalog::RunningCatalog, CatalogClient) {
    let catalog = floe_catalog::start(
        &floe_catalog::config::CatalogConfig::load(
            None,
            &floe_catalog::config::Overrides {
                listen: Some("127.0.0.1:0".into()),
                warehouse: Some(dir.join("warehouse").display().to_string()),
                store: Some(format!("sqlite://{}", dir.join("catalog.db").display())),
                ..Default::default()
            },
        )
        .unwrap(),
    )
    .await
    .unwrap();
    let client = CatalogClient::connect(CatalogSettings {
        uri: catalog.uri(),
        ..Default::default()
    })
    .await
    .unwrap();
    (catalog, client)
}

/// Runs a Python snippet with `FLOE_TEST_PYTHON` and the DuckDB helpers on its path; returns
/// its stdout and fails the test if it fails.
pub(crate) fn python(script: &str) -> String {
    let helpers = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/services/python");
    let out = Command::new(std::env::var("FLOE_TEST_PYTHON").unwrap())
        .args(["-c", script])
        .env("PYTHONPATH", helpers)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The numbers a script printed, separated by whitespace: exactly `N` of them.
pub(crate) fn numbers<T: std::str::FromStr, const N: usize>(out: &str) -> [T; N] {
    let cells: Vec<T> = out
        .split_whitespace()
        .map(|c| {
            c.parse()
                .unwrap_or_else(|_| panic!("not a number: {c} in {out}"))
        })
        .collect();
    cells
        .try_into()
        .unwrap_or_else(|_| panic!("not {N} numbers: {out}"))
}

/// A port nothing listens on right now.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The body of `GET http://127.0.0.1:{port}{path}` (plain HTTP/1.0).
pub(crate) fn http_get(port: u16, path: &str) -> String {
    http_request(port, path).1
}

/// The status code and body of `GET path` on `127.0.0.1:port`.
pub(crate) fn http_request(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A running `floe` process and the file its log goes to (so a failed stop can show why).
/// Dropped while it runs — a test that failed before stopping it — it is killed, so it
/// does not go on consuming beside the next test.
pub(crate) struct Floe {
    child: Option<std::process::Child>,
    log: PathBuf,
}

impl Floe {
    /// The process, for a caller that stops it its own way.
    pub(crate) fn into_child(mut self) -> std::process::Child {
        self.child.take().expect("a process")
    }
}

impl Drop for Floe {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child
            && matches!(child.try_wait(), Ok(None))
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl std::ops::Deref for Floe {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        self.child.as_ref().expect("a process")
    }
}

impl std::ops::DerefMut for Floe {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        self.child.as_mut().expect("a process")
    }
}

/// The last `lines` lines of a log file (all of it when shorter), for failure messages.
pub(crate) fn log_tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Starts `floe run JOB` with its log appended to `log`.
pub(crate) fn spawn_floe(job: &Path, log: &Path) -> Floe {
    spawn_floe_with(job, log, &[])
}

/// Starts `floe run JOB` with its log appended to `log` and `env` set (a shipped job file's
/// `${VAR}`s).
pub(crate) fn spawn_floe_with(job: &Path, log: &Path, env: &[(&str, &str)]) -> Floe {
    spawn_floe_run(job, log, env, &[])
}

/// `floe run JOB ARGS…` with its log appended to `log` and `env` set.
pub(crate) fn spawn_floe_run(job: &Path, log: &Path, env: &[(&str, &str)], args: &[&str]) -> Floe {
    spawn_run(Path::new(env!("CARGO_BIN_EXE_floe")), job, log, env, args)
}

/// `BIN run JOB ARGS…` — this build's `floe` or another (an upgrade) — with its log appended
/// to `log` and `env` set.
pub(crate) fn spawn_run(
    bin: &Path,
    job: &Path,
    log: &Path,
    env: &[(&str, &str)],
    args: &[&str],
) -> Floe {
    let child = Command::new(bin)
        .args(["run", job.to_str().unwrap()])
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .unwrap(),
        )
        .spawn()
        .unwrap();
    Floe {
        child: Some(child),
        log: log.to_path_buf(),
    }
}

/// `floe ARGS…` (this build), which must succeed: its standard output.
pub(crate) fn floe_command(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_floe"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "floe {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The rebuilt binary the savepointed run resumes with (`FLOE_UPGRADE_BIN`, which `tests/run`
/// builds; without it, and without `FLOE_REQUIRE_SERVICES=1`, the same binary, said on the
/// terminal): a different executable whose version says so.
pub(crate) fn upgraded_binary() -> PathBuf {
    let first = PathBuf::from(env!("CARGO_BIN_EXE_floe"));
    let Some(upgraded) = optional_service("FLOE_UPGRADE_BIN") else {
        return first;
    };
    let version = |bin: &Path| {
        let out = Command::new(bin).arg("--version").output().unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    let upgraded = PathBuf::from(upgraded);
    assert_ne!(
        version(&first),
        version(&upgraded),
        "FLOE_UPGRADE_BIN is a build of its own"
    );
    assert_ne!(
        std::fs::read(&first).unwrap(),
        std::fs::read(&upgraded).unwrap(),
        "FLOE_UPGRADE_BIN is another executable"
    );
    upgraded
}

/// Resumes `job` from savepoint `savepoint` with the rebuilt binary ([`upgraded_binary`]), its
/// log appended to `log`.
pub(crate) fn resume_upgraded(job: &Path, log: &Path, savepoint: &str) -> Floe {
    spawn_run(
        &upgraded_binary(),
        job,
        log,
        &[],
        &["--from-savepoint", savepoint],
    )
}

/// Asserts that the job logging to `log` went back to a savepoint when it started.
pub(crate) fn assert_went_back(log: &Path) {
    let text = std::fs::read_to_string(log).unwrap();
    assert!(
        text.contains("table back at the savepoint"),
        "the resumed job went back to the savepoint ({})",
        log.display()
    );
}

/// Whether process `pid` has installed a handler for SIGTERM (Linux: bit 14 of `SigCgt` in
/// `/proc/PID/status`). A process that has not got that far (still being loaded) is ended by
/// the signal's default action, which no program can prevent.
fn catches_sigterm(pid: u32) -> bool {
    proc_status(pid, "SigCgt")
        .and_then(|mask| u64::from_str_radix(&mask, 16).ok())
        .is_some_and(|mask| mask & (1 << 14) != 0)
}

/// The value of `field` in `/proc/PID/status` (Linux), trimmed; `None` once the process is
/// gone.
pub(crate) fn proc_status(pid: u32, field: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}

/// Stops a job with SIGTERM; it must take its final checkpoint and exit 0. A job started a
/// moment ago gets the signal once it listens for it (Floe does from the start of `main`).
pub(crate) fn terminate(mut floe: Floe) {
    let pid = floe.id();
    let began = Instant::now();
    while !catches_sigterm(pid) && floe.try_wait().unwrap().is_none() {
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "pid {pid} never listened for SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let status = floe.wait().unwrap();
    assert!(
        status.success(),
        "clean stop of pid {pid} exits 0, not {status}; the log's end:\n{}",
        log_tail(&floe.log, 80)
    );
}

/// How many times the chaos tests kill the job: `FLOE_CHAOS_KILLS`, default 20.
pub(crate) fn kills() -> usize {
    std::env::var("FLOE_CHAOS_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

/// Where a Postgres described by a `tokio_postgres::Config` listens, and as whom (for job
/// files and the Postgres tools).
#[derive(Debug, Clone)]
pub(crate) struct PgAddress {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) user: String,
}

impl PgAddress {
    pub(crate) fn of(config: &tokio_postgres::Config) -> Self {
        let host = match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            _ => "127.0.0.1".into(),
        };
        Self {
            host,
            port: config.get_ports().first().copied().unwrap_or(5432),
            user: config.get_user().unwrap_or("postgres").to_string(),
        }
    }
}

/// A session to the test Postgres (no TLS), its connection driven on a task.
pub(crate) async fn pg_connect(config: &tokio_postgres::Config) -> tokio_postgres::Client {
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// Whether replication slot `slot` has confirmed everything up to `lsn`.
pub(crate) async fn slot_confirmed(client: &tokio_postgres::Client, slot: &str, lsn: &str) -> bool {
    slot_at_least(client, slot, "confirmed_flush_lsn", lsn).await
}

/// Whether slot `slot`'s restart point (where a restarted walsender decodes from) has passed
/// `lsn`.
pub(crate) async fn slot_restarts_after(
    client: &tokio_postgres::Client,
    slot: &str,
    lsn: &str,
) -> bool {
    slot_at_least(client, slot, "restart_lsn", lsn).await
}

/// Whether column `point` of slot `slot` in `pg_replication_slots` is at `lsn` or past it.
async fn slot_at_least(
    client: &tokio_postgres::Client,
    slot: &str,
    point: &str,
    lsn: &str,
) -> bool {
    client
        .query_opt(
            &format!(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 \
                 AND {point} >= $2::text::pg_lsn"
            ),
            &[&slot, &lsn],
        )
        .await
        .unwrap()
        .is_some()
}

/// The positions job `job` committed on the dead-letter anchor of `namespace` (empty before
/// its first commit).
pub(crate) async fn committed(
    client: &CatalogClient,
    namespace: &str,
    job: &str,
) -> floe_core::Positions {
    let anchor = iceberg::TableIdent::from_strs([namespace, "floe_dead_letters"]).unwrap();
    client
        .load_table(&anchor)
        .await
        .ok()
        .and_then(|t| floe_lake::marker::newest_marker(&t.metadata, job))
        .map(|f| f.marker.positions)
        .unwrap_or_default()
}

/// How many writers (job incarnations) committed to the dead-letter anchor of `namespace`.
pub(crate) async fn anchor_writers(client: &CatalogClient, namespace: &str) -> usize {
    let anchor = iceberg::TableIdent::from_strs([namespace, "floe_dead_letters"]).unwrap();
    let Ok(table) = client.load_table(&anchor).await else {
        return 0; // nothing committed yet
    };
    let writers: std::collections::HashSet<&String> = table
        .metadata
        .snapshots()
        .filter_map(|s| s.summary().additional_properties.get("floe.writer"))
        .collect();
    writers.len()
}

/// Waits until `namespace`'s anchor has more than `before` writers, or `limit` passed;
/// returns the count. Chaos tests call it so that each incarnation commits once before its
/// kill: on a loaded machine a slow start would otherwise die before it committed, and the
/// kills would test nothing.
pub(crate) async fn wait_for_another_writer(
    client: &CatalogClient,
    namespace: &str,
    before: usize,
    limit: Duration,
) -> usize {
    let began = Instant::now();
    loop {
        let writers = anchor_writers(client, namespace).await;
        if writers > before || began.elapsed() >= limit {
            return writers;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An OTLP job on Kafka as the tests write one: `topics` as (topic, signal), group
/// `floe-{run}`, 700 ms checkpoints, session timeout 6 s, and with `instance` static group
/// membership (a restarted job takes its partitions back at once, without waiting for the
/// killed one's session to time out).
pub(crate) struct OtlpKafkaJob<'a> {
    pub(crate) name: &'a str,
    pub(crate) brokers: &'a str,
    pub(crate) topics: Vec<(String, &'a str)>,
    pub(crate) run: &'a str,
    pub(crate) catalog: &'a str,
    pub(crate) namespace: &'a str,
    pub(crate) instance: Option<&'a str>,
    pub(crate) state_dir: PathBuf,
}

impl OtlpKafkaJob<'_> {
    /// Writes the job file at `path`.
    pub(crate) fn write(&self, path: &Path) -> PathBuf {
        let names: Vec<String> = self
            .topics
            .iter()
            .map(|(t, _)| format!("\"{t}\""))
            .collect();
        let signals: Vec<String> = self
            .topics
            .iter()
            .map(|(t, s)| format!("\"{t}\" = \"{s}\""))
            .collect();
        let membership = self
            .instance
            .map(|i| format!("\"group.instance.id\" = \"floe-test-{i}\"\n"))
            .unwrap_or_default();
        std::fs::write(
            path,
            format!(
                "version = 1\nname = \"{name}\"\n[source.kafka]\nbrokers = \"{brokers}\"\n\
                 topics = [{names}]\ngroup_id = \"floe-{run}\"\nsignals = {{ {signals} }}\n\
                 [source.kafka.properties]\n{membership}\"session.timeout.ms\" = \"6000\"\n\
                 [catalog]\nuri = \"{catalog}\"\nnamespace = \"{namespace}\"\n\
                 [checkpoint]\ninterval = \"700ms\"\nstate_dir = \"{state}\"\n",
                name = self.name,
                brokers = self.brokers,
                names = names.join(", "),
                run = self.run,
                signals = signals.join(", "),
                catalog = self.catalog,
                namespace = self.namespace,
                state = self.state_dir.display(),
            ),
        )
        .unwrap();
        path.to_path_buf()
    }
}

/// Waits until job `job` (its anchor in `namespace`) committed the end of every partition of
/// `topic` in `ends`. Panics after three minutes, naming the job's log.
pub(crate) async fn wait_committed(
    client: &CatalogClient,
    (namespace, job): (&str, &str),
    topic: &str,
    ends: &BTreeMap<i32, i64>,
    log: &Path,
) {
    use floe_core::position_of;
    let began = Instant::now();
    loop {
        let positions = committed(client, namespace, job).await;
        if ends
            .iter()
            .all(|(p, end)| position_of(&positions, topic, *p) == Some(*end))
        {
            return;
        }
        assert!(
            began.elapsed() < Duration::from_secs(180),
            "{namespace}/{job}: the job did not catch up: {positions:?} vs {ends:?}; log: {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The shipped RED recipe (`jobs/otlp-red.toml`) running in `dir`: `floe run` on spans topic
/// `topic` with 1 s checkpoints, exchange topics of its own (`{topic}-x`, `{topic}-r`,
/// `{topic}-t`, `{topic}-f`), its tables in `namespace` of the catalog at `catalog`.
pub(crate) struct RedRecipe {
    pub floe: Floe,
    pub log: PathBuf,
    pub by_service: String,
    /// The exchange of `red_1m`'s final rows by service.
    pub rollups: String,
    pub by_trace: String,
    pub facts: String,
    /// The alerts sink's topic.
    pub alerts: String,
}

impl RedRecipe {
    /// Runs the shipped recipe on `topic`; its Prometheus sinks write to `prometheus` (none:
    /// a closed port — their deliveries fail and the job goes on).
    pub(crate) fn spawn(
        dir: &Path,
        brokers: &str,
        topic: &str,
        catalog: &str,
        namespace: &str,
        prometheus: Option<&str>,
    ) -> Self {
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../jobs/otlp-red.toml");
        let text = std::fs::read_to_string(&shipped)
            .unwrap()
            .replace("interval = \"10s\"", "interval = \"1s\"")
            // Minutes of traffic, not hours: scores from the fourth minute on.
            .replace("warmup = 30,", "warmup = 3,")
            // A topic of its own (earlier runs on the broker left theirs), read as traces.
            .replace(
                "topics = [\"otlp_spans\"]",
                &format!("topics = [\"{topic}\"]\nsignals = {{ \"{topic}\" = \"traces\" }}\n#"),
            );
        std::fs::create_dir_all(dir).unwrap();
        let job = dir.join("otlp-red.toml");
        std::fs::write(&job, text).unwrap();
        let log = dir.join("floe.log");
        let (by_service, by_trace) = (format!("{topic}-x"), format!("{topic}-t"));
        let (rollups, facts) = (format!("{topic}-r"), format!("{topic}-f"));
        let alerts = format!("{topic}-a");
        let state = dir.join("state");
        let floe = spawn_floe_with(
            &job,
            &log,
            &[
                ("KAFKA_BROKERS", brokers),
                ("FLOE_EXCHANGE_TOPIC", &by_service),
                ("FLOE_ROLLUP_TOPIC", &rollups),
                ("FLOE_EDGES_TOPIC", &by_trace),
                ("FLOE_FACTS_TOPIC", &facts),
                ("FLOE_ALERTS_TOPIC", &alerts),
                (
                    "FLOE_PROMETHEUS_URL",
                    prometheus.unwrap_or("http://127.0.0.1:1"),
                ),
                ("FLOE_CATALOG_URI", catalog),
                ("FLOE_NAMESPACE", namespace),
                ("FLOE_STATE_DIR", state.to_str().unwrap()),
            ],
        );
        Self {
            floe,
            log,
            by_service,
            rollups,
            by_trace,
            facts,
            alerts,
        }
    }

    /// Waits until the recipe committed the input up to `ends` and both exchanges after it,
    /// then stops it.
    pub(crate) async fn finish(
        self,
        client: &CatalogClient,
        brokers: &str,
        topic: &str,
        namespace: &str,
        ends: &BTreeMap<i32, i64>,
    ) {
        let job = ExchangeJob {
            brokers,
            namespace,
            job: "otlp-red",
            topic,
            ends,
            exchange: &self.by_service,
            log: &self.log,
        };
        // In the order they are fed: once the input is committed whole, each next exchange's
        // ends are final too.
        for exchange in [&self.by_service, &self.rollups, &self.by_trace, &self.facts] {
            wait_through_exchange(client, &ExchangeJob { exchange, ..job }).await;
        }
        terminate(self.floe);
    }
}

/// Creates Kafka topic `topic` with `partitions` partitions (one replica).
pub(crate) async fn create_topic(brokers: &str, topic: &str, partitions: i32) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    for result in admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .unwrap()
    {
        result.unwrap();
    }
}

/// The tests' Kafka producer of input records (5 ms linger).
pub(crate) fn producer(brokers: &str) -> rdkafka::producer::FutureProducer {
    rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "5")
        .create()
        .unwrap()
}

/// Sends `payload` (without a key) to `partition` of `topic` and waits until the broker has it;
/// returns the offset after it, the partition's end as far as this producer knows.
pub(crate) async fn send_to(
    producer: &rdkafka::producer::FutureProducer,
    topic: &str,
    partition: i32,
    payload: &[u8],
) -> i64 {
    let delivery = producer
        .send(
            rdkafka::producer::FutureRecord::<(), [u8]>::to(topic)
                .partition(partition)
                .payload(payload),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    delivery.offset + 1
}

/// The metadata location of table `namespace.table` (panics if it does not exist).
pub(crate) async fn metadata_location(
    client: &CatalogClient,
    namespace: &str,
    table: &str,
) -> String {
    let ident = iceberg::TableIdent::from_strs([namespace, table]).unwrap();
    client
        .load_table(&ident)
        .await
        .unwrap()
        .metadata_location
        .unwrap()
}

/// The end (high watermark) of every partition of Kafka topic `topic`.
pub(crate) fn topic_ends(brokers: &str, topic: &str) -> BTreeMap<i32, i64> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let timeout = Duration::from_secs(10);
    let metadata = consumer.fetch_metadata(Some(topic), timeout).unwrap();
    let partitions = metadata.topics()[0].partitions().len() as i32;
    (0..partitions)
        .map(|p| (p, consumer.fetch_watermarks(topic, p, timeout).unwrap().1))
        .collect()
}

/// One job reading `topic` (its partitions' ends in `ends`) and re-keying through
/// `exchange`, as [`wait_through_exchange`] watches it.
pub(crate) struct ExchangeJob<'a> {
    pub brokers: &'a str,
    pub namespace: &'a str,
    pub job: &'a str,
    pub topic: &'a str,
    pub ends: &'a BTreeMap<i32, i64>,
    pub exchange: &'a str,
    pub log: &'a Path,
}

/// Waits until the job's committed positions reach the end of every input partition, and
/// then the end every exchange partition had by then (final: a checkpoint's exchange records
/// and clocks are in the topic before it commits). Panics after four minutes.
pub(crate) async fn wait_through_exchange(client: &CatalogClient, job: &ExchangeJob<'_>) {
    use floe_core::position_of;
    let began = Instant::now();
    let mut exchange_ends: Option<BTreeMap<i32, i64>> = None;
    loop {
        let positions = committed(client, job.namespace, job.job).await;
        let input_done = job
            .ends
            .iter()
            .all(|(p, end)| position_of(&positions, job.topic, *p) == Some(*end));
        if input_done && exchange_ends.is_none() {
            exchange_ends = Some(topic_ends(job.brokers, job.exchange));
        }
        if let Some(ends) = &exchange_ends
            && ends.iter().all(|(p, end)| {
                *end == 0 || position_of(&positions, job.exchange, *p) == Some(*end)
            })
        {
            return;
        }
        assert!(
            began.elapsed() < Duration::from_secs(240),
            "{}/{}: the job did not catch up: {positions:?} vs {:?} / {exchange_ends:?}; log: {}",
            job.namespace,
            job.job,
            job.ends,
            job.log.display()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// One record of a sink's topic, as a `read_committed` consumer sees it.
#[derive(Debug, Clone)]
pub(crate) struct Mirrored {
    pub partition: i32,
    /// The `floe-seq` header.
    pub sequence: i64,
    /// The `floe-table` header.
    pub table: String,
    /// The JSON row.
    pub row: String,
}

/// Every committed record of sink topic `topic`, in each partition's order.
pub(crate) fn mirrored(brokers: &str, topic: &str) -> Vec<Mirrored> {
    use rdkafka::message::{Headers, Message};
    read_topic(brokers, topic)
        .into_iter()
        .map(|m| {
            let header = |name: &str| {
                m.headers()
                    .and_then(|h| h.iter().find(|h| h.key == name))
                    .and_then(|h| h.value)
                    .map(|v| String::from_utf8_lossy(v).to_string())
                    .unwrap_or_else(|| panic!("a record of {topic} without {name}"))
            };
            Mirrored {
                partition: m.partition(),
                sequence: header("floe-seq").parse().unwrap(),
                table: header("floe-table"),
                row: String::from_utf8_lossy(m.payload().unwrap_or_default()).to_string(),
            }
        })
        .collect()
}

/// Every committed record of `topic` (`read_committed`), from the beginning to the end each
/// partition had when called, partition by partition.
pub(crate) fn read_topic(brokers: &str, topic: &str) -> Vec<rdkafka::message::OwnedMessage> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("check-{}", uuid::Uuid::new_v4()))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()
        .unwrap();
    let ends = topic_ends(brokers, topic);
    let mut assignment = rdkafka::TopicPartitionList::new();
    for p in ends.keys() {
        assignment
            .add_partition_offset(topic, *p, rdkafka::Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut at_end = BTreeSet::new();
    let mut out = Vec::new();
    let began = Instant::now();
    while at_end.len() < ends.len() {
        assert!(
            began.elapsed() < Duration::from_secs(120),
            "reading {topic} took too long"
        );
        match consumer.poll(Duration::from_millis(500)) {
            None => {}
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            Some(Ok(m)) if m.offset() < ends[&m.partition()] => out.push(m.detach()),
            Some(Ok(_)) => {}
        }
    }
    out
}

/// Compares sink topic `topic` with the table at `table` (a metadata location) on `columns`
/// with DuckDB; returns (records, table rows, records not in the table, rows not in the
/// topic). Each partition's sequence numbers must not go down.
pub(crate) fn compare_mirrored(
    brokers: &str,
    topic: &str,
    table: &str,
    columns: &str,
    dir: &Path,
) -> [u64; 4] {
    let records = mirrored(brokers, topic);
    let mut last: BTreeMap<i32, i64> = BTreeMap::new();
    for r in &records {
        let previous = last.insert(r.partition, r.sequence).unwrap_or(i64::MIN);
        assert!(
            r.sequence >= previous,
            "{topic}/{}: sequence {} after {previous}",
            r.partition,
            r.sequence
        );
    }
    let file = dir.join(format!("{topic}.jsonl"));
    let lines: Vec<&str> = records.iter().map(|r| r.row.as_str()).collect();
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let out = python(&format!(
        r#"import duckdb_offline
con = duckdb_offline.connect()
con.sql("CREATE TABLE t AS SELECT {columns} FROM iceberg_scan('{table}')")
spec = "{{" + ", ".join(f"'{{n}}': '{{t}}'" for n, t, *_ in con.sql("DESCRIBE t").fetchall()) + "}}"
con.sql(f"CREATE TABLE k AS SELECT * FROM read_json('{file}', format = 'newline_delimited', columns = {{spec}})")
one = lambda q: con.sql(q).fetchone()[0]
print(one("SELECT count(*) FROM k"), one("SELECT count(*) FROM t"),
      one("SELECT count(*) FROM (SELECT * FROM k EXCEPT ALL SELECT * FROM t)"),
      one("SELECT count(*) FROM (SELECT * FROM t EXCEPT ALL SELECT * FROM k)"))
"#,
        file = file.display()
    ));
    numbers(&out)
}

/// A Prometheus sink's series against its table (a metadata location), queried back through
/// the HTTP API: returns (rows, samples of the `values` series, wrong) where wrong counts rows
/// without their sample at `window_end` with their value, and samples without a row.
pub(crate) fn compare_prometheus(
    prometheus: &str,
    table: &str,
    metric: &str,
    labels: &[&str],
    values: &[&str],
) -> (i64, i64, i64) {
    let list = |names: &[&str]| {
        names
            .iter()
            .map(|n| format!("\"{n}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let out = python(&format!(
        r#"import duckdb_offline, json, math, urllib.parse, urllib.request
con = duckdb_offline.connect()
labels, values = [{labels}], [{values}]
def samples(selector):
    q = urllib.parse.urlencode({{"query": selector + "[100y]"}})
    result = json.load(urllib.request.urlopen("{prometheus}/api/v1/query?" + q))["data"]["result"]
    out = {{}}
    for s in result:
        for t, v in s["values"]:
            out[tuple(s["metric"].get(l) for l in labels) + (round(float(t) * 1000),)] = float(v)
    return out
rows = con.sql(f"SELECT {{', '.join(labels)}}, epoch_ms(window_end), {{', '.join(values)}} FROM iceberg_scan('{table}')").fetchall()
wrong = total = 0
for i, v in enumerate(values):
    got = samples("{metric}_" + v)
    total += len(got)
    want = {{tuple(r[:len(labels) + 1]): float(r[len(labels) + 1 + i]) for r in rows}}
    wrong += len(rows) - len(want)
    wrong += sum(1 for k, x in want.items() if k not in got or not (got[k] == x or (math.isnan(x) and math.isnan(got[k]))))
    wrong += sum(1 for k in got if k not in want)
print(len(rows), total, wrong)
"#,
        labels = list(labels),
        values = list(values),
    ));
    let [rows, samples, wrong] = numbers::<i64, _>(&out);
    (rows, samples, wrong)
}

/// The newest value of a Prometheus sink's progress marker for table `table_uuid` (-1: none).
pub(crate) fn prometheus_progress(prometheus: &str, sink: &str, table_uuid: &str) -> i64 {
    let out = python(&format!(
        r#"import json, urllib.parse, urllib.request
q = urllib.parse.urlencode({{"query": 'floe_sink_progress{{floe_sink="{sink}",floe_table="{table_uuid}"}}[100y]'}})
result = json.load(urllib.request.urlopen("{prometheus}/api/v1/query?" + q))["data"]["result"]
values = [v for s in result for v in s["values"]]
print(int(float(max(values)[1])) if values else -1)
"#
    ));
    out.trim().parse().unwrap_or_else(|_| panic!("{out}"))
}

/// The sequence number of the newest snapshot job `job` committed to `namespace.table`.
pub(crate) async fn newest_sequence(
    client: &CatalogClient,
    namespace: &str,
    table: &str,
    job: &str,
) -> (String, i64) {
    let ident = iceberg::TableIdent::from_strs([namespace, table]).unwrap();
    let table = client.load_table(&ident).await.unwrap();
    let newest = floe_lake::marker::job_snapshots(&table.metadata, job)[0].1;
    (table.metadata.uuid().to_string(), newest)
}
