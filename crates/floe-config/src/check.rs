//! [`Checker`]: validation that collects every problem of a file, each at its place.
//!
//! Every Floe file (job, catalog, maintenance) is checked the same way: string values may use
//! `${VAR}` / `${VAR:-default}` (expanded here), durations and sizes carry units, counts are
//! positive, and every problem is kept with its `file:line:col` so the user sees them all at
//! once. Configuration sections of sources and operators check their own fields with the
//! checker they are handed.

use std::ops::Range;
use std::time::Duration;

use toml::Spanned;

use crate::{ConfigErrors, ConfigProblem, Source};

/// A string value with its place in the file.
pub type Text = Spanned<String>;

/// Collects the problems of one file.
#[derive(Debug)]
pub struct Checker<'a> {
    source: Source<'a>,
    problems: Vec<ConfigProblem>,
}

impl<'a> Checker<'a> {
    /// A checker of `source` with no problems yet.
    pub fn new(source: Source<'a>) -> Self {
        Self {
            source,
            problems: Vec::new(),
        }
    }

    /// The file being checked.
    pub fn source(&self) -> Source<'a> {
        self.source
    }

    /// A problem at `span` (the whole file when `None`).
    pub fn problem(&mut self, span: Option<Range<usize>>, message: impl Into<String>) {
        self.problems.push(self.source.problem(span, message));
    }

    /// A problem at a place found earlier ([`place`](Self::place)).
    pub fn at_place(&mut self, place: &str, message: impl Into<String>) {
        self.problems.push(ConfigProblem {
            place: place.to_string(),
            message: message.into(),
        });
    }

    /// A problem at a value.
    pub fn at<T>(&mut self, value: &Spanned<T>, message: impl Into<String>) {
        self.problem(Some(value.span()), message);
    }

    /// The `file:line:col` of a value (to report later, e.g. when a running job finds the
    /// job file incompatible with its state).
    pub fn place<T>(&self, value: &Spanned<T>) -> String {
        self.source.place(Some(value.span()))
    }

    /// Whether a problem was found.
    pub fn failed(&self) -> bool {
        !self.problems.is_empty()
    }

    /// The value `build` makes if no problem was found, else every problem.
    pub fn finish<T>(self, build: impl FnOnce() -> T) -> Result<T, ConfigErrors> {
        if self.problems.is_empty() {
            Ok(build())
        } else {
            Err(ConfigErrors(self.problems))
        }
    }

    /// Checks `version = 1` (see [`crate::check_version`]).
    pub fn version(&mut self, version: Option<&Spanned<i64>>) {
        crate::check_version(self.source, version, &mut self.problems);
    }

    /// The interpolated text of a value (`${VAR}` expanded).
    pub fn text(&mut self, value: &Text) -> String {
        match crate::interpolate(value.get_ref()) {
            Ok(text) => text,
            Err(message) => {
                self.at(value, message);
                value.get_ref().clone()
            }
        }
    }

    /// The interpolated text of an optional value.
    pub fn opt(&mut self, value: Option<&Text>) -> Option<String> {
        value.map(|v| self.text(v))
    }

    /// A duration (`10s`, `500ms`) that must be more than zero; `default` when absent.
    pub fn duration(&mut self, value: Option<&Text>, default: Duration) -> Duration {
        self.parsed(value, default, crate::parse_duration, Duration::is_zero)
    }

    /// A duration that may be zero; `default` when absent.
    pub fn duration_or_zero(&mut self, value: Option<&Text>, default: Duration) -> Duration {
        self.parsed(value, default, crate::parse_duration, |_| false)
    }

    /// A size (`256MiB`) that must be more than zero; `default` when absent.
    pub fn bytes(&mut self, value: Option<&Text>, default: u64) -> u64 {
        self.parsed(value, default, crate::parse_bytes, |b| *b == 0)
    }

    /// A value parsed by `parse` that `zero` must not hold for; `default` when absent or
    /// wrong.
    fn parsed<T>(
        &mut self,
        value: Option<&Text>,
        default: T,
        parse: fn(&str) -> Result<T, String>,
        zero: fn(&T) -> bool,
    ) -> T {
        let Some(value) = value else {
            return default;
        };
        let text = self.text(value);
        match parse(&text) {
            Ok(parsed) if !zero(&parsed) => parsed,
            Ok(_) => {
                self.at(value, "must be more than zero");
                default
            }
            Err(message) => {
                self.at(value, message);
                default
            }
        }
    }

    /// An integer in `range` (inclusive); `default` when absent or out of it.
    pub fn integer(
        &mut self,
        value: Option<&Spanned<i64>>,
        name: &str,
        range: std::ops::RangeInclusive<i64>,
        default: i64,
    ) -> i64 {
        match value {
            Some(v) if range.contains(v.get_ref()) => *v.get_ref(),
            Some(v) => {
                self.at(v, format!("{name} is {} to {}", range.start(), range.end()));
                default
            }
            None => default,
        }
    }

    /// A positive integer; `default` when absent or not positive.
    pub fn positive(&mut self, value: Option<&Spanned<i64>>, name: &str, default: u64) -> u64 {
        match value {
            Some(v) if *v.get_ref() > 0 => *v.get_ref() as u64,
            Some(v) => {
                self.at(v, format!("{name} must be positive"));
                default
            }
            None => default,
        }
    }

    /// One of `choices` (by name); `default` when absent or not one of them.
    pub fn choice<T: Copy>(
        &mut self,
        value: Option<&Text>,
        name: &str,
        choices: &[(&str, T)],
        default: T,
    ) -> T {
        let Some(value) = value else {
            return default;
        };
        let text = self.text(value);
        match choices.iter().find(|(n, _)| *n == text) {
            Some((_, t)) => *t,
            None => {
                let names: Vec<String> = choices.iter().map(|(n, _)| format!("{n:?}")).collect();
                self.at(
                    value,
                    format!("{name} is one of {}, not {text:?}", names.join(", ")),
                );
                default
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Raw {
        every: Option<Text>,
        size: Option<Text>,
        count: Option<Spanned<i64>>,
        mode: Option<Text>,
    }

    #[test]
    fn collects_every_problem_at_its_place() {
        let text = "every = \"10\"\nsize = \"0MiB\"\ncount = 99\nmode = \"fast\"\n";
        let source = Source {
            file: Some(std::path::Path::new("j.toml")),
            text,
        };
        let raw: Raw = crate::parse(source).unwrap();
        let mut c = Checker::new(source);
        assert_eq!(
            c.duration(raw.every.as_ref(), Duration::from_secs(1)),
            Duration::from_secs(1)
        );
        assert_eq!(c.bytes(raw.size.as_ref(), 7), 7);
        assert_eq!(c.integer(raw.count.as_ref(), "count", 1..=64, 2), 2);
        let mode = c.choice(raw.mode.as_ref(), "mode", &[("slow", 1), ("safe", 2)], 0);
        assert_eq!(mode, 0, "a wrong choice gives the default");
        let errors = c.finish(|| ()).unwrap_err().to_string();
        let lines: Vec<&str> = errors.lines().collect();
        assert_eq!(lines.len(), 4, "{errors}");
        assert!(
            lines[0].starts_with("j.toml:1:9: \"10\" needs a unit"),
            "{errors}"
        );
        assert!(
            lines[1].starts_with("j.toml:2:8: must be more than zero"),
            "{errors}"
        );
        assert!(
            lines[2].starts_with("j.toml:3:9: count is 1 to 64"),
            "{errors}"
        );
        assert!(
            lines[3].contains("mode is one of \"slow\", \"safe\", not \"fast\""),
            "{errors}"
        );
    }
}
