//! `floe-maintenance plan` and `run-once`, as a user runs them against a real floe-catalog:
//! plan changes nothing, run-once compacts, merges manifests, expires and sweeps orphans, and a
//! bad config file is refused with file:line:col and exit code 2.

#[path = "../../crates/floe-lake/tests/support/mod.rs"]
mod support;

use std::process::Command;

use support::common::{Harness, backends};
use support::{check, create_table, live_files, scan};

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_floe-maintenance"))
        .args(args)
        .output()
        .expect("floe-maintenance runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `floe-maintenance VERB --config CONFIG --table ops.events --task TASK`.
fn task(verb: &str, config: &str, task: &str) -> (i32, String, String) {
    run(&[
        verb,
        "--config",
        config,
        "--table",
        "ops.events",
        "--task",
        task,
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_and_run_once_as_a_user_would() {
    let h = Harness::start(&backends()[0]).await;
    let client = support::client(&h, &h.catalog.uri()).await;
    let (ident, _) = create_table(&client, "ops", "events").await;
    support::append_in_commits(&client, &ident, 0, 12, 2).await;
    let before = client.load_table(&ident).await.unwrap();
    let rows = scan(&before).await;
    let files_before = live_files(&before).await.0.len();

    let dir = std::env::temp_dir().join(format!("floe-maint-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("maintenance.toml");
    std::fs::write(
        &config,
        format!(
            "version = 1\n[catalog]\nuri = \"{}\"\n\n[[policy]]\ntables = \"ops.*\"\n\
             [policy.compact]\nschedule = \"0 * * * * *\"\nmin_input_files = 3\n\
             [policy.manifests]\nschedule = \"0 * * * * *\"\nmin_manifests = 4\n\
             [policy.expire]\nschedule = \"0 * * * * *\"\nolder_than = \"1h\"\nretain_last = 1\n",
            h.catalog.uri()
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();

    let (code, out, err) = task("plan", config, "compact");
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("would rewrite {files_before} data files")),
        "{out}"
    );
    let unchanged = client.load_table(&ident).await.unwrap();
    assert_eq!(
        unchanged.metadata.current_snapshot_id(),
        before.metadata.current_snapshot_id()
    );

    let (code, out, err) = task("run-once", config, "manifests");
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("manifests ops.events: 12 -> 1 manifests"),
        "{out}"
    );

    let (code, out, err) = task("run-once", config, "compact");
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("rewrote {files_before} data files")),
        "{out}"
    );
    let after = client.load_table(&ident).await.unwrap();
    assert!(live_files(&after).await.0.len() < files_before);
    check(&after, false, &rows, "after run-once compact").await;

    // Everything is younger than an hour: nothing expires, no orphan is old enough.
    let (code, out, _) = task("run-once", config, "expire");
    assert_eq!(code, 0);
    assert!(out.contains("expired 0 snapshots"), "{out}");
    let (code, out, _) = task("plan", config, "orphans");
    assert_eq!(code, 0);
    assert!(out.contains("would remove 0 files"), "{out}");

    // A table another daemon is working on is left alone: run-once says who holds it.
    let other = floe_maintenance::state::StateTable::open(
        client.clone(),
        iceberg::TableIdent::from_strs(["floe_maintenance", "state"]).unwrap(),
        "daemon-elsewhere".into(),
        std::time::Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert!(other.acquire("ops.events").await.unwrap().is_some());
    let (code, _, err) = task("run-once", config, "compact");
    assert_eq!(code, 1);
    assert!(
        err.contains("ops.events is being maintained by daemon-elsewhere"),
        "{err}"
    );
    other.release("ops.events", None).await.unwrap();
    let (code, _, err) = task("run-once", config, "compact");
    assert_eq!(code, 0, "{err}");
    let state = other.read().await.unwrap();
    assert!(state.leases.is_empty());
    assert!(
        state
            .last_runs
            .contains_key(&("ops.events".to_string(), "compact".to_string()))
    );

    // A bad config is refused with its position, before anything runs.
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "version = 1\n[catalog]\nuri = \"http://127.0.0.1:1\"\n[[policy]]\ntables = \"ops.*\"\n[policy.compact]\nschedule = \"sometimes\"\n").unwrap();
    let (code, _, err) = run(&[
        "run-once",
        "--config",
        bad.to_str().unwrap(),
        "--table",
        "ops.events",
        "--task",
        "compact",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("bad.toml:7:12: schedule"), "{err}");
    check(
        &client.load_table(&ident).await.unwrap(),
        false,
        &rows,
        "end",
    )
    .await;
    std::fs::remove_dir_all(&dir).ok();
    h.catalog.stop().await.unwrap();
}
