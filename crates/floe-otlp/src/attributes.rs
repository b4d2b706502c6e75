//! One rule for every attribute map: a key given more than once keeps its **last** value, at
//! the position of its **first** occurrence.
//!
//! OTLP says attribute keys must be unique, but protobuf (and OTLP JSON) cannot enforce it,
//! and one duplicate stored as given breaks readers for a whole table: Trino's
//! `transform_keys` fails, `element_at` and `CAST(… AS json)` disagree on the value, DuckDB
//! refuses to fetch the map. So [`crate::decode`] applies this rule to every record before any
//! row is built, the same for protobuf and JSON: resource, scope, span, event, link, log and
//! data point attributes, exemplars' filtered attributes, metric metadata, profile and sample
//! attributes (lists of indices into the profiles dictionary, compared by key), and every
//! kvlist nested in a value or a log body.
//!
//! Why the last value: the OpenTelemetry specification treats a repeated key as an overwrite,
//! the Go SDK's deduplication keeps the last value at the first position, and the Collector's
//! pdata, which keeps duplicates read from the wire, turns a map into a Go map (`AsRaw`) with
//! the last value too — only its `Map.Get` returns the first
//! (open-telemetry/opentelemetry-collector#6169).

use std::collections::HashMap;

use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    Exemplar, ExponentialHistogramDataPoint, HistogramDataPoint, NumberDataPoint, SummaryDataPoint,
    metric,
};
use opentelemetry_proto::tonic::profiles::v1development::ProfilesData;
use opentelemetry_proto::tonic::resource::v1::Resource;

use crate::decode::Decoded;

/// Below this many entries duplicates are looked for pair by pair, without a hash map.
const SMALL: usize = 16;

/// Applies the rule to `attributes` and to every kvlist inside their values; returns how many
/// entries were dropped.
pub fn unique_keys(attributes: &mut Vec<KeyValue>) -> u64 {
    let mut dropped: u64 = attributes
        .iter_mut()
        .filter_map(|kv| kv.value.as_mut())
        .map(unique_in_value)
        .sum();
    if !has_duplicates(attributes) {
        return dropped;
    }
    // For each key in order of first appearance, the index of its last entry.
    let mut slot_of: HashMap<&str, usize> = HashMap::with_capacity(attributes.len());
    let mut winners: Vec<usize> = Vec::with_capacity(attributes.len());
    for (i, kv) in attributes.iter().enumerate() {
        match slot_of.get(kv.key.as_str()) {
            Some(&slot) => winners[slot] = i,
            None => {
                slot_of.insert(kv.key.as_str(), winners.len());
                winners.push(i);
            }
        }
    }
    drop(slot_of);
    dropped += (attributes.len() - winners.len()) as u64;
    let mut entries: Vec<Option<KeyValue>> = attributes.drain(..).map(Some).collect();
    attributes.extend(winners.into_iter().filter_map(|i| entries[i].take()));
    dropped
}

fn has_duplicates(attributes: &[KeyValue]) -> bool {
    if attributes.len() <= SMALL {
        return attributes
            .iter()
            .enumerate()
            .any(|(i, a)| attributes[i + 1..].iter().any(|b| b.key == a.key));
    }
    let mut seen = std::collections::HashSet::with_capacity(attributes.len());
    !attributes.iter().all(|kv| seen.insert(kv.key.as_str()))
}

fn unique_in_value(value: &mut AnyValue) -> u64 {
    match value.value.as_mut() {
        Some(any_value::Value::KvlistValue(list)) => unique_keys(&mut list.values),
        Some(any_value::Value::ArrayValue(array)) => {
            array.values.iter_mut().map(unique_in_value).sum()
        }
        _ => 0,
    }
}

fn in_resource(resource: Option<&mut Resource>) -> u64 {
    resource.map_or(0, |r| unique_keys(&mut r.attributes))
}

fn in_scope(scope: Option<&mut InstrumentationScope>) -> u64 {
    scope.map_or(0, |s| unique_keys(&mut s.attributes))
}

/// A data point's attribute maps: its own and its exemplars' filtered attributes.
trait PointAttributes {
    fn unique_keys(&mut self) -> u64;
}

