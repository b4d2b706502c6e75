//! The table writers, on a task of their own: the job loop decodes records into Arrow batches
//! while this task encodes the previous batches into Parquet, so both cores work.
//!
//! The channel between them holds at most [`QUEUE`] sets of batches, which bounds the memory
//! in flight and makes a slow writer slow down the reader (backpressure). At a barrier the loop
//! asks for the files ([`Writers::close`]); a dropped checkpoint deletes them
//! ([`Writers::abort`]). A write error is kept and returned by the next `close`.

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use floe_lake::rest::LoadedTable;
use floe_lake::writer::{DataWriter, WriterOptions};
use floe_lake::{ErrorKind, LakeError, LakeResult};
use iceberg::spec::DataFile;
use tokio::sync::{mpsc, oneshot};

use crate::tables::conform;

/// Batch sets waiting for the writer task.
const QUEUE: usize = 2;

/// One table's writer state.
pub(crate) struct Target {
    pub(crate) key: String,
    pub(crate) table: LoadedTable,
    pub(crate) arrow: SchemaRef,
    pub(crate) options: WriterOptions,
    writer: Option<DataWriter>,
    rows: u64,
}

impl Target {
    pub(crate) fn new(key: &str, table: LoadedTable, options: WriterOptions) -> LakeResult<Self> {
        let arrow = crate::tables::arrow_schema(table.metadata.current_schema())?;
        Ok(Self {
            key: key.to_string(),
            table,
            arrow,
            options,
            writer: None,
            rows: 0,
        })
    }

    async fn write(&mut self, batch: &RecordBatch) -> LakeResult<()> {
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
}

/// The files and rows each table got since the last barrier, in target order.
pub(crate) type Closed = Vec<(Vec<DataFile>, u64)>;

enum Command {
    Write(Vec<(String, RecordBatch)>),
    Close(oneshot::Sender<LakeResult<Closed>>),
    Abort(oneshot::Sender<()>),
}

/// The handle of the writer task.
pub(crate) struct Writers {
    commands: mpsc::Sender<Command>,
}

fn gone() -> LakeError {
    LakeError::new(ErrorKind::Invalid, "the table writer task stopped")
}

impl Writers {
    /// Starts the task; `targets` keep their order in [`Closed`].
    pub(crate) fn start(targets: Vec<Target>) -> Self {
        let (commands, receiver) = mpsc::channel(QUEUE);
        tokio::spawn(serve(targets, receiver));
        Self { commands }
    }

    /// Queues batches (keyed by target); waits while the queue is full.
    pub(crate) async fn write(&self, batches: Vec<(String, RecordBatch)>) -> LakeResult<()> {
        if batches.is_empty() {
            return Ok(());
        }
        self.commands
            .send(Command::Write(batches))
            .await
            .map_err(|_| gone())
    }

    /// Closes every open file and returns them (the barrier).
    pub(crate) async fn close(&self) -> LakeResult<Closed> {
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

async fn serve(mut targets: Vec<Target>, mut commands: mpsc::Receiver<Command>) {
    let mut failed: Option<LakeError> = None;
    while let Some(command) = commands.recv().await {
        match command {
            Command::Write(batches) => {
                if failed.is_some() {
                    continue;
                }
                for (key, batch) in batches {
                    let result = match targets.iter_mut().find(|t| t.key == key) {
                        Some(target) => target.write(&batch).await,
                        None => Err(LakeError::new(
                            ErrorKind::Invalid,
                            format!("no table {key}"),
                        )),
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
                        discard(&mut targets).await;
                        Err(e)
                    }
                    None => close(&mut targets).await,
                };
                let _ = reply.send(result);
            }
            Command::Abort(reply) => {
                failed = None;
                discard(&mut targets).await;
                let _ = reply.send(());
            }
        }
    }
}

async fn close(targets: &mut [Target]) -> LakeResult<Closed> {
    let mut out = Vec::with_capacity(targets.len());
    for target in targets.iter_mut() {
        let files = match target.writer.take() {
            Some(writer) => writer.close().await?,
            None => Vec::new(),
        };
        out.push((files, std::mem::take(&mut target.rows)));
    }
    Ok(out)
}

async fn discard(targets: &mut [Target]) {
    for target in targets.iter_mut() {
        target.rows = 0;
        if let Some(writer) = target.writer.take() {
            match writer.close().await {
                Ok(files) => {
                    for file in files {
                        let _ = target.table.io.delete(file.file_path()).await;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "could not close a dropped writer"),
            }
        }
    }
}
