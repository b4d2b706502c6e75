//! The committer: every job kind's checkpoints, one commit in flight at a time, exactly once
//! and fenced.
//!
//! * **One commit.** The checkpoint's tables — the anchor (dead-letter) table always, every
//!   other table with something to commit — go in one `transactions/commit` with the marker
//!   `{job, writer, checkpoint, positions}` (`floe_lake::commit::commit_checkpoint_planned`).
//!   Upsert sinks may still be encoding when the commit starts; the commit task waits for
//!   them, so the job reads on meanwhile.
//! * **Fencing.** The positions recorded are planned on the anchor's head inside the commit's
//!   retry loop: if another writer committed any partition this writer holds since this
//!   writer sought it, the checkpoint is dropped ([`Settled::Fenced`]) — a replica that lost
//!   its partitions without noticing never commits them twice, and never moves another
//!   writer's position back.
//! * Only a settled commit's positions may be acknowledged to the source.

use std::time::{Duration, Instant};

use floe_core::{Positions, partition_of_entry};
use floe_lake::commit::{CommitReport, RetryPolicy, commit_checkpoint_planned};
use floe_lake::marker::CommitMarker;
use floe_lake::rest::CatalogClient;
use floe_lake::snapshot::Delta;
use floe_lake::{ErrorKind, LakeError, LakeResult};
use iceberg::TableIdent;
use iceberg::io::FileIO;

use crate::sink::{Closing, SinkOutput};

/// One sink's share of a checkpoint.
pub(crate) struct Part {
    pub(crate) table: TableIdent,
    pub(crate) io: FileIO,
    pub(crate) closing: Closing,
}

/// A checkpoint ready to commit.
pub(crate) struct Checkpoint {
    /// Every sink's output, the anchor first.
    pub(crate) parts: Vec<Part>,
    /// This writer's positions when it sought (or last committed).
    pub(crate) start: Positions,
    /// This writer's positions after everything in the checkpoint.
    pub(crate) current: Positions,
    /// When the barrier was taken.
    pub(crate) began: Instant,
    /// The state epoch whose changes the checkpoint carries (stateful jobs).
    pub(crate) epoch: Option<u64>,
    /// The stateful operators and their fingerprints.
    pub(crate) operators: std::collections::BTreeMap<String, String>,
    /// The streams the job lands and their tables (merged with the committed ones).
    pub(crate) streams: std::collections::BTreeMap<String, String>,
    /// Committed streams to leave out (`--stop-following`).
    pub(crate) forgotten: Vec<String>,
    /// Commit even without changes (the operators' fingerprints or the streams are new).
    pub(crate) force: bool,
}

/// What settling a commit found.
#[derive(Debug)]
pub(crate) enum Settled {
    /// No commit was in flight.
    Nothing,
    /// It committed.
    Committed(Committed),
    /// Another writer moved one of this writer's partitions: everything since this writer
    /// sought is void (the checkpoint's files are deleted).
    Fenced(String),
}

/// A committed checkpoint.
#[derive(Debug)]
pub(crate) struct Committed {
    /// The checkpoint id.
    pub(crate) id: u64,
    /// This writer's positions it committed.
    pub(crate) positions: Positions,
    /// Rows per table (the anchor first).
    pub(crate) rows: Vec<(String, u64)>,
    /// From barrier to committed.
    pub(crate) took: Duration,
    /// The catalog commit alone.
    pub(crate) commit_took: Duration,
    /// Attempts the commit took.
    pub(crate) attempts: u32,
    /// The state epoch it committed.
    pub(crate) epoch: Option<u64>,
    /// The streams and tables it recorded (this writer's view).
    pub(crate) streams: std::collections::BTreeMap<String, String>,
}

type Outcome = (
    LakeResult<(CommitReport, Duration)>,
    Vec<(TableIdent, FileIO, SinkOutput)>,
);

