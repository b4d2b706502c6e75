//! The daemons' shared state — which daemon holds which table, and when each task last ran on
//! each table — kept in the catalog itself, so any number of `floe-maintenance` daemons
//! pointed at one catalog coordinate without another service.
//!
//! The state lives in the summary of the current snapshot of one Iceberg table (by default
//! `floe_maintenance.state`, which holds no rows). Every change is a new, empty snapshot that
//! asserts `main` still points at the snapshot it read: the catalog's compare-and-swap on the
//! table's head makes every change linearizable. A lease is `owner expires-at-ms`; a daemon
//! takes a table only when no unexpired lease of another daemon is on it, renews it while
//! working, and removes it (recording when the task ran) when done. A daemon that dies leaves
//! a lease that others take over once it expires.
//!
//! Snapshots of the state table accumulate one per change; the daemon trims them itself.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use floe_lake::commit::{PreparedCommit, RetryPolicy, TableOperation, commit_operation};
use floe_lake::expire::{ExpireSnapshots, expire_snapshots};
use floe_lake::rest::{CatalogClient, LoadedTable};
use floe_lake::snapshot::{Delta, prepare_row_delta};
use floe_lake::{ErrorKind, LakeResult};
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use iceberg::{NamespaceIdent, TableIdent};
use iceberg_catalog_rest::CreateTableRequest;

const LEASE: &str = "floe.maintenance.lease.";
const LAST_RUN: &str = "floe.maintenance.last-run.";

pub use floe_process::now_ms;

/// A lease on one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The daemon holding it.
    pub owner: String,
    /// When it lapses unless renewed (ms since the epoch).
    pub expires_ms: i64,
}

/// The state as of one snapshot of the state table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Leases by table (`ns.table`).
    pub leases: BTreeMap<String, Lease>,
    /// Start time (ms) of the last run, by (`ns.table`, task name).
    pub last_runs: BTreeMap<(String, String), i64>,
}

impl State {
    fn from_table(table: &LoadedTable) -> Self {
        let mut state = State::default();
        let Some(snapshot) = table.metadata.current_snapshot() else {
            return state;
        };
        for (key, value) in &snapshot.summary().additional_properties {
            if let Some(name) = key.strip_prefix(LEASE) {
                if let Some((owner, expires)) = value.rsplit_once(' ')
                    && let Ok(expires_ms) = expires.parse()
                {
                    state.leases.insert(
                        name.to_string(),
                        Lease {
                            owner: owner.to_string(),
                            expires_ms,
                        },
                    );
                }
            } else if let Some(rest) = key.strip_prefix(LAST_RUN)
                && let Some((name, task)) = rest.rsplit_once('/')
                && let Ok(at) = value.parse()
            {
                state
                    .last_runs
                    .insert((name.to_string(), task.to_string()), at);
            }
        }
        state
    }

    fn to_properties(&self) -> std::collections::HashMap<String, String> {
        let mut out = std::collections::HashMap::new();
        for (name, lease) in &self.leases {
            out.insert(
                format!("{LEASE}{name}"),
                format!("{} {}", lease.owner, lease.expires_ms),
            );
        }
        for ((name, task), at) in &self.last_runs {
            out.insert(format!("{LAST_RUN}{name}/{task}"), at.to_string());
        }
        out
    }

    /// The lease on `table` unless it has lapsed at `now_ms`.
    pub fn live_lease(&self, table: &str, now_ms: i64) -> Option<&Lease> {
        self.leases.get(table).filter(|l| l.expires_ms > now_ms)
    }
}

/// One compare-and-swap on the state: `change` edits the state at the current head and says
/// whether it applies. What it decided, and the state it left, are kept in `outcome`.
struct Change<F> {
    change: F,
    outcome: Mutex<Option<(bool, State)>>,
}

impl<F> TableOperation for Change<F>
where
    F: Fn(&mut State) -> bool + Send + Sync,
{
    fn name(&self) -> &'static str {
        "maintenance state change"
    }

    async fn plan(&self, table: &LoadedTable) -> LakeResult<Option<PreparedCommit>> {
        let mut state = State::from_table(table);
        let before = state.clone();
        let applies = (self.change)(&mut state);
        *self.outcome.lock().expect("not poisoned") = Some((applies, state.clone()));
        if !applies || state == before {
            return Ok(None);
        }
        let delta = Delta {
            properties: state.to_properties(),
            ..Delta::default()
        };
        Ok(Some(prepare_row_delta(table, &delta).await?.into()))
    }
}

/// The state table and this daemon's identity in it.
#[derive(Debug, Clone)]
pub struct StateTable {
    client: CatalogClient,
    ident: TableIdent,
    owner: String,
    ttl: Duration,
    retry: RetryPolicy,
}

