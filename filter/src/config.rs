//! The filter's configuration: the JSON in the Envoy wasm filter's `configuration` field.
//!
//! Every key is optional; an empty configuration means all defaults. Unknown keys are
//! rejected, so a typo in the Envoy config fails loudly at load time instead of silently
//! routing with a default.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

/// Default Envoy cluster name of the control plane.
pub const DEFAULT_CONTROL_PLANE_CLUSTER: &str = "switchyard_control_plane";
/// Default `:authority` of route calls (the control plane ignores it; Envoy requires one).
pub const DEFAULT_CONTROL_PLANE_AUTHORITY: &str = "switchyard-control-plane";
/// Default budget of one route call. The control plane answers in well under a millisecond
/// on a warm index; 200 ms leaves room for a GC pause or a slow tokenization of a huge prompt
/// while keeping the worst-case added latency of a dead control plane bounded.
pub const DEFAULT_ROUTE_TIMEOUT_MS: u64 = 200;
/// Upper bound for `route_timeout_ms`: a route call is on every request's critical path.
pub const MAX_ROUTE_TIMEOUT_MS: u64 = 60_000;
/// Default extra route budget per MiB of body. A cold prompt's tokenization grows with its
/// length (about 160 ms per MiB on an idle 2-core machine, several times that on a busy one),
/// and failing open a long prompt costs far more than waiting: it loses the KV affinity that
/// would save re-prefilling it, seconds of GPU time for 250k tokens. A second per MiB is small
/// against the prefill such a prompt needs anyway.
pub const DEFAULT_ROUTE_TIMEOUT_MS_PER_MIB: u64 = 1_000;
/// Default Envoy cluster of the prefill workers.
pub const DEFAULT_PREFILL_CLUSTER: &str = "switchyard_prefill";
/// Default budget of one prefill-leg attempt. A cold 128k-token prefill queued behind others
/// takes seconds on real hardware; a minute bounds a hung prefill worker's cost (the request
/// then falls back to local prefill) without cutting legitimate long prefills.
pub const DEFAULT_PREFILL_TIMEOUT_MS: u64 = 60_000;
/// Upper bound for `prefill_timeout_ms`.
pub const MAX_PREFILL_TIMEOUT_MS: u64 = 600_000;
/// Default retries of a prefill leg that got 502/503/504 (vLLM's proxies retry once).
pub const DEFAULT_PREFILL_RETRIES: u32 = 1;
/// Upper bound for `prefill_retries`: each retry is on the request's critical path.
pub const MAX_PREFILL_RETRIES: u32 = 5;
/// Default largest request body the filter accepts (16 MiB: a 250k-token agentic context is
/// about 1 MB of text, a JSON-escaped one with tool schemas a few MB). Envoy's
/// `per_connection_buffer_limit_bytes` must be at least this, or Envoy answers 413 first.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 16 << 20;
/// Upper bound for `max_body_bytes` (what the control plane takes by default is 16 MiB too;
/// anything near this is a configuration mistake).
pub const MAX_MAX_BODY_BYTES: u64 = 256 << 20;
/// Default lifecycle flush period: the control plane frees predicted load at most this late.
pub const DEFAULT_LIFECYCLE_FLUSH_MS: u64 = 100;
/// Default bound of the per-VM lifecycle queue; beyond it new events are dropped and counted.
pub const DEFAULT_LIFECYCLE_QUEUE_MAX: usize = 8192;
/// Default events per lifecycle POST.
pub const DEFAULT_LIFECYCLE_BATCH_MAX: usize = 512;
/// Default budget of one lifecycle POST.
pub const DEFAULT_LIFECYCLE_TIMEOUT_MS: u64 = 1_000;

/// Who turns a prompt into block hashes (`tokenize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenizeMode {
    /// The filter sends the body; the control plane tokenizes on its own cores. The default:
    /// docs/performance.md, "Tokenizing in the filter", has the measurements behind it.
    #[default]
    ControlPlane,
    /// The filter tokenizes in its VM (on the Envoy worker thread) and sends block hashes,
    /// ISL and the non-prompt fields; until a model's tokenizer is loaded, the body.
    Filter,
}

impl TokenizeMode {
    /// The config value.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenizeMode::ControlPlane => "control_plane",
            TokenizeMode::Filter => "filter",
        }
    }
}

