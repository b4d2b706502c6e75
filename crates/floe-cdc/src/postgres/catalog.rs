//! What the job reads from (and creates in) the Postgres catalog: the publication and its
//! tables — columns, key, replica identity and TOAST — checked against what Floe can follow,
//! the types of columns added later, and the replication slot's state.

use std::sync::Arc;

use floe_core::SourceError;
use iceberg::spec::{NestedField, Schema};

use super::{PostgresConfig, err};
use crate::changelog::{Column, Layout};
use crate::types::{self, PgType, TypeInfo};

/// One followed table.
#[derive(Debug, Clone)]
pub(super) struct PgTable {
    pub(super) schema: String,
    pub(super) name: String,
    pub(super) iceberg_name: String,
    pub(super) layout: Layout,
    /// The select list of the initial binary `COPY` (see [`types::copy_expression`]).
    pub(super) copy_columns: Vec<String>,
    /// The key columns (quoted) and their SQL types with the column's collation (`text
    /// COLLATE pg_catalog."C"`), in index order: the order chunks of an incremental snapshot
    /// walk, which comparisons of keys must follow.
    pub(super) key_order: Vec<(String, String)>,
    /// Every column the Iceberg table has: `layout` plus columns dropped at the source since
    /// the job started (kept, NULL from then on). `None` while equal to `layout`.
    pub(super) layout_union: Option<Layout>,
    /// The Iceberg schema (ids assigned here; the catalog renumbers them).
    pub(super) iceberg: Schema,
    /// Transactions with a commit LSN below this are in the table's last commit.
    pub(super) committed_end: u64,
}

impl PgTable {
    pub(super) fn qualified(&self) -> String {
        format!("{}.{}", self.schema, self.name)
    }

    /// Whether this is table `schema.table`.
    pub(super) fn is(&self, qualified: &str) -> bool {
        qualified.split_once('.') == Some((self.schema.as_str(), self.name.as_str()))
    }

    pub(super) fn quoted(&self) -> String {
        format!("{}.{}", quote(&self.schema), quote(&self.name))
    }
}

/// A quoted SQL identifier.
pub(super) fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// The Iceberg schema of `layout`: key columns required and the identifier fields.
pub(crate) fn iceberg_schema(layout: &[Column]) -> Result<Schema, String> {
    let mut next = layout.len() as i32 + 1;
    let mut fields = Vec::new();
    let mut identifier = Vec::new();
    for (i, c) in layout.iter().enumerate() {
        let id = i as i32 + 1;
        let element = next;
        if c.ty.array {
            next += 1;
        }
        let ty = c.ty.iceberg(element);
        fields.push(Arc::new(if c.key {
            identifier.push(id);
            NestedField::required(id, &c.name, ty)
        } else {
            NestedField::optional(id, &c.name, ty)
        }));
    }
    Schema::builder()
        .with_fields(fields)
        .with_identifier_field_ids(identifier)
        .build()
        .map_err(|e| e.to_string())
}

/// A `schema.table` of the job file, quoted (a bare name is in `public`).
fn quoted_table(table: &str) -> String {
    match table.split_once('.') {
        Some((s, n)) => format!("{}.{}", quote(s), quote(n)),
        None => format!("{}.{}", quote("public"), quote(table)),
    }
}

/// A `schema.table` of the job file as Floe names streams (a bare name is in `public`).
fn qualified_table(table: &str) -> String {
    if table.contains('.') {
        table.to_string()
    } else {
        format!("public.{table}")
    }
}

/// Creates the publication if it does not exist — for `config.tables`, or all tables — and
/// adds the listed tables it lacks (a table added to the job file), so that their changes
/// are streamed from here on. Tables are never dropped from it: a table taken out of the job
/// file is refused by the runtime first (`--stop-following`).
pub(super) async fn ensure_publication(
    client: &tokio_postgres::Client,
    config: &PostgresConfig,
) -> Result<(), SourceError> {
    let exists = client
        .query_opt(
            "SELECT puballtables FROM pg_publication WHERE pubname = $1",
            &[&config.publication],
        )
        .await
        .map_err(|e| err("reading pg_publication", e))?
        .map(|row| row.get::<_, bool>(0));
    let listed: Vec<String> = config.tables.iter().map(|t| quoted_table(t)).collect();
    let sql = match exists {
        None if listed.is_empty() => format!(
            "CREATE PUBLICATION {} FOR ALL TABLES",
            quote(&config.publication)
        ),
        None => format!(
            "CREATE PUBLICATION {} FOR TABLE {}",
            quote(&config.publication),
            listed.join(", ")
        ),
        Some(true) => return Ok(()),
        Some(false) => {
            let rows = client
                .query(
                    "SELECT schemaname::text || '.' || tablename::text FROM pg_publication_tables \
                     WHERE pubname = $1",
                    &[&config.publication],
                )
                .await
                .map_err(|e| err("reading the publication's tables", e))?;
            let published: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
            let missing: Vec<String> = config
                .tables
                .iter()
                .filter(|t| !published.contains(&qualified_table(t)))
                .map(|t| quoted_table(t))
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            format!(
                "ALTER PUBLICATION {} ADD TABLE {}",
                quote(&config.publication),
                missing.join(", ")
            )
        }
    };
    tracing::info!(%sql, "publication");
    client
        .batch_execute(&sql)
        .await
        .map_err(|e| err("creating or extending the publication", e))
}

