//! The Envoy configs are valid for the installed Envoy 1.40: the rendered bootstrap template
//! and the standalone example both pass `envoy --mode validate`, which also loads the filter
//! and runs its `on_configure` (a bad filter config fails validation).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use switchyard_e2e::BUILD_COMMAND;
use switchyard_stack::envoy::{render_bootstrap, EnvoySettings};
use switchyard_stack::paths::workspace_root;
use switchyard_stack::{Artifacts, Profile, StackError};

fn artifacts() -> Artifacts {
    match Artifacts::locate(Profile::Debug) {
        Ok(a) => a,
        Err(e @ StackError::MissingArtifact { .. }) => panic!("{e}\nRun first:\n  {BUILD_COMMAND}"),
        Err(e) => panic!("{e}"),
    }
}

fn validate(envoy: &Path, config: &Path, cwd: &Path) -> (bool, String) {
    let output = Command::new(envoy)
        .args(["--mode", "validate", "--use-dynamic-base-id", "-c"])
        .arg(config)
        .current_dir(cwd)
        .output()
        .expect("run envoy --mode validate");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), log)
}

fn settings(artifacts: &Artifacts, route_timeout_ms: u64) -> EnvoySettings {
    EnvoySettings {
        listen_port: 10000,
        admin_port: 9901,
        control_plane_port: 8080,
        control_plane_replica_ports: vec![8082],
        wasm_path: artifacts.filter_wasm.clone(),
        route_timeout_ms,
        buffer_limit_bytes: 16 << 20,
        eds_refresh: Duration::from_secs(1),
        filter_overrides: serde_json::Map::new(),
        plain_listen_port: Some(10001),
    }
}

fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("switchyard-e2e-{}-{name}", std::process::id()));
    std::fs::write(&path, text).expect("write temp config");
    path
}

#[test]
fn the_rendered_bootstrap_validates_and_loads_the_filter() {
    let artifacts = artifacts();
    let yaml = render_bootstrap(&settings(&artifacts, 200)).expect("render");
    let path = temp_file("bootstrap.yaml", &yaml);
    let (ok, log) = validate(&artifacts.envoy, &path, &workspace_root());
    let _ = std::fs::remove_file(&path);
    assert!(ok, "envoy rejected the rendered bootstrap:\n{log}");
    assert!(
        log.contains("switchyard filter configured"),
        "the filter did not configure:\n{log}"
    );
}

#[test]
fn the_standalone_example_validates() {
    let artifacts = artifacts();
    let root = workspace_root();
    let (ok, log) = validate(&artifacts.envoy, &root.join("envoy/envoy.yaml"), &root);
    assert!(ok, "envoy rejected envoy/envoy.yaml:\n{log}");
}

#[test]
fn a_bad_filter_config_fails_validation() {
    let artifacts = artifacts();
    // 0 ms is out of range: the filter's on_configure must refuse it, and Envoy with it.
    let yaml = render_bootstrap(&settings(&artifacts, 0)).expect("render");
    let path = temp_file("bad-bootstrap.yaml", &yaml);
    let (ok, log) = validate(&artifacts.envoy, &path, &workspace_root());
    let _ = std::fs::remove_file(&path);
    assert!(
        !ok,
        "envoy accepted a filter config with route_timeout_ms 0:\n{log}"
    );
    assert!(
        log.contains("route_timeout_ms"),
        "the filter's error should name the key:\n{log}"
    );
}

/// The clusters `name` in an Envoy YAML config: (name, its lines up to the next cluster).
fn cluster_blocks(yaml: &str) -> Vec<(String, String)> {
    let mut blocks: Vec<(String, String)> = Vec::new();
    for line in yaml.lines() {
        if let Some(name) = line.trim_start().strip_prefix("- name: ") {
            if line.starts_with("    - name: ") {
                blocks.push((name.trim().to_string(), String::new()));
                continue;
            }
        }
        if let Some((_, block)) = blocks.last_mut() {
            block.push_str(line);
            block.push('\n');
        }
    }
    blocks
}

