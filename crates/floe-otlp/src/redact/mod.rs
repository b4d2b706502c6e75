//! Redaction of decoded OTLP records before any row is built (`[redaction]`, issue 29).
//!
//! Every string a table carries is scanned by one [`Redactor`]: resource, scope, span,
//! event, link, log, data point, exemplar, metric metadata and profile attributes (and every
//! string nested in their arrays and kvlists), log bodies, span and event names, status
//! messages, log event names and metric descriptions. A key's rule (`keys`) applies whatever
//! the value's type. Not scanned: attribute keys, identifiers and names the protocol defines
//! (metric and scope names, trace states, units, schema URLs) and profiles' symbol tables
//! (function and file names), and numbers unless a key's rule names them. A finding is masked
//! or hashed in place, its attribute (or nested entry, or the body) removed, or the span, log
//! record, data point or profile sample that holds it dropped — one on a resource or scope
//! drops everything under it. Each finding is counted under (minute of the item's event
//! time, service, signal, field, detector, action): the `pii_findings` stream. Values are
//! never kept.

use std::collections::BTreeMap;

mod config;
mod findings;

pub use config::{DEFAULT_HASH_KEY_ENV, RawRedaction, Redaction, check_redaction};
pub use findings::{FINDINGS_STREAM, FINDINGS_TABLE, FindingsBuilder};

use floe_pii::{Action, Finding, Outcome, Redactor};
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{Exemplar, metric};
use opentelemetry_proto::tonic::resource::v1::Resource;

use crate::decode::Decoded;

/// What a finding is counted under: (event-time minute µs, service, signal, field, detector,
/// action).
pub type FindingKey = (i64, String, &'static str, String, String, Action);

/// Findings counted per [`FindingKey`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Findings(pub BTreeMap<FindingKey, u64>);

/// What happens to the thing that held a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Keep,
    DropAttribute,
    DropRecord,
}

const MINUTE_NS: u64 = 60_000_000_000;

/// The minute (µs) of an event time in ns; 0 for none.
fn minute(ns: u64) -> i64 {
    ((ns / MINUTE_NS) * 60_000_000) as i64
}

/// One record's scan: where findings are counted.
struct Scan<'a> {
    redactor: &'a Redactor,
    findings: &'a mut Findings,
    signal: &'static str,
    service: String,
    minute: i64,
}

