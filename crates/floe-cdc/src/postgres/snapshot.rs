//! The first start: the replication slot created with an exported snapshot (one an earlier,
//! uncommitted attempt left is dropped first), and the initial copy of every table inside
//! that snapshot on `snapshot_parallelism` sessions (each table a binary `COPY`,
//! `crate::copy`), read batch by batch until it is complete.
//!
//! Failures are [`SourceError`]s, their fault named where they arise (the server's, mostly).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use floe_core::SourceError;
use pgwire_replication::Lsn;
use tokio::sync::mpsc;

use super::catalog::{self, quote};
use super::session::{connect, open_replication};
use super::{Phase, PostgresSource, err};
use crate::copy::CopyTable;

impl PostgresSource {
    /// First start: drops a slot no commit used, creates the slot with an exported snapshot
    /// and starts copying every table in it on `snapshot_parallelism` sessions.
    pub(super) async fn start_snapshot(&mut self) -> Result<(), SourceError> {
        if catalog::slot_state(&self.catalog, &self.config.slot)
            .await?
            .is_some()
        {
            tracing::warn!(
                slot = %self.config.slot,
                "dropping a replication slot no commit of this job used (an earlier first \
                 start did not finish its snapshot)"
            );
            self.catalog
                .execute("SELECT pg_drop_replication_slot($1)", &[&self.config.slot])
                .await
                .map_err(|e| err("dropping the unused slot", e))?;
        }
        let (mut replication, system) = open_replication(&self.config, Lsn::from_u64(0)).await?;
        let rows = replication
            .simple_query(&format!(
                "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput (SNAPSHOT 'export')",
                quote(&self.config.slot)
            ))
            .await
            .map_err(|e| err("creating the replication slot", e))?;
        let row = rows.first().ok_or_else(|| {
            SourceError::external("postgres: CREATE_REPLICATION_SLOT returned no row")
        })?;
        let text = |i: usize| {
            row.get(i)
                .and_then(|v| v.as_ref())
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .ok_or_else(|| {
                    SourceError::external(format!("postgres: slot creation: no column {i}"))
                })
        };
        let consistent = Lsn::parse(&text(1)?).map_err(|e| err("consistent point", e))?;
        let snapshot_name = text(2)?;
        tracing::info!(slot = %self.config.slot, consistent_point = %consistent, "replication slot created");
        self.system_id = system.system_id;
        self.timeline = system.timeline;
        self.position = consistent.as_u64();
        self.taken = self.position;

        // Every copy session imports the snapshot before the first COPY starts.
        let parallelism = self
            .config
            .snapshot_parallelism
            .clamp(1, self.tables.len().max(1));
        let mut sessions = Vec::new();
        for _ in 0..parallelism {
            let client = connect(&self.config).await?;
            client
                .batch_execute(&format!(
                    "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{snapshot_name}'"
                ))
                .await
                .map_err(|e| err("importing the slot's snapshot", e))?;
            sessions.push(client);
        }
        let queue = Arc::new(Mutex::new((0..self.tables.len()).collect::<VecDeque<_>>()));
        let (tx, rx) = mpsc::channel(4);
        for client in sessions {
            let queue = queue.clone();
            let tx = tx.clone();
            let tables = self.tables.clone();
            tokio::spawn(async move {
                loop {
                    let next = queue.lock().expect("queue lock").pop_front();
                    let Some(index) = next else { break };
                    let table = &tables[index];
                    let copy = CopyTable {
                        index,
                        name: table.qualified(),
                        from: table.quoted(),
                        select: &table.copy_columns,
                        layout: &table.layout,
                        filter: None,
                    };
                    if let Err(e) = copy.run(&client, &tx).await {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
                let _ = client.batch_execute("COMMIT").await;
            });
        }
        // The copy replaces whatever an earlier, unfinished attempt left in the tables.
        self.truncated.iter_mut().for_each(|t| *t = true);
        // The copy holds every table whole.
        self.known = self.tables.iter().map(|t| t.qualified()).collect();
        self.backfills.clear();
        self.snapshot = Some(rx);
        self.replication = Some(replication);
        self.phase = Phase::Copying;
        self.copy_began = Some(Instant::now());
        tracing::info!(
            tables = self.tables.len(),
            "copying the tables (initial snapshot)"
        );
        Ok(())
    }

    /// Reads one copied batch (or notes that the copy is complete).
    pub(super) async fn read_copy(&mut self) -> Result<(), SourceError> {
        let Some(rx) = &mut self.snapshot else {
            return Ok(());
        };
        match rx.recv().await {
            Some(Ok((index, batch))) => {
                self.bytes += batch.get_array_memory_size() as u64;
                self.copied.push((index, batch));
            }
            Some(Err(e)) => return Err(e),
            None => {
                self.snapshot = None;
                self.phase = Phase::Copied;
                tracing::info!(slot = %self.config.slot, "initial copy read; committing it");
            }
        }
        Ok(())
    }
}
