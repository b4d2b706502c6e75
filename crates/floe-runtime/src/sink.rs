//! The sinks: the tables a job lands its streams in, written on a task of their own.
//!
//! The job loop decodes (and runs operators) while this task encodes Parquet, so both cores
//! work. The channel between them holds at most [`QUEUE`] commands, which bounds the memory
//! in flight and makes a slow writer slow the reader down (backpressure).
//!
//! * An **append** sink streams rows into rolling data files as they come.
//! * An **upsert** sink (a changelog stream's table, keyed) collapses rows per key in an
//!   [`UpsertBuffer`] and writes equality deletes and the final rows at the barrier — on a task
//!   spawned for it, so the next checkpoint's rows keep flowing meanwhile. Rows without an op
//!   column — rows a database's snapshot copied, of keys the table does not hold — stream
//!   straight to data files as they come, like an append sink's. Changelog rows of the same
//!   checkpoint may change them again: the copied files are then committed first, in a
//!   snapshot of their own ([`SinkOutput::first_data_files`]), so that the changes' equality
//!   deletes reach them. A truncate drops the copied files written before it.
//!
//! At a barrier the loop asks for every sink's output ([`Sinks::close`]): each sink hands its
//! open files (and collapsed changes) to a task that finishes them, and the committer waits
//! for those tasks — the loop reads on meanwhile. A dropped checkpoint deletes its files
//! ([`Sinks::abort`]). A write error is kept and returned by the next close.
//!
//! Two clocks say which side waits: the task adds the time it works on a command (and the
//! finishing tasks theirs) to `busy`, and [`Sinks::write`] adds the time it waited for room
//! in the queue to `backpressure`.

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use floe_lake::rest::LoadedTable;
use floe_lake::tables::{arrow_schema, conform};
use floe_lake::writer::{DataWriter, EqualityDeleteWriter, WriterOptions, equality_delete_input};
use floe_lake::{ErrorKind, LakeError, LakeResult};
use iceberg::spec::DataFile;
use tokio::sync::{mpsc, oneshot};

use crate::upsert::{Collapsed, UpsertBuffer, is_changelog};

/// Commands waiting for the writer task.
const QUEUE: usize = 2;

/// What a sink wrote in one checkpoint.
#[derive(Debug, Default, Clone)]
pub(crate) struct SinkOutput {
    pub(crate) data_files: Vec<DataFile>,
    /// Copied rows' data files, committed in a snapshot before the others (after the
    /// truncate, if any) so that the delete files reach them.
    pub(crate) first_data_files: Vec<DataFile>,
    pub(crate) delete_files: Vec<DataFile>,
    /// Everything older is removed.
    pub(crate) truncate: bool,
    /// Rows written.
    pub(crate) rows: u64,
}

impl SinkOutput {
    /// Whether this output changes the table.
    pub(crate) fn is_empty(&self) -> bool {
        self.data_files.is_empty()
            && self.first_data_files.is_empty()
            && self.delete_files.is_empty()
            && !self.truncate
    }

    /// Every file written.
    pub(crate) fn files(&self) -> impl Iterator<Item = &DataFile> {
        self.first_data_files
            .iter()
            .chain(&self.data_files)
            .chain(&self.delete_files)
    }
}

/// A sink's output at a barrier: ready, or being encoded.
pub(crate) enum Closing {
    Ready(SinkOutput),
    Encoding(tokio::task::JoinHandle<LakeResult<SinkOutput>>),
}

impl Closing {
    /// The output, once encoded.
    pub(crate) async fn output(self) -> LakeResult<SinkOutput> {
        match self {
            Self::Ready(output) => Ok(output),
            Self::Encoding(task) => task.await.map_err(|e| {
                LakeError::new(ErrorKind::Invalid, format!("an encoding task failed: {e}"))
            })?,
        }
    }
}

/// How a sink writes.
#[derive(Debug, Clone)]
pub(crate) enum SinkKind {
    /// Every row is new.
    Append,
    /// Changelog rows, collapsed per key (the key columns).
    Upsert(Vec<String>),
}

/// One table's writer state.
pub(crate) struct Sink {
    table: LoadedTable,
    arrow: SchemaRef,
    options: WriterOptions,
    /// Rows going straight to data files (append sinks; an upsert sink's copied rows).
    writer: Option<DataWriter>,
    /// Files of writers closed before the barrier (a schema change rolls the writer).
    written: Vec<DataFile>,
    upsert: Option<UpsertBuffer>,
    rows: u64,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("table", &self.table.ident)
            .finish_non_exhaustive()
    }
}

fn invalid(message: impl Into<String>) -> LakeError {
    LakeError::new(ErrorKind::Invalid, message)
}

