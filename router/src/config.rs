//! Runtime configuration of the router: serving mode, conditional-disaggregation policy and
//! thresholds, selection weights, load-expiry timeouts.
//!
//! Config travels as JSON (`GET`/`PUT /v1/config`). The top level holds the serving mode and
//! the conditional-disaggregation fields flat, as docs/policies.md ("Decision logic") names them; selection weights
//! and load timeouts are nested objects:
//!
//! ```json
//! {"serving_mode": "conditional", "policy": "isl_bounding", "eff_isl_threshold": 2048,
//!  "eff_isl_ratio_threshold": 0.7, "prefill_busy_threshold": 0.8,
//!  "prefill_queue_budget_tokens": 32768, "decode_busy_threshold": null,
//!  "selection": {"overlap_weight": 1.0, ...}, "load": {"prefill_timeout_ms": 60000, ...}}
//! ```
//!
//! The types derive serde: defaults come from `Default`, unknown keys are refused (nested
//! objects by `deny_unknown_fields`; the top level, which flattens the conditional fields, by
//! comparing with the keys the default serializes to), and a type error names its field path
//! (`serde_path_to_error`). A partial document is a *patch* over the current config: merged
//! into the current config's JSON (absent fields keep their value; objects merge key by key;
//! `null` resets an optional field, which for `decode_busy_threshold` means "guard off"),
//! then deserialized and range-checked ([`RouterConfig::validate`]). A new setting is one
//! field with its doc, default and, if it has one, its range.

#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use switchyard_policy::config::non_negative;

// The policy's part of the config lives with the policy (the status page's what-if builds it
// for the browser); the router's config embeds it.
pub use switchyard_policy::config::{ConditionalDisaggConfig, ConfigError, PolicyKind};
pub use switchyard_protocol::route::ServingMode;

/// Weights of the worker-selection costs (see [`crate::select`] and `docs/policies.md`).
/// All default to 1.0 except `temperature` (0: always a cheapest worker).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SelectionWeights {
    /// Decode cost credit per cached leading block of the prompt on the worker.
    pub overlap_weight: f64,
    /// Decode cost per potential active KV block (active + the request's).
    pub decode_blocks_weight: f64,
    /// Decode cost per block's worth of queued prefill tokens on the decode worker.
    pub decode_prefill_weight: f64,
    /// Prefill cost per block's worth of queued prefill tokens on the prefill worker.
    pub prefill_queue_weight: f64,
    /// Prefill cost credit per cached leading block on the prefill worker.
    pub prefill_overlap_weight: f64,
    /// Prefill cost per active KV block on the prefill worker.
    pub prefill_blocks_weight: f64,
    /// 0: pick a cheapest worker (ties at random). Above 0: sample with probability
    /// proportional to `exp(-(cost - min_cost) / temperature)`.
    pub temperature: f64,
}

impl Default for SelectionWeights {
    fn default() -> Self {
        SelectionWeights {
            overlap_weight: 1.0,
            decode_blocks_weight: 1.0,
            decode_prefill_weight: 1.0,
            prefill_queue_weight: 1.0,
            prefill_overlap_weight: 1.0,
            prefill_blocks_weight: 1.0,
            temperature: 0.0,
        }
    }
}

/// The largest selection weight (and temperature): a cost multiplies a weight by counts of up
/// to 2^40 blocks, and a weight near `f64::MAX` made costs infinite, where the choice falls
/// back to uniform at random (a huge `overlap_weight` turned cache affinity off). Only ratios
/// between weights matter, so this bounds nothing a user needs.
pub const MAX_SELECTION_WEIGHT: f64 = 1e6;

/// When predicted load is forgotten if lifecycle reports never arrive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoadConfig {
    /// A routed request's prefill tokens are freed after this long without `first_token`.
    /// Default 60 000 ms.
    pub prefill_timeout_ms: u64,
    /// A routed request is forgotten after this long without `done`. Default 600 000 ms.
    pub request_timeout_ms: u64,
    /// A verdict's prompt blocks count as cached on its workers for this long, until their
    /// own KV events tell (`crate::predict`); 0 turns predictions off. Default 30 000 ms:
    /// longer than a long prefill plus the events' trip, short enough that a prediction a
    /// worker never confirms does not steer traffic for long.
    pub kv_prediction_ms: u64,
    /// A worker's load report is taken to leave out requests routed less than this long
    /// before it arrived: they may not have reached the worker when it was sampled
    /// (`crate::load`). Default 0: on a fast network the report nearly always has them
    /// already, and counting them twice until the next report moved a conversation's next
    /// turn off its cached worker (an end-to-end test caught it at 50 ms). Set it to the
    /// gateway-to-worker delay where that is long, and bursts pile onto a worker.
    pub report_grace_ms: u64,
    /// Requests counted on a worker beyond what every one of its reports for this long
    /// showed (running plus waiting) are taken as finished, their `done` lost, and released
    /// (`crate::load`); 0 turns that off. Default 30 000 ms: far past a `done`'s trip, so a
    /// report that crossed one is never taken for a loss.
    pub stale_in_flight_ms: u64,
    /// The decode leg of a disaggregated request is taken to have reached its decode worker
    /// this long after it was routed, even without its `first_token` report: by then the
    /// filter has handed it over or fallen back to a local prefill there (the prefill leg
    /// gives up after the filter's `prefill_timeout_ms` for each of `1 + prefill_retries`
    /// tries). From then on its worker's reports can show it lost (`stale_in_flight_ms`);
    /// before, a disaggregated request whose lifecycle reports were lost stayed counted for
    /// `request_timeout_ms`. 0: never (a virtual run, whose prefill legs never time out and
    /// whose reports are never lost). Default 150 000 ms: the filter's defaults (60 s, one
    /// retry) and a margin; raise it with them.
    pub handoff_timeout_ms: u64,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            prefill_timeout_ms: 60_000,
            request_timeout_ms: 600_000,
            kv_prediction_ms: 30_000,
            report_grace_ms: 0,
            stale_in_flight_ms: 30_000,
            handoff_timeout_ms: 150_000,
        }
    }
}

