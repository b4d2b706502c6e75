//! Detection quality of the alerts (issue 27): the quickstart's pipeline (`jobs/quickstart.toml`:
//! SLOs, deploy regressions, anomalies, the service map and alerts) on the generator with
//! incidents at known event times, for five seeds, and on incident-free traffic.
//!
//! Each run is 90 minutes of event time from a fixed start (the same rows in every run):
//! `inventory`'s connection pool filling up from 5 minutes in (full at 40, 90 % at 34.6), a
//! bad `payments` deploy at 35 minutes, `inventory` failing 100 × as often at 45 minutes
//! for 8 (its errors propagate up the call graph), `checkout`'s `PlaceOrder` 3 × slower at
//! 65 minutes for 8. Per seed and incident: the event-time delay from its start to the end of
//! the minute its first alert fired in (for the pool, also the lead: how long before the
//! usage crossed 90 % the alert fired), and for the failing dependency the rank of
//! `inventory` among the root-cause candidates of the first alert raised on a service that
//! calls it (or on itself when none of its callers alerted). False alerts: alerts firing
//! outside every incident's window (plus the keep-firing time) after the 30-minute warm-up,
//! per service-hour; an alert on a caller of `payments` after its deploy that names payments
//! first belongs to the deploy. The first seed runs twice: the same alerts, every transition. The seven runs
//! share the machine at once.
//!
//! Needs only the floe binary and a catalog in this process.

mod support;

use std::path::Path;
use tokio::process::Command;

use arrow_array::cast::AsArray;
use arrow_array::types::TimestampMicrosecondType;
use arrow_array::{Array, RecordBatch};
use futures::TryStreamExt;

/// 2026-01-01T00:00:00Z in minutes since the epoch: the runs' start.
const START_MINUTE: i64 = 29_453_760;
const SEEDS: [u64; 5] = [1, 2, 3, 4, 5];
const SERVICES: usize = 5;
/// Minutes after the start: the pool filling up, the deploy, the failing dependency, the
/// slow endpoint.
const SATURATION: (i64, i64) = (5, 35);
const DEPLOY: i64 = 35;
const FAILING: (i64, i64) = (45, 8);
const SLOW: (i64, i64) = (65, 8);
/// The anomalies' warm-up, and the run's length.
const WARMUP: i64 = 30;
const MINUTES: i64 = 90;
/// Longest keep-firing time of the quickstart's rules that can fire late in a window.
const KEEP: i64 = 5;

/// One alert transition: (minute after the start, rule, service, state, root causes, summary
/// — with its value, context and suppression).
type Alert = (i64, String, String, String, Vec<String>, String);

