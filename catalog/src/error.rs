//! The catalog's one error type and its mapping onto the REST spec's error model.
//!
//! Every failure a handler can meet is an [`ApiError`]: an [`ErrorType`] naming the spec's
//! exception (which fixes the HTTP status), a sentence for the client, and whether the outcome
//! of a mutation is unknown. The rule from the spec that shapes everything here: **a definite
//! failure is a 4xx and changed nothing; a 5xx means the outcome may be unknown** (clients then
//! neither clean up nor retry), so only faults after the point of no return map to 5xx.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// The spec's exception names, each with its HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    /// 400: the request is malformed (JSON, unknown requirement or update type, bad identifier).
    BadRequest,
    /// 400: an update could not be applied to the table's metadata.
    Validation,
    /// 401: no or bad credentials.
    NotAuthorized,
    /// 404: the namespace does not exist.
    NoSuchNamespace,
    /// 404: the table does not exist.
    NoSuchTable,
    /// 404: some other resource does not exist (a route, a warehouse).
    NotFound,
    /// 406: the server does not support the operation.
    Unsupported,
    /// 409: the namespace or table already exists.
    AlreadyExists,
    /// 409: a requirement failed or another writer won the compare-and-swap.
    CommitFailed,
    /// 409: the namespace still holds tables or namespaces.
    NamespaceNotEmpty,
    /// 422: the request is well formed but contradicts itself.
    Unprocessable,
    /// 500: the commit may or may not have happened.
    CommitStateUnknown,
    /// 500: an internal fault before any state changed.
    Server,
    /// 503: a backing service (database, object storage) is unavailable.
    ServiceUnavailable,
}

impl ErrorType {
    /// The HTTP status for this exception.
    pub fn status(self) -> StatusCode {
        match self {
            Self::BadRequest | Self::Validation => StatusCode::BAD_REQUEST,
            Self::NotAuthorized => StatusCode::UNAUTHORIZED,
            Self::NoSuchNamespace | Self::NoSuchTable | Self::NotFound => StatusCode::NOT_FOUND,
            Self::Unsupported => StatusCode::NOT_ACCEPTABLE,
            Self::AlreadyExists | Self::CommitFailed | Self::NamespaceNotEmpty => {
                StatusCode::CONFLICT
            }
            Self::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
            Self::CommitStateUnknown | Self::Server => StatusCode::INTERNAL_SERVER_ERROR,
            Self::ServiceUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The exception name clients match on (the Java client tells a missing namespace from a
    /// missing table by this name).
    pub fn name(self) -> &'static str {
        match self {
            Self::BadRequest => "BadRequestException",
            Self::Validation => "ValidationException",
            Self::NotAuthorized => "NotAuthorizedException",
            Self::NoSuchNamespace => "NoSuchNamespaceException",
            Self::NoSuchTable => "NoSuchTableException",
            Self::NotFound => "NotFoundException",
            Self::Unsupported => "UnsupportedOperationException",
            Self::AlreadyExists => "AlreadyExistsException",
            Self::CommitFailed => "CommitFailedException",
            Self::NamespaceNotEmpty => "NamespaceNotEmptyException",
            Self::Unprocessable => "UnprocessableEntityException",
            Self::CommitStateUnknown => "CommitStateUnknownException",
            Self::Server => "ServerError",
            Self::ServiceUnavailable => "ServiceUnavailableException",
        }
    }
}

/// A failed request: what kind, and a sentence saying what went wrong.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// The spec exception this maps to.
    pub kind: ErrorType,
    /// A sentence for the client; never contains secrets.
    pub message: String,
}

/// The result type of every catalog operation.
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorType, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// 400 `BadRequestException`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorType::BadRequest, message)
    }

    /// 404 `NoSuchTableException` for `table`.
    pub fn no_such_table(table: impl std::fmt::Display) -> Self {
        Self::new(
            ErrorType::NoSuchTable,
            format!("table {table} does not exist"),
        )
    }

    /// 404 `NoSuchNamespaceException` for `namespace`.
    pub fn no_such_namespace(namespace: impl std::fmt::Display) -> Self {
        Self::new(
            ErrorType::NoSuchNamespace,
            format!("namespace {namespace} does not exist"),
        )
    }

    /// 409 `CommitFailedException`.
    pub fn commit_failed(message: impl Into<String>) -> Self {
        Self::new(ErrorType::CommitFailed, message)
    }

    /// 500 `ServerError`: a fault of ours or of a backing system before any change.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorType::Server, message)
    }

    /// Whether the error says "nothing happened" (a 4xx), so the response may be remembered
    /// for an idempotency-key replay.
    pub fn is_definite(&self) -> bool {
        self.kind.status().is_client_error()
    }

    /// The JSON body the spec prescribes.
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(ErrorBody {
            error: ErrorModel {
                message: &self.message,
                r#type: self.kind.name(),
                code: self.kind.status().as_u16(),
            },
        })
        .unwrap_or_default()
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorModel<'a>,
}

#[derive(Serialize)]
struct ErrorModel<'a> {
    message: &'a str,
    r#type: &'static str,
    code: u16,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.kind.status(), Json(self.body())).into_response()
    }
}

/// Maps an iceberg error raised while checking requirements or applying updates.
///
/// `TableRequirement::check` reports a failed assertion as `CatalogCommitConflicts` (409) and a
/// missing table as `TableNotFound` (404); everything `TableUpdate::apply` or the metadata
/// builder rejects is the client's fault (400).
impl From<iceberg::Error> for ApiError {
    fn from(error: iceberg::Error) -> Self {
        use iceberg::ErrorKind as K;
        let kind = match error.kind() {
            K::CatalogCommitConflicts => ErrorType::CommitFailed,
            K::TableNotFound => ErrorType::NoSuchTable,
            K::NamespaceNotFound => ErrorType::NoSuchNamespace,
            K::TableAlreadyExists | K::NamespaceAlreadyExists => ErrorType::AlreadyExists,
            K::FeatureUnsupported => ErrorType::Unsupported,
            K::DataInvalid | K::PreconditionFailed => ErrorType::Validation,
            _ => ErrorType::Server,
        };
        Self::new(kind, error.message().to_string())
    }
}
