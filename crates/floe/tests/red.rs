//! The shipped RED recipe (`jobs/otlp-red.toml`) as a user runs it: the `floe` binary reads
//! generated OTLP spans from a real Kafka topic of four partitions, selects the requests,
//! re-keys them by service through an exchange and rolls them up per minute into
//! `otel_red_1m`, through a real floe-catalog.
//!
//! Read back by DuckDB, `otel_red_1m` must be DuckDB's own computation over the landed raw
//! spans (`otel_spans`) with the recipe's definitions — requests are SERVER, CONSUMER and root
//! spans; errors are status ERROR or HTTP 5xx on SERVER spans — for every minute the final
//! clock closed: one row per (window, service, span name, version, team), counts and errors
//! exact (`EXCEPT ALL` both ways), and every latency quantile within the sketch's 1 %
//! relative error of the exact quantile at the same rank. `otel_slo_status` must equal
//! DuckDB's minute series and window sums; `otel_deploy_regressions` must flag the bad deploy
//! of `payments` four minutes in, with DuckDB's request counts and error rates of both
//! versions over the compared minutes and the z-test's p-value recomputed from them.
//! `otel_service_edges` (behind a second exchange, by trace id), its partial rows summed per
//! (minute, caller, callee), must equal DuckDB's join of each span with its parent of another
//! service, and its merged p99 sketches the exact p99 within the sketch's 1 %.
//! `otel_anomaly_scores` (warm-up shortened to 3 minutes) must carry, per scored minute and
//! service, the request count and error rate of `otel_red_1m`; `otel_anomalies` exactly the
//! scores past the threshold. The alerts sink's topic, read `read_committed`, must hold each
//! row of `otel_alerts` once; Prometheus, queried back, one sample per value of each row of
//! `otel_slo_status` and `otel_anomaly_scores` (its sinks).
//!
//! Needs `FLOE_TEST_KAFKA_BROKERS`, `FLOE_TEST_PROMETHEUS_URL` and `FLOE_TEST_PYTHON` (from
//! `tests/services/up`).

use std::collections::BTreeMap;

use floe_otlp::generate::{Deploy, Generator};

mod support;
use support::{python, service, start_catalog, temp_dir};