#[test]
fn both_worker_pools_eject_a_worker_that_refuses_connections() {
    let artifacts = artifacts();
    let rendered = render_bootstrap(&settings(&artifacts, 200)).expect("render");
    let example = std::fs::read_to_string(workspace_root().join("envoy/envoy.yaml")).unwrap();
    for (config, yaml) in [("bootstrap", rendered), ("envoy.yaml", example)] {
        let blocks = cluster_blocks(&yaml);
        for pool in ["switchyard_decode", "switchyard_prefill"] {
            let (_, block) = blocks
                .iter()
                .find(|(name, _)| name == pool)
                .unwrap_or_else(|| panic!("{config}: no cluster {pool}"));
            assert!(
                block.contains("outlier_detection:")
                    && block.contains("consecutive_local_origin_failure: 1"),
                "{config}: {pool} must eject a worker that refuses a connection (a dead \
                 prefill worker otherwise takes the prefill leg's retry too):\n{block}"
            );
        }
    }
}

#[test]
fn one_ready_control_plane_replica_of_three_takes_every_route_call() {
    let artifacts = artifacts();
    let rendered = render_bootstrap(&settings(&artifacts, 200)).expect("render");
    let example = std::fs::read_to_string(workspace_root().join("envoy/envoy.yaml")).unwrap();
    for (config, yaml) in [("bootstrap", rendered), ("envoy.yaml", example)] {
        let blocks = cluster_blocks(&yaml);
        let (_, block) = blocks
            .iter()
            .find(|(name, _)| name == "switchyard_control_plane")
            .unwrap_or_else(|| panic!("{config}: no control-plane cluster"));
        // Envoy panics (calls every host, healthy or not) below this share of healthy hosts:
        // it must be under a third, or one ready replica of three shares its calls with dead
        // ones.
        let threshold: f64 = block
            .lines()
            .find_map(|l| l.trim().strip_prefix("healthy_panic_threshold: { value: "))
            .and_then(|v| v.trim_end_matches('}').trim().parse().ok())
            .unwrap_or(50.0);
        assert!(
            threshold > 0.0 && threshold < 100.0 / 3.0,
            "{config}: healthy_panic_threshold {threshold}"
        );
    }
}

/// A verdict that keeps a request on its prefill worker sets `x-switchyard-pool: prefill`:
/// every shipped gateway config routes that header to the prefill pool, before the route of
/// the same paths to the decode pool (without it the request lands on the full decode pool).
#[test]
fn every_shipped_gateway_routes_the_prefill_pool_header_first() {
    let root = workspace_root();
    let read = |path: &str| std::fs::read_to_string(root.join(path)).expect(path);
    for path in ["envoy/envoy.yaml", "envoy/bootstrap.template.yaml"] {
        let yaml = read(path);
        let pool = yaml
            .find("x-switchyard-pool, string_match: { exact: prefill }")
            .unwrap_or_else(|| panic!("{path}: no x-switchyard-pool route"));
        let decode = yaml
            .find("cluster: switchyard_decode,")
            .unwrap_or_else(|| panic!("{path}: no decode route"));
        assert!(pool < decode, "{path}: the pool route must come first");
    }
    let istio = read("envoy/istio/gateway-routes.yaml");
    let pool = istio
        .find("- name: openai-on-prefill-pool")
        .expect("the Istio VirtualService's prefill-pool route");
    let decode = istio.find("- name: openai\n").expect("the OpenAI route");
    assert!(
        pool < decode,
        "the Istio prefill-pool route must come first"
    );
    let route = &istio[pool..decode];
    assert!(
        route.contains("x-switchyard-pool: { exact: prefill }"),
        "{route}"
    );
    assert!(route.contains("host: vllm-prefill."), "{route}");
}