impl Scan<'_> {
    /// Counts one finding at `field`.
    fn count(&mut self, field: &str, finder: &str, action: Action) {
        let at = (
            self.minute,
            self.service.clone(),
            self.signal,
            field.to_string(),
            finder.to_string(),
            action,
        );
        *self.findings.0.entry(at).or_default() += 1;
    }

    /// Redacts `text` (the value of `key`, at `field`) in place.
    fn text(&mut self, field: &str, key: Option<&str>, text: &mut String) -> Verdict {
        let mut found: Vec<Finding> = Vec::new();
        let outcome = self.redactor.redact(key, text, &mut |f| found.push(f));
        for f in found {
            self.count(field, f.finder.name(), f.action);
        }
        match outcome {
            Outcome::Kept => Verdict::Keep,
            Outcome::Replaced(new) => {
                *text = new;
                Verdict::Keep
            }
            Outcome::DropAttribute => Verdict::DropAttribute,
            Outcome::DropRecord => Verdict::DropRecord,
        }
    }

    /// Redacts every string in `value`; entries of nested arrays and kvlists that must go are
    /// removed. A key allowed is not looked into; a key's rule applies to its value whatever
    /// its type (a number or a kvlist masked or hashed becomes a string).
    fn value(&mut self, field: &str, key: Option<&str>, value: &mut AnyValue) -> Verdict {
        if let Some(key) = key {
            if self.redactor.allows(key) {
                return Verdict::Keep;
            }
            let string = matches!(value.value, Some(any_value::Value::StringValue(_)));
            if let (Some(action), false) = (self.redactor.key_rule(key), string) {
                let text = crate::rows::any_to_string(value);
                self.count(field, "key", action);
                return match self.redactor.apply_whole(action, &text) {
                    Outcome::Replaced(new) => {
                        value.value = Some(any_value::Value::StringValue(new));
                        Verdict::Keep
                    }
                    Outcome::Kept => Verdict::Keep,
                    Outcome::DropAttribute => Verdict::DropAttribute,
                    Outcome::DropRecord => Verdict::DropRecord,
                };
            }
        }
        match value.value.as_mut() {
            Some(any_value::Value::StringValue(s)) => self.text(field, key, s),
            Some(any_value::Value::ArrayValue(array)) => {
                let mut verdict = Verdict::Keep;
                array
                    .values
                    .retain_mut(|v| match self.value(field, key, v) {
                        Verdict::Keep => true,
                        Verdict::DropAttribute => false,
                        Verdict::DropRecord => {
                            verdict = Verdict::DropRecord;
                            true
                        }
                    });
                verdict
            }
            Some(any_value::Value::KvlistValue(list)) => {
                match self.attributes(field, &mut list.values) {
                    true => Verdict::DropRecord,
                    false => Verdict::Keep,
                }
            }
            _ => Verdict::Keep,
        }
    }

    /// Redacts an attribute map (`field` names it in the findings); whether its record goes.
    fn attributes(&mut self, field: &str, attributes: &mut Vec<KeyValue>) -> bool {
        let mut drop_record = false;
        attributes.retain_mut(|kv| {
            let Some(value) = kv.value.as_mut() else {
                return true;
            };
            match self.value(field, Some(&kv.key), value) {
                Verdict::Keep => true,
                Verdict::DropAttribute => false,
                Verdict::DropRecord => {
                    drop_record = true;
                    true
                }
            }
        });
        drop_record
    }

    /// A resource's attributes, counted at `minute`; its service (after redaction) becomes
    /// the scan's. Whether everything under it goes.
    fn resource(&mut self, resource: Option<&mut Resource>, minute: i64) -> bool {
        self.minute = minute;
        self.service = String::new();
        let Some(r) = resource else { return false };
        let drop = self.attributes("resource.attributes", &mut r.attributes);
        self.service = service_name(&r.attributes);
        drop
    }

    /// A scope's attributes, counted at `minute` (which the items under it then refine);
    /// whether everything under it goes.
    fn scope(&mut self, scope: Option<&mut InstrumentationScope>, minute: i64) -> bool {
        self.minute = minute;
        scope.is_some_and(|s| self.attributes("scope.attributes", &mut s.attributes))
    }
}

