//! `floe-config`: what every Floe configuration file shares — parse, validate, build.
//!
//! A file is read into raw serde structs (which refuse unknown fields) with [`parse`]; a syntax
//! or shape error comes back as one [`ConfigProblem`] at its `file:line:col`. Validation then
//! collects **every** problem, placing each value by its `toml::Spanned` span with
//! [`Source::place`], and only a file without problems becomes a typed config. The caller
//! prints [`ConfigErrors`] (one problem per line) and exits with code 2.

use std::ops::Range;
use std::path::Path;

use serde::de::DeserializeOwned;

/// One problem found in a configuration, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// `file:line:col`, or the flag / environment variable the value came from.
    pub place: String,
    /// What is wrong.
    pub message: String,
}

/// Every problem found, one per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(|p| format!("{}: {}", p.place, p.message)).collect::<Vec<_>>().join("\n"))]
pub struct ConfigErrors(pub Vec<ConfigProblem>);

/// The text of a configuration and the file it came from, to place spans.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// The file, if the text came from one.
    pub file: Option<&'a Path>,
    /// The whole text.
    pub text: &'a str,
}

impl Source<'_> {
    /// `file:line:col` of a span (1-based), or just the file without one.
    pub fn place(&self, span: Option<Range<usize>>) -> String {
        let file = self
            .file
            .map(|f| f.display().to_string())
            .unwrap_or_else(|| "<config>".into());
        let Some(span) = span else {
            return file;
        };
        let before = &self.text[..span.start.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        format!("{file}:{line}:{col}")
    }

    /// A problem at `span`.
    pub fn problem(&self, span: Option<Range<usize>>, message: impl Into<String>) -> ConfigProblem {
        ConfigProblem {
            place: self.place(span),
            message: message.into(),
        }
    }
}

/// Parses TOML into `T`; a syntax or shape error (unknown field, wrong type) is reported at
/// its position.
pub fn parse<T: DeserializeOwned>(source: Source<'_>) -> Result<T, ConfigErrors> {
    toml::from_str(source.text)
        .map_err(|e| ConfigErrors(vec![source.problem(e.span(), e.message())]))
}

/// Reads a file into text; a read error is a problem placed at the file.
pub fn read(path: &Path) -> Result<String, ConfigErrors> {
    std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![ConfigProblem {
            place: path.display().to_string(),
            message: format!("cannot read the file: {e}"),
        }])
    })
}

/// Checks `version = 1`, the format version every Floe file carries.
pub fn check_version(
    source: Source<'_>,
    version: Option<&toml::Spanned<i64>>,
    problems: &mut Vec<ConfigProblem>,
) {
    match version {
        Some(v) if *v.get_ref() != 1 => problems.push(source.problem(
            Some(v.span()),
            format!(
                "version {} is not supported; this is version 1",
                v.get_ref()
            ),
        )),
        Some(_) => {}
        None if source.file.is_some() => {
            problems.push(source.problem(None, "`version = 1` is required"))
        }
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Raw {
        version: Option<toml::Spanned<i64>>,
        name: Option<String>,
    }

    #[test]
    fn places_errors_at_line_and_column() {
        let file = Path::new("x.toml");
        let text = "version = 2\nname = \"a\"\nnope = 1\n";
        let err = parse::<Raw>(Source {
            file: Some(file),
            text,
        })
        .unwrap_err();
        assert!(err.to_string().starts_with("x.toml:3:1:"), "{err}");
        let raw: Raw = parse(Source {
            file: Some(file),
            text: "version = 2\n",
        })
        .unwrap();
        let mut problems = Vec::new();
        check_version(
            Source {
                file: Some(file),
                text: "version = 2\n",
            },
            raw.version.as_ref(),
            &mut problems,
        );
        assert_eq!(problems[0].place, "x.toml:1:11");
        let mut missing = Vec::new();
        check_version(
            Source {
                file: Some(file),
                text: "",
            },
            None,
            &mut missing,
        );
        assert_eq!(
            ConfigErrors(missing).to_string(),
            "x.toml: `version = 1` is required"
        );
    }
}
