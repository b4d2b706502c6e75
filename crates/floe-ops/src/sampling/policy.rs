//! Tail-sampling policies: what a whole trace must show to be kept, judged on a
//! [`Summary`] of its spans — the OpenTelemetry Collector's `tail_sampling` policy set
//! (contrib v0.155.0), with the choices that make a decision a function of the trace and of
//! the decisions before it in event time (ADR 0011).
//!
//! | policy | a trace is sampled when |
//! |---|---|
//! | `always_sample` | always |
//! | `latency` | its duration (last span end − first span start, truncated to ms) is at least `threshold`, and at most `upper_threshold` when set (then strictly above `threshold`) |
//! | `status_code` | a span's status is one of `status_codes` (`OK`, `ERROR`, `UNSET`) |
//! | `string_attribute` | a span or its resource has `key` equal to one of `values`, or matching one of them as unanchored regular expressions (`regex = true`) |
//! | `numeric_attribute` | a span or its resource has `key`, an integer, within `[min_value, max_value]` (either may be left out) |
//! | `boolean_attribute` | a span or its resource has `key` equal to `value` |
//! | `probabilistic` | its trace id's hash is under `sampling_percentage` ([`super::probabilistic`], the Collector's bit for bit) |
//! | `span_count` | it has at least `min_spans` spans and at most `max_spans` (when set) |
//! | `rate_limiting` | its spans fit the token bucket: `spans_per_second` refilled in event time, `burst` deep (default 2 × the rate), per partition, or per service and partition |
//! | `and` | every sub-policy samples (evaluated in order, stopping at the first that does not) |
//! | `not` | its sub-policy does not |
//! | `drop` | every sub-policy samples: the trace is dropped, whatever other policies say |
//! | `composite` | the first sub-policy that samples still has room in its share of `max_total_spans_per_second` this second of event time |
//!
//! Attribute policies take `invert_match = true`: then a trace is sampled when **no** span
//! or resource has a matching value. Attributes are the landed maps' strings: a numeric
//! policy reads a value that parses as an integer, a boolean one `true` or `false`.
//!
//! **Combining** (the Collector's, with `sample_on_first_match`): `drop` policies are looked
//! at first, and any that drops the trace decides; then the others in order, and the first
//! that samples decides — its name is the deciding policy, and the policies after it are not
//! evaluated (so a rate limit after it spends nothing). A trace no policy samples is not
//! kept.
//!
//! **Where Floe differs from the Collector on purpose:** the rate limits run on event time —
//! the second a trace is decided at — not on the wall clock, so a replay decides the same;
//! `latency` with an upper bound tests the whole trace, not each prefix of its spans as
//! they happened to arrive; a numeric bound of 0 means 0, not "no bound"; a composite
//! sub-policy left out of `rate_allocation` gets an equal share (as the Collector from
//! v0.161.0).

use std::collections::{BTreeMap, BTreeSet};

use regex::Regex;

use super::probabilistic;
use crate::codec::{Reader, Writer};

/// A span status the `status_code` policy names.
pub const STATUS_CODES: [&str; 3] = ["OK", "ERROR", "UNSET"];

/// The most span conditions one operator's policies may hold (one bit each in [`Summary`]).
pub const MAX_CONDITIONS: usize = 64;

/// A condition on one span and its resource; a trace meets it when one of its spans does.
#[derive(Debug, Clone)]
pub enum Condition {
    /// The span's status is one of these.
    Status(BTreeSet<String>),
    /// The attribute is one of `values`, or matches one of `patterns` (unanchored).
    Text {
        /// The attribute key.
        key: String,
        /// Exact values.
        values: BTreeSet<String>,
        /// Regular expressions, any of which may match anywhere in the value.
        patterns: Vec<Regex>,
    },
    /// The attribute parses as an integer in `[min, max]`.
    Number {
        /// The attribute key.
        key: String,
        /// Smallest accepted.
        min: i64,
        /// Largest accepted.
        max: i64,
    },
    /// The attribute is `true` or `false` as `value`.
    Flag {
        /// The attribute key.
        key: String,
        /// The value sought.
        value: bool,
    },
}

