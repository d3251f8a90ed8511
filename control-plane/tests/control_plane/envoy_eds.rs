//! A real Envoy polls the control plane's REST EDS and shows the live workers as cluster
//! members in its admin `/clusters` output; when the control plane goes away, Envoy keeps
//! the last endpoints (routing fails open).

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use switchyard_control_plane::settings::Settings;
use switchyard_protocol::worker::WorkerRole;
use switchyard_support::Process;

/// An Envoy child process, stopped by PID when dropped.
struct Envoy {
    // Declared first: stopped before its config directory goes.
    _process: Process,
    admin: String,
    _dir: TempDir,
}

fn envoy_binary() -> PathBuf {
    let path = std::env::var_os("SWITCHYARD_ENVOY")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin/envoy"))
        });
    assert!(
        path.exists(),
        "envoy not found at {} (set SWITCHYARD_ENVOY or run scripts/setup.sh)",
        path.display()
    );
    path
}

/// The EDS clusters as the project's Envoy bootstrap configures them, polling faster. REST
/// xDS needs the node's `id` and `cluster` set.
fn bootstrap(control_plane: std::net::SocketAddr, admin_port: u16) -> String {
    let eds = |name: &str| {
        format!(
            r#"
  - name: {name}
    type: EDS
    connect_timeout: 1s
    eds_cluster_config:
      eds_config:
        resource_api_version: V3
        api_config_source:
          api_type: REST
          transport_api_version: V3
          cluster_names: [switchyard_control_plane]
          refresh_delay: 0.2s"#
        )
    };
    format!(
        r#"node: {{ id: switchyard-eds-test, cluster: switchyard }}
admin:
  address:
    socket_address: {{ address: 127.0.0.1, port_value: {admin_port} }}
static_resources:
  clusters:
  - name: switchyard_control_plane
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: switchyard_control_plane
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {{ address: {ip}, port_value: {port} }}{decode}{prefill}
"#,
        ip = control_plane.ip(),
        port = control_plane.port(),
        decode = eds("switchyard_decode"),
        prefill = eds("switchyard_prefill"),
    )
}

fn start_envoy(control_plane: std::net::SocketAddr) -> Envoy {
    let dir = TempDir::new("envoy").expect("scratch dir");
    let admin_port = free_port();
    let config = dir.path().join("envoy.yaml");
    std::fs::write(&config, bootstrap(control_plane, admin_port)).unwrap();
    let config = config.to_string_lossy().into_owned();
    let args = [
        "-c",
        &config,
        "--disable-hot-restart",
        "--concurrency",
        "1",
        "-l",
        "warning",
    ]
    .map(String::from);
    let log = dir.path().join("envoy.log");
    let mut process =
        Process::spawn("envoy", &envoy_binary(), &args, Some(&log)).expect("start envoy");
    process
        .wait_for_listener(([127, 0, 0, 1], admin_port).into(), Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("envoy admin not up: {e}"));
    Envoy {
        _process: process,
        admin: format!("http://127.0.0.1:{admin_port}"),
        _dir: dir,
    }
}

async fn clusters(envoy: &Envoy) -> String {
    match reqwest::get(format!("{}/clusters", envoy.admin)).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_learns_pool_membership_from_eds_and_keeps_it_when_the_control_plane_stops() {
    let (_server, svc, nats) = service_with_nats(Settings::for_tests()).await;
    register_worker(&svc, &nats, "decode-0", WorkerRole::Decode, 19001).await;
    register_worker(&svc, &nats, "prefill-0", WorkerRole::Prefill, 19100).await;

    let envoy = start_envoy(svc.addr);
    eventually(
        Duration::from_secs(30),
        "Envoy lists both workers",
        || async {
            let c = clusters(&envoy).await;
            c.contains("switchyard_decode::127.0.0.1:19001::hostname::decode-0")
                && c.contains("switchyard_prefill::127.0.0.1:19100::hostname::prefill-0")
        },
    )
    .await;

    // A second decode worker joins: Envoy picks it up without a restart.
    register_worker(&svc, &nats, "decode-1", WorkerRole::Decode, 19002).await;
    eventually(Duration::from_secs(30), "Envoy lists decode-1", || async {
        clusters(&envoy)
            .await
            .contains("switchyard_decode::127.0.0.1:19002::")
    })
    .await;

    // The control plane goes away: Envoy keeps what it had.
    svc.stop().await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let c = clusters(&envoy).await;
    assert!(c.contains("switchyard_decode::127.0.0.1:19001::"), "{c}");
    assert!(c.contains("switchyard_decode::127.0.0.1:19002::"), "{c}");
    assert!(c.contains("switchyard_prefill::127.0.0.1:19100::"), "{c}");
}
