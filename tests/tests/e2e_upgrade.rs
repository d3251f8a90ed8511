//! Changing the gateway's configuration under traffic, as operators do it in plain Envoy: the
//! listener, with the filter's configuration, served from a file (LDS with a path config
//! source) and replaced by an atomic rename. Envoy then drains the old listener's connections
//! for `--drain-time-s` (here 1 s) and builds the filter again with the new configuration,
//! in a root context of its own.
//!
//! 1. Streams in flight on the old configuration outlive the drain (Envoy then closes their
//!    connections, as it documents). The `done` reports of those requests, queued in the old
//!    configuration's root context as Envoy tears it down, still reach the control plane: one
//!    `done` per routed request, nothing counted in flight. (They were lost: the control plane
//!    counted those requests on their workers until the workers' load reports had shown them
//!    gone for 30 s, `switchyard_stale_in_flight_released_total`, and never heard their end.)
//! 2. The new configuration takes effect (the VM logs it; requests are served).
//! 3. A configuration the filter refuses (a value out of range) is refused by Envoy as an LDS
//!    update: the listener keeps the configuration before it and serves on.
//!
//! Needs `cargo build -p switchyard-filter --target wasm32-wasip1 --profile wasm && cargo
//! build --workspace --bins` first (the tests build nothing).

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use switchyard_e2e::{
    chat_body, client, envoy_stats, eventually, eventually_ok, get_text, post_observed, prom_sum,
    start_stack,
};
use switchyard_stack::{Artifacts, Profile, Stack, StackBuilder};
use switchyard_support::{free_listen_ports, Process, TempDir};

/// Streams this long outlive the 1 s drain by far on any machine.
const LONG_STREAM_TOKENS: u32 = 4_000;
/// Long streams in flight when the listener is replaced.
const STREAMS: usize = 4;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
const ENVOY_START: Duration = Duration::from_secs(60);

/// The stack's rendered bootstrap split into a bootstrap that reads its listeners from
/// `lds.yaml` in `dir`, and that listener, whose filter configuration `lds_file` rewrites.
struct FileListener {
    dir: TempDir,
    /// The listener as the stack rendered it, on the port of this Envoy.
    listener: String,
    /// The filter configuration JSON the stack rendered.
    filter_config: Value,
}

impl FileListener {
    /// Splits `run_dir/envoy.yaml`: the static listener moves to an LDS file, on
    /// `listen_port`; the admin listener moves to `admin_port`.
    fn from_stack(run_dir: &Path, listen_port: u16, admin_port: u16) -> FileListener {
        let rendered = std::fs::read_to_string(run_dir.join("envoy.yaml")).expect("envoy.yaml");
        let (head, rest) = rendered
            .split_once("  listeners:\n")
            .expect("a static listeners section");
        let (listener, clusters) = rest
            .split_once("\n  clusters:\n")
            .expect("clusters after the listeners");
        let admin = head
            .lines()
            .find(|l| l.contains("port_value:"))
            .expect("the admin port line");
        let new_admin = admin.replace(&port_of(admin).to_string(), &admin_port.to_string());
        let head = head.replacen(admin, &new_admin, 1);
        let listen_line = listener
            .lines()
            .find(|l| l.contains("port_value:"))
            .expect("the listener's port line");
        let listener = listener.replacen(
            listen_line,
            &listen_line.replace(&port_of(listen_line).to_string(), &listen_port.to_string()),
            1,
        );
        let config_line = listener
            .lines()
            .find(|l| l.trim_start().starts_with("value: '"))
            .expect("the filter configuration line");
        let json = config_line
            .trim()
            .trim_start_matches("value: '")
            .trim_end_matches('\'')
            .replace("''", "'");
        let filter_config: Value = serde_json::from_str(&json).expect("filter config JSON");
        let dir = TempDir::new("lds").expect("a scratch directory");
        let lds = dir.path().join("lds.yaml");
        let bootstrap = format!(
            "{head}  clusters:\n{clusters}\ndynamic_resources:\n  lds_config:\n    \
             resource_api_version: V3\n    path_config_source:\n      path: {}\n      \
             watched_directory: {{ path: {} }}\n",
            lds.display(),
            dir.path().display()
        );
        std::fs::write(dir.path().join("bootstrap.yaml"), bootstrap).expect("bootstrap");
        FileListener {
            dir,
            listener: listener.to_string(),
            filter_config,
        }
    }