impl StateTable {
    /// Opens the state table `ident`, creating it (and its namespace) if missing. `owner`
    /// names this daemon in leases, which last `ttl` unless renewed.
    pub async fn open(
        client: CatalogClient,
        ident: TableIdent,
        owner: String,
        ttl: Duration,
    ) -> LakeResult<Self> {
        match client.load_table(&ident).await {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {
                let parts = ident.namespace().clone().inner();
                let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
                client.ensure_namespace(&parts).await?;
                let schema = Schema::builder()
                    .with_fields(vec![
                        NestedField::optional(1, "note", Type::Primitive(PrimitiveType::String))
                            .into(),
                    ])
                    .build()?;
                let request = CreateTableRequest {
                    name: ident.name().to_string(),
                    location: None,
                    schema,
                    partition_spec: None,
                    write_order: None,
                    stage_create: None,
                    properties: [(
                        "comment".to_string(),
                        "floe-maintenance daemons' leases and last runs, in snapshot summaries"
                            .to_string(),
                    )]
                    .into(),
                };
                match client.create_table(&ident, &request).await {
                    Ok(_) => {}
                    // Another daemon created it first.
                    Err(e) if e.kind() == ErrorKind::Conflict => {}
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
        Ok(Self {
            client,
            ident,
            owner,
            ttl,
            retry: RetryPolicy {
                attempts: 30,
                ..RetryPolicy::default()
            },
        })
    }

    /// The state table's identifier.
    pub fn ident(&self) -> &TableIdent {
        &self.ident
    }

    /// This daemon's name in leases.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The current state.
    pub async fn read(&self) -> LakeResult<State> {
        Ok(State::from_table(
            &self.client.load_table(&self.ident).await?,
        ))
    }

    /// Applies `change` atomically; returns the state it produced if it applied.
    async fn change(
        &self,
        change: impl Fn(&mut State) -> bool + Send + Sync,
    ) -> LakeResult<Option<State>> {
        let op = Change {
            change,
            outcome: Mutex::new(None),
        };
        commit_operation(&self.client, &self.ident, &op, &self.retry).await?;
        let outcome = op.outcome.lock().expect("not poisoned").take();
        Ok(outcome.and_then(|(applies, state)| applies.then_some(state)))
    }

    /// Takes (or extends) the lease on `table` unless another daemon holds it. Returns the
    /// state as of taking it, or `None` if another daemon holds it.
    pub async fn acquire(&self, table: &str) -> LakeResult<Option<State>> {
        let ttl = self.ttl.as_millis() as i64;
        self.change(|state| {
            let now = now_ms();
            if state
                .live_lease(table, now)
                .is_some_and(|l| l.owner != self.owner)
            {
                return false;
            }
            // Drop lapsed leases of anyone while here.
            state.leases.retain(|_, l| l.expires_ms > now);
            state.leases.insert(
                table.to_string(),
                Lease {
                    owner: self.owner.clone(),
                    expires_ms: now + ttl,
                },
            );
            true
        })
        .await
    }

    /// Extends this daemon's lease on `table`; false if it no longer holds it (it lapsed and
    /// another daemon took it).
    pub async fn renew(&self, table: &str) -> LakeResult<bool> {
        Ok(self.acquire(table).await?.is_some())
    }

    /// Renews the lease on `table` every third of its lifetime; returns only when it was lost
    /// (it lapsed and another daemon took it). Race it against the work the lease guards.
    pub async fn hold(&self, table: &str) {
        let every = self.ttl / 3;
        loop {
            tokio::time::sleep(every).await;
            match self.renew(table).await {
                Ok(true) => {}
                Ok(false) => return,
                // The catalog is unreachable: keep working; the lease lasts a while yet.
                Err(error) => tracing::warn!(%table, %error, "could not renew the lease"),
            }
        }
    }

    /// Gives up the lease on `table`, recording that `task` started on it at `started_ms` when
    /// given.
    pub async fn release(&self, table: &str, ran: Option<(&str, i64)>) -> LakeResult<()> {
        self.change(|state| {
            if state
                .leases
                .get(table)
                .is_some_and(|l| l.owner == self.owner)
            {
                state.leases.remove(table);
            }
            if let Some((task, at)) = ran {
                let last = state
                    .last_runs
                    .entry((table.to_string(), task.to_string()))
                    .or_insert(at);
                *last = (*last).max(at);
            }
            true
        })
        .await?;
        Ok(())
    }

    /// Expires the state table's own old snapshots once it has more than `keep` of them.
    pub async fn trim(&self, keep: usize) -> LakeResult<()> {
        let table = self.client.load_table(&self.ident).await?;
        if table.metadata.snapshots().count() <= keep * 2 {
            return Ok(());
        }
        let settings = ExpireSnapshots {
            older_than_ms: now_ms(),
            retain_last: keep,
            protect: Vec::new(),
        };
        expire_snapshots(&self.client, &self.ident, &settings, &self.retry).await?;
        Ok(())
    }
}

/// A name for this daemon: host, process id and a random suffix.
pub fn daemon_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_else(|| "host".to_string());
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}-{}", std::process::id(), &suffix[..8])
}

/// Parses `ns.table` (nested namespaces: `a.b.table`).
pub fn table_ident(name: &str) -> Option<TableIdent> {
    let (namespace, table) = name.rsplit_once('.')?;
    if namespace.is_empty() || table.is_empty() {
        return None;
    }
    let namespace = NamespaceIdent::from_strs(namespace.split('.')).ok()?;
    Some(TableIdent::new(namespace, table.to_string()))
}

/// `ns.table` of an identifier.
pub fn table_name(ident: &TableIdent) -> String {
    format!(
        "{}.{}",
        ident.namespace().clone().inner().join("."),
        ident.name()
    )
}
