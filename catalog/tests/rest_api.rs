//! The REST surface as clients use it: config, namespaces (nested, properties, pagination),
//! tables (load modes, ETags, rename, register, drop with purge), metrics reports, auth.

mod common;

use common::{Harness, append_commit, backends};
use floe_catalog::auth::{Auth, Client, Secret};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_advertises_exactly_what_is_served() {
    let backend = &backends()[0];
    let h = Harness::start(backend).await;
    let cfg: Value = h
        .http
        .get(format!("{}/v1/config?warehouse=anything", h.catalog.uri()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(cfg["overrides"]["prefix"], h.config.name.as_str());
    let endpoints: Vec<&str> = cfg["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(endpoints.contains(&"POST /v1/{prefix}/transactions/commit"));
    assert!(endpoints.contains(&"HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}"));
    assert!(
        !endpoints.iter().any(|e| e.contains("views")),
        "views are not served"
    );
    h.create_namespace("probe").await;
    h.create_table("probe", "t").await;
    // Every advertised route answers something other than "no such route".
    for endpoint in endpoints {
        let (method, path) = endpoint.split_once(' ').unwrap();
        let path = path
            .replace("{prefix}", &h.config.name)
            .replace("{namespace}", "probe")
            .replace("{table}", "t");
        let url = format!("{}{}", h.catalog.uri(), path);
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        // DELETEs are probed on objects that do not exist, so the probe destroys nothing.
        let url = if method == reqwest::Method::DELETE {
            url.replace("probe", "absent")
        } else {
            url
        };
        let r = h
            .http
            .request(method.clone(), &url)
            .body("{}")
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        assert_ne!(body["error"]["message"], "no such route", "{method} {url}");
        assert_ne!(status, 405, "{method} {url}");
    }
    let (status, body) = h.get("../wrong-prefix/namespaces").await;
    assert_eq!(status, 404, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_nest_paginate_and_hold_properties() {
    for backend in backends() {
        let h = Harness::start(&backend).await;
        for ns in [
            json!(["a"]),
            json!(["a", "b"]),
            json!(["a", "c"]),
            json!(["a", "b", "d"]),
            json!(["z"]),
        ] {
            let (s, b) = h
                .post(
                    "namespaces",
                    json!({"namespace": ns, "properties": {"owner": "me"}}),
                )
                .await;
            assert_eq!(s, 200, "{b}");
        }
        let (_, top) = h.get("namespaces").await;
        assert_eq!(
            top["namespaces"],
            json!([["a"], ["z"]]),
            "[{}]",
            backend.label
        );
        let (_, kids) = h.get("namespaces?parent=a").await;
        assert_eq!(kids["namespaces"], json!([["a", "b"], ["a", "c"]]));
        let (_, grandkids) = h.get("namespaces?parent=a%1Fb").await;
        assert_eq!(grandkids["namespaces"], json!([["a", "b", "d"]]));
        let (status, _) = h.get("namespaces?parent=missing").await;
        assert_eq!(status, 404);

        // Paging through the children of `a`, one at a time.
        let (_, page1) = h.get("namespaces?parent=a&pageToken=&pageSize=1").await;
        assert_eq!(page1["namespaces"], json!([["a", "b"]]));
        let token = page1["next-page-token"].as_str().unwrap().to_string();
        let (_, page2) = h
            .get(&format!("namespaces?parent=a&pageToken={token}&pageSize=1"))
            .await;
        assert_eq!(page2["namespaces"], json!([["a", "c"]]));
        assert!(page2["next-page-token"].is_null(), "{page2}");

        let (_, loaded) = h.get("namespaces/a%1Fb").await;
        assert_eq!(loaded["namespace"], json!(["a", "b"]));
        assert_eq!(loaded["properties"]["owner"], "me");
        let location = format!("{}/a/b", h.config.warehouse);
        assert_eq!(
            loaded["properties"]["location"],
            location.as_str(),
            "the default location is reported"
        );
        let head = h.http.head(h.url("namespaces/a%1Fb")).send().await.unwrap();
        assert_eq!(head.status().as_u16(), 204);
        let head = h.http.head(h.url("namespaces/nope")).send().await.unwrap();
        assert_eq!(head.status().as_u16(), 404);

        let (s, body) = h
            .post(
                "namespaces/a/properties",
                json!({"removals": ["owner", "ghost"], "updates": {"team": "x"}}),
            )
            .await;
        assert_eq!(s, 200, "{body}");
        assert_eq!(body["removed"], json!(["owner"]));
        assert_eq!(body["missing"], json!(["ghost"]));
        assert_eq!(body["updated"], json!(["team"]));
        let (s, _) = h
            .post(
                "namespaces/a/properties",
                json!({"removals": ["k"], "updates": {"k": "v"}}),
            )
            .await;
        assert_eq!(s, 422);
        let (_, loaded) = h.get("namespaces/a").await;
        assert_eq!(loaded["properties"]["team"], "x");
        assert!(loaded["properties"].get("owner").is_none());
        // Removing every property does not drop the namespace.
        h.post("namespaces/a/properties", json!({"removals": ["team"]}))
            .await;
        assert_eq!(h.get("namespaces/a").await.0, 200);

        let (s, body) = h.send(reqwest::Method::DELETE, "namespaces/a", None).await;
        assert_eq!(
            (s, body["error"]["type"].as_str()),
            (409, Some("NamespaceNotEmptyException"))
        );
        let (s, _) = h.send(reqwest::Method::DELETE, "namespaces/z", None).await;
        assert_eq!(s, 204);
        assert_eq!(h.get("namespaces/z").await.0, 404);
        h.catalog.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_load_rename_register_and_purge() {
    for backend in backends() {
        let h = Harness::start(&backend).await;
        h.create_namespace("db").await;
        h.create_namespace("other").await;
        for i in 0..3 {
            h.create_table("db", &format!("t{i}")).await;
        }
        let (_, listed) = h.get("namespaces/db/tables").await;
        assert_eq!(listed["identifiers"].as_array().unwrap().len(), 3);
        let (_, page) = h.get("namespaces/db/tables?pageToken=&pageSize=2").await;
        assert_eq!(
            page["identifiers"],
            json!([{"namespace": ["db"], "name": "t0"}, {"namespace": ["db"], "name": "t1"}])
        );

        // Two snapshots, then load with snapshots=refs keeps only the branch head.
        assert_eq!(h.append("db", "t0", 1).await, 200);
        assert_eq!(h.append("db", "t0", 2).await, 200);
        let (_, all) = h.get("namespaces/db/tables/t0?snapshots=all").await;
        let (_, refs) = h.get("namespaces/db/tables/t0?snapshots=refs").await;
        assert_eq!(all["metadata"]["snapshots"].as_array().unwrap().len(), 2);
        assert_eq!(refs["metadata"]["snapshots"].as_array().unwrap().len(), 1);
        assert_eq!(refs["metadata"]["snapshots"][0]["snapshot-id"], 2);

        // ETag: unchanged metadata answers 304.
        let r = h
            .http
            .get(h.url("namespaces/db/tables/t0"))
            .send()
            .await
            .unwrap();
        let tag = r
            .headers()
            .get("etag")
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        let r = h
            .http
            .get(h.url("namespaces/db/tables/t0"))
            .header("If-None-Match", &tag)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 304);

        // Rename across namespaces; the destination must not exist.
        let rename = |from: (&str, &str), to: (&str, &str)| json!({"source": {"namespace": [from.0], "name": from.1}, "destination": {"namespace": [to.0], "name": to.1}});
        assert_eq!(
            h.post("tables/rename", rename(("db", "t0"), ("db", "t1")))
                .await
                .0,
            409
        );
        assert_eq!(
            h.post("tables/rename", rename(("db", "nope"), ("db", "x")))
                .await
                .0,
            404
        );
        assert_eq!(
            h.post("tables/rename", rename(("db", "t0"), ("ghost", "x")))
                .await
                .0,
            404
        );
        assert_eq!(
            h.post("tables/rename", rename(("db", "t0"), ("other", "moved")))
                .await
                .0,
            204
        );
        assert_eq!(h.get("namespaces/db/tables/t0").await.0, 404);
        let (_, moved) = h.get("namespaces/other/tables/moved").await;
        assert_eq!(moved["metadata"]["current-snapshot-id"], 2);

        // Register the moved table's metadata under a second name.
        let location = moved["metadata-location"].as_str().unwrap().to_string();
        let (s, reg) = h
            .post(
                "namespaces/db/register",
                json!({"name": "again", "metadata-location": location}),
            )
            .await;
        assert_eq!(s, 200, "{reg}");
        assert_eq!(reg["metadata"]["current-snapshot-id"], 2);
        let (s, _) = h
            .post(
                "namespaces/db/register",
                json!({"name": "again", "metadata-location": location}),
            )
            .await;
        assert_eq!(s, 409);
        let (s, _) = h
            .post(
                "namespaces/db/register",
                json!({"name": "x", "metadata-location": "file:///etc/passwd"}),
            )
            .await;
        assert_eq!(s, 400, "registering outside the warehouse is refused");
        assert_eq!(
            h.send(reqwest::Method::DELETE, "namespaces/db/tables/again", None)
                .await
                .0,
            204
        );

        // Metrics reports are accepted for existing tables.
        let (s, _) = h
            .post(
                "namespaces/other/tables/moved/metrics",
                json!({"report-type": "scan-report"}),
            )
            .await;
        assert_eq!(s, 204);

        // Drop with purge removes the table's files; without purge they stay.
        let (_, t1) = h.get("namespaces/db/tables/t1").await;
        let t1_location = t1["metadata"]["location"].as_str().unwrap().to_string();
        let (_, t2) = h.get("namespaces/db/tables/t2").await;
        let t2_location = t2["metadata"]["location"].as_str().unwrap().to_string();
        assert_eq!(
            h.send(
                reqwest::Method::DELETE,
                "namespaces/db/tables/t1?purgeRequested=true",
                None
            )
            .await
            .0,
            204
        );
        assert_eq!(
            h.send(reqwest::Method::DELETE, "namespaces/db/tables/t2", None)
                .await
                .0,
            204
        );
        assert_eq!(h.get("namespaces/db/tables/t1").await.0, 404);
        let io = h.warehouse_io();
        let t1_metadata = t1["metadata-location"].as_str().unwrap();
        let t2_metadata = t2["metadata-location"].as_str().unwrap();
        assert!(t1_metadata.starts_with(&t1_location) && t2_metadata.starts_with(&t2_location));
        assert!(
            !io.io().exists(t1_metadata).await.unwrap(),
            "[{}] purge left {t1_metadata}",
            backend.label
        );
        assert!(
            io.io().exists(t2_metadata).await.unwrap(),
            "[{}] drop without purge deleted files",
            backend.label
        );
        assert_eq!(
            h.send(reqwest::Method::DELETE, "namespaces/db/tables/t1", None)
                .await
                .0,
            404
        );
        h.catalog.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_guards_every_catalog_route() {
    let backend = &backends()[0];
    let mut config = common::config(backend);
    config.auth = Auth::new(
        vec![Secret("static-token-0123456789".into())],
        vec![Client {
            id: "job".into(),
            secret: Secret("job-secret".into()),
        }],
        None,
        3600,
    );
    let catalog = floe_catalog::start(&config).await.unwrap();
    let http = reqwest::Client::new();
    let base = catalog.uri();
    let ns_url = format!("{base}/v1/{}/namespaces", config.name);

    let r = http.get(&ns_url).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["type"], "NotAuthorizedException");
    assert_eq!(
        http.get(format!("{base}/v1/config"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        401
    );
    assert_eq!(
        http.get(&ns_url)
            .bearer_auth("wrong")
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        401
    );
    assert_eq!(
        http.get(&ns_url)
            .bearer_auth("static-token-0123456789")
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );

    let bad = http
        .post(format!("{base}/v1/oauth/tokens"))
        .form(&[
            ("grant_type", "client_credentials"),
            ("client_id", "job"),
            ("client_secret", "nope"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status().as_u16(), 401);
    assert_eq!(
        bad.json::<Value>().await.unwrap()["error"],
        "invalid_client"
    );
    let token: Value = http
        .post(format!("{base}/v1/oauth/tokens"))
        .form(&[
            ("grant_type", "client_credentials"),
            ("client_id", "job"),
            ("client_secret", "job-secret"),
            ("scope", "catalog"),
        ])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(token["token_type"], "bearer");
    let access = token["access_token"].as_str().unwrap();
    let r = http
        .post(&ns_url)
        .bearer_auth(access)
        .json(&json!({"namespace": ["secured"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // Health and metrics stay open for probes.
    assert_eq!(
        http.get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("floe_catalog_requests_total"), "{metrics}");
    assert!(!metrics.contains("job-secret") && !metrics.contains("static-token"));
    catalog.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_commits_and_conflicts() {
    let backend = &backends()[0];
    let h = Harness::start(backend).await;
    h.create_namespace("db").await;
    let t = h.create_table("db", "t").await;
    assert_eq!(
        h.post(
            "namespaces/db/tables/t",
            append_commit(&t["metadata"], 1, "a")
        )
        .await
        .0,
        200
    );
    assert_eq!(
        h.post(
            "namespaces/db/tables/t",
            append_commit(&t["metadata"], 2, "b")
        )
        .await
        .0,
        409
    );
    let text = h
        .http
        .get(format!("{}/metrics", h.catalog.uri()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("floe_catalog_commit_duration_seconds_count 1"),
        "{text}"
    );
    assert!(
        text.contains("floe_catalog_commit_conflicts_total 1"),
        "{text}"
    );
    assert!(
        text.contains(r#"route="/v1/{prefix}/namespaces/{namespace}/tables/{table}",status="409""#),
        "{text}"
    );
    h.catalog.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_returns_while_a_client_holds_a_request_open() {
    use tokio::io::AsyncWriteExt;
    let h = Harness::start(&backends()[0]).await;
    // A client that sent half a request head and went quiet: graceful shutdown alone would
    // wait for it forever.
    let mut stalled = tokio::net::TcpStream::connect(h.catalog.addr)
        .await
        .unwrap();
    stalled
        .write_all(b"GET /v1/config HTTP/1.1\r\nHost: catalog\r\n")
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let addr = h.catalog.addr;
    let bound = floe_catalog::DRAIN_TIMEOUT + std::time::Duration::from_secs(10);
    tokio::time::timeout(bound, h.catalog.stop())
        .await
        .expect("stop returns within its drain timeout")
        .unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "a stopped catalog accepts no connection"
    );
    drop(stalled);
}
