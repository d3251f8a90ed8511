//! The route request the filter sends and the verdict it gets back.
//!
//! By default the filter stays thin: it does not parse the request body. It POSTs the client's
//! body verbatim to `POST /v1/route` on the control plane with the headers below, and gets a
//! JSON [`Verdict`]. (With `tokenize: filter` it sends a hashed prompt instead:
//! [`crate::route_input`].) Keeping the body untouched also keeps its JSON key order, which the chat
//! template renders (see docs/tokenization.md, "Exactness rules for chat templates").

use serde::{Deserialize, Serialize};

use crate::worker::{Engine, WorkerId};

/// Path of the route call on the control plane.
pub const ROUTE_PATH: &str = "/v1/route";
/// Header naming which OpenAI API the body is for: one of [`ApiKind::as_str`].
pub const API_HEADER: &str = "x-switchyard-api";
/// Request id shared by the route call, both legs and lifecycle reports.
pub const REQUEST_ID_HEADER: &str = "x-request-id";
/// Header of a route call naming the call itself: a number the filter makes per call, which
/// its `failed_open` report repeats, so that the control plane tells the late call of a
/// failed-open request from a new request that reuses the client's `x-request-id`.
pub const ROUTE_CALL_HEADER: &str = "x-switchyard-route-call";
/// Longest request id anyone keeps: the filter replaces a longer client id with its own, and
/// the control plane refuses one, so a client cannot blow up headers, logs or metric labels.
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// Whether `id` is a request id the gateway forwards and the control plane accepts: 1 to
/// [`MAX_REQUEST_ID_LEN`] visible ASCII characters (no spaces or controls: it is a header value
/// and a log field).
pub fn is_usable_request_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_REQUEST_ID_LEN && id.bytes().all(|b| b.is_ascii_graphic())
}
/// Header the filter sets on a request it fails open, naming the body's `model`, so that an
/// Envoy route matching it sends the request to that model's decode cluster
/// ([`model_cluster`]) rather than to any model's worker. Clients cannot set it: the filter
/// strips every `x-switchyard-` header they send.
pub const MODEL_HEADER: &str = "x-switchyard-model";
/// Longest `model` the filter copies into [`MODEL_HEADER`].
pub const MAX_MODEL_HEADER_LEN: usize = 256;
/// Envoy cluster of every decode (and agg) worker, whatever its model, as EDS serves it.
pub const DECODE_CLUSTER: &str = "switchyard_decode";
/// Envoy cluster of every prefill worker, whatever its model.
pub const PREFILL_CLUSTER: &str = "switchyard_prefill";

/// The Envoy cluster of `model`'s workers in `cluster` (one of [`DECODE_CLUSTER`],
/// [`PREFILL_CLUSTER`]): `<cluster>__<model>` with every character but ASCII letters, digits,
/// `-` and `_` written `_` (`Qwen/Qwen3-0.6B` → `switchyard_decode__Qwen_Qwen3-0_6B`), so the
/// name is safe in Envoy's stat names and YAML. Two models whose names map to the same
/// cluster are refused by the control plane's pool file.
pub fn model_cluster(cluster: &str, model: &str) -> String {
    let slug: String = model
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{cluster}__{slug}")
}

/// Whether `model` can be copied into [`MODEL_HEADER`] as it is: 1 to
/// [`MAX_MODEL_HEADER_LEN`] printable ASCII characters (spaces allowed inside, as in a header
/// value; no controls, nothing a header could not carry), and no `"` or `\`: a worker's model
/// is also a Prometheus label value, which the exposition writes unescaped (a quote or a
/// line break there would forge series). No model name on a hub has them.
pub fn is_header_safe_model(model: &str) -> bool {
    !model.is_empty()
        && model.len() <= MAX_MODEL_HEADER_LEN
        && model
            .bytes()
            .all(|b| (b == b' ' || b.is_ascii_graphic()) && b != b'"' && b != b'\\')
        && !model.starts_with(' ')
        && !model.ends_with(' ')
}

