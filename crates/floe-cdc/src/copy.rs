//! The initial copy of one table: `COPY (SELECT …) TO STDOUT (FORMAT binary)` inside the
//! slot's exported snapshot, parsed into Arrow batches.
//!
//! The binary format (PostgreSQL's "COPY — Binary Format"): an 11-byte signature, an Int32
//! flags field and an Int32 header-extension length (and extension); then per row an Int16
//! field count (`-1` ends the data) and per field an Int32 length (`-1` is NULL) and the value
//! in the type's binary send format. `CopyData` messages do not have to align with rows, so
//! the reader keeps what is left of a chunk for the next one.

use std::sync::Arc;
use std::time::Instant;

use arrow_array::RecordBatch;
use bytes::{Buf, BytesMut};
use floe_core::SourceError;
use futures::StreamExt;
use tokio::sync::mpsc;

use crate::changelog::Layout;
use crate::types::ColumnBuilder;

/// Rows per snapshot batch.
const BATCH_ROWS: usize = 16 * 1024;
/// A progress line about every this many rows of a table.
const PROGRESS_ROWS: u64 = 1_000_000;

const SIGNATURE: &[u8] = b"PGCOPY\n\xff\r\n\0";

/// One table to copy.
pub(crate) struct CopyTable<'a> {
    /// Its index among the source's tables.
    pub(crate) index: usize,
    /// `schema.table`, for messages.
    pub(crate) name: String,
    /// The quoted `schema.table`.
    pub(crate) from: String,
    /// The select list, one expression per column of `layout`.
    pub(crate) select: &'a [String],
    /// The columns.
    pub(crate) layout: &'a Layout,
    /// A `WHERE` condition (a chunk of an incremental snapshot); `None`: every row.
    pub(crate) filter: Option<String>,
}

/// The state of a binary COPY stream being parsed.
#[derive(Debug, Default)]
struct Reader {
    pending: BytesMut,
    header_done: bool,
    finished: bool,
}

impl Reader {
    /// Parses the complete rows in `pending` into `builders`; returns how many were added.
    fn rows(&mut self, builders: &mut [ColumnBuilder], limit: usize) -> Result<usize, String> {
        if !self.header_done {
            if self.pending.len() < SIGNATURE.len() + 8 {
                return Ok(0);
            }
            if &self.pending[..SIGNATURE.len()] != SIGNATURE {
                return Err("not a binary COPY stream".into());
            }
            let extension = u32::from_be_bytes(
                self.pending[SIGNATURE.len() + 4..SIGNATURE.len() + 8]
                    .try_into()
                    .expect("4 bytes"),
            ) as usize;
            if self.pending.len() < SIGNATURE.len() + 8 + extension {
                return Ok(0);
            }
            self.pending.advance(SIGNATURE.len() + 8 + extension);
            self.header_done = true;
        }
        let mut added = 0;
        while added < limit && !self.finished {
            // Check that the whole row is here before appending any of it.
            let buf = &self.pending[..];
            if buf.len() < 2 {
                break;
            }
            let fields = i16::from_be_bytes([buf[0], buf[1]]);
            if fields == -1 {
                self.finished = true;
                self.pending.advance(2);
                break;
            }
            if fields as usize != builders.len() {
                return Err(format!(
                    "a row of {fields} fields where {} columns were selected",
                    builders.len()
                ));
            }
            let mut at = 2;
            let mut complete = true;
            for _ in 0..fields {
                let Some(len) = buf.get(at..at + 4) else {
                    complete = false;
                    break;
                };
                let len = i32::from_be_bytes(len.try_into().expect("4 bytes"));
                at += 4 + len.max(0) as usize;
                if at > buf.len() {
                    complete = false;
                    break;
                }
            }
            if !complete {
                break;
            }
            let mut at = 2;
            for builder in builders.iter_mut() {
                let len = i32::from_be_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
                at += 4;
                let value = (len >= 0).then(|| &buf[at..at + len as usize]);
                at += len.max(0) as usize;
                builder.append_binary(value)?;
            }
            self.pending.advance(at);
            added += 1;
        }
        Ok(added)
    }
}

