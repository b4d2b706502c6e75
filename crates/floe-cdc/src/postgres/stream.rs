//! Following the slot: the replication session started (at the committed LSN), pgoutput
//! messages read into whole transactions — changes skipped for tables whose commit holds them,
//! Relation messages followed — keepalives acknowledged when nothing is uncommitted, and a
//! broken session reopened with backoff after the last transaction handed over.
//!
//! Failures are [`SourceError`]s: a slot gone, another cluster, a second reader or a change
//! Floe cannot follow are the user's; a session that cannot be restored the server's;
//! pgoutput that does not decode ours.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use floe_core::{Op, SourceError};
use pgwire_replication::{Lsn, ReplicationEvent};

use super::backfill::Change;
use super::catalog::{self, iceberg_schema};
use super::session::{connect, open_replication};
use super::{Phase, PostgresSource, err};
use crate::changelog::{Column, key_names, key_of};
use crate::pgoutput::{self, Message, OldTuple, Tuple, Value};

/// Reconnection attempts after the replication session breaks.
const RECONNECT_ATTEMPTS: u32 = 8;

/// The columns of a table changed while it is copied by an incremental snapshot.
pub(super) fn columns_changed_while_copying(table: &str) -> SourceError {
    SourceError::external(format!(
        "postgres: the columns of {table} changed while it is copied; the job stops without \
         committing the copy's next rows — start it again: it reads the columns anew and goes \
         on from the last committed chunk"
    ))
    .permanent()
}

impl PostgresSource {
    /// Opens the replication session that will stream from `committed_lsn` (refused if the
    /// slot is gone or the server is another cluster); START_REPLICATION waits for the
    /// first read.
    pub(super) async fn start_streaming(&mut self, committed_lsn: u64) -> Result<(), SourceError> {
        let state = catalog::slot_state(&self.catalog, &self.config.slot).await?;
        if state.is_none() {
            return Err(SourceError::user(format!(
                "postgres: replication slot {} is gone, so changes after LSN {} are lost to \
                 this job; drop the job's tables (or its commits) to start over with a new \
                 snapshot",
                self.config.slot,
                Lsn::from_u64(committed_lsn)
            )));
        }
        let (replication, system) =
            open_replication(&self.config, Lsn::from_u64(committed_lsn)).await?;
        if !self.system_id.is_empty() && self.system_id != system.system_id {
            return Err(SourceError::user(format!(
                "postgres: the server is cluster {}, but the job's commits came from cluster \
                 {}; refusing to mix them",
                system.system_id, self.system_id
            )));
        }
        self.system_id = system.system_id;
        self.timeline = system.timeline;
        self.replication = Some(replication);
        self.position = committed_lsn;
        self.taken = committed_lsn;
        self.phase = Phase::Streaming;
        Ok(())
    }

    /// Sends START_REPLICATION once the session is open and the reader streams.
    async fn ensure_started(&mut self) -> Result<(), SourceError> {
        if let Some(replication) = &mut self.replication
            && self.phase == Phase::Streaming
            && !self.streaming
        {
            let slot = &self.config.slot;
            let refused = |e: pgwire_replication::PgWireError| {
                let message = e.to_string();
                if message.contains("is active for PID") {
                    // A slot has one reader: this is a second replica of the job.
                    SourceError::user(format!(
                        "postgres: replication slot {slot} is being read by another session \
                         ({message}); a slot has one reader, so a Postgres CDC job runs as one \
                         replica — stop the other one first"
                    ))
                } else {
                    err("START_REPLICATION", message)
                }
            };
            replication.start().await.map_err(refused)?;
            replication.wait_started().await.map_err(refused)?;
            self.streaming = true;
        }
        Ok(())
    }

    /// Forgets every change not handed over (and the transaction being read).
    pub(super) fn forget_unread(&mut self) {
        for builder in &mut self.changes {
            builder.clear();
        }
        self.truncated.iter_mut().for_each(|t| *t = false);
        self.in_transaction = None;
        self.backfills_forget_unread();
    }

