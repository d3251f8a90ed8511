//! The route request the filter sends and the verdict it gets back.
//!
//! The filter stays thin: it does not parse the request body. It POSTs the client's body
//! verbatim to `POST /v1/route` on the control plane with the headers below, and gets a JSON
//! [`Verdict`]. Keeping the body untouched also keeps its JSON key order, which the chat
//! template renders (see docs/tokenization.md, "Exactness rules for chat templates").

use serde::{Deserialize, Serialize};

use crate::worker::WorkerId;

/// Path of the route call on the control plane.
pub const ROUTE_PATH: &str = "/v1/route";
/// Header naming which OpenAI API the body is for: one of [`ApiKind::as_str`].
pub const API_HEADER: &str = "x-switchyard-api";
/// Request id shared by the route call, both legs and lifecycle reports.
pub const REQUEST_ID_HEADER: &str = "x-request-id";
/// Header the filter sets for Envoy's `override_host` load-balancing policy.
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// Response header telling the client how its request was routed (`bypass`, `disagg`, `agg`,
/// or `fail-open;reason=...`).
pub const ROUTE_HEADER: &str = "x-switchyard-route";
/// Annotation on bypassed requests (the name NVIDIA Dynamo's backends use).
pub const BYPASS_HEADER: &str = "x-bypass-remote-prefill";
/// Header on a route answer that refuses the client's request (a 4xx whose body is the
/// OpenAI error for the client): the filter answers the client with that status and body as
/// they are. Its value is a [`RejectReason`].
pub const REJECT_HEADER: &str = "x-switchyard-reject";

/// Why the control plane refused a client's request before any worker saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// A field the engine would refuse (type, range, `stream_options` without `stream`), or a
    /// body that is not a request of its API.
    InvalidRequest,
    /// The prompt is longer than the model's context.
    PromptTooLong,
    /// The body names a model the gateway does not serve.
    UnknownModel,
}

impl RejectReason {
    /// Every reason, in a fixed order (the filter keeps one counter each).
    pub const ALL: [RejectReason; 3] = [
        RejectReason::InvalidRequest,
        RejectReason::PromptTooLong,
        RejectReason::UnknownModel,
    ];

    /// Wire name: the [`REJECT_HEADER`] value and a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::InvalidRequest => "invalid_request",
            RejectReason::PromptTooLong => "prompt_too_long",
            RejectReason::UnknownModel => "unknown_model",
        }
    }

    /// Parses the wire name.
    pub fn parse(s: &str) -> Option<RejectReason> {
        RejectReason::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// Which OpenAI API a request body is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApiKind {
    /// `POST /v1/chat/completions` (`messages`).
    Chat,
    /// `POST /v1/completions` (`prompt`).
    Completions,
}

impl ApiKind {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ApiKind::Chat => "chat",
            ApiKind::Completions => "completions",
        }
    }

    /// The API a request path belongs to, if it is one Switchyard routes.
    pub fn from_path(path: &str) -> Option<ApiKind> {
        // Ignore the query string; Envoy passes `:path` with it.
        let path = path.split('?').next().unwrap_or(path);
        match path {
            "/v1/chat/completions" => Some(ApiKind::Chat),
            "/v1/completions" => Some(ApiKind::Completions),
            _ => None,
        }
    }

    /// Parses the wire name.
    pub fn parse(s: &str) -> Option<ApiKind> {
        match s {
            "chat" => Some(ApiKind::Chat),
            "completions" => Some(ApiKind::Completions),
            _ => None,
        }
    }
}

/// How a request is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteMode {
    /// Straight to the decode worker, which prefills locally (conditional decision).
    Bypass,
    /// Prefill on the prefill worker, KV handed over, then decode on the decode worker.
    Disagg,
    /// Aggregated serving: straight to a worker, no prefill pool involved.
    Agg,
}

impl RouteMode {
    /// Wire name, also the `x-switchyard-route` header value and a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteMode::Bypass => "bypass",
            RouteMode::Disagg => "disagg",
            RouteMode::Agg => "agg",
        }
    }
}

/// How requests are served: the control plane's `--serving-mode` (clap names, the same as
/// the JSON's) and `PUT /v1/config`, and the mode a comparison run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum ServingMode {
    /// No prefill pool: every request goes to a decode (or agg) worker, which prefills.
    Agg,
    /// Every request is prefilled on a prefill worker, then decoded.
    Disagg,
    /// The policy decides per request (bypass or disaggregate).
    #[default]
    Conditional,
}

impl ServingMode {
    /// Lower-case name, as on the command line, in JSON and in metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ServingMode::Agg => "agg",
            ServingMode::Disagg => "disagg",
            ServingMode::Conditional => "conditional",
        }
    }
}

/// A worker chosen for one leg of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// Worker name.
    pub worker_id: WorkerId,
    /// `host:port`, the value for [`DESTINATION_HEADER`].
    pub address: String,
}

/// The control plane's answer to a route request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// Protocol version.
    #[serde(default = "crate::default_version")]
    pub v: u32,
    /// Echo of the request id.
    pub request_id: String,
    /// How to serve it.
    pub mode: RouteMode,
    /// The worker that decodes (and, unless `mode` is `disagg`, prefills).
    pub decode: Endpoint,
    /// The prefill worker, present iff `mode` is `disagg`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill: Option<Endpoint>,
    /// Prompt length in tokens.
    pub isl: u32,
    /// Prompt tokens already cached on the decode worker (longest cached prefix).
    pub cached_tokens: u32,
    /// `isl - min(cached_tokens, isl)`: what the decode worker would have to prefill.
    pub eff_isl: u32,
    /// Why, as `<mode>:<rule>` (e.g. `bypass:isl_bounding`, `disagg:decode_busy`); also a
    /// metric label.
    pub reason: String,
}

/// Error body of the control plane's API (4xx/5xx), so callers can act on `code`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiError {
    /// Stable machine-readable code, e.g. `invalid_json`, `no_workers`, `invalid_config`.
    pub code: String,
    /// Human-readable explanation naming the offending field or value.
    pub message: String,
}
