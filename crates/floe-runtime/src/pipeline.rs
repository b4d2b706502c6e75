//! The pipeline between the reader and the sinks: the job's operators, the routes between
//! streams, and the keyed state of the stateful ones.
//!
//! ```text
//!  reader streams ──> operators (by the job file's order of inputs) ──> derived streams
//!        │                 │ refused rows: dead letters                      │
//!        └── every stream that lands has a sink; others only feed operators ─┘
//! ```
//!
//! An operator is built as soon as its input's columns are known (at start for OTLP streams,
//! on the first event for a Debezium topic). Rows are routed depth-first: a batch reaches
//! its sink and every operator reading its stream, and what those emit is routed the same
//! way, before the next batch — so each stream sees its partitions' rows in source order.
//!
//! **State** lives in one [`StateStore`] (RocksDB) under [`state_table`](crate::state_table)
//! names: operator id, source partition. At a barrier the operators flush, the store seals its
//! epoch, and the epoch's changes become rows of the state table in the same checkpoint.
//! Restoring clears the local store and loads the owned partitions' rows from the state
//! table, then lets each operator rebuild what it keeps in memory.

use std::collections::HashMap;

use floe_core::{StreamBatch, StreamSpec};
use floe_lake::{ErrorKind, LakeError, LakeResult};
use floe_ops::config::{OperatorConfig, OperatorKind};
use floe_ops::{Context, DeadRow, OpError, Operator, OperatorStats};
use floe_state::{Change, StateStore};

fn invalid(message: impl Into<String>) -> LakeError {
    LakeError::new(ErrorKind::Invalid, message)
}

fn op_error(e: OpError) -> LakeError {
    invalid(e.to_string())
}

/// What routing produced: rows per stream (to land), rows for exchanges (by exchange id),
/// truncated streams, refused rows.
#[derive(Debug, Default)]
pub(crate) struct Routed {
    pub(crate) rows: Vec<(String, StreamBatch)>,
    pub(crate) exchanged: Vec<(String, StreamBatch)>,
    pub(crate) truncates: Vec<String>,
    pub(crate) dead: Vec<DeadRow>,
}

/// A job's operators.
pub(crate) struct Pipeline {
    configs: Vec<OperatorConfig>,
    operators: Vec<Option<Box<dyn Operator>>>,
    /// The input columns each built operator was last told of (a union's: each input's).
    inputs: Vec<Option<Vec<iceberg::spec::Schema>>>,
    /// Stream → the operators reading it, and which of their inputs it is.
    consumers: HashMap<String, Vec<(usize, usize)>>,
    /// Stream → the exchanges reading it (their rows go to a topic, not to an operator).
    exchanges: HashMap<String, Vec<String>>,
    /// Per operator run on its producers' progress ([`Pipeline::derived_clocks`]): the
    /// producers, and the clock last given.
    derived: Vec<(usize, Vec<usize>, Option<i64>)>,
    state: Option<StateStore>,
}

/// The partition an operator run on its producers' progress sees all its input in: the
/// reader's first (the generator's spans), held by the one process that holds them all.
const HOME: u32 = 0;

/// The operators whose rows final per minute make up `stream` in this pipeline (through
/// unions); `None` when some of it is not such rows or comes from an exchange.
fn final_producers(configs: &[OperatorConfig], stream: &str) -> Option<Vec<usize>> {
    let (i, c) = configs
        .iter()
        .enumerate()
        .find(|(_, c)| c.outputs.iter().any(|o| o == stream))?;
    let is = |name: &str| name == stream;
    let final_output = match &c.kind {
        OperatorKind::Union => {
            let mut all = Vec::new();
            for input in &c.inputs {
                all.extend(final_producers(configs, input)?);
            }
            return Some(all);
        }
        OperatorKind::Slo(s) => is(&s.output),
        OperatorKind::Regression(r) => is(&r.output),
        OperatorKind::Series(s) => is(&s.output) || is(&s.scores_output),
        OperatorKind::Edges(e) => is(&e.final_output),
        OperatorKind::Window(w) => w.final_output.as_deref().is_some_and(is),
        OperatorKind::Alerts(a) => is(&a.output),
        OperatorKind::Sql { .. } | OperatorKind::Exchange(_) | OperatorKind::TailSampling(_) => {
            false
        }
    };
    final_output.then(|| vec![i])
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("operators", &self.configs.len())
            .finish_non_exhaustive()
    }
}

