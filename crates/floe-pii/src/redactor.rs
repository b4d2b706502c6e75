//! [`Redactor`]: every detector over a string in one pass, then the actions.
//!
//! One [`regex::RegexSet`] holds every detector's pattern (built-in and the job's own); a
//! string none of them matches — almost every string — costs that one pass. For the
//! patterns that match, their own regex finds the candidates, the validators keep the real
//! ones, overlaps go to the detector first in precedence, and each finding is replaced by
//! its action's text — or the attribute or the record is dropped.

use std::collections::{BTreeMap, BTreeSet};

use hmac::{Hmac, Mac};
use regex::{Regex, RegexSet};
use sha2::Sha256;

use crate::Detector;

/// What is done with a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    /// Replaced by `*` per letter and digit, punctuation kept (its shape).
    Mask,
    /// Replaced by `hmac:` and the first 16 bytes (hex) of its HMAC-SHA256 under the job's
    /// key: the same value gives the same text, so joins and counts on it still work.
    Hash,
    /// The attribute (or log body) that holds it is removed.
    DropAttribute,
    /// The span, log record, data point or profile sample that holds it is not written.
    DropRecord,
    /// Counted in the findings, left as it is.
    Flag,
}

impl Action {
    /// Its name in job files and in the findings table.
    pub fn name(self) -> &'static str {
        match self {
            Action::Mask => "mask",
            Action::Hash => "hash",
            Action::DropAttribute => "drop_attribute",
            Action::DropRecord => "drop_record",
            Action::Flag => "flag",
        }
    }

    /// The action named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [
            Action::Mask,
            Action::Hash,
            Action::DropAttribute,
            Action::DropRecord,
            Action::Flag,
        ]
        .into_iter()
        .find(|a| a.name() == name)
    }

    /// The more severe of two: a drop wins over a replacement, a replacement over a flag.
    fn severity(self) -> u8 {
        match self {
            Action::Flag => 0,
            Action::Mask | Action::Hash => 1,
            Action::DropAttribute => 2,
            Action::DropRecord => 3,
        }
    }
}

/// What finds a value: a built-in detector, a pattern of the job's, or the attribute's key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Finder {
    /// A built-in detector.
    Builtin(Detector),
    /// A pattern the job declared, by its name.
    Pattern(String),
    /// A key the job redacts whatever its value (`keys`).
    Key,
}

impl Finder {
    /// Its name in the findings table: the detector's or pattern's, or `key`.
    pub fn name(&self) -> &str {
        match self {
            Finder::Builtin(d) => d.name(),
            Finder::Pattern(name) => name,
            Finder::Key => "key",
        }
    }
}

/// A pattern of the job's own.
#[derive(Debug, Clone)]
pub struct UserPattern {
    /// Its name (in the findings table).
    pub name: String,
    /// The regex; a group named `v` marks the part to redact.
    pub regex: String,
    /// Its action.
    pub action: Action,
}

/// A redactor's settings, as a job declares them.
#[derive(Debug, Clone)]
pub struct Rules {
    /// The built-in detectors that run (all by default).
    pub detectors: BTreeSet<Detector>,
    /// The action of each built-in detector not in `actions`.
    pub default_action: Action,
    /// Per built-in detector, its action.
    pub actions: BTreeMap<Detector, Action>,
    /// The job's patterns.
    pub patterns: Vec<UserPattern>,
    /// Attribute keys whose values are not scanned.
    pub allow_keys: BTreeSet<String>,
    /// Attribute keys whose values are redacted whatever they hold, with their action.
    pub keys: BTreeMap<String, Action>,
    /// The HMAC key of [`Action::Hash`] (required when any action hashes).
    pub hash_key: Option<Vec<u8>>,
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            detectors: Detector::ALL.into_iter().collect(),
            default_action: Action::Mask,
            actions: BTreeMap::new(),
            patterns: Vec::new(),
            allow_keys: BTreeSet::new(),
            keys: BTreeMap::new(),
            hash_key: None,
        }
    }
}

/// Why rules do not make a redactor.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// A pattern of the job's does not compile.
    #[error("pattern {name}: {reason}")]
    Pattern {
        /// The pattern's name.
        name: String,
        /// The regex crate's message.
        reason: String,
    },
    /// A hash action without a key.
    #[error(
        "an action is hash but no key is set (hash_key_env names the environment variable that holds it)"
    )]
    NoHashKey,
}

/// One finding in a string: what found it, and what was done.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Finding {
    /// What found it.
    pub finder: Finder,
    /// What was done.
    pub action: Action,
}

/// What became of one string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing to change (nothing found, or only flags).
    Kept,
    /// Its new text.
    Replaced(String),
    /// The attribute (or body) that holds it goes.
    DropAttribute,
    /// The record that holds it goes.
    DropRecord,
}

