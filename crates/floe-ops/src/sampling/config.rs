//! `[[operators.policies]]` of a `tail_sampling` operator, as written and as checked: each
//! problem at its `file:line:col`, every problem of the file at once.
//!
//! ```toml
//! [[operators.policies]]
//! name = "errors"                      # unique among the operator's policies
//! type = "status_code"
//! status_codes = ["ERROR"]
//!
//! [[operators.policies]]
//! name = "slow"
//! type = "latency"
//! threshold = "500ms"                  # upper_threshold = "5s" for a band
//!
//! [[operators.policies]]
//! name = "gold-customers"
//! type = "and"                         # and | not | drop | composite: sub_policies below
//! [[operators.policies.sub_policies]]
//! name = "gold"
//! type = "string_attribute"
//! key = "customer.tier"
//! values = ["gold", "platinum"]        # regex = true: unanchored patterns
//! [[operators.policies.sub_policies]]
//! name = "some-of-them"
//! type = "probabilistic"
//! sampling_percentage = 25
//! ```
//!
//! The types and what they read are in [`super::policy`]; their settings:
//!
//! | type | settings |
//! |---|---|
//! | `always_sample` | — |
//! | `latency` | `threshold`, `upper_threshold` (durations) |
//! | `status_code` | `status_codes` (`OK`, `ERROR`, `UNSET`) |
//! | `string_attribute` | `key`, `values`, `regex` (false), `invert_match` (false) |
//! | `numeric_attribute` | `key`, `min_value`, `max_value` (at least one), `invert_match` |
//! | `boolean_attribute` | `key`, `value`, `invert_match` |
//! | `probabilistic` | `sampling_percentage`, `hash_salt` (the Collector's default) |
//! | `rate_limiting` | `spans_per_second`, `burst_capacity` (2 × the rate), `per` (`partition` or `service`) |
//! | `span_count` | `min_spans`, `max_spans` (none) |
//! | `and`, `drop` | `sub_policies` (one or more) |
//! | `not` | `sub_policies` (exactly one) |
//! | `composite` | `max_total_spans_per_second`, `sub_policies`, `rate_allocation` (`{ name = percent }`; the others share what is left equally) |

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use floe_config::{Checker, Text};
use serde::Deserialize;
use toml::Spanned;

use super::policy::{Condition, MAX_CONDITIONS, Named, Policy, STATUS_CODES};
use super::probabilistic;

/// One `[[operators.policies]]` (or sub-policy) as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    /// Unique among its siblings.
    pub name: Option<Text>,
    /// The policy's type.
    #[serde(rename = "type")]
    pub kind: Option<Text>,
    /// `status_code`.
    pub status_codes: Option<Vec<Text>>,
    /// `latency`.
    pub threshold: Option<Text>,
    /// `latency`.
    pub upper_threshold: Option<Text>,
    /// Attribute policies.
    pub key: Option<Text>,
    /// `string_attribute`.
    pub values: Option<Vec<Text>>,
    /// `string_attribute`: `values` are regular expressions.
    pub regex: Option<Spanned<bool>>,
    /// Attribute policies: sampled when nothing matches.
    pub invert_match: Option<Spanned<bool>>,
    /// `numeric_attribute`.
    pub min_value: Option<Spanned<i64>>,
    /// `numeric_attribute`.
    pub max_value: Option<Spanned<i64>>,
    /// `boolean_attribute`.
    pub value: Option<Spanned<bool>>,
    /// `probabilistic`.
    pub sampling_percentage: Option<Spanned<f64>>,
    /// `probabilistic`.
    pub hash_salt: Option<Text>,
    /// `rate_limiting`.
    pub spans_per_second: Option<Spanned<i64>>,
    /// `rate_limiting`.
    pub burst_capacity: Option<Spanned<i64>>,
    /// `rate_limiting`: `partition` (default) or `service`.
    pub per: Option<Text>,
    /// `span_count`.
    pub min_spans: Option<Spanned<i64>>,
    /// `span_count`.
    pub max_spans: Option<Spanned<i64>>,
    /// `and`, `not`, `drop`, `composite`.
    pub sub_policies: Option<Vec<Spanned<RawPolicy>>>,
    /// `composite`.
    pub max_total_spans_per_second: Option<Spanned<i64>>,
    /// `composite`: sub-policy name → percent of the total.
    pub rate_allocation: Option<BTreeMap<String, Spanned<i64>>>,
}

