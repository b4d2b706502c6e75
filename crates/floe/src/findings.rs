//! What `floe quickstart` found: each SLO's newest status, every deploy judged, every
//! saturation forecast and every alert transition, read back from the tables the run wrote
//! (`otel_slo_status`, `otel_deploy_regressions`, `otel_forecasts`, `otel_alerts`) through a
//! catalog of its own, as any reader would.

use std::collections::BTreeMap;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, RecordBatch};
use floe_lake::read::{ReadRequest, read_live};
use floe_lake::rest::CatalogClient;
use floe_runtime::JobConfig;
use futures::TryStreamExt;

/// Prints the findings of the quickstart job `config` ran.
pub(crate) async fn print(config: &JobConfig) -> anyhow::Result<()> {
    let (embedded, client) = crate::catalog(config).await?;
    let namespace = &config.catalog.namespace;
    let result = async {
        let status = rows(&client, namespace, "otel_slo_status").await?;
        let deploys = rows(&client, namespace, "otel_deploy_regressions").await?;
        let forecasts = rows(&client, namespace, "otel_forecasts").await?;
        let alerts = rows(&client, namespace, "otel_alerts").await?;
        print_status(&status);
        print_deploys(&deploys);
        print_forecasts(&forecasts);
        print_alerts(&alerts);
        anyhow::Ok(())
    }
    .await;
    if let Some(running) = embedded {
        running.stop().await?;
    }
    result
}

/// Every live row of `namespace.table` (none if it does not exist yet).
async fn rows(
    client: &CatalogClient,
    namespace: &str,
    table: &str,
) -> anyhow::Result<Vec<RecordBatch>> {
    let ident = iceberg::TableIdent::from_strs([namespace, table])?;
    let Ok(table) = client.load_table(&ident).await else {
        return Ok(Vec::new());
    };
    Ok(read_live(&table, ReadRequest::current())
        .await?
        .try_collect()
        .await?)
}

fn text(b: &RecordBatch, column: &str, row: usize) -> String {
    b.column_by_name(column)
        .map(|c| c.as_string::<i32>().value(row).to_string())
        .unwrap_or_default()
}

fn float(b: &RecordBatch, column: &str, row: usize) -> Option<f64> {
    let c = b.column_by_name(column)?.as_primitive::<Float64Type>();
    (!c.is_null(row)).then(|| c.value(row))
}

fn micros(b: &RecordBatch, column: &str, row: usize) -> i64 {
    b.column_by_name(column)
        .map(|c| c.as_primitive::<TimestampMicrosecondType>().value(row))
        .unwrap_or_default()
}

fn clock(us: i64) -> String {
    let secs = us.div_euclid(1_000_000).rem_euclid(86_400);
    format!("{:02}:{:02} UTC", secs / 3600, secs / 60 % 60)
}

/// Each objective's newest minute.
fn print_status(batches: &[RecordBatch]) {
    let mut newest: BTreeMap<String, (i64, &RecordBatch, usize)> = BTreeMap::new();
    for b in batches {
        for r in 0..b.num_rows() {
            let end = micros(b, "window_end", r);
            let slo = text(b, "slo", r);
            if newest.get(&slo).is_none_or(|(e, ..)| end > *e) {
                newest.insert(slo, (end, b, r));
            }
        }
    }
    if newest.is_empty() {
        println!("\nSLOs: no minute evaluated yet (a minute is final 30 s after it ends).");
        return;
    }
    println!("\nSLOs, at their newest minute (otel_slo_status):\n");
    for (slo, (end, b, r)) in &newest {
        let alerts: Vec<&str> = ["page_1h", "page_6h", "ticket_3d"]
            .into_iter()
            .filter(|a| {
                b.column_by_name(a)
                    .is_some_and(|c| c.as_boolean().value(*r))
            })
            .collect();
        let total = b
            .column_by_name("period_total")
            .map_or(0, |c| c.as_primitive::<Int64Type>().value(*r));
        println!(
            "  {slo:<24} {} · target {:.1} % · {total} requests · budget left {:.1} % · burn rate 1h {:.2}× · alerts: {}",
            clock(*end),
            float(b, "target", *r).unwrap_or_default() * 100.0,
            float(b, "budget_remaining", *r).unwrap_or_default() * 100.0,
            float(b, "burn_rate_1h", *r).unwrap_or_default(),
            if alerts.is_empty() {
                "none".to_string()
            } else {
                alerts.join(", ")
            }
        );
    }
}

