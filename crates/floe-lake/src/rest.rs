//! A client of any spec-conforming Iceberg REST catalog, for the calls iceberg-rust's
//! `RestCatalog` cannot make: commits with our own requirements and updates, and the
//! multi-table `transactions/commit`.
//!
//! Outcomes are classified for the commit protocol: 409 → [`ErrorKind::Conflict`]; 500, 502,
//! 503, 504, a timeout or a connection lost after the request was sent →
//! [`ErrorKind::CommitStateUnknown`] (the caller must look for its marker before retrying); a
//! connection that could not be opened → [`ErrorKind::Unavailable`] (nothing was sent).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use iceberg::io::{FileIO, FileIOBuilder};
use iceberg::spec::TableMetadata;
use iceberg::{TableIdent, TableRequirement, TableUpdate};
use iceberg_catalog_rest::{CommitTableRequest, CreateTableRequest, LoadTableResult};
use iceberg_storage_opendal::OpenDalResolvingStorageFactory;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::RwLock;

use crate::error::{ErrorKind, LakeError, LakeResult};

const TRANSACTIONS_ENDPOINT: &str = "POST /v1/{prefix}/transactions/commit";

/// How to reach a catalog.
#[derive(Clone, Default)]
pub struct CatalogSettings {
    /// Base URI, e.g. `http://127.0.0.1:8181` (https works).
    pub uri: String,
    /// Warehouse name sent as `GET /v1/config?warehouse=`.
    pub warehouse: Option<String>,
    /// A static bearer token.
    pub token: Option<String>,
    /// OAuth2 client credentials `id:secret`, exchanged at `{uri}/v1/oauth/tokens`.
    pub credential: Option<String>,
    /// FileIO properties of our own (e.g. `s3.access-key-id`), applied over the catalog's.
    pub io_properties: HashMap<String, String>,
    /// Timeout of one request.
    pub timeout: Option<Duration>,
}

impl std::fmt::Debug for CatalogSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogSettings")
            .field("uri", &self.uri)
            .field("warehouse", &self.warehouse)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field(
                "credential",
                &self.credential.as_ref().map(|_| "<redacted>"),
            )
            .finish_non_exhaustive()
    }
}

/// A table as loaded from the catalog, with the I/O to read and write its files.
#[derive(Debug, Clone)]
pub struct LoadedTable {
    /// The table's identifier.
    pub ident: TableIdent,
    /// The location of the metadata file the catalog returned.
    pub metadata_location: Option<String>,
    /// The metadata.
    pub metadata: TableMetadata,
    /// FileIO configured from the catalog's and our properties.
    pub io: FileIO,
}

impl LoadedTable {
    /// The table as iceberg-rust's `Table`, for scans on the current tokio runtime.
    pub fn to_table(&self) -> LakeResult<iceberg::table::Table> {
        let mut builder = iceberg::table::Table::builder()
            .runtime(iceberg::Runtime::try_current()?)
            .identifier(self.ident.clone())
            .metadata(self.metadata.clone())
            .file_io(self.io.clone())
            .readonly(true);
        if let Some(location) = &self.metadata_location {
            builder = builder.metadata_location(location.clone());
        }
        Ok(builder.build()?)
    }
}

/// One table's part of a commit.
#[derive(Debug, Clone)]
pub struct TableCommit {
    /// The table.
    pub ident: TableIdent,
    /// Assertions the catalog checks first.
    pub requirements: Vec<TableRequirement>,
    /// Changes to apply.
    pub updates: Vec<TableUpdate>,
}

#[derive(Deserialize)]
struct ConfigResponse {
    #[serde(default)]
    defaults: HashMap<String, String>,
    #[serde(default)]
    overrides: HashMap<String, String>,
    endpoints: Option<Vec<String>>,
}

/// A connected REST catalog client.
#[derive(Debug, Clone)]
pub struct CatalogClient {
    http: reqwest::Client,
    base: String,
    settings: CatalogSettings,
    properties: HashMap<String, String>,
    endpoints: Option<HashSet<String>>,
    token: Arc<RwLock<Option<String>>>,
}

