//! The commit protocol under faults, with a fault-injecting HTTP proxy in front of a real
//! floe-catalog: a 500 after the commit landed, a 500 before it reached the catalog, a real
//! concurrent writer (409), and per-table commits when the catalog does not advertise
//! multi-table commits. In every case the checkpoint lands exactly once.

mod support;

use std::sync::{Arc, Mutex};

use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use floe_lake::commit::{CommitMode, RetryPolicy, commit_checkpoint};
use floe_lake::marker::{CommitMarker, JOB_ID, newest_marker};
use floe_lake::rest::{CatalogClient, LoadedTable};
use floe_lake::snapshot::{Delta, prepare_row_delta};
use iceberg::TableIdent;
use support::common::{Harness, backends};
use support::{create_table, scan, write_data};

/// What the proxy does to the next commit request.
#[derive(Debug, Clone, Default)]
enum Fault {
    #[default]
    None,
    /// Forward it, then answer 500 as if the connection broke.
    FailAfterForwarding,
    /// Answer 500 without forwarding.
    FailBeforeForwarding,
    /// First commit this competing request (table URL path, JSON body), then forward.
    RaceWith(String, serde_json::Value),
}

#[derive(Clone)]
struct Proxy {
    target: String,
    http: reqwest::Client,
    fault: Arc<Mutex<Fault>>,
    hide_transactions: bool,
    commits_seen: Arc<Mutex<usize>>,
}

fn is_commit(method: &axum::http::Method, path: &str) -> bool {
    method == axum::http::Method::POST
        && (path.ends_with("/transactions/commit")
            || (path.contains("/tables/") && !path.ends_with("/metrics")))
}

async fn forward(State(proxy): State<Proxy>, request: Request) -> Response {
    let method = request.method().clone();
    let path_and_query = request
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    let path = request.uri().path().to_string();
    let body = to_bytes(request.into_body(), usize::MAX).await.unwrap();
    let send = |body: Vec<u8>| {
        proxy
            .http
            .request(
                method.clone(),
                format!("{}{}", proxy.target, path_and_query),
            )
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    if is_commit(&method, &path) {
        *proxy.commits_seen.lock().unwrap() += 1;
        let fault = std::mem::take(&mut *proxy.fault.lock().unwrap());
        match fault {
            Fault::None => {}
            Fault::FailBeforeForwarding => {
                return StatusCode::INTERNAL_SERVER_ERROR.into_response();
            }
            Fault::FailAfterForwarding => {
                let landed = send(body.to_vec()).await.unwrap();
                assert!(
                    landed.status().is_success(),
                    "the forwarded commit failed: {}",
                    landed.status()
                );
                return StatusCode::INTERNAL_SERVER_ERROR.into_response();
            }
            Fault::RaceWith(table_path, competitor) => {
                let r = proxy
                    .http
                    .post(format!("{}{}", proxy.target, table_path))
                    .json(&competitor)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status().as_u16(), 200, "the competing commit failed");
            }
        }
    }
    let upstream = send(body.to_vec()).await.unwrap();
    let status = StatusCode::from_u16(upstream.status().as_u16()).unwrap();
    let mut text = upstream.text().await.unwrap();
    if proxy.hide_transactions && path.ends_with("/v1/config") {
        let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
        config["endpoints"]
            .as_array_mut()
            .unwrap()
            .retain(|e| !e.as_str().unwrap().contains("transactions"));
        text = config.to_string();
    }
    (
        status,
        [("content-type", "application/json")],
        Body::from(text),
    )
        .into_response()
}

struct Setup {
    h: Harness,
    proxy: Proxy,
    client: CatalogClient,
}