macro_rules! point_with_exemplars {
    ($($point:ty),*) => {$(
        impl PointAttributes for $point {
            fn unique_keys(&mut self) -> u64 {
                unique_keys(&mut self.attributes)
                    + self
                        .exemplars
                        .iter_mut()
                        .map(|e: &mut Exemplar| unique_keys(&mut e.filtered_attributes))
                        .sum::<u64>()
            }
        }
    )*};
}

point_with_exemplars!(
    NumberDataPoint,
    HistogramDataPoint,
    ExponentialHistogramDataPoint
);

impl PointAttributes for SummaryDataPoint {
    fn unique_keys(&mut self) -> u64 {
        unique_keys(&mut self.attributes)
    }
}

fn in_points<P: PointAttributes>(points: &mut [P]) -> u64 {
    points.iter_mut().map(PointAttributes::unique_keys).sum()
}

/// The rule for a list of indices into a profiles dictionary's attribute table (`key` gives
/// an index's key): a key given more than once keeps its last index at the position of its
/// first. Returns how many indices were dropped.
pub fn unique_key_indices<'k>(indices: &mut Vec<i32>, key: impl Fn(i32) -> &'k str) -> u64 {
    // Checked without allocating: this runs for every sample, and repeats are rare.
    let repeated = indices
        .iter()
        .enumerate()
        .any(|(n, &a)| indices[n + 1..].iter().any(|&b| key(a) == key(b)));
    if !repeated {
        return 0;
    }
    let mut kept: Vec<(&str, i32)> = Vec::with_capacity(indices.len());
    for &index in indices.iter() {
        let k = key(index);
        match kept.iter_mut().find(|(seen, _)| *seen == k) {
            Some(slot) => slot.1 = index,
            None => kept.push((k, index)),
        }
    }
    let dropped = (indices.len() - kept.len()) as u64;
    *indices = kept.into_iter().map(|(_, i)| i).collect();
    dropped
}