    /// The replication session broke: everything after the last transaction handed over is
    /// read again on a new session. Retried with backoff; gives up after
    /// [`RECONNECT_ATTEMPTS`].
    async fn reconnect(&mut self, why: String) -> Result<(), SourceError> {
        let mut pause = Duration::from_millis(500);
        for attempt in 1..=RECONNECT_ATTEMPTS {
            tracing::warn!(
                slot = %self.config.slot,
                error = %why,
                attempt,
                pause_ms = pause.as_millis() as u64,
                "replication session lost; reconnecting after the last transaction handed over"
            );
            if let Some(mut old) = self.replication.take() {
                old.abort();
            }
            self.streaming = false;
            self.forget_unread();
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(30));
            // A restarted server closed the catalog session too.
            if self.catalog.is_closed() {
                match connect(&self.config).await {
                    Ok(catalog) => self.catalog = catalog,
                    Err(e) if attempt == RECONNECT_ATTEMPTS => return Err(e),
                    Err(e) => {
                        tracing::warn!(error = %e, "reconnecting the catalog session failed");
                        continue;
                    }
                }
            }
            match self.start_streaming(self.taken).await {
                Ok(()) => match self.ensure_started().await {
                    Ok(()) => return Ok(()),
                    Err(e) if attempt == RECONNECT_ATTEMPTS => return Err(e),
                    Err(e) => tracing::warn!(error = %e, "START_REPLICATION failed"),
                },
                Err(e) if attempt == RECONNECT_ATTEMPTS => return Err(e),
                Err(e) => tracing::warn!(error = %e, "reconnecting failed"),
            }
        }
        Err(SourceError::external(format!(
            "postgres: the replication session could not be restored: {why}"
        )))
    }

    /// Reads the slot until `timeout` passes outside a transaction.
    pub(super) async fn read_stream(&mut self, timeout: Duration) -> Result<(), SourceError> {
        self.ensure_started().await?;
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() && self.in_transaction.is_none() {
                return Ok(());
            }
            let replication = self
                .replication
                .as_mut()
                .ok_or_else(|| SourceError::internal("postgres: not started"))?;
            // Inside a transaction, read on to its commit.
            let wait = if self.in_transaction.is_some() {
                Duration::from_secs(3600)
            } else {
                left
            };
            let event = match tokio::time::timeout(wait, replication.recv()).await {
                Err(_) => return Ok(()),
                Ok(Ok(Some(event))) => event,
                Ok(Ok(None)) => {
                    self.reconnect("the server ended the replication stream".into())
                        .await?;
                    continue;
                }
                Ok(Err(e)) => {
                    self.reconnect(e.to_string()).await?;
                    continue;
                }
            };
            match event {
                ReplicationEvent::Begin { final_lsn, xid, .. } => {
                    self.in_transaction = Some(final_lsn.as_u64());
                    self.xid = xid;
                }
                ReplicationEvent::XLogData { data, .. } => {
                    self.bytes += data.len() as u64;
                    self.on_message(data).await?
                }
                ReplicationEvent::Commit { end_lsn, .. } => {
                    self.in_transaction = None;
                    self.position = self.position.max(end_lsn.as_u64());
                    // A chunk's watermark arrived: it closes now, and the next one is taken.
                    if self.backfills.first().is_some_and(|b| b.closing()) {
                        return Ok(());
                    }
                }
                ReplicationEvent::KeepAlive { wal_end, .. } => {
                    // Nothing read since the last commit, and nothing uncommitted: the slot
                    // need not hold the WAL up to here.
                    if self.in_transaction.is_none()
                        && self.position <= self.acknowledged
                        && self.changes.iter().all(|c| c.rows() == 0)
                        && self.ordered.is_empty()
                    {
                        replication.update_applied_lsn(wal_end);
                    }
                }
                ReplicationEvent::Message {
                    prefix, content, ..
                } => {
                    // A chunk to close: then the next one is taken right away.
                    if self.on_watermark(&prefix, &content) && self.in_transaction.is_none() {
                        return Ok(());
                    }
                    let commit_lsn = self.in_transaction.unwrap_or(0);
                    if self.tables.iter().all(|t| commit_lsn >= t.committed_end) {
                        self.on_resnapshot(&prefix, &content);
                    }
                }
                ReplicationEvent::StoppedAt { .. } => {
                    return Err(SourceError::external(
                        "postgres: the replication stream stopped",
                    ));
                }
            }
        }
    }

    async fn on_message(&mut self, data: Bytes) -> Result<(), SourceError> {
        let commit_lsn = self.in_transaction.unwrap_or(0);
        let message = pgoutput::decode(data)
            .map_err(|e| SourceError::internal(format!("postgres: decoding pgoutput: {e}")))?;
        match message {
            Message::Relation(relation) => self.on_relation(relation).await?,
            Message::Insert { relation, new } => {
                self.change(relation, commit_lsn, Op::Insert, &new)?
            }
            Message::Update { relation, old, new } => {
                self.on_update(relation, commit_lsn, old, new)?
            }
            Message::Delete { relation, old } => {
                let old = match old {
                    OldTuple::Key(t) | OldTuple::Full(t) => t,
                };
                self.change(relation, commit_lsn, Op::Delete, &old)?
            }
            Message::Truncate { relations, .. } => {
                for oid in relations {
                    if let Some(&index) = self.by_oid.get(&oid)
                        && commit_lsn >= self.tables[index].committed_end
                    {
                        let xid = self.xid;
                        if let Some(backfill) = self.backfill_of(index) {
                            // In order with the table's held changes.
                            backfill.hold(xid, Change::Truncate);
                        } else {
                            self.changes[index].clear();
                            self.truncated[index] = true;
                        }
                    }
                }
            }
            Message::Type { .. }
            | Message::Origin { .. }
            | Message::Message { .. }
            | Message::Transaction => {}
        }
        Ok(())
    }

    /// An update: `+U`, or `-D` of the old key and `+I` of the new one when the key changed;
    /// unchanged TOASTed values are taken from a full old row.
    fn on_update(
        &mut self,
        oid: u32,
        commit_lsn: u64,
        old: Option<OldTuple>,
        mut new: Tuple,
    ) -> Result<(), SourceError> {
        let Some(&index) = self.by_oid.get(&oid) else {
            return Ok(());
        };
        let layout = self.tables[index].layout.clone();
        let (old, old_full) = match old {
            Some(OldTuple::Full(t)) => (Some(t), true),
            Some(OldTuple::Key(t)) => (Some(t), false),
            None => (None, false),
        };
        if old_full && let Some(old) = &old {
            for (value, before) in new.iter_mut().zip(old) {
                if *value == Value::Unchanged && *before != Value::Unchanged {
                    *value = before.clone();
                }
            }
        }
        let moved = old.as_ref().filter(|o| {
            key_of(&layout, o).is_some() && key_of(&layout, o) != key_of(&layout, &new)
        });
        match moved {
            Some(old) => {
                self.change(oid, commit_lsn, Op::Delete, old)?;
                self.change(oid, commit_lsn, Op::Insert, &new)
            }
            None => self.change(oid, commit_lsn, Op::UpdateAfter, &new),
        }
    }

    fn change(
        &mut self,
        oid: u32,
        commit_lsn: u64,
        op: Op,
        tuple: &Tuple,
    ) -> Result<(), SourceError> {
        let Some(&index) = self.by_oid.get(&oid) else {
            return Ok(());
        };
        let table = &self.tables[index];
        if commit_lsn < table.committed_end {
            return Ok(());
        }
        if key_of(&table.layout, tuple).is_none() {
            return Err(SourceError::internal(format!(
                "postgres: table {}: a {} change carries no complete key",
                table.qualified(),
                op.symbol()
            )));
        }
        let xid = self.xid;
        if let Some(backfill) = self.backfill_of(index) {
            // Being copied: applied, kept or dropped by its key (`backfill`).
            backfill.hold(xid, Change::Row(op, tuple.clone()));
            return Ok(());
        }
        let qualified = self.tables[index].qualified();
        self.changes[index].push(op, tuple).map_err(|e| {
            SourceError::user(format!(
                "postgres: table {qualified} at LSN {}: {e}",
                Lsn::from_u64(commit_lsn)
            ))
        })
    }

    /// A Relation message: the table's columns from here on. Added columns are followed;
    /// a changed type or key stops the job.
    async fn on_relation(&mut self, relation: pgoutput::Relation) -> Result<(), SourceError> {
        let Some(&index) = self.by_oid.get(&relation.id) else {
            return self.adopt_table(&relation).await;
        };
        // A table being copied (or waiting to be) whose columns change: the chunks and the
        // changes kept for them are in the old columns. The job stops before committing any
        // of it and, started again, reads the table's columns anew and goes on from its last
        // committed chunk.
        if self.backfill_of(index).is_some() {
            let layout = &self.tables[index].layout;
            let same = relation.columns.len() == layout.len()
                && relation
                    .columns
                    .iter()
                    .zip(layout.iter())
                    .all(|(r, c)| r.name == c.name);
            if !same {
                return Err(columns_changed_while_copying(
                    &self.tables[index].qualified(),
                ));
            }
        }
        let current = self.tables[index].layout.clone();
        let qualified = self.tables[index].qualified();
        let mut layout = Vec::with_capacity(relation.columns.len());
        for column in &relation.columns {
            let known = current.iter().find(|c| c.name == column.name);
            let ty = match known {
                Some(c) => {
                    let now =
                        catalog::type_of(&self.catalog, column.type_oid, column.type_modifier)
                            .await?;
                    if now != c.ty {
                        return Err(SourceError::user(format!(
                            "postgres: column {} of {qualified} changed type ({:?} → {:?}); \
                             Floe cannot follow that change without rewriting the table — \
                             nothing after it was committed",
                            column.name, c.ty, now
                        )));
                    }
                    c.ty
                }
                None => {
                    catalog::type_of(&self.catalog, column.type_oid, column.type_modifier).await?
                }
            };
            layout.push(Column {
                name: column.name.clone(),
                ty,
                key: known.is_some_and(|c| c.key),
            });
        }
        if key_names(&layout) != key_names(&current) {
            return Err(SourceError::user(format!(
                "postgres: the key of {qualified} lost a column; Floe cannot follow that change"
            )));
        }
        if *layout != *current {
            let added: Vec<&str> = layout
                .iter()
                .filter(|c| !current.iter().any(|o| o.name == c.name))
                .map(|c| c.name.as_str())
                .collect();
            tracing::info!(table = %qualified, ?added, "the table's columns changed");
            // Columns dropped at the source stay in Iceberg (NULL from now on).
            let mut union = layout.clone();
            for old in current.iter() {
                if !union.iter().any(|c| c.name == old.name) {
                    union.push(old.clone());
                }
            }
            let layout = Arc::new(layout);
            self.changes[index]
                .set_layout(layout.clone())
                .map_err(|e| SourceError::internal(format!("postgres: {qualified}: {e}")))?;
            let table = &mut self.tables[index];
            table.iceberg = iceberg_schema(&union)
                .map_err(|e| SourceError::internal(format!("postgres: schema: {e}")))?;
            table.layout = layout;
            table.layout_union = Some(Arc::new(union));
            self.version += 1;
        }
        Ok(())
    }

    /// A table the stream carries that the job does not follow yet: under `FOR ALL TABLES`, one
    /// created since the job started. It is followed from here on and copied by an incremental
    /// snapshot (its rows so far may predate this message); a table Floe cannot follow stops the
    /// job as it would at start.
    async fn adopt_table(&mut self, relation: &pgoutput::Relation) -> Result<(), SourceError> {
        if !self.config.tables.is_empty() || relation.namespace.is_empty() {
            return Ok(());
        }
        let identity = char::from(relation.replica_identity).to_string();
        let table = catalog::read_table(
            &self.catalog,
            &self.config,
            relation.id,
            &relation.namespace,
            &relation.name,
            &identity,
        )
        .await
        .map_err(SourceError::user)?;
        let streamed: Vec<&str> = relation.columns.iter().map(|c| c.name.as_str()).collect();
        let read: Vec<&str> = table.layout.iter().map(|c| c.name.as_str()).collect();
        if streamed != read {
            return Err(SourceError::external(format!(
                "postgres: the new table {} changed since the stream's first change of it; the \
                 job reads it anew when it starts again",
                table.qualified()
            )));
        }
        let name = table.qualified();
        if self.table_index(&name).is_some() {
            return Err(SourceError::external(format!(
                "postgres: table {name} was dropped and created again; the job stops so that it \
                 reads the new table when started again"
            ))
            .permanent());
        }
        tracing::info!(table = %name, "a new table in the publication: following it, and copying it by an incremental snapshot");
        self.by_oid.insert(relation.id, self.tables.len());
        self.changes.push(crate::changelog::ChangelogBuilder::new(
            table.layout.clone(),
        ));
        self.truncated.push(true);
        self.tables.push(table);
        self.backfills
            .push(super::backfill::Backfill::new(name, None, true));
        self.version += 1;
        Ok(())
    }
}