const PARTITIONS: i32 = 4;
const RECORDS: usize = 1200;
const REQUESTS: usize = 4;
/// 2025-10-09T08:53:20Z.
const START_NS: u64 = 1_760_000_000_000_000_000;
/// Event time of the bad deploy: `payments` 1.1.0, 4 × its errors, 1.5 × slower.
const DEPLOY_NS: u64 = START_NS + 4 * 60_000_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test services: tests/run, or tests/services/up then --include-ignored"]
async fn the_red_recipe_equals_duckdb_over_the_landed_spans() {
    let brokers = service("FLOE_TEST_KAFKA_BROKERS");
    service("FLOE_TEST_PYTHON");
    let dir = temp_dir("red");
    let (catalog, client) = start_catalog(&dir).await;
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let topic = format!("red-{run}");
    support::create_topic(&brokers, &topic, PARTITIONS).await;

    // Twenty-four minutes of traffic (the alerts wait for the service map, 5 minutes behind),
    // a record every 1.2 s of event time, spread over the
    // partitions; payments deploys a bad version four minutes in.
    let producer = support::producer(&brokers);
    let mut ends: BTreeMap<i32, i64> = BTreeMap::new();
    for j in 0..RECORDS {
        let start = START_NS + j as u64 * 1_200_000_000;
        let [traces, _logs] = Generator::new(j as u64, start)
            .with_deploy(Deploy {
                service: "payments".into(),
                version: "1.1.0".into(),
                at_unix_nano: DEPLOY_NS,
                error_factor: 4.0,
                latency_factor: 1.5,
            })
            .requests(REQUESTS);
        let partition = (j % PARTITIONS as usize) as i32;
        let end = support::send_to(&producer, &topic, partition, &traces.bytes).await;
        ends.insert(partition, end);
    }

    let uri = catalog.uri();
    let prometheus = service("FLOE_TEST_PROMETHEUS_URL");
    let recipe = support::RedRecipe::spawn(&dir, &brokers, &topic, &uri, "red", Some(&prometheus));
    let alerts_topic = recipe.alerts.clone();
    recipe.finish(&client, &brokers, &topic, "red", &ends).await;

    let location = async |table: &str| support::metadata_location(&client, "red", table).await;
    let spans = location("otel_spans").await;
    let red = location("otel_red_1m").await;
    let slo = location("otel_slo_status").await;
    let out = python(&format!(
        r#"import duckdb_offline
con = duckdb_offline.connect()
con.sql("CREATE TABLE spans AS SELECT * FROM iceberg_scan('{spans}')")
con.sql("CREATE TABLE got AS SELECT epoch_us(window_start) AS start_us, service_name, span_name, service_version, team, requests, errors, p50_ns, p95_ns, p99_ns FROM iceberg_scan('{red}')")
con.sql('''CREATE TABLE requests AS SELECT (epoch_us(ts) // 60000000) * 60000000 AS start_us,
    service_name, span_name, coalesce(service_version, '') AS service_version,
    coalesce(resource_attributes['team'], '') AS team, duration_ns,
    CASE WHEN status_code = 'ERROR' OR (span_kind = 'SERVER' AND coalesce(
      TRY_CAST(span_attributes['http.response.status_code'] AS INT),
      TRY_CAST(span_attributes['http.status_code'] AS INT), 0) >= 500) THEN 1 ELSE 0 END AS error
  FROM spans WHERE span_kind IN ('SERVER', 'CONSUMER') OR is_root''')
clock = con.sql("SELECT min(m) FROM (SELECT max(epoch_us(ts)) AS m FROM spans GROUP BY kafka_partition)").fetchone()[0]
con.sql(f'''CREATE TABLE expected AS SELECT start_us, service_name, span_name, service_version, team,
    count(*) AS requests, sum(error) AS errors, list_sort(list(duration_ns)) AS d
  FROM requests GROUP BY ALL HAVING start_us + 60000000 <= {{clock}} - 5000000''')
one = lambda q: con.sql(q).fetchone()[0]
keys = "start_us, service_name, span_name, service_version, team, requests, errors"
# The shipped [[slos]]: minutes are final a minute after they end (allowed_lateness).
last = ((clock - 5000000 - 120000000) // 60000000) * 60000000
con.sql('''CREATE TABLE slo_requests AS
  SELECT 'frontend-availability' AS slo, start_us, 1 - error AS good, 0.995 AS target FROM requests WHERE service_name = 'frontend'
  UNION ALL SELECT 'checkout-latency', start_us, CASE WHEN duration_ns <= 250000000 THEN 1 ELSE 0 END, 0.99
  FROM requests WHERE service_name = 'checkout' AND span_name = 'PlaceOrder' ''')
con.sql(f'''CREATE TABLE slo_expected AS
  WITH minutes AS (SELECT slo, start_us, sum(good) AS good, count(*) AS total FROM slo_requests GROUP BY ALL),
  dense AS (SELECT slo, unnest(generate_series(min(start_us), {{last}}, 60000000)) AS start_us FROM minutes GROUP BY slo),
  filled AS (SELECT d.slo, d.start_us, coalesce(m.good, 0) AS good, coalesce(m.total, 0) AS total
    FROM dense d LEFT JOIN minutes m USING (slo, start_us))
  SELECT slo, start_us, good, total,
    sum(total) OVER w5 AS total_5m, sum(total - good) OVER w5 AS bad_5m,
    sum(total) OVER w60 AS total_1h, sum(total - good) OVER w60 AS bad_1h,
    sum(total) OVER wall AS period_total, sum(total - good) OVER wall AS period_bad
  FROM filled
  WINDOW w5 AS (PARTITION BY slo ORDER BY start_us ROWS BETWEEN 4 PRECEDING AND CURRENT ROW),
    w60 AS (PARTITION BY slo ORDER BY start_us ROWS BETWEEN 59 PRECEDING AND CURRENT ROW),
    wall AS (PARTITION BY slo ORDER BY start_us ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)''')
con.sql(f"CREATE TABLE slo_got AS SELECT *, epoch_us(window_start) AS start_us FROM iceberg_scan('{slo}')")
slo_keys = "slo, start_us, good, total, total_5m, bad_5m, total_1h, bad_1h, period_total, period_bad"
print(one("SELECT count(*) FROM got"),
      one("SELECT count(*) FROM (SELECT DISTINCT start_us, service_name, span_name, service_version, team FROM got)"),
      one(f"SELECT count(*) FROM (SELECT {{keys}} FROM expected EXCEPT ALL SELECT {{keys}} FROM got)"),
      one(f"SELECT count(*) FROM (SELECT {{keys}} FROM got EXCEPT ALL SELECT {{keys}} FROM expected)"),
      one("SELECT sum(errors) FROM got"),
      one("SELECT count(*) FROM got WHERE service_version IN ('1.0.0', '1.1.0') AND team = 'shop-core'"),
      one("SELECT count(*) FROM slo_got"),
      one(f"SELECT count(*) FROM (SELECT {{slo_keys}} FROM slo_expected EXCEPT ALL SELECT {{slo_keys}} FROM slo_got)"),
      one(f"SELECT count(*) FROM (SELECT {{slo_keys}} FROM slo_got EXCEPT ALL SELECT {{slo_keys}} FROM slo_expected)"),
      one('''SELECT count(*) FROM slo_got WHERE abs(burn_rate_1h - CASE WHEN total_1h = 0 THEN 0
             ELSE bad_1h / total_1h / (1 - target) END) > 1e-9
             OR abs(budget_remaining - CASE WHEN period_total = 0 THEN 1
             ELSE 1 - period_bad / ((1 - target) * period_total) END) > 1e-9
             OR page_1h <> (burn_rate_1h > 14.4 AND burn_rate_5m > 14.4)'''),
      one('''SELECT count(*) FROM got JOIN expected USING (start_us, service_name, span_name, service_version, team)
             WHERE abs(p50_ns - d[floor(0.5 * (len(d) - 1))::INT + 1]) > 0.0101 * d[floor(0.5 * (len(d) - 1))::INT + 1]
                OR abs(p95_ns - d[floor(0.95 * (len(d) - 1))::INT + 1]) > 0.0101 * d[floor(0.95 * (len(d) - 1))::INT + 1]
                OR abs(p99_ns - d[floor(0.99 * (len(d) - 1))::INT + 1]) > 0.0101 * d[floor(0.99 * (len(d) - 1))::INT + 1]'''))
"#
    ));
    let [
        rows,
        keys,
        missing,
        extra,
        errors,
        tagged,
        slo_rows,
        slo_missing,
        slo_extra,
        slo_wrong,
        off,
    ] = support::numbers::<i64, _>(&out);
    eprintln!("otel_red_1m: {rows} rows, {errors} errors; otel_slo_status: {slo_rows} rows");
    assert!(
        rows > 0,
        "otel_red_1m is empty; log {}",
        dir.join("floe.log").display()
    );
    assert_eq!(
        rows, keys,
        "one row per (window, service, endpoint, version, team)"
    );
    assert_eq!(
        (missing, extra),
        (0, 0),
        "requests and errors per minute are DuckDB's over the landed spans"
    );
    assert!(
        errors > 0,
        "the generator's failed requests count as errors"
    );
    assert_eq!(tagged, rows, "every row carries the deploy and the team");
    assert!(
        slo_rows > 0,
        "otel_slo_status is empty; log {}",
        dir.join("floe.log").display()
    );
    assert_eq!(
        (slo_missing, slo_extra),
        (0, 0),
        "good, total and the window sums of every SLO minute are DuckDB's over the landed spans"
    );
    assert_eq!(
        slo_wrong, 0,
        "burn rates, budgets and pages follow their definitions"
    );
    assert_eq!(
        off, 0,
        "quantiles within the sketch's 1 % of the exact ones"
    );
    check_regressions(&spans, &location("otel_deploy_regressions").await);
    check_edges(&spans, &location("otel_service_edges").await);
    let anomalies = location("otel_anomalies").await;
    check_anomalies(&red, &location("otel_anomaly_scores").await, &anomalies);
    check_alerts(
        &location("otel_deploy_regressions").await,
        &anomalies,
        &location("otel_alerts").await,
    );
    // The alerts sink: every transition in the topic once, as the table has it.
    let [records, rows, extra, missing] = support::compare_mirrored(
        &brokers,
        &alerts_topic,
        &location("otel_alerts").await,
        "*",
        &dir,
    );
    assert!(rows > 0, "no alert transitions");
    assert_eq!(
        (records, extra, missing),
        (rows, 0, 0),
        "the alerts topic holds each transition of otel_alerts once"
    );
    // The Prometheus sinks: one sample per value of each row, and this run's own progress
    // marker at its table's newest snapshot (an earlier run may have sent the same samples).
    let (slo_rows, slo_samples, slo_wrong) = support::compare_prometheus(
        &prometheus,
        &location("otel_slo_status").await,
        "floe_slo",
        &["slo", "service_name"],
        &[
            "total",
            "good",
            "burn_rate_5m",
            "burn_rate_1h",
            "burn_rate_6h",
            "budget_remaining",
        ],
    );
    let (score_rows, score_samples, score_wrong) = support::compare_prometheus(
        &prometheus,
        &location("otel_anomaly_scores").await,
        "floe_anomaly",
        &["service_name", "measure"],
        &["observed", "expected", "score"],
    );
    let (uuid, newest) =
        support::newest_sequence(&client, "red", "otel_slo_status", "otlp-red").await;
    let progress = support::prometheus_progress(&prometheus, "otlp-red.slo_series", &uuid);
    eprintln!(
        "prometheus: {slo_samples} SLO samples of {slo_rows} rows, {score_samples} anomaly \
         samples of {score_rows} rows, progress marker at sequence {progress}"
    );
    assert!(slo_rows > 0 && score_rows > 0);
    assert_eq!(
        (slo_samples, score_samples, slo_wrong, score_wrong),
        (6 * slo_rows, 3 * score_rows, 0, 0),
        "every row of otel_slo_status and otel_anomaly_scores is one sample per value in Prometheus"
    );
    assert_eq!(
        progress, newest,
        "the progress marker names the SLO table's newest snapshot"
    );
    catalog.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `otel_deploy_regressions` against DuckDB over the landed spans: the one deploy, flagged by
/// both metrics at the end of its tenth minute, with the requests, error rates and p-value of
/// the compared minutes (the old version's 30 before the deploy and its own, the new one's 10).
fn check_regressions(spans: &str, regressions: &str) {
    let out = python(&format!(
        r#"import duckdb_offline, math
con = duckdb_offline.connect()
con.sql("""CREATE TABLE requests AS SELECT (epoch_us(ts) // 60000000) * 60000000 AS start_us,
    service_name, service_version,
    CASE WHEN status_code = 'ERROR' OR (span_kind = 'SERVER' AND coalesce(
      TRY_CAST(span_attributes['http.response.status_code'] AS INT),
      TRY_CAST(span_attributes['http.status_code'] AS INT), 0) >= 500) THEN 1 ELSE 0 END AS error
  FROM iceberg_scan('{spans}') WHERE (span_kind IN ('SERVER', 'CONSUMER') OR is_root) AND service_name = 'payments'""")
con.sql("CREATE TABLE got AS SELECT * FROM iceberg_scan('{regressions}')")
one = lambda q: con.sql(q).fetchone()
d = one("SELECT min(start_us) FROM requests WHERE service_version = '1.1.0'")[0]
last = d + 9 * 60000000
n_old, e_old = one(f"SELECT count(*), sum(error) FROM requests WHERE service_version = '1.0.0' AND start_us BETWEEN {{d}} - 30 * 60000000 AND {{last}}")
n_new, e_new = one(f"SELECT count(*), sum(error) FROM requests WHERE service_version = '1.1.0' AND start_us BETWEEN {{d}} AND {{last}}")
p_old, p_new = e_old / n_old, e_new / n_new
pooled = (e_old + e_new) / (n_old + n_new)
z = (p_new - p_old) / math.sqrt(pooled * (1 - pooled) * (1 / n_old + 1 / n_new))
p = 0.5 * math.erfc(z / math.sqrt(2))
rows = con.sql("SELECT metric, verdict, epoch_us(deployed_at), epoch_us(decided_at), old_version, new_version, old_requests, new_requests, old_value, new_value, p_value FROM got ORDER BY metric").fetchall()
assert [r[:2] for r in rows] == [('error_rate', 'regression'), ('latency_p99', 'regression')], rows
for r in rows:
    assert r[2:8] == (d, d + 10 * 60000000, '1.0.0', '1.1.0', n_old, n_new), (r, d, n_old, n_new)
err = rows[0]
assert abs(err[8] - p_old) < 1e-12 and abs(err[9] - p_new) < 1e-12, (err, p_old, p_new)
assert abs(err[10] - p) <= 1e-9 * max(p, 1e-300) + 1e-15, (err[10], p)
assert rows[1][9] / rows[1][8] >= 1.2, rows[1]
print(len(rows), n_old, n_new, e_old, e_new, p)
"#
    ));
    eprintln!("otel_deploy_regressions: (rows, old n, new n, old errors, new errors, p) = {out}");
}

/// `otel_anomaly_scores` against `otel_red_1m` (itself DuckDB's over the spans): each scored
/// (minute, service) has the rollup's requests summed over endpoints as its count and their
/// error share as its error rate; `otel_anomalies` holds exactly the scores at or above the
/// threshold (4, upwards).
fn check_anomalies(red: &str, scores: &str, anomalies: &str) {
    let out = python(&format!(
        r#"import duckdb_offline
con = duckdb_offline.connect()
con.sql("CREATE TABLE red AS SELECT window_start, service_name, sum(requests) AS n, sum(errors) / sum(requests) AS rate FROM iceberg_scan('{red}') GROUP BY ALL")
con.sql("CREATE TABLE scores AS SELECT * FROM iceberg_scan('{scores}')")
con.sql("CREATE TABLE flagged AS SELECT * FROM iceberg_scan('{anomalies}')")
one = lambda q: con.sql(q).fetchone()[0]
n = one("SELECT count(*) FROM scores WHERE measure = 'error_rate'")
assert n > 0, "no error-rate scores"
assert one("SELECT count(DISTINCT measure) FROM scores") == 2
wrong = one('''SELECT count(*) FROM scores s LEFT JOIN red r USING (window_start, service_name)
  WHERE s.measure = 'error_rate' AND (r.n IS NULL OR r.n <> s."values" OR abs(r.rate - s.observed) > 1e-12)''')
assert wrong == 0, con.sql("SELECT * FROM scores s LEFT JOIN red r USING (window_start, service_name) WHERE s.measure = 'error_rate' LIMIT 5").fetchall()
extra = one("SELECT count(*) FROM (SELECT * FROM flagged EXCEPT ALL SELECT * FROM scores WHERE score >= 4)")
missing = one("SELECT count(*) FROM (SELECT * FROM scores WHERE score >= 4 EXCEPT ALL SELECT * FROM flagged)")
assert (extra, missing) == (0, 0), (extra, missing)
print(n, one("SELECT count(*) FROM flagged"), con.sql("SELECT list(DISTINCT service_name || '/' || measure) FROM flagged").fetchone()[0])
"#
    ));
    eprintln!("otel_anomaly_scores: (error-rate scores, anomalies, flagged series) = {out}");
}

/// `otel_alerts` from the facts behind the one-partition exchange: the bad deploy's two
/// regression verdicts each raise a `deploy-regression` alert in the minute decided (`for =
/// "0m"`), one group led by the first; every `anomaly` alert fires in a minute its service
/// and measure were flagged, and names its own service among the root-cause candidates.
fn check_alerts(regressions: &str, anomalies: &str, alerts: &str) {
    let out = python(&format!(
        r#"import duckdb_offline
con = duckdb_offline.connect()
con.sql("CREATE TABLE verdicts AS SELECT 'service_name=' || service_name || ',new_version=' || new_version || ',metric=' || metric AS key, epoch_us(decided_at) // 60000000 AS m FROM iceberg_scan('{regressions}') WHERE verdict = 'regression'")
con.sql("CREATE TABLE flagged AS SELECT 'service_name=' || service_name || ',measure=' || measure AS key, epoch_us(window_start) // 60000000 AS m FROM iceberg_scan('{anomalies}')")
con.sql("CREATE TABLE got AS SELECT *, epoch_us(window_start) // 60000000 AS m FROM iceberg_scan('{alerts}')")
one = lambda q: con.sql(q).fetchone()[0]
deploys = con.sql("SELECT key, m, suppressed FROM got WHERE rule = 'deploy-regression' AND state = 'firing' ORDER BY key").fetchall()
expected = con.sql("SELECT key, m FROM verdicts ORDER BY key").fetchall()
assert [(k, m) for k, m, _ in deploys] == expected, (deploys, expected)
assert [s for _, _, s in deploys] == [False, True], deploys
unfounded = one("SELECT count(*) FROM got g WHERE rule = 'anomaly' AND state = 'firing' AND NOT EXISTS (SELECT 1 FROM flagged f WHERE f.key = g.key AND f.m = g.m)")
unnamed = one("SELECT count(*) FROM got WHERE rule = 'anomaly' AND state = 'firing' AND NOT list_contains(root_causes, service_name) AND len(root_causes) > 0")
assert (unfounded, unnamed) == (0, 0), (unfounded, unnamed)
print(one("SELECT count(*) FROM got"), len(deploys), one("SELECT count(*) FROM got WHERE rule = 'anomaly' AND state = 'firing'"))
"#
    ));
    eprintln!("otel_alerts: (transitions, deploy alerts, anomaly alerts) = {out}");
}

/// `otel_service_edges` against DuckDB's join of every span with its parent in another
/// service, per minute of the child, for the minutes the final clock fired: partial rows
/// (one per exchange partition) summed, counts and errors exact, the p99 of the merged
/// sketches (crates/floe-sketch/SQL.md) within 1 % of the exact one.
fn check_edges(spans: &str, edges: &str) {
    let out = python(&format!(
        r#"import duckdb_offline
con = duckdb_offline.connect()
con.sql("CREATE TABLE spans AS SELECT * FROM iceberg_scan('{spans}')")
con.sql("CREATE TABLE parts AS SELECT epoch_us(window_start) AS start_us, caller_service, callee_service, source_partition, requests, errors, p99_ns_sketch FROM iceberg_scan('{edges}')")
clock = con.sql("SELECT min(m) FROM (SELECT max(epoch_us(ts)) AS m FROM spans GROUP BY kafka_partition)").fetchone()[0]
con.sql(f'''CREATE TABLE expected AS SELECT (epoch_us(c.ts) // 60000000) * 60000000 AS start_us,
    p.service_name AS caller_service, c.service_name AS callee_service, count(*) AS requests,
    sum(CASE WHEN c.status_code = 'ERROR' OR (c.span_kind = 'SERVER' AND coalesce(
      TRY_CAST(c.span_attributes['http.response.status_code'] AS INT),
      TRY_CAST(c.span_attributes['http.status_code'] AS INT), 0) >= 500) THEN 1 ELSE 0 END) AS errors,
    list_sort(list(c.duration_ns)) AS d
  FROM spans c JOIN spans p ON c.trace_id = p.trace_id AND c.parent_span_id = p.span_id
  WHERE c.service_name <> p.service_name
  GROUP BY 1, 2, 3 HAVING start_us + 60000000 <= {{clock}} - 5000000''')
con.sql("CREATE TABLE got AS SELECT start_us, caller_service, callee_service, sum(requests) AS requests, sum(errors) AS errors, count(*) AS parts FROM parts GROUP BY ALL")
con.sql('''CREATE TABLE merged AS
  WITH buckets AS (SELECT start_us, caller_service, callee_service, e.k AS k, sum(e.n) AS n
      FROM (SELECT start_us, caller_service, callee_service, unnest(p99_ns_sketch) AS e FROM parts) GROUP BY ALL),
    cum AS (SELECT start_us, caller_service, callee_service,
      sign(k) * 2 * power(1.02020202020202e0, abs(k) - 1048576) / (1.02020202020202e0 + 1) AS v,
      sum(n) OVER (PARTITION BY start_us, caller_service, callee_service ORDER BY k ROWS UNBOUNDED PRECEDING) AS cum,
      sum(n) OVER (PARTITION BY start_us, caller_service, callee_service) AS total FROM buckets)
  SELECT start_us, caller_service, callee_service, min(v) FILTER (WHERE cum > 0.99e0 * CAST(total - 1 AS DOUBLE)) AS p99
  FROM cum GROUP BY ALL''')
one = lambda q: con.sql(q).fetchone()[0]
keys = "start_us, caller_service, callee_service, requests, errors"
print(one("SELECT count(*) FROM got"), one("SELECT max(parts) FROM got"),
      one(f"SELECT count(*) FROM (SELECT {{keys}} FROM expected EXCEPT ALL SELECT {{keys}} FROM got)"),
      one(f"SELECT count(*) FROM (SELECT {{keys}} FROM got EXCEPT ALL SELECT {{keys}} FROM expected)"),
      one("SELECT count(DISTINCT (caller_service, callee_service)) FROM got"),
      one('''SELECT count(*) FROM merged JOIN expected USING (start_us, caller_service, callee_service)
             WHERE abs(p99 - d[floor(0.99 * (len(d) - 1))::INT + 1]) > 0.0101 * d[floor(0.99 * (len(d) - 1))::INT + 1]'''))
"#
    ));
    let [rows, parts, missing, extra, pairs, off] = support::numbers::<i64, _>(&out);
    eprintln!(
        "otel_service_edges: {rows} (minute, caller, callee) rows of up to {parts} partial rows, \
         {pairs} caller → callee pairs"
    );
    assert!(rows > 0, "otel_service_edges is empty");
    assert!(
        pairs >= 3,
        "the generator's call chain has at least three edges"
    );
    assert_eq!(
        (missing, extra),
        (0, 0),
        "edges per minute are DuckDB's join of spans with their parents"
    );
    assert_eq!(
        off, 0,
        "merged p99 within the sketch's 1 % of the exact one"
    );
}
