//! Envoy's side of the stack: rendering the bootstrap and reading the admin `/clusters` page.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::StackError;

/// The bootstrap template (`envoy/bootstrap.template.yaml`), compiled in so the launcher
/// works from any directory.
pub const BOOTSTRAP_TEMPLATE: &str = include_str!("../../envoy/bootstrap.template.yaml");

pub use switchyard_protocol::route::{model_cluster, DECODE_CLUSTER, PREFILL_CLUSTER};
use switchyard_protocol::route::{MODEL_HEADER, POOL_HEADER, POOL_PREFILL};

/// The template's comment line where extra listeners go.
const EXTRA_LISTENERS_MARKER: &str = "    # switchyard:extra-listeners\n";

/// The template's comment line where each model's routes go (before the shared ones: Envoy
/// takes the first route that matches).
const MODEL_ROUTES_MARKER: &str = "                        # switchyard:model-routes\n";
/// The template's comment line where further control-plane replicas' endpoints go.
const REPLICAS_MARKER: &str = "              # switchyard:control-plane-replicas\n";

/// An endpoint of the control-plane cluster for each further replica.
fn replica_endpoints(ports: &[u16]) -> String {
    ports
        .iter()
        .map(|port| {
            format!(
                "              - endpoint:\n                  address:\n                    socket_address: {{ address: 127.0.0.1, port_value: {port} }}\n"
            )
        })
        .collect()
}

/// The template's comment line where each model's decode cluster goes.
const MODEL_CLUSTERS_MARKER: &str = "    # switchyard:model-clusters\n";
/// The API paths a model's route covers (the shared routes' paths that reach workers with a
/// body naming a model).
const MODEL_PATHS: [&str; 2] = ["/v1/chat/completions", "/v1/completions"];

/// Each model's routes: the filter names a request's model in [`MODEL_HEADER`] (from the
/// verdict, or the body when it fails open), and the request goes to that model's cluster,
/// where a retry or fallback finds only that model's workers.
fn model_routes(models: &[String]) -> String {
    let mut out = String::new();
    for model in models {
        // A JSON string is a YAML double-quoted scalar: any model name stays one value.
        let quoted = serde_json::Value::from(model.as_str()).to_string();
        let model_match =
            format!("{{ name: {MODEL_HEADER}, string_match: {{ exact: {quoted} }} }}");
        // A prefill worker serving the request whole, then every other request of the model:
        // each to the model's own cluster, so Envoy's retries and fallbacks stay in it.
        let prefill = model_cluster(PREFILL_CLUSTER, model);
        let decode = model_cluster(DECODE_CLUSTER, model);
        for path in MODEL_PATHS {
            out.push_str(&format!(
                "                        - match: {{ path: \"{path}\", headers: [ {{ name: {POOL_HEADER}, string_match: {{ exact: {POOL_PREFILL} }} }}, {model_match} ] }}\n                          route: {{ cluster: {prefill}, timeout: 0s }}\n"
            ));
        }
        for path in MODEL_PATHS {
            out.push_str(&format!(
                "                        - match: {{ path: \"{path}\", headers: [ {model_match} ] }}\n                          route: {{ cluster: {decode}, timeout: 0s }}\n"
            ));
        }
    }
    out
}

/// Each model's decode and prefill clusters: the template's shared cluster of that role (its
/// EDS source, buffer limit and override-host policy, written once there) under the model's
/// name ([`model_cluster`]), which the control plane's EDS serves with that model's workers.
fn model_clusters(rendered: &str, models: &[String]) -> Result<String, StackError> {
    let mut out = String::new();
    for role_cluster in [DECODE_CLUSTER, PREFILL_CLUSTER] {
        let shared = cluster_block(rendered, role_cluster).ok_or_else(|| {
            StackError::InvalidSetting(format!(
                "the bootstrap template has no {role_cluster} cluster followed by another"
            ))
        })?;
        for model in models {
            let cluster = model_cluster(role_cluster, model);
            out.push_str(
                &shared
                    .replace(
                        &format!("    - name: {role_cluster}\n"),
                        &format!("    - name: {cluster}\n"),
                    )
                    .replace(
                        &format!("service_name: {role_cluster}\n"),
                        &format!("service_name: {cluster}\n"),
                    ),
            );
        }
    }
    Ok(out)
}