impl Pipeline {
    /// The operators of a job file (producers first); `state` holds the stateful ones' state.
    pub(crate) fn new(configs: Vec<OperatorConfig>, state: Option<StateStore>) -> Self {
        let mut consumers: HashMap<String, Vec<(usize, usize)>> = HashMap::new();
        let mut exchanges: HashMap<String, Vec<String>> = HashMap::new();
        for (i, c) in configs.iter().enumerate() {
            if matches!(c.kind, OperatorKind::Exchange(_)) {
                exchanges
                    .entry(c.input.clone())
                    .or_default()
                    .push(c.id.clone());
            } else {
                for (k, input) in c.inputs.iter().enumerate() {
                    consumers.entry(input.clone()).or_default().push((i, k));
                }
            }
        }
        let derived = configs
            .iter()
            .enumerate()
            .filter(|(_, c)| matches!(c.kind, OperatorKind::Alerts(_)))
            .filter_map(|(i, c)| Some((i, final_producers(&configs, &c.input)?, None)))
            .collect();
        Self {
            operators: configs.iter().map(|_| None).collect(),
            inputs: configs.iter().map(|_| None).collect(),
            configs,
            consumers,
            exchanges,
            derived,
            state,
        }
    }

    /// Operators reading rows final per minute straight from their producers in this
    /// pipeline (an `alerts` operator on a union, without an exchange between) run on the
    /// producers' progress, as an exchange would give it (ADR 0010): the smallest frontier of
    /// every producer in every partition. Their input is in one place by definition — each
    /// producer's stream in one partition, though not all in the same one (the generator's
    /// spans and logs are two) — so they see all of it in [`HOME`]. Called after each
    /// routing step.
    fn derived_clocks(
        &mut self,
        names: &dyn Fn(u32) -> String,
        out: &mut Routed,
    ) -> LakeResult<()> {
        for d in 0..self.derived.len() {
            let (i, producers) = (self.derived[d].0, &self.derived[d].1);
            let mut clock: Option<i64> = None;
            for &q in producers {
                let smallest = self.operators[q]
                    .as_ref()
                    .and_then(|op| op.final_frontiers().into_iter().map(|(_, t)| t).min());
                // A producer without progress yet holds everything back.
                let Some(t) = smallest else {
                    clock = None;
                    break;
                };
                clock = Some(clock.map_or(t, |c| c.min(t)));
            }
            let Some(t) = clock.filter(|t| self.derived[d].2.is_none_or(|last| *t > last)) else {
                continue;
            };
            self.derived[d].2 = Some(t);
            let Some(op) = self.operators[i].as_mut() else {
                continue;
            };
            let mut ctx = Context::new(self.state.as_mut(), i as u16, names);
            op.on_event_clock(HOME, t, &mut ctx).map_err(op_error)?;
            let done = ctx.finish();
            self.drain(i, done, names, out)?;
        }
        Ok(())
    }

    /// Builds the operators whose input is now known, and tells built ones their input's
    /// columns changed (producers first, so changes flow down).
    pub(crate) fn build(&mut self, known: &[StreamSpec]) -> LakeResult<()> {
        let mut specs: HashMap<String, StreamSpec> = known
            .iter()
            .filter(|s| s.schema.is_some())
            .map(|s| (s.name.clone(), s.clone()))
            .collect();
        for (i, config) in self.configs.iter().enumerate() {
            if matches!(config.kind, OperatorKind::Exchange(_)) {
                // Its output is a stream of the reader (read back from the topic).
                continue;
            }
            let Some(inputs) = config
                .inputs
                .iter()
                .map(|name| specs.get(name).cloned())
                .collect::<Option<Vec<StreamSpec>>>()
            else {
                continue;
            };
            let schemas: Vec<iceberg::spec::Schema> =
                inputs.iter().filter_map(|s| s.schema.clone()).collect();
            let failed =
                |e: String| invalid(format!("{}: operator {}: {e}", config.place, config.id));
            match &mut self.operators[i] {
                Some(_) if self.inputs[i].as_ref() == Some(&schemas) => {}
                // A union holds nothing: it is built again over the new columns.
                Some(_) if matches!(config.kind, OperatorKind::Union) => {
                    self.operators[i] = Some(config.build_over(&inputs).map_err(failed)?);
                }
                Some(op) => op.on_input(&inputs[0]).map_err(failed)?,
                None => self.operators[i] = Some(config.build_over(&inputs).map_err(failed)?),
            }
            self.inputs[i] = Some(schemas);
            if let Some(op) = &self.operators[i] {
                for out in op.outputs() {
                    specs.insert(out.name.clone(), out.clone());
                }
            }
        }
        Ok(())
    }

    /// The streams the built operators produce.
    pub(crate) fn outputs(&self) -> Vec<StreamSpec> {
        self.operators
            .iter()
            .flatten()
            .flat_map(|op| op.outputs().to_vec())
            .collect()
    }

