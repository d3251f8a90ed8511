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

/// Validated filter configuration, shared by all request contexts of a VM.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Envoy cluster that reaches the control plane (must exist in the bootstrap).
    pub control_plane_cluster: String,
    /// `:authority` header of route calls.
    pub control_plane_authority: String,
    /// Timeout of one route call in milliseconds; on expiry the request fails open.
    pub route_timeout_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            control_plane_cluster: DEFAULT_CONTROL_PLANE_CLUSTER.to_string(),
            control_plane_authority: DEFAULT_CONTROL_PLANE_AUTHORITY.to_string(),
            route_timeout_ms: DEFAULT_ROUTE_TIMEOUT_MS,
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
        let config: Config =
            serde_json::from_slice(raw).map_err(|e| ConfigError::InvalidJson(e.to_string()))?;
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
        if self.route_timeout_ms == 0 || self.route_timeout_ms > MAX_ROUTE_TIMEOUT_MS {
            return Err(ConfigError::InvalidValue {
                key: "route_timeout_ms",
                reason: format!(
                    "{} is outside 1..={MAX_ROUTE_TIMEOUT_MS}",
                    self.route_timeout_ms
                ),
            });
        }
        Ok(())
    }

    /// The route call timeout as a [`Duration`].
    pub fn route_timeout(&self) -> Duration {
        Duration::from_millis(self.route_timeout_ms)
    }
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
    fn keys_override_defaults() {
        let config = Config::parse(Some(
            br#"{"control_plane_cluster":"cp","route_timeout_ms":50}"#,
        ))
        .expect("valid");
        assert_eq!(config.control_plane_cluster, "cp");
        assert_eq!(config.route_timeout(), Duration::from_millis(50));
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
    }
}