/// The quickstart's job with `seed`, a fixed start, and `incidents` (none: clean traffic).
fn job(dir: &Path, seed: u64, incidents: bool, uri: &str, namespace: &str) -> std::path::PathBuf {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../jobs/quickstart.toml");
    let text = std::fs::read_to_string(shipped).unwrap();
    let (head, rest) = text.split_once("[source.generator]").unwrap();
    let (_, rest) = rest.split_once("\n[catalog]").unwrap();
    let (_, rest) = rest.split_once("\n[checkpoint]").unwrap();
    let mut generator = format!(
        "[source.generator]\nrequests_per_second = 1000\nduration = \"45s\"\nspeed = 120\n\
         seed = {seed}\nstart = 2026-01-01T00:00:00Z\n"
    );
    if incidents {
        generator.push_str(&format!(
            "deploy = {{ service = \"payments\", version = \"1.1.0\", at = \"{DEPLOY}m\", \
             error_factor = 4, latency_factor = 1.5 }}\nincidents = [\n  \
             {{ service = \"inventory\", kind = \"saturation\", at = \"{}m\", for = \"{}m\" }},\n  \
             {{ service = \"inventory\", kind = \"errors\", at = \"{}m\", for = \"{}m\", factor = 100 }},\n  \
             {{ service = \"checkout\", kind = \"slow\", endpoint = \"PlaceOrder\", at = \"{}m\", for = \"{}m\", factor = 3 }},\n]\n",
            SATURATION.0, SATURATION.1, FAILING.0, FAILING.1, SLOW.0, SLOW.1
        ));
    }
    let text = format!(
        "{head}{generator}\n[catalog]\nuri = \"{uri}\"\nnamespace = \"{namespace}\"\n\n[checkpoint]{}",
        rest.replacen(
            "state_dir = \"${FLOE_QUICKSTART_DIR:-floe-quickstart}/state\"",
            &format!(
                "state_dir = \"{}\"",
                dir.join(namespace).join("state").display()
            ),
            1
        )
    );
    let path = dir.join(format!("{namespace}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

async fn alerts(client: &floe_lake::rest::CatalogClient, namespace: &str) -> Vec<Alert> {
    let ident = iceberg::TableIdent::from_strs([namespace, "otel_alerts"]).unwrap();
    let Ok(table) = client.load_table(&ident).await else {
        return Vec::new();
    };
    let batches: Vec<RecordBatch> =
        floe_lake::read::read_live(&table, floe_lake::read::ReadRequest::current())
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
    let mut out = Vec::new();
    for b in &batches {
        let text = |n: &str| b.column_by_name(n).unwrap().as_string::<i32>().clone();
        let (rules, services, states) = (text("rule"), text("service_name"), text("state"));
        let summaries = text("summary");
        let starts = b
            .column_by_name("window_start")
            .unwrap()
            .as_primitive::<TimestampMicrosecondType>();
        let causes = b.column_by_name("root_causes").unwrap().as_list::<i32>();
        for r in 0..b.num_rows() {
            let list = causes.value(r);
            let list = list.as_string::<i32>();
            out.push((
                starts.value(r) / 60_000_000 - START_MINUTE,
                rules.value(r).to_string(),
                services.value(r).to_string(),
                states.value(r).to_string(),
                (0..list.len()).map(|i| list.value(i).to_string()).collect(),
                summaries.value(r).to_string(),
            ));
        }
    }
    out.sort();
    out
}

/// Runs the job of `seed` (with or without incidents) to its end; its alerts.
async fn run(
    dir: &Path,
    uri: &str,
    client: &floe_lake::rest::CatalogClient,
    seed: u64,
    incidents: bool,
    tag: &str,
) -> Vec<Alert> {
    let namespace = format!("d{seed}{}{tag}", if incidents { "i" } else { "c" });
    let job = job(dir, seed, incidents, uri, &namespace);
    let log = dir.join(format!("{namespace}.log"));
    let status = Command::new(env!("CARGO_BIN_EXE_floe"))
        .args(["run", job.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::options().append(true).open(&log).unwrap())
        .status()
        .await
        .unwrap();
    assert!(
        status.success(),
        "floe run {}: see {}",
        job.display(),
        log.display()
    );
    alerts(client, &namespace).await
}

/// Whether a firing alert at `minute` on `service`, with root-cause candidates `causes`,
/// belongs to an injected incident.
fn explained(minute: i64, rule: &str, service: &str, causes: &[String]) -> bool {
    let within = |(at, lasts): (i64, i64)| minute >= at && minute <= at + lasts + KEEP;
    match rule {
        "deploy-regression" => service == "payments" && minute >= DEPLOY,
        "saturation" => service == "inventory" && within(SATURATION),
        // The bad deploy makes payments slower and fail more from its first minute, and its
        // errors reach its callers — an alert there that names payments first is the deploy's.
        _ if service == "payments" && within((DEPLOY, 10)) => true,
        _ if within((DEPLOY, 10))
            && ["checkout", "frontend"].contains(&service)
            && causes.first().is_some_and(|c| c == "payments") =>
        {
            true
        }
        _ => {
            within(FAILING) && ["inventory", "payments", "checkout", "frontend"].contains(&service)
                || within(SLOW) && ["checkout", "frontend"].contains(&service)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_incidents_raise_their_alerts_and_clean_traffic_almost_none() {
    let dir = support::temp_dir("detection");
    let (catalog, client) = support::start_catalog(&dir).await;
    let uri = catalog.uri();
    let firing = |alerts: &[Alert]| -> Vec<Alert> {
        alerts.iter().filter(|a| a.3 == "firing").cloned().collect()
    };
    let mut table = vec![
        "| seed | pool filling delay (lead) | deploy delay | failing dependency delay | its rank | slow endpoint delay | false alerts |".to_string(),
        "|---|---|---|---|---|---|---|".to_string(),
    ];
    let (mut detected, mut first, mut false_alerts) = ([0; 4], 0, 0);
    // The runs are paced by the wall clock, not the CPU: all at once. Each run's rows are a
    // function of its seed, however the runs share the cores.
    let runs = SEEDS
        .iter()
        .map(|&seed| (seed, true, ""))
        .chain([(SEEDS[0], true, "again"), (1, false, "")]);
    let mut results = futures::future::join_all(
        runs.map(|(seed, incidents, tag)| run(&dir, &uri, &client, seed, incidents, tag)),
    )
    .await;
    let clean = firing(&results.pop().unwrap());
    let again = results.pop().unwrap();
    let first_seed = results[0].clone();
    for (seed, all) in SEEDS.into_iter().zip(results) {
        let fired = firing(&all);
        // From the incident's start to the end of the minute its first alert fired in.
        let delay = |from: i64, hit: &dyn Fn(&Alert) -> bool| {
            fired
                .iter()
                .filter(|a| a.0 >= from && hit(a))
                .map(|a| a.0 + 1 - from)
                .min()
        };
        let pool = delay(SATURATION.0, &|a| a.1 == "saturation" && a.2 == "inventory");
        let deploy = delay(DEPLOY, &|a| a.1 == "deploy-regression" && a.2 == "payments");
        let failing = delay(FAILING.0, &|a| {
            a.0 <= FAILING.0 + FAILING.1 && a.4.first().is_some_and(|c| c == "inventory")
                || a.2 == "inventory"
        });
        let slow = delay(SLOW.0, &|a| {
            a.0 <= SLOW.0 + SLOW.1 && a.2 == "checkout" && a.1 != "deploy-regression"
        });
        let during = |a: &&Alert| a.0 >= FAILING.0 && a.0 <= FAILING.0 + FAILING.1;
        let callers = fired
            .iter()
            .filter(during)
            .find(|a| a.2 != "inventory" && a.1 == "anomaly");
        let own = fired.iter().filter(during).find(|a| a.2 == "inventory");
        let ranked = callers.or(own);
        let rank = ranked
            .and_then(|a| a.4.iter().position(|c| c == "inventory"))
            .map(|r| r + 1);
        let unexplained: Vec<&Alert> = fired
            .iter()
            .filter(|a| a.0 >= WARMUP && !explained(a.0, &a.1, &a.2, &a.4))
            .collect();
        eprintln!("seed {seed}: alerts outside the incidents: {unexplained:?}");
        let unexplained = unexplained.len();
        for (i, d) in [pool, deploy, failing, slow].iter().enumerate() {
            detected[i] += usize::from(d.is_some());
        }
        first += usize::from(rank == Some(1));
        false_alerts += unexplained;
        let show = |d: Option<i64>| d.map_or("missed".to_string(), |d| format!("{d} min"));
        // The usage crosses 90 % at 0.55 / 0.65 of the way up.
        let crossing = SATURATION.0 as f64 + SATURATION.1 as f64 * 0.55 / 0.65;
        table.push(format!(
            "| {seed} | {} | {} | {} | {} | {} | {unexplained} |",
            pool.map_or("missed".to_string(), |d| format!(
                "{d} min ({:.0} min before 90 %)",
                crossing - (SATURATION.0 + d) as f64
            )),
            show(deploy),
            show(failing),
            match (rank, ranked) {
                (Some(r), Some(a)) => format!("{r} (in {}'s alert)", a.2),
                _ => "-".to_string(),
            },
            show(slow)
        ));
    }
    // Determinism: the first seed again raises the same transitions, every one.
    assert!(!first_seed.is_empty());
    assert_eq!(again, first_seed, "seed {} run twice", SEEDS[0]);
    let clean_false = clean.iter().filter(|a| a.0 >= WARMUP).count();
    let service_hours = SERVICES as f64 * (MINUTES - WARMUP) as f64 / 60.0;
    table.push(format!(
        "| clean, seed 1 | - | - | - | - | - | {clean_false} ({:.2} per service-hour) |",
        clean_false as f64 / service_hours
    ));
    eprintln!("{}", table.join("\n"));
    assert_eq!(
        detected,
        [SEEDS.len(); 4],
        "every injected incident raises an alert in every seed:\n{}",
        table.join("\n")
    );
    assert!(
        false_alerts as f64 <= service_hours * SEEDS.len() as f64,
        "at most one alert per service-hour outside the incidents:\n{}",
        table.join("\n")
    );
    assert!(
        first >= 4,
        "the failing dependency is the first root-cause candidate in at least 4 of 5 seeds:\n{}",
        table.join("\n")
    );
    assert!(
        clean_false as f64 <= service_hours,
        "at most one false alert per service-hour on clean traffic:\n{}",
        table.join("\n")
    );
    eprintln!(
        "slow endpoint detected in {} of {}; {false_alerts} alerts outside the incidents",
        detected[3],
        SEEDS.len()
    );
    catalog.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