    /// Routes rows of `stream`: the rows themselves and everything operators make of them.
    pub(crate) fn push(
        &mut self,
        stream: &str,
        batch: StreamBatch,
        names: &dyn Fn(u32) -> String,
        out: &mut Routed,
    ) -> LakeResult<()> {
        self.route(stream, batch, names, out)?;
        self.derived_clocks(names, out)
    }

    fn route(
        &mut self,
        stream: &str,
        batch: StreamBatch,
        names: &dyn Fn(u32) -> String,
        out: &mut Routed,
    ) -> LakeResult<()> {
        let consumers = self.consumers.get(stream).cloned().unwrap_or_default();
        for (i, k) in consumers {
            let Some(op) = self.operators[i].as_mut() else {
                return Err(invalid(format!(
                    "operator {} got rows before its input's columns were known",
                    self.configs[i].id
                )));
            };
            let mut ctx = Context::new(self.state.as_mut(), i as u16, names);
            if self.derived.iter().any(|d| d.0 == i) {
                let home = StreamBatch::single(batch.stream, batch.batch.clone(), HOME);
                op.on_batch_of(k, &home, &mut ctx).map_err(op_error)?;
            } else {
                op.on_batch_of(k, &batch, &mut ctx).map_err(op_error)?;
            }
            let done = ctx.finish();
            self.drain(i, done, names, out)?;
        }
        for id in self.exchanges.get(stream).into_iter().flatten() {
            out.exchanged.push((id.clone(), batch.clone()));
        }
        out.rows.push((stream.to_string(), batch));
        Ok(())
    }

    /// Routes what operator `i` emitted and refused.
    fn drain(
        &mut self,
        i: usize,
        (emitted, dead): (Vec<(usize, StreamBatch)>, Vec<DeadRow>),
        names: &dyn Fn(u32) -> String,
        out: &mut Routed,
    ) -> LakeResult<()> {
        out.dead.extend(dead);
        for (output, mut batch) in emitted {
            let stream = self.configs[i]
                .outputs
                .get(output)
                .cloned()
                .ok_or_else(|| {
                    invalid(format!(
                        "operator {} has no output {output}",
                        self.configs[i].id
                    ))
                })?;
            batch.stream = output;
            self.route(&stream, batch, names, out)?;
        }
        Ok(())
    }

    /// The event-time clock of `partition` of `stream` moved: every operator reading it is
    /// told, and through `select`/`filter` operators those reading what they derive.
    pub(crate) fn clock(
        &mut self,
        stream: &str,
        partition: u32,
        max_time: i64,
        names: &dyn Fn(u32) -> String,
        out: &mut Routed,
    ) -> LakeResult<()> {
        self.clock_of(stream, partition, max_time, names, out)?;
        self.derived_clocks(names, out)
    }

    fn clock_of(
        &mut self,
        stream: &str,
        partition: u32,
        max_time: i64,
        names: &dyn Fn(u32) -> String,
        out: &mut Routed,
    ) -> LakeResult<()> {
        let consumers = self.consumers.get(stream).cloned().unwrap_or_default();
        for (i, _) in consumers {
            match self.configs[i].kind {
                OperatorKind::Sql { .. } | OperatorKind::Union => {
                    let outputs = self.configs[i].outputs.clone();
                    for o in outputs {
                        self.clock_of(&o, partition, max_time, names, out)?;
                    }
                    continue;
                }
                // Another exchange has clocks of its own.
                OperatorKind::Exchange(_) => continue,
                OperatorKind::Window(_)
                | OperatorKind::Slo(_)
                | OperatorKind::Regression(_)
                | OperatorKind::Edges(_)
                | OperatorKind::Series(_)
                | OperatorKind::Alerts(_)
                | OperatorKind::TailSampling(_) => {}
            }
            let Some(op) = self.operators[i].as_mut() else {
                continue;
            };
            let mut ctx = Context::new(self.state.as_mut(), i as u16, names);
            op.on_event_clock(partition, max_time, &mut ctx)
                .map_err(op_error)?;
            let done = ctx.finish();
            self.drain(i, done, names, out)?;
        }
        Ok(())
    }

    /// A stream was emptied: so are the streams `select`/`filter` operators derive from it.
    pub(crate) fn truncate(&mut self, stream: &str, out: &mut Routed) {
        out.truncates.push(stream.to_string());
        let consumers = self.consumers.get(stream).cloned().unwrap_or_default();
        for (i, _) in consumers {
            if !self.configs[i].stateful() {
                let outputs = self.configs[i].outputs.clone();
                for o in outputs {
                    self.truncate(&o, out);
                }
            }
        }
    }

