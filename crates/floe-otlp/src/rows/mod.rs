//! Decoded OTLP requests → Arrow rows of the tables in [`crate::schema`].
//!
//! [`TableBuilders`] holds one set of Arrow builders per table, made from the table's Arrow
//! schema, so the finished batches carry exactly the table's types (field ids included). Rows
//! are appended column by column in schema order through a [`Row`] cursor; the cursor checks
//! the builder type of each column, and [`TableBuilders::finish`] checks every column got the
//! same number of values, so an order mistake fails loudly in tests rather than writing a
//! shifted table.
//!
//! This module maps each signal onto its table's columns; the cursor lives in `cursor`, the
//! value conversions in `values`. Conversions (`../shared/reference/otlp.md` §3): ids become lowercase hex (empty or all-zero
//! → NULL); attributes become `map<string,string>` (scalars stringified, arrays and kvlists as
//! JSON, bytes as base64); times are kept raw in `*_unix_nano` and as µs `timestamptz`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use arrow_array::builder::{
    ArrayBuilder, BooleanBuilder, Float64Builder, Int32Builder, Int64Builder, ListBuilder,
    MapBuilder, StringBuilder, StructBuilder, TimestampMicrosecondBuilder, make_builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::SchemaRef;
use base64::Engine as _;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::LogsData;
use opentelemetry_proto::tonic::metrics::v1::{
    Exemplar, ExponentialHistogramDataPoint, HistogramDataPoint, Metric, MetricsData,
    NumberDataPoint, SummaryDataPoint, exemplar, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::TracesData;

use crate::schema::OtlpTable;

mod cursor;
mod profiles;
mod values;

use cursor::*;
use values::*;
pub use values::{any_to_string, hex_id};

/// Where a record came from: written on every row it produces.
#[derive(Debug, Clone, Copy)]
pub struct Lineage<'a> {
    /// Kafka topic (or the generator's stream name).
    pub topic: &'a str,
    /// Partition.
    pub partition: i32,
    /// Offset of the record.
    pub offset: i64,
    /// When Floe read it, µs since the epoch.
    pub ingested_at_us: i64,
}

/// Appends data points of one metric to its kind's table.
struct MetricPoints<'a> {
    m: &'a Metric,
    context: &'a Context<'a>,
    from: &'a Lineage<'a>,
    /// The next item ordinal within the record.
    item: &'a mut i32,
}

impl MetricPoints<'_> {
    /// One row per point: the columns every metric table starts with, the kind's own (`body`),
    /// then exemplars, resource, scope and lineage.
    fn append<P: Point>(
        &mut self,
        columns: &mut TableColumns,
        points: &[P],
        body: impl Fn(&mut Row<'_, Vec<AnyBuilder>>, &P),
    ) {
        let m = self.m;
        for p in points {
            let mut row = columns.row();
            row.ts(Some(p.time()));
            row.nanos(p.time());
            row.ts((p.start() != 0).then_some(p.start()));
            row.nanos_opt(p.start());
            row.str(Some(&m.name));
            row.text(&m.description);
            row.text(&m.unit);
            row.attributes(&m.metadata);
            row.attributes(p.attributes());
            row.uint(p.flags());
            body(&mut row, p);
            row.structs(p.exemplars(), |e, ex| {
                e.ts(Some(ex.time_unix_nano));
                e.nanos(ex.time_unix_nano);
                e.number(match ex.value {
                    Some(exemplar::Value::AsDouble(d)) => Some(Number::Double(d)),
                    Some(exemplar::Value::AsInt(i)) => Some(Number::Int(i)),
                    None => None,
                });
                e.id(&ex.span_id);
                e.id(&ex.trace_id);
                e.attributes(&ex.filtered_attributes);
            });
            self.context.append(&mut row);
            lineage(&mut row, self.from, *self.item);
            *self.item += 1;
        }
    }
}

/// What every kind of metric data point has.
trait Point {
    fn time(&self) -> u64;
    fn start(&self) -> u64;
    fn attributes(&self) -> &[KeyValue];
    fn flags(&self) -> u32;
    fn exemplars(&self) -> &[Exemplar];
}

macro_rules! point {
    ($type:ty, $p:ident => $exemplars:expr) => {
        impl Point for $type {
            fn time(&self) -> u64 {
                self.time_unix_nano
            }
            fn start(&self) -> u64 {
                self.start_time_unix_nano
            }
            fn attributes(&self) -> &[KeyValue] {
                &self.attributes
            }
            fn flags(&self) -> u32 {
                self.flags
            }
            fn exemplars(&self) -> &[Exemplar] {
                let $p = self;
                $exemplars
            }
        }
    };
}

