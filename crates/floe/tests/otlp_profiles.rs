//! OTLP profiles from Kafka: a generated profile set — five services, stacks sharing their
//! root frames, about half the samples linked to spans — produced as protobuf and as OTLP
//! JSON next to the traces it links to, plus bad profile records; `floe run` lands them, and
//! DuckDB must find every sample once, each service's top stack as computed here from what
//! was sent, every linked sample joined to its span by trace and span id, and every bad record
//! in the dead-letter table with its reason.
//!
//! Needs `FLOE_TEST_KAFKA_BROKERS` and `FLOE_TEST_PYTHON` (from `tests/services/up`): ignored
//! without `--include-ignored`, which `tests/run` passes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use floe_core::position_of;
use floe_otlp::generate::{Generator, profiles_json};
use floe_otlp::profiles::{Dictionary, stack_hash};
use floe_otlp::rows::any_to_string;
use floe_otlp::{Decoded, Signal, decode};
use opentelemetry_proto::tonic::profiles::v1development::ProfilesData;
use prost::Message as _;
use rdkafka::ClientConfig;
use rdkafka::producer::FutureProducer;

mod support;
use support::{
    OtlpKafkaJob, committed, python, service, spawn_floe, start_catalog, temp_dir, terminate,
};

/// Per service, the summed value of each stack (by hash) in what was sent, and how many
/// samples link to a span.
#[derive(Default)]
struct Expected {
    stacks: BTreeMap<String, BTreeMap<String, i64>>,
    samples: u64,
    linked: u64,
}

impl Expected {
    fn note(&mut self, bytes: &[u8]) {
        let Ok(Decoded::Profiles(data)) = decode(Signal::Profiles, bytes) else {
            panic!("generated profiles decode")
        };
        let d = Dictionary::of(&data);
        for rp in &data.resource_profiles {
            let service = rp
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
                .and_then(|a| a.value.as_ref())
                .map(any_to_string)
                .unwrap();
            for p in rp.scope_profiles.iter().flat_map(|s| &s.profiles) {
                for s in &p.samples {
                    let hash = stack_hash(d.frames(s.stack_index));
                    *self
                        .stacks
                        .entry(service.clone())
                        .or_default()
                        .entry(hash)
                        .or_default() += s.values.iter().sum::<i64>();
                    self.samples += 1;
                    self.linked += u64::from(d.link(s.link_index).is_some());
                }
            }
        }
    }

