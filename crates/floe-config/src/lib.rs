//! `floe-config`: what every Floe configuration file shares — parse, validate, build.
//!
//! A file is read into raw serde structs (which refuse unknown fields) with [`parse`]; a syntax
//! or shape error comes back as one [`ConfigProblem`] at its `file:line:col`. Validation then
//! collects **every** problem with a [`Checker`], placing each value by its `toml::Spanned`
//! span, and only a file without problems becomes a typed config. The caller prints
//! [`ConfigErrors`] (one problem per line) and exits with code 2.

use std::ops::Range;
use std::path::Path;

use serde::de::DeserializeOwned;

mod check;

pub use check::{Checker, Text};
pub use toml::Spanned;

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

/// The catalog bearer token of the environment (`FLOE_CATALOG_TOKEN`), for a config file
/// that sets none; unset or empty is none.
pub fn catalog_token_from_env() -> Option<String> {
    env_value("FLOE_CATALOG_TOKEN")
}

/// The catalog's OAuth2 `id:secret` of the environment (`FLOE_CATALOG_CREDENTIAL`), for a
/// config file that sets none; unset or empty is none.
pub fn catalog_credential_from_env() -> Option<String> {
    env_value("FLOE_CATALOG_CREDENTIAL")
}

fn env_value(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Expands `${VAR}` and `${VAR:-default}` from the environment (`$$` is a literal `$`); an
/// unset variable without a default is an error naming it.
pub fn interpolate(value: &str) -> Result<String, String> {
    interpolate_with(value, |name| std::env::var(name).ok())
}

/// [`interpolate`] with another variable lookup.
pub fn interpolate_with(
    value: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
            continue;
        }
        let Some(body) = after.strip_prefix('{') else {
            out.push('$');
            rest = after;
            continue;
        };
        let Some(end) = body.find('}') else {
            return Err(format!("unclosed `${{` in {value:?}"));
        };
        let expr = &body[..end];
        let (name, default) = match expr.split_once(":-") {
            Some((name, default)) => (name, Some(default)),
            None => (expr, None),
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("`${{{expr}}}` is not a variable reference"));
        }
        match (lookup(name).filter(|v| !v.is_empty()), default) {
            (Some(v), _) => out.push_str(&v),
            (None, Some(default)) => out.push_str(default),
            (None, None) => {
                return Err(format!(
                    "environment variable {name} is not set (write ${{{name}:-default}} for a default)"
                ));
            }
        }
        rest = &body[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `"10 s"` → `(10.0, "s")`: a decimal number and the unit after it (trimmed).
fn number_and_unit(value: &str) -> Option<(f64, &str)> {
    let value = value.trim();
    let split = value
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    Some((number.parse().ok()?, unit.trim()))
}

/// Parses a duration like `500ms`, `10s`, `5m`, `2h`, `1d`.
pub fn parse_duration(value: &str) -> Result<std::time::Duration, String> {
    let (number, unit) = number_and_unit(value)
        .ok_or_else(|| format!("{value:?} is not a duration like 10s, 500ms, 5m"))?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "s" => number,
        "m" | "min" => number * 60.0,
        "h" => number * 3600.0,
        "d" => number * 86400.0,
        _ => return Err(format!("{value:?} needs a unit: ms, s, m, h or d")),
    };
    Ok(std::time::Duration::from_secs_f64(seconds))
}

/// Parses a size like `512MiB`, `64MB`, `1GiB`, `1000` (bytes).
pub fn parse_bytes(value: &str) -> Result<u64, String> {
    let (number, unit) =
        number_and_unit(value).ok_or_else(|| format!("{value:?} is not a size like 512MiB"))?;
    let scale: f64 = match unit {
        "" | "B" => 1.0,
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        _ => {
            return Err(format!(
                "{value:?}: the unit must be B, KB, MB, GB, KiB, MiB or GiB"
            ));
        }
    };
    Ok((number * scale) as u64)
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
    fn interpolates_environment_values() {
        let env = |name: &str| (name == "HOST").then(|| "kafka:9092".to_string());
        assert_eq!(interpolate_with("${HOST}", env).unwrap(), "kafka:9092");
        assert_eq!(interpolate_with("a-${NOPE:-b}-$$x", env).unwrap(), "a-b-$x");
        assert!(
            interpolate_with("${NOPE}", env)
                .unwrap_err()
                .contains("NOPE")
        );
        assert!(interpolate_with("${HOST", env).is_err());
        assert_eq!(parse_duration("10s").unwrap().as_millis(), 10_000);
        assert_eq!(parse_duration("250ms").unwrap().as_millis(), 250);
        assert!(parse_duration("10").is_err());
        assert_eq!(parse_bytes("2MiB").unwrap(), 2 * 1024 * 1024);
        assert!(parse_bytes("2 parsecs").is_err());
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
