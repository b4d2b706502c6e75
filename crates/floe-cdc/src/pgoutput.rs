//! The pgoutput logical-replication protocol (version 1), decoded from the payload of an
//! `XLogData` message.
//!
//! `pgwire-replication` hands over Begin and Commit already parsed; everything else arrives as
//! the raw pgoutput message this module decodes: Relation (a table's columns, sent before its
//! first change and again after every schema change), Type, Insert, Update, Delete, Truncate,
//! Origin and logical Message. Tuple values are in text format (`binary` is not requested), and
//! a TOASTed value the change did not touch is [`Value::Unchanged`] — it was not sent and must
//! not be mistaken for NULL.
//!
//! All integers are big-endian; strings are NUL-terminated. The layout is PostgreSQL's
//! "Logical Replication Message Formats" chapter.

use bytes::{Buf, Bytes};

use crate::types::Native;

/// A decoding failure: the payload is not the pgoutput message it claims to be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed pgoutput message: {0}")]
pub struct DecodeError(pub String);

type Result<T> = std::result::Result<T, DecodeError>;

/// One column of a relation as pgoutput describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationColumn {
    /// Part of the replica identity (the key).
    pub key: bool,
    /// Column name.
    pub name: String,
    /// Type OID.
    pub type_oid: u32,
    /// Type modifier (`-1` when none).
    pub type_modifier: i32,
}

/// A Relation message: the shape of a table's tuples from here on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// The table's OID.
    pub id: u32,
    /// Schema name (`pg_catalog` is sent as an empty string).
    pub namespace: String,
    /// Table name.
    pub name: String,
    /// Replica identity setting: `d` default, `n` nothing, `f` full, `i` index.
    pub replica_identity: u8,
    /// Columns, in tuple order.
    pub columns: Vec<RelationColumn>,
}

/// One value of a tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// A TOASTed value the change left as it was; not sent.
    Unchanged,
    /// The value in text format.
    Text(Bytes),
    /// The value already typed; pgoutput never sends one — a Debezium event's decimals,
    /// dates, times and integer timestamps decode to it.
    Native(Native),
}

/// A row image: one value per column of the relation.
pub type Tuple = Vec<Value>;

/// A decoded pgoutput message (Begin and Commit are parsed by the transport).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// The columns of a table.
    Relation(Relation),
    /// A user-defined type's name (sent before a relation using it).
    Type {
        /// Type OID.
        id: u32,
        /// Schema.
        namespace: String,
        /// Name.
        name: String,
    },
    /// A new row.
    Insert {
        /// Table OID.
        relation: u32,
        /// The row.
        new: Tuple,
    },
    /// A changed row. `old` is the key (replica identity `d`/`i`, only when the key changed)
    /// or the full old row (`f`); `None` when not sent.
    Update {
        /// Table OID.
        relation: u32,
        /// The old key or row, if sent.
        old: Option<OldTuple>,
        /// The new row (unchanged TOASTed values are [`Value::Unchanged`]).
        new: Tuple,
    },
    /// A removed row: the old key or the full old row.
    Delete {
        /// Table OID.
        relation: u32,
        /// The key or full row.
        old: OldTuple,
    },
    /// Tables emptied.
    Truncate {
        /// Table OIDs.
        relations: Vec<u32>,
        /// `CASCADE` (1) and `RESTART IDENTITY` (2) bits.
        options: u8,
    },
    /// Where the transaction came from (replicated from another node).
    Origin {
        /// The origin's commit LSN.
        lsn: u64,
        /// Origin name.
        name: String,
    },
    /// A `pg_logical_emit_message` message.
    Message {
        /// Transactional.
        transactional: bool,
        /// Its LSN.
        lsn: u64,
        /// The prefix.
        prefix: String,
        /// Content.
        content: Bytes,
    },
    /// Begin or Commit, when they reach this decoder (the transport parses them).
    Transaction,
}

/// An old image sent with an update or delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OldTuple {
    /// Only the replica-identity columns are set; others are NULL (`K`).
    Key(Tuple),
    /// The whole old row, TOASTed values detoasted (`O`, replica identity full).
    Full(Tuple),
}

impl OldTuple {
    /// The values.
    pub fn values(&self) -> &Tuple {
        match self {
            OldTuple::Key(t) | OldTuple::Full(t) => t,
        }
    }
}

struct Reader(Bytes);

