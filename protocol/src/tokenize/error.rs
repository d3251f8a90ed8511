//! Errors of prompt tokenization, split by who is at fault so callers can map them to HTTP.

use std::path::PathBuf;

/// Why a prompt could not be turned into token ids.
///
/// [`TokenizeError::InvalidRequest`] is the client's fault (answer 400 and count it); every other
/// variant is a server-side problem (a broken model directory or template, or a tokenizer
/// failure) that the caller should fail open on.
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    /// The request body is malformed for its API: a missing or ill-typed field, or a chat the
    /// template itself rejects (`raise_exception`). `field` names the offending JSON field.
    #[error("invalid request: `{field}`: {message}")]
    InvalidRequest {
        /// JSON path of the offending field, e.g. `messages[2].content`.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// The model directory is missing a file or holds one that cannot be parsed.
    #[error("model directory {}: {message}", path.display())]
    ModelDir {
        /// The file or directory at fault.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The chat template failed to compile or to render for a reason that is not the request's.
    #[error("chat template: {0}")]
    Template(String),
    /// The HF tokenizer failed to encode or decode.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

impl TokenizeError {
    /// Shorthand for an [`TokenizeError::InvalidRequest`].
    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        TokenizeError::InvalidRequest {
            field: field.into(),
            message: message.into(),
        }
    }

    /// True when the request body is at fault (HTTP 400), false for server-side failures.
    pub fn is_client_error(&self) -> bool {
        matches!(self, TokenizeError::InvalidRequest { .. })
    }
}