/// A resource's `service.name`, or "".
fn service_name(attributes: &[KeyValue]) -> String {
    attributes
        .iter()
        .find(|kv| kv.key == "service.name")
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

/// Redacts `decoded` in place under `redactor`, counting into `findings`.
pub fn redact(decoded: &mut Decoded, redactor: &Redactor, findings: &mut Findings) {
    let signal = match decoded {
        Decoded::Traces(_) => "traces",
        Decoded::Logs(_) => "logs",
        Decoded::Metrics(_) => "metrics",
        Decoded::Profiles(_) => "profiles",
    };
    let mut scan = Scan {
        redactor,
        findings,
        signal,
        service: String::new(),
        minute: 0,
    };
    match decoded {
        Decoded::Traces(data) => traces(&mut scan, data),
        Decoded::Logs(data) => logs(&mut scan, data),
        Decoded::Metrics(data) => metrics(&mut scan, data),
        Decoded::Profiles(data) => profiles(&mut scan, data),
    }
}

fn traces(scan: &mut Scan<'_>, data: &mut opentelemetry_proto::tonic::trace::v1::TracesData) {
    data.resource_spans.retain_mut(|rs| {
        let first = rs.scope_spans.iter().flat_map(|s| &s.spans).next();
        let first = minute(first.map_or(0, |s| s.start_time_unix_nano));
        if scan.resource(rs.resource.as_mut(), first) {
            return false;
        }
        rs.scope_spans.retain_mut(|ss| {
            if scan.scope(
                ss.scope.as_mut(),
                minute(ss.spans.first().map_or(0, |s| s.start_time_unix_nano)),
            ) {
                return false;
            }
            ss.spans.retain_mut(|span| {
                scan.minute = minute(span.start_time_unix_nano);
                let mut drop = scan.attributes("span.attributes", &mut span.attributes);
                drop |= gone(scan.text("span.name", None, &mut span.name), &mut span.name);
                if let Some(status) = span.status.as_mut() {
                    let verdict = scan.text("span.status_message", None, &mut status.message);
                    drop |= gone(verdict, &mut status.message);
                }
                for event in &mut span.events {
                    let verdict = scan.text("span.events.name", None, &mut event.name);
                    drop |= gone(verdict, &mut event.name);
                    drop |= scan.attributes("span.events.attributes", &mut event.attributes);
                }
                for link in &mut span.links {
                    drop |= scan.attributes("span.links.attributes", &mut link.attributes);
                }
                !drop
            });
            true
        });
        true
    });
}

/// A field that is no attribute: dropping "the attribute" empties it. Whether its record goes.
fn gone(verdict: Verdict, text: &mut String) -> bool {
    match verdict {
        Verdict::Keep => false,
        Verdict::DropAttribute => {
            text.clear();
            false
        }
        Verdict::DropRecord => true,
    }
}

fn logs(scan: &mut Scan<'_>, data: &mut opentelemetry_proto::tonic::logs::v1::LogsData) {
    let time = |l: &opentelemetry_proto::tonic::logs::v1::LogRecord| {
        if l.time_unix_nano > 0 {
            l.time_unix_nano
        } else {
            l.observed_time_unix_nano
        }
    };
    data.resource_logs.retain_mut(|rl| {
        let first = rl.scope_logs.iter().flat_map(|s| &s.log_records).next();
        if scan.resource(rl.resource.as_mut(), minute(first.map_or(0, time))) {
            return false;
        }
        rl.scope_logs.retain_mut(|sl| {
            if scan.scope(
                sl.scope.as_mut(),
                minute(sl.log_records.first().map_or(0, time)),
            ) {
                return false;
            }
            sl.log_records.retain_mut(|log| {
                scan.minute = minute(time(log));
                let mut drop = scan.attributes("log.attributes", &mut log.attributes);
                drop |= gone(
                    scan.text("log.event_name", None, &mut log.event_name),
                    &mut log.event_name,
                );
                if let Some(body) = log.body.as_mut() {
                    match scan.value("log.body", None, body) {
                        Verdict::Keep => {}
                        Verdict::DropAttribute => log.body = None,
                        Verdict::DropRecord => drop = true,
                    }
                }
                !drop
            });
            true
        });
        true
    });
}

/// A data point's time and attribute maps.
trait Point {
    fn time(&self) -> u64;
    /// Redacts its attributes and its exemplars'; whether it goes.
    fn redact(&mut self, scan: &mut Scan<'_>) -> bool;
}

fn exemplars(scan: &mut Scan<'_>, exemplars: &mut [Exemplar]) -> bool {
    let mut drop = false;
    for e in exemplars {
        drop |= scan.attributes("metric.exemplars.attributes", &mut e.filtered_attributes);
    }
    drop
}

macro_rules! point {
    ($point:ty, $exemplars:expr) => {
        impl Point for $point {
            fn time(&self) -> u64 {
                self.time_unix_nano
            }
            fn redact(&mut self, scan: &mut Scan<'_>) -> bool {
                scan.minute = minute(self.time_unix_nano);
                let drop = scan.attributes("metric.attributes", &mut self.attributes);
                $exemplars(scan, self) || drop
            }
        }
    };
}

use opentelemetry_proto::tonic::metrics::v1::{
    ExponentialHistogramDataPoint, HistogramDataPoint, NumberDataPoint, SummaryDataPoint,
};
point!(
    NumberDataPoint,
    |s: &mut Scan<'_>, p: &mut NumberDataPoint| exemplars(s, &mut p.exemplars)
);
point!(
    HistogramDataPoint,
    |s: &mut Scan<'_>, p: &mut HistogramDataPoint| exemplars(s, &mut p.exemplars)
);
point!(
    ExponentialHistogramDataPoint,
    |s: &mut Scan<'_>, p: &mut ExponentialHistogramDataPoint| exemplars(s, &mut p.exemplars)
);
point!(
    SummaryDataPoint,
    |_: &mut Scan<'_>, _: &mut SummaryDataPoint| false
);

fn points<P: Point>(scan: &mut Scan<'_>, points: &mut Vec<P>) {
    points.retain_mut(|p| !p.redact(scan));
}

fn first_time<P: Point>(points: &[P]) -> u64 {
    points.first().map_or(0, Point::time)
}

fn metric_time(m: &opentelemetry_proto::tonic::metrics::v1::Metric) -> u64 {
    match m.data.as_ref() {
        Some(metric::Data::Gauge(g)) => first_time(&g.data_points),
        Some(metric::Data::Sum(s)) => first_time(&s.data_points),
        Some(metric::Data::Histogram(h)) => first_time(&h.data_points),
        Some(metric::Data::ExponentialHistogram(h)) => first_time(&h.data_points),
        Some(metric::Data::Summary(s)) => first_time(&s.data_points),
        None => 0,
    }
}

fn metrics(scan: &mut Scan<'_>, data: &mut opentelemetry_proto::tonic::metrics::v1::MetricsData) {
    data.resource_metrics.retain_mut(|rm| {
        let first = rm.scope_metrics.iter().flat_map(|s| &s.metrics).next();
        if scan.resource(rm.resource.as_mut(), minute(first.map_or(0, metric_time))) {
            return false;
        }
        rm.scope_metrics.retain_mut(|sm| {
            if scan.scope(
                sm.scope.as_mut(),
                minute(sm.metrics.first().map_or(0, metric_time)),
            ) {
                return false;
            }
            for m in &mut sm.metrics {
                scan.minute = minute(metric_time(m));
                // A metric's description and metadata are about all of its points: dropping
                // "the record" for them empties it.
                let mut drop = gone(
                    scan.text("metric.description", None, &mut m.description),
                    &mut m.description,
                );
                drop |= scan.attributes("metric.metadata", &mut m.metadata);
                if drop {
                    m.data = None;
                }
                match m.data.as_mut() {
                    Some(metric::Data::Gauge(g)) => points(scan, &mut g.data_points),
                    Some(metric::Data::Sum(s)) => points(scan, &mut s.data_points),
                    Some(metric::Data::Histogram(h)) => points(scan, &mut h.data_points),
                    Some(metric::Data::ExponentialHistogram(h)) => points(scan, &mut h.data_points),
                    Some(metric::Data::Summary(s)) => points(scan, &mut s.data_points),
                    None => {}
                }
            }
            true
        });
        true
    });
}

/// Profiles: the dictionary's attribute table holds the values every profile and sample
/// points at. Each entry is redacted once, in place; a finding is counted for each profile
/// or sample that points at it; an entry to drop is unlinked from them, and a profile or
/// sample pointing at an entry that drops its record goes.
fn profiles(
    scan: &mut Scan<'_>,
    data: &mut opentelemetry_proto::tonic::profiles::v1development::ProfilesData,
) {
    use std::collections::HashMap;
    let Some(dictionary) = data.dictionary.as_mut() else {
        return;
    };
    // Per entry: its verdict and findings, scanned once.
    let mut verdicts: HashMap<i32, (Verdict, Findings)> = HashMap::new();
    let strings = &dictionary.string_table;
    for (i, entry) in dictionary.attribute_table.iter_mut().enumerate() {
        let key = strings
            .get(entry.key_strindex as usize)
            .cloned()
            .unwrap_or_default();
        let Some(value) = entry.value.as_mut() else {
            continue;
        };
        let mut own = Findings::default();
        let mut entry_scan = Scan {
            redactor: scan.redactor,
            findings: &mut own,
            signal: scan.signal,
            service: String::new(),
            minute: 0,
        };
        let verdict = entry_scan.value("profile.attributes", Some(&key), value);
        if verdict != Verdict::Keep {
            // Whatever else points at it (a location, a mapping) finds no value.
            entry.value = None;
        }
        if verdict != Verdict::Keep || !own.0.is_empty() {
            verdicts.insert(i as i32, (verdict, own));
        }
    }
    // Counts an index list's findings at the scan's place; whether its holder goes.
    let apply = |scan: &mut Scan<'_>, indices: &mut Vec<i32>| -> bool {
        let mut drop = false;
        indices.retain(|i| match verdicts.get(i) {
            None => true,
            Some((verdict, own)) => {
                for ((_, _, signal, field, detector, action), n) in &own.0 {
                    let at = (
                        scan.minute,
                        scan.service.clone(),
                        *signal,
                        field.clone(),
                        detector.clone(),
                        *action,
                    );
                    *scan.findings.0.entry(at).or_default() += n;
                }
                match verdict {
                    Verdict::Keep => true,
                    Verdict::DropAttribute => false,
                    Verdict::DropRecord => {
                        drop = true;
                        true
                    }
                }
            }
        });
        drop
    };
    data.resource_profiles.retain_mut(|rp| {
        let first = rp.scope_profiles.iter().flat_map(|s| &s.profiles).next();
        if scan.resource(
            rp.resource.as_mut(),
            minute(first.map_or(0, |p| p.time_unix_nano)),
        ) {
            return false;
        }
        rp.scope_profiles.retain_mut(|sp| {
            if scan.scope(
                sp.scope.as_mut(),
                minute(sp.profiles.first().map_or(0, |p| p.time_unix_nano)),
            ) {
                return false;
            }
            sp.profiles.retain_mut(|p| {
                scan.minute = minute(p.time_unix_nano);
                if apply(scan, &mut p.attribute_indices) {
                    return false;
                }
                p.samples
                    .retain_mut(|s| !apply(scan, &mut s.attribute_indices));
                true
            });
            true
        });
        true
    });
}

#[cfg(test)]
mod tests {
    use floe_pii::{Detector, Rules};
    use opentelemetry_proto::tonic::common::v1::{ArrayValue, KeyValueList};
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, LogsData, ResourceLogs, ScopeLogs};
    use opentelemetry_proto::tonic::trace::v1::{
        ResourceSpans, ScopeSpans, Span, Status, TracesData, span,
    };

    use super::*;

    fn s(text: &str) -> AnyValue {
        AnyValue {
            value: Some(any_value::Value::StringValue(text.into())),
        }
    }

    fn kv(key: &str, value: AnyValue) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(value),
            ..Default::default()
        }
    }

    fn text(value: Option<&AnyValue>) -> &str {
        match value.and_then(|v| v.value.as_ref()) {
            Some(any_value::Value::StringValue(s)) => s,
            _ => "",
        }
    }

    fn resource(service: &str) -> Option<Resource> {
        Some(Resource {
            attributes: vec![kv("service.name", s(service))],
            ..Default::default()
        })
    }

    const T0: u64 = 1_700_000_000_000_000_000;

    fn traces() -> Decoded {
        let span = |name: &str, attributes: Vec<KeyValue>| Span {
            name: name.into(),
            start_time_unix_nano: T0,
            attributes,
            status: Some(Status {
                message: "charge failed for jane@example.com".into(),
                ..Default::default()
            }),
            events: vec![span::Event {
                attributes: vec![kv("exception.message", s("bad card 4111 1111 1111 1111"))],
                ..Default::default()
            }],
            ..Default::default()
        };
        Decoded::Traces(TracesData {
            resource_spans: vec![ResourceSpans {
                resource: resource("shop"),
                scope_spans: vec![ScopeSpans {
                    spans: vec![
                        span(
                            "GET /users",
                            vec![
                                kv("enduser.email", s("jane@example.com")),
                                kv("http.route", s("/users/jane@example.com")),
                                kv(
                                    "tags",
                                    AnyValue {
                                        value: Some(any_value::Value::ArrayValue(ArrayValue {
                                            values: vec![s("ok"), s("10.1.2.3")],
                                        })),
                                    },
                                ),
                            ],
                        ),
                        span(
                            "POST /pay",
                            vec![kv("secret.key", s("AKIAIOSFODNN7EXAMPLE"))],
                        ),
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        })
    }

    fn counts(findings: &Findings) -> Vec<(String, String, String, u64)> {
        findings
            .0
            .iter()
            .map(|((_, service, _, field, detector, action), n)| {
                (
                    format!("{service}:{field}"),
                    detector.clone(),
                    action.name().to_string(),
                    *n,
                )
            })
            .collect()
    }

    #[test]
    fn every_string_of_a_span_is_scanned_and_counted_where_it_was() {
        let rules = Rules {
            actions: [
                (Detector::CloudKey, Action::DropRecord),
                (Detector::Ipv4, Action::DropAttribute),
            ]
            .into(),
            allow_keys: ["http.route".to_string()].into(),
            ..Rules::default()
        };
        let redactor = Redactor::new(&rules).unwrap();
        let mut decoded = traces();
        let mut findings = Findings::default();
        redact(&mut decoded, &redactor, &mut findings);
        let Decoded::Traces(data) = decoded else {
            unreachable!()
        };
        let spans = &data.resource_spans[0].scope_spans[0].spans;
        assert_eq!(spans.len(), 1, "the span with a cloud key is dropped");
        let span = &spans[0];
        assert_eq!(text(span.attributes[0].value.as_ref()), "****@*******.***");
        assert_eq!(
            text(span.attributes[1].value.as_ref()),
            "/users/jane@example.com",
            "an allowed key is not scanned"
        );
        let Some(any_value::Value::ArrayValue(tags)) = span.attributes[2]
            .value
            .as_ref()
            .and_then(|v| v.value.as_ref())
        else {
            panic!()
        };
        assert_eq!(tags.values.len(), 1, "the address left the array");
        assert_eq!(
            span.status.as_ref().unwrap().message,
            "charge failed for ****@*******.***"
        );
        assert_eq!(
            text(span.events[0].attributes[0].value.as_ref()),
            "bad card **** **** **** ****"
        );
        let minute = ((T0 / 60_000_000_000) * 60_000_000) as i64;
        assert!(findings.0.keys().all(|k| k.0 == minute && k.2 == "traces"));
        assert_eq!(
            counts(&findings),
            [
                (
                    "shop:span.attributes".into(),
                    "cloud_key".into(),
                    "drop_record".into(),
                    1
                ),
                (
                    "shop:span.attributes".into(),
                    "email".into(),
                    "mask".into(),
                    1
                ),
                (
                    "shop:span.attributes".into(),
                    "ipv4".into(),
                    "drop_attribute".into(),
                    1
                ),
                (
                    "shop:span.events.attributes".into(),
                    "card".into(),
                    "mask".into(),
                    2
                ),
                (
                    "shop:span.status_message".into(),
                    "email".into(),
                    "mask".into(),
                    2
                ),
            ]
        );
    }

    #[test]
    fn a_keys_rule_applies_whatever_the_values_type() {
        let redactor = Redactor::new(&Rules {
            keys: [
                ("card.number".to_string(), Action::Mask),
                ("profile".to_string(), Action::DropAttribute),
            ]
            .into(),
            allow_keys: ["debug".to_string()].into(),
            ..Rules::default()
        })
        .unwrap();
        let int = AnyValue {
            value: Some(any_value::Value::IntValue(4111111111111111)),
        };
        let list = AnyValue {
            value: Some(any_value::Value::KvlistValue(KeyValueList {
                values: vec![kv("email", s("jane@example.com"))],
            })),
        };
        let nested = AnyValue {
            value: Some(any_value::Value::KvlistValue(KeyValueList {
                values: vec![kv("email", s("jane@example.com"))],
            })),
        };
        let mut decoded = Decoded::Logs(LogsData {
            resource_logs: vec![ResourceLogs {
                resource: resource("api"),
                scope_logs: vec![ScopeLogs {
                    log_records: vec![LogRecord {
                        time_unix_nano: T0,
                        attributes: vec![
                            kv("card.number", int),
                            kv("profile", list),
                            kv("debug", nested),
                        ],
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        });
        let mut findings = Findings::default();
        redact(&mut decoded, &redactor, &mut findings);
        let Decoded::Logs(data) = decoded else {
            unreachable!()
        };
        let attributes = &data.resource_logs[0].scope_logs[0].log_records[0].attributes;
        assert_eq!(
            attributes.len(),
            2,
            "the kvlist under a dropped key is gone"
        );
        assert_eq!(text(attributes[0].value.as_ref()), "****************");
        let debug = crate::rows::any_to_string(attributes[1].value.as_ref().unwrap());
        assert!(
            debug.contains("jane@example.com"),
            "an allowed key is not looked into"
        );
        assert_eq!(
            counts(&findings),
            [
                ("api:log.attributes".into(), "key".into(), "mask".into(), 1),
                (
                    "api:log.attributes".into(),
                    "key".into(),
                    "drop_attribute".into(),
                    1
                ),
            ]
        );
    }

    #[test]
    fn log_bodies_strings_and_kvlists() {
        let redactor = Redactor::new(&Rules {
            keys: [("password".to_string(), Action::DropAttribute)].into(),
            ..Rules::default()
        })
        .unwrap();
        let log = |body: AnyValue| LogRecord {
            time_unix_nano: T0,
            body: Some(body),
            ..Default::default()
        };
        let mut decoded = Decoded::Logs(LogsData {
            resource_logs: vec![ResourceLogs {
                resource: resource("api"),
                scope_logs: vec![ScopeLogs {
                    log_records: vec![
                        log(s("login by +44 20 7946 0958 from 192.0.2.1")),
                        log(AnyValue {
                            value: Some(any_value::Value::KvlistValue(KeyValueList {
                                values: vec![
                                    kv("user", s("jane@example.com")),
                                    kv("password", s("hunter2")),
                                ],
                            })),
                        }),
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        });
        let mut findings = Findings::default();
        redact(&mut decoded, &redactor, &mut findings);
        let Decoded::Logs(data) = decoded else {
            unreachable!()
        };
        let logs = &data.resource_logs[0].scope_logs[0].log_records;
        assert_eq!(
            text(logs[0].body.as_ref()),
            "login by +** ** **** **** from ***.*.*.*"
        );
        let Some(any_value::Value::KvlistValue(list)) =
            logs[1].body.as_ref().and_then(|v| v.value.as_ref())
        else {
            panic!()
        };
        assert_eq!(list.values.len(), 1, "the password entry is gone");
        assert_eq!(text(list.values[0].value.as_ref()), "****@*******.***");
        assert_eq!(
            counts(&findings),
            [
                ("api:log.body".into(), "email".into(), "mask".into(), 1),
                ("api:log.body".into(), "ipv4".into(), "mask".into(), 1),
                (
                    "api:log.body".into(),
                    "key".into(),
                    "drop_attribute".into(),
                    1
                ),
                ("api:log.body".into(), "phone".into(), "mask".into(), 1),
            ]
        );
    }
}