/// The template's definition of cluster `name`: from its `- name:` line to the next
/// cluster's.
fn cluster_block<'a>(rendered: &'a str, name: &str) -> Option<&'a str> {
    const NEXT: &str = "\n    - name: ";
    let from = rendered.find(&format!("    - name: {name}\n"))?;
    let to = from + rendered[from..].find(NEXT)? + 1;
    Some(&rendered[from..to])
}

/// A listener routing to the decode cluster with no filter but the router.
fn plain_listener(port: u16, buffer_limit_bytes: u64) -> String {
    format!(
        r#"    # Baseline without the Switchyard filter (filter-overhead bench).
    - name: switchyard_plain
      address:
        socket_address: {{ address: 127.0.0.1, port_value: {port} }}
      per_connection_buffer_limit_bytes: {buffer_limit_bytes}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: plain
                route_config:
                  name: plain
                  virtual_hosts:
                    - name: llm
                      domains: ["*"]
                      routes:
                        - match: {{ prefix: "/" }}
                          route: {{ cluster: switchyard_decode, timeout: 0s }}
                http_filters:
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#
    )
}

/// What the template needs.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvoySettings {
    /// Client-facing listener port on 127.0.0.1.
    pub listen_port: u16,
    /// Admin port on 127.0.0.1.
    pub admin_port: u16,
    /// The control plane's port on 127.0.0.1 (route API and EDS).
    pub control_plane_port: u16,
    /// Further control-plane replicas' route ports on 127.0.0.1 (active-active).
    pub control_plane_replica_ports: Vec<u16>,
    /// The filter's `.wasm`.
    pub wasm_path: PathBuf,
    /// Route call timeout handed to the filter.
    pub route_timeout_ms: u64,
    /// Largest request body the gateway takes: the filter's `max_body_bytes` (bodies above
    /// get its JSON 413). Envoy buffers [`BUFFER_HEADROOM_BYTES`] more per connection.
    pub buffer_limit_bytes: u64,
    /// How often Envoy polls the control plane's EDS.
    pub eds_refresh: Duration,
    /// Filter configuration keys that win over the defaults of [`EnvoySettings::filter_config`].
    pub filter_overrides: serde_json::Map<String, serde_json::Value>,
    /// A second listener on this port routing to the decode cluster without the filter (the
    /// overhead bench's baseline).
    pub plain_listen_port: Option<u16>,
}

/// The least Envoy buffers per connection beyond the largest body the filter takes.
///
/// A body uploaded chunked has no length to refuse up front: the filter counts it as it
/// arrives, and Envoy must still have room when the count passes the filter's limit, or
/// Envoy answers its own plain-text 413 first. Envoy's HTTP/1 codec hands a stream all the
/// body one read brought at once, and a fast client on loopback brought more than 1 MiB per
/// read: with 1 MiB of room about half the uploads of 17.5 MiB got Envoy's 413. The room is
/// therefore as large as the body limit itself ([`EnvoySettings::envoy_buffer_limit`]), and
/// at least this much.
pub const BUFFER_HEADROOM_BYTES: u64 = 1 << 20;

impl EnvoySettings {
    /// Envoy's `per_connection_buffer_limit_bytes`: twice the body limit (at least the body
    /// limit plus [`BUFFER_HEADROOM_BYTES`]). Envoy only fills it for a body the filter has
    /// already refused, and it stops keeping such a body once its reply is sent.
    pub fn envoy_buffer_limit(&self) -> u64 {
        self.buffer_limit_bytes
            .saturating_add(self.buffer_limit_bytes.max(BUFFER_HEADROOM_BYTES))
    }

    /// The filter's JSON configuration: the clusters of the template, the route timeout, a
    /// body limit half of Envoy's buffer limit (so the filter answers 413 with a JSON error
    /// before Envoy's plain-text one, chunked uploads included), then
    /// [`EnvoySettings::filter_overrides`].
    pub fn filter_config(&self) -> String {
        self.filter_config_for_models(&[])
    }

