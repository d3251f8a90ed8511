//! Command-line flags of `switchyard-control-plane`, each with an environment fallback so the
//! same binary runs from a shell, a container spec or the local stack without wrappers.
//!
//! Parsing is separate from use: [`Settings`] is plain data that `main.rs` fills from the
//! command line and tests fill by hand (see [`Settings::for_tests`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use switchyard_bus::{NatsArgs, RegistrationArgs};

use crate::api::auth::{AdminToken, AdminTokenError};
use crate::config::{ConfigError, RouterConfig, ServingMode};

/// Default largest `POST /v1/route` body. Long agentic prompts (250k tokens of text plus tool
/// schemas) are a few MiB; anything far beyond that is a client error, not a prompt.
pub const DEFAULT_MAX_ROUTE_BODY_BYTES: usize = 16 * 1024 * 1024;

/// A secret taken from the environment; `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Redacted(pub String);

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Everything the control plane is configured with at start.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "switchyard-control-plane",
    version,
    about = "Switchyard control plane: KV-aware routing and conditional disaggregation verdicts for Envoy."
)]
pub struct Settings {
    /// Address of the route API, for Envoy only: route verdicts, lifecycle reports, EDS,
    /// metrics and health. Unauthenticated: expose it to the gateway, not to clients.
    #[arg(long, env = "SWITCHYARD_LISTEN", default_value = "127.0.0.1:8090")]
    pub listen: SocketAddr,

