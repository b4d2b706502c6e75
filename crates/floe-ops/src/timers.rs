//! Timers in keyed state: an operator registers a time and a tag per partition, and gets the
//! due ones back in time order — event-time timers when the partition's watermark passes
//! them, processing-time timers when the clock does. Timers are state like any other: they
//! are committed with the checkpoint and restored with their partition.

use std::ops::ControlFlow;

use crate::codec::{sortable, unsortable};
use crate::{Context, OpResult};

/// A timer taken when due: `(time, tag, value)`.
pub type DueTimer = (i64, Vec<u8>, Vec<u8>);

/// A set of timers under one state namespace byte.
#[derive(Debug, Clone, Copy)]
pub struct Timers {
    namespace: u8,
}

/// Event-time timers of an operator (namespace `0xF0`).
pub const EVENT_TIME: Timers = Timers { namespace: 0xF0 };
/// Processing-time timers of an operator (namespace `0xF1`).
pub const PROCESSING_TIME: Timers = Timers { namespace: 0xF1 };
/// Event-time timers that forget an operator's own entries, apart from [`EVENT_TIME`] so that
/// an operator can hold them beside a window of its own (namespace `0xF2`).
pub const EXPIRY: Timers = Timers { namespace: 0xF2 };

impl Timers {
    fn key(&self, at: i64, tag: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(9 + tag.len());
        k.push(self.namespace);
        k.extend_from_slice(&sortable(at));
        k.extend_from_slice(tag);
        k
    }

    /// Fires `tag` at `at` (again registering the same time and tag is one timer).
    pub fn register(
        &self,
        ctx: &mut Context<'_>,
        partition: u32,
        at: i64,
        tag: &[u8],
    ) -> OpResult<()> {
        ctx.put(partition, &self.key(at, tag), &[])
    }

    /// Fires `tag` at `at` with `value` (replacing the value of the same time and tag): a timer
    /// that carries what it is for, e.g. the keys it expires.
    pub fn register_value(
        &self,
        ctx: &mut Context<'_>,
        partition: u32,
        at: i64,
        tag: &[u8],
        value: &[u8],
    ) -> OpResult<()> {
        ctx.put(partition, &self.key(at, tag), value)
    }

    /// The value of a registered timer.
    pub fn value(
        &self,
        ctx: &Context<'_>,
        partition: u32,
        at: i64,
        tag: &[u8],
    ) -> OpResult<Option<Vec<u8>>> {
        ctx.get(partition, &self.key(at, tag))
    }

    /// Removes a timer.
    pub fn cancel(
        &self,
        ctx: &mut Context<'_>,
        partition: u32,
        at: i64,
        tag: &[u8],
    ) -> OpResult<()> {
        ctx.delete(partition, &self.key(at, tag))
    }

    /// The earliest timer of a partition at or after `from`, a time no timer is known to be
    /// earlier than (`i64::MIN` when nothing is known). Taken timers leave tombstones in
    /// RocksDB until compaction; a scan from the floor skips them instead of walking them all.
    pub fn next(&self, ctx: &mut Context<'_>, partition: u32, from: i64) -> OpResult<Option<i64>> {
        let mut next = None;
        ctx.scan(
            partition,
            &self.key(from, &[]),
            Some(&[self.namespace + 1]),
            |k, _| {
                next = Some(unsortable(&k[1..9]));
                ControlFlow::Break(())
            },
        )?;
        Ok(next)
    }

    /// Removes and returns the timers of a partition due at `upto` (inclusive), earliest
    /// first: `(time, tag)`. `from` is a time no timer is earlier than, as for [`Self::next`].
    pub fn take_due(
        &self,
        ctx: &mut Context<'_>,
        partition: u32,
        from: i64,
        upto: i64,
    ) -> OpResult<Vec<(i64, Vec<u8>)>> {
        let due = self.take_due_values(ctx, partition, from, upto)?;
        Ok(due.into_iter().map(|(at, tag, _)| (at, tag)).collect())
    }

    /// [`Self::take_due`] with each timer's value: `(time, tag, value)`.
    pub fn take_due_values(
        &self,
        ctx: &mut Context<'_>,
        partition: u32,
        from: i64,
        upto: i64,
    ) -> OpResult<Vec<DueTimer>> {
        let mut due = Vec::new();
        if upto < from {
            return Ok(due);
        }
        let end = self.key(upto.saturating_add(1), &[]);
        ctx.scan(partition, &self.key(from, &[]), Some(&end), |k, v| {
            due.push((unsortable(&k[1..9]), k[9..].to_vec(), v.to_vec()));
            ControlFlow::Continue(())
        })?;
        for (at, tag, _) in &due {
            ctx.delete(partition, &self.key(*at, tag))?;
        }
        Ok(due)
    }

    /// Timers of a partition, counted.
    pub fn count(&self, ctx: &mut Context<'_>, partition: u32) -> OpResult<u64> {
        let mut n = 0;
        ctx.scan(
            partition,
            &[self.namespace],
            Some(&[self.namespace + 1]),
            |_, _| {
                n += 1;
                ControlFlow::Continue(())
            },
        )?;
        Ok(n)
    }
}