/// Header the filter sets for Envoy's `override_host` load-balancing policy.
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// Response header telling the client how its request was routed (`bypass`, `disagg`, `agg`,
/// or `fail-open;reason=...`).
pub const ROUTE_HEADER: &str = "x-switchyard-route";
/// Header the filter sets on a request whose verdict names a prefill worker as the worker that
/// serves it ([`Verdict::decode_on_prefill`]), with the value [`POOL_PREFILL`]: the gateway's
/// route matching it sends the request to the prefill cluster, where the override-host policy
/// finds that worker (the decode cluster does not hold it). Clients cannot set it: the filter
/// strips every `x-switchyard-` header they send.
pub const POOL_HEADER: &str = "x-switchyard-pool";
/// The [`POOL_HEADER`] value naming the prefill pool.
pub const POOL_PREFILL: &str = "prefill";
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

    /// Why a prompt of `prompt_tokens` that the context check refused
    /// (`crate::openai::check_prompt_length`) is refused: an empty prompt is a malformed
    /// request, not a long one.
    pub fn of_refused_prompt(prompt_tokens: usize) -> RejectReason {
        if prompt_tokens == 0 {
            RejectReason::InvalidRequest
        } else {
            RejectReason::PromptTooLong
        }
    }

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

/// Why a verdict is what it is: `<mode>:<rule>` on the wire (`bypass:isl_bounding`), and a
/// metric label. The one list of reasons: the control plane pre-registers every label from
/// [`Reason::ALL`], and the replay reports them as the control plane does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// Bypassed: the uncached prompt is short (`isl_bounding`).
    BypassIslBounding,
    /// Bypassed: the prefill worker is busy (`prefill_load`).
    BypassPrefillBusy,
    /// Bypassed: `slo_cost` predicts a TTFT no worse than disagg's and a decode stall within
    /// the running streams' ITL budget.
    BypassSloCost,
    /// Bypassed: `slo_cost` predicts disaggregation would miss the TTFT objective, and the
    /// stall fits the running streams' budget times the learned rescue factor.
    BypassSloCostRescue,
    /// Bypassed: the client asked for several choices (`n > 1`), which handoffs cannot carry.
    BypassMultipleChoices,
    /// Bypassed: the client asked for prompt logprobs, for which vLLM reads no cached prefix
    /// (neither its own nor one handed over), so a prefill worker's work would be done twice.
    BypassPromptLogprobs,
    /// Disaggregated: `eff_isl >= eff_isl_threshold`.
    DisaggEffIslAboveThreshold,
    /// Disaggregated: `eff_isl / isl >= eff_isl_ratio_threshold`.
    DisaggEffIslRatioAboveThreshold,
    /// Disaggregated: the prefill worker is not busy (`prefill_load`).
    DisaggPrefillNotBusy,
    /// Disaggregated: `slo_cost` predicts a lower TTFT through the prefill worker.
    DisaggSloCostTtft,
    /// Disaggregated: `slo_cost` predicts a bypass's prefill stall would break the decode
    /// worker's running streams' ITL budget.
    DisaggSloCostItlStall,
    /// Disaggregated: a bypass would push the decode worker past its KV budget.
    DisaggDecodeBusy,
    /// Disaggregated: the decode worker reports no KV capacity (decode-busy guard on).
    DisaggDecodeCapacityUnknown,
    /// Disaggregated: `disagg` serving mode.
    DisaggAlways,
    /// Aggregated: `agg` serving mode.
    AggServingMode,
    /// Aggregated: disagg or conditional mode, but no live prefill worker.
    AggNoPrefillWorkers,
    /// Aggregated: disagg or conditional mode, but no decode worker can take the request (KV
    /// capacity, or the decode-busy guard's fraction of it), so the chosen prefill worker
    /// keeps it and decodes it itself, as a plain aggregated request.
    AggDecodePoolFull,
    /// Aggregated: disagg or conditional mode, but no decode worker is live at all (the pool
    /// is down), so a prefill worker serves the request whole rather than no one.
    AggNoDecodeWorkers,
    /// A reason this build does not know (from a newer control plane): read, never written.
    Unknown,
}