impl Condition {
    /// The attribute key the condition reads, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Status(_) => None,
            Self::Text { key, .. } | Self::Number { key, .. } | Self::Flag { key, .. } => Some(key),
        }
    }

    /// Whether an attribute value (of the span or its resource) meets the condition.
    pub fn value_meets(&self, value: &str) -> bool {
        match self {
            Self::Status(_) => false,
            Self::Text {
                values, patterns, ..
            } => values.contains(value) || patterns.iter().any(|p| p.is_match(value)),
            Self::Number { min, max, .. } => value
                .trim()
                .parse::<i64>()
                .is_ok_and(|v| (*min..=*max).contains(&v)),
            Self::Flag { value: wanted, .. } => match value.trim() {
                "true" => *wanted,
                "false" => !*wanted,
                _ => false,
            },
        }
    }

    /// Whether a span's status meets the condition.
    pub fn status_meets(&self, status: &str) -> bool {
        matches!(self, Self::Status(codes) if codes.contains(status))
    }
}

/// What the policies know of a trace: kept as its spans arrive, the same whatever their
/// order (every field merges commutatively).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Spans seen.
    pub spans: u64,
    /// The earliest span start, ns (`i64::MAX`: none).
    pub start: i64,
    /// The latest span end, ns (`i64::MIN`: none).
    pub end: i64,
    /// Bit `i`: some span met condition `i`.
    pub met: u64,
    /// The root span's service, once the root was seen.
    pub root_service: Option<String>,
    /// The smallest service name among the spans (the trace's service before its root).
    pub any_service: Option<String>,
}

impl Default for Summary {
    fn default() -> Self {
        Self {
            spans: 0,
            start: i64::MAX,
            end: i64::MIN,
            met: 0,
            root_service: None,
            any_service: None,
        }
    }
}

impl Summary {
    /// Adds one span: its start and end (ns, 0 or absent: unknown, as the Collector reads
    /// them), the conditions it met, its service and whether it is the root.
    pub fn add(
        &mut self,
        (start, end): (Option<i64>, Option<i64>),
        met: u64,
        service: &str,
        root: bool,
    ) {
        self.spans += 1;
        if let Some(s) = start.filter(|s| *s != 0) {
            self.start = self.start.min(s);
        }
        if let Some(e) = end.filter(|e| *e != 0) {
            self.end = self.end.max(e);
        }
        self.met |= met;
        if self.any_service.as_deref().is_none_or(|s| service < s) {
            self.any_service = Some(service.to_string());
        }
        // Two roots (a broken trace): the smaller service — in any order.
        if root && self.root_service.as_deref().is_none_or(|s| service < s) {
            self.root_service = Some(service.to_string());
        }
    }

    /// The trace's duration in whole milliseconds (0 without both ends).
    pub fn duration_ms(&self) -> i64 {
        if self.start == i64::MAX || self.end == i64::MIN {
            return 0;
        }
        self.end.saturating_sub(self.start) / 1_000_000
    }

    /// The service a per-service budget charges: the root's, else the smallest seen.
    pub fn service(&self) -> &str {
        self.root_service
            .as_deref()
            .or(self.any_service.as_deref())
            .unwrap_or("")
    }

    /// The stored form.
    pub fn encode(&self, w: &mut Writer) {
        w.varint(self.spans);
        w.zigzag(self.start);
        w.zigzag(self.end);
        w.varint(self.met);
        for s in [&self.root_service, &self.any_service] {
            match s {
                Some(s) => {
                    w.varint(1);
                    w.short_bytes(s.as_bytes());
                }
                None => w.varint(0),
            }
        }
    }

    /// Reads what [`Summary::encode`] wrote.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, String> {
        let spans = r.varint()?;
        let start = r.zigzag()?;
        let end = r.zigzag()?;
        let met = r.varint()?;
        let mut text = || -> Result<Option<String>, String> {
            Ok(match r.varint()? {
                0 => None,
                _ => Some(String::from_utf8_lossy(r.short_bytes()?).into_owned()),
            })
        };
        let root_service = text()?;
        let any_service = text()?;
        Ok(Self {
            spans,
            start,
            end,
            met,
            root_service,
            any_service,
        })
    }
}

/// A policy with its name.
#[derive(Debug, Clone)]
pub struct Named {
    /// Unique among the operator's top-level policies.
    pub name: String,
    /// What it tests.
    pub policy: Policy,
}

