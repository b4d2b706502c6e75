//! Floe's RED against the OpenTelemetry Collector's on the same traces. One Collector
//! (`tests/services/collector`, config `spanmetrics.yaml`) receives the generator's shop
//! traffic over OTLP/HTTP and both writes the spans to Kafka (`partition_traces_by_id`) and
//! counts them with its span metrics connector, whose cumulative `traces.span.metrics.calls`
//! it writes to Kafka too. The shipped RED recipe (`jobs/otlp-red.toml`) lands `otel_red_1m`
//! from the spans; a plain OTLP job lands the connector's counters in `otel_metrics_sum`.
//!
//! Read back by DuckDB, Floe's requests and errors per (service, span name), as the
//! connector's dimensions (service, span name, kind, status) split them — SERVER spans with
//! status ERROR, and the rest — must equal the connector's final cumulative calls, for every
//! service of the shop. A few spans of a service of their own, far later in event time, close
//! every minute of the shop's traffic in Floe; their own minute never closes, and the
//! comparison leaves that service out.
//!
//! Needs `FLOE_TEST_OTELCOL`, `FLOE_TEST_KAFKA_BROKERS` and `FLOE_TEST_PYTHON` (from
//! `tests/services/up`).

use std::path::Path;
use std::time::Duration;

use floe_otlp::generate::{Deploy, Generator};

mod support;
use support::otelcol::{CLOCK_SERVICE, Collector, clock_spans};
use support::{
    OtlpKafkaJob, RedRecipe, python, service, spawn_floe, start_catalog, temp_dir, terminate,
};