/// The publication's tables with their columns, keys and Iceberg schemas (with their OIDs);
/// every table that cannot be followed is one problem of the error.
pub(super) async fn read_tables(
    client: &tokio_postgres::Client,
    config: &PostgresConfig,
) -> Result<Vec<(u32, PgTable)>, SourceError> {
    let rows = client
        .query(
            "SELECT c.oid, n.nspname::text, c.relname::text, c.relreplident::text \
             FROM pg_publication_tables p \
             JOIN pg_namespace n ON n.nspname = p.schemaname \
             JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename \
             WHERE p.pubname = $1 ORDER BY 2, 3",
            &[&config.publication],
        )
        .await
        .map_err(|e| err("reading the publication's tables", e))?;
    // A job that lists its tables follows those, whatever else the publication holds.
    let listed: Vec<String> = config.tables.iter().map(|t| qualified_table(t)).collect();
    let rows: Vec<_> = rows
        .into_iter()
        .filter(|row| {
            listed.is_empty()
                || listed.contains(&format!(
                    "{}.{}",
                    row.get::<_, String>(1),
                    row.get::<_, String>(2)
                ))
        })
        .collect();
    if rows.is_empty() {
        return Err(SourceError::user(format!(
            "postgres: publication {} has no tables",
            config.publication
        )));
    }
    let mut problems = Vec::new();
    let mut tables = Vec::new();
    for row in rows {
        let oid: u32 = row.get(0);
        let schema: String = row.get(1);
        let name: String = row.get(2);
        let identity: String = row.get(3);
        match read_table(client, config, oid, &schema, &name, &identity).await {
            Ok(table) => tables.push((oid, table)),
            Err(problem) => problems.push(problem),
        }
    }
    if !problems.is_empty() {
        return Err(SourceError::user(problems.join("\n")));
    }
    Ok(tables)
}

pub(super) async fn read_table(
    client: &tokio_postgres::Client,
    config: &PostgresConfig,
    oid: u32,
    schema: &str,
    name: &str,
    identity: &str,
) -> Result<PgTable, String> {
    let qualified = format!("{schema}.{name}");
    let db = |e: tokio_postgres::Error| format!("postgres: reading table {qualified}: {e}");
    // The key: the replica-identity index under `USING INDEX`, else the primary key.
    let key_rows = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) || \
               coalesce((SELECT ' COLLATE ' || quote_ident(n.nspname) || '.' || \
                 quote_ident(c.collname) FROM pg_collation c \
                 JOIN pg_namespace n ON n.oid = c.collnamespace WHERE c.oid = a.attcollation), '') \
             FROM pg_index i \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
             WHERE i.indrelid = $1 AND CASE WHEN $2 = 'i' THEN i.indisreplident \
             ELSE i.indisprimary END \
             ORDER BY array_position(i.indkey::int2[], a.attnum)",
            &[&oid, &identity],
        )
        .await
        .map_err(db)?;
    let keys: Vec<String> = key_rows.iter().map(|r| r.get(0)).collect();
    let key_order: Vec<(String, String)> = key_rows
        .iter()
        .map(|r| (quote(&r.get::<_, String>(0)), r.get(1)))
        .collect();
    if keys.is_empty() {
        return Err(format!(
            "table {qualified} has no primary key: Floe keeps a table equal to its source \
             by key; add a primary key (or a unique index used as REPLICA IDENTITY)"
        ));
    }
    if identity == "n" {
        return Err(format!(
            "table {qualified} has REPLICA IDENTITY NOTHING: its updates and deletes \
             carry no key; set REPLICA IDENTITY DEFAULT or FULL"
        ));
    }
    let columns = client
        .query(
            "SELECT a.attname::text, \
               (CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END)::int4, \
               a.attstorage::text, \
               (e.oid IS NOT NULL), \
               COALESCE(e.typname, b.typname)::text, \
               COALESCE(e.typtype, b.typtype)::text \
             FROM pg_attribute a \
             JOIN pg_type t ON t.oid = a.atttypid \
             JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype \
               ELSE a.atttypid END \
             LEFT JOIN pg_type e ON b.typcategory = 'A' AND b.typelem <> 0 AND e.oid = b.typelem \
             WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped \
               AND a.attgenerated = '' \
             ORDER BY a.attnum",
            &[&oid],
        )
        .await
        .map_err(db)?;
    let mut layout = Vec::new();
    let mut copy_columns = Vec::new();
    let mut problems = Vec::new();
    let mut toastable = Vec::new();
    for row in &columns {
        let column: String = row.get(0);
        let modifier: i32 = row.get(1);
        let storage: String = row.get(2);
        let array: bool = row.get(3);
        let type_name: String = row.get(4);
        let kind: String = row.get(5);
        match types::map_type(&TypeInfo {
            name: &type_name,
            kind: kind.bytes().next().unwrap_or(b'b'),
            array,
            modifier,
        }) {
            Ok(ty) => {
                if storage == "x" || storage == "e" {
                    toastable.push(column.clone());
                }
                copy_columns.push(types::copy_expression(&quote(&column), ty, &type_name));
                layout.push(Column {
                    key: keys.contains(&column),
                    name: column,
                    ty,
                })
            }
            Err(e) => problems.push(format!("table {qualified}, column {column}: {e}")),
        }
    }
    if !problems.is_empty() {
        return Err(problems.join("\n"));
    }
    // Postgres gives a table a TOAST relation only if its rows can outgrow a page's
    // quarter (`needs_toast_table`); without one, no value is ever stored out of line.
    let has_toast: bool = client
        .query_one(
            "SELECT reltoastrelid <> 0 FROM pg_class WHERE oid = $1",
            &[&oid],
        )
        .await
        .map_err(db)?
        .get(0);
    if identity != "f" && has_toast && !toastable.is_empty() {
        if config.replica_identity_full {
            let sql = format!(
                "ALTER TABLE {}.{} REPLICA IDENTITY FULL",
                quote(schema),
                quote(name)
            );
            tracing::info!(%sql, "setting the replica identity");
            client.batch_execute(&sql).await.map_err(db)?;
        } else {
            return Err(format!(
                "table {qualified}: columns {} can be TOASTed, and under REPLICA IDENTITY \
                 {} an update that leaves them unchanged does not carry their value; run \
                 ALTER TABLE {qualified} REPLICA IDENTITY FULL (or set \
                 replica_identity_full = true in [source.postgres])",
                toastable.join(", "),
                if identity == "i" {
                    "USING INDEX"
                } else {
                    "DEFAULT"
                }
            ));
        }
    }
    let iceberg = iceberg_schema(&layout).map_err(|e| format!("table {qualified}: {e}"))?;
    let iceberg_name = config
        .table_names
        .get(&qualified)
        .cloned()
        .unwrap_or_else(|| crate::changelog::default_table_name(schema, name));
    Ok(PgTable {
        schema: schema.to_string(),
        name: name.to_string(),
        iceberg_name,
        layout: Arc::new(layout),
        copy_columns,
        key_order,
        layout_union: None,
        iceberg,
        committed_end: 0,
    })
}