/// What a policy tests.
#[derive(Debug, Clone)]
pub enum Policy {
    /// Every trace.
    Always,
    /// The trace's duration in ms: at least `min`, or in `(min, max]` with an upper bound.
    Latency {
        /// Threshold, ms.
        min: i64,
        /// Upper threshold, ms.
        max: Option<i64>,
    },
    /// A span condition (`status_code`, `*_attribute`): met by some span, or by none.
    Met {
        /// Index into the operator's conditions.
        condition: usize,
        /// Sampled when no span meets it.
        invert: bool,
    },
    /// The trace id's hash at most `threshold` ([`probabilistic`]).
    Probabilistic {
        /// The hash's salt.
        salt: String,
        /// The largest hash kept.
        threshold: u64,
    },
    /// At least `min` spans, at most `max`.
    SpanCount {
        /// Fewest spans.
        min: u64,
        /// Most spans.
        max: Option<u64>,
    },
    /// A token bucket in event time.
    RateLimit {
        /// Index of its bucket among the operator's rate limits.
        slot: usize,
        /// Spans per second refilled.
        per_second: u64,
        /// The bucket's depth, spans.
        burst: u64,
        /// One bucket per service.
        per_service: bool,
    },
    /// Every sub-policy samples.
    And(Vec<Named>),
    /// The sub-policy does not sample.
    Not(Box<Named>),
    /// Every sub-policy samples: the trace is dropped.
    Drop(Vec<Named>),
    /// The first sub-policy that samples, within its share of a per-second budget.
    Composite {
        /// Index of its budget among the operator's composites.
        slot: usize,
        /// Spans per second, all sub-policies together.
        max_total: u64,
        /// Each sub-policy and its spans per second.
        subs: Vec<(Named, u64)>,
    },
}

/// A policy's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Keep the trace.
    Sampled,
    /// This policy does not keep it.
    NotSampled,
    /// Drop the trace, whatever the others say.
    Dropped,
}

/// What became of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Kept.
    pub sampled: bool,
    /// The deciding policy: the first that sampled, or the `drop` policy that dropped it;
    /// `None` when nothing sampled it.
    pub policy: Option<String>,
}

/// The rate limits' and composites' budgets of one partition, in event time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Budgets {
    /// (rate limit slot, service or "") → (tokens × 10⁶, at µs).
    buckets: BTreeMap<(usize, String), (i128, i64)>,
    /// composite slot → (second, spans per sub-policy in it).
    seconds: BTreeMap<usize, (i64, Vec<u64>)>,
}

impl Budgets {
    /// The stored form.
    pub fn encode(&self, w: &mut Writer) {
        w.varint(self.buckets.len() as u64);
        for ((slot, service), (tokens, at)) in &self.buckets {
            w.varint(*slot as u64);
            w.short_bytes(service.as_bytes());
            w.0.extend_from_slice(&tokens.to_le_bytes());
            w.zigzag(*at);
        }
        w.varint(self.seconds.len() as u64);
        for (slot, (second, spent)) in &self.seconds {
            w.varint(*slot as u64);
            w.zigzag(*second);
            w.varint(spent.len() as u64);
            for s in spent {
                w.varint(*s);
            }
        }
    }