    /// [`EnvoySettings::filter_config`] for a gateway of `models`: with any, prefill retries
    /// go to the model's own prefill cluster (`prefill_model_clusters`), which
    /// [`render_bootstrap_for_models`] defines.
    fn filter_config_for_models(&self, models: &[String]) -> String {
        filter_config_json(
            self.route_timeout_ms,
            self.buffer_limit_bytes,
            &self.filter_overrides,
            !models.is_empty(),
        )
    }
}

/// The filter configuration [`EnvoySettings::filter_config`] describes, for a gateway of
/// several models when `per_model_clusters`.
fn filter_config_json(
    route_timeout_ms: u64,
    max_body_bytes: u64,
    overrides: &serde_json::Map<String, serde_json::Value>,
    per_model_clusters: bool,
) -> String {
    let mut config = serde_json::Map::new();
    config.insert(
        "control_plane_cluster".into(),
        "switchyard_control_plane".into(),
    );
    config.insert("prefill_cluster".into(), PREFILL_CLUSTER.into());
    config.insert("route_timeout_ms".into(), route_timeout_ms.into());
    config.insert("max_body_bytes".into(), max_body_bytes.into());
    if per_model_clusters {
        config.insert("prefill_model_clusters".into(), true.into());
    }
    for (key, value) in overrides {
        config.insert(key.clone(), value.clone());
    }
    serde_json::Value::Object(config).to_string()
}

/// Checks the filter configuration a stack with these settings would hand Envoy, as the
/// filter checks it: Envoy refuses a configuration the filter refuses, but only once the
/// stack is half started, and with the reason deep in its log.
///
/// # Errors
/// [`StackError::InvalidSetting`] naming the key and what is wrong with it.
pub fn check_filter_config(
    route_timeout_ms: u64,
    max_body_bytes: u64,
    overrides: &serde_json::Map<String, serde_json::Value>,
) -> Result<(), StackError> {
    let config = filter_config_json(route_timeout_ms, max_body_bytes, overrides, false);
    switchyard_filter::config::Config::parse(Some(config.as_bytes()))
        .map(drop)
        .map_err(|e| StackError::InvalidSetting(format!("filter setting: {e}")))
}

/// Fills the template in, for a gateway of one model.
///
/// # Errors
/// [`StackError::InvalidSetting`] if the wasm path cannot be written into the YAML, or a
/// placeholder is left unfilled (the template and this function disagree).
pub fn render_bootstrap(settings: &EnvoySettings) -> Result<String, StackError> {
    render_bootstrap_for_models(settings, &[])
}

