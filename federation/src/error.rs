//! Errors of decoding and validating wire messages, and the error body sent back to senders.

use serde::{Deserialize, Serialize};

/// Why a message was refused. None of these is retryable: the same bytes will fail the same way.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WireError {
    /// Not JSON, or JSON of the wrong shape.
    /// (What came from the message is escaped, so a newline in it cannot forge a line of a log.)
    #[error("malformed message at `{}`: {}", path.escape_debug(), message.escape_debug())]
    Malformed { path: String, message: String },
    /// Well-formed, but a field's value is not acceptable.
    #[error("invalid `{}`: {}", field.escape_debug(), problem.escape_debug())]
    Invalid { field: String, problem: String },
    /// A field the message type does not have (in what people write; between components they are ignored).
    #[error("unknown field `{}`", path.escape_debug())]
    UnknownField { path: String },
    #[error("message is {size} bytes; the limit is {limit}")]
    TooLarge { size: usize, limit: usize },
    #[error("message nests {depth} levels deep; the limit is {limit}")]
    TooDeep { depth: usize, limit: usize },
    #[error("message holds a string of {length} bytes; the limit is {limit}")]
    TooLong { length: usize, limit: usize },
    #[error("message has wire version {found}; this build speaks {supported}")]
    UnsupportedVersion { found: u32, supported: u32 },
    #[error("could not encode message: {0}")]
    Encode(String),
}

impl WireError {
    pub fn invalid(field: impl Into<String>, problem: impl Into<String>) -> Self {
        WireError::Invalid {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// The field the error is about, if one is known.
    pub fn field(&self) -> Option<&str> {
        match self {
            WireError::Malformed { path, .. } if path != "." => Some(path),
            WireError::Invalid { field, .. } => Some(field),
            WireError::UnknownField { path } => Some(path),
            _ => None,
        }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            WireError::Malformed { .. } => ErrorCode::Malformed,
            WireError::Invalid { .. } => ErrorCode::Invalid,
            WireError::UnknownField { .. } => ErrorCode::Invalid,
            WireError::TooLarge { .. } => ErrorCode::TooLarge,
            WireError::TooDeep { .. } => ErrorCode::Malformed,
            WireError::TooLong { .. } => ErrorCode::TooLarge,
            WireError::UnsupportedVersion { .. } => ErrorCode::UnsupportedVersion,
            WireError::Encode(_) => ErrorCode::Internal,
        }
    }

    pub fn to_body(&self) -> ErrorBody {
        ErrorBody::new(
            self.code(),
            self.field().map(str::to_owned),
            self.to_string(),
        )
    }
}

/// Machine-readable class of an error reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    Malformed,
    Invalid,
    TooLarge,
    UnsupportedVersion,
    NotFound,
    Conflict,
    /// The tenant's budget would be exceeded.
    OverBudget,
    /// The caller's token lacks a permission the call needs (the message names it).
    Forbidden,
    /// No token, or one that is unknown, expired or revoked.
    Unauthenticated,
    /// Too many calls from this tenant or site: slow down (`retry_after_ms` says for how long).
    RateLimited,
    /// The path exists, but not with this HTTP method.
    MethodNotAllowed,
    Unavailable,
    Internal,
}

impl ErrorCode {
    /// The HTTP status that goes with this code.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::Malformed | ErrorCode::Invalid | ErrorCode::UnsupportedVersion => 400,
            ErrorCode::TooLarge => 413,
            ErrorCode::NotFound => 404,
            ErrorCode::Conflict => 409,
            ErrorCode::OverBudget => 402,
            ErrorCode::Forbidden => 403,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::RateLimited => 429,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::Unavailable => 503,
            ErrorCode::Internal => 500,
        }
    }
}

/// The body of an error reply, on NATS and HTTP alike.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: ErrorCode,
    /// The field the error is about, as a path such as `resources.count`.
    #[serde(default)]
    pub field: Option<String>,
    pub message: String,
    /// With `rate_limited`: when to try again, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, field: Option<String>, message: impl Into<String>) -> Self {
        Self {
            code,
            field,
            message: message.into(),
            retry_after_ms: None,
        }
    }
}

impl std::fmt::Display for ErrorBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}
