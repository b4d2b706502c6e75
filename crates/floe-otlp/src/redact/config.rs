//! `[source.redaction]`: the job file's redaction rules, checked with their places.
//!
//! ```toml
//! [source.redaction]
//! detectors = ["email", "card", "iban"]    # default: every built-in detector
//! action = "mask"                          # the detectors' action (default mask)
//! actions = { card = "hash", private_key = "drop_record" }
//! allow_keys = ["http.route"]              # never scanned
//! keys = { "enduser.id" = "hash" }         # redacted whatever they hold
//! hash_key_env = "FLOE_PII_HASH_KEY"       # the HMAC key of `hash` (default this variable)
//!
//! [[source.redaction.patterns]]
//! name = "employee_id"
//! regex = 'EMP-(?P<v>\d{6})'               # a group `v` marks the part to redact
//! action = "mask"
//! ```

use std::collections::BTreeMap;

use floe_config::{Checker, Text};
use floe_pii::{Action, Detector, Rules, UserPattern};
use serde::Deserialize;

/// The variable `hash_key_env` names by default.
pub const DEFAULT_HASH_KEY_ENV: &str = "FLOE_PII_HASH_KEY";

/// `[source.redaction]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRedaction {
    detectors: Option<Vec<Text>>,
    action: Option<Text>,
    #[serde(default)]
    actions: BTreeMap<String, Text>,
    #[serde(default)]
    allow_keys: Vec<Text>,
    #[serde(default)]
    keys: BTreeMap<String, Text>,
    hash_key_env: Option<Text>,
    #[serde(default)]
    patterns: Vec<RawPattern>,
}

/// `[[source.redaction.patterns]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPattern {
    name: Text,
    regex: Text,
    action: Option<Text>,
}

const ACTIONS: &str =
    "an action is \"mask\", \"hash\", \"drop_attribute\", \"drop_record\" or \"flag\"";

fn action(c: &mut Checker<'_>, value: &Text) -> Action {
    Action::parse(&c.text(value)).unwrap_or_else(|| {
        c.at(value, ACTIONS);
        Action::Flag
    })
}

fn detector_names() -> String {
    Detector::ALL.map(Detector::name).join(", ")
}

/// Checked redaction settings: the rules, and where the hash key comes from.
#[derive(Debug, Clone)]
pub struct Redaction {
    /// The rules; `hash_key` is read from `hash_key_env` when checked.
    pub rules: Rules,
    /// The environment variable of the HMAC key.
    pub hash_key_env: String,
}

impl Redaction {
    /// The redactor; refused (naming the variable) when an action hashes and the key is not
    /// set — at the job's start, so `floe validate` needs no secret.
    pub fn redactor(&self) -> Result<floe_pii::Redactor, String> {
        floe_pii::Redactor::new(&self.rules).map_err(|e| match e {
            floe_pii::RulesError::NoHashKey => format!(
                "[source.redaction]: an action is \"hash\"; set its HMAC key in environment \
                 variable {}",
                self.hash_key_env
            ),
            e => format!("[source.redaction]: {e}"),
        })
    }
}

/// Checks `raw`.
pub fn check_redaction(raw: &RawRedaction, c: &mut Checker<'_>) -> Redaction {
    let mut rules = Rules::default();
    if let Some(list) = &raw.detectors {
        rules.detectors.clear();
        for name in list {
            match Detector::parse(&c.text(name)) {
                Some(d) => {
                    rules.detectors.insert(d);
                }
                None => c.at(name, format!("a detector is one of {}", detector_names())),
            }
        }
    }
    if let Some(a) = &raw.action {
        rules.default_action = action(c, a);
    }
    for (name, a) in &raw.actions {
        match Detector::parse(name) {
            Some(d) => {
                let a = action(c, a);
                rules.actions.insert(d, a);
            }
            None => c.at(
                a,
                format!("{name:?} is no detector; one of {}", detector_names()),
            ),
        }
    }
    for key in &raw.allow_keys {
        let key = c.text(key);
        rules.allow_keys.insert(key);
    }
    for (key, a) in &raw.keys {
        let a = action(c, a);
        rules.keys.insert(key.clone(), a);
    }
    for p in &raw.patterns {
        let name = c.text(&p.name);
        let regex = c.text(&p.regex);
        if let Err(e) = regex::Regex::new(&regex) {
            c.at(&p.regex, format!("pattern {name}: {e}"));
        }
        if name.is_empty() || Detector::parse(&name).is_some() || name == "key" {
            c.at(
                &p.name,
                "a pattern's name is its own (not a detector's, not \"key\")",
            );
        }
        let action = p
            .action
            .as_ref()
            .map_or(rules.default_action, |a| action(c, a));
        rules.patterns.push(UserPattern {
            name,
            regex,
            action,
        });
    }
    let env = raw
        .hash_key_env
        .as_ref()
        .map_or_else(|| DEFAULT_HASH_KEY_ENV.to_string(), |e| c.text(e));
    rules.hash_key = std::env::var(&env)
        .ok()
        .filter(|k| !k.is_empty())
        .map(String::into_bytes);
    Redaction {
        rules,
        hash_key_env: env,
    }
}