async fn setup(hide_transactions: bool) -> Setup {
    let h = Harness::start(&backends()[0]).await;
    let proxy = Proxy {
        target: h.catalog.uri(),
        http: reqwest::Client::new(),
        fault: Arc::default(),
        hide_transactions,
        commits_seen: Arc::default(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new()
        .fallback(forward)
        .with_state(proxy.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = support::client(&h, &uri).await;
    Setup { h, proxy, client }
}

fn marker(checkpoint: u64) -> CommitMarker {
    CommitMarker {
        job_id: "job".into(),
        writer: None,
        checkpoint_id: checkpoint,
        positions: [("src/0".to_string(), checkpoint.to_string())].into(),
        operators: Default::default(),
        streams: Default::default(),
    }
}

/// How many snapshots along `main` carry checkpoint `checkpoint` of our job.
fn snapshots_with(table: &LoadedTable, checkpoint: u64) -> usize {
    table
        .metadata
        .snapshots()
        .filter(|s| {
            let p = &s.summary().additional_properties;
            p.get(JOB_ID).map(String::as_str) == Some("job")
                && p.get(floe_lake::marker::CHECKPOINT_ID) == Some(&checkpoint.to_string())
        })
        .count()
}

fn quick() -> RetryPolicy {
    RetryPolicy {
        initial_backoff: std::time::Duration::from_millis(10),
        ..RetryPolicy::default()
    }
}

async fn checkpoint_rows(
    s: &Setup,
    ident: &TableIdent,
    ids: &[i64],
    checkpoint: u64,
) -> floe_lake::commit::CommitReport {
    let table = s.client.load_table(ident).await.unwrap();
    let delta = Delta {
        data_files: write_data(&table, ids, checkpoint as f64).await,
        ..Delta::default()
    };
    commit_checkpoint(
        &s.client,
        &marker(checkpoint),
        &[(ident.clone(), delta)],
        &quick(),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_after_the_commit_landed_does_not_commit_twice() {
    let s = setup(false).await;
    let (ident, _) = create_table(&s.client, "faults", "after").await;
    *s.proxy.fault.lock().unwrap() = Fault::FailAfterForwarding;
    let report = checkpoint_rows(&s, &ident, &[1, 2, 3], 1).await;
    assert_eq!(report.attempts, 2, "the second attempt found the marker");
    let table = s.client.load_table(&ident).await.unwrap();
    assert_eq!(snapshots_with(&table, 1), 1);
    assert_eq!(scan(&table).await, vec![(1, 1.0), (2, 1.0), (3, 1.0)]);
    // The committed checkpoint is found again after a "restart".
    assert_eq!(
        newest_marker(&table.metadata, "job").unwrap().marker,
        marker(1)
    );
    s.h.catalog.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_before_the_commit_landed_commits_once() {
    let s = setup(false).await;
    let (ident, _) = create_table(&s.client, "faults", "before").await;
    *s.proxy.fault.lock().unwrap() = Fault::FailBeforeForwarding;
    let report = checkpoint_rows(&s, &ident, &[1, 2], 1).await;
    assert_eq!(report.attempts, 2);
    let table = s.client.load_table(&ident).await.unwrap();
    assert_eq!(snapshots_with(&table, 1), 1);
    assert_eq!(scan(&table).await, vec![(1, 1.0), (2, 1.0)]);
    // Replaying the same checkpoint (as a restarted job would) changes nothing.
    let again = checkpoint_rows(&s, &ident, &[1, 2], 1).await;
    assert_eq!(again.attempts, 1);
    let table = s.client.load_table(&ident).await.unwrap();
    assert_eq!(scan(&table).await, vec![(1, 1.0), (2, 1.0)]);
    s.h.catalog.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_that_run_out_on_an_unknown_outcome_say_so_and_a_restart_finds_the_commit() {
    let s = setup(false).await;
    let (ident, _) = create_table(&s.client, "faults", "unknown").await;
    *s.proxy.fault.lock().unwrap() = Fault::FailAfterForwarding;
    let table = s.client.load_table(&ident).await.unwrap();
    let delta = Delta {
        data_files: write_data(&table, &[7, 8], 1.0).await,
        ..Delta::default()
    };
    let once = RetryPolicy {
        attempts: 1,
        ..quick()
    };
    let err = commit_checkpoint(&s.client, &marker(1), &[(ident.clone(), delta)], &once)
        .await
        .unwrap_err();
    // Not a plain failure: the caller must keep the files, which the table now references.
    assert_eq!(
        err.kind(),
        floe_lake::ErrorKind::CommitStateUnknown,
        "{err}"
    );
    let table = s.client.load_table(&ident).await.unwrap();
    assert_eq!(scan(&table).await, vec![(7, 1.0), (8, 1.0)]);
    // A restarted job replaying the checkpoint finds its marker and commits nothing more.
    let again = checkpoint_rows(&s, &ident, &[7, 8], 1).await;
    assert_eq!(again.attempts, 1);
    let table = s.client.load_table(&ident).await.unwrap();
    assert_eq!(snapshots_with(&table, 1), 1);
    assert_eq!(scan(&table).await, vec![(7, 1.0), (8, 1.0)]);
    s.h.catalog.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_writer_gets_replanned_over() {
    let s = setup(false).await;
    let (ident, table) = create_table(&s.client, "faults", "race").await;
    // Another writer's append, planned on the same (empty) head, lands just before ours.
    let competitor = Delta {
        data_files: write_data(&table, &[100], 9.0).await,
        ..Delta::default()
    };
    let prepared = prepare_row_delta(&table, &competitor).await.unwrap();
    let body = serde_json::json!({
        "requirements": prepared.commit.requirements,
        "updates": prepared.commit.updates,
    });
    let path = format!("/v1/{}/namespaces/faults/tables/race", s.h.config.name);
    *s.proxy.fault.lock().unwrap() = Fault::RaceWith(path, body);
    let report = checkpoint_rows(&s, &ident, &[1], 1).await;
    assert_eq!(
        report.attempts, 2,
        "409, then re-planned on the competitor's snapshot"
    );
    let table = s.client.load_table(&ident).await.unwrap();
    assert_eq!(scan(&table).await, vec![(1, 1.0), (100, 9.0)]);
    assert_eq!(snapshots_with(&table, 1), 1);
    assert_eq!(table.metadata.snapshots().count(), 2);
    s.h.catalog.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_table_and_per_table_checkpoints_land_once() {
    for hide in [false, true] {
        let s = setup(hide).await;
        let (a, table_a) = create_table(&s.client, "multi", "a").await;
        let (b, table_b) = create_table(&s.client, "multi", "b").await;
        let deltas = vec![
            (
                a.clone(),
                Delta {
                    data_files: write_data(&table_a, &[1], 1.0).await,
                    ..Delta::default()
                },
            ),
            (
                b.clone(),
                Delta {
                    data_files: write_data(&table_b, &[2], 1.0).await,
                    ..Delta::default()
                },
            ),
        ];
        // The first commit request lands but answers 500: the whole transaction in
        // multi-table mode, the first table's commit in per-table mode.
        *s.proxy.commits_seen.lock().unwrap() = 0;
        *s.proxy.fault.lock().unwrap() = Fault::FailAfterForwarding;
        let report = commit_checkpoint(&s.client, &marker(7), &deltas, &quick())
            .await
            .unwrap();
        let expected = if hide {
            CommitMode::PerTable
        } else {
            CommitMode::MultiTable
        };
        assert_eq!(report.mode, expected);
        assert_eq!(report.snapshots.len(), 2);
        for (ident, rows) in [(&a, vec![(1, 1.0)]), (&b, vec![(2, 1.0)])] {
            let table = s.client.load_table(ident).await.unwrap();
            assert_eq!(snapshots_with(&table, 7), 1, "hide={hide} {ident}");
            assert_eq!(scan(&table).await, rows);
        }
        if !hide {
            assert_eq!(
                *s.proxy.commits_seen.lock().unwrap(),
                1,
                "one transaction, then found by marker"
            );
        }
        s.h.catalog.stop().await.unwrap();
    }
}