/// Every shipped gateway config keeps a dead worker from costing more than what it was serving
/// and answers "no worker" as JSON: connection failures (and only those, so no generation runs
/// twice) retried, a worker ejected at its first refused connection in both pools, and Envoy's
/// own 503s rendered as OpenAI errors. The Istio sample once had none of it (`retries:
/// attempts: 0`, no outlier detection, plain-text 503s).
#[test]
fn every_shipped_gateway_retries_connection_failures_ejects_dead_workers_and_answers_json() {
    let root = workspace_root();
    let read = |path: &str| std::fs::read_to_string(root.join(path)).expect(path);
    let count = |text: &str, needle: &str| text.matches(needle).count();
    for path in ["envoy/envoy.yaml", "envoy/bootstrap.template.yaml"] {
        let yaml = read(path);
        assert_eq!(
            count(&yaml, "retry_on: connect-failure,reset-before-request"),
            1,
            "{path}"
        );
        assert_eq!(
            count(&yaml, "consecutive_local_origin_failure: 1"),
            2,
            "{path}: decode and prefill clusters"
        );
        assert!(yaml.contains("local_reply_config:"), "{path}");
    }
    let routes = read("envoy/istio/gateway-routes.yaml");
    assert_eq!(
        count(&routes, "retryOn: connect-failure,reset-before-request"),
        2,
        "both Istio routes"
    );
    assert!(!routes.contains("attempts: 0"), "{routes}");
    assert_eq!(
        count(&routes, "consecutiveLocalOriginFailures: 1"),
        2,
        "both Istio DestinationRules"
    );
    let patches = read("envoy/istio/envoyfilter-override-host.yaml");
    let reply = |text: String| {
        let at = text
            .find("response_flag_filter")
            .expect("a local reply mapper");
        let lines: Vec<String> = text[at..]
            .lines()
            .take(11)
            .map(|l| l.trim().to_owned())
            .collect();
        lines
    };
    assert_eq!(
        reply(patches),
        reply(read("envoy/envoy.yaml")),
        "the Istio gateway's local replies are the standalone gateway's"
    );
}

/// Every shipped gateway config replaces a crashed filter VM instead of skipping the filter:
/// skipped (`FAIL_OPEN`), every later request on that Envoy worker thread passed with its
/// routing headers and steering keys unstripped, so a client could pick its worker and make a
/// decode worker pull KV from a host it named.
#[test]
fn every_shipped_gateway_reloads_a_crashed_filter_instead_of_skipping_it() {
    let root = workspace_root();
    let read = |path: &str| std::fs::read_to_string(root.join(path)).expect(path);
    for path in [
        "envoy/envoy.yaml",
        "envoy/bootstrap.template.yaml",
        "envoy/istio/envoyfilter-switchyard.yaml",
    ] {
        let yaml = read(path);
        assert!(yaml.contains("failure_policy: FAIL_RELOAD"), "{path}");
        assert!(yaml.contains("reload_config:"), "{path}");
        assert!(!yaml.contains("FAIL_OPEN"), "{path}");
    }
}

/// Every shipped gateway config lets a generation run as long as it takes (a non-streamed
/// answer sends nothing until it ends: Envoy's 5-minute stream idle timeout cut such answers
/// with a plain-text 504) and bounds receiving a request instead, with JSON 408s.
#[test]
fn every_shipped_gateway_lets_generations_run_and_bounds_receiving_a_request() {
    let root = workspace_root();
    for path in [
        "envoy/envoy.yaml",
        "envoy/bootstrap.template.yaml",
        "envoy/istio/envoyfilter-override-host.yaml",
    ] {
        let yaml = std::fs::read_to_string(root.join(path)).expect(path);
        for setting in [
            "stream_idle_timeout: 0s",
            "request_timeout: 300s",
            "request_headers_timeout: 10s",
            "default_value: 408",
        ] {
            assert!(yaml.contains(setting), "{path}: {setting}");
        }
    }
    // The standalone configs bound client connections too (Istio sets its own).
    for path in ["envoy/envoy.yaml", "envoy/bootstrap.template.yaml"] {
        let yaml = std::fs::read_to_string(root.join(path)).expect(path);
        assert!(
            yaml.contains("max_active_downstream_connections:"),
            "{path}"
        );
    }
}