/// The checked policies of one operator.
#[derive(Debug, Clone, Default)]
pub struct Policies {
    /// In the order written.
    pub list: Vec<Named>,
    /// The span conditions they test, by index.
    pub conditions: Vec<Condition>,
    /// How many rate limits and composites hold budgets.
    pub slots: (usize, usize),
    /// What the policies were written as, for the fingerprint and `floe validate`.
    pub text: String,
}

/// Which settings a type takes (besides `name` and `type`).
fn settings_of(kind: &str) -> Option<&'static [&'static str]> {
    Some(match kind {
        "always_sample" => &[],
        "latency" => &["threshold", "upper_threshold"],
        "status_code" => &["status_codes"],
        "string_attribute" => &["key", "values", "regex", "invert_match"],
        "numeric_attribute" => &["key", "min_value", "max_value", "invert_match"],
        "boolean_attribute" => &["key", "value", "invert_match"],
        "probabilistic" => &["sampling_percentage", "hash_salt"],
        "rate_limiting" => &["spans_per_second", "burst_capacity", "per"],
        "span_count" => &["min_spans", "max_spans"],
        "and" | "not" | "drop" => &["sub_policies"],
        "composite" => &[
            "max_total_spans_per_second",
            "sub_policies",
            "rate_allocation",
        ],
        _ => return None,
    })
}

const TYPES: &str = "always_sample, latency, status_code, string_attribute, \
                     numeric_attribute, boolean_attribute, probabilistic, rate_limiting, \
                     span_count, and, not, drop or composite";

impl RawPolicy {
    /// The settings given, by name, each with its place.
    fn given(&self) -> Vec<(&'static str, std::ops::Range<usize>)> {
        let mut out = Vec::new();
        let mut at = |name: &'static str, span: Option<std::ops::Range<usize>>| {
            if let Some(span) = span {
                out.push((name, span));
            }
        };
        at(
            "status_codes",
            self.status_codes
                .as_ref()
                .and_then(|v| v.first())
                .map(Spanned::span),
        );
        at("threshold", self.threshold.as_ref().map(Spanned::span));
        at(
            "upper_threshold",
            self.upper_threshold.as_ref().map(Spanned::span),
        );
        at("key", self.key.as_ref().map(Spanned::span));
        at(
            "values",
            self.values
                .as_ref()
                .and_then(|v| v.first())
                .map(Spanned::span),
        );
        at("regex", self.regex.as_ref().map(Spanned::span));
        at(
            "invert_match",
            self.invert_match.as_ref().map(Spanned::span),
        );
        at("min_value", self.min_value.as_ref().map(Spanned::span));
        at("max_value", self.max_value.as_ref().map(Spanned::span));
        at("value", self.value.as_ref().map(Spanned::span));
        at(
            "sampling_percentage",
            self.sampling_percentage.as_ref().map(Spanned::span),
        );
        at("hash_salt", self.hash_salt.as_ref().map(Spanned::span));
        at(
            "spans_per_second",
            self.spans_per_second.as_ref().map(Spanned::span),
        );
        at(
            "burst_capacity",
            self.burst_capacity.as_ref().map(Spanned::span),
        );
        at("per", self.per.as_ref().map(Spanned::span));
        at("min_spans", self.min_spans.as_ref().map(Spanned::span));
        at("max_spans", self.max_spans.as_ref().map(Spanned::span));
        at(
            "sub_policies",
            self.sub_policies
                .as_ref()
                .and_then(|v| v.first())
                .map(Spanned::span),
        );
        at(
            "max_total_spans_per_second",
            self.max_total_spans_per_second.as_ref().map(Spanned::span),
        );
        at(
            "rate_allocation",
            self.rate_allocation
                .as_ref()
                .and_then(|m| m.values().next())
                .map(Spanned::span),
        );
        out
    }
}

/// Checks an operator's policies (`at` is the operator's `kind`, for problems of the whole
/// list); `None` when any problem was reported.
pub fn check(c: &mut Checker<'_>, raw: &[Spanned<RawPolicy>], at: &Text) -> Option<Policies> {
    if raw.is_empty() {
        c.at(
            at,
            "a tail_sampling operator needs [[operators.policies]]: e.g. name = \"errors\", \
             type = \"status_code\", status_codes = [\"ERROR\"]",
        );
        return None;
    }
    let mut out = Policies::default();
    out.list = siblings(c, raw, &mut out, 0)?;
    if out.conditions.len() > MAX_CONDITIONS {
        c.at(
            at,
            format!(
                "{} attribute and status conditions: one operator takes at most {MAX_CONDITIONS}",
                out.conditions.len()
            ),
        );
        return None;
    }
    out.text = describe(&out.list);
    Some(out)
}