    /// Writes the listener with the filter configuration patched by `patch`, as operators do:
    /// a new file renamed over the old, so Envoy never reads half of one.
    fn write(&self, patch: &Value) {
        let mut config = self.filter_config.clone();
        for (key, value) in patch.as_object().expect("a JSON object patch") {
            config[key] = value.clone();
        }
        let text = config.to_string().replace('\'', "''");
        let old_line = self
            .listener
            .lines()
            .find(|l| l.trim_start().starts_with("value: '"))
            .expect("the filter configuration line");
        let indent = &old_line[..old_line.len() - old_line.trim_start().len()];
        let listener = self
            .listener
            .replacen(old_line, &format!("{indent}value: '{text}'"), 1)
            .replacen(
                "- name: switchyard_ingress",
                "- \"@type\": type.googleapis.com/envoy.config.listener.v3.Listener\n      name: switchyard_ingress",
                1,
            );
        let temp = self.dir.path().join("lds.yaml.new");
        std::fs::write(&temp, format!("resources:\n{listener}\n")).expect("new LDS file");
        std::fs::rename(&temp, self.dir.path().join("lds.yaml")).expect("rename");
    }
}

fn port_of(line: &str) -> u16 {
    line.split("port_value:")
        .nth(1)
        .and_then(|rest| rest.trim().trim_end_matches(['}', ' ']).trim().parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"))
}

/// Requests the control plane counts in flight, summed over the workers.
async fn in_flight(http: &reqwest::Client, stack: &Stack) -> Result<f64, String> {
    let text = get_text(http, &format!("{}/metrics", stack.control_plane_url())).await?;
    Ok(prom_sum(&text, "switchyard_worker_in_flight"))
}

/// Route calls the control plane decided, and `done` reports it received.
async fn routed_and_done(http: &reqwest::Client, stack: &Stack) -> Result<(f64, f64), String> {
    let text = get_text(http, &format!("{}/metrics", stack.control_plane_url())).await?;
    let done = text
        .lines()
        .find_map(|l| l.strip_prefix("switchyard_lifecycle_events_total{event=\"done\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    Ok((prom_sum(&text, "switchyard_route_decisions_total"), done))
}

fn stat(stats: &std::collections::HashMap<String, u64>, name: &str) -> u64 {
    stats.get(name).copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_replaced_under_traffic_loses_no_lifecycle_report_and_refuses_a_bad_config() {
    let stack = start_stack(StackBuilder::new().decode_workers(2)).await;
    let http = client();
    let ports = free_listen_ports(2);
    let (listen_port, admin_port) = (ports[0], ports[1]);
    let files = FileListener::from_stack(stack.run_dir(), listen_port, admin_port);
    files.write(&serde_json::json!({"route_timeout_ms": 200}));
    let envoy_bin = Artifacts::locate(Profile::Debug)
        .expect("the stack's artifacts")
        .envoy;
    let log = files.dir.path().join("envoy.log");
    let args: Vec<String> = [
        "-c",
        &files.dir.path().join("bootstrap.yaml").to_string_lossy(),
        "--use-dynamic-base-id",
        "--concurrency",
        "1",
        // Old connections are closed 1 s after a listener update: the streams below outlive it.
        "--drain-time-s",
        "1",
        "--drain-strategy",
        "immediate",
        "--log-level",
        "info",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let _envoy = Process::spawn("envoy-lds", &envoy_bin, &args, Some(&log)).expect("envoy");
    let admin = format!("http://127.0.0.1:{admin_port}");
    let gateway = format!("http://127.0.0.1:{listen_port}/v1/chat/completions");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    eventually_ok("Envoy serves the file's listener", ENVOY_START, || async {
        let stats = envoy_stats(&http, &admin).await?;
        match stat(&stats, "listener_manager.total_listeners_active") {
            1 => Ok(()),
            n => Err(format!("{n} active listeners; log:\n{}", log_text())),
        }
    })
    .await;
    eventually_ok("the cluster endpoints from EDS", ENVOY_START, || async {
        let body = chat_body("Say hello.", 4, true);
        let seen = post_observed(&http, &gateway, &body, &[], REQUEST_TIMEOUT).await?;
        match (seen.status, seen.header("x-switchyard-route")) {
            (200, "bypass" | "agg" | "disagg") => Ok(()),
            (status, route) => Err(format!("{status} {route}")),
        }
    })
    .await;
    eventually(
        "the warm-up request reported done",
        REQUEST_TIMEOUT,
        || async { in_flight(&http, &stack).await == Ok(0.0) },
    )
    .await;

    // (1) Long streams on the old configuration; the listener replaced under them.
    let streams: Vec<_> = (0..STREAMS)
        .map(|i| {
            let http = http.clone();
            let gateway = gateway.clone();
            tokio::spawn(async move {
                let body = chat_body(
                    &format!("Stream {i}: tell a long story."),
                    LONG_STREAM_TOKENS,
                    true,
                );
                post_observed(&http, &gateway, &body, &[], REQUEST_TIMEOUT).await
            })
        })
        .collect();
    eventually(
        "every stream routed and counted in flight",
        REQUEST_TIMEOUT,
        || async { in_flight(&http, &stack).await == Ok(STREAMS as f64) },
    )
    .await;
    files.write(&serde_json::json!({"route_timeout_ms": 321}));
    eventually_ok("the new listener taken", ENVOY_START, || async {
        let stats = envoy_stats(&http, &admin).await?;
        match stat(&stats, "listener_manager.lds.update_success") {
            n if n >= 2 => Ok(()),
            n => Err(format!("{n} LDS updates; log:\n{}", log_text())),
        }
    })
    .await;
    let mut cut = 0;
    for stream in streams {
        match stream.await.expect("the stream task") {
            Ok(seen) if seen.body().contains("[DONE]") => {}
            // Envoy closes what outlives --drain-time-s: a cut stream, or an error.
            _ => cut += 1,
        }
    }
    eprintln!("{cut} of {STREAMS} streams outlived the drain and were cut");
    // A stream that ended before the drain had its `done` sent by the old context's timer;
    // only the cut ones end as Envoy lets that context go, which is what this test is about.
    assert!(
        cut > 0,
        "every stream finished within the drain: nothing tested the reports queued at its end"
    );
    // Their `done` reports were queued in the old configuration's root context as Envoy let it
    // go: they reach the control plane all the same, well before the workers' reports could
    // make up for a lost one (30 s).
    eventually_ok(
        "a done report for every routed request, none in flight",
        Duration::from_secs(15),
        || async {
            let (routed, done) = routed_and_done(&http, &stack).await?;
            match in_flight(&http, &stack).await? {
                0.0 if done == routed => Ok(()),
                n => Err(format!(
                    "{routed} routed, {done} reported done, {n} in flight; Envoy log:\n{}",
                    log_text()
                )),
            }
        },
    )
    .await;

    // (2) The new configuration serves.
    assert!(
        log_text().contains("timeout=321ms"),
        "the new configuration was never loaded:\n{}",
        log_text()
    );
    let body = chat_body("Say hello again.", 4, true);
    let seen = post_observed(&http, &gateway, &body, &[], REQUEST_TIMEOUT)
        .await
        .expect("a request on the new configuration");
    assert_eq!(seen.status, 200, "{}", seen.body());
    assert!(seen.body().contains("[DONE]"), "{}", seen.body());

    // (3) A value the filter refuses: Envoy rejects the update and keeps the listener it has.
    let rejected_before = stat(
        &envoy_stats(&http, &admin).await.expect("stats"),
        "listener_manager.lds.update_rejected",
    );
    files.write(&serde_json::json!({"route_timeout_ms": 0}));
    eventually_ok("the bad configuration rejected", ENVOY_START, || async {
        let stats = envoy_stats(&http, &admin).await?;
        match stat(&stats, "listener_manager.lds.update_rejected") {
            n if n > rejected_before => Ok(()),
            n => Err(format!("{n} rejected; log:\n{}", log_text())),
        }
    })
    .await;
    assert!(
        log_text().contains("route_timeout_ms"),
        "the refusal names the key:\n{}",
        log_text()
    );
    let seen = post_observed(&http, &gateway, &body, &[], REQUEST_TIMEOUT)
        .await
        .expect("a request after the rejected update");
    assert_eq!(seen.status, 200, "{}", seen.body());
    assert!(
        matches!(
            seen.header("x-switchyard-route"),
            "bypass" | "agg" | "disagg"
        ),
        "still routed by the filter: {:?}",
        seen.headers
    );
}
