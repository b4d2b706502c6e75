//! The job's [`Pipeline`] on a thread of its own, so that decoding the next rows (on the job
//! loop) and running the operators over the last ones use two cores.
//!
//! ```text
//!  job loop ──commands (in order)──> pipeline thread
//!     ^                                   │ one reply per command, in the same order
//!     └──── routed rows, sealed epochs ───┘
//! ```
//!
//! **Contract.** The thread runs commands strictly in the order they were sent and answers each
//! with exactly one reply, in that order. So a barrier's reply comes after the replies of every
//! batch sent before it, and the job lands those before the barrier's — a checkpoint holds
//! exactly what was read before it, as when the pipeline ran on the job loop. Rows are
//! pipelined: the job sends a batch and goes on reading while at most [`IN_FLIGHT`] commands
//! are unanswered. Anything that must not see later rows (a barrier, following new streams,
//! dropping an uncommitted checkpoint, restoring state) waits for every reply first.
//!
//! Source partitions are numbers on both sides; the thread learns their names (which
//! operators write into rows) from the commands that first mention them. The reader's
//! numbering only grows, so a name once sent stays right.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::mpsc;
use std::thread::JoinHandle;

use floe_core::{ReadItem, StreamSpec};
use floe_lake::{ErrorKind, LakeError, LakeResult};
use floe_ops::OperatorStats;
use floe_ops::config::OperatorConfig;
use floe_state::{Change, StateStore};

use crate::pipeline::{Pipeline, Routed};

/// Commands the job may have sent and not yet seen answered before it waits for replies.
pub(crate) const IN_FLIGHT: usize = 2;

/// Rows of the state table sent per command while restoring.
pub(crate) const LOAD_CHUNK: usize = 4096;

/// One committed state row: operator, partition, key, value.
pub(crate) type StateRow = (u16, u32, Vec<u8>, Vec<u8>);

/// What the operators report for gauges and for the checkpoint's watermarks, as of a barrier.
#[derive(Debug, Default, Clone)]
pub(crate) struct Status {
    /// Per operator: the watermark of each partition it saw.
    pub(crate) watermarks: Vec<(String, Vec<(u32, i64)>)>,
    /// Gauges per operator.
    pub(crate) stats: Vec<(String, OperatorStats)>,
    /// Keys and bytes of the state store.
    pub(crate) state_size: Option<(u64, u64)>,
    /// Per stream final per minute: each partition's frontier (see
    /// `Operator::final_frontiers`).
    pub(crate) frontiers: Vec<(String, Vec<(u32, i64)>)>,
}

/// A barrier's outcome besides the rows the operators flushed: the epoch it closed with its
/// changes (stateful pipelines), and the operators' status.
#[derive(Debug)]
pub(crate) struct Sealed {
    pub(crate) epoch: Option<(u64, Vec<Change>)>,
    pub(crate) status: Status,
}

/// A reply, in the order of the commands.
#[derive(Debug)]
pub(crate) enum Reply {
    /// Rows routed from a batch or a tick.
    Routed(Routed),
    /// A barrier's outcome: the rows the operators flushed, and the rest.
    Sealed(Routed, Box<Sealed>),
    /// The streams the built operators produce.
    Built(Vec<StreamSpec>),
    /// A command without output was done.
    Done,
}

enum Command {
    /// Items the reader read, with their streams' names.
    Items(Vec<(String, ReadItem)>),
    Tick(i64),
    Barrier,
    Build(Vec<StreamSpec>),
    Committed(u64),
    Clear,
    Load(Vec<StateRow>),
    Restored(Vec<u32>),
}

/// A command and the names of source partitions it is the first to mention.
struct Message {
    names: Vec<(u32, String)>,
    command: Command,
}

/// The job side of the pipeline thread.
pub(crate) struct PipelineThread {
    commands: Option<mpsc::Sender<Message>>,
    replies: tokio::sync::mpsc::UnboundedReceiver<LakeResult<Reply>>,
    /// Commands sent and not answered yet.
    pending: usize,
    /// Partitions whose names the thread was sent.
    named: HashSet<u32>,
    configs: Vec<OperatorConfig>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for PipelineThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineThread")
            .field("operators", &self.configs.len())
            .field("pending", &self.pending)
            .finish_non_exhaustive()
    }
}