    /// Address of the admin API: the runtime config (`GET`/`PUT /v1/config`) and the worker
    /// list (`GET /v1/workers`), each behind the admin token; metrics and health too. Loopback
    /// by default: bind it elsewhere only on a network operators alone reach.
    #[arg(
        long,
        env = "SWITCHYARD_ADMIN_LISTEN",
        default_value = "127.0.0.1:8091"
    )]
    pub admin_listen: SocketAddr,

    /// File holding the admin API's bearer token (at least 16 characters, trimmed). Or set
    /// `SWITCHYARD_ADMIN_TOKEN` (environment only: a flag's value would show in `ps`).
    /// Without either, the admin endpoints refuse every request.
    #[arg(long, env = "SWITCHYARD_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,

    /// `SWITCHYARD_ADMIN_TOKEN`, read from the environment at parse time.
    #[arg(skip = std::env::var("SWITCHYARD_ADMIN_TOKEN").ok().map(Redacted))]
    pub admin_token_env: Option<Redacted>,

    /// NATS, where the workers publish heartbeats, load reports and KV events, and its
    /// credentials.
    #[command(flatten)]
    pub nats: NatsArgs,

    /// The registration secret workers sign their heartbeats with.
    #[command(flatten)]
    pub registration: RegistrationArgs,

    /// Accept worker heartbeats that are not signed with a registration secret. For
    /// development only: anyone who can publish on NATS can then add a worker to Envoy's
    /// pools and receive client prompts. Without it (and without a secret) the control plane
    /// registers no worker from NATS.
    /// The environment variable takes `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`.
    #[arg(
        long,
        env = "SWITCHYARD_ALLOW_UNSIGNED_REGISTRATIONS",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub allow_unsigned_registrations: bool,

    /// The model's context length in tokens: longer prompts and larger `max_tokens` get a
    /// 400 before any worker sees them. Default: the model directory's `config.json`
    /// (`max_position_embeddings`), else its `tokenizer_config.json` (`model_max_length`),
    /// else 131072.
    #[arg(long, env = "SWITCHYARD_MAX_MODEL_LEN",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_model_len: Option<u32>,

    /// Directory with the served model's `tokenizer.json` and `tokenizer_config.json`
    /// (chat template). Defaults to the workspace's `.cache/models/qwen3` when it exists.
    #[arg(long, env = "SWITCHYARD_MODEL_DIR")]
    pub model_dir: Option<PathBuf>,

    /// A pool file (YAML or JSON) declaring engines that do not register themselves, such as
    /// vLLM workers: their addresses, roles and KV-event sockets (docs/vllm.md). Watched:
    /// changes apply without a restart. Self-registering workers on NATS work beside it.
    #[arg(long, env = "SWITCHYARD_POOL_FILE")]
    pub pool_file: Option<PathBuf>,

    /// How often the pool file is re-read, in milliseconds.
    #[arg(long, env = "SWITCHYARD_POOL_RELOAD_MS", default_value_t = 1_000,
          value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub pool_reload_ms: u64,

    /// Directory with the status page's what-if module (`switchyard_whatif.js` and
    /// `switchyard_whatif_bg.wasm`, written by `scripts/build-whatif.sh`), served at
    /// `/whatif/` on the admin listener. Without it the page says the what-if is unavailable.
    #[arg(long, env = "SWITCHYARD_WHATIF_DIR")]
    pub whatif_dir: Option<PathBuf>,

    /// agg, disagg or conditional.
    #[arg(
        long,
        env = "SWITCHYARD_SERVING_MODE",
        value_enum,
        default_value = "conditional"
    )]
    pub serving_mode: ServingMode,

    /// Conditional-disaggregation policy as JSON, e.g.
    /// `{"policy":"isl_bounding","eff_isl_threshold":2048}`; changeable later with
    /// `PUT /v1/config`.
    #[arg(long, env = "SWITCHYARD_CONDITIONAL_DISAGG_CONFIG")]
    pub conditional_disagg_config: Option<String>,

    /// Heartbeat intervals a worker may miss before it is expired.
    #[arg(long, env = "SWITCHYARD_HEARTBEAT_MISSES", default_value_t = switchyard_protocol::worker::DEFAULT_HEARTBEAT_MISSES,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub heartbeat_misses: u32,

    /// Route requests tokenized at once (each on a blocking thread), so long prompts run in
    /// parallel without starving the async runtime. Per lane: bodies of 64 KiB or more and
    /// smaller ones have a lane each, so long cold prompts never hold up short ones.
    #[arg(long, env = "SWITCHYARD_ROUTE_TOKENIZE_THREADS", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..=256))]
    pub route_tokenize_threads: u32,

    /// Largest accepted `POST /v1/route` body in bytes (larger ones get 413); at least 1 KiB,
    /// so that no ordinary request is refused (and failed open) by a mistyped limit.
    #[arg(long, env = "SWITCHYARD_MAX_ROUTE_BODY_BYTES", default_value_t = DEFAULT_MAX_ROUTE_BODY_BYTES,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1024..))]
    pub max_route_body_bytes: usize,

    /// Seconds in-flight HTTP requests get to finish after SIGTERM / Ctrl-C.
    #[arg(long, env = "SWITCHYARD_SHUTDOWN_GRACE_SECS", default_value_t = 10)]
    pub shutdown_grace_secs: u64,

    /// Milliseconds between SIGTERM / Ctrl-C and no longer accepting requests, during which
    /// `/readyz` says `stopping` and everything is still served: Envoy's health check
    /// (every 0.5 s in the shipped configs) moves route calls to the other replicas first,
    /// where they failed open before. Default: 1000 with `--replica-id`, else 0 (a lone
    /// control plane has no one to hand over to).
    #[arg(long, env = "SWITCHYARD_SHUTDOWN_DELAY_MS",
          value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub shutdown_delay_ms: Option<u64>,

    /// Seed of the router's tie-breaking randomness (same seed and inputs, same verdicts).
    #[arg(long, env = "SWITCHYARD_SEED", default_value_t = 0)]
    pub seed: u64,

    /// Run as one of several control-plane replicas behind the gateway, under this id
    /// (`[A-Za-z0-9_-]`, at most 64 characters, unique per replica): routing decisions and
    /// lifecycle reports are shared with the other replicas over NATS, and the router config
    /// is kept in a NATS KV bucket (JetStream) that one `PUT /v1/config` changes for all.
    /// Without it the control plane runs alone and its config is its own.
    #[arg(long, env = "SWITCHYARD_REPLICA_ID", value_parser = parse_replica_id)]
    pub replica_id: Option<String>,

    /// How long NATS must have been connected before `/readyz` says ready, in milliseconds:
    /// enough to hear every live worker's heartbeat (one interval; 1 s by default) and ask for
    /// its KV dump. Only when workers register over NATS or replicas share state.
    #[arg(long, env = "SWITCHYARD_READY_AFTER_MS", default_value_t = 1_500,
          value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub ready_after_ms: u64,

    /// text or json.
    #[arg(
        long,
        env = "SWITCHYARD_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

fn parse_replica_id(id: &str) -> Result<String, String> {
    if crate::replicas::is_valid_replica_id(id) {
        Ok(id.to_string())
    } else {
        Err("a replica id is 1 to 64 characters of A-Z, a-z, 0-9, '-' and '_'".into())
    }
}

impl Settings {
    /// The router's start-up config: defaults, then `--serving-mode`, then the
    /// `--conditional-disagg-config` JSON as a patch (so a `serving_mode` key in the JSON
    /// wins over the flag).
    ///
    /// # Errors
    /// [`ConfigError`] naming the offending field (`conditional_disagg_config` itself when
    /// the text is not JSON).
    pub fn router_config(&self) -> Result<RouterConfig, ConfigError> {
        let mut config = RouterConfig {
            serving_mode: self.serving_mode,
            ..RouterConfig::default()
        };
        if let Some(text) = &self.conditional_disagg_config {
            let json: serde_json::Value = serde_json::from_str(text).map_err(|e| ConfigError {
                field: "conditional_disagg_config".into(),
                message: format!("not valid JSON: {e}"),
            })?;
            config = config.apply_json_patch(&json)?;
        }
        Ok(config)
    }