/// Checks a list of sibling policies at nesting `depth`: names unique among them.
fn siblings(
    c: &mut Checker<'_>,
    raw: &[Spanned<RawPolicy>],
    out: &mut Policies,
    depth: usize,
) -> Option<Vec<Named>> {
    let mut names = BTreeSet::new();
    let mut list = Vec::new();
    let mut ok = true;
    for p in raw {
        let r = p.get_ref();
        let Some(name) = r.name.as_ref() else {
            c.at(p, "a policy needs a `name`");
            ok = false;
            continue;
        };
        let text = c.text(name);
        if text.is_empty() || !names.insert(text.clone()) {
            c.at(
                name,
                format!("policy names are unique and not empty: {text:?}"),
            );
            ok = false;
        }
        match one(c, p, out, depth) {
            Some(policy) => list.push(Named { name: text, policy }),
            None => ok = false,
        }
    }
    ok.then_some(list)
}

/// Checks one policy.
fn one(
    c: &mut Checker<'_>,
    p: &Spanned<RawPolicy>,
    out: &mut Policies,
    depth: usize,
) -> Option<Policy> {
    let r = p.get_ref();
    let Some(kind_value) = r.kind.as_ref() else {
        c.at(p, format!("a policy needs a `type`: {TYPES}"));
        return None;
    };
    let kind = c.text(kind_value);
    let Some(allowed) = settings_of(&kind) else {
        c.at(
            kind_value,
            format!("there is no policy type {kind:?}; use {TYPES}"),
        );
        return None;
    };
    let mut ok = true;
    for (name, span) in r.given() {
        if !allowed.contains(&name) {
            c.problem(
                Some(span),
                format!(
                    "`{name}` is not a setting of a {kind} policy (it takes {})",
                    list(allowed)
                ),
            );
            ok = false;
        }
    }
    let mut need = |c: &mut Checker<'_>, present: bool, name: &str| {
        if !present {
            c.at(kind_value, format!("a {kind} policy needs `{name}`"));
            ok = false;
        }
    };
    let invert = r.invert_match.as_ref().is_some_and(|b| *b.get_ref());
    let policy = match kind.as_str() {
        "always_sample" => Policy::Always,
        "latency" => {
            need(c, r.threshold.is_some(), "threshold");
            let ms = |c: &mut Checker<'_>, v: Option<&Text>| {
                v.map(|v| c.duration_or_zero(Some(v), Duration::ZERO).as_millis() as i64)
            };
            let min = ms(c, r.threshold.as_ref()).unwrap_or(0);
            let max = ms(c, r.upper_threshold.as_ref());
            if let (Some(max), Some(v)) = (max, r.upper_threshold.as_ref())
                && max <= min
            {
                c.at(v, "`upper_threshold` is above `threshold`");
                ok = false;
            }
            Policy::Latency { min, max }
        }
        "status_code" => {
            let codes: Vec<&Text> = r.status_codes.iter().flatten().collect();
            need(c, !codes.is_empty(), "status_codes");
            let mut set = BTreeSet::new();
            for code in codes {
                let text = c.text(code);
                if STATUS_CODES.contains(&text.as_str()) {
                    set.insert(text);
                } else {
                    c.at(
                        code,
                        format!("{text:?} is not a status: OK, ERROR or UNSET"),
                    );
                    ok = false;
                }
            }
            met(out, Condition::Status(set), false)
        }
        "string_attribute" => {
            need(c, r.key.is_some(), "key");
            let values: Vec<&Text> = r.values.iter().flatten().collect();
            need(c, !values.is_empty(), "values");
            let key = c.opt(r.key.as_ref()).unwrap_or_default();
            let regex = r.regex.as_ref().is_some_and(|b| *b.get_ref());
            let (mut exact, mut patterns) = (BTreeSet::new(), Vec::new());
            for v in values {
                let text = c.text(v);
                if !regex {
                    exact.insert(text);
                    continue;
                }
                match regex::Regex::new(&text) {
                    Ok(p) => patterns.push(p),
                    Err(e) => {
                        c.at(v, format!("not a regular expression: {e}"));
                        ok = false;
                    }
                }
            }
            met(
                out,
                Condition::Text {
                    key,
                    values: exact,
                    patterns,
                },
                invert,
            )
        }
        "numeric_attribute" => {
            need(c, r.key.is_some(), "key");
            need(
                c,
                r.min_value.is_some() || r.max_value.is_some(),
                "min_value or max_value",
            );
            let min = r.min_value.as_ref().map_or(i64::MIN, |v| *v.get_ref());
            let max = r.max_value.as_ref().map_or(i64::MAX, |v| *v.get_ref());
            if min > max {
                c.at(
                    r.max_value.as_ref().expect("both given"),
                    "`max_value` is below `min_value`",
                );
                ok = false;
            }
            let key = c.opt(r.key.as_ref()).unwrap_or_default();
            met(out, Condition::Number { key, min, max }, invert)
        }
        "boolean_attribute" => {
            need(c, r.key.is_some(), "key");
            need(c, r.value.is_some(), "value");
            let key = c.opt(r.key.as_ref()).unwrap_or_default();
            let value = r.value.as_ref().is_some_and(|b| *b.get_ref());
            met(out, Condition::Flag { key, value }, invert)
        }
        "probabilistic" => {
            need(c, r.sampling_percentage.is_some(), "sampling_percentage");
            let percentage = r.sampling_percentage.as_ref().map_or(0.0, |v| *v.get_ref());
            if let Some(v) = &r.sampling_percentage
                && !(0.0..=100.0).contains(v.get_ref())
            {
                c.at(v, "`sampling_percentage` is from 0 to 100");
                ok = false;
            }
            let salt = c
                .opt(r.hash_salt.as_ref())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| probabilistic::DEFAULT_SALT.to_string());
            Policy::Probabilistic {
                salt,
                threshold: probabilistic::threshold(percentage),
            }
        }
        "rate_limiting" => {
            need(c, r.spans_per_second.is_some(), "spans_per_second");
            let per_second = positive(c, r.spans_per_second.as_ref(), "spans_per_second", &mut ok);
            let burst = match &r.burst_capacity {
                None => per_second.saturating_mul(2),
                Some(_) => positive(c, r.burst_capacity.as_ref(), "burst_capacity", &mut ok),
            };
            let per_service = match c.opt(r.per.as_ref()).as_deref() {
                None | Some("partition") => false,
                Some("service") => true,
                Some(other) => {
                    c.at(
                        r.per.as_ref().expect("given"),
                        format!("`per` is \"partition\" or \"service\", not {other:?}"),
                    );
                    ok = false;
                    false
                }
            };
            out.slots.0 += 1;
            Policy::RateLimit {
                slot: out.slots.0 - 1,
                per_second,
                burst,
                per_service,
            }
        }
        "span_count" => {
            need(
                c,
                r.min_spans.is_some() || r.max_spans.is_some(),
                "min_spans or max_spans",
            );
            let count = |v: &Option<Spanned<i64>>, c: &mut Checker<'_>, ok: &mut bool| match v {
                Some(n) if *n.get_ref() < 0 => {
                    c.at(n, "a span count is 0 or more");
                    *ok = false;
                    None
                }
                Some(n) => Some(*n.get_ref() as u64),
                None => None,
            };
            let min = count(&r.min_spans, c, &mut ok).unwrap_or(0);
            let max = count(&r.max_spans, c, &mut ok);
            if max.is_some_and(|m| m < min) {
                c.at(
                    r.max_spans.as_ref().expect("given"),
                    "`max_spans` is below `min_spans`",
                );
                ok = false;
            }
            Policy::SpanCount { min, max }
        }
        "and" | "not" | "drop" | "composite" => {
            let subs: &[Spanned<RawPolicy>] = r.sub_policies.as_deref().unwrap_or_default();
            need(c, !subs.is_empty(), "sub_policies");
            if depth >= 4 {
                c.at(kind_value, "policies nest at most four deep");
                return None;
            }
            if kind == "not" && subs.len() > 1 {
                c.at(&subs[1], "a not policy has one sub-policy");
                ok = false;
            }
            let named = siblings(c, subs, out, depth + 1)?;
            match kind.as_str() {
                "and" => Policy::And(named),
                "drop" => Policy::Drop(named),
                "not" => match named.into_iter().next() {
                    Some(sub) => Policy::Not(Box::new(sub)),
                    None => return None,
                },
                _ => composite(c, r, kind_value, named, out, &mut ok)?,
            }
        }
        _ => unreachable!("settings_of knows the types"),
    };
    ok.then_some(policy)
}

