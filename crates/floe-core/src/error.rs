//! The one error of sources, formats and readers: what failed, whose fault it is, and whether
//! trying again can help.
//!
//! * [`Fault::User`] — the job file or the data it points at is wrong (a missing table, a
//!   refused type, a topic without keys): fix the input; retrying cannot help;
//! * [`Fault::External`] — a system outside Floe failed (a broker, a database, the network):
//!   usually retryable;
//! * [`Fault::Internal`] — Floe broke its own contract: a bug to report.
//!
//! `Display` is the message with its context (`postgres: table public.t: …`) and the cause.

use std::fmt;

/// Whose fault a failure is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The configuration, or the data or system it names, is wrong: fix the input.
    User,
    /// An external system failed or refused.
    External,
    /// Floe broke its own contract.
    Internal,
}

/// A failure of a source, a format or a reader.
#[derive(Debug)]
pub struct SourceError {
    fault: Fault,
    retryable: bool,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// The result type of sources.
pub type SourceResult<T> = Result<T, SourceError>;

impl SourceError {
    /// The input is wrong (never retryable).
    pub fn user(message: impl Into<String>) -> Self {
        Self::new(Fault::User, false, message)
    }

    /// An external system failed; trying again may help.
    pub fn external(message: impl Into<String>) -> Self {
        Self::new(Fault::External, true, message)
    }

    /// Floe broke its own contract (never retryable).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Fault::Internal, false, message)
    }

    fn new(fault: Fault, retryable: bool, message: impl Into<String>) -> Self {
        Self {
            fault,
            retryable,
            message: message.into(),
            source: None,
        }
    }

    /// The same error, but trying again cannot help (e.g. a server that refused on purpose).
    pub fn permanent(mut self) -> Self {
        self.retryable = false;
        self
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// Puts `context` in front of the message (`"postgres"` → `postgres: …`).
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }

    /// Whose fault it is.
    pub fn fault(&self) -> Fault {
        self.fault
    }

    /// Whether trying again may succeed.
    pub fn retryable(&self) -> bool {
        self.retryable
    }

    /// The message, without the cause.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SourceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_and_cause_read_as_one_sentence() {
        let e = SourceError::external("cannot connect")
            .with_source(std::io::Error::other("refused"))
            .context("postgres");
        assert_eq!(e.to_string(), "postgres: cannot connect: refused");
        assert_eq!(e.fault(), Fault::External);
        assert!(e.retryable());
        assert!(!e.permanent().retryable());
        assert!(!SourceError::user("bad").retryable());
    }
}