/// Fills the template in, with a route, a decode cluster and a prefill cluster for each of
/// `models` (the pool file's; none: exactly [`render_bootstrap`]'s config).
///
/// # Errors
/// As [`render_bootstrap`].
pub fn render_bootstrap_for_models(
    settings: &EnvoySettings,
    models: &[String],
) -> Result<String, StackError> {
    let wasm = settings.wasm_path.to_string_lossy();
    if wasm.contains(['"', '\\', '\n']) {
        return Err(StackError::InvalidSetting(format!(
            "wasm path {wasm:?} has quote/escape characters"
        )));
    }
    let refresh_ms = settings.eds_refresh.as_millis().max(1);
    // The filter config sits in a single-quoted YAML scalar: double any single quote.
    let filter_config = settings
        .filter_config_for_models(models)
        .replace('\'', "''");
    let rendered = BOOTSTRAP_TEMPLATE
        .replace("${LISTEN_PORT}", &settings.listen_port.to_string())
        .replace("${ADMIN_PORT}", &settings.admin_port.to_string())
        .replace(
            "${CONTROL_PLANE_PORT}",
            &settings.control_plane_port.to_string(),
        )
        .replace("${WASM_PATH}", &wasm)
        .replace("${FILTER_CONFIG}", &filter_config)
        .replace(
            "${BUFFER_LIMIT}",
            &settings.envoy_buffer_limit().to_string(),
        )
        .replace(
            "${EDS_REFRESH}",
            &format!("{}s", refresh_ms as f64 / 1000.0),
        );
    let plain = match settings.plain_listen_port {
        Some(port) => plain_listener(port, settings.envoy_buffer_limit()),
        None => String::new(),
    };
    let rendered = rendered.replace(EXTRA_LISTENERS_MARKER, &plain).replace(
        REPLICAS_MARKER,
        &replica_endpoints(&settings.control_plane_replica_ports),
    );
    let clusters = model_clusters(&rendered, models)?;
    let rendered = rendered
        .replace(MODEL_ROUTES_MARKER, &model_routes(models))
        .replace(MODEL_CLUSTERS_MARKER, &clusters);
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

/// Requests in flight through the gateway's listeners: the sum of every HTTP connection
/// manager's `downstream_rq_active` gauge on Envoy's admin `/stats` text page (lines like
/// `http.switchyard.downstream_rq_active: 3`), the admin interface's own left out (the
/// request reading the page is one of them).
pub fn requests_in_flight(stats_page: &str) -> u64 {
    stats_page
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            let manager = name
                .strip_prefix("http.")?
                .strip_suffix(".downstream_rq_active")?;
            if manager == "admin" {
                return None;
            }
            value.trim().parse::<u64>().ok()
        })
        .sum()
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

    #[test]
    fn requests_in_flight_sum_every_listener_but_the_admin_interface() {
        let page = "http.admin.downstream_rq_active: 1\n\
                    http.plain.downstream_rq_active: 2\n\
                    http.switchyard.downstream_rq_active: 3\n\
                    http.switchyard.downstream_rq_active_total: 9\n\
                    cluster.switchyard_decode.upstream_rq_active: 7\n";
        assert_eq!(requests_in_flight(page), 5);
        assert_eq!(
            requests_in_flight("http.admin.downstream_rq_active: 1\n"),
            0
        );
        assert_eq!(requests_in_flight(""), 0);
    }

    fn settings() -> EnvoySettings {
        EnvoySettings {
            listen_port: 10000,
            admin_port: 9901,
            control_plane_port: 8080,
            control_plane_replica_ports: Vec::new(),
            wasm_path: PathBuf::from("/tmp/switchyard_filter.wasm"),
            route_timeout_ms: 150,
            buffer_limit_bytes: 16 << 20,
            eds_refresh: Duration::from_millis(500),
            filter_overrides: serde_json::Map::new(),
            plain_listen_port: None,
        }
    }

    #[test]
    fn each_control_plane_replica_is_an_endpoint_health_checked_on_readyz() {
        let one = render_bootstrap(&settings()).expect("renders");
        let two = render_bootstrap(&EnvoySettings {
            control_plane_replica_ports: vec![8082, 8084],
            ..settings()
        })
        .expect("renders");
        let cluster = |yaml: &str| {
            let start = yaml.find("- name: switchyard_control_plane").unwrap();
            yaml[start..].to_string()
        };
        assert_eq!(cluster(&one).matches("- endpoint:").count(), 1);
        assert_eq!(cluster(&two).matches("- endpoint:").count(), 3);
        assert!(cluster(&two).contains("port_value: 8084 }"));
        assert!(cluster(&one).contains("http_health_check: { path: /readyz }"));
    }

    #[test]
    fn rendering_fills_every_placeholder() {
        let yaml = render_bootstrap(&settings()).expect("renders");
        assert!(yaml.contains("port_value: 10000"));
        assert!(yaml.contains("port_value: 9901"));
        assert!(yaml.contains("port_value: 8080"));
        assert!(yaml.contains("refresh_delay: 0.5s"));
        assert!(yaml.contains(r#"value: '{"control_plane_cluster":"switchyard_control_plane","prefill_cluster":"switchyard_prefill","route_timeout_ms":150,"max_body_bytes":16777216}'"#), "{yaml}");
        // Envoy has room past the filter's limit, so a chunked upload meets the filter's 413.
        assert!(
            yaml.contains("per_connection_buffer_limit_bytes: 33554432"),
            "{yaml}"
        );
        assert!(
            !yaml.contains("per_connection_buffer_limit_bytes: 16777216"),
            "{yaml}"
        );
        assert!(!yaml.contains("switchyard_plain"));
        assert!(yaml.contains("filename: \"/tmp/switchyard_filter.wasm\""));
        assert!(yaml.contains("allow_on_headers_stop_iteration: true"));
    }

    #[test]
    fn a_request_kept_on_its_prefill_worker_is_routed_to_the_prefill_cluster() {
        let yaml = render_bootstrap(&settings()).expect("renders");
        for path in ["/v1/chat/completions", "/v1/completions"] {
            let pool = format!(
                r#"- match: {{ path: "{path}", headers: [ {{ name: {POOL_HEADER}, string_match: {{ exact: {POOL_PREFILL} }} }} ] }}
                          route: {{ cluster: {PREFILL_CLUSTER}, timeout: 0s }}"#
            );
            let at = yaml
                .find(&pool)
                .unwrap_or_else(|| panic!("no pool route: {yaml}"));
            let shared = yaml
                .find(&format!(r#"- match: {{ path: "{path}" }}"#))
                .expect("shared route");
            assert!(at < shared, "the pool route comes first");
        }
    }

    #[test]
    fn overrides_win_and_a_plain_listener_can_be_added() {
        let mut with = settings();
        with.filter_overrides
            .insert("route_timeout_ms".into(), 7.into());
        with.filter_overrides.insert("note".into(), "it's".into());
        with.plain_listen_port = Some(10001);
        let yaml = render_bootstrap(&with).expect("renders");
        assert!(yaml.contains(r#""route_timeout_ms":7"#), "{yaml}");
        assert!(
            yaml.contains(r#""note":"it''s""#),
            "single quotes doubled: {yaml}"
        );
        assert!(yaml.contains("name: switchyard_plain"));
        assert!(yaml.contains("port_value: 10001"));
    }

    #[test]
    fn each_model_gets_a_route_on_its_header_and_a_cluster_per_role() {
        let one = render_bootstrap(&settings()).expect("renders");
        assert!(!one.contains(MODEL_HEADER), "one model: no model routes");
        assert_eq!(one.matches("- name: switchyard_decode").count(), 1);
        let models = ["org/a-1.0".to_string(), "b".to_string()];
        let yaml = render_bootstrap_for_models(&settings(), &models).expect("renders");
        let route = yaml.find(r#"exact: "org/a-1.0""#).expect("a's route");
        let shared = yaml
            .find(r#"- match: { path: "/v1/chat/completions" }"#)
            .expect("shared route");
        assert!(route < shared, "model routes come first");
        assert!(yaml.contains("route: { cluster: switchyard_decode__org_a-1_0, timeout: 0s }"));
        // A request a model's prefill worker serves whole goes to that model's prefill
        // cluster, before the shared pool route and the model's decode route could take it.
        let model_pool = yaml
            .find(&format!(
                r#"headers: [ {{ name: {POOL_HEADER}, string_match: {{ exact: {POOL_PREFILL} }} }}, {{ name: {MODEL_HEADER}, string_match: {{ exact: "b" }} }} ] }}
                          route: {{ cluster: switchyard_prefill__b, timeout: 0s }}"#
            ))
            .expect("b's pool route");
        let model_decode = yaml
            .find(
                r#"string_match: { exact: "b" } } ] }
                          route: { cluster: switchyard_decode__b, timeout: 0s }"#,
            )
            .expect("b's decode route");
        let shared_pool = yaml
            .find(&format!(
                r#"headers: [ {{ name: {POOL_HEADER}, string_match: {{ exact: {POOL_PREFILL} }} }} ] }}"#
            ))
            .expect("the shared pool route");
        assert!(
            model_pool < model_decode && model_decode < shared_pool,
            "{yaml}"
        );
        assert!(yaml.contains("    - name: switchyard_decode__b\n"));
        assert!(yaml.contains("service_name: switchyard_decode__b\n"));
        assert!(yaml.contains("    - name: switchyard_prefill__org_a-1_0\n"));
        assert!(yaml.contains("service_name: switchyard_prefill__b\n"));
        assert_eq!(
            yaml.matches("override_host_sources").count(),
            6,
            "2 shared + 2 per model"
        );
        assert!(
            yaml.contains(r#""prefill_model_clusters":true"#),
            "retries stay in the model's prefill cluster: {yaml}"
        );
        assert!(!one.contains("prefill_model_clusters"));
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