    /// Each service's top stack: the largest sum, ties to the smaller hash.
    fn top(&self) -> BTreeMap<String, (String, i64)> {
        self.stacks
            .iter()
            .map(|(service, stacks)| {
                let (hash, value) = stacks
                    .iter()
                    .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
                    .unwrap();
                (service.clone(), (hash.clone(), *value))
            })
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn profiles_land_with_their_stacks_and_join_their_spans() {
    let brokers = service("FLOE_TEST_KAFKA_BROKERS");
    service("FLOE_TEST_PYTHON");
    let dir = temp_dir("profiles");
    let (catalog, client) = start_catalog(&dir).await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let (spans_topic, profiles_topic) = (format!("spans_{run}"), format!("profiles_{run}"));
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    let mut ends: BTreeMap<String, i64> = BTreeMap::new();
    let mut send = async |topic: &str, payload: &[u8]| {
        let end = support::send_to(&producer, topic, 0, payload).await;
        ends.insert(topic.to_string(), end);
    };

    let mut generator = Generator::new(41, 1_700_000_000_000_000_000);
    let mut expected = Expected::default();
    for round in 0..4 {
        let [traces, _] = generator.requests(30);
        send(&spans_topic, &traces.bytes).await;
        let profiles = generator.profiles(100);
        expected.note(&profiles.bytes);
        // Every other record as OTLP JSON, as the Collector's otlp_json writes it.
        let payload = if round % 2 == 0 {
            profiles.bytes
        } else {
            profiles_json(&profiles.bytes)
        };
        send(&profiles_topic, &payload).await;
    }
    // Bad profile records: not protobuf, a sample pointing past the stack table (what a
    // record of another protocol version decodes as), JSON with a wrong type.
    let mut broken = ProfilesData::decode(generator.profiles(5).bytes.as_slice()).unwrap();
    broken.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].stack_index = 100_000;
    let bad: [Vec<u8>; 3] = [
        vec![0x0f; 40],
        broken.encode_to_vec(),
        br#"{"resourceProfiles":[{"scopeProfiles":[{"profiles":[{"samples":"many"}]}]}]}"#.to_vec(),
    ];
    for record in &bad {
        send(&profiles_topic, record).await;
    }

    let job = OtlpKafkaJob {
        name: "profiles",
        brokers: &brokers,
        topics: vec![
            (spans_topic.clone(), "traces"),
            (profiles_topic.clone(), "profiles"),
        ],
        run: &run,
        catalog: &catalog.uri(),
        namespace: "prof",
        instance: None,
        state_dir: dir.join("state"),
    }
    .write(&dir.join("job.toml"));
    let log = dir.join("floe.log");
    let mut child = spawn_floe(&job, &log);
    let began = Instant::now();
    loop {
        let positions = committed(&client, "prof", "profiles").await;
        if ends
            .iter()
            .all(|(topic, end)| position_of(&positions, topic, 0) == Some(*end))
        {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "floe stopped: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(
            began.elapsed() < Duration::from_secs(120),
            "the job did not catch up: {positions:?} vs {ends:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    terminate(child);

    let location = async |table: &str| support::metadata_location(&client, "prof", table).await;
    let (profiles, spans, dead) = (
        location("otel_profiles").await,
        location("otel_spans").await,
        location("floe_dead_letters").await,
    );
    let out = python(&format!(
        r#"import duckdb_offline, json
con = duckdb_offline.connect()
def rows(q): return con.sql(q).fetchall()
con.sql("CREATE VIEW p AS SELECT * FROM iceberg_scan('{profiles}')")
con.sql("CREATE VIEW s AS SELECT * FROM iceberg_scan('{spans}')")
out = {{}}
out["samples"] = rows("SELECT count(*), count(DISTINCT (kafka_offset, kafka_item)) FROM p")[0]
out["top"] = rows("SELECT service_name, stack_hash, v FROM (SELECT service_name, stack_hash, sum(value) AS v FROM p GROUP BY ALL) QUALIFY row_number() OVER (PARTITION BY service_name ORDER BY v DESC, stack_hash) = 1 ORDER BY 1")
out["joined"] = rows("SELECT count(*), count(DISTINCT s.service_name = p.service_name) FROM p JOIN s ON p.trace_id = s.trace_id AND p.span_id = s.span_id")[0]
out["shapes"] = rows("SELECT count(*) FILTER (WHERE list_last(function_names) = 'main' AND len(function_names) = len(line_numbers) AND len(file_names) = len(addresses) AND sample_type = 'cpu' AND sample_unit = 'nanoseconds' AND list_last(mapping_files) LIKE '/usr/bin/%' AND sample_attributes['thread.name'] LIKE 'worker-%') FROM p")[0]
out["dead"] = rows("SELECT error FROM iceberg_scan('{dead}') ORDER BY kafka_offset")
print(json.dumps(out))"#
    ));
    let out: serde_json::Value = serde_json::from_str(out.trim().lines().last().unwrap()).unwrap();
    assert_eq!(
        out["samples"],
        serde_json::json!([expected.samples, expected.samples]),
        "every sample exactly once"
    );
    let top: BTreeMap<String, (String, i64)> = out["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r[0].as_str().unwrap().to_string(),
                (r[1].as_str().unwrap().to_string(), r[2].as_i64().unwrap()),
            )
        })
        .collect();
    assert_eq!(top, expected.top(), "each service's top stack");
    assert_eq!(top.len(), 5, "five services");
    assert_eq!(
        out["joined"],
        serde_json::json!([expected.linked, 1]),
        "every linked sample joins its span, of its own service"
    );
    assert!(expected.linked > expected.samples / 4);
    assert_eq!(out["shapes"], serde_json::json!([expected.samples]));
    let dead: Vec<String> = out["dead"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[0].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        dead.len(),
        bad.len(),
        "every bad record dead-lettered: {dead:?}"
    );
    assert!(dead[0].contains("protobuf"), "{}", dead[0]);
    assert!(
        dead[1].contains("stack index 100000 is outside")
            && dead[1].contains(floe_otlp::profiles::PROTO_VERSION),
        "{}",
        dead[1]
    );
    assert!(dead[2].contains("JSON"), "{}", dead[2]);
    eprintln!(
        "profiles: {} samples, {} linked to spans, top stacks {:?}",
        expected.samples, expected.linked, top
    );
    catalog.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