fn transport(what: &str, error: reqwest::Error) -> LakeError {
    // A request that never reached the server changed nothing; anything later is unknown.
    let kind = if error.is_connect() || error.is_builder() {
        ErrorKind::Unavailable
    } else {
        ErrorKind::CommitStateUnknown
    };
    LakeError::new(kind, format!("{what} failed")).with_source(error)
}

async fn classify(what: &str, response: reqwest::Response) -> LakeResult<reqwest::Response> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.text().await.unwrap_or_default();
    let detail = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| {
            let e = &v["error"];
            Some(format!(
                "{}: {}",
                e["type"].as_str()?,
                e["message"].as_str()?
            ))
        })
        .unwrap_or(body);
    let kind = match status.as_u16() {
        404 => ErrorKind::NotFound,
        409 => ErrorKind::Conflict,
        500 | 502 | 503 | 504 => ErrorKind::CommitStateUnknown,
        _ => ErrorKind::Rejected,
    };
    Err(LakeError::new(
        kind,
        format!("{what} answered {status}: {detail}"),
    ))
}

/// A namespace as one URL path segment: parts joined by the unit separator (`%1F`).
fn encode_namespace(ident: &TableIdent) -> String {
    encode(&ident.namespace().clone().inner().join("\u{1f}"))
}