/// Everything the router can be told at run time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RouterConfig {
    /// Agg, disagg or conditional.
    pub serving_mode: ServingMode,
    /// Policy and thresholds (flat at the JSON top level).
    #[serde(flatten)]
    pub conditional: ConditionalDisaggConfig,
    /// Selection weights (`"selection": {...}`).
    pub selection: SelectionWeights,
    /// Load expiry (`"load": {...}`).
    pub load: LoadConfig,
    /// In `disagg` and `conditional` serving: when no decode worker can take a request (its
    /// KV blocks would exceed a decode worker's capacity, or the decode-busy guard's fraction
    /// of it, on every decode worker), the chosen prefill worker keeps it and decodes it
    /// itself, as a plain aggregated request (`agg:decode_pool_full`), instead of handing it
    /// to a full decode pool where it would queue for KV. Default true; false is the
    /// behaviour before it (the request disaggregates or bypasses onto the full pool).
    pub prefill_continues_decode: bool,
    /// Under `slo_cost`: correct its timing coefficients online from what requests took (the
    /// lifecycle reports' TTFT and time per output token against the configured model's
    /// predictions; `switchyard_policy::learn`), so that a preset that is off still decides
    /// well. Default true; false decides with the configured coefficients as they are.
    pub learn_timing: bool,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            serving_mode: ServingMode::default(),
            conditional: ConditionalDisaggConfig::default(),
            selection: SelectionWeights::default(),
            load: LoadConfig::default(),
            prefill_continues_decode: true,
            learn_timing: true,
        }
    }
}

impl RouterConfig {
    /// A full config from JSON; absent fields take their defaults.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first unknown, mistyped or out-of-range field.
    pub fn from_json(value: &Value) -> Result<Self, ConfigError> {
        RouterConfig::default().apply_json_patch(value)
    }

    /// This config with the fields present in `patch` replaced (merge-patch semantics, see
    /// the module docs). `self` is untouched on error.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first unknown, mistyped or out-of-range field.
    pub fn apply_json_patch(&self, patch: &Value) -> Result<Self, ConfigError> {
        let patch = as_object("", patch)?;
        let mut merged = serde_json::to_value(self)
            .map_err(|e| ConfigError::new("", format!("cannot serialize the config: {e}")))?;
        let Value::Object(current) = &mut merged else {
            return Err(ConfigError::new("", "the config is not a JSON object"));
        };
        // Top-level keys the config knows: those its serialization has (the flattened
        // conditional fields included; optional ones serialize as `null`).
        if let Some(key) = patch.keys().find(|k| !current.contains_key(*k)) {
            let known: Vec<&str> = current.keys().map(String::as_str).collect();
            return Err(ConfigError::new(
                key,
                format!("unknown field; the known ones are {}", known.join(", ")),
            ));
        }
        merge(current, patch);
        // Fields of a flattened struct lose their path in serde's errors, so the flattened
        // conditional fields are read on their own first (the other keys are ignored there).
        typed::<ConditionalDisaggConfig>(merged.clone())?;
        let next: RouterConfig = typed(merged)?;
        next.validate()?;
        Ok(next)
    }

    /// Checks every range.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first out-of-range field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        // The policy's own ranges, which the status page's what-if checks too.
        self.conditional.validate()?;
        let s = &self.selection;
        for (name, w) in [
            ("selection.overlap_weight", s.overlap_weight),
            ("selection.decode_blocks_weight", s.decode_blocks_weight),
            ("selection.decode_prefill_weight", s.decode_prefill_weight),
            ("selection.prefill_queue_weight", s.prefill_queue_weight),
            ("selection.prefill_overlap_weight", s.prefill_overlap_weight),
            ("selection.prefill_blocks_weight", s.prefill_blocks_weight),
            ("selection.temperature", s.temperature),
        ] {
            non_negative(name, w)?;
            if w > MAX_SELECTION_WEIGHT {
                return Err(ConfigError::new(
                    name,
                    format!("must be at most {MAX_SELECTION_WEIGHT:e}, got {w}"),
                ));
            }
        }
        for (name, ms) in [
            ("load.prefill_timeout_ms", self.load.prefill_timeout_ms),
            ("load.request_timeout_ms", self.load.request_timeout_ms),
        ] {
            if ms == 0 {
                return Err(ConfigError::new(name, "must be at least 1"));
            }
        }
        Ok(())
    }
}

fn as_object<'a>(field: &str, v: &'a Value) -> Result<&'a Map<String, Value>, ConfigError> {
    v.as_object()
        .ok_or_else(|| ConfigError::new(field, format!("expected a JSON object, got {v}")))
}

/// Deserializes `value`, naming the field path of a type error.
fn typed<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let field = e.path().to_string();
        let field = if field == "." { String::new() } else { field };
        let message = e.into_inner().to_string();
        ConfigError { field, message }
    })
}

/// Merges `patch` into `into`: objects key by key, everything else replaced (`null` too, so
/// an optional field can be reset).
fn merge(into: &mut Map<String, Value>, patch: &Map<String, Value>) {
    for (key, value) in patch {
        match (into.get_mut(key), value) {
            (Some(Value::Object(inner)), Value::Object(patch)) => merge(inner, patch),
            _ => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}