impl Sink {
    pub(crate) fn new(
        table: LoadedTable,
        options: WriterOptions,
        kind: SinkKind,
    ) -> LakeResult<Self> {
        let arrow = arrow_schema(table.metadata.current_schema())?;
        Ok(Self {
            table,
            arrow,
            options,
            writer: None,
            written: Vec::new(),
            upsert: match kind {
                SinkKind::Append => None,
                SinkKind::Upsert(key) => Some(UpsertBuffer::new(key)),
            },
            rows: 0,
        })
    }

    async fn write(&mut self, batch: &RecordBatch) -> LakeResult<()> {
        if let Some(upsert) = &mut self.upsert
            && is_changelog(batch)
        {
            return upsert.apply(batch);
        }
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let batch = conform(batch, &self.arrow)?;
        let writer = match &mut self.writer {
            Some(w) => w,
            None => self
                .writer
                .insert(DataWriter::data(&self.table, &self.options)?),
        };
        self.rows += batch.num_rows() as u64;
        writer.write(&batch).await
    }

    async fn truncate(&mut self) -> LakeResult<()> {
        match &mut self.upsert {
            Some(upsert) => {
                upsert.truncate();
                // Rows copied before the truncate go with it.
                self.drop_copied().await;
                Ok(())
            }
            None => Err(invalid(format!(
                "{}: a truncate on an append table",
                self.table.ident
            ))),
        }
    }

    /// The table's schema changed: files written so far stay, new rows use the new schema.
    async fn retable(&mut self, table: LoadedTable) -> LakeResult<()> {
        if let Some(writer) = self.writer.take() {
            self.written.extend(writer.close().await?);
        }
        self.arrow = arrow_schema(table.metadata.current_schema())?;
        self.table = table;
        Ok(())
    }

    /// The barrier: hands the open files and the collapsed changes to a task that finishes
    /// them, so that the next checkpoint's rows flow meanwhile (the committer waits for it);
    /// the task adds its working time to `busy`.
    fn close(&mut self, busy: &prometheus::Counter) -> LakeResult<Closing> {
        let written = std::mem::take(&mut self.written);
        let writer = self.writer.take();
        let rows = std::mem::take(&mut self.rows);
        let collapsed = match &mut self.upsert {
            Some(upsert) if !upsert.is_empty() => {
                // Collapse now (the buffer is needed empty for the next checkpoint).
                let key: Vec<String> = upsert.key().to_vec();
                let key_refs: Vec<&str> = key.iter().map(String::as_str).collect();
                let (_, delete_input) = equality_delete_input(&self.table, &key_refs)?;
                let delete_schema = arrow_schema(&delete_input)?;
                let copied = !written.is_empty() || writer.is_some();
                Some((key, upsert.finish(&self.arrow, &delete_schema, copied)?))
            }
            _ => None,
        };
        if writer.is_none() && collapsed.is_none() {
            return Ok(Closing::Ready(SinkOutput {
                data_files: written,
                rows,
                ..Default::default()
            }));
        }
        let (table, options, busy) = (self.table.clone(), self.options.clone(), busy.clone());
        Ok(Closing::Encoding(tokio::spawn(async move {
            let working = std::time::Instant::now();
            let output = finish(writer, written, rows, collapsed, &table, &options).await;
            busy.inc_by(working.elapsed().as_secs_f64());
            output
        })))
    }

    async fn discard(&mut self) {
        if let Some(upsert) = &mut self.upsert {
            upsert.clear();
        }
        self.drop_copied().await;
    }

    /// Deletes the data files written since the barrier.
    async fn drop_copied(&mut self) {
        self.rows = 0;
        let mut files = std::mem::take(&mut self.written);
        if let Some(writer) = self.writer.take() {
            match writer.close().await {
                Ok(more) => files.extend(more),
                Err(e) => tracing::warn!(error = %e, "could not close a dropped writer"),
            }
        }
        for file in files {
            let _ = self.table.io.delete(file.file_path()).await;
        }
    }
}

/// Finishes a sink's files of one checkpoint: the rows streamed to `writer` (after the
/// files already `written`), then the upsert buffer's `collapsed` changes.
async fn finish(
    writer: Option<DataWriter>,
    written: Vec<DataFile>,
    rows: u64,
    collapsed: Option<(Vec<String>, Collapsed)>,
    table: &LoadedTable,
    options: &WriterOptions,
) -> LakeResult<SinkOutput> {
    let mut streamed = written;
    if let Some(writer) = writer {
        streamed.extend(writer.close().await?);
    }
    let Some((key, collapsed)) = collapsed else {
        return Ok(SinkOutput {
            data_files: streamed,
            rows,
            ..Default::default()
        });
    };
    let mut output = SinkOutput {
        first_data_files: streamed,
        rows,
        truncate: collapsed.truncate,
        ..Default::default()
    };
    if let Some(deletes) = collapsed.deletes {
        let key_refs: Vec<&str> = key.iter().map(String::as_str).collect();
        let mut writer = EqualityDeleteWriter::equality(table, options, &key_refs)?;
        writer.write(&deletes).await?;
        output.delete_files = writer.close().await?;
    }
    if !collapsed.rows.is_empty() {
        let mut writer = DataWriter::data(table, options)?;
        for rows in &collapsed.rows {
            output.rows += rows.num_rows() as u64;
            writer.write(rows).await?;
        }
        output.data_files.extend(writer.close().await?);
    }
    Ok(output)
}