/// Applies the rule to every attribute map of a decoded record; returns how many entries were
/// dropped.
pub fn unique_keys_in(decoded: &mut Decoded) -> u64 {
    let mut dropped = 0;
    match decoded {
        Decoded::Profiles(data) => {
            let ProfilesData {
                resource_profiles,
                dictionary,
            } = data;
            if let Some(d) = dictionary.as_mut() {
                for a in &mut d.attribute_table {
                    dropped += a.value.as_mut().map_or(0, unique_in_value);
                }
            }
            let empty = Default::default();
            let d =
                crate::profiles::Dictionary::of_dictionary(dictionary.as_ref().unwrap_or(&empty));
            for rp in resource_profiles {
                dropped += in_resource(rp.resource.as_mut());
                for sp in &mut rp.scope_profiles {
                    dropped += in_scope(sp.scope.as_mut());
                    for p in &mut sp.profiles {
                        dropped +=
                            unique_key_indices(&mut p.attribute_indices, |i| d.attribute_key(i));
                        for s in &mut p.samples {
                            dropped += unique_key_indices(&mut s.attribute_indices, |i| {
                                d.attribute_key(i)
                            });
                        }
                    }
                }
            }
        }
        Decoded::Traces(data) => {
            for rs in &mut data.resource_spans {
                dropped += in_resource(rs.resource.as_mut());
                for ss in &mut rs.scope_spans {
                    dropped += in_scope(ss.scope.as_mut());
                    for span in &mut ss.spans {
                        dropped += unique_keys(&mut span.attributes);
                        for event in &mut span.events {
                            dropped += unique_keys(&mut event.attributes);
                        }
                        for link in &mut span.links {
                            dropped += unique_keys(&mut link.attributes);
                        }
                    }
                }
            }
        }
        Decoded::Logs(data) => {
            for rl in &mut data.resource_logs {
                dropped += in_resource(rl.resource.as_mut());
                for sl in &mut rl.scope_logs {
                    dropped += in_scope(sl.scope.as_mut());
                    for log in &mut sl.log_records {
                        dropped += unique_keys(&mut log.attributes);
                        dropped += log.body.as_mut().map_or(0, unique_in_value);
                    }
                }
            }
        }
        Decoded::Metrics(data) => {
            for rm in &mut data.resource_metrics {
                dropped += in_resource(rm.resource.as_mut());
                for sm in &mut rm.scope_metrics {
                    dropped += in_scope(sm.scope.as_mut());
                    for m in &mut sm.metrics {
                        dropped += unique_keys(&mut m.metadata);
                        dropped += match m.data.as_mut() {
                            Some(metric::Data::Gauge(g)) => in_points(&mut g.data_points),
                            Some(metric::Data::Sum(s)) => in_points(&mut s.data_points),
                            Some(metric::Data::Histogram(h)) => in_points(&mut h.data_points),
                            Some(metric::Data::ExponentialHistogram(h)) => {
                                in_points(&mut h.data_points)
                            }
                            Some(metric::Data::Summary(s)) => in_points(&mut s.data_points),
                            None => 0,
                        };
                    }
                }
            }
        }
    }
    dropped
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::common::v1::KeyValueList;

    use super::*;

    use crate::generate::string_attribute as kv;

    fn pairs(attributes: &[KeyValue]) -> Vec<(String, String)> {
        attributes
            .iter()
            .map(|kv| {
                (
                    kv.key.clone(),
                    kv.value
                        .as_ref()
                        .map(crate::rows::any_to_string)
                        .unwrap_or_default(),
                )
            })
            .collect()
    }

    #[test]
    fn the_last_value_wins_at_the_first_position() {
        let mut small = vec![
            kv("a", "1"),
            kv("b", "2"),
            kv("a", "3"),
            kv("c", "4"),
            kv("a", "5"),
        ];
        assert_eq!(unique_keys(&mut small), 2);
        assert_eq!(
            pairs(&small),
            [("a", "5"), ("b", "2"), ("c", "4")].map(|(k, v)| (k.to_string(), v.to_string()))
        );
        // Past SMALL entries the hash path gives the same answer.
        let mut large: Vec<KeyValue> = (0..40)
            .map(|i| kv(&format!("k{}", i % 30), &i.to_string()))
            .collect();
        assert_eq!(unique_keys(&mut large), 10);
        assert_eq!(large.len(), 30);
        assert_eq!(pairs(&large)[0], ("k0".to_string(), "30".to_string()));
        assert_eq!(pairs(&large)[12], ("k12".to_string(), "12".to_string()));
        // Unique keys are left as they are.
        let mut unique = vec![kv("x", "1"), kv("y", "2")];
        assert_eq!(unique_keys(&mut unique), 0);
        assert_eq!(pairs(&unique).len(), 2);
    }

    #[test]
    fn protobuf_and_json_records_come_out_the_same_and_are_counted() {
        use floe_core::{Format, SourceRecord};
        use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, TracesData};
        use prost::Message as _;

        let data = TracesData {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![kv("service.name", "a"), kv("service.name", "b")],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans: vec![Span {
                        trace_id: vec![1; 16],
                        span_id: vec![2; 8],
                        name: "s".into(),
                        attributes: vec![kv("k", "1"), kv("j", "2"), kv("k", "3"), kv("k", "4")],
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let mut format = crate::OtlpFormat::new(Default::default());
        for payload in [data.encode_to_vec(), serde_json::to_vec(&data).unwrap()] {
            let (decoded, dropped) =
                crate::decode::decode_counted(crate::Signal::Traces, &payload).unwrap();
            assert_eq!(dropped, 3);
            let Decoded::Traces(traces) = decoded else {
                panic!("traces")
            };
            let rs = &traces.resource_spans[0];
            assert_eq!(
                pairs(&rs.resource.as_ref().unwrap().attributes),
                vec![("service.name".to_string(), "b".to_string())]
            );
            assert_eq!(
                pairs(&rs.scope_spans[0].spans[0].attributes),
                vec![
                    ("k".to_string(), "4".to_string()),
                    ("j".to_string(), "2".to_string())
                ]
            );
            let record = SourceRecord {
                topic: "otlp_spans".into(),
                partition: 0,
                offset: 0,
                payload,
                key: None,
            };
            format.append(&record, 0).unwrap();
        }
        assert_eq!(format.status(), vec![("otlp_duplicate_attribute_keys", 6)]);
    }

    #[test]
    fn nested_kvlists_follow_the_rule() {
        let nested = AnyValue {
            value: Some(any_value::Value::KvlistValue(KeyValueList {
                values: vec![kv("n", "old"), kv("n", "new")],
            })),
        };
        let mut attributes = vec![KeyValue {
            key: "outer".into(),
            value: Some(nested),
            ..Default::default()
        }];
        assert_eq!(unique_keys(&mut attributes), 1);
        assert_eq!(pairs(&attributes)[0].1, r#"{"n":"new"}"#);
    }
}
