//! `floe-catalog`'s settings: the TOML file (`catalog/catalog.toml` is the example), command-line
//! flags that override it, and the environment for credentials.
//!
//! Parse, validate, build: the file is read into raw serde structs that refuse unknown fields;
//! validation collects **every** problem with its file:line:col; the result is a typed
//! [`CatalogConfig`]. Secrets (tokens, client secrets, S3 keys) are held in types whose `Debug`
//! hides them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use crate::auth::{Auth, Client, Secret};
use crate::warehouse::S3Settings;

/// Where the catalog keeps its pointers.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// A SQLite database file, or `:memory:`.
    Sqlite(PathBuf),
    /// A Postgres connection URL.
    Postgres(String),
}

impl std::fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sqlite(path) => write!(f, "sqlite://{}", path.display()),
            // The URL may carry a password.
            Self::Postgres(url) => match url::Url::parse(url) {
                Ok(mut u) => {
                    if u.password().is_some() {
                        let _ = u.set_password(Some("<redacted>"));
                    }
                    write!(f, "{u}")
                }
                Err(_) => f.write_str("postgres://<unparsable>"),
            },
        }
    }
}

impl StoreUrl {
    /// Parses `sqlite:///abs/path.db`, `sqlite://rel/path.db`, `sqlite::memory:` or
    /// `postgres://…` / `postgresql://…`.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            return Ok(Self::Postgres(s.to_string()));
        }
        if let Some(rest) = s.strip_prefix("sqlite:") {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(
                    "a sqlite store needs a file path, e.g. sqlite:///var/lib/floe/catalog.db"
                        .into(),
                );
            }
            return Ok(Self::Sqlite(PathBuf::from(path)));
        }
        Err(format!(
            "store {s:?} is not supported; use sqlite:///path/to/catalog.db or postgres://user@host/db"
        ))
    }
}

/// The validated settings of a catalog server.
#[derive(Debug, Clone)]
pub struct CatalogConfig {
    /// The catalog's name: the JDBC `catalog_name` and the REST URL prefix.
    pub name: String,
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Warehouse root URL (`file:///…` or `s3://bucket/prefix`).
    pub warehouse: String,
    /// Pointer store.
    pub store: StoreUrl,
    /// Serve without authentication on a non-loopback address.
    pub allow_anonymous: bool,
    /// Largest number of Postgres connections.
    pub max_db_connections: usize,
    /// S3 settings for an `s3://` warehouse.
    pub s3: S3Settings,
    /// Authentication.
    pub auth: Auth,
}

/// The raw TOML file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    /// Format version of this file; must be 1.
    version: Option<Spanned<i64>>,
    /// Catalog name (URL prefix and JDBC `catalog_name`); default `floe`.
    name: Option<Spanned<String>>,
    /// Listen address; default `127.0.0.1:8181`.
    listen: Option<Spanned<String>>,
    /// Warehouse URL or absolute path.
    warehouse: Option<Spanned<String>>,
    /// Store URL.
    store: Option<Spanned<String>>,
    /// Allow serving without auth beyond loopback.
    allow_anonymous: Option<bool>,
    /// Postgres pool size; default 16.
    max_db_connections: Option<Spanned<i64>>,
    /// S3 settings.
    #[serde(default)]
    s3: RawS3,
    /// Authentication settings.
    #[serde(default)]
    auth: RawAuth,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawS3 {
    /// Endpoint for S3-compatible storage (MinIO, moto).
    endpoint: Option<String>,
    /// Region.
    region: Option<String>,
    /// Path-style addressing.
    path_style: Option<bool>,
    /// Access key id (prefer `AWS_ACCESS_KEY_ID`).
    access_key_id: Option<String>,
    /// Secret access key (prefer `AWS_SECRET_ACCESS_KEY`).
    secret_access_key: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuth {
    /// Static bearer tokens.
    #[serde(default)]
    tokens: Vec<String>,
    /// OAuth2 clients allowed to obtain tokens.
    #[serde(default)]
    clients: Vec<RawClient>,
    /// Key signing issued tokens; random per process when unset.
    signing_key: Option<String>,
    /// Lifetime of issued tokens in seconds; default 3600.
    token_ttl_secs: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClient {
    /// Client id.
    id: String,
    /// Client secret.
    secret: String,
}

/// Values given on the command line; each overrides the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--name`.
    pub name: Option<String>,
    /// `--listen`.
    pub listen: Option<String>,
    /// `--warehouse`.
    pub warehouse: Option<String>,
    /// `--store`.
    pub store: Option<String>,
    /// `--allow-anonymous`.
    pub allow_anonymous: bool,
}

use floe_config::Source;
pub use floe_config::{ConfigErrors, ConfigProblem};

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Turns a plain absolute path into a `file://` URL; URLs pass through.
fn warehouse_url(s: &str) -> Result<String, String> {
    if s.contains("://") {
        return Ok(s.trim_end_matches('/').to_string());
    }
    let path = Path::new(s);
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| format!("cannot resolve relative warehouse path: {e}"))?
            .join(path)
    };
    url::Url::from_directory_path(&absolute)
        .map(|u| u.to_string().trim_end_matches('/').to_string())
        .map_err(|()| format!("warehouse path {s:?} is not valid"))
}

