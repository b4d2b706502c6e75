//! Sinks beyond Iceberg at run time: each `[sinks.<id>]` mirrors the table one stream lands
//! in to a [`Mirror`] (a Kafka topic, Prometheus), every snapshot the job committed to it
//! once, in sequence order, after its commit (ADR 0010).
//!
//! * **Who delivers.** The writer holding the sink's home partition
//!   ([`crate::mirror_config`]) and no other, whichever replica committed the rows: the
//!   mirror's own fencing (a Kafka `transactional.id`) stops a writer that lost it.
//! * **When.** A round starts after every settled commit and every barrier (another replica
//!   may have committed), and after recovery: it claims the
//!   mirror when this writer has not yet, then delivers every snapshot of the job in the
//!   table newer than the newest one delivered, oldest first. Rounds run beside the job loop;
//!   one at a time. A failed round is logged, counted and retried after the next commit,
//!   claiming again: what the mirror holds is read afresh.
//! * **What was delivered** is the mirror's own answer ([`Mirror::claim`]), or the job's
//!   position entry `<home>#sink:<id>` when that is newer (a topic whose retention dropped
//!   everything). The entry goes into every checkpoint, so expiry keeps each snapshot not yet
//!   delivered ([`floe_lake::marker::MIRRORED`]).

use std::sync::Arc;

use floe_core::{Delivery, Mirror, Positions};
use floe_lake::marker::{MIRRORED, job_snapshots, mirrored_value, parse_mirrored};
use floe_lake::read::read_added;
use floe_lake::rest::CatalogClient;
use iceberg::TableIdent;

use crate::metrics::JobMetrics;

/// A `[sinks.<id>]` as the runtime needs it.
#[derive(Clone)]
pub struct MirrorSink {
    /// The sink's id.
    pub id: String,
    /// The stream whose table it mirrors.
    pub stream: String,
    /// Its home partition (`None`: the reader's first partition).
    pub home: Option<String>,
    /// Where it delivers.
    pub target: Arc<dyn Mirror>,
}

impl std::fmt::Debug for MirrorSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MirrorSink")
            .field("id", &self.id)
            .field("stream", &self.stream)
            .field("home", &self.home)
            .field("target", &self.target.describe())
            .finish()
    }
}

/// A sink and what this writer knows of it.
#[derive(Debug)]
struct Held {
    sink: MirrorSink,
    /// The home partition, resolved.
    home: String,
    /// Whether this writer holds the home partition.
    held: bool,
    /// Whether this writer claimed the mirror.
    claimed: bool,
    /// The table's UUID and the newest sequence delivered, as far as known.
    delivered: Option<(String, i64)>,
}

/// What a round learned of one sink.
#[derive(Debug)]
struct Outcome {
    index: usize,
    claimed: bool,
    delivered: Option<(String, i64)>,
    rows: u64,
    error: Option<String>,
}

/// One sink's work in a round.
struct Work {
    index: usize,
    id: String,
    target: Arc<dyn Mirror>,
    table: TableIdent,
    claimed: bool,
    delivered: Option<(String, i64)>,
}

/// The job's mirrors.
#[derive(Debug, Default)]
pub(crate) struct Mirrors {
    sinks: Vec<Held>,
    round: Option<tokio::task::JoinHandle<Vec<Outcome>>>,
    /// A commit landed (or the writer recovered) since the last round started.
    due: bool,
}

