//! The catalog's guarantees, over HTTP, on every configured store × warehouse: concurrent
//! commits on one base, atomic multi-table commits, concurrent creates, idempotency-key
//! replays, and "a 4xx changes nothing".

mod common;

use common::{Harness, append_commit, backends, create_body, main_ancestry};
use futures::future::join_all;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_commits_on_one_base_exactly_one_wins() {
    for backend in backends() {
        let h = Harness::start(&backend).await;
        h.create_namespace("db").await;
        h.create_table("db", "hot").await;
        let mut winners = Vec::new();
        for round in 0..5 {
            let (_, loaded) = h.get("namespaces/db/tables/hot").await;
            let base = loaded["metadata"].clone();
            let attempts = (0..8).map(|i| {
                let id = 1000 * (round + 1) + i;
                let body = append_commit(&base, id, &format!("w{i}"));
                let h = &h;
                async move { (id, h.post("namespaces/db/tables/hot", body).await) }
            });
            let results = join_all(attempts).await;
            let won: Vec<i64> = results
                .iter()
                .filter(|(_, (s, _))| *s == 200)
                .map(|(id, _)| *id)
                .collect();
            for (_, (status, body)) in &results {
                assert!(
                    *status == 200 || *status == 409,
                    "[{}] unexpected {status}: {body}",
                    backend.label
                );
                if *status == 409 {
                    assert_eq!(
                        body["error"]["type"], "CommitFailedException",
                        "[{}] {body}",
                        backend.label
                    );
                }
            }
            assert_eq!(
                won.len(),
                1,
                "[{}] round {round}: winners {won:?}",
                backend.label
            );
            winners.push(won[0]);
        }
        let (_, loaded) = h.get("namespaces/db/tables/hot").await;
        let mut ancestry = main_ancestry(&loaded["metadata"]);
        ancestry.reverse();
        assert_eq!(
            ancestry, winners,
            "[{}] history is the winners, in order",
            backend.label
        );
        assert_eq!(
            loaded["metadata"]["snapshots"].as_array().unwrap().len(),
            winners.len(),
            "[{}] no loser's snapshot leaked in",
            backend.label
        );
        h.catalog.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compatible_concurrent_commits_all_land() {
    // Commits whose requirements still hold after another writer won are retried server-side.
    for backend in backends() {
        let h = Harness::start(&backend).await;
        h.create_namespace("db").await;
        let created = h.create_table("db", "props").await;
        let uuid = created["metadata"]["table-uuid"]
            .as_str()
            .unwrap()
            .to_string();
        let commits = (0..6).map(|i| {
            let body = json!({
                "requirements": [{"type": "assert-table-uuid", "uuid": uuid}],
                "updates": [{"action": "set-properties", "updates": {format!("k{i}"): "v"}}]
            });
            let h = &h;
            async move { h.post("namespaces/db/tables/props", body).await }
        });
        for (status, body) in join_all(commits).await {
            assert_eq!(status, 200, "[{}] {body}", backend.label);
        }
        let (_, loaded) = h.get("namespaces/db/tables/props").await;
        for i in 0..6 {
            assert_eq!(
                loaded["metadata"]["properties"][format!("k{i}")],
                "v",
                "[{}]",
                backend.label
            );
        }
        h.catalog.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn multi_table_commit_with_one_stale_requirement_changes_nothing() {
    for backend in backends() {
        let h = Harness::start(&backend).await;
        h.create_namespace("db").await;
        let a = h.create_table("db", "a").await;
        let b = h.create_table("db", "b").await;
        // Move b forward so a commit based on its old state is stale.
        let (status, _) = h
            .post(
                "namespaces/db/tables/b",
                append_commit(&b["metadata"], 7, "x"),
            )
            .await;
        assert_eq!(status, 200);
        let before = (h.pointer("db", "a").await, h.pointer("db", "b").await);
        let files_before = h.warehouse_files();

        let mut change_a = append_commit(&a["metadata"], 11, "tx");
        change_a["identifier"] = json!({"namespace": ["db"], "name": "a"});
        let mut change_b = append_commit(&b["metadata"], 12, "tx");
        change_b["identifier"] = json!({"namespace": ["db"], "name": "b"});
        let (status, body) = h
            .post(
                "transactions/commit",
                json!({ "table-changes": [change_a.clone(), change_b] }),
            )
            .await;
        assert_eq!(status, 409, "[{}] {body}", backend.label);
        assert_eq!(body["error"]["type"], "CommitFailedException");
        assert_eq!(
            before,
            (h.pointer("db", "a").await, h.pointer("db", "b").await),
            "[{}]",
            backend.label
        );
        assert_eq!(
            files_before,
            h.warehouse_files(),
            "[{}] the failed commit left files behind",
            backend.label
        );

        // With both requirements fresh, both tables move in one request.
        let (_, b_now) = h.get("namespaces/db/tables/b").await;
        let mut change_b = append_commit(&b_now["metadata"], 13, "tx");
        change_b["identifier"] = json!({"namespace": ["db"], "name": "b"});
        let (status, body) = h
            .post(
                "transactions/commit",
                json!({ "table-changes": [change_a, change_b] }),
            )
            .await;
        assert_eq!(status, 204, "[{}] {body}", backend.label);
        let (_, a_now) = h.get("namespaces/db/tables/a").await;
        let (_, b_now) = h.get("namespaces/db/tables/b").await;
        assert_eq!(a_now["metadata"]["current-snapshot-id"], 11);
        assert_eq!(b_now["metadata"]["current-snapshot-id"], 13);
        h.catalog.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_of_one_name_one_wins() {
    for backend in backends() {
        let h = Harness::start(&backend).await;
        h.create_namespace("db").await;
        let creates = (0..6).map(|_| {
            let h = &h;
            async move { h.post("namespaces/db/tables", create_body("same")).await }
        });
        let results = join_all(creates).await;
        let ok = results.iter().filter(|(s, _)| *s == 200).count();
        assert_eq!(ok, 1, "[{}] {results:?}", backend.label);
        for (status, body) in results.iter().filter(|(s, _)| *s != 200) {
            assert_eq!(*status, 409, "[{}] {body}", backend.label);
            assert_eq!(body["error"]["type"], "AlreadyExistsException");
        }
        // Only the winner's metadata file remains.
        if backend.local_dir.is_some() {
            assert_eq!(
                h.warehouse_files().len(),
                1,
                "[{}] {:?}",
                backend.label,
                h.warehouse_files()
            );
        }

        // The same through stage-create + assert-create, as DuckDB and Trino create tables.
        let mut staged = create_body("staged");
        staged["stage-create"] = json!(true);
        let (status, stage) = h.post("namespaces/db/tables", staged).await;
        assert_eq!(status, 200, "{stage}");
        assert!(stage["metadata-location"].is_null());
        assert_eq!(
            h.get("namespaces/db/tables/staged").await.0,
            404,
            "a staged table is invisible"
        );
        let md = &stage["metadata"];
        let finish = json!({
            "requirements": [{"type": "assert-create"}],
            "updates": [
                {"action": "assign-uuid", "uuid": md["table-uuid"]},
                {"action": "upgrade-format-version", "format-version": 2},
                {"action": "add-schema", "schema": md["schemas"][0]},
                {"action": "set-current-schema", "schema-id": -1},
                {"action": "add-spec", "spec": {"spec-id": 0, "fields": []}},
                {"action": "set-default-spec", "spec-id": -1},
                {"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}},
                {"action": "set-default-sort-order", "sort-order-id": -1},
                {"action": "set-location", "location": md["location"]},
                {"action": "set-properties", "updates": {"owner": "test"}}
            ]
        });
        let commits = (0..4).map(|_| {
            let (h, finish) = (&h, finish.clone());
            async move { h.post("namespaces/db/tables/staged", finish).await }
        });
        let results = join_all(commits).await;
        assert_eq!(
            results.iter().filter(|(s, _)| *s == 200).count(),
            1,
            "[{}] {results:?}",
            backend.label
        );
        assert!(
            results.iter().all(|(s, _)| *s == 200 || *s == 409),
            "{results:?}"
        );
        let (status, loaded) = h.get("namespaces/db/tables/staged").await;
        assert_eq!(status, 200);
        assert_eq!(
            loaded["metadata"]["schemas"].as_array().unwrap().len(),
            1,
            "{loaded}"
        );
        assert_eq!(loaded["metadata"]["table-uuid"], md["table-uuid"]);
        assert_eq!(loaded["metadata"]["properties"]["owner"], "test");
        h.catalog.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_replay_applies_once() {
    for backend in backends() {
        let h = Harness::start(&backend).await;
        let cfg: Value = h
            .http
            .get(format!("{}/v1/config", h.catalog.uri()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(cfg["idempotency-key-lifetime"], "PT30M", "advertised");
        h.create_namespace("db").await;
        let t = h.create_table("db", "t").await;
        let commit = append_commit(&t["metadata"], 42, "idem");
        let key = uuid::Uuid::now_v7().to_string();
        let send = |body: Value| {
            let h = &h;
            let key = key.clone();
            async move {
                let r = h
                    .http
                    .post(h.url("namespaces/db/tables/t"))
                    .header("Idempotency-Key", key)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                (
                    r.status().as_u16(),
                    r.json::<Value>().await.unwrap_or(Value::Null),
                )
            }
        };
        let first = send(commit.clone()).await;
        assert_eq!(first.0, 200, "{}", first.1);
        let pointer = h.pointer("db", "t").await;
        let files = h.warehouse_files();
        // The replay would fail its requirement if it ran again; it must return the first answer.
        let replay = send(commit.clone()).await;
        assert_eq!(replay, first, "[{}] replay differs", backend.label);
        assert_eq!(pointer, h.pointer("db", "t").await);
        assert_eq!(files, h.warehouse_files());
        // Same key, different request: refused.
        let mut other = commit.clone();
        other["updates"][0]["snapshot"]["snapshot-id"] = json!(43);
        let reused = send(other).await;
        assert_eq!(reused.0, 422, "{}", reused.1);

        // A 409 is remembered too: the replay of a failed commit fails the same way even after
        // the table moved to a state where it would succeed.
        let stale = append_commit(&t["metadata"], 44, "stale");
        let key2 = uuid::Uuid::now_v7().to_string();
        let post2 = || {
            h.http
                .post(h.url("namespaces/db/tables/t"))
                .header("Idempotency-Key", key2.clone())
                .json(&stale)
                .send()
        };
        assert_eq!(post2().await.unwrap().status().as_u16(), 409);
        assert_eq!(post2().await.unwrap().status().as_u16(), 409);
        h.catalog.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_spec_errors_and_change_nothing() {
    for backend in backends() {
        let h = Harness::start(&backend).await;
        h.create_namespace("db").await;
        let t = h.create_table("db", "t").await;
        let pointer = h.pointer("db", "t").await;
        let files = h.warehouse_files();
        let (_, namespaces) = h.get("namespaces").await;

        let raw = |path: &str, body: &'static str| {
            let url = h.url(path);
            let http = h.http.clone();
            async move {
                let r = http
                    .post(url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .unwrap();
                (
                    r.status().as_u16(),
                    r.json::<Value>().await.unwrap_or(Value::Null),
                )
            }
        };
        let mut cases: Vec<(&str, (u16, Value))> = vec![
            ("malformed json", raw("namespaces/db/tables/t", "{\"requirements\": [").await),
            (
                "unknown requirement",
                raw("namespaces/db/tables/t", r#"{"requirements":[{"type":"assert-nothing"}],"updates":[]}"#).await,
            ),
            (
                "unknown update",
                raw("namespaces/db/tables/t", r#"{"requirements":[],"updates":[{"action":"make-it-fast"}]}"#).await,
            ),
            ("namespace with ..", h.post("namespaces", json!({"namespace": [".."]})).await),
            ("namespace with /", h.post("namespaces", json!({"namespace": ["a/b"]})).await),
            ("empty namespace part", h.post("namespaces", json!({"namespace": ["ok", ""]})).await),
            ("control character", h.post("namespaces", json!({"namespace": ["a\u{7}"]})).await),
            ("table name with /", h.post("namespaces/db/tables", create_body("x/y")).await),
            ("table name ..", h.post("namespaces/db/tables", create_body("..")).await),
            (
                "location outside the warehouse",
                h.post("namespaces/db/tables", {
                    let mut b = create_body("escape");
                    b["location"] = json!("file:///tmp/elsewhere");
                    b
                })
                .await,
            ),
            (
                "invalid update",
                h.post(
                    "namespaces/db/tables/t",
                    json!({"requirements": [], "updates": [{"action": "set-current-schema", "schema-id": 99}]}),
                )
                .await,
            ),
            (
                "transaction without identifier",
                h.post("transactions/commit", json!({"table-changes": [{"requirements": [], "updates": []}]})).await,
            ),
        ];
        for (what, (status, body)) in &cases {
            assert_eq!(*status, 400, "[{}] {what}: {body}", backend.label);
            assert_eq!(
                body["error"]["code"], 400,
                "[{}] {what}: {body}",
                backend.label
            );
            let kind = body["error"]["type"].as_str().unwrap_or_default();
            assert!(
                kind == "BadRequestException" || kind == "ValidationException",
                "[{}] {what}: {body}",
                backend.label
            );
            assert!(
                !body["error"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .is_empty()
            );
        }
        cases.clear();
        let (status, body) = h
            .post(
                "namespaces/db/tables/missing",
                append_commit(&t["metadata"], 5, "x"),
            )
            .await;
        assert_eq!(
            (status, body["error"]["type"].as_str()),
            (404, Some("NoSuchTableException")),
            "{body}"
        );
        let (status, body) = h.get("namespaces/nope/tables").await;
        assert_eq!(
            (status, body["error"]["type"].as_str()),
            (404, Some("NoSuchNamespaceException")),
            "{body}"
        );
        let (status, body) = h.post("namespaces", json!({"namespace": ["db"]})).await;
        assert_eq!(
            (status, body["error"]["type"].as_str()),
            (409, Some("AlreadyExistsException")),
            "{body}"
        );

        assert_eq!(pointer, h.pointer("db", "t").await, "[{}]", backend.label);
        assert_eq!(files, h.warehouse_files(), "[{}]", backend.label);
        assert_eq!(
            namespaces,
            h.get("namespaces").await.1,
            "[{}]",
            backend.label
        );
        h.catalog.stop().await.unwrap();
    }
}