impl Reason {
    /// Every reason a verdict can carry, in a fixed order.
    pub const ALL: [Reason; 18] = [
        Reason::BypassIslBounding,
        Reason::BypassPrefillBusy,
        Reason::BypassSloCost,
        Reason::BypassSloCostRescue,
        Reason::BypassMultipleChoices,
        Reason::BypassPromptLogprobs,
        Reason::DisaggEffIslAboveThreshold,
        Reason::DisaggEffIslRatioAboveThreshold,
        Reason::DisaggPrefillNotBusy,
        Reason::DisaggSloCostTtft,
        Reason::DisaggSloCostItlStall,
        Reason::DisaggDecodeBusy,
        Reason::DisaggDecodeCapacityUnknown,
        Reason::DisaggAlways,
        Reason::AggServingMode,
        Reason::AggNoPrefillWorkers,
        Reason::AggDecodePoolFull,
        Reason::AggNoDecodeWorkers,
    ];

    /// The wire name and metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::BypassIslBounding => "bypass:isl_bounding",
            Reason::BypassPrefillBusy => "bypass:prefill_busy",
            Reason::BypassSloCost => "bypass:slo_cost",
            Reason::BypassSloCostRescue => "bypass:slo_cost_rescue",
            Reason::BypassMultipleChoices => "bypass:multiple_choices",
            Reason::BypassPromptLogprobs => "bypass:prompt_logprobs",
            Reason::DisaggEffIslAboveThreshold => "disagg:eff_isl_above_threshold",
            Reason::DisaggEffIslRatioAboveThreshold => "disagg:eff_isl_ratio_above_threshold",
            Reason::DisaggPrefillNotBusy => "disagg:prefill_not_busy",
            Reason::DisaggSloCostTtft => "disagg:slo_cost_ttft",
            Reason::DisaggSloCostItlStall => "disagg:slo_cost_itl_stall",
            Reason::DisaggDecodeBusy => "disagg:decode_busy",
            Reason::DisaggDecodeCapacityUnknown => "disagg:decode_capacity_unknown",
            Reason::DisaggAlways => "disagg:always",
            Reason::AggServingMode => "agg:serving_mode",
            Reason::AggNoPrefillWorkers => "agg:no_prefill_workers",
            Reason::AggDecodePoolFull => "agg:decode_pool_full",
            Reason::AggNoDecodeWorkers => "agg:no_decode_workers",
            Reason::Unknown => "unknown",
        }
    }

    /// The reason with wire name `s` ([`Reason::Unknown`] for any other string).
    pub fn parse(s: &str) -> Reason {
        Reason::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .unwrap_or(Reason::Unknown)
    }

    /// The mode the reason leads to (its wire name's prefix).
    pub fn mode(self) -> Option<RouteMode> {
        match self.as_str().split(':').next() {
            Some("bypass") => Some(RouteMode::Bypass),
            Some("disagg") => Some(RouteMode::Disagg),
            Some("agg") => Some(RouteMode::Agg),
            _ => None,
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Reason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Reason {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Ok(Reason::parse(&text))
    }
}

/// A worker chosen for one leg of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// Worker name.
    pub worker_id: WorkerId,
    /// `host:port`, the value for [`DESTINATION_HEADER`].
    pub address: String,
    /// Port of the worker's SGLang bootstrap server (an SGLang prefill worker): the legs'
    /// `bootstrap_port`, with the host of `address` as `bootstrap_host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_port: Option<u16>,
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
    /// Why (`bypass:isl_bounding`, `disagg:decode_busy`, ...); also a metric label.
    pub reason: Reason,
    /// The worker in `decode` is a prefill worker (mode `agg`, reason `agg:decode_pool_full`):
    /// no decode worker could take the request, so the prefill worker prefills and decodes it.
    /// The filter sends it to the prefill cluster ([`POOL_HEADER`]). Absent (false) otherwise,
    /// and in verdicts from before it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub decode_on_prefill: bool,
    /// The engine of the workers named, and so the handoff the filter runs for `disagg`
    /// ([`Engine::handoff`]). Absent (vLLM) in verdicts from before other engines.
    #[serde(default, skip_serializing_if = "Engine::is_vllm")]
    pub engine: Engine,
    /// The route call's body was a JSON object naming none of the keys only the gateway may
    /// set ([`crate::openai::CLIENT_STEERING_KEYS`]), as the control plane found when it
    /// parsed it, so the filter passes the body on without screening it itself. Absent
    /// (false) when the route input was a hashed prompt, and in verdicts from before it: the
    /// filter screens the body.
    #[serde(default, skip_serializing_if = "is_false")]
    pub steering_free: bool,
    /// A `disagg` verdict's legs carry a `disaggregated_params.disagg_request_id` the filter
    /// draws per request ([`crate::handoff::disagg_request_id`]): the model's TensorRT-LLM
    /// servers move KV with the Python transceiver, which needs one (the pool file's
    /// `trtllm_disagg_request_id`). Absent (false) otherwise: a TensorRT-LLM 1.0 server
    /// refuses the field.
    #[serde(default, skip_serializing_if = "is_false")]
    pub disagg_request_id: bool,
    /// The pool file's model the request was routed within (absent on a gateway without
    /// declared models): the filter names it in [`MODEL_HEADER`], so that Envoy's retries and
    /// fallbacks, when the named worker is gone, stay among that model's workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// [`ApiError::code`] of the control plane's 503 when it knows no live decode (or agg) worker.
pub const NO_WORKERS: &str = "no_workers";

/// Error body of the control plane's API (4xx/5xx), so callers can act on `code`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiError {
    /// Stable machine-readable code, e.g. `invalid_json`, `no_workers`, `invalid_config`.
    pub code: String,
    /// Human-readable explanation naming the offending field or value.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reasons table users read (`docs/policies.md`, "Reasons") lists every reason a
    /// verdict can carry.
    #[test]
    fn the_policies_doc_lists_every_reason() {
        let doc = include_str!("../../docs/policies.md");
        let table = &doc[doc.find("## Reasons").expect("a Reasons section")..];
        for r in Reason::ALL {
            assert!(
                table.contains(&format!("| `{}` |", r.as_str())),
                "docs/policies.md's Reasons table does not list {}",
                r.as_str()
            );
        }
    }

    #[test]
    fn reasons_round_trip_and_name_their_mode() {
        for r in Reason::ALL {
            assert_eq!(Reason::parse(r.as_str()), r);
            assert_eq!(
                r.mode().map(RouteMode::as_str),
                r.as_str().split(':').next()
            );
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<Reason>(&json).unwrap(), r);
        }
        assert_eq!(Reason::parse("bypass:something_new"), Reason::Unknown);
        assert_eq!(
            model_cluster(DECODE_CLUSTER, "Qwen/Qwen3-0.6B"),
            "switchyard_decode__Qwen_Qwen3-0_6B"
        );
        assert_eq!(model_cluster(PREFILL_CLUSTER, "a"), "switchyard_prefill__a");
        assert!(is_header_safe_model("Qwen/Qwen3 0.6B"));
        for bad in ["", " a", "a\n", "a\u{7f}", "é", "a\"b", "a\\b"] {
            assert!(!is_header_safe_model(bad), "{bad:?}");
        }
        assert!(!is_header_safe_model(&"m".repeat(MAX_MODEL_HEADER_LEN + 1)));
        assert_eq!(
            serde_json::from_str::<Reason>("\"x\"").unwrap(),
            Reason::Unknown
        );
    }
}