fn stopped() -> LakeError {
    LakeError::new(ErrorKind::Invalid, "the pipeline thread stopped")
}

impl PipelineThread {
    /// Starts the thread running the operators of `configs` (producers first), their state in
    /// `state`.
    pub(crate) fn start(configs: Vec<OperatorConfig>, state: Option<StateStore>) -> Self {
        let (commands, inbox) = mpsc::channel::<Message>();
        let (outbox, replies) = tokio::sync::mpsc::unbounded_channel();
        let pipeline = Pipeline::new(configs.clone(), state);
        let thread = std::thread::Builder::new()
            .name("floe-pipeline".into())
            .spawn(move || serve(pipeline, &inbox, &outbox))
            .expect("spawning the pipeline thread");
        Self {
            commands: Some(commands),
            replies,
            pending: 0,
            named: HashSet::new(),
            configs,
            thread: Some(thread),
        }
    }

    /// The operators' ids, by index (their number in the state store).
    pub(crate) fn ids(&self) -> Vec<String> {
        self.configs.iter().map(|c| c.id.clone()).collect()
    }

    /// The configurations.
    pub(crate) fn configs(&self) -> &[OperatorConfig] {
        &self.configs
    }

    /// The fingerprint of every stateful operator.
    pub(crate) fn fingerprints(&self) -> BTreeMap<String, String> {
        self.configs
            .iter()
            .filter_map(|c| Some((c.id.clone(), c.fingerprint()?)))
            .collect()
    }

    /// Commands sent and not answered yet.
    pub(crate) fn pending(&self) -> usize {
        self.pending
    }

    fn send(
        &mut self,
        partitions: impl IntoIterator<Item = u32>,
        names: &dyn Fn(u32) -> String,
        command: Command,
    ) -> LakeResult<()> {
        let names = partitions
            .into_iter()
            .filter(|p| self.named.insert(*p))
            .map(|p| (p, names(p)))
            .collect();
        self.commands
            .as_ref()
            .ok_or_else(stopped)?
            .send(Message { names, command })
            .map_err(|_| stopped())?;
        self.pending += 1;
        Ok(())
    }

    /// Sends a command that names no source partition.
    fn command(&mut self, command: Command) -> LakeResult<()> {
        self.send([], &|_| String::new(), command)
    }

    /// Sends what the reader read (each item with its stream's name); answered with
    /// [`Reply::Routed`].
    pub(crate) fn items(
        &mut self,
        items: Vec<(String, ReadItem)>,
        names: &dyn Fn(u32) -> String,
    ) -> LakeResult<()> {
        let mut partitions = Vec::new();
        for (_, item) in &items {
            match item {
                ReadItem::Rows(rows) => partitions.extend(rows.runs.iter().map(|r| r.partition)),
                ReadItem::Clock { partition, .. } => partitions.push(*partition),
                ReadItem::Truncate(_) => {}
            }
        }
        self.send(partitions, names, Command::Items(items))
    }

    /// Processing time passed; answered with [`Reply::Routed`].
    pub(crate) fn tick(&mut self, now_ms: i64) -> LakeResult<()> {
        self.command(Command::Tick(now_ms))
    }

    /// The barrier; answered with [`Reply::Sealed`].
    pub(crate) fn barrier(&mut self) -> LakeResult<()> {
        self.command(Command::Barrier)
    }

    /// Builds the operators whose input is now known; answered with [`Reply::Built`].
    pub(crate) fn build(&mut self, known: Vec<StreamSpec>) -> LakeResult<()> {
        self.command(Command::Build(known))
    }

    /// The changes of epochs up to `epoch` are committed.
    pub(crate) fn committed(&mut self, epoch: u64) -> LakeResult<()> {
        self.command(Command::Committed(epoch))
    }

    /// Forgets all state (before restoring it).
    pub(crate) fn clear(&mut self) -> LakeResult<()> {
        self.command(Command::Clear)
    }

    /// Loads committed state rows (a chunk of about [`LOAD_CHUNK`]).
    pub(crate) fn load(&mut self, rows: Vec<StateRow>) -> LakeResult<()> {
        if rows.is_empty() {
            return Ok(());
        }
        self.command(Command::Load(rows))
    }