/// A composite's shares: `rate_allocation` percents of the total, the rest split equally
/// among the sub-policies it does not name.
fn composite(
    c: &mut Checker<'_>,
    r: &RawPolicy,
    kind_value: &Text,
    named: Vec<Named>,
    out: &mut Policies,
    ok: &mut bool,
) -> Option<Policy> {
    if r.max_total_spans_per_second.is_none() {
        c.at(
            kind_value,
            "a composite policy needs `max_total_spans_per_second`",
        );
        *ok = false;
    }
    let total = positive(
        c,
        r.max_total_spans_per_second.as_ref(),
        "max_total_spans_per_second",
        ok,
    );
    let empty = BTreeMap::new();
    let allocation = r.rate_allocation.as_ref().unwrap_or(&empty);
    let mut given = 0i64;
    for (name, percent) in allocation {
        if !named.iter().any(|n| &n.name == name) {
            c.at(
                percent,
                format!("{name:?} is not one of the composite's sub-policies"),
            );
            *ok = false;
        }
        if !(1..=100).contains(percent.get_ref()) {
            c.at(percent, "a share is a percent from 1 to 100");
            *ok = false;
        }
        given += *percent.get_ref();
    }
    if given > 100 {
        c.at(
            kind_value,
            format!("`rate_allocation` gives {given} % in all: at most 100"),
        );
        *ok = false;
    }
    let rest = named
        .iter()
        .filter(|n| !allocation.contains_key(&n.name))
        .count() as u64;
    let left = total.saturating_mul((100 - given.clamp(0, 100)) as u64) / 100;
    let subs = named
        .into_iter()
        .map(|n| {
            let share = match allocation.get(&n.name) {
                Some(p) => total.saturating_mul(*p.get_ref() as u64) / 100,
                None => left / rest.max(1),
            };
            (n, share)
        })
        .collect();
    out.slots.1 += 1;
    Some(Policy::Composite {
        slot: out.slots.1 - 1,
        max_total: total,
        subs,
    })
}