/// The slot's restart LSN, confirmed flush LSN and retained WAL bytes, if the slot exists.
pub(super) async fn slot_state(
    client: &tokio_postgres::Client,
    slot: &str,
) -> Result<Option<SlotState>, SourceError> {
    let row = client
        .query_opt(
            "SELECT restart_lsn::text, confirmed_flush_lsn::text, \
               COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::int8, \
               COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::int8, \
               active \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(|e| err("reading pg_replication_slots", e))?;
    Ok(row.map(|r| SlotState {
        retained_wal_bytes: r.get(2),
        lag_bytes: r.get(3),
        active: r.get(4),
    }))
}

/// The mapped type of a column's type OID (domains resolved), for a column added later.
pub(super) async fn type_of(
    client: &tokio_postgres::Client,
    oid: u32,
    modifier: i32,
) -> Result<PgType, SourceError> {
    let row = client
        .query_one(
            "SELECT (e.oid IS NOT NULL), COALESCE(e.typname, b.typname)::text, \
               COALESCE(e.typtype, b.typtype)::text, \
               (CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE $2 END)::int4 \
             FROM pg_type t \
             JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END \
             LEFT JOIN pg_type e ON b.typcategory = 'A' AND b.typelem <> 0 AND e.oid = b.typelem \
             WHERE t.oid = $1",
            &[&oid, &modifier],
        )
        .await
        .map_err(|e| err("reading pg_type", e))?;
    let name: String = row.get(1);
    let kind: String = row.get(2);
    types::map_type(&TypeInfo {
        name: &name,
        kind: kind.bytes().next().unwrap_or(b'b'),
        array: row.get(0),
        modifier: row.get(3),
    })
    .map_err(|e| SourceError::user(format!("postgres: a new column: {e}")))
}

/// Slot health, for metrics.
#[derive(Debug, Clone, Copy)]
pub struct SlotState {
    /// WAL the slot keeps on the server (from its restart LSN).
    pub retained_wal_bytes: i64,
    /// WAL written since the slot's confirmed flush LSN.
    pub lag_bytes: i64,
    /// A session is streaming from it.
    pub active: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iceberg_schema_keys_are_required_identifiers() {
        let col = |name: &str, key, array| Column {
            name: name.into(),
            ty: PgType {
                scalar: types::Scalar::Long,
                array,
            },
            key,
        };
        let schema = iceberg_schema(&[col("id", true, false), col("tags", false, true)]).unwrap();
        assert_eq!(schema.identifier_field_ids().collect::<Vec<_>>(), vec![1]);
        assert!(schema.field_by_name("id").unwrap().required);
        assert!(matches!(
            *schema.field_by_name("tags").unwrap().field_type,
            iceberg::spec::Type::List(_)
        ));
    }
}