    /// Lets every stateful operator rebuild its memory of `partitions` from their state.
    pub(crate) fn restored(
        &mut self,
        partitions: Vec<u32>,
        names: &dyn Fn(u32) -> String,
    ) -> LakeResult<()> {
        self.send(partitions.clone(), names, Command::Restored(partitions))
    }

    /// The next reply, waiting for it if none is there; `None` when nothing is pending.
    pub(crate) async fn next(&mut self) -> LakeResult<Option<Reply>> {
        if self.pending == 0 {
            return Ok(None);
        }
        let Some(reply) = self.replies.recv().await else {
            self.pending = 0;
            return Err(stopped());
        };
        self.pending -= 1;
        reply.map(Some)
    }

    /// The next reply if one is there.
    pub(crate) fn ready(&mut self) -> LakeResult<Option<Reply>> {
        if self.pending == 0 {
            return Ok(None);
        }
        match self.replies.try_recv() {
            Ok(reply) => {
                self.pending -= 1;
                reply.map(Some)
            }
            Err(tokio::sync::mpsc::error::TryRecvError::Empty) => Ok(None),
            Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                self.pending = 0;
                Err(stopped())
            }
        }
    }
}

impl Drop for PipelineThread {
    /// Stops the thread and waits for it, so that its state store is closed (and its
    /// directory free) when the job is gone.
    fn drop(&mut self) {
        self.commands = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The thread: runs each command and answers it, until the job hangs up.
fn serve(
    mut pipeline: Pipeline,
    inbox: &mpsc::Receiver<Message>,
    outbox: &tokio::sync::mpsc::UnboundedSender<LakeResult<Reply>>,
) {
    let mut names: HashMap<u32, String> = HashMap::new();
    while let Ok(message) = inbox.recv() {
        names.extend(message.names);
        let reply = run(&mut pipeline, &names, message.command);
        if outbox.send(reply).is_err() {
            break;
        }
    }
}

fn run(
    pipeline: &mut Pipeline,
    names: &HashMap<u32, String>,
    command: Command,
) -> LakeResult<Reply> {
    let names = |p: u32| names.get(&p).cloned().unwrap_or_default();
    let mut routed = Routed::default();
    match command {
        Command::Items(items) => {
            for (stream, item) in items {
                match item {
                    ReadItem::Rows(rows) => pipeline.push(&stream, rows, &names, &mut routed)?,
                    ReadItem::Truncate(_) => pipeline.truncate(&stream, &mut routed),
                    ReadItem::Clock {
                        partition,
                        max_time,
                        ..
                    } => pipeline.clock(&stream, partition, max_time, &names, &mut routed)?,
                }
            }
            Ok(Reply::Routed(routed))
        }
        Command::Tick(now_ms) => {
            pipeline.tick(now_ms, &names, &mut routed)?;
            Ok(Reply::Routed(routed))
        }
        Command::Barrier => {
            let epoch = pipeline.barrier(&names, &mut routed)?;
            Ok(Reply::Sealed(
                routed,
                Box::new(Sealed {
                    epoch,
                    status: Status {
                        watermarks: pipeline.watermarks(),
                        stats: pipeline.stats(),
                        state_size: pipeline.state_size(),
                        frontiers: pipeline.frontiers(),
                    },
                }),
            ))
        }
        Command::Build(known) => {
            pipeline.build(&known)?;
            Ok(Reply::Built(pipeline.outputs()))
        }
        Command::Committed(epoch) => pipeline.committed(epoch).map(|()| Reply::Done),
        Command::Clear => pipeline.clear().map(|()| Reply::Done),
        Command::Load(rows) => {
            for (operator, partition, key, value) in rows {
                pipeline.load(operator, partition, &key, &value)?;
            }
            Ok(Reply::Done)
        }
        Command::Restored(partitions) => {
            pipeline.restored(&partitions, &names).map(|()| Reply::Done)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Array, Int64Array, RecordBatch};
    use floe_core::StreamBatch;
    use floe_ops::config::OperatorKind;
    use iceberg::spec::{NestedField, PrimitiveType, Type};

    use super::*;

    fn spec() -> StreamSpec {
        let schema = iceberg::spec::Schema::builder()
            .with_fields(vec![Arc::new(NestedField::required(
                1,
                "x",
                Type::Primitive(PrimitiveType::Long),
            ))])
            .build()
            .unwrap();
        StreamSpec::append("s", "s", schema)
    }

    /// `x > 1` over `s`, into `big`.
    fn filter() -> OperatorConfig {
        OperatorConfig {
            id: "big".into(),
            place: "job.toml:1:1".into(),
            input: "s".into(),
            inputs: vec!["s".into()],
            outputs: vec!["big".into()],
            kind: OperatorKind::Sql {
                columns: None,
                predicate: Some("x > 1".into()),
            },
        }
    }

    fn rows(values: Vec<i64>) -> ReadItem {
        let batch = RecordBatch::try_from_iter([(
            "x",
            Arc::new(Int64Array::from(values)) as arrow_array::ArrayRef,
        )])
        .unwrap();
        ReadItem::Rows(StreamBatch::single(0, batch, 7))
    }

    fn values(routed: &Routed) -> Vec<(String, Vec<i64>)> {
        routed
            .rows
            .iter()
            .map(|(stream, rows)| {
                let x = rows.batch.column(0);
                let x = x.as_any().downcast_ref::<Int64Array>().unwrap();
                (stream.clone(), x.values().to_vec())
            })
            .collect()
    }

    async fn routed(thread: &mut PipelineThread) -> Routed {
        match thread.next().await.unwrap() {
            Some(Reply::Routed(routed)) => routed,
            other => panic!("expected routed rows, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn replies_come_in_the_order_of_the_commands_with_the_barrier_after_every_batch_before_it()
     {
        let mut thread = PipelineThread::start(vec![filter()], None);
        thread.build(vec![spec()]).unwrap();
        match thread.next().await.unwrap() {
            Some(Reply::Built(outputs)) => assert_eq!(outputs[0].name, "big"),
            other => panic!("expected the built outputs, got {other:?}"),
        }
        let names = |p: u32| format!("topic/{p}");
        // Three batches and a barrier, sent without waiting for any reply.
        for first in [0, 10, 20] {
            thread
                .items(
                    vec![("s".into(), rows(vec![first, first + 1, first + 2]))],
                    &names,
                )
                .unwrap();
        }
        thread.tick(0).unwrap();
        thread.barrier().unwrap();
        assert_eq!(thread.pending(), 5);
        assert_eq!(
            values(&routed(&mut thread).await),
            [("big".into(), vec![2]), ("s".into(), vec![0, 1, 2])]
        );
        for first in [10, 20] {
            assert_eq!(
                values(&routed(&mut thread).await),
                [
                    ("big".into(), vec![first, first + 1, first + 2]),
                    ("s".into(), vec![first, first + 1, first + 2])
                ]
            );
        }
        assert!(values(&routed(&mut thread).await).is_empty());
        match thread.next().await.unwrap() {
            Some(Reply::Sealed(routed, sealed)) => {
                assert!(routed.rows.is_empty());
                assert!(sealed.epoch.is_none(), "a stateless pipeline has no epoch");
            }
            other => panic!("expected the barrier, got {other:?}"),
        }
        assert_eq!(thread.pending(), 0);
        assert!(thread.next().await.unwrap().is_none());
        assert!(thread.ready().unwrap().is_none());
    }

    #[tokio::test]
    async fn a_failing_command_answers_with_its_error_in_its_place_and_the_thread_goes_on() {
        let mut thread = PipelineThread::start(vec![filter()], None);
        let names = |p: u32| format!("topic/{p}");
        // Rows before the operator knows its input's columns are refused.
        thread
            .items(vec![("s".into(), rows(vec![5]))], &names)
            .unwrap();
        thread.build(vec![spec()]).unwrap();
        thread
            .items(vec![("s".into(), rows(vec![6]))], &names)
            .unwrap();
        let refused = thread.next().await.unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("before its input's columns were known"),
            "{refused}"
        );
        assert!(matches!(
            thread.next().await.unwrap(),
            Some(Reply::Built(_))
        ));
        assert_eq!(
            values(&routed(&mut thread).await),
            [("big".into(), vec![6]), ("s".into(), vec![6])]
        );
    }
}