/// Validated filter configuration, shared by all request contexts of a VM.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Envoy cluster that reaches the control plane (must exist in the bootstrap).
    pub control_plane_cluster: String,
    /// `:authority` header of route calls.
    pub control_plane_authority: String,
    /// Timeout of one route call in milliseconds, for an empty body; on expiry the request
    /// fails open.
    #[serde(deserialize_with = "whole_number")]
    pub route_timeout_ms: u64,
    /// Extra route call budget per MiB of request body, in milliseconds (0: none); the total
    /// is capped at `MAX_ROUTE_TIMEOUT_MS`.
    #[serde(deserialize_with = "whole_number")]
    pub route_timeout_ms_per_mib: u64,
    /// Envoy cluster of the prefill workers (the prefill leg of `disagg` verdicts).
    pub prefill_cluster: String,
    /// Timeout of one prefill-leg attempt in milliseconds.
    #[serde(deserialize_with = "whole_number")]
    pub prefill_timeout_ms: u64,
    /// Retries of a prefill leg answered 502/503/504 (0..=5).
    #[serde(deserialize_with = "whole_number")]
    pub prefill_retries: u32,
    /// Whether the bootstrap defines a prefill cluster per model
    /// (`<prefill_cluster>__<model>`, as the control plane's EDS serves them): retries then
    /// go to the request's model's cluster instead of the shared one, which holds every
    /// model's prefill workers.
    pub prefill_model_clusters: bool,
    /// Largest request body in bytes; larger ones get 413 from the filter.
    #[serde(deserialize_with = "whole_number")]
    pub max_body_bytes: u64,
    /// Whether to report first-token/done to the control plane (`POST /v1/lifecycle`).
    pub lifecycle_reports: bool,
    /// Lifecycle flush period in milliseconds (the VM's tick period).
    #[serde(deserialize_with = "whole_number")]
    pub lifecycle_flush_ms: u64,
    /// Most lifecycle events queued per VM; more are dropped and counted.
    #[serde(deserialize_with = "whole_number")]
    pub lifecycle_queue_max: usize,
    /// Most events per lifecycle POST.
    #[serde(deserialize_with = "whole_number")]
    pub lifecycle_batch_max: usize,
    /// Timeout of one lifecycle POST in milliseconds.
    #[serde(deserialize_with = "whole_number")]
    pub lifecycle_timeout_ms: u64,
    /// Who tokenizes prompts: `control_plane` (default) or `filter`.
    pub tokenize: TokenizeMode,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            control_plane_cluster: DEFAULT_CONTROL_PLANE_CLUSTER.to_string(),
            control_plane_authority: DEFAULT_CONTROL_PLANE_AUTHORITY.to_string(),
            route_timeout_ms: DEFAULT_ROUTE_TIMEOUT_MS,
            route_timeout_ms_per_mib: DEFAULT_ROUTE_TIMEOUT_MS_PER_MIB,
            prefill_cluster: DEFAULT_PREFILL_CLUSTER.to_string(),
            prefill_timeout_ms: DEFAULT_PREFILL_TIMEOUT_MS,
            prefill_retries: DEFAULT_PREFILL_RETRIES,
            prefill_model_clusters: false,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            lifecycle_reports: true,
            lifecycle_flush_ms: DEFAULT_LIFECYCLE_FLUSH_MS,
            lifecycle_queue_max: DEFAULT_LIFECYCLE_QUEUE_MAX,
            lifecycle_batch_max: DEFAULT_LIFECYCLE_BATCH_MAX,
            lifecycle_timeout_ms: DEFAULT_LIFECYCLE_TIMEOUT_MS,
            tokenize: TokenizeMode::ControlPlane,
        }
    }
}