/// A compiled set of rules.
#[derive(Debug)]
pub struct Redactor {
    set: RegexSet,
    /// Per pattern of the set: what it finds, its own regex, its action.
    finders: Vec<(Finder, Regex, Action)>,
    allow_keys: BTreeSet<String>,
    keys: BTreeMap<String, Action>,
    hash_key: Option<Vec<u8>>,
}

impl Redactor {
    /// Compiles `rules`.
    pub fn new(rules: &Rules) -> Result<Self, RulesError> {
        let mut finders = Vec::new();
        for detector in Detector::ALL {
            if rules.detectors.contains(&detector) {
                let action = rules
                    .actions
                    .get(&detector)
                    .copied()
                    .unwrap_or(rules.default_action);
                let regex = Regex::new(detector.pattern()).expect("a built-in pattern compiles");
                finders.push((Finder::Builtin(detector), regex, action));
            }
        }
        for p in &rules.patterns {
            let regex = Regex::new(&p.regex).map_err(|e| RulesError::Pattern {
                name: p.name.clone(),
                reason: e.to_string(),
            })?;
            finders.push((Finder::Pattern(p.name.clone()), regex, p.action));
        }
        let hashes = finders.iter().any(|(_, _, a)| *a == Action::Hash)
            || rules.keys.values().any(|a| *a == Action::Hash);
        if hashes && rules.hash_key.as_ref().is_none_or(Vec::is_empty) {
            return Err(RulesError::NoHashKey);
        }
        let set = RegexSet::new(finders.iter().map(|(_, r, _)| r.as_str())).map_err(|e| {
            RulesError::Pattern {
                name: "(all patterns together)".into(),
                reason: e.to_string(),
            }
        })?;
        Ok(Self {
            set,
            finders,
            allow_keys: rules.allow_keys.clone(),
            keys: rules.keys.clone(),
            hash_key: rules.hash_key.clone(),
        })
    }

    /// Whether attribute `key`'s values are never scanned (`allow_keys`).
    pub fn allows(&self, key: &str) -> bool {
        self.allow_keys.contains(key)
    }

    /// The action on attribute `key`'s values whatever they hold (`keys`), if any.
    pub fn key_rule(&self, key: &str) -> Option<Action> {
        self.keys.get(key).copied()
    }

    /// What `action` makes of `text` when it applies to all of it (a key's rule): the
    /// replacement, or the drop.
    pub fn apply_whole(&self, action: Action, text: &str) -> Outcome {
        match action {
            Action::Flag => Outcome::Kept,
            Action::DropAttribute => Outcome::DropAttribute,
            Action::DropRecord => Outcome::DropRecord,
            Action::Mask | Action::Hash => Outcome::Replaced(self.replace(action, text)),
        }
    }

    /// Redacts `text`, the value of attribute `key` (`None` for a log body or another
    /// field without a key); each finding goes to `found`.
    pub fn redact(
        &self,
        key: Option<&str>,
        text: &str,
        found: &mut impl FnMut(Finding),
    ) -> Outcome {
        if let Some(key) = key {
            if self.allow_keys.contains(key) {
                return Outcome::Kept;
            }
            if let Some(&action) = self.keys.get(key) {
                found(Finding {
                    finder: Finder::Key,
                    action,
                });
                return self.apply_whole(action, text);
            }
        }
        // The common case, without allocating: nothing matches.
        if !self.set.is_match(text) {
            return Outcome::Kept;
        }
        let matched = self.set.matches(text);
        // (start, end, precedence) of every validated candidate.
        let mut candidates: Vec<(usize, usize, usize)> = Vec::new();
        for i in matched.iter() {
            let (finder, regex, _) = &self.finders[i];
            for caps in regex.captures_iter(text) {
                let m = caps.name("v").or_else(|| caps.get(0)).expect("a match");
                let len = match finder {
                    Finder::Builtin(d) => {
                        d.validate(m.as_str(), &text[..m.start()], &text[m.end()..])
                    }
                    _ => Some(m.len()),
                };
                if let Some(len) = len.filter(|l| *l > 0) {
                    candidates.push((m.start(), m.start() + len, i));
                }
            }
        }
        // Precedence first, then position: each kept finding excludes what overlaps it —
        // except that a flag excludes nothing (flags are placed last, where still free).
        let flag = |i: usize| self.finders[i].2 == Action::Flag;
        candidates.sort_by_key(|&(start, _, i)| (flag(i), i, start));
        // Kept findings by start → end: an overlap is the one starting last before the end.
        let mut taken: BTreeMap<usize, usize> = BTreeMap::new();
        let mut kept: Vec<(usize, usize, usize)> = Vec::new();
        for c in candidates {
            let free = taken
                .range(..c.1)
                .next_back()
                .is_none_or(|(_, &end)| end <= c.0);
            if free {
                taken.insert(c.0, c.1);
                kept.push(c);
            }
        }
        if kept.is_empty() {
            return Outcome::Kept;
        }
        kept.sort_unstable();
        let mut worst = Action::Flag;
        for &(_, _, i) in &kept {
            let (finder, _, action) = &self.finders[i];
            found(Finding {
                finder: finder.clone(),
                action: *action,
            });
            if action.severity() > worst.severity() {
                worst = *action;
            }
        }
        match worst {
            Action::Flag => Outcome::Kept,
            Action::DropRecord => Outcome::DropRecord,
            Action::DropAttribute => Outcome::DropAttribute,
            Action::Mask | Action::Hash => {
                let mut out = String::with_capacity(text.len());
                let mut at = 0;
                for (start, end, i) in kept {
                    out.push_str(&text[at..start]);
                    let action = self.finders[i].2;
                    match action {
                        Action::Flag => out.push_str(&text[start..end]),
                        _ => out.push_str(&self.replace(action, &text[start..end])),
                    }
                    at = end;
                }
                out.push_str(&text[at..]);
                Outcome::Replaced(out)
            }
        }
    }