/// Every deploy decided, a line per metric.
fn print_deploys(batches: &[RecordBatch]) {
    let mut lines = Vec::new();
    for b in batches {
        for r in 0..b.num_rows() {
            let metric = text(b, "metric", r);
            let (old, new) = (float(b, "old_value", r), float(b, "new_value", r));
            let value = |v: Option<f64>| match (metric.as_str(), v) {
                (_, None) => "-".to_string(),
                ("error_rate", Some(v)) => format!("{:.2} %", v * 100.0),
                (_, Some(v)) => format!("{:.1} ms", v / 1e6),
            };
            let test = match float(b, "p_value", r) {
                Some(p) => format!("p = {p:.1e}"),
                None => format!("×{:.2}", float(b, "effect", r).unwrap_or(f64::NAN)),
            };
            lines.push((
                micros(b, "decided_at", r),
                format!(
                    "  {} {} → {} (deployed {}, decided {}): {metric} {} → {} ({test}): {}",
                    text(b, "service_name", r),
                    text(b, "old_version", r),
                    text(b, "new_version", r),
                    clock(micros(b, "deployed_at", r)),
                    clock(micros(b, "decided_at", r)),
                    value(old),
                    value(new),
                    text(b, "verdict", r).to_uppercase()
                ),
            ));
        }
    }
    if lines.is_empty() {
        println!(
            "\nDeploys: none decided yet (a deploy is judged 10 minutes of event time after it; \
             the default --duration 30s makes an hour)."
        );
        return;
    }
    lines.sort();
    println!("\nDeploys judged (otel_deploy_regressions):\n");
    for (_, line) in lines {
        println!("{line}");
    }
}

/// A series' first minute within the horizon (and its line), and its first at the threshold.
type Forecast = ((i64, String), Option<i64>);

/// Per series, the first minute its forecast came within the horizon, and when it crossed.
fn print_forecasts(batches: &[RecordBatch]) {
    let mut series: BTreeMap<(String, String), Forecast> = BTreeMap::new();
    for b in batches {
        for r in 0..b.num_rows() {
            let end = micros(b, "window_end", r);
            let key = (text(b, "service_name", r), text(b, "measure", r));
            let threshold = float(b, "threshold", r).unwrap_or(f64::NAN);
            let observed = float(b, "observed", r).unwrap_or(f64::NAN);
            let minutes_left = float(b, "minutes_left", r).unwrap_or(0.0);
            let line = format!(
                "{} at {observed:.2}, rising {:.3}/min: {:.0} % forecast for {} ({:.0} min ahead)",
                clock(end),
                float(b, "trend_per_minute", r).unwrap_or(f64::NAN),
                threshold * 100.0,
                clock(end + (minutes_left * 60e6) as i64),
                minutes_left,
            );
            let entry = series.entry(key).or_insert(((end, line.clone()), None));
            if end < entry.0.0 {
                entry.0 = (end, line);
            }
            if observed >= threshold && entry.1.is_none_or(|c| end < c) {
                entry.1 = Some(end);
            }
        }
    }
    if series.is_empty() {
        return;
    }
    println!(
        "
Saturation forecasts (otel_forecasts), first within the horizon:
"
    );
    for ((service, measure), ((_, line), crossed)) in &series {
        let crossed = crossed.map_or(String::new(), |c| format!("; crossed at {}", clock(c)));
        println!("  {service} {measure}: {line}{crossed}");
    }
}

/// Every alert transition, in event time, with its root-cause ranking.
fn print_alerts(batches: &[RecordBatch]) {
    // Per minute, the alerts that lead their group first.
    let mut lines: Vec<((i64, bool, String), String)> = Vec::new();
    for b in batches {
        let suppressed = b
            .column_by_name("suppressed")
            .map(|c| c.as_boolean().clone());
        for r in 0..b.num_rows() {
            let at = micros(b, "window_start", r);
            let state = text(b, "state", r).to_uppercase();
            let line = format!("  {}  {state:<8}  {}", clock(at), text(b, "summary", r));
            let follows = suppressed.as_ref().is_some_and(|s| s.value(r));
            lines.push(((at, follows, text(b, "alert_id", r)), line));
        }
    }
    if lines.is_empty() {
        return;
    }
    lines.sort();
    println!("\nAlerts (otel_alerts):\n");
    for (_, line) in lines {
        println!("{line}");
    }
}
