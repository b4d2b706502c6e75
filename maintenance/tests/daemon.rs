//! The `floe-maintenance` daemon as users run it — two of them on one catalog, schedules every
//! few seconds, a writer committing all along: tasks run on their schedule, no fire runs
//! twice, the table loses and duplicates nothing, `/metrics` counts the runs, and SIGTERM
//! stops both cleanly with their leases given back.

#[path = "../../crates/floe-lake/tests/support/mod.rs"]
mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use floe_lake::snapshot::Delta;
use floe_maintenance::state::StateTable;
use support::common::{Harness, backends, free_port};
use support::{check, create_table, live_files, scan};

fn start_daemon(config: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_floe-maintenance"))
        .args(["--config", config.to_str().unwrap()])
        .env("RUST_LOG", "floe_maintenance=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("floe-maintenance starts")
}

/// The value of one sample of `/metrics` (0 when absent).
async fn metric(port: u16, sample: &str) -> f64 {
    let body = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
        .unwrap_or(0.0)
}

fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits for `child` to exit within `limit`; returns its exit code and stderr.
fn wait_exit(mut child: Child, limit: Duration) -> (i32, String) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child.stderr.take().unwrap().read_to_string(&mut err).ok();
            return (status.code().unwrap_or(-1), err);
        }
        if start.elapsed() > limit {
            child.kill().ok();
            panic!("the daemon did not stop within {limit:?} of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_share_the_schedules_while_a_writer_commits_and_stop_on_sigterm() {
    let h = Harness::start(&backends()[0]).await;
    let client = support::client(&h, &h.catalog.uri()).await;
    let (ident, _) = create_table(&client, "ops", "events").await;
    support::append_in_commits(&client, &ident, 0, 10, 2).await;

    let dir = std::env::temp_dir().join(format!("floe-daemon-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let ports = [free_port(), free_port()];
    let configs: Vec<_> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            let path = dir.join(format!("maintenance-{i}.toml"));
            std::fs::write(
                &path,
                format!(
                    "version = 1\n\
                     [daemon]\nconcurrency = 2\nmetrics_listen = \"127.0.0.1:{port}\"\n\
                     discover_every = \"1s\"\nlease_ttl = \"6s\"\nshutdown_grace = \"10s\"\n\
                     [catalog]\nuri = \"{}\"\n\
                     [[policy]]\ntables = \"ops.*\"\n\
                     [policy.compact]\nschedule = \"*/2 * * * * *\"\nmin_input_files = 3\n\
                     [policy.expire]\nschedule = \"*/3 * * * * *\"\nolder_than = \"1h\"\nretain_last = 5\n",
                    h.catalog.uri()
                ),
            )
            .unwrap();
            path
        })
        .collect();
    let daemons: Vec<Child> = configs.iter().map(|c| start_daemon(c)).collect();

    // The writer: a small commit every second for 12 s.
    let started = Instant::now();
    let mut next = 10i64;
    while started.elapsed() < Duration::from_secs(12) {
        let table = client.load_table(&ident).await.unwrap();
        let delta = Delta {
            data_files: support::write_data(&table, &[next * 2, next * 2 + 1], 1.0).await,
            ..Delta::default()
        };
        // Retries on the daemons' commits as a job does.
        support::commit_as_writer(&client, &ident, next as u64, delta).await;
        next += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let window = started.elapsed().as_secs_f64();

    // Runs and skipped fires (a fire that came while the same task still ran), per task,
    // summed over both daemons.
    let (mut runs, mut skipped) = ([0.0; 2], [0.0; 2]);
    for port in ports {
        for (i, task) in ["compact", "expire"].into_iter().enumerate() {
            runs[i] += metric(
                port,
                &format!("floe_maintenance_runs_total{{outcome=\"ok\",task=\"{task}\"}}"),
            )
            .await;
            skipped[i] += metric(
                port,
                &format!("floe_maintenance_runs_total{{outcome=\"skipped\",task=\"{task}\"}}"),
            )
            .await;
        }
        assert_eq!(metric(port, "floe_maintenance_tables").await, 1.0);
        // The probes a deployment uses: alive, and ready (it schedules).
        for (path, body) in [("/healthz", "ok\n"), ("/readyz", "ready\n")] {
            let response = reqwest::get(format!("http://127.0.0.1:{port}{path}"))
                .await
                .unwrap();
            assert_eq!(response.status().as_u16(), 200, "{path}");
            assert_eq!(response.text().await.unwrap(), body, "{path}");
        }
    }
    let stop = Instant::now();
    for d in &daemons {
        sigterm(d);
    }
    let mut logs = String::new();
    for d in daemons {
        let (code, err) = wait_exit(d, Duration::from_secs(15));
        assert_eq!(code, 0, "{err}");
        assert!(err.contains("maintenance daemon stopped"), "{err}");
        logs.push_str(&err);
    }
    assert!(stop.elapsed() < Duration::from_secs(12), "{logs}");
    // No fire runs twice, though both daemons schedule it; fires run on time unless the
    // table is busy with another task (then they are caught up once): 2 s and 3 s schedules
    // over the window.
    for (i, (every, at_least)) in [(2.0, 3.0), (3.0, 2.0)].into_iter().enumerate() {
        let fires = window / every;
        assert!(
            runs[i] <= fires + 1.0 && runs[i] >= at_least && runs[i] + skipped[i] <= fires + 2.0,
            "task {i}: {} runs and {} skipped fires in {window:.1} s of a {every} s schedule\n{logs}",
            runs[i],
            skipped[i]
        );
    }

    // Leases given back; the last runs recorded.
    let state = StateTable::open(
        client.clone(),
        iceberg::TableIdent::from_strs(["floe_maintenance", "state"]).unwrap(),
        "test".into(),
        Duration::from_secs(1),
    )
    .await
    .unwrap()
    .read()
    .await
    .unwrap();
    assert!(state.leases.is_empty(), "{:?}", state.leases);
    let last_compact = state.last_runs[&("ops.events".to_string(), "compact".to_string())];
    assert!(
        floe_maintenance::state::now_ms() - last_compact < 6_000,
        "the last compaction started {} ms ago",
        floe_maintenance::state::now_ms() - last_compact
    );

    // The table: every row written, once; fewer files than commits.
    let table = client.load_table(&ident).await.unwrap();
    let expected: Vec<(i64, f64)> = (0..next * 2).map(|id| (id, 1.0)).collect();
    check(&table, false, &expected, "after the daemons").await;
    assert_eq!(scan(&table).await.len() as i64, next * 2);
    let files = live_files(&table).await.0.len() as i64;
    assert!(files < next, "{files} data files after {next} commits");
    std::fs::remove_dir_all(&dir).ok();
    h.catalog.stop().await.unwrap();
}
