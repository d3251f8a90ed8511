//! Several models behind one gateway, through real Envoy and the filter: a pool file declares
//! two models, each served by its own simulated worker on vLLM's wire.
//!
//! - Each model's requests reach its own worker, and only it.
//! - A model the gateway does not serve is answered OpenAI's 404 `model_not_found` by the
//!   gateway (no worker sees it), counted in the control plane's metrics, and its name never
//!   becomes a metric label.
//! - A disaggregated request's prefill retry stays in its model: alpha's prefill worker
//!   refuses every other request (a simulated 503), and each retry, which names no worker,
//!   goes to alpha's own prefill cluster, never to beta's prefill worker.
//! - With the control plane gone, requests fail open and still reach their own model's
//!   worker (the filter names the model in `x-switchyard-model`, an Envoy route per model
//!   sends it to that model's decode cluster).
//! - A model with no reachable worker is answered Envoy's 503 as an OpenAI-style JSON error
//!   (the gateway's `local_reply_config`), before and after the control plane drops the worker.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use switchyard_e2e::probe::{filter_stat, long_prompt, worker_metric};
use switchyard_e2e::{
    client, envoy_stats, eventually, get_text, post_observed, prom_sum, start_stack, WORKER_HEADER,
};
use switchyard_protocol::route::{REJECT_HEADER, ROUTE_HEADER};
use switchyard_protocol::worker::{WorkerId, WorkerRole};
use switchyard_stack::envoy::{healthy_hosts, model_cluster, DECODE_CLUSTER, PREFILL_CLUSTER};
use switchyard_stack::{Artifacts, Component, Profile, StackBuilder, WorkerSpec};
use switchyard_support::{free_port, Process, Signal, TempDir};

const WAIT: Duration = Duration::from_secs(20);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);
const MODELS: [&str; 2] = ["org/alpha-1.0", "beta"];

/// One simulated vLLM-wire worker and its ports.
struct Sim {
    id: String,
    role: WorkerRole,
    http: u16,
    events: u16,
    replay: u16,
    process: Process,
}

impl Sim {
    fn start(
        id: &str,
        role: WorkerRole,
        extra_args: &[&str],
        model_dir: &str,
        dir: &Path,
        artifacts: &Artifacts,
    ) -> Sim {
        let (http, events, replay) = (free_port(), free_port(), free_port());
        let mut args = vec![
            "--wire".into(),
            "vllm".into(),
            "--worker".into(),
            format!("{}:{id}@127.0.0.1:{http}", role.as_str()),
            "--kv-events-endpoint".into(),
            format!("tcp://127.0.0.1:{events}"),
            "--kv-replay-endpoint".into(),
            format!("tcp://127.0.0.1:{replay}"),
            "--model-dir".into(),
            model_dir.into(),
        ];
        args.extend(extra_args.iter().map(|a| a.to_string()));
        let process = Process::spawn(
            id,
            &artifacts.sim_worker,
            &args,
            Some(&dir.join(format!("{id}.log"))),
        )
        .expect("sim worker starts");
        Sim {
            id: id.into(),
            role,
            http,
            events,
            replay,
            process,
        }
    }

    fn address(&self) -> String {
        format!("127.0.0.1:{}", self.http)
    }

    fn declared(&self) -> String {
        format!(
            "      - id: {}\n        role: {}\n        address: {}\n        engine: vllm\n        kv_events: tcp://127.0.0.1:{}\n        kv_replay: tcp://127.0.0.1:{}\n",
            self.id,
            self.role.as_str(),
            self.address(),
            self.events,
            self.replay
        )
    }

    fn spec(&self) -> WorkerSpec {
        WorkerSpec {
            id: WorkerId(self.id.clone()),
            role: self.role,
            address: self.address(),
        }
    }
}

/// A prompt of ~4,000 tokens no worker holds: above the default policy's threshold, so it is
/// disaggregated.
fn cold_chat(model: &str, salt: usize) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": long_prompt(&format!("{model} topic {salt}"))}],
        "max_tokens": 2,
    })
}

