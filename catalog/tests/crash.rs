//! A catalog killed with SIGKILL at any point of a commit restarts consistent: every commit a
//! client saw acknowledged is in the table's history, the history is one linear chain, and
//! commits go on working.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Backend, append_commit, backends, free_port, main_ancestry};
use serde_json::{Value, json};

fn spawn(backend: &Backend, name: &str, port: u16) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_floe-catalog"));
    cmd.args(["--listen", &format!("127.0.0.1:{port}")])
        .args([
            "--store",
            &backend.store,
            "--warehouse",
            &backend.warehouse,
            "--name",
            name,
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if let Ok(endpoint) = std::env::var("FLOE_TEST_S3_ENDPOINT") {
        cmd.env("FLOE_S3_ENDPOINT", endpoint)
            .env("FLOE_S3_PATH_STYLE", "true")
            .env(
                "AWS_REGION",
                std::env::var("AWS_REGION").unwrap_or("us-east-1".into()),
            )
            .env(
                "AWS_ACCESS_KEY_ID",
                std::env::var("AWS_ACCESS_KEY_ID").unwrap_or("test".into()),
            )
            .env(
                "AWS_SECRET_ACCESS_KEY",
                std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or("test".into()),
            );
    }
    cmd.spawn().expect("floe-catalog binary starts")
}

async fn wait_healthy(http: &reqwest::Client, base: &str) {
    for _ in 0..200 {
        if let Ok(r) = http.get(format!("{base}/healthz")).send().await
            && r.status().is_success()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("catalog at {base} did not become healthy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_during_commits_leaves_a_consistent_catalog() {
    for backend in backends() {
        let name = format!("crash{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let port = free_port();
        let base = format!("http://127.0.0.1:{port}");
        let table_url = format!("{base}/v1/{name}/namespaces/db/tables/t");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();

        let mut child = spawn(&backend, &name, port);
        wait_healthy(&http, &base).await;
        let r = http
            .post(format!("{base}/v1/{name}/namespaces"))
            .json(&json!({"namespace": ["db"]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let r = http
            .post(format!("{base}/v1/{name}/namespaces/db/tables"))
            .json(&common::create_body("t"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);

        let acked = Arc::new(Mutex::new(Vec::<i64>::new()));
        let mut next_id = 1i64;
        let rounds = 12;
        for round in 0..rounds {
            let writers: Vec<_> = (0..3)
                .map(|w| {
                    let (http, url, acked) = (http.clone(), table_url.clone(), acked.clone());
                    let first_id = next_id + w * 10_000;
                    tokio::spawn(async move {
                        let mut id = first_id;
                        loop {
                            let Ok(r) = http.get(&url).send().await else {
                                return;
                            };
                            let Ok(loaded) = r.json::<Value>().await else {
                                return;
                            };
                            let body = append_commit(&loaded["metadata"], id, "crash");
                            match http.post(&url).json(&body).send().await {
                                Ok(r) if r.status().as_u16() == 200 => {
                                    acked.lock().unwrap().push(id)
                                }
                                Ok(_) => {}
                                Err(_) => return,
                            }
                            id += 1;
                        }
                    })
                })
                .collect();
            next_id += 100_000;
            // Kill at a different instant each round: early, mid-stream, late.
            let delay = 30 + (round * 97) % 400;
            tokio::time::sleep(Duration::from_millis(delay as u64)).await;
            child.kill().expect("SIGKILL");
            child.wait().unwrap();
            for w in writers {
                w.await.unwrap();
            }
            child = spawn(&backend, &name, port);
            wait_healthy(&http, &base).await;
        }

        let loaded: Value = http
            .get(&table_url)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let ancestry = main_ancestry(&loaded["metadata"]);
        let acked = acked.lock().unwrap().clone();
        assert!(
            acked.len() >= rounds,
            "[{}] too few commits landed to test anything: {}",
            backend.label,
            acked.len()
        );
        for id in &acked {
            assert!(
                ancestry.contains(id),
                "[{}] acknowledged commit {id} is missing",
                backend.label
            );
        }
        assert_eq!(
            ancestry.len(),
            loaded["metadata"]["snapshots"].as_array().unwrap().len(),
            "[{}] history is not one linear chain",
            backend.label
        );
        // And it still commits.
        let r = http
            .post(&table_url)
            .json(&append_commit(&loaded["metadata"], 9_999_999, "after"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "[{}]", backend.label);
        eprintln!(
            "[{}] {} acknowledged commits survived {rounds} kills",
            backend.label,
            acked.len()
        );
        child.kill().ok();
        child.wait().ok();
    }
}
