//! Errors of the simulated worker: HTTP errors in OpenAI's JSON shape, and start-up errors.

use serde_json::{json, Value};
use switchyard_protocol::openai::InvalidRequest;

/// An error answered to an HTTP client, in the shape vLLM's OpenAI server uses:
/// `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} ({status}): {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// OpenAI error type (`BadRequestError`, `NotFoundError`, ...).
    pub kind: &'static str,
    /// What went wrong, for humans.
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<String>,
}

impl From<InvalidRequest> for ApiError {
    fn from(e: InvalidRequest) -> Self {
        ApiError {
            status: e.kind.status(),
            kind: e.kind.type_name(),
            message: e.message,
            param: e.param,
        }
    }
}

impl ApiError {
    /// 400 `BadRequestError`.
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError {
            status: 400,
            kind: "BadRequestError",
            message: message.into(),
            param: param.map(str::to_owned),
        }
    }

    /// 404 `NotFoundError`.
    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError {
            status: 404,
            kind: "NotFoundError",
            message: message.into(),
            param: None,
        }
    }

    /// 405 `MethodNotAllowedError`.
    pub fn method_not_allowed() -> Self {
        ApiError {
            status: 405,
            kind: "MethodNotAllowedError",
            message: "method not allowed".into(),
            param: None,
        }
    }

    /// 503 `ServiceUnavailableError`: the worker is shutting down.
    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError {
            status: 503,
            kind: "ServiceUnavailableError",
            message: message.into(),
            param: None,
        }
    }

    /// 413: the body is larger than `limit` bytes.
    pub fn payload_too_large(limit: u64) -> Self {
        ApiError {
            status: 413,
            kind: "BadRequestError",
            message: format!("request body exceeds {limit} bytes"),
            param: None,
        }
    }

    /// 500 `InternalServerError`: our fault, not the request's.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: 500,
            kind: "InternalServerError",
            message: message.into(),
            param: None,
        }
    }

    /// The JSON body.
    pub fn to_json(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status,
            }
        })
    }
}

/// Why a worker could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is inconsistent (bad id, zero block size, ...).
    #[error("invalid worker configuration: {0}")]
    InvalidConfig(String),
    /// The HTTP port could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The tokenizer could not be loaded.
    #[error("cannot load the tokenizer: {0}")]
    Tokenizer(String),
    /// A ZMQ socket of the vLLM wire could not be bound.
    #[error("cannot bind the ZMQ socket at {endpoint}: {source}")]
    Zmq {
        /// The endpoint asked for.
        endpoint: String,
        /// The ZMQ error.
        source: zeromq::ZmqError,
    },
}