/// Percent-encodes one URL path segment. The form encoder writes a space as `+`, which in a
/// path means a literal plus; it writes a literal plus as `%2B`, so every `+` left is a space.
fn encode(part: &str) -> String {
    url::form_urlencoded::byte_serialize(part.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

impl CatalogClient {
    /// Fetches the catalog's config and returns a client using its prefix and endpoints.
    pub async fn connect(settings: CatalogSettings) -> LakeResult<Self> {
        let http = reqwest::Client::builder()
            .timeout(settings.timeout.unwrap_or(Duration::from_secs(60)))
            .build()
            .map_err(|e| {
                LakeError::new(ErrorKind::Invalid, "cannot build an HTTP client").with_source(e)
            })?;
        let uri = settings.uri.trim_end_matches('/').to_string();
        let mut client = Self {
            http,
            base: format!("{uri}/v1"),
            settings: CatalogSettings { uri, ..settings },
            properties: HashMap::new(),
            endpoints: None,
            token: Arc::new(RwLock::new(None)),
        };
        if client.settings.credential.is_some() || client.settings.token.is_some() {
            client.authenticate().await?;
        }
        let mut request = client
            .http
            .get(format!("{}/v1/config", client.settings.uri));
        if let Some(warehouse) = &client.settings.warehouse {
            request = request.query(&[("warehouse", warehouse)]);
        }
        let config: ConfigResponse = classify(
            "GET /v1/config",
            client
                .authorize(request)
                .await
                .send()
                .await
                .map_err(|e| transport("GET /v1/config", e))?,
        )
        .await?
        .json()
        .await
        .map_err(|e| {
            LakeError::new(ErrorKind::Rejected, "unreadable /v1/config response").with_source(e)
        })?;
        let mut properties = config.defaults;
        properties.extend(client.settings.io_properties.clone());
        properties.extend(config.overrides);
        if let Some(prefix) = properties.get("prefix").filter(|p| !p.is_empty()) {
            client.base = format!("{}/v1/{}", client.settings.uri, prefix);
        }
        client.endpoints = config.endpoints.map(|e| e.into_iter().collect());
        client.properties = properties;
        Ok(client)
    }

    async fn authenticate(&self) -> LakeResult<()> {
        let token = match (&self.settings.token, &self.settings.credential) {
            (Some(token), _) => token.clone(),
            (None, Some(credential)) => {
                let (id, secret) = credential.split_once(':').unwrap_or(("", credential));
                let response = self
                    .http
                    .post(format!("{}/v1/oauth/tokens", self.settings.uri))
                    .form(&[
                        ("grant_type", "client_credentials"),
                        ("client_id", id),
                        ("client_secret", secret),
                        ("scope", "catalog"),
                    ])
                    .send()
                    .await
                    .map_err(|e| transport("token request", e))?;
                let body: Value = classify("token request", response)
                    .await?
                    .json()
                    .await
                    .map_err(|e| {
                        LakeError::new(ErrorKind::Rejected, "unreadable token response")
                            .with_source(e)
                    })?;
                body["access_token"]
                    .as_str()
                    .ok_or_else(|| {
                        LakeError::new(
                            ErrorKind::Rejected,
                            "the token response has no access_token",
                        )
                    })?
                    .to_string()
            }
            (None, None) => return Ok(()),
        };
        *self.token.write().await = Some(token);
        Ok(())
    }

    async fn authorize(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match self.token.read().await.as_ref() {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Sends a request built by `build`; on 401 with OAuth2 credentials, fetches a new token
    /// once and resends (a 401 changed nothing).
    async fn send(
        &self,
        what: &str,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> LakeResult<reqwest::Response> {
        let response = self
            .authorize(build())
            .await
            .send()
            .await
            .map_err(|e| transport(what, e))?;
        if response.status() == reqwest::StatusCode::UNAUTHORIZED
            && self.settings.credential.is_some()
        {
            self.authenticate().await?;
            let retry = self
                .authorize(build())
                .await
                .send()
                .await
                .map_err(|e| transport(what, e))?;
            return classify(what, retry).await;
        }
        classify(what, response).await
    }

    /// Whether the catalog advertises the atomic multi-table commit.
    pub fn supports_transactions(&self) -> bool {
        self.endpoints
            .as_ref()
            .is_some_and(|e| e.contains(TRANSACTIONS_ENDPOINT))
    }

    fn table_url(&self, ident: &TableIdent) -> String {
        format!(
            "{}/namespaces/{}/tables/{}",
            self.base,
            encode_namespace(ident),
            encode(ident.name())
        )
    }

    fn file_io(&self, table_config: &HashMap<String, String>) -> FileIO {
        let mut props = self.properties.clone();
        props.extend(table_config.clone());
        props.extend(self.settings.io_properties.clone());
        FileIOBuilder::new(Arc::new(OpenDalResolvingStorageFactory::new()))
            .with_props(props)
            .build()
    }

    fn loaded(&self, ident: TableIdent, result: LoadTableResult) -> LoadedTable {
        LoadedTable {
            io: self.file_io(&result.config),
            ident,
            metadata_location: result.metadata_location,
            metadata: result.metadata,
        }
    }

    /// Creates a namespace; an existing one is fine.
    pub async fn ensure_namespace(&self, namespace: &[&str]) -> LakeResult<()> {
        let url = format!("{}/namespaces", self.base);
        let body = json!({ "namespace": namespace });
        match self
            .send("create namespace", || self.http.post(&url).json(&body))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ErrorKind::Conflict => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Creates a table.
    pub async fn create_table(
        &self,
        ident: &TableIdent,
        request: &CreateTableRequest,
    ) -> LakeResult<LoadedTable> {
        let url = format!(
            "{}/namespaces/{}/tables",
            self.base,
            encode_namespace(ident)
        );
        let response = self
            .send("create table", || self.http.post(&url).json(request))
            .await?;
        let result: LoadTableResult = response.json().await.map_err(|e| {
            LakeError::new(ErrorKind::Rejected, "unreadable create-table response").with_source(e)
        })?;
        Ok(self.loaded(ident.clone(), result))
    }

    /// Loads a table's current metadata.
    pub async fn load_table(&self, ident: &TableIdent) -> LakeResult<LoadedTable> {
        let url = self.table_url(ident);
        let response = self.send("load table", || self.http.get(&url)).await?;
        let result: LoadTableResult = response.json().await.map_err(|e| {
            LakeError::new(ErrorKind::Rejected, "unreadable load-table response").with_source(e)
        })?;
        Ok(self.loaded(ident.clone(), result))
    }

    /// Commits changes to one table.
    pub async fn commit_table(&self, commit: &TableCommit) -> LakeResult<()> {
        let url = self.table_url(&commit.ident);
        let body = CommitTableRequest {
            identifier: Some(commit.ident.clone()),
            requirements: commit.requirements.clone(),
            updates: commit.updates.clone(),
        };
        self.send("commit table", || self.http.post(&url).json(&body))
            .await?;
        Ok(())
    }

    /// GETs a listing, following `next-page-token` to the end; returns the array under `key`
    /// of every page.
    async fn list_pages(
        &self,
        what: &str,
        url: &str,
        query: &[(&str, String)],
        key: &str,
    ) -> LakeResult<Vec<Value>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut params = query.to_vec();
            if let Some(t) = &token {
                params.push(("pageToken", t.clone()));
            }
            let page: Value = self
                .send(what, || self.http.get(url).query(&params))
                .await?
                .json()
                .await
                .map_err(|e| {
                    LakeError::new(ErrorKind::Rejected, format!("unreadable {what} response"))
                        .with_source(e)
                })?;
            if let Some(items) = page[key].as_array() {
                out.extend(items.iter().cloned());
            }
            match page["next-page-token"].as_str().filter(|t| !t.is_empty()) {
                Some(next) => token = Some(next.to_string()),
                None => return Ok(out),
            }
        }
    }

    /// Every namespace, nested ones included (each as its parts).
    pub async fn list_namespaces(&self) -> LakeResult<Vec<Vec<String>>> {
        let url = format!("{}/namespaces", self.base);
        let mut all = Vec::new();
        let mut pending: Vec<Option<Vec<String>>> = vec![None];
        while let Some(parent) = pending.pop() {
            let query: Vec<(&str, String)> = parent
                .iter()
                .map(|p| ("parent", p.join("\u{1f}")))
                .collect();
            for item in self
                .list_pages("list namespaces", &url, &query, "namespaces")
                .await?
            {
                let parts: Vec<String> = item
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|p| p.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                // A catalog that ignores `parent` answers with the same level again.
                if parts.is_empty() || all.contains(&parts) {
                    continue;
                }
                all.push(parts.clone());
                pending.push(Some(parts));
            }
        }
        Ok(all)
    }

    /// The tables of one namespace.
    pub async fn list_tables(&self, namespace: &[String]) -> LakeResult<Vec<TableIdent>> {
        let url = format!(
            "{}/namespaces/{}/tables",
            self.base,
            encode(&namespace.join("\u{1f}"))
        );
        self.list_pages("list tables", &url, &[], "identifiers")
            .await?
            .into_iter()
            .map(|item| {
                serde_json::from_value::<TableIdent>(item).map_err(|e| {
                    LakeError::new(ErrorKind::Rejected, "unreadable table identifier")
                        .with_source(e)
                })
            })
            .collect()
    }

    /// Renames a table (`tables/rename`); its history, markers included, goes with it.
    pub async fn rename_table(&self, from: &TableIdent, to: &TableIdent) -> LakeResult<()> {
        let url = format!("{}/tables/rename", self.base);
        let body = json!({ "source": from, "destination": to });
        self.send("rename table", || self.http.post(&url).json(&body))
            .await?;
        Ok(())
    }

    /// Commits changes to several tables atomically (`transactions/commit`).
    pub async fn commit_transaction(&self, commits: &[TableCommit]) -> LakeResult<()> {
        let url = format!("{}/transactions/commit", self.base);
        let changes: Vec<CommitTableRequest> = commits
            .iter()
            .map(|c| CommitTableRequest {
                identifier: Some(c.ident.clone()),
                requirements: c.requirements.clone(),
                updates: c.updates.clone(),
            })
            .collect();
        let body = json!({ "table-changes": changes });
        self.send("commit transaction", || self.http.post(&url).json(&body))
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_keep_spaces_pluses_and_separators() {
        assert_eq!(encode("a b+c/d"), "a%20b%2Bc%2Fd");
        let ident = TableIdent::from_strs(["sales", "eu west", "orders"]).unwrap();
        assert_eq!(encode_namespace(&ident), "sales%1Feu%20west");
    }
}
