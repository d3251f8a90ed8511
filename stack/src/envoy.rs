//! Envoy's side of the stack: rendering the bootstrap and reading the admin `/clusters` page.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::StackError;

/// The bootstrap template (`envoy/bootstrap.template.yaml`), compiled in so the launcher
/// works from any directory.
pub const BOOTSTRAP_TEMPLATE: &str = include_str!("../../envoy/bootstrap.template.yaml");

/// Envoy cluster of decode (and agg) workers, as the control plane's EDS names it.
pub const DECODE_CLUSTER: &str = "switchyard_decode";
/// Envoy cluster of prefill workers.
pub const PREFILL_CLUSTER: &str = "switchyard_prefill";

/// What the template needs.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvoySettings {
    /// Client-facing listener port on 127.0.0.1.
    pub listen_port: u16,
    /// Admin port on 127.0.0.1.
    pub admin_port: u16,
    /// The control plane's port on 127.0.0.1 (route API and EDS).
    pub control_plane_port: u16,
    /// The filter's `.wasm`.
    pub wasm_path: PathBuf,
    /// Route call timeout handed to the filter.
    pub route_timeout_ms: u64,
    /// Largest request/response Envoy buffers per connection (bodies above get 413).
    pub buffer_limit_bytes: u64,
    /// How often Envoy polls the control plane's EDS.
    pub eds_refresh: Duration,
}

impl EnvoySettings {
    /// The filter's JSON configuration.
    pub fn filter_config(&self) -> String {
        serde_json::json!({
            "control_plane_cluster": "switchyard_control_plane",
            "route_timeout_ms": self.route_timeout_ms,
        })
        .to_string()
    }
}

/// Fills the template in.
///
/// # Errors
/// [`StackError::InvalidSetting`] if the wasm path cannot be written into the YAML, or a
/// placeholder is left unfilled (the template and this function disagree).
pub fn render_bootstrap(settings: &EnvoySettings) -> Result<String, StackError> {
    let wasm = settings.wasm_path.to_string_lossy();
    if wasm.contains(['"', '\\', '\n']) {
        return Err(StackError::InvalidSetting(format!(
            "wasm path {wasm:?} has quote/escape characters"
        )));
    }
    let refresh_ms = settings.eds_refresh.as_millis().max(1);
    // The filter config sits in a single-quoted YAML scalar: double any single quote.
    let filter_config = settings.filter_config().replace('\'', "''");
    let rendered = BOOTSTRAP_TEMPLATE
        .replace("${LISTEN_PORT}", &settings.listen_port.to_string())
        .replace("${ADMIN_PORT}", &settings.admin_port.to_string())
        .replace(
            "${CONTROL_PLANE_PORT}",
            &settings.control_plane_port.to_string(),
        )
        .replace("${WASM_PATH}", &wasm)
        .replace("${FILTER_CONFIG}", &filter_config)
        .replace("${BUFFER_LIMIT}", &settings.buffer_limit_bytes.to_string())
        .replace(
            "${EDS_REFRESH}",
            &format!("{}s", refresh_ms as f64 / 1000.0),
        );
    let body_lines = rendered
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'));
    if let Some(line) = body_lines.into_iter().find(|l| l.contains("${")) {
        return Err(StackError::InvalidSetting(format!(
            "unfilled placeholder in: {}",
            line.trim()
        )));
    }
    Ok(rendered)
}

/// The `host:port` of every healthy host of `cluster` on Envoy's admin `/clusters` text page
/// (lines like `switchyard_decode::127.0.0.1:8001::health_flags::healthy`).
pub fn healthy_hosts(clusters_page: &str, cluster: &str) -> Vec<String> {
    let mut hosts: Vec<String> = clusters_page
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(cluster)?.strip_prefix("::")?;
            let (host, flags) = rest.split_once("::health_flags::")?;
            (flags.trim() == "healthy").then(|| host.to_string())
        })
        .collect();
    hosts.sort();
    hosts.dedup();
    hosts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> EnvoySettings {
        EnvoySettings {
            listen_port: 10000,
            admin_port: 9901,
            control_plane_port: 8080,
            wasm_path: PathBuf::from("/tmp/switchyard_filter.wasm"),
            route_timeout_ms: 150,
            buffer_limit_bytes: 16 << 20,
            eds_refresh: Duration::from_millis(500),
        }
    }

    #[test]
    fn rendering_fills_every_placeholder() {
        let yaml = render_bootstrap(&settings()).expect("renders");
        assert!(yaml.contains("port_value: 10000"));
        assert!(yaml.contains("port_value: 9901"));
        assert!(yaml.contains("port_value: 8080"));
        assert!(yaml.contains("refresh_delay: 0.5s"));
        assert!(yaml.contains(r#"value: '{"control_plane_cluster":"switchyard_control_plane","route_timeout_ms":150}'"#));
        assert!(yaml.contains("filename: \"/tmp/switchyard_filter.wasm\""));
        assert!(yaml.contains("allow_on_headers_stop_iteration: true"));
    }

    #[test]
    fn a_path_that_would_break_the_yaml_is_refused() {
        let mut bad = settings();
        bad.wasm_path = PathBuf::from("/tmp/a\"b.wasm");
        assert!(matches!(
            render_bootstrap(&bad),
            Err(StackError::InvalidSetting(_))
        ));
    }

    #[test]
    fn healthy_hosts_are_read_per_cluster() {
        let page = "\
switchyard_decode::127.0.0.1:8001::cx_active::0
switchyard_decode::127.0.0.1:8001::health_flags::healthy
switchyard_decode::127.0.0.1:8002::health_flags::/failed_eds_health
switchyard_decode_x::127.0.0.1:8009::health_flags::healthy
switchyard_prefill::127.0.0.1:8003::health_flags::healthy
";
        assert_eq!(healthy_hosts(page, DECODE_CLUSTER), vec!["127.0.0.1:8001"]);
        assert_eq!(healthy_hosts(page, PREFILL_CLUSTER), vec!["127.0.0.1:8003"]);
        assert!(healthy_hosts(page, "switchyard_control_plane").is_empty());
    }
}
