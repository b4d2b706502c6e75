//! `floe-lake`'s one error type: what went wrong, whose fault it is, and whether a retry can
//! help — above all, whether a commit's outcome is **unknown**.

use std::fmt;

/// What kind of failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Another writer changed the table (409); reload, revalidate and retry.
    Conflict,
    /// The commit may or may not have happened (5xx, timeout, connection lost after sending);
    /// reload and look for the commit's marker before retrying.
    CommitStateUnknown,
    /// The table or namespace does not exist.
    NotFound,
    /// The catalog refused the request as invalid (4xx other than 404/409): our fault or the
    /// user's; retrying the same request cannot help.
    Rejected,
    /// The catalog or the storage could not be reached, and nothing was changed.
    Unavailable,
    /// Input or table state that this crate cannot handle.
    Invalid,
    /// Another writer of the same job committed positions this writer was working on (it lost
    /// them in a rebalance it did not notice); its uncommitted work must be dropped.
    Fenced,
}

/// An error of `floe-lake`.
#[derive(Debug)]
pub struct LakeError {
    kind: ErrorKind,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// The result type of this crate.
pub type LakeResult<T> = Result<T, LakeError>;

impl LakeError {
    /// An error of `kind` with a sentence saying what happened.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// The kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the cause.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether retrying (after a reload) may succeed.
    pub fn retryable(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Conflict | ErrorKind::Unavailable | ErrorKind::CommitStateUnknown
        )
    }
}

impl fmt::Display for LakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl std::error::Error for LakeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<iceberg::Error> for LakeError {
    /// Iceberg errors raised while reading or writing files are storage faults; the rest are
    /// invalid input or state.
    fn from(error: iceberg::Error) -> Self {
        let kind = match error.kind() {
            iceberg::ErrorKind::Unexpected => ErrorKind::Unavailable,
            iceberg::ErrorKind::TableNotFound | iceberg::ErrorKind::NamespaceNotFound => {
                ErrorKind::NotFound
            }
            iceberg::ErrorKind::CatalogCommitConflicts => ErrorKind::Conflict,
            _ => ErrorKind::Invalid,
        };
        Self::new(kind, error.message().to_string()).with_source(error)
    }
}
