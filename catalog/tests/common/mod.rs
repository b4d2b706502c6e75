//! Shared helpers of the catalog's integration tests: start a catalog on every configured
//! store × warehouse, and talk to it over HTTP.
//!
//! SQLite with a local warehouse always runs. Postgres runs when `FLOE_TEST_PG_URL` is set and
//! S3 when `FLOE_TEST_S3_ENDPOINT` is set (the test harness `tests/run` sets both and
//! `FLOE_REQUIRE_SERVICES=1`, which turns a missing service into a failure instead of a skip).
//! Each test gets its own catalog name (the JDBC `catalog_name`) and warehouse prefix, so tests
//! share one database and bucket without seeing each other.

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;

use floe_catalog::RunningCatalog;
use floe_catalog::config::{CatalogConfig, Overrides};
use serde_json::{Value, json};

/// One store × warehouse combination.
#[derive(Debug, Clone)]
pub struct Backend {
    pub label: String,
    pub store: String,
    pub warehouse: String,
    /// The local warehouse directory, when the warehouse is on the file system.
    pub local_dir: Option<PathBuf>,
    /// The temporary directory of the local stores and warehouses; removed when the last
    /// backend of a `backends()` call is dropped.
    _root: std::sync::Arc<TempRoot>,
}

/// A temporary directory removed on drop (tests must not fill the disk).
#[derive(Debug)]
struct TempRoot(PathBuf);

impl Drop for TempRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Says on the real stderr (the harness does not capture it) that part of a test did not
/// run: these tests run on SQLite and a local warehouse always, on Postgres and S3 when the
/// services are there.
pub fn skipped(what: &str) {
    use std::io::Write;
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let _ = writeln!(std::io::stderr(), "SKIPPED part of {test}: {what}");
}

fn required() -> bool {
    std::env::var("FLOE_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

fn unique(tag: &str) -> String {
    format!("{tag}{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// A TCP port free on loopback right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Every backend this run can reach.
pub fn backends() -> Vec<Backend> {
    let tmp = std::env::temp_dir().join(unique("floe-cat-"));
    std::fs::create_dir_all(&tmp).unwrap();
    let root = std::sync::Arc::new(TempRoot(tmp.clone()));
    let local_wh = tmp.join("warehouse");
    let mut out = vec![Backend {
        label: "sqlite+file".into(),
        store: format!("sqlite://{}", tmp.join("catalog.db").display()),
        warehouse: format!("file://{}", local_wh.display()),
        local_dir: Some(local_wh.clone()),
        _root: root.clone(),
    }];
    let pg = std::env::var("FLOE_TEST_PG_URL").ok();
    let s3 = std::env::var("FLOE_TEST_S3_ENDPOINT").ok();
    if required() {
        assert!(
            pg.is_some(),
            "FLOE_REQUIRE_SERVICES=1 but FLOE_TEST_PG_URL is not set"
        );
        assert!(
            s3.is_some(),
            "FLOE_REQUIRE_SERVICES=1 but FLOE_TEST_S3_ENDPOINT is not set"
        );
    }
    if let Some(pg) = &pg {
        out.push(Backend {
            label: "postgres+file".into(),
            store: pg.clone(),
            warehouse: format!("file://{}", tmp.join("warehouse-pg").display()),
            local_dir: Some(tmp.join("warehouse-pg")),
            _root: root.clone(),
        });
    } else {
        skipped("FLOE_TEST_PG_URL is not set: the Postgres store");
    }
    if s3.is_some() {
        let bucket = std::env::var("FLOE_TEST_S3_BUCKET").unwrap_or_else(|_| "floe-test".into());
        out.push(Backend {
            label: "sqlite+s3".into(),
            store: format!("sqlite://{}", tmp.join("catalog-s3.db").display()),
            warehouse: format!("s3://{bucket}/{}", unique("wh-")),
            local_dir: None,
            _root: root.clone(),
        });
        if let Some(pg) = &pg {
            out.push(Backend {
                label: "postgres+s3".into(),
                store: pg.clone(),
                warehouse: format!("s3://{bucket}/{}", unique("wh-")),
                local_dir: None,
                _root: root.clone(),
            });
        }
    } else {
        skipped("FLOE_TEST_S3_ENDPOINT is not set: the S3 warehouse");
    }
    out
}

/// Settings for a catalog on `backend` with a unique name, listening on a free port.
pub fn config(backend: &Backend) -> CatalogConfig {
    let mut config = CatalogConfig::from_toml(
        None,
        "",
        &Overrides {
            name: Some(unique("t")),
            listen: Some("127.0.0.1:0".into()),
            warehouse: Some(backend.warehouse.clone()),
            store: Some(backend.store.clone()),
            allow_anonymous: false,
        },
    )
    .expect("test config is valid");
    if let Ok(endpoint) = std::env::var("FLOE_TEST_S3_ENDPOINT") {
        config.s3.endpoint = Some(endpoint);
        config.s3.path_style = true;
        config.s3.region.get_or_insert_with(|| "us-east-1".into());
        config.s3.access_key_id.get_or_insert_with(|| "test".into());
        config
            .s3
            .secret_access_key
            .get_or_insert_with(|| "test".into());
    }
    config
}

/// A running catalog and an HTTP client pointed at it.
pub struct Harness {
    pub backend: Backend,
    pub config: CatalogConfig,
    pub catalog: RunningCatalog,
    pub http: reqwest::Client,
}

impl Harness {
    pub async fn start(backend: &Backend) -> Self {
        let config = config(backend);
        let catalog = floe_catalog::start(&config).await.expect("catalog starts");
        Self {
            backend: backend.clone(),
            config,
            catalog,
            // A hung request fails the test instead of stalling the suite.
            http: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(120))
                .build()
                .unwrap(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}/v1/{}/{}", self.catalog.uri(), self.config.name, path)
    }

    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self.http.request(method, self.url(path));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("request sent");
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, path, None).await
    }

    pub async fn create_namespace(&self, ns: &str) {
        let (status, body) = self.post("namespaces", json!({ "namespace": [ns] })).await;
        assert_eq!(status, 200, "create namespace {ns}: {body}");
    }

    /// Creates `ns.name` with a two-column schema and returns the load result.
    pub async fn create_table(&self, ns: &str, name: &str) -> Value {
        let (status, body) = self
            .post(&format!("namespaces/{ns}/tables"), create_body(name))
            .await;
        assert_eq!(status, 200, "create table {ns}.{name}: {body}");
        body
    }

    /// Loads `ns.name` and commits one more snapshot on top of its current one; returns the
    /// commit's status.
    pub async fn append(&self, ns: &str, name: &str, snapshot_id: i64) -> u16 {
        let path = format!("namespaces/{ns}/tables/{name}");
        let (_, loaded) = self.get(&path).await;
        let commit = append_commit(&loaded["metadata"], snapshot_id, "append");
        self.post(&path, commit).await.0
    }

    /// The current metadata location of a table.
    pub async fn pointer(&self, ns: &str, name: &str) -> Option<String> {
        let (status, body) = self.get(&format!("namespaces/{ns}/tables/{name}")).await;
        (status == 200).then(|| body["metadata-location"].as_str().unwrap().to_string())
    }

    /// The warehouse, opened with the catalog's own settings, to look at files directly.
    pub fn warehouse_io(&self) -> floe_catalog::warehouse::Warehouse {
        floe_catalog::warehouse::Warehouse::open(&self.config.warehouse, &self.config.s3).unwrap()
    }

    /// Every file under the local warehouse, sorted (empty for S3 warehouses).
    pub fn warehouse_files(&self) -> Vec<PathBuf> {
        let Some(dir) = &self.backend.local_dir else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut stack = vec![dir.clone()];
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else {
                    out.push(path);
                }
            }
        }
        out.sort();
        out
    }
}