impl Reader {
    fn need(&self, n: usize, what: &str) -> Result<()> {
        if self.0.remaining() < n {
            return Err(DecodeError(format!("truncated {what}")));
        }
        Ok(())
    }
    fn u8(&mut self, what: &str) -> Result<u8> {
        self.need(1, what)?;
        Ok(self.0.get_u8())
    }
    fn i16(&mut self, what: &str) -> Result<i16> {
        self.need(2, what)?;
        Ok(self.0.get_i16())
    }
    fn i32(&mut self, what: &str) -> Result<i32> {
        self.need(4, what)?;
        Ok(self.0.get_i32())
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        self.need(4, what)?;
        Ok(self.0.get_u32())
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        self.need(8, what)?;
        Ok(self.0.get_u64())
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let end = self
            .0
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(|| DecodeError(format!("unterminated {what}")))?;
        let text = String::from_utf8(self.0.split_to(end).to_vec())
            .map_err(|_| DecodeError(format!("{what} is not UTF-8")))?;
        self.0.advance(1);
        Ok(text)
    }
    fn bytes(&mut self, n: usize, what: &str) -> Result<Bytes> {
        self.need(n, what)?;
        Ok(self.0.split_to(n))
    }

    fn tuple(&mut self) -> Result<Tuple> {
        let n = self.i16("tuple column count")?;
        let mut values = Vec::with_capacity(n.max(0) as usize);
        for _ in 0..n {
            values.push(match self.u8("tuple value kind")? {
                b'n' => Value::Null,
                b'u' => Value::Unchanged,
                b't' | b'b' => {
                    let len = self.i32("value length")?;
                    if len < 0 {
                        return Err(DecodeError("negative value length".into()));
                    }
                    Value::Text(self.bytes(len as usize, "value")?)
                }
                other => {
                    return Err(DecodeError(format!(
                        "unknown tuple value kind {:?}",
                        other as char
                    )));
                }
            });
        }
        Ok(values)
    }
}