    /// The text that stands for `value` under `action` (mask or hash).
    fn replace(&self, action: Action, value: &str) -> String {
        match action {
            Action::Hash => {
                let key = self.hash_key.as_deref().expect("checked when built");
                let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
                mac.update(value.as_bytes());
                let digest = mac.finalize().into_bytes();
                let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
                format!("hmac:{hex}")
            }
            _ => value
                .chars()
                .map(|c| if c.is_alphanumeric() { '*' } else { c })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redactor(rules: Rules) -> Redactor {
        Redactor::new(&rules).unwrap()
    }

    /// The outcome and the findings' names of `text` under the default rules.
    fn run(r: &Redactor, key: Option<&str>, text: &str) -> (Outcome, Vec<String>) {
        let mut found = Vec::new();
        let outcome = r.redact(key, text, &mut |f| {
            found.push(format!("{}:{}", f.finder.name(), f.action.name()))
        });
        (outcome, found)
    }

    #[test]
    fn every_detector_finds_its_kind_in_running_text() {
        let r = redactor(Rules::default());
        let cases = [
            ("mail jane.doe+shop@example.co.uk now", "email"),
            ("call +1 415 555 0123 today", "phone"),
            ("card 4111 1111 1111 1111 declined", "card"),
            ("iban DE89 3704 0044 0532 0130 00 ok", "iban"),
            ("ssn 123-45-6789", "us_ssn"),
            ("cpf 529.982.247-25", "cpf"),
            ("cnpj 11.222.333/0001-81", "cnpj"),
            ("from 203.0.113.7 via", "ipv4"),
            ("peer 2001:db8::8a2e:370:7334 up", "ipv6"),
            (
                "token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abc_def-ghi",
                "jwt",
            ),
            ("key AKIAIOSFODNN7EXAMPLE used", "cloud_key"),
            (
                "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
                "private_key",
            ),
            ("Authorization: Bearer abc.def-ghi_jkl", "bearer"),
            ("secret q8ZrT2xLw9VbN4mKp7HsY3dFg6Jc end", "secret"),
        ];
        for (text, kind) in cases {
            let (outcome, found) = run(&r, None, text);
            assert_eq!(found, vec![format!("{kind}:mask")], "{text}");
            let Outcome::Replaced(out) = outcome else {
                panic!("{text}: {outcome:?}")
            };
            assert_ne!(out, text);
            assert_eq!(out.len(), text.len(), "the mask keeps the shape: {out}");
        }
    }

    #[test]
    fn decoys_are_not_findings() {
        let r = redactor(Rules::default());
        for text in [
            "4111 1111 1111 1112",                     // Luhn-invalid card
            "order 1234567812345670",                  // Luhn-valid, no issuer
            "cpf 529.982.247-26",                      // wrong check digit
            "trace 0af7651916cd43dd8448eb211c80319c",  // hex trace id
            "id 550e8400-e29b-41d4-a716-446655440000", // UUID
            "version 1.24.3",                          // version
            "build v2.3.4.5 and 1.2.3.4.5",            // dotted versions
            "at 12:30:45 on 2026-12-07",               // time and date
            "GET /api/v1/orders/42?page=3",            // a route
            "span 00f067aa0ba902b7",                   // span id
            "mac 00:1a:2b:3c:4d:5e",                   // MAC address
            "took 1234567 ns",                         // a count
        ] {
            let (outcome, found) = run(&r, None, text);
            assert_eq!((outcome, found), (Outcome::Kept, vec![]), "{text}");
        }
    }

    #[test]
    fn values_next_to_other_text_are_found_and_odd_input_does_not_panic() {
        let r = redactor(Rules::default());
        for (text, masked) in [
            (
                "card 4111 1111 1111 1111 12/27",
                "card **** **** **** **** 12/27",
            ),
            ("net 10.0.0.1/24", "net **.*.*.*/24"),
            ("peers 10.0.0.1 10.0.0.2", "peers **.*.*.* **.*.*.*"),
            (
                "pay ES91 2100 0418 4502 0005 1332 EUR",
                "pay **** **** **** **** **** **** EUR",
            ),
            ("from fe80::1: refused", "from ****::*: refused"),
            (
                "iban de89 3704 0044 0532 0130 00",
                "iban **** **** **** **** **** **",
            ),
        ] {
            assert_eq!(
                run(&r, None, text).0,
                Outcome::Replaced(masked.into()),
                "{text}"
            );
        }
        // Non-ASCII digits are no digits: no finding, no panic.
        assert_eq!(
            run(&r, None, "DE1\u{0969}3704004405320130").0,
            Outcome::Kept
        );
        assert_eq!(
            run(&r, None, "\u{0967}\u{0968}\u{0969}-45-6789 é").0,
            Outcome::Kept
        );
    }

    #[test]
    fn a_flag_does_not_shield_what_it_overlaps() {
        let r = redactor(Rules {
            patterns: vec![UserPattern {
                name: "contact".into(),
                regex: r"contact \S+".into(),
                action: Action::Flag,
            }],
            ..Rules::default()
        });
        let (outcome, found) = run(&r, None, "contact jane@example.com");
        assert_eq!(
            outcome,
            Outcome::Replaced("contact ****@*******.***".into())
        );
        assert_eq!(
            found,
            ["email:mask"],
            "the flag overlapping the mask is not placed"
        );
    }

    #[test]
    fn precedence_and_several_findings_in_one_string() {
        let r = redactor(Rules::default());
        let (outcome, found) = run(&r, None, "a@b.io paid 5500-0000-0000-0004 from 10.0.0.1");
        assert_eq!(found, ["email:mask", "card:mask", "ipv4:mask"]);
        assert_eq!(
            outcome,
            Outcome::Replaced("*@*.** paid ****-****-****-**** from **.*.*.*".into())
        );
    }

    #[test]
    fn actions_keys_and_patterns() {
        let rules = Rules {
            actions: [
                (Detector::Email, Action::Hash),
                (Detector::Card, Action::DropRecord),
                (Detector::Ipv4, Action::Flag),
            ]
            .into(),
            keys: [("enduser.id".to_string(), Action::DropAttribute)].into(),
            allow_keys: ["net.peer.ip".to_string()].into(),
            patterns: vec![UserPattern {
                name: "employee".into(),
                regex: r"\bEMP-(?P<v>\d{6})\b".into(),
                action: Action::Mask,
            }],
            hash_key: Some(b"k".to_vec()),
            ..Rules::default()
        };
        let r = redactor(rules);
        let (a, _) = run(&r, None, "jane@example.com");
        let (b, _) = run(&r, Some("user"), "jane@example.com");
        assert_eq!(a, b, "the same value hashes the same");
        let Outcome::Replaced(hashed) = a else {
            panic!()
        };
        assert!(
            hashed.starts_with("hmac:") && hashed.len() == 37,
            "{hashed}"
        );
        assert_eq!(
            run(&r, None, "card 4111111111111111").0,
            Outcome::DropRecord
        );
        assert_eq!(
            run(&r, None, "from 10.0.0.1"),
            (Outcome::Kept, vec!["ipv4:flag".to_string()])
        );
        assert_eq!(run(&r, Some("net.peer.ip"), "10.0.0.1").0, Outcome::Kept);
        assert_eq!(
            run(&r, Some("enduser.id"), "anything"),
            (
                Outcome::DropAttribute,
                vec!["key:drop_attribute".to_string()]
            )
        );
        assert_eq!(
            run(&r, None, "by EMP-123456").0,
            Outcome::Replaced("by EMP-******".into())
        );
        // Redacted text is not found again.
        let Outcome::Replaced(once) = run(&r, None, "by EMP-123456").0 else {
            panic!()
        };
        assert_eq!(run(&r, None, &once).0, Outcome::Kept);
    }

    #[test]
    fn hashing_needs_a_key_and_patterns_must_compile() {
        let rules = Rules {
            default_action: Action::Hash,
            ..Rules::default()
        };
        assert!(matches!(Redactor::new(&rules), Err(RulesError::NoHashKey)));
        let rules = Rules {
            patterns: vec![UserPattern {
                name: "bad".into(),
                regex: "(".into(),
                action: Action::Mask,
            }],
            ..Rules::default()
        };
        assert!(matches!(
            Redactor::new(&rules),
            Err(RulesError::Pattern { .. })
        ));
    }
}