    /// The admin token from `--admin-token-file` or `SWITCHYARD_ADMIN_TOKEN`, if either is set.
    ///
    /// # Errors
    /// [`AdminTokenError`] for an unreadable file, a short token, or both sources at once.
    pub fn admin_token(&self) -> Result<Option<AdminToken>, AdminTokenError> {
        AdminToken::load(
            self.admin_token_file.as_deref(),
            self.admin_token_env.as_ref().map(|v| v.0.as_str()),
        )
    }

    /// Defaults as if started with no flags and no environment, for tests that then set
    /// the fields they care about.
    pub fn for_tests() -> Self {
        Settings::parse_from(["switchyard-control-plane"])
    }

    /// How long a worker stays live after a heartbeat that promised `interval_ms`.
    pub fn expires_after_ms(&self, interval_ms: u64) -> u64 {
        interval_ms.saturating_mul(u64::from(self.heartbeat_misses))
    }

    /// Grace period for draining HTTP requests at shutdown.
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_secs)
    }

    /// How long a shutdown serves on as not ready (see `--shutdown-delay-ms`).
    pub fn shutdown_delay(&self) -> Duration {
        let default_ms = if self.replica_id.is_some() { 1_000 } else { 0 };
        Duration::from_millis(self.shutdown_delay_ms.unwrap_or(default_ms))
    }

    /// `--model-dir`, or the workspace's tokenizer directory that `scripts/setup.sh` fills.
    pub fn model_dir_or_default(&self) -> PathBuf {
        self.model_dir.clone().unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../.cache/models/qwen3"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_documented_ones() {
        let s = Settings::try_parse_from(["x"]).expect("defaults parse");
        assert_eq!(s.listen.to_string(), "127.0.0.1:8090");
        assert_eq!(s.admin_listen.to_string(), "127.0.0.1:8091");
        assert_eq!(s.admin_token_file, None);
        assert_eq!(s.nats.nats_url, "nats://127.0.0.1:4222");
        assert!(!s.allow_unsigned_registrations);
        assert_eq!(s.registration.registration_secret_file, None);
        assert_eq!(s.serving_mode, ServingMode::Conditional);
        assert_eq!(s.heartbeat_misses, 3);
        assert_eq!(s.expires_after_ms(1_000), 3_000);
    }

    #[test]
    fn bad_values_are_rejected_with_the_flag_named() {
        let err = Settings::try_parse_from(["x", "--serving-mode", "turbo"]).unwrap_err();
        assert!(err.to_string().contains("--serving-mode"), "{err}");
        let err = Settings::try_parse_from(["x", "--heartbeat-misses", "0"]).unwrap_err();
        assert!(err.to_string().contains("--heartbeat-misses"), "{err}");
        let err = Settings::try_parse_from(["x", "--listen", "not-an-addr"]).unwrap_err();
        assert!(err.to_string().contains("--listen"), "{err}");
        let err = Settings::try_parse_from(["x", "--max-route-body-bytes", "0"]).unwrap_err();
        assert!(err.to_string().contains("--max-route-body-bytes"), "{err}");
        let err = Settings::try_parse_from(["x", "--replica-id", "cp.0"]).unwrap_err();
        assert!(err.to_string().contains("--replica-id"), "{err}");
        let s = Settings::try_parse_from(["x", "--replica-id", "cp-0"]).unwrap();
        assert_eq!(s.replica_id.as_deref(), Some("cp-0"));
    }

    #[test]
    fn router_config_takes_the_flag_then_the_json() {
        let s = Settings::try_parse_from([
            "x",
            "--serving-mode",
            "agg",
            "--conditional-disagg-config",
            r#"{"eff_isl_threshold": 512}"#,
        ])
        .unwrap();
        let c = s.router_config().unwrap();
        assert_eq!(c.serving_mode, ServingMode::Agg);
        assert_eq!(c.conditional.eff_isl_threshold, 512);

        let mut s = Settings::try_parse_from(["x"]).unwrap();
        s.conditional_disagg_config = Some("{not json".into());
        assert_eq!(
            s.router_config().unwrap_err().field,
            "conditional_disagg_config"
        );
        s.conditional_disagg_config = Some(r#"{"eff_isl_ratio_threshold": 3}"#.into());
        assert_eq!(
            s.router_config().unwrap_err().field,
            "eff_isl_ratio_threshold"
        );
        s.conditional_disagg_config = Some(r#"{"bogus": 1}"#.into());
        assert_eq!(s.router_config().unwrap_err().field, "bogus");
    }
}