    /// Reads what [`Budgets::encode`] wrote.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, String> {
        let mut out = Self::default();
        for _ in 0..r.varint()? {
            let slot = r.varint()? as usize;
            let service = String::from_utf8_lossy(r.short_bytes()?).into_owned();
            let bytes: [u8; 16] = r.take(16)?.try_into().expect("16 bytes");
            let at = r.zigzag()?;
            out.buckets
                .insert((slot, service), (i128::from_le_bytes(bytes), at));
        }
        for _ in 0..r.varint()? {
            let slot = r.varint()? as usize;
            let second = r.zigzag()?;
            let spent = (0..r.varint()?)
                .map(|_| r.varint())
                .collect::<Result<Vec<_>, _>>()?;
            out.seconds.insert(slot, (second, spent));
        }
        Ok(out)
    }

    /// Takes `spans` from the bucket of `slot` and `service` at `at` µs, if it holds them.
    fn take(
        &mut self,
        (slot, service): (usize, &str),
        (per_second, burst): (u64, u64),
        spans: u64,
        at: i64,
    ) -> bool {
        const SCALE: i128 = 1_000_000;
        let full = i128::from(burst) * SCALE;
        let (tokens, last) = self
            .buckets
            .entry((slot, service.to_string()))
            .or_insert((full, at));
        // Tokens per µs = per_second / 10⁶: scaled by 10⁶, elapsed µs × per_second.
        let elapsed = i128::from(at.saturating_sub(*last).max(0));
        *tokens = (*tokens + elapsed * i128::from(per_second)).min(full);
        *last = (*last).max(at);
        let need = i128::from(spans) * SCALE;
        if *tokens >= need {
            *tokens -= need;
            true
        } else {
            false
        }
    }

    /// Charges `spans` to sub-policy `sub` of composite `slot` in the second of `at` µs, if
    /// both its share and the total have room.
    fn charge(
        &mut self,
        slot: usize,
        (sub, subs): (usize, usize),
        (share, total): (u64, u64),
        spans: u64,
        at: i64,
    ) -> bool {
        let second = at.div_euclid(1_000_000);
        let (current, spent) = self
            .seconds
            .entry(slot)
            .or_insert_with(|| (second, vec![0; subs]));
        if *current != second {
            *current = second;
            spent.iter_mut().for_each(|s| *s = 0);
        }
        spent.resize(subs, 0);
        let all: u64 = spent.iter().sum();
        if spent[sub].saturating_add(spans) <= share && all.saturating_add(spans) <= total {
            spent[sub] += spans;
            true
        } else {
            false
        }
    }
}

/// A trace to decide: its id's bytes, its summary, and the event time of the decision (µs).
#[derive(Debug, Clone, Copy)]
pub struct Trace<'a> {
    /// The 16 bytes of the trace id.
    pub id: &'a [u8; 16],
    /// What its spans showed.
    pub summary: &'a Summary,
    /// When it is decided, µs of event time.
    pub at: i64,
}

impl Policy {
    /// This policy's verdict on `trace`, spending `budgets` when it samples by a budget.
    pub fn verdict(&self, trace: &Trace<'_>, budgets: &mut Budgets) -> Verdict {
        let yes = |b: bool| {
            if b {
                Verdict::Sampled
            } else {
                Verdict::NotSampled
            }
        };
        let s = trace.summary;
        match self {
            Self::Always => Verdict::Sampled,
            Self::Latency { min, max: None } => yes(s.duration_ms() >= *min),
            Self::Latency {
                min,
                max: Some(max),
            } => yes(s.duration_ms() > *min && s.duration_ms() <= *max),
            Self::Met { condition, invert } => yes((s.met >> condition) & 1 == 1 && !invert
                || (s.met >> condition) & 1 == 0 && *invert),
            Self::Probabilistic { salt, threshold } => {
                yes(probabilistic::keeps(salt, *threshold, trace.id))
            }
            Self::SpanCount { min, max } => {
                yes(s.spans >= *min && max.is_none_or(|m| s.spans <= m))
            }
            Self::RateLimit {
                slot,
                per_second,
                burst,
                per_service,
            } => {
                let service = if *per_service { s.service() } else { "" };
                yes(budgets.take((*slot, service), (*per_second, *burst), s.spans, trace.at))
            }
            Self::And(subs) | Self::Drop(subs) => {
                for sub in subs {
                    if sub.policy.verdict(trace, budgets) != Verdict::Sampled {
                        return Verdict::NotSampled;
                    }
                }
                if matches!(self, Self::Drop(_)) {
                    Verdict::Dropped
                } else {
                    Verdict::Sampled
                }
            }
            Self::Not(sub) => match sub.policy.verdict(trace, budgets) {
                Verdict::Sampled => Verdict::NotSampled,
                Verdict::NotSampled => Verdict::Sampled,
                Verdict::Dropped => Verdict::Dropped,
            },
            Self::Composite {
                slot,
                max_total,
                subs,
            } => {
                for (i, (sub, share)) in subs.iter().enumerate() {
                    if sub.policy.verdict(trace, budgets) == Verdict::Sampled {
                        return yes(budgets.charge(
                            *slot,
                            (i, subs.len()),
                            (*share, *max_total),
                            s.spans,
                            trace.at,
                        ));
                    }
                }
                Verdict::NotSampled
            }
        }
    }
}

