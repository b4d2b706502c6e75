//! Debezium change events from a real Kafka broker into Iceberg through `floe run`
//! (`format = "debezium-json"`), read back by DuckDB:
//!
//! * `<prefix>.public.customers` with the JsonConverter schema envelope — snapshot reads,
//!   inserts, updates (one carrying the TOAST placeholder with a full `before`), a key change
//!   (delete + tombstone + insert), a delete with its tombstone, a replayed older event, and
//!   Debezium logical types (Decimal, Date, ZonedTimestamp, MicroTimestamp, Uuid, arrays);
//! * `<prefix>.inventory.orders` without the envelope — types inferred from values — and a
//!   truncate;
//!
//! in two runs of the job (the second resumes from the offsets committed in Iceberg, and
//! replays nothing). And a three-partition topic of random upserts and deletes produced while
//! the job is killed -9 at random instants: DuckDB then reads exactly the final image of every
//! key. Needs `FLOE_TEST_KAFKA_BROKERS` and `FLOE_TEST_PYTHON`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use floe_lake::marker::newest_marker;
use iceberg::TableIdent;
use rand::Rng;
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{Value, json};

mod support;
use support::{python, service, spawn_floe, start_catalog, temp_dir, terminate};

fn row_fields() -> Value {
    json!([
        {"type": "int32", "optional": false, "field": "id"},
        {"type": "string", "optional": true, "field": "name"},
        {"type": "bytes", "optional": true, "name": "org.apache.kafka.connect.data.Decimal",
         "version": 1, "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "balance"},
        {"type": "int32", "optional": true, "name": "io.debezium.time.Date", "version": 1, "field": "born"},
        {"type": "string", "optional": true, "name": "io.debezium.time.ZonedTimestamp", "version": 1, "field": "updated_at"},
        {"type": "int64", "optional": true, "name": "io.debezium.time.MicroTimestamp", "version": 1, "field": "seen"},
        {"type": "string", "optional": true, "field": "note"},
        {"type": "array", "optional": true, "items": {"type": "string", "optional": true}, "field": "tags"},
        {"type": "boolean", "optional": true, "field": "active"},
        {"type": "string", "optional": true, "name": "io.debezium.data.Uuid", "version": 1, "field": "uid"}
    ])
}

/// A customers event with the schema envelope.
fn customer_event(op: &str, before: Value, after: Value, lsn: u64) -> Value {
    let row = |field: &str| {
        json!({"type": "struct", "fields": row_fields(), "optional": true,
               "name": "dbz.public.customers.Value", "field": field})
    };
    json!({
        "schema": {"type": "struct", "name": "dbz.public.customers.Envelope", "optional": false,
            "fields": [row("before"), row("after"),
                {"type": "struct", "field": "source", "optional": false, "fields": [
                    {"type": "string", "field": "connector"}, {"type": "int64", "field": "lsn", "optional": true},
                    {"type": "string", "field": "sequence", "optional": true}]},
                {"type": "string", "field": "op"}, {"type": "int64", "field": "ts_ms", "optional": true}]},
        "payload": {"before": before, "after": after, "op": op, "ts_ms": 1_700_000_000_000u64,
            "source": {"connector": "postgresql", "db": "shop", "schema": "public", "table": "customers",
                "snapshot": if op == "r" { "true" } else { "false" }, "lsn": lsn,
                "sequence": format!("[\"{}\",\"{lsn}\"]", lsn.saturating_sub(1))}}
    })
}

fn customer_key(id: i32) -> Value {
    json!({"schema": {"type": "struct", "name": "dbz.public.customers.Key", "optional": false,
        "fields": [{"type": "int32", "optional": false, "field": "id"}]}, "payload": {"id": id}})
}

fn customer(id: i32, name: &str, balance_b64: &str, note: &str) -> Value {
    json!({"id": id, "name": name, "balance": balance_b64, "born": 19_723,
        "updated_at": "2024-01-01T10:00:00.25+02:00", "seen": 1_704_067_200_000_001i64,
        "note": note, "tags": ["a", null, "b,c"], "active": id % 2 == 0,
        "uid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"})
}

fn order(id: i64, item: &str, qty: i64, price: f64) -> Value {
    json!({"id": id, "item": item, "qty": qty, "price": price, "meta": {"gift": id % 2 == 0}})
}

fn order_event(op: &str, before: Value, after: Value) -> Value {
    json!({"before": before, "after": after, "op": op,
        "source": {"connector": "postgresql", "schema": "inventory", "table": "orders"}})
}

/// Sends to partition 0.
async fn send(producer: &FutureProducer, topic: &str, key: &Value, value: Option<&Value>) {
    send_to(producer, topic, 0, key, value).await;
}

/// Sends one record; returns its offset.
async fn send_to(
    producer: &FutureProducer,
    topic: &str,
    partition: i32,
    key: &Value,
    value: Option<&Value>,
) -> i64 {
    let key = key.to_string();
    let value = value.map(|v| v.to_string());
    let mut record = FutureRecord::<String, String>::to(topic)
        .key(&key)
        .partition(partition);
    if let Some(v) = &value {
        record = record.payload(v);
    }
    producer
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .unwrap()
        .offset
}

/// A job file for `topics`, for replica `replica`; static group membership lets a restarted
/// replica take its partitions back at once instead of after the killed member's session
/// timeout.
fn job_file(
    dir: &Path,
    brokers: &str,
    topics: &[&str],
    group: &str,
    catalog: &str,
    replica: usize,
) -> std::path::PathBuf {
    let job = dir.join(format!("job-{replica}.toml"));
    let topics: Vec<String> = topics.iter().map(|t| format!("\"{t}\"")).collect();
    std::fs::write(
        &job,
        format!(
            "version = 1\nname = \"dbz\"\n[source.kafka]\nbrokers = \"{brokers}\"\n\
             topics = [{}]\nformat = \"debezium-json\"\ngroup_id = \"{group}\"\n\
             [source.kafka.properties]\n\"group.instance.id\" = \"floe-test-{replica}\"\n\
             \"session.timeout.ms\" = \"6000\"\n\
             [catalog]\nuri = \"{catalog}\"\nnamespace = \"dbz\"\n\
             [checkpoint]\ninterval = \"1s\"\nstate_dir = \"{}\"\n\
             [tables.\"inventory.orders\"]\nname = \"orders\"\n",
            topics.join(", "),
            dir.join(format!("state-{replica}")).display()
        ),
    )
    .unwrap();
    job
}

/// Runs the job until the anchor's committed positions reach `ends` (topic, partition, next
/// offset), then stops it cleanly.
fn run_until_caught_up(
    job: &Path,
    log: &Path,
    client: &floe_lake::rest::CatalogClient,
    ends: &[(String, i32, i64)],
) -> impl std::future::Future<Output = ()> {
    let mut child = spawn_floe(job, log);
    let log = log.to_path_buf();
    let ends = ends.to_vec();
    let client = client.clone();
    async move {
        let anchor = TableIdent::from_strs(["dbz", "floe_dead_letters"]).unwrap();
        let began = Instant::now();
        loop {
            assert!(
                child.try_wait().unwrap().is_none(),
                "floe stopped: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            let done = match client.load_table(&anchor).await {
                Ok(t) => newest_marker(&t.metadata, "dbz").is_some_and(|m| {
                    ends.iter().all(|(topic, partition, end)| {
                        floe_core::position_of(&m.marker.positions, topic, *partition) == Some(*end)
                    })
                }),
                Err(_) => false,
            };
            if done {
                break;
            }
            assert!(
                began.elapsed() < Duration::from_secs(120),
                "did not catch up: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        terminate(child);
    }
}

/// A catalog in this process, a temp dir, a fresh topic prefix and a producer.
struct Fixture {
    brokers: String,
    dir: std::path::PathBuf,
    catalog: floe_catalog::RunningCatalog,
    client: floe_lake::rest::CatalogClient,
    prefix: String,
    producer: FutureProducer,
}

impl Fixture {
    async fn new(tag: &str) -> Self {
        let brokers = service("FLOE_TEST_KAFKA_BROKERS");
        service("FLOE_TEST_PYTHON");
        let dir = temp_dir(tag);
        let (catalog, client) = start_catalog(&dir).await;
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("linger.ms", "5")
            .create()
            .unwrap();
        Self {
            brokers,
            dir,
            catalog,
            client,
            prefix: format!("dbz{}", uuid::Uuid::new_v4().simple()),
            producer,
        }
    }

    /// A job file reading `topics` (see [`job_file`]).
    fn job(&self, topics: &[&str]) -> std::path::PathBuf {
        self.replica_job(topics, 0)
    }

    /// The job file of replica `replica` of the same job.
    fn replica_job(&self, topics: &[&str], replica: usize) -> std::path::PathBuf {
        job_file(
            &self.dir,
            &self.brokers,
            topics,
            &self.prefix,
            &self.catalog.uri(),
            replica,
        )
    }

    async fn finish(self) {
        self.catalog.stop().await.unwrap();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn debezium_topics_become_upserted_tables() {
    let f = Fixture::new("debezium").await;
    let (dir, client, producer) = (&f.dir, &f.client, &f.producer);
    let customers = format!("{}.public.customers", f.prefix);
    let orders = format!("{}.inventory.orders", f.prefix);
    support::create_topic(&f.brokers, &customers, 1).await;
    support::create_topic(&f.brokers, &orders, 1).await;

    // 12.50 = "BOI=", 3.00 = "ASw=", 99.99 = "Jw8=".
    let (b1250, b300, b9999) = ("BOI=", "ASw=", "Jw8=");
    let big_note = "x".repeat(5000);
    // Run 1: snapshot reads, an insert, updates, a delete with tombstone.
    for id in 1..=3 {
        send(
            producer,
            &customers,
            &customer_key(id),
            Some(&customer_event(
                "r",
                Value::Null,
                customer(id, &format!("c{id}"), b1250, &big_note),
                100,
            )),
        )
        .await;
    }
    send(
        producer,
        &customers,
        &customer_key(4),
        Some(&customer_event(
            "c",
            Value::Null,
            customer(4, "c4", b300, "short"),
            200,
        )),
    )
    .await;
    // id 1: the note was not read (TOAST placeholder); the full before supplies it.
    let mut updated = customer(1, "c1-renamed", b9999, "__debezium_unavailable_value");
    updated["active"] = json!(true);
    send(
        producer,
        &customers,
        &customer_key(1),
        Some(&customer_event(
            "u",
            customer(1, "c1", b1250, &big_note),
            updated,
            300,
        )),
    )
    .await;
    // id 2 is deleted (before = key only), then its tombstone.
    send(
        producer,
        &customers,
        &customer_key(2),
        Some(&customer_event("d", json!({"id": 2}), Value::Null, 400)),
    )
    .await;
    send(producer, &customers, &customer_key(2), None).await;
    // A replay of id 4's insert, older than what was applied: dropped.
    send(
        producer,
        &customers,
        &customer_key(4),
        Some(&customer_event(
            "c",
            Value::Null,
            customer(4, "stale", b1250, "stale"),
            150,
        )),
    )
    .await;

    for id in 1..=3 {
        send(
            producer,
            &orders,
            &json!({"id": id}),
            Some(&order_event("c", Value::Null, order(id, "book", id, 12.5))),
        )
        .await;
    }
    send(
        producer,
        &orders,
        &json!({"id": 2}),
        Some(&order_event("u", Value::Null, order(2, "pen", 5, 1.25))),
    )
    .await;

    let job = f.job(&[&customers, &orders]);
    let log = dir.join("floe.log");
    run_until_caught_up(
        &job,
        &log,
        client,
        &[(customers.clone(), 0, 8), (orders.clone(), 0, 4)],
    )
    .await;

    // Run 2: a key change 3 → 30 (delete, tombstone, insert), and a truncate of orders
    // followed by a new order.
    send(
        producer,
        &customers,
        &customer_key(3),
        Some(&customer_event(
            "d",
            customer(3, "c3", b1250, &big_note),
            Value::Null,
            500,
        )),
    )
    .await;
    send(producer, &customers, &customer_key(3), None).await;
    send(
        producer,
        &customers,
        &customer_key(30),
        Some(&customer_event(
            "c",
            Value::Null,
            customer(30, "c3", b1250, &big_note),
            501,
        )),
    )
    .await;
    send(
        producer,
        &orders,
        &json!({"id": 1}),
        Some(&json!({"before": null, "after": null, "op": "t", "source": {}})),
    )
    .await;
    send(
        producer,
        &orders,
        &json!({"id": 9}),
        Some(&order_event("c", Value::Null, order(9, "lamp", 1, 40.0))),
    )
    .await;
    run_until_caught_up(
        &job,
        &log,
        client,
        &[(customers.clone(), 0, 11), (orders.clone(), 0, 6)],
    )
    .await;

    let location = |table: &str| {
        let client = client.clone();
        let table = table.to_string();
        async move {
            client
                .load_table(&TableIdent::from_strs(["dbz", &table]).unwrap())
                .await
                .unwrap()
                .metadata_location
                .unwrap()
        }
    };
    let (c, o) = (location("customers").await, location("orders").await);
    let out = python(&format!(
        "import duckdb_offline\ncon = duckdb_offline.connect()\n\
         for r in con.sql(\"SELECT id, name, balance::varchar, born::varchar, epoch_us(updated_at), epoch_us(seen), length(note), array_to_string(list_transform(tags, x -> coalesce(x, '~')), '|'), active, uid::varchar FROM iceberg_scan('{c}') ORDER BY id\").fetchall(): print('C', *r)\n\
         for r in con.sql(\"SELECT id, item, qty, price, meta FROM iceberg_scan('{o}') ORDER BY id\").fetchall(): print('O', *r)\n"
    ));
    let lines: Vec<&str> = out.lines().collect();
    let ts = 1_704_096_000_250_000i64; // 2024-01-01T08:00:00.25Z
    let seen = 1_704_067_200_000_001i64;
    let uid = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11";
    assert_eq!(
        lines,
        vec![
            format!("C 1 c1-renamed 99.99 2024-01-01 {ts} {seen} 5000 a|~|b,c True {uid}"),
            format!("C 4 c4 3.00 2024-01-01 {ts} {seen} 5 a|~|b,c True {uid}"),
            format!("C 30 c3 12.50 2024-01-01 {ts} {seen} 5000 a|~|b,c True {uid}"),
            "O 9 lamp 1 40.0 {\"gift\":false}".to_string(),
        ],
        "{out}"
    );
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn debezium_upserts_land_exactly_once_through_kill_9() {
    let f = Fixture::new("debezium-chaos").await;
    let (dir, client, producer) = (&f.dir, &f.client, &f.producer);
    let topic = format!("{}.public.kv", f.prefix);
    support::create_topic(&f.brokers, &topic, 3).await;
    let job = f.job(&[&topic]);
    let log = dir.join("floe.log");

    // The expected final image per key; a key always goes to the same partition.
    let mut expected: std::collections::BTreeMap<i64, i64> = Default::default();
    let mut ends = [0i64; 3];
    let mut lsn = 1_000u64;
    let kills = std::env::var("FLOE_CHAOS_KILLS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(8, |k| (k / 2).max(4));
    for _ in 0..kills {
        let mut child = spawn_floe(&job, &log);
        let life = Duration::from_millis(rand::random_range(300..2500));
        let began = Instant::now();
        while began.elapsed() < life {
            for _ in 0..50 {
                let id = rand::random_range(0..300i64);
                let partition = (id % 3) as i32;
                lsn += 1;
                let source = json!({"connector": "postgresql", "schema": "public", "table": "kv",
                    "sequence": format!("[\"{}\",\"{lsn}\"]", lsn - 1), "lsn": lsn});
                let key = json!({"id": id});
                let offset = if rand::random_range(0..4) == 0 {
                    expected.remove(&id);
                    let deleted =
                        json!({"before": {"id": id}, "after": null, "op": "d", "source": source});
                    send_to(producer, &topic, partition, &key, Some(&deleted)).await;
                    send_to(producer, &topic, partition, &key, None).await
                } else {
                    let v = lsn as i64;
                    let op = if expected.insert(id, v).is_some() {
                        "u"
                    } else {
                        "c"
                    };
                    let event = json!({"before": null, "after": {"id": id, "v": v}, "op": op, "source": source});
                    send_to(producer, &topic, partition, &key, Some(&event)).await
                };
                ends[partition as usize] = offset + 1;
            }
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }
    let ends: Vec<(String, i32, i64)> = ends
        .iter()
        .enumerate()
        .map(|(p, end)| (topic.clone(), p as i32, *end))
        .collect();
    run_until_caught_up(&job, &log, client, &ends).await;

    let table = client
        .load_table(&TableIdent::from_strs(["dbz", "kv"]).unwrap())
        .await
        .unwrap();
    // The kills hit incarnations that had committed rows.
    let writers: std::collections::BTreeSet<String> = table
        .metadata
        .snapshots()
        .filter_map(|s| {
            floe_lake::marker::CommitMarker::from_properties(&s.summary().additional_properties)
        })
        .filter_map(|m| m.writer)
        .collect();
    assert!(
        writers.len() > kills / 3,
        "{} incarnations committed rows",
        writers.len()
    );
    let location = table.metadata_location.unwrap();
    let out = python(&format!(
        "import duckdb_offline\ncon = duckdb_offline.connect()\n\
         for r in con.sql(\"SELECT id, v FROM iceberg_scan('{location}') ORDER BY id\").fetchall(): print(*r)\n"
    ));
    let got: Vec<(i64, i64)> = out
        .lines()
        .map(|l| {
            let (a, b) = l.split_once(' ').unwrap();
            (a.parse().unwrap(), b.parse().unwrap())
        })
        .collect();
    let want: Vec<(i64, i64)> = expected.into_iter().collect();
    assert_eq!(got.len(), want.len(), "one row per live key");
    assert_eq!(got, want, "the final image of every key, exactly once");
    eprintln!(
        "debezium chaos: {kills} kills, {} incarnations committed, {} events, {} live keys \
         equal in DuckDB",
        writers.len(),
        lsn - 1_000,
        got.len()
    );
    f.finish().await;
}

/// One Debezium event of the `kv` table: `c`/`u` with `(id, version)`, or `d`.
fn kv_event(op: &str, id: i64, version: i64, lsn: u64) -> Value {
    let source = json!({"connector": "postgresql", "schema": "public", "table": "kv",
        "sequence": format!("[\"{}\",\"{lsn}\"]", lsn - 1), "lsn": lsn});
    if op == "d" {
        json!({"before": {"id": id}, "after": null, "op": "d", "source": source})
    } else {
        json!({"before": null, "after": {"id": id, "version": version}, "op": op, "source": source})
    }
}

/// The regression test of issue 18: replicas of one Debezium job, killed -9 and restarted,
/// with replicas joining and leaving mid-stream, never move a committed position back, and
/// readers never see a key go back to an older image or come back after its delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn debezium_replicas_never_rewind_positions_or_rows() {
    let f = Fixture::new("debezium-replicas").await;
    let (client, producer) = (&f.client, &f.producer);
    const PARTITIONS: i64 = 6;
    let topic = format!("{}.public.kv", f.prefix);
    support::create_topic(&f.brokers, &topic, PARTITIONS as i32).await;
    let log = f.dir.join("floe.log");
    let jobs: Vec<_> = (0..3).map(|r| f.replica_job(&[&topic], r)).collect();

    // Keys are never reused: a key changed or deleted is gone for good, so a reader must
    // never see it again, and every image of a key has a higher version than the last.
    let mut live: BTreeMap<i64, i64> = BTreeMap::new();
    let (mut next_id, mut lsn, mut events) = (0i64, 1_000u64, 0usize);
    let mut ends = vec![0i64; PARTITIONS as usize];
    let mut replicas: Vec<Option<support::Floe>> = vec![
        Some(spawn_floe(&jobs[0], &log)),
        Some(spawn_floe(&jobs[1], &log)),
        None,
    ];
    let kills_wanted = (support::kills() / 2).max(10);
    let (mut kills, mut round, mut joins) = (0, 0, 0);
    let mut rng = rand::rng();
    while kills < kills_wanted {
        round += 1;
        for _ in 0..120 {
            let pick = rng.random_range(0..100);
            let existing = (!live.is_empty())
                .then(|| *live.keys().nth(rng.random_range(0..live.len())).unwrap());
            let emit = |op: &str, id: i64, version: i64| (op.to_string(), id, version);
            let batch: Vec<(String, i64, i64)> = match (pick, existing) {
                (0..30, _) | (_, None) => {
                    next_id += 1;
                    live.insert(next_id, 1);
                    vec![emit("c", next_id, 1)]
                }
                (30..75, Some(id)) => {
                    let v = live[&id] + 1;
                    live.insert(id, v);
                    vec![emit("u", id, v)]
                }
                (75..85, Some(id)) => {
                    live.remove(&id);
                    vec![emit("d", id, 0)]
                }
                (_, Some(id)) => {
                    // A key change: the old key goes, a new one comes.
                    live.remove(&id);
                    next_id += 1;
                    live.insert(next_id, 1);
                    vec![emit("d", id, 0), emit("c", next_id, 1)]
                }
            };
            for (op, id, version) in batch {
                lsn += 1;
                events += 1;
                let partition = (id % PARTITIONS) as i32;
                let key = json!({"id": id});
                let offset = send_to(
                    producer,
                    &topic,
                    partition,
                    &key,
                    Some(&kv_event(&op, id, version, lsn)),
                )
                .await;
                let offset = if op == "d" {
                    send_to(producer, &topic, partition, &key, None).await
                } else {
                    offset
                };
                ends[partition as usize] = offset + 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..1500))).await;
        // Kill one running replica -9, bring back the others; now and then a third joins the
        // group and later leaves (forced rebalances).
        let running: Vec<usize> = (0..2).filter(|r| replicas[*r].is_some()).collect();
        if !running.is_empty() && rng.random_range(0..3) > 0 {
            let r = running[rng.random_range(0..running.len())];
            let mut child = replicas[r].take().unwrap();
            child.kill().unwrap();
            child.wait().unwrap();
            kills += 1;
        }
        for r in 0..2 {
            if replicas[r].is_none() && rng.random_range(0..2) == 0 {
                replicas[r] = Some(spawn_floe(&jobs[r], &log));
            }
        }
        match replicas[2].take() {
            None if round % 4 == 1 => {
                replicas[2] = Some(spawn_floe(&jobs[2], &log));
                joins += 1;
            }
            Some(child) if round % 4 == 3 => terminate(child),
            other => replicas[2] = other,
        }
    }
    for r in 0..2 {
        if replicas[r].is_none() {
            replicas[r] = Some(spawn_floe(&jobs[r], &log));
        }
    }
    // Every replica runs until the job's commits reach the end of every partition.
    let anchor = TableIdent::from_strs(["dbz", "floe_dead_letters"]).unwrap();
    let began = Instant::now();
    loop {
        let caught_up = match client.load_table(&anchor).await {
            Ok(t) => newest_marker(&t.metadata, "dbz").is_some_and(|m| {
                ends.iter().enumerate().all(|(p, end)| {
                    floe_core::position_of(&m.marker.positions, &topic, p as i32) == Some(*end)
                })
            }),
            Err(_) => false,
        };
        if caught_up {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(180),
            "the replicas did not catch up: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for child in replicas.into_iter().flatten() {
        terminate(child);
    }

    // 1. No commit moves a partition's position (or its sequence watermark) back.
    let anchor = client.load_table(&anchor).await.unwrap();
    let mut snapshots: Vec<_> = anchor.metadata.snapshots().collect();
    snapshots.sort_by_key(|s| s.sequence_number());
    let mut seen: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let mut commits = 0;
    for s in &snapshots {
        let Some(marker) =
            floe_lake::marker::CommitMarker::from_properties(&s.summary().additional_properties)
        else {
            continue;
        };
        commits += 1;
        for (key, value) in &marker.positions {
            let at = match value.split_once(',') {
                Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
                None => (value.parse().unwrap(), 0),
            };
            if let Some(before) = seen.insert(key.clone(), at) {
                assert!(
                    at >= before,
                    "checkpoint {} of writer {:?} moved {key} back from {before:?} to {at:?}",
                    marker.checkpoint_id,
                    marker.writer
                );
            }
        }
    }

    // 2. DuckDB reads every snapshot of the table: versions never decrease, a key that went
    // never returns; 3. the last one is exactly the live keys.
    let table = client
        .load_table(&TableIdent::from_strs(["dbz", "kv"]).unwrap())
        .await
        .unwrap();
    let location = table.metadata_location.clone().unwrap();
    let out = python(&format!(
        "import duckdb_offline, json\ncon = duckdb_offline.connect()\n\
         m = json.load(open('{location}'.removeprefix('file://')))\n\
         for s in sorted(m['snapshots'], key=lambda s: s['sequence-number']):\n\
         \x20   sid = s['snapshot-id']\n\
         \x20   rows = con.sql(f\"SELECT id, version FROM iceberg_scan('{location}', snapshot_from_id={{sid}}) ORDER BY id\").fetchall()\n\
         \x20   print(sid, ' '.join(f'{{a}}:{{b}}' for a, b in rows))\n"
    ));
    let mut last: BTreeMap<i64, i64> = BTreeMap::new();
    let mut gone: std::collections::BTreeSet<i64> = Default::default();
    let mut snapshots_read = 0;
    for line in out.lines() {
        snapshots_read += 1;
        let mut parts = line.split(' ');
        let sid = parts.next().unwrap();
        let now: BTreeMap<i64, i64> = parts
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (a, b) = p.split_once(':').unwrap();
                (a.parse().unwrap(), b.parse().unwrap())
            })
            .collect();
        for (id, version) in &now {
            assert!(
                !gone.contains(id),
                "snapshot {sid}: key {id} came back after it went"
            );
            if let Some(before) = last.get(id) {
                assert!(
                    version >= before,
                    "snapshot {sid}: key {id} went back from version {before} to {version}"
                );
            }
        }
        gone.extend(last.keys().filter(|id| !now.contains_key(id)));
        last = now;
    }
    assert_eq!(last.len(), live.len(), "one row per live key");
    assert!(
        last == live,
        "the last snapshot is exactly the final image of every key"
    );
    let writers: std::collections::BTreeSet<String> = table
        .metadata
        .snapshots()
        .filter_map(|s| {
            floe_lake::marker::CommitMarker::from_properties(&s.summary().additional_properties)
        })
        .filter_map(|m| m.writer)
        .collect();
    assert!(
        writers.len() >= 4,
        "{} incarnations committed rows",
        writers.len()
    );
    eprintln!(
        "debezium replicas: {kills} kills, {joins} joins of a third replica, {events} events, \
         {commits} commits, {} writers, {snapshots_read} snapshots read by DuckDB, {} live keys",
        writers.len(),
        live.len()
    );
    f.finish().await;
}