struct InFlight {
    id: u64,
    task: tokio::task::JoinHandle<Outcome>,
    positions: Positions,
    began: Instant,
    epoch: Option<u64>,
    streams: std::collections::BTreeMap<String, String>,
}

/// Commits a job's checkpoints.
pub(crate) struct Committer {
    client: CatalogClient,
    job: String,
    writer: String,
    next_checkpoint: u64,
    in_flight: Option<InFlight>,
}

impl std::fmt::Debug for Committer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Committer")
            .field("job", &self.job)
            .field("writer", &self.writer)
            .finish_non_exhaustive()
    }
}

fn fenced(message: String) -> LakeError {
    LakeError::new(ErrorKind::Fenced, message)
}

/// The positions to record on top of `base` (the anchor's newest marker): this writer's
/// `current` positions, unless another writer moved one of its partitions since `start`.
pub(crate) fn plan_positions(
    base: Option<&Positions>,
    start: &Positions,
    current: &Positions,
) -> LakeResult<Positions> {
    let mut positions = base.cloned().unwrap_or_default();
    for key in current.keys().chain(start.keys()) {
        if positions.get(key) != start.get(key) {
            return Err(fenced(format!(
                "partition {} was committed by another writer ({key} at {:?}, this writer \
                 started at {:?})",
                partition_of_entry(key),
                positions.get(key),
                start.get(key)
            )));
        }
    }
    positions.extend(current.clone());
    Ok(positions)
}

impl Committer {
    /// A committer for `job`'s checkpoints by a new writer (a fresh UUIDv7).
    pub(crate) fn new(client: CatalogClient, job: String) -> Self {
        Self {
            client,
            job,
            writer: uuid::Uuid::now_v7().to_string(),
            next_checkpoint: 1,
            in_flight: None,
        }
    }

    /// This writer's id.
    pub(crate) fn writer(&self) -> &str {
        &self.writer
    }

    /// Whether the commit in flight has finished (settling it will not wait).
    pub(crate) fn finished(&self) -> bool {
        self.in_flight
            .as_ref()
            .is_some_and(|f| f.task.is_finished())
    }

    /// Whether no commit is in flight (nothing to settle).
    pub(crate) fn idle(&self) -> bool {
        self.in_flight.is_none()
    }