fn chat(model: &str, salt: usize) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": format!("Question {salt} for {model}. ").repeat(20)}],
        "max_tokens": 2,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_models_are_served_by_their_own_workers_and_an_unknown_one_is_404() {
    let artifacts = Artifacts::locate(Profile::Debug).unwrap_or_else(|e| panic!("{e}"));
    let dir = TempDir::new("models-e2e").expect("scratch");
    let model_dir = artifacts.model_dir.to_string_lossy().into_owned();
    let start = |id, role, extra_args: &[&str]| {
        Sim::start(id, role, extra_args, &model_dir, dir.path(), &artifacts)
    };
    let alpha = start("alpha-0", WorkerRole::Decode, &[]);
    let beta = start("beta-0", WorkerRole::Decode, &[]);
    // Alpha's prefill worker refuses its 1st, 3rd, 5th, ... request with a 503.
    let alpha_prefill = start(
        "alpha-p0",
        WorkerRole::Prefill,
        &["--unavailable-every", "2"],
    );
    let beta_prefill = start("beta-p0", WorkerRole::Prefill, &[]);
    let pools = dir.path().join("pools.yaml");
    // beta names its tokenizer folder; alpha takes --model-dir's.
    std::fs::write(
        &pools,
        format!(
            "health: {{ interval_ms: 200, timeout_ms: 200, unhealthy_after: 2 }}\nmetrics: {{ interval_ms: 200 }}\nmodels:\n  - name: {}\n    block_size: 64\n    workers:\n{}  - name: {}\n    model_dir: {model_dir}\n    block_size: 64\n    workers:\n{}",
            MODELS[0],
            alpha.declared() + &alpha_prefill.declared(),
            MODELS[1],
            beta.declared() + &beta_prefill.declared()
        ),
    )
    .expect("pool file");
    let declared = [&alpha, &alpha_prefill, &beta, &beta_prefill];
    let mut stack = start_stack(
        StackBuilder::new()
            .decode_workers(0)
            .pool_file(pools, declared.iter().map(|sim| sim.spec()).collect())
            .route_timeout_ms(1_000),
    )
    .await;
    let http = client();
    let gateway = format!("{}/v1/chat/completions", stack.gateway_url());
    let cp = stack.control_plane_url();

    // Each model's clusters have its workers (the fail-open leg and the prefill retries
    // below need them).
    let clusters = format!("{}/clusters", stack.admin_url());
    let per_model = [
        (MODELS[0], DECODE_CLUSTER, &alpha),
        (MODELS[0], PREFILL_CLUSTER, &alpha_prefill),
        (MODELS[1], DECODE_CLUSTER, &beta),
        (MODELS[1], PREFILL_CLUSTER, &beta_prefill),
    ];
    for (model, role_cluster, sim) in per_model {
        let cluster = model_cluster(role_cluster, model);
        eventually(&format!("{cluster} holds {}", sim.id), WAIT, || async {
            let page = get_text(&http, &clusters).await.unwrap_or_default();
            healthy_hosts(&page, &cluster) == [sim.address()]
        })
        .await;
    }

    // Routed: each model to its own worker, never the other's (alpha's prompts are cached
    // on alpha's worker, beta's on beta's, and neither draws the other model's requests).
    for i in 0..6 {
        for (model, sim) in MODELS.iter().zip([&alpha, &beta]) {
            let answer = post_observed(&http, &gateway, &chat(model, i % 2), &[], REQUEST_TIMEOUT)
                .await
                .unwrap_or_else(|e| panic!("{model}: {e}"));
            assert_eq!(answer.status, 200, "{model}: {}", answer.body());
            assert_eq!(answer.header(WORKER_HEADER), sim.id, "{model} request {i}");
            assert!(
                !answer.header(ROUTE_HEADER).starts_with("fail-open"),
                "{model} routed by a verdict: {:?}",
                answer.headers
            );
        }
    }

    // Unknown: the gateway's own OpenAI 404.
    let unknown = post_observed(&http, &gateway, &chat("gamma", 0), &[], REQUEST_TIMEOUT)
        .await
        .expect("unknown model");
    assert_eq!(unknown.status, 404, "{}", unknown.body());
    assert_eq!(
        serde_json::from_str::<Value>(&unknown.body()).expect("JSON body"),
        json!({"error": {
            "message": "The model `gamma` does not exist.",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }})
    );
    assert!(
        unknown.header(WORKER_HEADER).is_empty(),
        "no worker saw it: {:?}",
        unknown.headers
    );
    assert!(
        unknown.header(ROUTE_HEADER).contains("unknown_model"),
        "{:?}",
        unknown.headers
    );
    assert!(
        unknown.header(REJECT_HEADER).is_empty(),
        "internal header not relayed"
    );

    // Counted, with the model label bounded by the declared models.
    let metrics = get_text(&http, &format!("{cp}/metrics"))
        .await
        .expect("metrics");
    let refused: f64 = metrics
        .lines()
        .filter(|l| l.contains("code=\"unknown_model\""))
        .map(|l| prom_sum(l, "switchyard_route_bad_requests_total"))
        .sum();
    assert_eq!(refused, 1.0, "{metrics}");
    for model in MODELS {
        let decided: f64 = metrics
            .lines()
            .filter(|l| l.contains(&format!("model=\"{model}\"")))
            .map(|l| prom_sum(l, "switchyard_route_model_decisions_total"))
            .sum();
        assert_eq!(decided, 6.0, "{model}: {metrics}");
    }
    assert!(!metrics.contains("gamma"), "an unknown name is no label");

    // Prefill retries stay in the model. Every cold alpha prompt is disaggregated to alpha's
    // prefill worker, which refuses the first attempt; the retry names no worker, so only
    // the cluster decides where it goes: alpha's own prefill cluster holds alpha's worker
    // alone (which serves it), while the shared one would also offer beta's.
    const COLD: usize = 6;
    let served = |address: String| {
        let http = http.clone();
        async move { worker_metric(&http, &address, "switchyard_requests_total").await }
    };
    let alpha_prefill_before = served(alpha_prefill.address()).await;
    let beta_prefill_before = served(beta_prefill.address()).await;
    let retries_before = filter_stat(
        &envoy_stats(&http, &stack.admin_url()).await.expect("stats"),
        "prefill.retries_total",
    );
    for i in 0..COLD {
        let answer = post_observed(
            &http,
            &gateway,
            &cold_chat(MODELS[0], i),
            &[],
            REQUEST_TIMEOUT,
        )
        .await
        .unwrap_or_else(|e| panic!("cold {i}: {e}"));
        assert_eq!(answer.status, 200, "cold {i}: {}", answer.body());
        assert_eq!(
            answer.header(ROUTE_HEADER),
            "disagg",
            "cold {i}: {:?}",
            answer.headers
        );
        assert_eq!(answer.header(WORKER_HEADER), alpha.id, "cold {i}");
    }
    let retries = filter_stat(
        &envoy_stats(&http, &stack.admin_url()).await.expect("stats"),
        "prefill.retries_total",
    ) - retries_before;
    assert_eq!(
        retries, COLD as u64,
        "every first attempt was refused and retried once"
    );
    assert_eq!(
        served(alpha_prefill.address()).await - alpha_prefill_before,
        COLD as f64,
        "alpha's prefill worker served every retry"
    );
    assert_eq!(
        served(beta_prefill.address()).await,
        beta_prefill_before,
        "no alpha prefill reached beta's prefill worker"
    );

    // The control plane gone: every request fails open, and stays on its model's workers.
    stack.stop_component(Component::ControlPlane);
    for i in 0..6 {
        for (model, sim) in MODELS.iter().zip([&alpha, &beta]) {
            let answer = post_observed(&http, &gateway, &chat(model, i), &[], REQUEST_TIMEOUT)
                .await
                .unwrap_or_else(|e| panic!("{model} failing open: {e}"));
            assert_eq!(answer.status, 200, "{model}: {}", answer.body());
            assert!(
                answer.header(ROUTE_HEADER).starts_with("fail-open"),
                "{model}: {:?}",
                answer.headers
            );
            assert_eq!(
                answer.header(WORKER_HEADER),
                sim.id,
                "{model} request {i} failed open to its own model's worker"
            );
        }
    }
    stack.shutdown();
}