impl Config {
    /// Parses and validates the plugin configuration. `None` or blank bytes mean defaults.
    ///
    /// # Errors
    /// [`ConfigError`] naming the offending key or the JSON problem.
    pub fn parse(raw: Option<&[u8]>) -> Result<Config, ConfigError> {
        let raw = match raw {
            Some(bytes) if !bytes.iter().all(u8::is_ascii_whitespace) => bytes,
            _ => return Ok(Config::default()),
        };
        // The path names the key a type error is about: serde_json alone gives a column of
        // JSON that Istio or a launcher generated, not the key the user wrote.
        let config: Config =
            serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(raw))
                .map_err(|e| match e.path().to_string() {
                    path if path == "." => ConfigError::InvalidJson(e.inner().to_string()),
                    path => ConfigError::InvalidJson(format!("`{path}`: {}", e.inner())),
                })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks value ranges serde cannot express.
    ///
    /// # Errors
    /// [`ConfigError::InvalidValue`] for the first bad key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.control_plane_cluster.trim().is_empty() {
            return Err(ConfigError::InvalidValue {
                key: "control_plane_cluster",
                reason: "must name an Envoy cluster".to_string(),
            });
        }
        if self.control_plane_authority.trim().is_empty() {
            return Err(ConfigError::InvalidValue {
                key: "control_plane_authority",
                reason: "must not be empty".to_string(),
            });
        }
        if self.prefill_cluster.trim().is_empty() {
            return Err(ConfigError::InvalidValue {
                key: "prefill_cluster",
                reason: "must name an Envoy cluster".to_string(),
            });
        }
        let ranges: [(&'static str, u64, u64, u64); 9] = [
            (
                "route_timeout_ms",
                self.route_timeout_ms,
                1,
                MAX_ROUTE_TIMEOUT_MS,
            ),
            (
                "route_timeout_ms_per_mib",
                self.route_timeout_ms_per_mib,
                0,
                MAX_ROUTE_TIMEOUT_MS,
            ),
            (
                "prefill_timeout_ms",
                self.prefill_timeout_ms,
                1,
                MAX_PREFILL_TIMEOUT_MS,
            ),
            (
                "prefill_retries",
                self.prefill_retries.into(),
                0,
                MAX_PREFILL_RETRIES.into(),
            ),
            ("max_body_bytes", self.max_body_bytes, 1, MAX_MAX_BODY_BYTES),
            ("lifecycle_flush_ms", self.lifecycle_flush_ms, 10, 60_000),
            (
                "lifecycle_queue_max",
                self.lifecycle_queue_max as u64,
                1,
                1 << 20,
            ),
            (
                "lifecycle_batch_max",
                self.lifecycle_batch_max as u64,
                1,
                1 << 16,
            ),
            ("lifecycle_timeout_ms", self.lifecycle_timeout_ms, 1, 60_000),
        ];
        for (key, value, min, max) in ranges {
            if value < min || value > max {
                return Err(ConfigError::InvalidValue {
                    key,
                    reason: format!("{value} is outside {min}..={max}"),
                });
            }
        }
        Ok(())
    }

    /// One prefill-leg attempt's timeout as a [`Duration`].
    pub fn prefill_timeout(&self) -> Duration {
        Duration::from_millis(self.prefill_timeout_ms)
    }

    /// The lifecycle flush period as a [`Duration`].
    pub fn lifecycle_flush(&self) -> Duration {
        Duration::from_millis(self.lifecycle_flush_ms)
    }

    /// One lifecycle POST's timeout as a [`Duration`].
    pub fn lifecycle_timeout(&self) -> Duration {
        Duration::from_millis(self.lifecycle_timeout_ms)
    }

    /// The route call timeout for a body of `body_bytes`: `route_timeout_ms` plus
    /// `route_timeout_ms_per_mib` pro rata, at most [`MAX_ROUTE_TIMEOUT_MS`].
    pub fn route_timeout(&self, body_bytes: usize) -> Duration {
        let extra = ((u128::from(self.route_timeout_ms_per_mib) * body_bytes as u128) >> 20) as u64;
        Duration::from_millis(
            self.route_timeout_ms
                .saturating_add(extra)
                .min(MAX_ROUTE_TIMEOUT_MS),
        )
    }
}

/// An integer key's value, also when written as a whole float (`200.0`): a WasmPlugin's
/// `pluginConfig` is a protobuf Struct, whose numbers are doubles, and Istio may hand them on
/// so. A fraction, a negative number or one beyond the key's type is refused.
fn whole_number<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<u64>,
{
    use serde::de::Error;
    let number = serde_json::Number::deserialize(deserializer)?;
    // 2^53: above it a double no longer holds every whole number.
    let whole = number.as_u64().or_else(|| {
        number
            .as_f64()
            .filter(|f| f.fract() == 0.0 && (0.0..=9_007_199_254_740_992.0).contains(f))
            .map(|f| f as u64)
    });
    let value = whole
        .ok_or_else(|| D::Error::custom(format!("must be a whole number >= 0, got {number}")))?;
    T::try_from(value).map_err(|_| D::Error::custom(format!("{value} is too large")))
}