    /// Starts committing `checkpoint` (call [`settle`](Self::settle) first); returns `false`
    /// when it has nothing to commit.
    pub(crate) fn start(&mut self, checkpoint: Checkpoint) -> bool {
        let changes = checkpoint.parts.iter().any(|p| match &p.closing {
            Closing::Ready(output) => !output.is_empty(),
            Closing::Encoding(_) => true,
        });
        if !changes && checkpoint.current == checkpoint.start && !checkpoint.force {
            return false;
        }
        let id = self.next_checkpoint;
        self.next_checkpoint += 1;
        let marker = CommitMarker {
            job_id: self.job.clone(),
            writer: Some(self.writer.clone()),
            checkpoint_id: id,
            positions: Positions::new(),
            operators: checkpoint.operators,
            streams: checkpoint.streams.clone(),
        };
        let planned = marker.clone();
        let forgotten = checkpoint.forgotten;
        let streams = checkpoint.streams;
        let client = self.client.clone();
        let (start, current) = (checkpoint.start, checkpoint.current.clone());
        let parts = checkpoint.parts;
        let task = tokio::spawn(async move {
            let mut outputs = Vec::with_capacity(parts.len());
            let mut failed = None;
            for part in parts {
                match part.closing.output().await {
                    Ok(output) => outputs.push((part.table, part.io, output)),
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = failed {
                return (Err(e), outputs);
            }
            let deltas: Vec<(TableIdent, Delta)> = outputs
                .iter()
                .enumerate()
                // The anchor is always committed; other tables only with a change.
                .filter(|(i, (_, _, o))| *i == 0 || !o.is_empty())
                .map(|(_, (ident, _, o))| {
                    (
                        ident.clone(),
                        Delta {
                            data_files: o.data_files.clone(),
                            first_data_files: o.first_data_files.clone(),
                            delete_files: o.delete_files.clone(),
                            truncate: o.truncate,
                            ..Default::default()
                        },
                    )
                })
                .collect();
            let began = Instant::now();
            let result = commit_checkpoint_planned(
                &client,
                &marker,
                &deltas,
                &RetryPolicy::default(),
                |base| {
                    let positions = plan_positions(base.map(|m| &m.positions), &start, &current)?;
                    // Another writer may have landed streams this one never saw.
                    let mut streams = base.map(|m| m.streams.clone()).unwrap_or_default();
                    streams.retain(|s, _| !forgotten.contains(s));
                    streams.extend(planned.streams.clone());
                    Ok(CommitMarker {
                        positions,
                        streams,
                        ..planned.clone()
                    })
                },
            )
            .await
            .map(|report| (report, began.elapsed()));
            (result, outputs)
        });
        self.in_flight = Some(InFlight {
            id,
            task,
            positions: checkpoint.current,
            began: checkpoint.began,
            epoch: checkpoint.epoch,
            streams,
        });
        true
    }

    /// Waits for the commit in flight, if any.
    pub(crate) async fn settle(&mut self) -> LakeResult<Settled> {
        let Some(in_flight) = self.in_flight.take() else {
            return Ok(Settled::Nothing);
        };
        let (result, outputs) = in_flight.task.await.map_err(|e| {
            LakeError::new(ErrorKind::Invalid, format!("the commit task failed: {e}"))
        })?;
        match result {
            Ok((report, commit_took)) => Ok(Settled::Committed(Committed {
                id: in_flight.id,
                positions: in_flight.positions,
                rows: outputs
                    .iter()
                    .map(|(ident, _, o)| (ident.name().to_string(), o.rows))
                    .collect(),
                took: in_flight.began.elapsed(),
                commit_took,
                attempts: report.attempts,
                epoch: in_flight.epoch,
                streams: in_flight.streams,
            })),
            Err(e) => {
                // A definite failure: its files were never committed. An outcome still
                // unknown keeps them — the commit may have landed; a restart finds its marker,
                // and orphan removal collects them if it did not.
                if e.kind() != ErrorKind::CommitStateUnknown {
                    for (_, io, output) in &outputs {
                        for file in output.files() {
                            let _ = io.delete(file.file_path()).await;
                        }
                    }
                }
                if e.kind() == ErrorKind::Fenced {
                    Ok(Settled::Fenced(e.to_string()))
                } else {
                    Err(e)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(entries: &[(&str, &str)]) -> Positions {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn positions_move_forward_only_for_the_writer_that_holds_them() {
        // Another writer's partition t/1 stays; ours moves.
        let base = p(&[("t/0", "10"), ("t/1", "7")]);
        let planned = plan_positions(Some(&base), &p(&[("t/0", "10")]), &p(&[("t/0", "15")]));
        assert_eq!(planned.unwrap(), p(&[("t/0", "15"), ("t/1", "7")]));
        // t/0 moved since we sought it: fenced, whatever we read.
        let moved = p(&[("t/0", "12"), ("t/1", "7")]);
        let err =
            plan_positions(Some(&moved), &p(&[("t/0", "10")]), &p(&[("t/0", "15")])).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Fenced);
        assert!(err.to_string().contains("partition t/0"), "{err}");
        // A partition's own entries (a sequence watermark) are fenced with it.
        let moved = p(&[("t/0", "10"), ("t/0#sequence", "5,5")]);
        let err = plan_positions(
            Some(&moved),
            &p(&[("t/0", "10"), ("t/0#sequence", "4,4")]),
            &p(&[("t/0", "11"), ("t/0#sequence", "6,6")]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("partition t/0"), "{err}");
        // A partition nobody committed may be taken by whoever reads it first.
        let planned = plan_positions(None, &Positions::new(), &p(&[("t/2", "3")]));
        assert_eq!(planned.unwrap(), p(&[("t/2", "3")]));
    }
}
