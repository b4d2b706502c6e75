//! The status pages a person reads in a browser: `/` lists the namespaces and their tables
//! (with the catalog's request and commit counts), `/tables/{namespace}/{table}` shows one
//! table — its current snapshot, schema, partitioning, properties, branches and tags, and its
//! snapshots newest first. The namespace in the path is its dot-joined form (namespace parts
//! hold no dots).
//!
//! They read what a `loadTable` reads (the pointer store and the metadata file) and pass the
//! same authentication as the REST routes. HTML from [`floe_process::html`]: no script,
//! nothing from another host, every name and value escaped; an error is an HTML page with the
//! REST error's status.

use std::fmt::Write as _;

use axum::response::Html;
use floe_process::html::{Cell, bytes, escape, head, link, number, sum, table, tiles, utc};
use iceberg::spec::TableMetadata;

use super::*;

/// Snapshots the table page lists at most (the newest).
const SNAPSHOTS_SHOWN: usize = 200;

/// A path segment with everything but unreserved characters percent-encoded.
fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The link to a table's page.
fn table_href(namespace: &Namespace, table: &str) -> String {
    format!(
        "/tables/{}/{}",
        segment(&namespace.stored()),
        segment(table)
    )
}

/// An error as a page, with the status the REST route would answer.
fn error_page(error: ApiError) -> Response {
    let mut out = String::new();
    head(&mut out, "floe-catalog");
    let _ = writeln!(
        out,
        "<p>{}: {}</p><p><a href=\"/\">all tables</a></p></body></html>",
        escape(error.kind.name()),
        escape(&error.message)
    );
    (error.kind.status(), Html(out)).into_response()
}

/// `GET /`: namespaces and their tables.
pub(super) async fn home(State(state): State<AppState>) -> Response {
    match home_page(&state).await {
        Ok(html) => Html(html).into_response(),
        Err(e) => error_page(e),
    }
}

async fn home_page(state: &AppState) -> ApiResult<String> {
    let store = state.catalog.store();
    let mut tables = Vec::new();
    let namespaces = store.list_namespaces().await?;
    for namespace in &namespaces {
        for name in store.list_tables(namespace).await? {
            tables.push((namespace.clone(), name));
        }
    }
    let families = state.metrics.gather();
    let mut out = String::with_capacity(8 << 10);
    head(&mut out, &format!("floe-catalog {}", state.prefix));
    let _ = write!(
        out,
        "<p>warehouse <code>{}</code> · REST prefix <code>/v1/{}</code> · \
         <a href=\"/metrics\">/metrics</a></p>",
        escape(state.catalog.warehouse().root()),
        escape(&state.prefix)
    );
    tiles(
        &mut out,
        &[
            ("namespaces", number(namespaces.len() as f64)),
            ("tables", number(tables.len() as f64)),
            (
                "requests",
                number(sum(&families, "floe_catalog_requests_total")),
            ),
            (
                "commits",
                number(sum(&families, "floe_catalog_commit_seconds")),
            ),
            (
                "commit conflicts",
                number(sum(&families, "floe_catalog_commit_conflicts_total")),
            ),
        ],
    );
    out.push_str("<h2>Tables</h2>");
    table(
        &mut out,
        &["namespace", "table"],
        tables.iter().map(|(namespace, name)| {
            vec![
                Cell::from(namespace.stored()),
                link(table_href(namespace, name), name.clone()),
            ]
        }),
    );
    let empty: Vec<String> = namespaces
        .iter()
        .filter(|ns| !tables.iter().any(|(t, _)| t == *ns))
        .map(Namespace::stored)
        .collect();
    if !empty.is_empty() {
        let _ = write!(
            out,
            "<p>Namespaces without tables: {}</p>",
            escape(&empty.join(", "))
        );
    }
    out.push_str("</body></html>\n");
    Ok(out)
}

/// `GET /tables/{namespace}/{table}`: one table.
pub(super) async fn table_page(
    State(state): State<AppState>,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    let loaded = async {
        let table = TableName::new(Namespace::from_stored(&namespace)?, name)?;
        let (location, metadata) = state.catalog.load(&table).await?;
        Ok::<_, ApiError>((table, location, metadata))
    };
    match loaded.await {
        Ok((table, location, metadata)) => {
            Html(render_table(&table, &location, &metadata)).into_response()
        }
        Err(e) => error_page(e),
    }
}