    /// Calls one hook of every built operator (in order), routing what it emits.
    fn each(
        &mut self,
        names: &dyn Fn(u32) -> String,
        out: &mut Routed,
        mut hook: impl FnMut(&mut Box<dyn Operator>, &mut Context<'_>) -> Result<(), OpError>,
    ) -> LakeResult<()> {
        for i in 0..self.operators.len() {
            let Some(op) = self.operators[i].as_mut() else {
                continue;
            };
            let mut ctx = Context::new(self.state.as_mut(), i as u16, names);
            hook(op, &mut ctx).map_err(op_error)?;
            let done = ctx.finish();
            self.drain(i, done, names, out)?;
        }
        Ok(())
    }

    /// Processing time passed.
    pub(crate) fn tick(
        &mut self,
        now_ms: i64,
        names: &dyn Fn(u32) -> String,
        out: &mut Routed,
    ) -> LakeResult<()> {
        self.each(names, out, |op, ctx| op.on_tick(now_ms, ctx))?;
        self.derived_clocks(names, out)
    }

    /// The barrier: operators flush; returns the state changes of the epoch it closes.
    pub(crate) fn barrier(
        &mut self,
        names: &dyn Fn(u32) -> String,
        out: &mut Routed,
    ) -> LakeResult<Option<(u64, Vec<Change>)>> {
        self.each(names, out, |op, ctx| op.on_barrier(ctx))?;
        self.derived_clocks(names, out)?;
        let Some(state) = self.state.as_mut() else {
            return Ok(None);
        };
        let epoch = state.seal().map_err(|e| invalid(e.to_string()))?;
        Ok(Some((epoch, state.changes(epoch))))
    }

    /// The changes of epochs up to `epoch` are committed.
    pub(crate) fn committed(&mut self, epoch: u64) -> LakeResult<()> {
        if let Some(state) = self.state.as_mut() {
            state.release(epoch).map_err(|e| invalid(e.to_string()))?;
        }
        Ok(())
    }

    /// Forgets all state (before restoring it).
    pub(crate) fn clear(&mut self) -> LakeResult<()> {
        for op in self.operators.iter_mut().flatten() {
            op.forget();
        }
        if let Some(state) = self.state.as_mut() {
            state.clear().map_err(|e| invalid(e.to_string()))?;
        }
        Ok(())
    }

    /// Loads one committed state row.
    pub(crate) fn load(
        &mut self,
        operator: u16,
        partition: u32,
        key: &[u8],
        value: &[u8],
    ) -> LakeResult<()> {
        match self.state.as_mut() {
            Some(state) => state
                .load(operator, partition, key, value)
                .map_err(|e| invalid(e.to_string())),
            None => Ok(()),
        }
    }

    /// Lets every stateful operator rebuild its memory of `partitions` from their state.
    pub(crate) fn restored(
        &mut self,
        partitions: &[u32],
        names: &dyn Fn(u32) -> String,
    ) -> LakeResult<()> {
        let mut out = Routed::default();
        for &p in partitions {
            self.each(names, &mut out, |op, ctx| op.on_restore(p, ctx))?;
        }
        if !out.rows.is_empty() {
            return Err(invalid(
                "an operator emitted rows while its state was restored",
            ));
        }
        Ok(())
    }

    /// Per operator: the watermark of each partition it saw.
    pub(crate) fn watermarks(&self) -> Vec<(String, Vec<(u32, i64)>)> {
        self.configs
            .iter()
            .zip(&self.operators)
            .filter_map(|(c, op)| op.as_ref().map(|op| (c.id.clone(), op.watermarks())))
            .filter(|(_, w)| !w.is_empty())
            .collect()
    }

    /// Per output stream final per minute: each partition's frontier.
    pub(crate) fn frontiers(&self) -> Vec<(String, Vec<(u32, i64)>)> {
        let mut out = Vec::new();
        for op in self.operators.iter().flatten() {
            let finals: Vec<&StreamSpec> = op
                .outputs()
                .iter()
                .filter(|s| floe_core::exchange::final_per_minute(s).is_some())
                .collect();
            if finals.is_empty() {
                continue;
            }
            let frontiers = op.final_frontiers();
            for stream in finals {
                out.push((stream.name.clone(), frontiers.clone()));
            }
        }
        out
    }

    /// Gauges per operator.
    pub(crate) fn stats(&self) -> Vec<(String, OperatorStats)> {
        self.configs
            .iter()
            .zip(&self.operators)
            .filter_map(|(c, op)| Some((c.id.clone(), op.as_ref()?.stats())))
            .collect()
    }

    /// Keys and bytes of the state store.
    pub(crate) fn state_size(&self) -> Option<(u64, u64)> {
        self.state.as_ref().map(StateStore::size)
    }
}
