//! Lifecycle reports from the filter, so the control plane frees predicted load promptly.
//!
//! The filter queues one [`LifecycleEvent`] per milestone of a request and POSTs them in a
//! [`LifecycleBatch`] to [`LIFECYCLE_PATH`] from a timer. Lost reports are tolerated: the
//! control plane also expires predicted load after a timeout.

use serde::{Deserialize, Serialize};

/// Path on the control plane that takes lifecycle batches.
pub const LIFECYCLE_PATH: &str = "/v1/lifecycle";

/// A milestone of one routed request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum LifecycleEvent {
    /// The first response bytes reached the filter: the prefill is done.
    FirstToken {
        /// Request id of the verdict.
        request_id: String,
    },
    /// The response finished (or the client went away).
    Done {
        /// Request id of the verdict.
        request_id: String,
        /// Prompt tokens, from the response's `usage` when present.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prompt_tokens: Option<u32>,
        /// Generated tokens, from `usage` when present.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        completion_tokens: Option<u32>,
        /// Whether the response completed successfully (2xx and end of stream).
        ok: bool,
    },
}

/// What the filter POSTs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifecycleBatch {
    /// Protocol version.
    #[serde(default = "crate::default_version")]
    pub v: u32,
    /// Events in the order they happened.
    pub events: Vec<LifecycleEvent>,
}