point!(NumberDataPoint, p => &p.exemplars);
point!(HistogramDataPoint, p => &p.exemplars);
point!(ExponentialHistogramDataPoint, p => &p.exemplars);
// Summaries carry no exemplars.
point!(SummaryDataPoint, _p => &[]);

/// The resource and scope part every row carries.
struct Context<'a> {
    resource: Option<&'a Resource>,
    resource_schema_url: &'a str,
    scope: Option<&'a InstrumentationScope>,
    scope_schema_url: &'a str,
    promoted: &'a Promoted,
}

#[derive(Default)]
struct Promoted {
    service_name: Option<String>,
    service_namespace: Option<String>,
    service_instance_id: Option<String>,
    deployment_environment: Option<String>,
    service_version: Option<String>,
    team: Option<String>,
}

impl Promoted {
    /// The promoted columns of `resource`; `team` names the attribute of the `team` column.
    fn of(resource: Option<&Resource>, team: &str) -> Self {
        let mut found: BTreeMap<&str, String> = BTreeMap::new();
        for kv in resource
            .map(|r| r.attributes.as_slice())
            .unwrap_or_default()
        {
            if let Some(value) = &kv.value {
                found.insert(kv.key.as_str(), any_to_string(value));
            }
        }
        // Looked up before the removals: the team may be any attribute, even a promoted one.
        let team = found.get(team).cloned();
        Self {
            team,
            service_name: Some(
                found
                    .remove("service.name")
                    .unwrap_or_else(|| "unknown_service".into()),
            ),
            service_namespace: found.remove("service.namespace"),
            service_instance_id: found.remove("service.instance.id"),
            deployment_environment: found
                .remove("deployment.environment.name")
                .or_else(|| found.remove("deployment.environment")),
            service_version: found.remove("service.version"),
        }
    }
}

impl Context<'_> {
    fn append<S: Slots>(&self, row: &mut Row<'_, S>) {
        row.str(self.promoted.service_name.as_deref());
        row.str(self.promoted.service_namespace.as_deref());
        row.str(self.promoted.service_instance_id.as_deref());
        row.str(self.promoted.deployment_environment.as_deref());
        row.str(self.promoted.service_version.as_deref());
        row.str(self.promoted.team.as_deref());
        row.attributes(
            self.resource
                .map(|r| r.attributes.as_slice())
                .unwrap_or_default(),
        );
        row.text(self.resource_schema_url);
        row.uint(self.resource.map_or(0, |r| r.dropped_attributes_count));
        row.text(self.scope.map_or("", |s| s.name.as_str()));
        row.text(self.scope.map_or("", |s| s.version.as_str()));
        row.attributes(
            self.scope
                .map(|s| s.attributes.as_slice())
                .unwrap_or_default(),
        );
        row.text(self.scope_schema_url);
    }
}

fn lineage<S: Slots>(row: &mut Row<'_, S>, from: &Lineage<'_>, item: i32) {
    row.str(Some(from.topic));
    row.int(Some(from.partition));
    row.long(Some(from.offset));
    row.int(Some(item));
    row.builder::<TimestampMicrosecondBuilder>()
        .append_value(from.ingested_at_us);
}

/// The resource attribute the `team` column holds unless the job names another.
pub const DEFAULT_TEAM_ATTRIBUTE: &str = "team";

/// Arrow builders for every OTLP table; append decoded requests, then [`Self::finish`].
pub struct TableBuilders {
    tables: Vec<(OtlpTable, TableColumns)>,
    team_attribute: String,
}

impl std::fmt::Debug for TableBuilders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.tables.iter().map(|(t, c)| (t, c.rows)))
            .finish()
    }
}

impl Default for TableBuilders {
    fn default() -> Self {
        Self::new()
    }
}

impl TableBuilders {
    /// Empty builders for every table.
    pub fn new() -> Self {
        Self {
            tables: OtlpTable::ALL
                .iter()
                .map(|t| (*t, TableColumns::new(t.arrow_schema())))
                .collect(),
            team_attribute: DEFAULT_TEAM_ATTRIBUTE.into(),
        }
    }

