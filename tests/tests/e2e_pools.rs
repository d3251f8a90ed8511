//! Declared pools against simulated workers on vLLM's wire (simulated: a GB200 model, no
//! GPU): the same ZMQ events, replay socket and `/metrics` as a real vLLM, started in a
//! second, so the pool file's whole life is exercised fast. The control plane runs with a
//! NATS URL nothing listens on: declared workers need no NATS.
//!
//! - A declared worker joins at its first good health poll, with the capacity its
//!   `vllm:cache_config_info` gives; its KV events reach the index.
//! - Frozen (SIGSTOP), it fails its polls and leaves the pools and the index; thawed, it comes
//!   back, and the index is rebuilt from its replay buffer.
//! - A pool file that does not load keeps the last good pools, counted; removing a worker
//!   from the file takes it out; adding it back brings it in.
//! - Restarted within its health window, a quiet engine's blocks leave the index: its PUB
//!   socket's reconnection is the sign.
//! - The worker list is read from the admin listener with the admin token (from a file); the
//!   route listener does not serve it, and the admin listener refuses a missing or wrong token.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use switchyard_e2e::{client, eventually, get_json, get_text, prom_sum};
use switchyard_stack::{Artifacts, Profile};
use switchyard_support::{free_port, Process, TempDir};

const WAIT: Duration = Duration::from_secs(15);

struct Ports {
    http: u16,
    events: u16,
    replay: u16,
}

fn pool_file(sim: &Ports, with_worker: bool) -> String {
    pool_file_with(sim, with_worker, 2)
}

/// [`pool_file`] with health polls every 200 ms and a worker withdrawn after
/// `unhealthy_after` failed ones.
fn pool_file_with(sim: &Ports, with_worker: bool, unhealthy_after: u32) -> String {
    let worker = format!(
        "      - id: decode-0\n        role: decode\n        address: 127.0.0.1:{}\n        engine: vllm\n        kv_events: tcp://127.0.0.1:{}\n        kv_replay: tcp://127.0.0.1:{}\n",
        sim.http, sim.events, sim.replay
    );
    format!(
        "health: {{ interval_ms: 200, timeout_ms: 200, unhealthy_after: {unhealthy_after} }}\nmetrics: {{ interval_ms: 200 }}\nmodels:\n  - name: qwen3\n    block_size: 64\n    workers:\n{}",
        if with_worker { worker.as_str() } else { "" }
    )
}

/// The control plane's two listeners and the admin token.
struct ControlPlane {
    route: String,
    admin: String,
    token: String,
}

async fn workers(http: &reqwest::Client, cp: &ControlPlane) -> Vec<Value> {
    let response = http
        .get(format!("{}/v1/workers", cp.admin))
        .bearer_auth(&cp.token)
        .send()
        .await;
    match response {
        Ok(r) => r
            .json::<Value>()
            .await
            .map(|v| v["workers"].as_array().cloned().unwrap_or_default())
            .unwrap_or_default(),
        Err(_) => Vec::new(),
    }
}

async fn cached_blocks(http: &reqwest::Client, cp: &ControlPlane) -> Option<u64> {
    workers(http, cp)
        .await
        .first()
        .and_then(|w| w["cached_blocks"].as_u64())
}

async fn reloads(http: &reqwest::Client, cp: &ControlPlane, result: &str) -> f64 {
    let text = get_text(http, &format!("{}/metrics", cp.route))
        .await
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.contains(&format!("reason=\"{result}\"")))
        .map(|l| prom_sum(l, "switchyard_pool_reloads_total"))
        .sum()
}

/// The worker list is the admin listener's, behind the token: 401 without one, 403 with a
/// wrong one (both counted), and the route listener points elsewhere.
async fn admin_listener_guards_the_worker_list(http: &reqwest::Client, cp: &ControlPlane) {
    let url = format!("{}/v1/workers", cp.admin);
    let missing = http.get(&url).send().await.expect("admin GET");
    assert_eq!(missing.status(), 401);
    assert_eq!(
        missing
            .headers()
            .get("www-authenticate")
            .map(|v| v.as_bytes()),
        Some(&b"Bearer"[..])
    );
    let wrong = http
        .get(&url)
        .bearer_auth("not-the-admin-token-at-all")
        .send()
        .await
        .expect("admin GET");
    assert_eq!(wrong.status(), 403);
    let body: Value = wrong.json().await.expect("error JSON");
    assert_eq!(body["code"], "wrong_token");
    let on_route = get_json(http, &format!("{}/v1/workers", cp.route))
        .await
        .expect("route listener answers JSON");
    assert_eq!(on_route["code"], "admin_listener", "{on_route}");
    let metrics = get_text(http, &format!("{}/metrics", cp.admin))
        .await
        .expect("metrics on the admin listener");
    for (reason, want) in [("missing_token", 1.0), ("wrong_token", 1.0)] {
        let line = metrics
            .lines()
            .find(|l| l.starts_with("switchyard_admin_refusals_total") && l.contains(reason))
            .unwrap_or_else(|| panic!("no {reason} refusal counter in\n{metrics}"));
        assert_eq!(
            prom_sum(line, "switchyard_admin_refusals_total"),
            want,
            "{line}"
        );
    }
}