/// A routed request whose worker is gone (killed, or draining in a rolling restart) is retried
/// by Envoy among its own model's workers only: the verdict names the model, and the model's
/// routes send the request to its own cluster. Before, routed requests went to the shared
/// cluster, and a dead alpha worker's requests were answered by beta's worker with a 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_request_whose_worker_died_is_never_served_by_another_models_worker() {
    let artifacts = Artifacts::locate(Profile::Debug).unwrap_or_else(|e| panic!("{e}"));
    let dir = TempDir::new("models-dead-e2e").expect("scratch");
    let model_dir = artifacts.model_dir.to_string_lossy().into_owned();
    let start = |id, role| Sim::start(id, role, &[], &model_dir, dir.path(), &artifacts);
    let alpha = start("alpha-0", WorkerRole::Decode);
    let beta = start("beta-0", WorkerRole::Decode);
    let pools = dir.path().join("pools.yaml");
    // Health polls a second apart: the control plane routes to alpha's worker for a while
    // after it dies, as it does for a worker whose death no poll has seen yet.
    std::fs::write(
        &pools,
        format!(
            "health: {{ interval_ms: 1000, timeout_ms: 500, unhealthy_after: 3 }}\nmodels:\n  - name: {}\n    block_size: 64\n    workers:\n{}  - name: {}\n    block_size: 64\n    workers:\n{}",
            MODELS[0],
            alpha.declared(),
            MODELS[1],
            beta.declared()
        ),
    )
    .expect("pool file");
    let stack = start_stack(
        StackBuilder::new()
            .decode_workers(0)
            .pool_file(pools, vec![alpha.spec(), beta.spec()])
            .route_timeout_ms(1_000),
    )
    .await;
    let http = client();
    let gateway = format!("{}/v1/chat/completions", stack.gateway_url());
    let clusters = format!("{}/clusters", stack.admin_url());
    for (model, sim) in MODELS.iter().zip([&alpha, &beta]) {
        let cluster = model_cluster(DECODE_CLUSTER, model);
        eventually(&format!("{cluster} holds {}", sim.id), WAIT, || async {
            let page = get_text(&http, &clusters).await.unwrap_or_default();
            healthy_hosts(&page, &cluster) == [sim.address()]
        })
        .await;
    }
    let first = post_observed(&http, &gateway, &chat(MODELS[0], 0), &[], REQUEST_TIMEOUT)
        .await
        .expect("alpha, alive");
    assert_eq!(first.header(WORKER_HEADER), alpha.id);

    alpha.process.signal(Signal::Kill).expect("SIGKILL alpha-0");
    let beta_before = worker_metric(&http, &beta.address(), "switchyard_requests_total").await;
    let mut routed = 0;
    for i in 1..4 {
        let answer = post_observed(&http, &gateway, &chat(MODELS[0], i), &[], REQUEST_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("alpha request {i}: {e}"));
        assert_ne!(
            answer.header(WORKER_HEADER),
            beta.id,
            "alpha request {i} served by beta's worker: {:?}",
            answer.headers
        );
        assert_ne!(answer.status, 200, "alpha request {i}: {}", answer.body());
        assert_gateway_error(&answer, 503);
        if !answer.header(ROUTE_HEADER).starts_with("fail-open") {
            routed += 1;
        }
    }
    assert!(routed > 0, "no alpha request was routed to the dead worker");
    assert_eq!(
        worker_metric(&http, &beta.address(), "switchyard_requests_total").await,
        beta_before,
        "beta's worker saw none of alpha's requests"
    );
    // Once the control plane has dropped alpha's worker, alpha's requests fail open to a
    // cluster with no host: still an OpenAI error a client can parse, not Envoy's plain text.
    let deadline = tokio::time::Instant::now() + WAIT;
    for salt in 10.. {
        let answer = post_observed(
            &http,
            &gateway,
            &chat(MODELS[0], salt),
            &[],
            REQUEST_TIMEOUT,
        )
        .await
        .expect("alpha, no worker");
        assert_gateway_error(&answer, 503);
        // Envoy's cluster may still hold the dead host (EDS not refreshed yet: `URX,UF`) or
        // none (`UH`): a JSON error either way, checked above.
        if answer.header(ROUTE_HEADER) == "fail-open;reason=no_workers" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "alpha's requests never failed open for want of a worker: {} {}",
            answer.header(ROUTE_HEADER),
            answer.body()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Beta is served as before.
    let answer = post_observed(&http, &gateway, &chat(MODELS[1], 9), &[], REQUEST_TIMEOUT)
        .await
        .expect("beta");
    assert_eq!(answer.status, 200, "{}", answer.body());
    assert_eq!(answer.header(WORKER_HEADER), beta.id);
}

/// An answer Envoy gave itself for want of a reachable worker: an OpenAI-style JSON error with
/// the status and the request's id, as the gateway's `local_reply_config` renders it.
fn assert_gateway_error(answer: &switchyard_e2e::Observed, status: u16) {
    assert_eq!(answer.status, status, "{}", answer.body());
    assert_eq!(
        answer.header("content-type"),
        "application/json",
        "{:?}",
        answer.headers
    );
    let body: Value = serde_json::from_str(&answer.body())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", answer.body()));
    let error = &body["error"];
    assert_eq!(error["code"], status, "{body}");
    assert_eq!(error["type"], "ServiceUnavailableError", "{body}");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("the gateway reached no worker")),
        "{body}"
    );
    assert!(
        !answer.header("x-request-id").is_empty(),
        "{:?}",
        answer.headers
    );
}
