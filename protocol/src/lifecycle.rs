//! Lifecycle reports from the filter, so the control plane frees predicted load promptly.
//!
//! The filter queues one [`LifecycleEvent`] per milestone of a request and POSTs them in a
//! [`LifecycleBatch`] to [`LIFECYCLE_PATH`] from a timer. Lost reports are tolerated: the
//! control plane also expires predicted load after a timeout.
//!
//! The control plane applies each event once per request id, so a batch sent twice is
//! harmless. A `done` may come before the route call it closes (`failed_open`).

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
        /// The filter sent the request on without a verdict (it failed open) after its route
        /// call went out: the control plane may still route that call, late (it waited in a
        /// stopped control plane's socket), and must not count the request then. Sent when
        /// the request fails open, not when it ends; older control planes ignore the field
        /// and the unknown id.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        failed_open: bool,
        /// With `failed_open`: the route call the request was failed open after
        /// ([`crate::route::ROUTE_CALL_HEADER`]), so that only that call is taken for the late
        /// one, not a new request's under the same `x-request-id`. Absent from older filters.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        route_call: Option<u64>,
    },
    /// An event of a kind this build does not know: a newer filter's milestone. It is read as
    /// this and skipped (the control plane counts it), so that the `done` reports batched
    /// with it still free their requests' load; refusing the whole batch for it, as before,
    /// made the filter drop them all.
    #[serde(other)]
    Unknown,
}

impl LifecycleEvent {
    /// Every [`LifecycleEvent::kind`], for labels known before any event arrives.
    pub const KINDS: [&'static str; 4] = ["first_token", "done", "failed_open", "unknown"];

    /// What the event reports: `first_token`, `done`, `failed_open` (a `done` with the
    /// flag set), or `unknown` (a kind this build does not know).
    pub fn kind(&self) -> &'static str {
        match self {
            LifecycleEvent::FirstToken { .. } => Self::KINDS[0],
            LifecycleEvent::Done {
                failed_open: false, ..
            } => Self::KINDS[1],
            LifecycleEvent::Done {
                failed_open: true, ..
            } => Self::KINDS[2],
            LifecycleEvent::Unknown => Self::KINDS[3],
        }
    }

    /// The request the event is about; `None` for an event of an unknown kind.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            LifecycleEvent::FirstToken { request_id } | LifecycleEvent::Done { request_id, .. } => {
                Some(request_id)
            }
            LifecycleEvent::Unknown => None,
        }
    }

    /// Whether this is a `done` for a request the filter failed open.
    pub fn is_failed_open(&self) -> bool {
        matches!(
            self,
            LifecycleEvent::Done {
                failed_open: true,
                ..
            }
        )
    }

    /// A `done` for a request that completed, without token counts (what a client of the
    /// control plane other than the filter reports, e.g. a bench or a test).
    pub fn completed(request_id: impl Into<String>) -> Self {
        LifecycleEvent::Done {
            request_id: request_id.into(),
            prompt_tokens: None,
            completion_tokens: None,
            ok: true,
            failed_open: false,
            route_call: None,
        }
    }

    /// A `done` for a request the filter failed open after its route call went out.
    pub fn failed_open(request_id: impl Into<String>) -> Self {
        LifecycleEvent::Done {
            request_id: request_id.into(),
            prompt_tokens: None,
            completion_tokens: None,
            ok: false,
            failed_open: true,
            route_call: None,
        }
    }
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

impl LifecycleBatch {
    /// `events` at this protocol version.
    pub fn new(events: Vec<LifecycleEvent>) -> Self {
        LifecycleBatch {
            v: crate::PROTOCOL_VERSION,
            events,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_open_is_sent_only_when_set_and_defaults_to_false() {
        let plain = LifecycleEvent::Done {
            request_id: "r".into(),
            prompt_tokens: None,
            completion_tokens: None,
            ok: false,
            failed_open: false,
            route_call: None,
        };
        let text = serde_json::to_string(&plain).unwrap();
        assert!(!text.contains("failed_open"), "{text}");
        let marked = serde_json::to_string(&LifecycleEvent::failed_open("r")).unwrap();
        assert!(marked.contains(r#""failed_open":true"#), "{marked}");
        // What an older filter sends still parses, as a plain `done`.
        let old = r#"{"event":"done","request_id":"r","ok":false}"#;
        assert_eq!(serde_json::from_str::<LifecycleEvent>(old).unwrap(), plain);
        assert_eq!(
            serde_json::from_str::<LifecycleEvent>(&marked).unwrap(),
            LifecycleEvent::failed_open("r")
        );
    }

    #[test]
    fn a_newer_filters_event_kind_does_not_spoil_its_batch() {
        let batch = r#"{"v":1,"events":[
            {"event":"cancelled","request_id":"r-1","at_ms":5},
            {"event":"done","request_id":"r-2","ok":true,"new_field":[1]}]}"#;
        let batch: LifecycleBatch = serde_json::from_str(batch).unwrap();
        assert_eq!(
            batch.events,
            vec![LifecycleEvent::Unknown, LifecycleEvent::completed("r-2")]
        );
        assert_eq!(batch.events[0].kind(), "unknown");
        assert_eq!(batch.events[0].request_id(), None);
        // A known kind that is malformed is still an error, not an unknown event.
        let broken = r#"{"event":"done","ok":true}"#;
        let error = serde_json::from_str::<LifecycleEvent>(broken).unwrap_err();
        assert!(error.to_string().contains("request_id"), "{error}");
    }

    #[test]
    fn each_event_names_its_kind() {
        let first = LifecycleEvent::FirstToken {
            request_id: "r".into(),
        };
        let kinds = [
            first.kind(),
            LifecycleEvent::completed("r").kind(),
            LifecycleEvent::failed_open("r").kind(),
            LifecycleEvent::Unknown.kind(),
        ];
        assert_eq!(kinds, LifecycleEvent::KINDS);
        assert!(LifecycleEvent::failed_open("r").is_failed_open());
        assert!(!LifecycleEvent::completed("r").is_failed_open());
        assert!(!first.is_failed_open());
    }
}