impl Mirrors {
    pub(crate) fn new(sinks: Vec<MirrorSink>) -> Self {
        Self {
            sinks: sinks
                .into_iter()
                .map(|sink| Held {
                    sink,
                    home: String::new(),
                    held: false,
                    claimed: false,
                    delivered: None,
                })
                .collect(),
            round: None,
            due: true,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.sinks.is_empty()
    }

    /// After seeking: what the job's newest commit says the sinks delivered. Waits for a
    /// round in flight first.
    pub(crate) async fn recover(&mut self, committed: Option<&Positions>, metrics: &JobMetrics) {
        self.finish(metrics).await;
        for h in &mut self.sinks {
            let suffix = format!("{MIRRORED}{}", h.sink.id);
            let recorded = committed
                .and_then(|p| p.iter().find(|(k, _)| k.ends_with(&suffix)))
                .and_then(|(_, v)| parse_mirrored(v))
                .map(|(uuid, sequence)| (uuid.to_string(), sequence));
            h.delivered = newer(h.delivered.take(), recorded);
        }
    }

    /// The position entries of the sinks this writer delivers.
    pub(crate) fn positions(&self) -> Positions {
        self.sinks
            .iter()
            .filter(|h| h.held)
            .filter_map(|h| {
                let (uuid, sequence) = h.delivered.as_ref()?;
                Some((entry(&h.home, &h.sink.id), mirrored_value(uuid, *sequence)))
            })
            .collect()
    }

    /// Takes a finished round's outcome, if any.
    pub(crate) async fn collect(&mut self, metrics: &JobMetrics) {
        if self.round.as_ref().is_some_and(|r| r.is_finished()) {
            self.finish(metrics).await;
        }
    }

    /// Waits for the round in flight, if any, and takes its outcome.
    pub(crate) async fn finish(&mut self, metrics: &JobMetrics) {
        let Some(round) = self.round.take() else {
            return;
        };
        let outcomes = match round.await {
            Ok(outcomes) => outcomes,
            Err(e) => {
                tracing::warn!(error = %e, "a sink's delivery round failed");
                return;
            }
        };
        for o in outcomes {
            let h = &mut self.sinks[o.index];
            h.claimed = o.claimed;
            h.delivered = newer(h.delivered.take(), o.delivered);
            metrics
                .mirror_rows
                .with_label_values(&[&h.sink.id])
                .inc_by(o.rows);
            if let Some(error) = o.error {
                metrics.mirror_errors.with_label_values(&[&h.sink.id]).inc();
                tracing::warn!(sink = %h.sink.id, %error, "delivery failed; retried after the next commit");
            }
        }
    }

    /// Whether a round would start now (one is due, none is in flight).
    pub(crate) fn ready(&self) -> bool {
        self.due && self.round.is_none() && !self.sinks.is_empty()
    }

    /// Something may wait to be delivered (a commit landed).
    pub(crate) fn due(&mut self) {
        self.due = true;
    }

    /// Starts a round over the sinks whose home is in `held` when one is due and none is in
    /// flight; `first_partition` is the reader's first, `table` names each stream's table
    /// once it exists.
    pub(crate) fn start(
        &mut self,
        client: &CatalogClient,
        job: &str,
        held: &std::collections::BTreeSet<String>,
        first_partition: &str,
        table: impl Fn(&str) -> Option<TableIdent>,
    ) {
        if self.round.is_some() || !self.due {
            return;
        }
        self.due = false;
        for h in &mut self.sinks {
            h.home = h
                .sink
                .home
                .clone()
                .unwrap_or_else(|| first_partition.to_string());
            let was = h.held;
            h.held = !h.home.is_empty() && held.contains(&h.home);
            if was && !h.held {
                // The writer that holds it now claims it (and fences this one).
                h.claimed = false;
                tracing::info!(sink = %h.sink.id, home = %h.home, "another writer delivers this sink now");
            }
        }
        let work: Vec<Work> = self
            .sinks
            .iter()
            .enumerate()
            .filter(|(_, h)| h.held)
            .filter_map(|(index, h)| {
                Some(Work {
                    index,
                    id: h.sink.id.clone(),
                    target: h.sink.target.clone(),
                    table: table(&h.sink.stream)?,
                    claimed: h.claimed,
                    delivered: h.delivered.clone(),
                })
            })
            .collect();
        if work.is_empty() {
            return;
        }
        let (client, job) = (client.clone(), job.to_string());
        self.round = Some(tokio::spawn(async move {
            let mut outcomes = Vec::with_capacity(work.len());
            for w in work {
                outcomes.push(deliver(&client, &job, w).await);
            }
            outcomes
        }));
    }
}

/// The position entry of sink `id` homed in `home`.
fn entry(home: &str, id: &str) -> String {
    format!("{home}{MIRRORED}{id}")
}

/// The newer of two delivered marks (a mark of another table — a table dropped and created
/// again — gives way to the one read last).
fn newer(a: Option<(String, i64)>, b: Option<(String, i64)>) -> Option<(String, i64)> {
    match (a, b) {
        (Some(a), Some(b)) if a.0 == b.0 => Some(if b.1 > a.1 { b } else { a }),
        (a, b) => b.or(a),
    }
}

/// One sink's share of a round: claim if needed, then deliver every newer snapshot.
async fn deliver(client: &CatalogClient, job: &str, w: Work) -> Outcome {
    let mut outcome = Outcome {
        index: w.index,
        claimed: w.claimed,
        delivered: w.delivered.clone(),
        rows: 0,
        error: None,
    };
    if let Err(e) = deliver_into(client, job, &w, &mut outcome).await {
        // The next round claims again, reading afresh what the mirror holds (ADR 0010).
        outcome.error = Some(e);
        outcome.claimed = false;
    }
    outcome
}

async fn deliver_into(
    client: &CatalogClient,
    job: &str,
    w: &Work,
    outcome: &mut Outcome,
) -> Result<(), String> {
    let lake = |e: floe_lake::LakeError| e.to_string();
    let table = client.load_table(&w.table).await.map_err(lake)?;
    let uuid = table.metadata.uuid().to_string();
    if !outcome.claimed {
        let held = w
            .target
            .claim()
            .await
            .map_err(|e| format!("cannot claim {}: {e}", w.target.describe()))?;
        outcome.claimed = true;
        outcome.delivered = newer(outcome.delivered.take(), held);
        tracing::info!(
            sink = %w.id,
            target = %w.target.describe(),
            delivered = ?outcome.delivered.as_ref().map(|d| d.1),
            "sink claimed"
        );
    }
    let floor = match &outcome.delivered {
        Some((id, sequence)) if *id == uuid => *sequence,
        _ => i64::MIN,
    };
    let mut snapshots = job_snapshots(&table.metadata, job);
    snapshots.reverse();
    for (snapshot_id, sequence) in snapshots.into_iter().filter(|(_, s)| *s > floor) {
        let batches = read_added(&table, snapshot_id).await.map_err(lake)?;
        let delivery = Delivery {
            sequence,
            snapshot_id,
            table_uuid: uuid.clone(),
            batches,
        };
        let rows = delivery.rows() as u64;
        if rows > 0 {
            w.target.deliver(delivery).await.map_err(|e| {
                format!(
                    "cannot deliver snapshot {snapshot_id} (sequence {sequence}) to {}: {e}",
                    w.target.describe()
                )
            })?;
        }
        outcome.rows += rows;
        outcome.delivered = Some((uuid.clone(), sequence));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newer_mark_of_the_same_table_wins() {
        let mark = |t: &str, s: i64| Some((t.to_string(), s));
        assert_eq!(newer(mark("a", 3), mark("a", 5)), mark("a", 5));
        assert_eq!(newer(mark("a", 7), mark("a", 5)), mark("a", 7));
        assert_eq!(newer(None, mark("a", 5)), mark("a", 5));
        assert_eq!(newer(mark("a", 5), None), mark("a", 5));
        // A table made again: what was read last counts.
        assert_eq!(newer(mark("a", 9), mark("b", 2)), mark("b", 2));
    }
}