impl CopyTable<'_> {
    fn batch(&self, builders: &mut [ColumnBuilder]) -> Result<RecordBatch, SourceError> {
        let arrays: Vec<arrow_array::ArrayRef> = builders.iter_mut().map(|b| b.finish()).collect();
        let fields: Vec<arrow_schema::Field> = self
            .layout
            .iter()
            .zip(&arrays)
            .map(|(c, a)| arrow_schema::Field::new(&c.name, a.data_type().clone(), true))
            .collect();
        RecordBatch::try_new(Arc::new(arrow_schema::Schema::new(fields)), arrays).map_err(|e| {
            SourceError::internal(format!("postgres: snapshot batch of {}: {e}", self.name))
        })
    }

    /// Copies the table on `client` (inside the imported snapshot), sending batches of
    /// [`BATCH_ROWS`] rows to `tx`.
    pub(crate) async fn run(
        &self,
        client: &tokio_postgres::Client,
        tx: &mpsc::Sender<Result<(usize, RecordBatch), SourceError>>,
    ) -> Result<(), SourceError> {
        let failed =
            |e: String| SourceError::external(format!("postgres: copying {}: {e}", self.name));
        let sql = format!(
            "COPY (SELECT {} FROM {}{}) TO STDOUT (FORMAT binary)",
            self.select.join(", "),
            self.from,
            self.filter
                .as_ref()
                .map(|f| format!(" WHERE {f}"))
                .unwrap_or_default()
        );
        let began = Instant::now();
        let stream = client
            .copy_out(&sql)
            .await
            .map_err(|e| failed(e.to_string()))?;
        futures::pin_mut!(stream);
        let new_builders = || -> Vec<ColumnBuilder> {
            self.layout
                .iter()
                .map(|c| ColumnBuilder::new(c.ty, BATCH_ROWS))
                .collect()
        };
        let mut builders = new_builders();
        let mut reader = Reader::default();
        let (mut rows, mut total) = (0usize, 0u64);
        while let Some(chunk) = stream.next().await {
            reader
                .pending
                .extend_from_slice(&chunk.map_err(|e| failed(e.to_string()))?);
            loop {
                let added = reader
                    .rows(&mut builders, BATCH_ROWS - rows)
                    .map_err(failed)?;
                rows += added;
                if rows < BATCH_ROWS {
                    break;
                }
                total += rows as u64;
                rows = 0;
                if tx
                    .send(Ok((self.index, self.batch(&mut builders)?)))
                    .await
                    .is_err()
                {
                    return Ok(());
                }
                if total % PROGRESS_ROWS < BATCH_ROWS as u64 {
                    tracing::info!(
                        table = %self.name,
                        rows = total,
                        rows_per_second = (total as f64 / began.elapsed().as_secs_f64()) as u64,
                        "copying"
                    );
                }
            }
        }
        if rows > 0 {
            total += rows as u64;
            let _ = tx.send(Ok((self.index, self.batch(&mut builders)?))).await;
        }
        if self.filter.is_none() {
            tracing::info!(
                table = %self.name,
                rows = total,
                seconds = began.elapsed().as_secs_f64(),
                "table copied"
            );
        }
        Ok(())
    }

    /// Copies the rows on `client` into batches (one chunk of an incremental snapshot).
    pub(crate) async fn collect(
        &self,
        client: &tokio_postgres::Client,
    ) -> Result<Vec<RecordBatch>, SourceError> {
        let (tx, mut rx) = mpsc::channel(4);
        let mut received = Vec::new();
        let copy = async move {
            let result = self.run(client, &tx).await;
            drop(tx);
            result
        };
        let receive = async {
            while let Some(batch) = rx.recv().await {
                received.push(batch);
            }
        };
        let (result, ()) = tokio::join!(copy, receive);
        result?;
        let mut batches = Vec::with_capacity(received.len());
        for batch in received {
            batches.push(batch?.1);
        }
        Ok(batches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{PgType, Scalar};

    fn stream() -> Vec<u8> {
        let mut s = SIGNATURE.to_vec();
        s.extend_from_slice(&0i32.to_be_bytes());
        s.extend_from_slice(&0i32.to_be_bytes());
        for (id, name) in [(1i64, Some("a")), (2, None)] {
            s.extend_from_slice(&2i16.to_be_bytes());
            s.extend_from_slice(&8i32.to_be_bytes());
            s.extend_from_slice(&id.to_be_bytes());
            match name {
                Some(n) => {
                    s.extend_from_slice(&(n.len() as i32).to_be_bytes());
                    s.extend_from_slice(n.as_bytes());
                }
                None => s.extend_from_slice(&(-1i32).to_be_bytes()),
            }
        }
        s.extend_from_slice(&(-1i16).to_be_bytes());
        s
    }

    #[test]
    fn rows_split_across_chunks_are_read_whole() {
        let data = stream();
        let ty = |scalar| PgType {
            scalar,
            array: false,
        };
        for cut in 1..data.len() {
            let mut builders = vec![
                ColumnBuilder::new(ty(Scalar::Long), 2),
                ColumnBuilder::new(ty(Scalar::Text), 2),
            ];
            let mut reader = Reader::default();
            let mut rows = 0;
            for chunk in [&data[..cut], &data[cut..]] {
                reader.pending.extend_from_slice(chunk);
                rows += reader.rows(&mut builders, usize::MAX).unwrap();
            }
            assert_eq!(rows, 2, "cut at {cut}");
            assert!(reader.finished);
            let names = builders[1].finish();
            assert!(names.is_null(1));
        }
    }
}
