//! Validated namespace and table names, and their encodings on the wire and in the store.
//!
//! Names reach storage paths (`{warehouse}/{ns…}/{table}-…`) and SQL rows, so every part is
//! checked once, here, before anything else sees it: not empty, at most 255 bytes, no `/`,
//! `\`, control characters or `..`, and namespace parts without `.` (the JDBC layout stores a
//! namespace dot-joined, so a dot inside a part would be ambiguous). Parsing is the only way to
//! build these types, so the rest of the crate never handles an unchecked name.

use std::fmt;

use crate::error::{ApiError, ApiResult};

/// The separator of namespace parts in a URL path segment: the unit separator, `%1F`.
pub const URL_SEPARATOR: char = '\u{1f}';

const MAX_PART_LEN: usize = 255;

/// A validated namespace: one or more parts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Namespace(Vec<String>);

/// A validated table identifier.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    /// The namespace holding the table.
    pub namespace: Namespace,
    /// The table's own name.
    pub name: String,
}

fn check_part(part: &str, what: &str, allow_dot: bool) -> ApiResult<()> {
    let problem = if part.is_empty() {
        Some("is empty")
    } else if part.len() > MAX_PART_LEN {
        Some("is longer than 255 bytes")
    } else if part.contains('/') || part.contains('\\') {
        Some("contains a path separator")
    } else if part.chars().any(char::is_control) {
        Some("contains a control character")
    } else if part.contains("..") || part == "." {
        Some("contains `..`")
    } else if !allow_dot && part.contains('.') {
        Some("contains `.`, which is ambiguous in a stored namespace")
    } else {
        None
    };
    match problem {
        Some(problem) => Err(ApiError::bad_request(format!(
            "invalid {what} {part:?}: it {problem}"
        ))),
        None => Ok(()),
    }
}

impl Namespace {
    /// Builds a namespace from its parts, validating each.
    pub fn from_parts(parts: Vec<String>) -> ApiResult<Self> {
        if parts.is_empty() {
            return Err(ApiError::bad_request("a namespace needs at least one part"));
        }
        for part in &parts {
            check_part(part, "namespace part", false)?;
        }
        Ok(Self(parts))
    }

    /// Parses a URL path segment (already percent-decoded): parts joined by `%1F`.
    pub fn from_url(segment: &str) -> ApiResult<Self> {
        Self::from_parts(segment.split(URL_SEPARATOR).map(str::to_string).collect())
    }

    /// Parses the dot-joined form kept in the store.
    pub fn from_stored(stored: &str) -> ApiResult<Self> {
        Self::from_parts(stored.split('.').map(str::to_string).collect())
    }

    /// The dot-joined form kept in the store (JDBC-catalog compatible).
    pub fn stored(&self) -> String {
        self.0.join(".")
    }

    /// The parts, outermost first.
    pub fn parts(&self) -> &[String] {
        &self.0
    }

    /// Whether `self` is a direct child of `parent` (`None` = the root).
    pub fn is_child_of(&self, parent: Option<&Namespace>) -> bool {
        match parent {
            None => self.0.len() == 1,
            Some(parent) => self.0.len() == parent.0.len() + 1 && self.0.starts_with(&parent.0),
        }
    }

    /// Whether `self` is `other` or lies inside it.
    pub fn is_within(&self, other: &Namespace) -> bool {
        self.0.starts_with(&other.0)
    }

    /// The namespace's relative storage path: its parts joined by `/`.
    pub fn path(&self) -> String {
        self.0.join("/")
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.stored())
    }
}

impl TableName {
    /// Builds a table identifier, validating the name.
    pub fn new(namespace: Namespace, name: String) -> ApiResult<Self> {
        check_part(&name, "table name", true)?;
        Ok(Self { namespace, name })
    }

    /// Builds a table identifier from the wire form `{namespace: [...], name}`.
    pub fn from_ident(ident: &iceberg::TableIdent) -> ApiResult<Self> {
        let namespace = Namespace::from_parts(ident.namespace.clone().inner())?;
        Self::new(namespace, ident.name.clone())
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn accepts_ordinary_nested_names() {
        let ns = Namespace::from_url("analytics\u{1f}otel").unwrap();
        assert_eq!(ns.parts(), &parts(&["analytics", "otel"])[..]);
        assert_eq!(ns.stored(), "analytics.otel");
        assert_eq!(Namespace::from_stored("analytics.otel").unwrap(), ns);
        assert_eq!(ns.path(), "analytics/otel");
        let t = TableName::new(ns.clone(), "spans.v2".into()).unwrap();
        assert_eq!(t.to_string(), "analytics.otel.spans.v2");
    }

    #[test]
    fn rejects_names_that_could_escape_the_warehouse() {
        for bad in ["", "..", "a/b", "a\\b", "x\u{0}y", "tab\tname", "a..b", "."] {
            assert!(
                TableName::new(Namespace::from_url("ns").unwrap(), bad.into()).is_err(),
                "table name {bad:?} accepted"
            );
            assert!(
                Namespace::from_parts(parts(&["ok", bad])).is_err(),
                "namespace part {bad:?} accepted"
            );
        }
        assert!(Namespace::from_parts(vec![]).is_err());
        assert!(
            Namespace::from_url("a.b").is_err(),
            "dots are ambiguous in stored namespaces"
        );
        assert!(TableName::new(Namespace::from_url("ns").unwrap(), "x".repeat(256)).is_err());
    }

    #[test]
    fn child_and_within_relations() {
        let a = Namespace::from_url("a").unwrap();
        let ab = Namespace::from_url("a\u{1f}b").unwrap();
        let abc = Namespace::from_url("a\u{1f}b\u{1f}c").unwrap();
        assert!(a.is_child_of(None));
        assert!(!ab.is_child_of(None));
        assert!(ab.is_child_of(Some(&a)));
        assert!(!abc.is_child_of(Some(&a)));
        assert!(abc.is_within(&a));
        assert!(!a.is_within(&ab));
    }
}