fn write(path: &Path, text: &str) {
    // Written whole, then renamed: the watcher never reads half a file (as with a ConfigMap).
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write pool file");
    std::fs::rename(&tmp, path).expect("rename pool file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_workers_join_leave_and_follow_the_pool_file() {
    let artifacts = Artifacts::locate(Profile::Debug).unwrap_or_else(|e| panic!("{e}"));
    let dir = TempDir::new("pools-e2e").expect("scratch");
    let sim = Ports {
        http: free_port(),
        events: free_port(),
        replay: free_port(),
    };
    let model_dir = artifacts.model_dir.to_string_lossy().into_owned();
    let mut worker = sim_worker(&artifacts, &sim, &dir, "sim-worker.log", "qwen3");
    let pools = dir.path().join("pools.yaml");
    write(&pools, &pool_file(&sim, true));
    let (cp_port, admin_port) = (free_port(), free_port());
    let token = switchyard_support::random_token();
    let token_file = dir.path().join("admin-token");
    std::fs::write(&token_file, format!("{token}\n")).expect("token file");
    let _cp = Process::spawn(
        "control-plane",
        &artifacts.control_plane,
        &[
            "--listen".into(),
            format!("127.0.0.1:{cp_port}"),
            "--admin-listen".into(),
            format!("127.0.0.1:{admin_port}"),
            "--admin-token-file".into(),
            token_file.to_string_lossy().into_owned(),
            "--nats-url".into(),
            format!("nats://127.0.0.1:{}", free_port()),
            "--model-dir".into(),
            model_dir,
            "--pool-file".into(),
            pools.to_string_lossy().into_owned(),
            "--pool-reload-ms".into(),
            "100".into(),
        ],
        Some(&dir.path().join("control-plane.log")),
    )
    .expect("control plane starts");
    let cp = ControlPlane {
        route: format!("http://127.0.0.1:{cp_port}"),
        admin: format!("http://127.0.0.1:{admin_port}"),
        token,
    };
    let http = client();

    // Joins with the engine's capacity; its KV events reach the index.
    eventually(
        "decode-0 registered with its scraped capacity",
        WAIT,
        || async {
            workers(&http, &cp).await.first().is_some_and(|w| {
                w["info"]["worker_id"] == "decode-0"
                    && w["info"]["kv_capacity_blocks"].as_u64().unwrap_or(0) > 0
            })
        },
    )
    .await;
    let metrics = get_text(&http, &format!("{}/metrics", cp.route))
        .await
        .unwrap_or_default();
    assert!(
        !metrics.contains("reason=\"model_mismatch\"} 1"),
        "the engine serves the pool file's model: {metrics}"
    );
    admin_listener_guards_the_worker_list(&http, &cp).await;
    let body = json!({
        "model": "qwen3",
        "messages": [{"role": "user", "content": "Pools are declared. ".repeat(60)}],
        "max_tokens": 2,
    });
    let answer = http
        .post(format!("http://127.0.0.1:{}/v1/chat/completions", sim.http))
        .json(&body)
        .send()
        .await
        .expect("chat");
    assert!(answer.status().is_success());
    eventually("the prompt's blocks indexed", WAIT, || async {
        cached_blocks(&http, &cp).await.unwrap_or(0) > 0
    })
    .await;
    let indexed = cached_blocks(&http, &cp).await.unwrap_or(0);

    // Frozen: out of the pools and the index. Thawed: back, the index rebuilt by replay.
    worker.freeze(Duration::from_secs(5)).expect("SIGSTOP");
    eventually("a frozen worker leaves the pools", WAIT, || async {
        workers(&http, &cp).await.is_empty()
    })
    .await;
    worker
        .signal(switchyard_support::Signal::Cont)
        .expect("SIGCONT");
    eventually(
        "the thawed worker is back with its blocks",
        WAIT,
        || async { cached_blocks(&http, &cp).await == Some(indexed) },
    )
    .await;

    // A broken file keeps the last good pools, counted.
    let errors_before = reloads(&http, &cp, "error").await;
    write(&pools, "models: [ { name: qwen3, block_size: 0 } ]\n");
    eventually("a bad reload is counted", WAIT, || async {
        reloads(&http, &cp, "error").await > errors_before
    })
    .await;
    assert_eq!(
        workers(&http, &cp).await.len(),
        1,
        "the last good pools stay"
    );
    // A file that goes missing is one bad reload, not one per tick.
    std::fs::remove_file(&pools).expect("remove the pool file");
    let errors_before = reloads(&http, &cp, "error").await;
    eventually("a missing file is counted", WAIT, || async {
        reloads(&http, &cp, "error").await > errors_before
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        reloads(&http, &cp, "error").await,
        errors_before + 1.0,
        "counted once while it stays missing"
    );
    assert_eq!(
        workers(&http, &cp).await.len(),
        1,
        "the last good pools stay"
    );

    // Removed from the file: gone. Added back: in again.
    write(&pools, &pool_file(&sim, false));
    eventually("a removed worker leaves", WAIT, || async {
        workers(&http, &cp).await.is_empty()
    })
    .await;
    write(&pools, &pool_file(&sim, true));
    eventually("a re-added worker joins with its blocks", WAIT, || async {
        cached_blocks(&http, &cp).await == Some(indexed)
    })
    .await;

    // Restarted faster than its health checks notice (here they allow 10 s), a quiet new
    // engine sends no KV event that would show it: its PUB socket's reconnection does, and
    // the old engine's blocks leave the index while the worker stays in the pools.
    write(&pools, &pool_file_with(&sim, true, 50));
    let reloads_ok = reloads(&http, &cp, "ok").await;
    eventually("the long health window is in force", WAIT, || async {
        reloads(&http, &cp, "ok").await > reloads_ok
    })
    .await;
    // New health settings restart the worker's task: it rejoins with its blocks.
    eventually("the worker is back with its blocks", WAIT, || async {
        cached_blocks(&http, &cp).await == Some(indexed)
    })
    .await;
    worker
        .signal(switchyard_support::Signal::Kill)
        .expect("SIGKILL");
    worker.stop(Duration::from_secs(1));
    // The new engine serves under another name than the pool file's (a changed
    // --served-model-name): its metrics say so, and the control plane says it once.
    let mut worker = sim_worker(&artifacts, &sim, &dir, "sim-worker-2.log", "Qwen/Qwen3-32B");
    eventually(
        "the restarted engine's empty cache replaces the old one's blocks",
        WAIT,
        || async { cached_blocks(&http, &cp).await == Some(0) },
    )
    .await;
    let metrics = get_text(&http, &format!("{}/metrics", cp.route))
        .await
        .unwrap_or_default();
    let reconnected: f64 = metrics
        .lines()
        .filter(|l| l.contains("reason=\"kv_reconnected\""))
        .map(|l| prom_sum(l, "switchyard_declared_worker_events_total"))
        .sum();
    assert!(reconnected >= 1.0, "{metrics}");
    let declared_events = |metrics: &str, reason: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.contains(&format!("reason=\"{reason}\"")))
            .map(|l| prom_sum(l, "switchyard_declared_worker_events_total"))
            .sum()
    };
    eventually("the other served model name is noticed", WAIT, || async {
        let metrics = get_text(&http, &format!("{}/metrics", cp.route))
            .await
            .unwrap_or_default();
        declared_events(&metrics, "model_mismatch") == 1.0
    })
    .await;
    assert_eq!(workers(&http, &cp).await.len(), 1, "never withdrawn");

    // A declared worker that never answers (an address typo) is in no list: it is counted
    // and warned once, after `unhealthy_after` failed polls.
    let nobody = free_port();
    let with_typo = format!(
        "{}      - id: decode-9\n        role: decode\n        address: 127.0.0.1:{nobody}\n        engine: vllm\n        kv_events: tcp://127.0.0.1:{}\n",
        pool_file(&sim, true),
        free_port()
    );
    write(&pools, &with_typo);
    eventually("a worker that never came up is counted", WAIT, || async {
        let metrics = get_text(&http, &format!("{}/metrics", cp.route))
            .await
            .unwrap_or_default();
        metrics
            .lines()
            .filter(|l| l.contains("reason=\"never_healthy\""))
            .map(|l| prom_sum(l, "switchyard_declared_worker_events_total"))
            .sum::<f64>()
            >= 1.0
    })
    .await;
    worker.stop(Duration::from_secs(3));
}

/// A simulated worker on vLLM's wire at `sim`'s ports.
/// A simulated worker on vLLM's wire at `sim`'s ports, serving `model` (the pool file's is
/// `qwen3`).
fn sim_worker(
    artifacts: &Artifacts,
    sim: &Ports,
    dir: &TempDir,
    log: &str,
    model: &str,
) -> Process {
    Process::spawn(
        "sim-worker",
        &artifacts.sim_worker,
        &[
            "--wire".into(),
            "vllm".into(),
            "--model-name".into(),
            model.into(),
            "--worker".into(),
            format!("decode:decode-0@127.0.0.1:{}", sim.http),
            "--kv-events-endpoint".into(),
            format!("tcp://127.0.0.1:{}", sim.events),
            "--kv-replay-endpoint".into(),
            format!("tcp://127.0.0.1:{}", sim.replay),
            "--model-dir".into(),
            artifacts.model_dir.to_string_lossy().into_owned(),
        ],
        Some(&dir.path().join(log)),
    )
    .expect("sim worker starts")
}