    /// The `team` column holds the resource attribute `name` (default
    /// [`DEFAULT_TEAM_ATTRIBUTE`]).
    pub fn with_team_attribute(mut self, name: impl Into<String>) -> Self {
        self.team_attribute = name.into();
        self
    }

    fn columns(&mut self, table: OtlpTable) -> &mut TableColumns {
        self.columns_and_team(table).0
    }

    /// A table's builders and the team attribute, borrowed together.
    fn columns_and_team(&mut self, table: OtlpTable) -> (&mut TableColumns, &str) {
        (&mut self.tables[table as usize].1, &self.team_attribute)
    }

    /// Rows appended since the last [`Self::finish`], over all tables.
    pub fn rows(&self) -> usize {
        self.tables.iter().map(|(_, c)| c.rows).sum()
    }

    /// Rows of one table appended since the last [`Self::finish`].
    pub fn table_rows(&self, table: OtlpTable) -> usize {
        self.tables[table as usize].1.rows
    }

    /// The batches of every table that has rows; the builders start empty again.
    pub fn finish(&mut self) -> Vec<(OtlpTable, RecordBatch)> {
        self.tables
            .iter_mut()
            .filter(|(_, c)| c.rows > 0)
            .map(|(t, c)| (*t, c.finish()))
            .collect()
    }

    /// Appends every span; returns how many.
    pub fn append_traces(&mut self, data: &TracesData, from: &Lineage<'_>) -> usize {
        let (columns, team) = self.columns_and_team(OtlpTable::Spans);
        let mut item = 0;
        for rs in &data.resource_spans {
            let promoted = Promoted::of(rs.resource.as_ref(), team);
            for ss in &rs.scope_spans {
                let context = Context {
                    resource: rs.resource.as_ref(),
                    resource_schema_url: &rs.schema_url,
                    scope: ss.scope.as_ref(),
                    scope_schema_url: &ss.schema_url,
                    promoted: &promoted,
                };
                for span in &ss.spans {
                    let mut row = columns.row();
                    row.ts(Some(span.start_time_unix_nano));
                    row.nanos(span.start_time_unix_nano);
                    row.nanos(span.end_time_unix_nano);
                    row.long(Some(
                        span.end_time_unix_nano
                            .saturating_sub(span.start_time_unix_nano)
                            as i64,
                    ));
                    row.id(&span.trace_id);
                    row.id(&span.span_id);
                    row.id(&span.parent_span_id);
                    row.bool(Some(span.parent_span_id.iter().all(|b| *b == 0)));
                    row.text(&span.trace_state);
                    row.uint(span.flags);
                    row.str(Some(&span.name));
                    row.str(Some(span_kind(span.kind)));
                    let status = span.status.as_ref();
                    row.str(Some(status_code(status.map_or(0, |s| s.code))));
                    row.text(status.map_or("", |s| s.message.as_str()));
                    row.attributes(&span.attributes);
                    row.uint(span.dropped_attributes_count);
                    row.uint(span.dropped_events_count);
                    row.uint(span.dropped_links_count);
                    row.structs(&span.events, |e, event| {
                        e.ts(Some(event.time_unix_nano));
                        e.nanos(event.time_unix_nano);
                        e.str(Some(&event.name));
                        e.attributes(&event.attributes);
                        e.uint(event.dropped_attributes_count);
                    });
                    row.structs(&span.links, |l, link| {
                        l.id(&link.trace_id);
                        l.id(&link.span_id);
                        l.text(&link.trace_state);
                        l.uint(link.flags);
                        l.attributes(&link.attributes);
                        l.uint(link.dropped_attributes_count);
                    });
                    context.append(&mut row);
                    lineage(&mut row, from, item);
                    item += 1;
                }
            }
        }
        item as usize
    }