/// The body of a create-table request with `id long` and `data string`.
pub fn create_body(name: &str) -> Value {
    json!({
        "name": name,
        "schema": {
            "type": "struct", "schema-id": 0,
            "fields": [
                {"id": 1, "name": "id", "required": true, "type": "long"},
                {"id": 2, "name": "data", "required": false, "type": "string"}
            ]
        },
        "properties": {"format-version": "2"}
    })
}

/// A commit adding a snapshot on top of `parent` (the table's current snapshot), asserting
/// that `main` still points at `parent`. The manifest list need not exist: the catalog never
/// reads it.
pub fn append_commit(metadata: &Value, snapshot_id: i64, tag: &str) -> Value {
    let parent = metadata["current-snapshot-id"]
        .as_i64()
        .filter(|id| *id >= 0);
    let seq = metadata["last-sequence-number"].as_i64().unwrap_or(0) + 1;
    let location = metadata["location"].as_str().unwrap();
    let mut snapshot = json!({
        "snapshot-id": snapshot_id,
        "sequence-number": seq,
        "timestamp-ms": chrono_now_ms(),
        "manifest-list": format!("{location}/metadata/snap-{snapshot_id}.avro"),
        "summary": {"operation": "append", "writer": tag},
        "schema-id": 0
    });
    if let Some(parent) = parent {
        snapshot["parent-snapshot-id"] = json!(parent);
    }
    json!({
        "requirements": [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": parent}],
        "updates": [
            {"action": "add-snapshot", "snapshot": snapshot},
            {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": snapshot_id}
        ]
    })
}

pub fn chrono_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Snapshot ids along `main`'s ancestry, newest first.
pub fn main_ancestry(metadata: &Value) -> Vec<i64> {
    let snapshots: std::collections::HashMap<i64, Option<i64>> = metadata["snapshots"]
        .as_array()
        .map(|all| {
            all.iter()
                .map(|s| {
                    (
                        s["snapshot-id"].as_i64().unwrap(),
                        s["parent-snapshot-id"].as_i64(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let mut out = Vec::new();
    let mut next = metadata["current-snapshot-id"]
        .as_i64()
        .filter(|id| *id >= 0);
    while let Some(id) = next {
        out.push(id);
        next = snapshots.get(&id).copied().flatten();
    }
    out
}
