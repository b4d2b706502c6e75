//! The job file parts this crate owns: `[source.generator]` (the quickstart's data) and the
//! OTLP format's `signals` map of `[source.kafka]`.
//!
//! ```toml
//! [source.generator]
//! requests_per_second = 2000   # traces of five spans and five logs each
//! duration = "20s"             # stop after this long (default: run until stopped)
//! seed = 42
//! ```

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use floe_config::{Checker, Text};
use serde::Deserialize;
use toml::Spanned;

use crate::Signal;

/// `[source.generator]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGenerator {
    /// Requests (a trace of five spans and five logs each) per second (default 2000).
    pub requests_per_second: Option<Spanned<i64>>,
    /// Stop after this long (default: until stopped).
    pub duration: Option<Text>,
    /// Seed of the generated data (default 42).
    pub seed: Option<Spanned<i64>>,
}

/// The generator's settings.
#[derive(Debug, Clone)]
pub struct GeneratorConfig {
    /// Requests per second.
    pub requests_per_second: u64,
    /// Stop after this long (`None`: until stopped).
    pub duration: Option<Duration>,
    /// Seed of the data.
    pub seed: u64,
}

impl RawGenerator {
    /// The typed settings; problems go to `c`.
    pub fn check(&self, c: &mut Checker<'_>) -> GeneratorConfig {
        GeneratorConfig {
            requests_per_second: c.integer(
                self.requests_per_second.as_ref(),
                "requests_per_second",
                1..=10_000_000,
                2_000,
            ) as u64,
            duration: self
                .duration
                .as_ref()
                .map(|d| c.duration(Some(d), Duration::from_secs(30))),
            seed: self.seed.as_ref().map_or(42, |s| *s.get_ref() as u64),
        }
    }
}

/// The OTLP format's topic → signal map (`signals = { my_spans = "traces" }`); problems go to
/// `c`.
pub fn check_signals(raw: &BTreeMap<String, Text>, c: &mut Checker<'_>) -> HashMap<String, Signal> {
    let mut signals = HashMap::new();
    for (topic, signal) in raw {
        match Signal::parse(&c.text(signal)) {
            Some(s) => {
                signals.insert(topic.clone(), s);
            }
            None => c.at(
                signal,
                "a signal is \"traces\", \"logs\", \"metrics\" or \"profiles\"",
            ),
        }
    }
    signals
}