const PARTITIONS: i32 = 3;
const EXPORTS: usize = 300;
const REQUESTS: usize = 4;
/// 2025-10-09T08:53:20Z.
const START_NS: u64 = 1_760_000_000_000_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn floes_red_counts_what_the_collectors_span_metrics_count() {
    let brokers = service("FLOE_TEST_KAFKA_BROKERS");
    service("FLOE_TEST_PYTHON");
    let dir = temp_dir("spanmetrics");
    let (catalog, client) = start_catalog(&dir).await;
    let uri = catalog.uri();
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let (spans_topic, metrics_topic) = (format!("sm-spans-{run}"), format!("sm-metrics-{run}"));
    support::create_topic(&brokers, &spans_topic, PARTITIONS).await;
    support::create_topic(&brokers, &metrics_topic, 1).await;

    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/spanmetrics.yaml");
    let mut collector = Collector::start(
        &config,
        &[],
        &[
            ("KAFKA_BROKERS", &brokers),
            ("TRACES_TOPIC", &spans_topic),
            ("METRICS_TOPIC", &metrics_topic),
        ],
        &dir.join("collector.log"),
    );
    let http = reqwest::Client::new();
    collector.ready(&http).await;

    // Ten minutes of the shop's traffic, a bad payments deploy four minutes in; then the
    // clock's spans twenty minutes on.
    let mut spans = 0;
    for j in 0..EXPORTS {
        let start = START_NS + j as u64 * 2_000_000_000;
        let [traces, _logs] = Generator::new(j as u64, start)
            .with_deploy(Deploy {
                service: "payments".into(),
                version: "1.1.0".into(),
                at_unix_nano: START_NS + 4 * 60_000_000_000,
                error_factor: 4.0,
                latency_factor: 1.5,
            })
            .requests(REQUESTS);
        spans += traces.items;
        collector.send(&http, &traces).await;
    }
    collector
        .send(&http, &clock_spans(START_NS + 30 * 60_000_000_000, 64))
        .await;
    // Two flushes of the connector after the last span, then SIGTERM flushes the rest.
    tokio::time::sleep(Duration::from_secs(3)).await;
    collector.stop();

    let spans_ends = support::topic_ends(&brokers, &spans_topic);
    assert_eq!(
        spans_ends.values().filter(|end| **end > 0).count(),
        PARTITIONS as usize,
        "the clock's spans reached every partition"
    );
    let red = RedRecipe::spawn(&dir.join("red"), &brokers, &spans_topic, &uri, "sm", None);
    let metrics_dir = dir.join("metrics");
    std::fs::create_dir_all(&metrics_dir).unwrap();
    let metrics_job = OtlpKafkaJob {
        name: "spanmetrics",
        brokers: &brokers,
        topics: vec![(metrics_topic.clone(), "metrics")],
        run: &run,
        catalog: &uri,
        namespace: "sm_metrics",
        instance: None,
        state_dir: metrics_dir.join("state"),
    }
    .write(&metrics_dir.join("job.toml"));
    let metrics = spawn_floe(&metrics_job, &metrics_dir.join("floe.log"));
    red.finish(&client, &brokers, &spans_topic, "sm", &spans_ends)
        .await;
    let metrics_ends = support::topic_ends(&brokers, &metrics_topic);
    let metrics_log = metrics_dir.join("floe.log");
    support::wait_committed(
        &client,
        ("sm_metrics", "spanmetrics"),
        &metrics_topic,
        &metrics_ends,
        &metrics_log,
    )
    .await;
    terminate(metrics);

    let red_1m = support::metadata_location(&client, "sm", "otel_red_1m").await;
    let sums = support::metadata_location(&client, "sm_metrics", "otel_metrics_sum").await;
    let out = python(&format!(
        r#"import duckdb_offline
con = duckdb_offline.connect()
# A series is the resource and the dimensions; its newest cumulative value is its largest.
con.sql("""CREATE TABLE collector AS
  WITH series AS (SELECT service_name, attributes['span.name'] AS span_name,
      attributes['span.kind'] AS kind, attributes['status.code'] AS status, max(value_int) AS calls
    FROM iceberg_scan('{sums}') WHERE metric_name = 'traces.span.metrics.calls' AND service_name <> '{CLOCK_SERVICE}'
    GROUP BY CAST(resource_attributes AS VARCHAR), CAST(attributes AS VARCHAR), 1, 2, 3, 4)
  SELECT service_name, span_name, kind, status, sum(calls) AS calls FROM series GROUP BY 1, 2, 3, 4""")
con.sql("""CREATE TABLE floe AS
  SELECT service_name, span_name, 'SPAN_KIND_SERVER' AS kind, 'STATUS_CODE_ERROR' AS status, sum(errors) AS calls
  FROM iceberg_scan('{red_1m}') GROUP BY 1, 2 HAVING sum(errors) > 0
  UNION ALL
  SELECT service_name, span_name, 'SPAN_KIND_SERVER', 'STATUS_CODE_UNSET', sum(requests) - sum(errors)
  FROM iceberg_scan('{red_1m}') GROUP BY 1, 2 HAVING sum(requests) > sum(errors)""")
one = lambda q: con.sql(q).fetchone()[0]
print(one("SELECT count(*) FROM collector"), one("SELECT sum(calls) FROM collector"),
      one("SELECT sum(calls) FROM floe"),
      one("SELECT count(*) FROM (SELECT * FROM collector EXCEPT ALL SELECT * FROM floe)"),
      one("SELECT count(*) FROM (SELECT * FROM floe EXCEPT ALL SELECT * FROM collector)"),
      one("SELECT count(DISTINCT service_name) FROM collector"),
      one("SELECT coalesce(sum(calls), 0) FROM collector WHERE status = 'STATUS_CODE_ERROR'"))
"#
    ));
    let [
        series,
        collector_calls,
        floe_calls,
        missing,
        extra,
        services,
        errors,
    ] = support::numbers::<i64, _>(&out);
    eprintln!(
        "span metrics: {series} series, {services} services, {collector_calls} calls \
         ({errors} errors); Floe's RED: {floe_calls} requests; {spans} spans sent"
    );
    assert_eq!(
        collector_calls, spans as i64,
        "the connector counted every span of the shop"
    );
    assert!(services >= 5 && errors > 0, "{out}");
    assert_eq!(
        (missing, extra),
        (0, 0),
        "Floe's requests and errors per (service, span name, kind, status) are the connector's"
    );
    catalog.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