impl CatalogConfig {
    /// Loads the optional file, applies the overrides and the environment, and validates.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigErrors> {
        let text = match file {
            Some(path) => floe_config::read(path)?,
            None => String::new(),
        };
        Self::from_toml(file, &text, overrides)
    }

    /// Validates configuration text (`file` names it in error messages).
    pub fn from_toml(
        file: Option<&Path>,
        text: &str,
        overrides: &Overrides,
    ) -> Result<Self, ConfigErrors> {
        let src = Source { file, text };
        let raw: RawFile = floe_config::parse(src)?;
        let mut problems = Vec::new();
        floe_config::check_version(src, raw.version.as_ref(), &mut problems);
        let mut problem = |place: String, message: String| {
            problems.push(ConfigProblem { place, message });
        };

        let name = match (&overrides.name, &raw.name) {
            (Some(n), _) => (n.clone(), "--name".to_string()),
            (None, Some(n)) => (n.get_ref().clone(), src.place(Some(n.span()))),
            (None, None) => ("floe".to_string(), String::new()),
        };
        let name_ok = !name.0.is_empty()
            && name.0.len() <= 64
            && name
                .0
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !name_ok {
            problem(
                name.1.clone(),
                format!(
                    "name {:?} must be 1-64 letters, digits, `-` or `_` (it is a URL path segment)",
                    name.0
                ),
            );
        }

        let listen = match (&overrides.listen, &raw.listen) {
            (Some(l), _) => (l.clone(), "--listen".to_string()),
            (None, Some(l)) => (l.get_ref().clone(), src.place(Some(l.span()))),
            (None, None) => ("127.0.0.1:8181".to_string(), String::new()),
        };
        let listen_addr = match listen.0.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                problem(
                    listen.1.clone(),
                    format!("listen address {:?} is not IP:PORT", listen.0),
                );
                None
            }
        };

        let warehouse = match (&overrides.warehouse, &raw.warehouse) {
            (Some(w), _) => (w.clone(), "--warehouse".to_string()),
            (None, Some(w)) => (w.get_ref().clone(), src.place(Some(w.span()))),
            (None, None) => ("warehouse".to_string(), String::new()),
        };
        let warehouse_url = match warehouse_url(&warehouse.0) {
            Ok(url)
                if url.starts_with("file://")
                    || url.starts_with("s3://")
                    || url.starts_with("s3a://") =>
            {
                Some(url)
            }
            Ok(url) => {
                problem(
                    warehouse.1.clone(),
                    format!("warehouse {url:?} must be file:// or s3://"),
                );
                None
            }
            Err(e) => {
                problem(warehouse.1.clone(), e);
                None
            }
        };

        let store = match (&overrides.store, &raw.store) {
            (Some(s), _) => (s.clone(), "--store".to_string()),
            (None, Some(s)) => (s.get_ref().clone(), src.place(Some(s.span()))),
            (None, None) => ("sqlite://catalog.db".to_string(), String::new()),
        };
        let store_url = match StoreUrl::parse(&store.0) {
            Ok(s) => Some(s),
            Err(e) => {
                problem(store.1.clone(), e);
                None
            }
        };

        let max_db_connections = match &raw.max_db_connections {
            Some(n) if !(1..=1024).contains(n.get_ref()) => {
                problem(
                    src.place(Some(n.span())),
                    "max_db_connections must be between 1 and 1024".into(),
                );
                16
            }
            Some(n) => *n.get_ref() as usize,
            None => 16,
        };

        let token_ttl_secs = match &raw.auth.token_ttl_secs {
            Some(t) if *t.get_ref() < 60 => {
                problem(
                    src.place(Some(t.span())),
                    "token_ttl_secs must be at least 60".into(),
                );
                3600
            }
            Some(t) => *t.get_ref() as u64,
            None => 3600,
        };

        let mut tokens: Vec<Secret> = raw.auth.tokens.iter().cloned().map(Secret).collect();
        if let Some(list) = env("FLOE_CATALOG_TOKENS") {
            tokens.extend(
                list.split(',')
                    .map(|t| Secret(t.trim().to_string()))
                    .filter(|t| !t.0.is_empty()),
            );
        }
        let mut clients: Vec<Client> = raw
            .auth
            .clients
            .iter()
            .map(|c| Client {
                id: c.id.clone(),
                secret: Secret(c.secret.clone()),
            })
            .collect();
        if let Some(list) = env("FLOE_CATALOG_CLIENTS") {
            for entry in list.split(',').filter(|e| !e.trim().is_empty()) {
                match entry.trim().split_once(':') {
                    Some((id, secret)) if !id.is_empty() && !secret.is_empty() => {
                        clients.push(Client {
                            id: id.to_string(),
                            secret: Secret(secret.to_string()),
                        })
                    }
                    // Never echo the entry: it holds a secret.
                    _ => problem(
                        "FLOE_CATALOG_CLIENTS".into(),
                        "entries must look like id:secret".into(),
                    ),
                }
            }
        }
        if tokens.iter().any(|t| t.0.len() < 16) {
            problem(
                "auth.tokens".into(),
                "tokens must be at least 16 characters".into(),
            );
        }
        let signing_key = raw
            .auth
            .signing_key
            .clone()
            .or_else(|| env("FLOE_CATALOG_SIGNING_KEY"))
            .map(Secret);
        let auth = Auth::new(tokens, clients, signing_key, token_ttl_secs);

        let allow_anonymous = overrides.allow_anonymous || raw.allow_anonymous.unwrap_or(false);
        if let Some(addr) = listen_addr
            && !addr.ip().is_loopback()
            && !auth.enabled()
            && !allow_anonymous
        {
            problem(
                if listen.1.is_empty() {
                    "--listen".into()
                } else {
                    listen.1.clone()
                },
                format!(
                    "refusing to listen on {addr} without authentication; configure [auth] \
                     tokens or clients, or pass --allow-anonymous"
                ),
            );
        }

        let s3 = S3Settings {
            endpoint: raw
                .s3
                .endpoint
                .clone()
                .or_else(|| env("FLOE_S3_ENDPOINT"))
                .or_else(|| env("AWS_ENDPOINT_URL_S3"))
                .or_else(|| env("AWS_ENDPOINT_URL")),
            region: raw
                .s3
                .region
                .clone()
                .or_else(|| env("AWS_REGION"))
                .or_else(|| env("AWS_DEFAULT_REGION")),
            path_style: raw.s3.path_style.unwrap_or_else(|| {
                env("FLOE_S3_PATH_STYLE").is_some_and(|v| v == "true" || v == "1")
            }),
            access_key_id: raw
                .s3
                .access_key_id
                .clone()
                .or_else(|| env("AWS_ACCESS_KEY_ID")),
            secret_access_key: raw
                .s3
                .secret_access_key
                .clone()
                .or_else(|| env("AWS_SECRET_ACCESS_KEY")),
            session_token: env("AWS_SESSION_TOKEN"),
        };

        if !problems.is_empty() {
            return Err(ConfigErrors(problems));
        }
        let (Some(listen), Some(warehouse), Some(store)) = (listen_addr, warehouse_url, store_url)
        else {
            unreachable!("a missing value was reported as a problem");
        };
        Ok(Self {
            name: name.0,
            listen,
            warehouse,
            store,
            allow_anonymous,
            max_db_connections,
            s3,
            auth,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<CatalogConfig, ConfigErrors> {
        CatalogConfig::from_toml(Some(Path::new("catalog.toml")), text, &Overrides::default())
    }

    #[test]
    fn a_full_file_validates() {
        let c = load(
            "version = 1\nname = \"lake\"\nlisten = \"127.0.0.1:9000\"\n\
             warehouse = \"s3://bucket/wh\"\nstore = \"postgres://u:pw@db/cat\"\n\
             [s3]\nendpoint = \"http://127.0.0.1:9001\"\npath_style = true\n",
        )
        .unwrap();
        assert_eq!(c.name, "lake");
        assert_eq!(c.warehouse, "s3://bucket/wh");
        assert!(c.s3.path_style);
        assert_eq!(c.store, StoreUrl::Postgres("postgres://u:pw@db/cat".into()));
        assert!(
            !format!("{c:?}").contains(":pw@"),
            "password leaked into Debug"
        );
    }

    #[test]
    fn every_problem_is_reported_with_its_position() {
        let err =
            load("version = 2\nname = \"bad name\"\nlisten = \"nowhere\"\nstore = \"mysql://x\"\n")
                .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("catalog.toml:1:11: version 2 is not supported"),
            "{text}"
        );
        assert!(text.contains("catalog.toml:2:8: name"), "{text}");
        assert!(text.contains("catalog.toml:3:10: listen address"), "{text}");
        assert!(text.contains("catalog.toml:4:9: store"), "{text}");
        assert_eq!(err.0.len(), 4);
    }

    #[test]
    fn unknown_fields_and_syntax_errors_point_at_the_spot() {
        let err = load("version = 1\nlisten_addr = \"x\"\n").unwrap_err();
        assert!(err.to_string().starts_with("catalog.toml:2:1:"), "{err}");
        let err = load("version = 1\nname = \n").unwrap_err();
        assert!(err.to_string().starts_with("catalog.toml:2:"), "{err}");
    }

    #[test]
    fn refuses_public_address_without_auth() {
        let err = load("version = 1\nlisten = \"0.0.0.0:8181\"\n").unwrap_err();
        assert!(err.to_string().contains("without authentication"), "{err}");
        let ok = CatalogConfig::from_toml(
            None,
            "listen = \"0.0.0.0:8181\"",
            &Overrides {
                allow_anonymous: true,
                ..Overrides::default()
            },
        );
        assert!(ok.is_ok());
        let with_auth = load(
            "version = 1\nlisten = \"0.0.0.0:8181\"\n[auth]\ntokens = [\"0123456789abcdef0\"]\n",
        );
        assert!(with_auth.is_ok());
    }

    #[test]
    fn the_example_file_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("catalog.toml");
        let c = CatalogConfig::load(Some(&path), &Overrides::default()).unwrap();
        assert_eq!(c.name, "floe");
        assert_eq!(c.listen.to_string(), "127.0.0.1:8181");
        assert_eq!(c.store, StoreUrl::Sqlite("/var/lib/floe/catalog.db".into()));
    }

    #[test]
    fn store_urls() {
        assert_eq!(
            StoreUrl::parse("sqlite:///var/c.db").unwrap(),
            StoreUrl::Sqlite("/var/c.db".into())
        );
        assert_eq!(
            StoreUrl::parse("sqlite::memory:").unwrap(),
            StoreUrl::Sqlite(":memory:".into())
        );
        assert!(StoreUrl::parse("sqlite://").is_err());
        assert!(StoreUrl::parse("redis://x").is_err());
    }
}