/// Why a configuration was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// Not JSON, wrong types, or an unknown key (serde's message names it).
    InvalidJson(String),
    /// A key's value is out of range.
    InvalidValue {
        /// The key.
        key: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::InvalidJson(e) => write!(f, "invalid filter configuration JSON: {e}"),
            ConfigError::InvalidValue { key, reason } => {
                write!(f, "invalid filter configuration: `{key}` {reason}")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_or_blank_configuration_means_defaults() {
        assert_eq!(Config::parse(None), Ok(Config::default()));
        assert_eq!(Config::parse(Some(b"  \n")), Ok(Config::default()));
        assert_eq!(Config::parse(Some(b"{}")), Ok(Config::default()));
    }

    #[test]
    fn the_route_budget_grows_with_the_body_up_to_the_cap() {
        let config = Config::parse(Some(
            br#"{"route_timeout_ms":1000,"route_timeout_ms_per_mib":2000}"#,
        ))
        .unwrap();
        assert_eq!(config.route_timeout(0), Duration::from_millis(1000));
        assert_eq!(config.route_timeout(1 << 20), Duration::from_millis(3000));
        assert_eq!(
            config.route_timeout(usize::MAX),
            Duration::from_millis(MAX_ROUTE_TIMEOUT_MS)
        );
        let flat = Config::parse(Some(br#"{"route_timeout_ms_per_mib":0}"#)).unwrap();
        assert_eq!(flat.route_timeout(16 << 20), flat.route_timeout(0));
        assert!(Config::parse(Some(br#"{"route_timeout_ms_per_mib":60001}"#)).is_err());
    }

    #[test]
    fn tokenize_names_who_tokenizes_and_defaults_to_the_control_plane() {
        assert_eq!(Config::default().tokenize, TokenizeMode::ControlPlane);
        let filter = Config::parse(Some(br#"{"tokenize":"filter"}"#)).unwrap();
        assert_eq!(filter.tokenize, TokenizeMode::Filter);
        assert_eq!(filter.tokenize.as_str(), "filter");
        let typo = Config::parse(Some(br#"{"tokenize":"envoy"}"#)).unwrap_err();
        let message = typo.to_string();
        assert!(
            message.contains("envoy") && message.contains("control_plane"),
            "{message}"
        );
    }

    #[test]
    fn keys_override_defaults() {
        let config = Config::parse(Some(
            br#"{"control_plane_cluster":"cp","route_timeout_ms":50}"#,
        ))
        .expect("valid");
        assert_eq!(config.control_plane_cluster, "cp");
        assert_eq!(config.route_timeout(0), Duration::from_millis(50));
        // The default per-MiB budget: half a MiB adds half a second.
        assert_eq!(config.route_timeout(512 << 10), Duration::from_millis(550));
        assert_eq!(
            config.control_plane_authority,
            DEFAULT_CONTROL_PLANE_AUTHORITY
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_rejected_with_the_key_named() {
        let typo = Config::parse(Some(br#"{"route_timeout":50}"#)).unwrap_err();
        assert!(typo.to_string().contains("route_timeout"), "{typo}");

        let zero = Config::parse(Some(br#"{"route_timeout_ms":0}"#)).unwrap_err();
        assert!(matches!(
            zero,
            ConfigError::InvalidValue {
                key: "route_timeout_ms",
                ..
            }
        ));

        let empty = Config::parse(Some(br#"{"control_plane_cluster":" "}"#)).unwrap_err();
        assert!(matches!(
            empty,
            ConfigError::InvalidValue {
                key: "control_plane_cluster",
                ..
            }
        ));

        assert!(matches!(
            Config::parse(Some(b"[1")),
            Err(ConfigError::InvalidJson(_))
        ));
        assert!(Config::parse(Some(br#"{"route_timeout_ms":-1}"#)).is_err());
        // A whole float is a whole number (Istio's WasmPlugin passes numbers as doubles); a
        // type error names its key.
        let doubles = Config::parse(Some(br#"{"route_timeout_ms":200.0,"prefill_retries":2.0}"#));
        assert_eq!(
            doubles.map(|c| (c.route_timeout_ms, c.prefill_retries)),
            Ok((200, 2))
        );
        for (bad, named) in [
            (
                &br#"{"route_timeout_ms":200.5}"#[..],
                "`route_timeout_ms`: must be a whole number",
            ),
            (
                br#"{"prefill_retries":5000000000}"#,
                "`prefill_retries`: 5000000000 is too large",
            ),
            (
                br#"{"lifecycle_reports":"yes"}"#,
                "`lifecycle_reports`: invalid type",
            ),
        ] {
            let err = Config::parse(Some(bad)).unwrap_err().to_string();
            assert!(err.contains(named), "{err}");
        }
        for bad in [
            &br#"{"prefill_retries":6}"#[..],
            br#"{"prefill_timeout_ms":0}"#,
            br#"{"max_body_bytes":0}"#,
            br#"{"lifecycle_flush_ms":1}"#,
            br#"{"lifecycle_batch_max":0}"#,
            br#"{"prefill_cluster":""}"#,
        ] {
            let err = Config::parse(Some(bad)).unwrap_err();
            let key = std::str::from_utf8(bad).unwrap().split('"').nth(1).unwrap();
            assert!(err.to_string().contains(key), "{err}");
        }
    }

    #[test]
    fn disaggregation_and_lifecycle_keys_parse() {
        let config = Config::parse(Some(
            br#"{"prefill_cluster":"pf","prefill_retries":0,"max_body_bytes":1024,"lifecycle_reports":false}"#,
        ))
        .expect("valid");
        assert_eq!(config.prefill_cluster, "pf");
        assert_eq!(config.prefill_retries, 0);
        assert_eq!(config.max_body_bytes, 1024);
        assert!(!config.lifecycle_reports);
        assert_eq!(
            config.prefill_timeout(),
            Duration::from_millis(DEFAULT_PREFILL_TIMEOUT_MS)
        );
    }
}