/// Decodes one pgoutput message.
pub fn decode(payload: Bytes) -> Result<Message> {
    let mut r = Reader(payload);
    let tag = r.u8("message tag")?;
    Ok(match tag {
        b'B' | b'C' => Message::Transaction,
        b'R' => {
            let id = r.u32("relation id")?;
            let namespace = r.string("namespace")?;
            let name = r.string("relation name")?;
            let replica_identity = r.u8("replica identity")?;
            let n = r.i16("column count")?;
            let mut columns = Vec::with_capacity(n.max(0) as usize);
            for _ in 0..n {
                let flags = r.u8("column flags")?;
                columns.push(RelationColumn {
                    key: flags & 1 == 1,
                    name: r.string("column name")?,
                    type_oid: r.u32("column type")?,
                    type_modifier: r.i32("type modifier")?,
                });
            }
            Message::Relation(Relation {
                id,
                namespace: if namespace.is_empty() {
                    "pg_catalog".into()
                } else {
                    namespace
                },
                name,
                replica_identity,
                columns,
            })
        }
        b'Y' => Message::Type {
            id: r.u32("type id")?,
            namespace: r.string("type namespace")?,
            name: r.string("type name")?,
        },
        b'I' => {
            let relation = r.u32("relation id")?;
            match r.u8("tuple tag")? {
                b'N' => Message::Insert {
                    relation,
                    new: r.tuple()?,
                },
                other => return Err(DecodeError(format!("insert tuple tag {:?}", other as char))),
            }
        }
        b'U' => {
            let relation = r.u32("relation id")?;
            let mut old = None;
            let new = loop {
                match r.u8("tuple tag")? {
                    b'K' => old = Some(OldTuple::Key(r.tuple()?)),
                    b'O' => old = Some(OldTuple::Full(r.tuple()?)),
                    b'N' => break r.tuple()?,
                    other => {
                        return Err(DecodeError(format!("update tuple tag {:?}", other as char)));
                    }
                }
            };
            Message::Update { relation, old, new }
        }
        b'D' => {
            let relation = r.u32("relation id")?;
            let old = match r.u8("tuple tag")? {
                b'K' => OldTuple::Key(r.tuple()?),
                b'O' => OldTuple::Full(r.tuple()?),
                other => return Err(DecodeError(format!("delete tuple tag {:?}", other as char))),
            };
            Message::Delete { relation, old }
        }
        b'T' => {
            let n = r.i32("relation count")?;
            let options = r.u8("truncate options")?;
            let mut relations = Vec::with_capacity(n.max(0) as usize);
            for _ in 0..n {
                relations.push(r.u32("relation id")?);
            }
            Message::Truncate { relations, options }
        }
        b'O' => Message::Origin {
            lsn: r.u64("origin lsn")?,
            name: r.string("origin name")?,
        },
        b'M' => {
            let transactional = r.u8("message flags")? & 1 == 1;
            let lsn = r.u64("message lsn")?;
            let prefix = r.string("message prefix")?;
            let len = r.i32("message length")?.max(0) as usize;
            Message::Message {
                transactional,
                lsn,
                prefix,
                content: r.bytes(len, "message content")?,
            }
        }
        other => {
            return Err(DecodeError(format!(
                "message tag {:?} is not part of protocol version 1",
                other as char
            )));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    fn tuple(out: &mut Vec<u8>, values: &[Option<&str>]) {
        out.put_i16(values.len() as i16);
        for v in values {
            match v {
                None => out.put_u8(b'n'),
                Some("<u>") => out.put_u8(b'u'),
                Some(text) => {
                    out.put_u8(b't');
                    out.put_i32(text.len() as i32);
                    out.put_slice(text.as_bytes());
                }
            }
        }
    }

    fn text(s: &str) -> Value {
        Value::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn relation_with_key_and_pg_catalog_namespace() {
        let mut m = vec![b'R'];
        m.put_u32(16384);
        m.put_slice(b"\0accounts\0");
        m.put_u8(b'd');
        m.put_i16(2);
        m.put_u8(1);
        m.put_slice(b"id\0");
        m.put_u32(20);
        m.put_i32(-1);
        m.put_u8(0);
        m.put_slice(b"balance\0");
        m.put_u32(1700);
        m.put_i32(((12 << 16) | 2) + 4);
        let Message::Relation(r) = decode(m.into()).unwrap() else {
            panic!("not a relation")
        };
        assert_eq!(r.namespace, "pg_catalog");
        assert_eq!(r.name, "accounts");
        assert_eq!(r.replica_identity, b'd');
        assert!(r.columns[0].key && !r.columns[1].key);
        assert_eq!(r.columns[1].type_oid, 1700);
        assert_eq!(r.columns[1].type_modifier, ((12 << 16) | 2) + 4);
    }

    #[test]
    fn update_with_key_change_and_unchanged_toast() {
        let mut m = vec![b'U'];
        m.put_u32(7);
        m.put_u8(b'K');
        tuple(&mut m, &[Some("2"), None, None]);
        m.put_u8(b'N');
        tuple(&mut m, &[Some("10"), Some("x"), Some("<u>")]);
        assert_eq!(
            decode(m.into()).unwrap(),
            Message::Update {
                relation: 7,
                old: Some(OldTuple::Key(vec![text("2"), Value::Null, Value::Null])),
                new: vec![text("10"), text("x"), Value::Unchanged],
            }
        );
    }

    #[test]
    fn insert_delete_truncate() {
        let mut m = vec![b'I'];
        m.put_u32(7);
        m.put_u8(b'N');
        tuple(&mut m, &[Some("1"), None]);
        assert_eq!(
            decode(m.into()).unwrap(),
            Message::Insert {
                relation: 7,
                new: vec![text("1"), Value::Null]
            }
        );
        let mut m = vec![b'D'];
        m.put_u32(7);
        m.put_u8(b'O');
        tuple(&mut m, &[Some("1"), Some("")]);
        assert_eq!(
            decode(m.into()).unwrap(),
            Message::Delete {
                relation: 7,
                old: OldTuple::Full(vec![text("1"), text("")])
            }
        );
        let mut m = vec![b'T'];
        m.put_i32(2);
        m.put_u8(1);
        m.put_u32(7);
        m.put_u32(8);
        assert_eq!(
            decode(m.into()).unwrap(),
            Message::Truncate {
                relations: vec![7, 8],
                options: 1
            }
        );
    }

    #[test]
    fn truncated_and_unknown_messages_are_errors() {
        let mut m = vec![b'I'];
        m.put_u32(7);
        m.put_u8(b'N');
        m.put_i16(1);
        m.put_u8(b't');
        m.put_i32(10);
        m.put_slice(b"abc");
        assert!(decode(m.into()).unwrap_err().0.contains("truncated value"));
        assert!(decode(Bytes::from_static(b"S")).is_err());
        assert!(decode(Bytes::new()).is_err());
    }
}