/// Decides `trace` by `policies` (the operator's, in order): a `drop` that drops it first,
/// then the first that samples it.
pub fn decide(policies: &[Named], trace: &Trace<'_>, budgets: &mut Budgets) -> Decision {
    for p in policies
        .iter()
        .filter(|p| matches!(p.policy, Policy::Drop(_)))
    {
        if p.policy.verdict(trace, budgets) == Verdict::Dropped {
            return Decision {
                sampled: false,
                policy: Some(p.name.clone()),
            };
        }
    }
    for p in policies
        .iter()
        .filter(|p| !matches!(p.policy, Policy::Drop(_)))
    {
        if p.policy.verdict(trace, budgets) == Verdict::Sampled {
            return Decision {
                sampled: true,
                policy: Some(p.name.clone()),
            };
        }
    }
    Decision {
        sampled: false,
        policy: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(name: &str, policy: Policy) -> Named {
        Named {
            name: name.into(),
            policy,
        }
    }

    fn summary(spans: &[(i64, i64, u64, &str, bool)]) -> Summary {
        let mut s = Summary::default();
        for &(start, end, met, service, root) in spans {
            s.add((Some(start), Some(end)), met, service, root);
        }
        s
    }

    const MS: i64 = 1_000_000;

    #[test]
    fn the_summary_is_the_same_in_any_order_and_survives_encoding() {
        let spans = [
            (5 * MS, 90 * MS, 0b01, "db", false),
            (0, 0, 0, "api", false),
            (2 * MS, 250 * MS + 999_999, 0b10, "gateway", true),
            (3 * MS, 40 * MS, 0, "api", false),
        ];
        let forward = summary(&spans);
        let mut backward = spans;
        backward.reverse();
        assert_eq!(summary(&backward), forward);
        // 250.999999 ms − 2 ms, truncated; zero timestamps are unknown, not the epoch.
        assert_eq!(forward.duration_ms(), 248);
        assert_eq!((forward.spans, forward.met), (4, 0b11));
        assert_eq!(forward.service(), "gateway");
        assert_eq!(summary(&spans[..2]).service(), "api");
        let mut w = Writer::default();
        forward.encode(&mut w);
        assert_eq!(Summary::decode(&mut Reader(&w.0)).unwrap(), forward);
    }

    #[test]
    fn drop_beats_everything_and_the_first_sampling_policy_decides() {
        let id = [7u8; 16];
        let slow_error = summary(&[(MS, 600 * MS, 0b1, "api", true)]);
        let fast_ok = summary(&[
            (MS, 20 * MS, 0, "health", true),
            (MS, 10 * MS, 0b10, "health", false),
        ]);
        let policies = vec![
            named(
                "errors",
                Policy::Met {
                    condition: 0,
                    invert: false,
                },
            ),
            named(
                "slow",
                Policy::Latency {
                    min: 500,
                    max: None,
                },
            ),
            named(
                "no-health",
                Policy::Drop(vec![named(
                    "health",
                    Policy::Met {
                        condition: 1,
                        invert: false,
                    },
                )]),
            ),
        ];
        let mut budgets = Budgets::default();
        let decide = |s: &Summary, b: &mut Budgets| {
            decide(
                &policies,
                &Trace {
                    id: &id,
                    summary: s,
                    at: 0,
                },
                b,
            )
        };
        assert_eq!(
            decide(&slow_error, &mut budgets),
            Decision {
                sampled: true,
                policy: Some("errors".into())
            }
        );
        assert_eq!(
            decide(&fast_ok, &mut budgets),
            Decision {
                sampled: false,
                policy: Some("no-health".into())
            }
        );
        let plain = summary(&[(MS, 20 * MS, 0, "api", true)]);
        assert_eq!(
            decide(&plain, &mut budgets),
            Decision {
                sampled: false,
                policy: None
            }
        );
        // Latency bounds: at least the threshold; with an upper bound, (min, max].
        let at = |ms: i64, p: &Policy| {
            let s = summary(&[(MS, (ms + 1) * MS, 0, "a", true)]);
            p.verdict(
                &Trace {
                    id: &id,
                    summary: &s,
                    at: 0,
                },
                &mut Budgets::default(),
            ) == Verdict::Sampled
        };
        let open = Policy::Latency {
            min: 500,
            max: None,
        };
        let band = Policy::Latency {
            min: 500,
            max: Some(900),
        };
        assert_eq!((at(499, &open), at(500, &open)), (false, true));
        assert_eq!(
            (
                at(500, &band),
                at(501, &band),
                at(900, &band),
                at(901, &band)
            ),
            (false, true, true, false)
        );
        // Inverted: sampled when no span met it; `not` and span counts.
        let inverted = Policy::Met {
            condition: 1,
            invert: true,
        };
        fn t<'a>(id: &'a [u8; 16], s: &'a Summary) -> Trace<'a> {
            Trace {
                id,
                summary: s,
                at: 0,
            }
        }
        assert_eq!(
            inverted.verdict(&t(&id, &slow_error), &mut budgets),
            Verdict::Sampled
        );
        assert_eq!(
            inverted.verdict(&t(&id, &fast_ok), &mut budgets),
            Verdict::NotSampled
        );
        let not = Policy::Not(Box::new(named("x", Policy::Always)));
        assert_eq!(
            not.verdict(&t(&id, &plain), &mut budgets),
            Verdict::NotSampled
        );
        let count = Policy::SpanCount {
            min: 2,
            max: Some(2),
        };
        assert_eq!(
            count.verdict(&t(&id, &fast_ok), &mut budgets),
            Verdict::Sampled
        );
        assert_eq!(
            count.verdict(&t(&id, &plain), &mut budgets),
            Verdict::NotSampled
        );
    }

    #[test]
    fn rate_limits_refill_in_event_time_and_composites_share_each_second() {
        let id = [1u8; 16];
        let three = summary(&[
            (0, 1, 0, "a", true),
            (0, 1, 0, "a", false),
            (0, 1, 0, "a", false),
        ]);
        let limit = Policy::RateLimit {
            slot: 0,
            per_second: 10,
            burst: 10,
            per_service: false,
        };
        let mut budgets = Budgets::default();
        let at = |t: i64, b: &mut Budgets| {
            limit.verdict(
                &Trace {
                    id: &id,
                    summary: &three,
                    at: t,
                },
                b,
            ) == Verdict::Sampled
        };
        // A full bucket of 10: three traces of 3 spans, not a fourth, in the same instant.
        let first: Vec<bool> = (0..4).map(|_| at(0, &mut budgets)).collect();
        assert_eq!(first, [true, true, true, false]);
        // 10 spans a second: 0.2 s later 1 + 2 = 3 tokens again.
        assert!(at(200_000, &mut budgets));
        assert!(!at(200_000, &mut budgets));
        // The budgets survive encoding.
        let mut w = Writer::default();
        budgets.encode(&mut w);
        let mut back = Budgets::decode(&mut Reader(&w.0)).unwrap();
        assert_eq!(back, budgets);
        assert!(at(10_000_000, &mut back));
        // A composite: 6 spans a second, half to the first sub-policy.
        let composite = Policy::Composite {
            slot: 0,
            max_total: 6,
            subs: vec![
                (
                    named(
                        "errors",
                        Policy::Met {
                            condition: 0,
                            invert: false,
                        },
                    ),
                    3,
                ),
                (named("rest", Policy::Always), 6),
            ],
        };
        let error = summary(&[
            (0, 1, 1, "a", true),
            (0, 1, 0, "a", false),
            (0, 1, 0, "a", false),
        ]);
        let mut b = Budgets::default();
        let mut go = |s: &Summary, t: i64| {
            composite.verdict(
                &Trace {
                    id: &id,
                    summary: s,
                    at: t,
                },
                &mut b,
            )
        };
        assert_eq!(go(&error, 0), Verdict::Sampled);
        assert_eq!(go(&error, 10), Verdict::NotSampled); // its share is spent
        assert_eq!(go(&three, 20), Verdict::Sampled); // the total has 3 left
        assert_eq!(go(&three, 30), Verdict::NotSampled);
        assert_eq!(go(&error, 1_000_000), Verdict::Sampled); // a new second
    }
}