    /// Appends every log record; returns how many.
    pub fn append_logs(&mut self, data: &LogsData, from: &Lineage<'_>) -> usize {
        let (columns, team) = self.columns_and_team(OtlpTable::Logs);
        let mut item = 0;
        for rl in &data.resource_logs {
            let promoted = Promoted::of(rl.resource.as_ref(), team);
            for sl in &rl.scope_logs {
                let context = Context {
                    resource: rl.resource.as_ref(),
                    resource_schema_url: &rl.schema_url,
                    scope: sl.scope.as_ref(),
                    scope_schema_url: &sl.schema_url,
                    promoted: &promoted,
                };
                for log in &sl.log_records {
                    let mut row = columns.row();
                    let time = if log.time_unix_nano != 0 {
                        log.time_unix_nano
                    } else {
                        log.observed_time_unix_nano
                    };
                    row.ts(Some(time));
                    row.nanos_opt(log.time_unix_nano);
                    row.nanos_opt(log.observed_time_unix_nano);
                    row.id(&log.trace_id);
                    row.id(&log.span_id);
                    row.uint(log.flags);
                    row.int(Some(log.severity_number));
                    row.text(&log.severity_text);
                    row.text(&log.event_name);
                    let body = log.body.as_ref();
                    row.str(body.map(any_to_string).as_deref());
                    row.str(Some(body_type(body)));
                    row.attributes(&log.attributes);
                    row.uint(log.dropped_attributes_count);
                    context.append(&mut row);
                    lineage(&mut row, from, item);
                    item += 1;
                }
            }
        }
        item as usize
    }

    /// Appends every data point to its kind's table; returns how many.
    pub fn append_metrics(&mut self, data: &MetricsData, from: &Lineage<'_>) -> usize {
        let mut item = 0;
        for rm in &data.resource_metrics {
            let promoted = Promoted::of(rm.resource.as_ref(), &self.team_attribute);
            for sm in &rm.scope_metrics {
                let context = Context {
                    resource: rm.resource.as_ref(),
                    resource_schema_url: &rm.schema_url,
                    scope: sm.scope.as_ref(),
                    scope_schema_url: &sm.schema_url,
                    promoted: &promoted,
                };
                for m in &sm.metrics {
                    item = self.append_metric(m, &context, from, item);
                }
            }
        }
        item as usize
    }

    fn append_metric(
        &mut self,
        m: &Metric,
        context: &Context<'_>,
        from: &Lineage<'_>,
        mut item: i32,
    ) -> i32 {
        let Some(data) = &m.data else {
            return item;
        };
        let mut points = MetricPoints {
            m,
            context,
            from,
            item: &mut item,
        };
        let number = |value: Option<number_data_point::Value>| match value {
            Some(number_data_point::Value::AsDouble(d)) => Some(Number::Double(d)),
            Some(number_data_point::Value::AsInt(i)) => Some(Number::Int(i)),
            None => None,
        };
        match data {
            metric::Data::Gauge(g) => {
                let columns = self.columns(OtlpTable::Gauge);
                points.append(columns, &g.data_points, |row, p| {
                    row.number(number(p.value))
                });
            }
            metric::Data::Sum(s) => {
                let columns = self.columns(OtlpTable::Sum);
                points.append(columns, &s.data_points, |row, p| {
                    row.number(number(p.value));
                    row.int(Some(s.aggregation_temporality));
                    row.bool(Some(s.is_monotonic));
                });
            }
            metric::Data::Histogram(h) => {
                let columns = self.columns(OtlpTable::Histogram);
                points.append(columns, &h.data_points, |row, p| {
                    row.long(Some(p.count as i64));
                    row.double(p.sum);
                    row.double(p.min);
                    row.double(p.max);
                    row.longs(&p.bucket_counts);
                    row.doubles(&p.explicit_bounds);
                    row.int(Some(h.aggregation_temporality));
                });
            }
            metric::Data::ExponentialHistogram(h) => {
                let columns = self.columns(OtlpTable::ExponentialHistogram);
                points.append(columns, &h.data_points, |row, p| {
                    row.long(Some(p.count as i64));
                    row.double(p.sum);
                    row.double(p.min);
                    row.double(p.max);
                    row.int(Some(p.scale));
                    row.long(Some(p.zero_count as i64));
                    row.double(Some(p.zero_threshold));
                    for buckets in [p.positive.as_ref(), p.negative.as_ref()] {
                        row.int(Some(buckets.map_or(0, |b| b.offset)));
                        row.longs(
                            buckets
                                .map(|b| b.bucket_counts.as_slice())
                                .unwrap_or_default(),
                        );
                    }
                    row.int(Some(h.aggregation_temporality));
                });
            }
            metric::Data::Summary(s) => {
                let columns = self.columns(OtlpTable::Summary);
                points.append(columns, &s.data_points, |row, p| {
                    row.long(Some(p.count as i64));
                    row.double(Some(p.sum));
                    row.structs(&p.quantile_values, |q, v| {
                        q.double(Some(v.quantile));
                        q.double(Some(v.value));
                    });
                });
            }
        }
        item
    }
}