fn render_table(name: &TableName, location: &str, metadata: &TableMetadata) -> String {
    let mut out = String::with_capacity(16 << 10);
    head(&mut out, &name.to_string());
    let _ = write!(
        out,
        "<p><a href=\"/\">all tables</a> · metadata <code>{}</code></p>",
        escape(location)
    );
    let current = metadata.current_snapshot();
    // Totals as the current snapshot's summary has them (a writer may leave them out).
    let total = |key: &str, show: fn(f64) -> String| {
        current
            .and_then(|s| s.summary().additional_properties.get(key))
            .and_then(|v| v.parse::<f64>().ok())
            .map(show)
            .unwrap_or_else(|| "-".to_string())
    };
    tiles(
        &mut out,
        &[
            ("format version", format!("{}", metadata.format_version())),
            ("snapshots", number(metadata.snapshots().len() as f64)),
            ("rows", total("total-records", number)),
            ("data files", total("total-data-files", number)),
            ("delete files", total("total-delete-files", number)),
            ("size", total("total-files-size", bytes)),
            ("last change (UTC)", utc(metadata.last_updated_ms())),
        ],
    );

    out.push_str("<h2>Schema</h2>");
    let schema = metadata.current_schema();
    table(
        &mut out,
        &["id", "column", "type", "required", "doc"],
        schema.as_struct().fields().iter().map(|f| {
            vec![
                f.id.to_string(),
                f.name.clone(),
                f.field_type.to_string(),
                if f.required { "yes" } else { "no" }.to_string(),
                f.doc.clone().unwrap_or_default(),
            ]
        }),
    );
    let identifiers: Vec<String> = schema
        .identifier_field_ids()
        .filter_map(|id| schema.name_by_field_id(id).map(str::to_string))
        .collect();
    if !identifiers.is_empty() {
        let _ = write!(
            out,
            "<p>Identifier (key) columns: {}</p>",
            escape(&identifiers.join(", "))
        );
    }

    out.push_str("<h2>Partitioning and sort order</h2>");
    let spec = metadata.default_partition_spec();
    table(
        &mut out,
        &["partition field", "source column", "transform"],
        spec.fields().iter().map(|f| {
            vec![
                f.name.clone(),
                schema
                    .name_by_field_id(f.source_id)
                    .unwrap_or_default()
                    .to_string(),
                f.transform.to_string(),
            ]
        }),
    );
    let order = metadata.default_sort_order();
    if !order.fields.is_empty() {
        let fields: Vec<String> = order
            .fields
            .iter()
            .map(|f| {
                format!(
                    "{} {} {}",
                    schema.name_by_field_id(f.source_id).unwrap_or_default(),
                    f.direction,
                    f.null_order
                )
            })
            .collect();
        let _ = write!(out, "<p>Sorted by {}</p>", escape(&fields.join(", ")));
    }

    out.push_str("<h2>Branches and tags</h2>");
    table(
        &mut out,
        &["name", "kind", "snapshot"],
        refs(metadata).into_iter().map(|(name, kind, id)| {
            vec![name, kind, id.map(|i| i.to_string()).unwrap_or_default()]
        }),
    );

    let _ = write!(
        out,
        "<h2>Snapshots</h2><p>The newest {} of {}.</p>",
        SNAPSHOTS_SHOWN.min(metadata.snapshots().len()),
        metadata.snapshots().len()
    );
    let mut snapshots: Vec<_> = metadata.snapshots().collect();
    snapshots.sort_by_key(|s| std::cmp::Reverse((s.sequence_number(), s.timestamp_ms())));
    let current_id = metadata.current_snapshot_id();
    table(
        &mut out,
        &[
            "snapshot",
            "parent",
            "sequence",
            "committed (UTC)",
            "operation",
            "added rows",
            "deleted rows",
            "added files",
            "total rows",
        ],
        snapshots.into_iter().take(SNAPSHOTS_SHOWN).map(|s| {
            let get = |k: &str| {
                s.summary()
                    .additional_properties
                    .get(k)
                    .and_then(|v| v.parse::<f64>().ok())
                    .map(number)
                    .unwrap_or_default()
            };
            let id = if Some(s.snapshot_id()) == current_id {
                format!("{} (current)", s.snapshot_id())
            } else {
                s.snapshot_id().to_string()
            };
            vec![
                id,
                s.parent_snapshot_id()
                    .map(|p| p.to_string())
                    .unwrap_or_default(),
                s.sequence_number().to_string(),
                utc(s.timestamp_ms()),
                s.summary().operation.as_str().to_string(),
                get("added-records"),
                get("deleted-records"),
                get("added-data-files"),
                get("total-records"),
            ]
        }),
    );

    out.push_str("<h2>Properties</h2>");
    let mut properties: Vec<_> = metadata.properties().iter().collect();
    properties.sort();
    table(
        &mut out,
        &["property", "value"],
        properties
            .into_iter()
            .map(|(k, v)| vec![k.clone(), v.clone()]),
    );
    out.push_str("</body></html>\n");
    out
}

/// The table's references: (name, `branch` or `tag`, snapshot), by name. The metadata keeps
/// them private, so they are read from its serialized form.
fn refs(metadata: &TableMetadata) -> Vec<(String, String, Option<i64>)> {
    let value = serde_json::to_value(metadata).unwrap_or_default();
    let mut out: Vec<_> = value
        .get("refs")
        .and_then(Value::as_object)
        .map(|refs| {
            refs.iter()
                .map(|(name, r)| {
                    (
                        name.clone(),
                        r.get("type")
                            .and_then(Value::as_str)
                            .unwrap_or("branch")
                            .to_string(),
                        r.get("snapshot-id").and_then(Value::as_i64),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_survive_any_name() {
        let ns = Namespace::from_parts(vec!["a".into(), "b c".into()]).unwrap();
        assert_eq!(table_href(&ns, "t/1?"), "/tables/a.b%20c/t%2F1%3F");
    }
}