/// A condition policy: the condition registered, tested by index.
fn met(out: &mut Policies, condition: Condition, invert: bool) -> Policy {
    out.conditions.push(condition);
    Policy::Met {
        condition: out.conditions.len() - 1,
        invert,
    }
}

/// A count above zero (spans per second, a bucket's depth), or 1 after reporting it.
fn positive(c: &mut Checker<'_>, v: Option<&Spanned<i64>>, name: &str, ok: &mut bool) -> u64 {
    match v {
        Some(n) if *n.get_ref() > 0 => *n.get_ref() as u64,
        Some(n) => {
            c.at(n, format!("`{name}` is a whole number above 0"));
            *ok = false;
            1
        }
        None => 1,
    }
}

fn list(names: &[&str]) -> String {
    if names.is_empty() {
        "no settings".to_string()
    } else {
        names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A one-line rendering of the policies: names, types and settings, in order.
pub fn describe(list: &[Named]) -> String {
    list.iter()
        .map(|n| format!("{}={}", n.name, describe_one(&n.policy)))
        .collect::<Vec<_>>()
        .join("; ")
}

fn describe_one(p: &Policy) -> String {
    match p {
        Policy::Always => "always_sample".into(),
        Policy::Latency { min, max } => match max {
            Some(max) => format!("latency({min}ms,{max}ms]"),
            None => format!("latency>={min}ms"),
        },
        Policy::Met { condition, invert } => {
            format!("{}condition{condition}", if *invert { "!" } else { "" })
        }
        Policy::Probabilistic { salt, threshold } => format!("probabilistic({salt},{threshold})"),
        Policy::SpanCount { min, max } => format!("span_count({min},{max:?})"),
        Policy::RateLimit {
            per_second,
            burst,
            per_service,
            ..
        } => format!(
            "rate({per_second}/s,{burst},{})",
            if *per_service { "service" } else { "partition" }
        ),
        Policy::And(subs) => format!("and({})", describe(subs)),
        Policy::Drop(subs) => format!("drop({})", describe(subs)),
        Policy::Not(sub) => format!("not({})", describe(std::slice::from_ref(sub))),
        Policy::Composite {
            max_total, subs, ..
        } => format!(
            "composite({max_total}/s: {})",
            subs.iter()
                .map(|(n, share)| format!("{}@{share}", describe(std::slice::from_ref(n))))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        policies: Vec<Spanned<RawPolicy>>,
        kind: Text,
    }

    fn checked(text: &str) -> Result<Policies, String> {
        let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let source = floe_config::Source {
            file: Some(std::path::Path::new("job.toml")),
            text,
        };
        let mut c = Checker::new(source);
        let out = check(&mut c, &file.policies, &file.kind);
        c.finish(|| out.expect("checked"))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_collector_s_policy_set_is_checked_into_policies() {
        let p = checked(
            r#"kind = "tail_sampling"
[[policies]]
name = "errors"
type = "status_code"
status_codes = ["ERROR"]
[[policies]]
name = "slow"
type = "latency"
threshold = "500ms"
[[policies]]
name = "gold"
type = "and"
[[policies.sub_policies]]
name = "tier"
type = "string_attribute"
key = "customer.tier"
values = ["^gold", "platinum$"]
regex = true
[[policies.sub_policies]]
name = "quarter"
type = "probabilistic"
sampling_percentage = 25
[[policies]]
name = "budget"
type = "composite"
max_total_spans_per_second = 1000
rate_allocation = { vip = 60 }
[[policies.sub_policies]]
name = "vip"
type = "boolean_attribute"
key = "vip"
value = true
[[policies.sub_policies]]
name = "rest"
type = "always_sample"
[[policies.sub_policies]]
name = "big"
type = "span_count"
min_spans = 100
"#,
        )
        .unwrap();
        assert_eq!(p.list.len(), 4);
        assert_eq!(p.conditions.len(), 3);
        assert_eq!(p.slots, (0, 1));
        let Policy::Composite { subs, .. } = &p.list[3].policy else {
            panic!("{:?}", p.list[3]);
        };
        // 60 % to vip, the other 40 % split between the two it does not name.
        let shares: Vec<u64> = subs.iter().map(|(_, s)| *s).collect();
        assert_eq!(shares, [600, 200, 200]);
        assert!(
            p.text
                .contains("quarter=probabilistic(default-hash-seed,4611686018427387903)"),
            "{}",
            p.text
        );
        let Condition::Text { patterns, .. } = &p.conditions[1] else {
            panic!()
        };
        assert!(patterns[0].is_match("golden") && !patterns[0].is_match("rose gold"));
    }

    #[test]
    fn every_mistake_is_reported_at_its_place() {
        let e = checked(
            r#"kind = "tail_sampling"
[[policies]]
name = "errors"
type = "status_code"
status_codes = ["FAILED"]
[[policies]]
name = "errors"
type = "latency"
threshold = "1s"
upper_threshold = "500ms"
key = "x"
[[policies]]
name = "odd"
type = "sometimes"
[[policies]]
name = "some"
type = "probabilistic"
sampling_percentage = 140
[[policies]]
name = "pattern"
type = "string_attribute"
key = "k"
values = ["("]
regex = true
[[policies]]
name = "limit"
type = "rate_limiting"
spans_per_second = 0
per = "host"
"#,
        )
        .unwrap_err();
        for expected in [
            "job.toml:5:17: \"FAILED\" is not a status",
            "job.toml:7:8: policy names are unique",
            "job.toml:10:19: `upper_threshold` is above `threshold`",
            "job.toml:11:7: `key` is not a setting of a latency policy",
            "job.toml:14:8: there is no policy type \"sometimes\"",
            "job.toml:18:23: `sampling_percentage` is from 0 to 100",
            "job.toml:23:11: not a regular expression",
            "job.toml:28:20: `spans_per_second` is a whole number above 0",
            "job.toml:29:7: `per` is \"partition\" or \"service\"",
        ] {
            assert!(e.contains(expected), "{expected}\n in\n{e}");
        }
        let none = checked("kind = \"tail_sampling\"\n").unwrap_err();
        assert!(
            none.contains("job.toml:1:8: a tail_sampling operator needs"),
            "{none}"
        );
    }
}