/// One input of a sink.
#[derive(Debug)]
pub(crate) enum SinkInput {
    Rows(RecordBatch),
    Truncate,
}

enum Command {
    Add(Box<Sink>),
    Retable(usize, Box<LoadedTable>),
    Write(Vec<(usize, SinkInput)>),
    Close(oneshot::Sender<LakeResult<Vec<Closing>>>),
    Abort(oneshot::Sender<()>),
}

/// The handle of the writer task.
#[derive(Debug)]
pub(crate) struct Sinks {
    commands: mpsc::Sender<Command>,
    count: usize,
    backpressure: prometheus::Counter,
}

fn gone() -> LakeError {
    invalid("the table writer task stopped")
}

impl Sinks {
    /// Starts the task with no sinks; it adds its working time to `busy`, and
    /// [`write`](Self::write) the time it waits for room to `backpressure` (seconds).
    pub(crate) fn start(busy: prometheus::Counter, backpressure: prometheus::Counter) -> Self {
        let (commands, receiver) = mpsc::channel(QUEUE);
        tokio::spawn(serve(receiver, busy));
        Self {
            commands,
            count: 0,
            backpressure,
        }
    }

    /// Adds a sink; returns its index (its place in [`close`](Self::close)'s outputs).
    pub(crate) async fn add(&mut self, sink: Sink) -> LakeResult<usize> {
        self.commands
            .send(Command::Add(Box::new(sink)))
            .await
            .map_err(|_| gone())?;
        self.count += 1;
        Ok(self.count - 1)
    }

    /// A sink's table gained columns.
    pub(crate) async fn retable(&self, sink: usize, table: LoadedTable) -> LakeResult<()> {
        self.commands
            .send(Command::Retable(sink, Box::new(table)))
            .await
            .map_err(|_| gone())
    }

    /// Queues inputs (keyed by sink); waits while the queue is full.
    pub(crate) async fn write(&self, inputs: Vec<(usize, SinkInput)>) -> LakeResult<()> {
        if inputs.is_empty() {
            return Ok(());
        }
        let waited = std::time::Instant::now();
        let sent = self.commands.send(Command::Write(inputs)).await;
        self.backpressure.inc_by(waited.elapsed().as_secs_f64());
        sent.map_err(|_| gone())
    }

    /// The barrier: every sink's output, in sink order.
    pub(crate) async fn close(&self) -> LakeResult<Vec<Closing>> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Close(reply))
            .await
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    /// Drops everything written since the last barrier, deleting its files.
    pub(crate) async fn abort(&self) {
        let (reply, answer) = oneshot::channel();
        if self.commands.send(Command::Abort(reply)).await.is_ok() {
            let _ = answer.await;
        }
    }
}

async fn serve(mut commands: mpsc::Receiver<Command>, busy: prometheus::Counter) {
    let mut sinks: Vec<Sink> = Vec::new();
    let mut failed: Option<LakeError> = None;
    while let Some(command) = commands.recv().await {
        let working = std::time::Instant::now();
        match command {
            Command::Add(sink) => sinks.push(*sink),
            Command::Retable(index, table) => {
                if let Some(sink) = sinks.get_mut(index)
                    && let Err(e) = sink.retable(*table).await
                    && failed.is_none()
                {
                    failed = Some(e);
                }
            }
            Command::Write(inputs) => {
                if failed.is_some() {
                    continue;
                }
                for (index, input) in inputs {
                    let result = match (sinks.get_mut(index), input) {
                        (Some(sink), SinkInput::Rows(batch)) => sink.write(&batch).await,
                        (Some(sink), SinkInput::Truncate) => sink.truncate().await,
                        (None, _) => Err(invalid(format!("no sink {index}"))),
                    };
                    if let Err(e) = result {
                        failed = Some(e);
                        break;
                    }
                }
            }
            Command::Close(reply) => {
                let result = match failed.take() {
                    Some(e) => {
                        for sink in &mut sinks {
                            sink.discard().await;
                        }
                        Err(e)
                    }
                    None => {
                        let mut out = Vec::with_capacity(sinks.len());
                        let mut error = None;
                        for sink in &mut sinks {
                            match sink.close(&busy) {
                                Ok(closing) => out.push(closing),
                                Err(e) => {
                                    error = Some(e);
                                    break;
                                }
                            }
                        }
                        match error {
                            Some(e) => Err(e),
                            None => Ok(out),
                        }
                    }
                };
                let _ = reply.send(result);
            }
            Command::Abort(reply) => {
                failed = None;
                for sink in &mut sinks {
                    sink.discard().await;
                }
                let _ = reply.send(());
            }
        }
        busy.inc_by(working.elapsed().as_secs_f64());
    }
}
