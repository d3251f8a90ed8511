//! Several models behind one gateway, through real Envoy and the filter: a pool file declares
//! two models, each served by its own simulated worker on vLLM's wire.
//!
//! - Each model's requests reach its own worker, and only it.
//! - A model the gateway does not serve is answered OpenAI's 404 `model_not_found` by the
//!   gateway (no worker sees it), counted in the control plane's metrics, and its name never
//!   becomes a metric label.
//! - With the control plane gone, requests fail open and still reach their own model's
//!   worker (the filter names the model in `x-switchyard-model`, an Envoy route per model
//!   sends it to that model's decode cluster).

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use switchyard_e2e::{
    client, eventually, get_text, post_observed, prom_sum, start_stack, WORKER_HEADER,
};
use switchyard_protocol::route::{REJECT_HEADER, ROUTE_HEADER};
use switchyard_protocol::worker::{WorkerId, WorkerRole};
use switchyard_stack::envoy::{healthy_hosts, model_cluster, DECODE_CLUSTER};
use switchyard_stack::{Artifacts, Component, Profile, StackBuilder, WorkerSpec};
use switchyard_support::{free_port, Process, TempDir};

const WAIT: Duration = Duration::from_secs(20);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);
const MODELS: [&str; 2] = ["org/alpha-1.0", "beta"];

/// One simulated vLLM-wire worker and its ports.
struct Sim {
    id: String,
    http: u16,
    events: u16,
    replay: u16,
    _process: Process,
}

impl Sim {
    fn start(id: &str, model_dir: &str, dir: &Path, artifacts: &Artifacts) -> Sim {
        let (http, events, replay) = (free_port(), free_port(), free_port());
        let process = Process::spawn(
            id,
            &artifacts.sim_worker,
            &[
                "--wire".into(),
                "vllm".into(),
                "--worker".into(),
                format!("decode:{id}@127.0.0.1:{http}"),
                "--kv-events-endpoint".into(),
                format!("tcp://127.0.0.1:{events}"),
                "--kv-replay-endpoint".into(),
                format!("tcp://127.0.0.1:{replay}"),
                "--model-dir".into(),
                model_dir.into(),
            ],
            Some(&dir.join(format!("{id}.log"))),
        )
        .expect("sim worker starts");
        Sim {
            id: id.into(),
            http,
            events,
            replay,
            _process: process,
        }
    }

    fn address(&self) -> String {
        format!("127.0.0.1:{}", self.http)
    }

    fn declared(&self) -> String {
        format!(
            "      - id: {}\n        role: decode\n        address: {}\n        engine: vllm\n        kv_events: tcp://127.0.0.1:{}\n        kv_replay: tcp://127.0.0.1:{}\n",
            self.id,
            self.address(),
            self.events,
            self.replay
        )
    }

    fn spec(&self) -> WorkerSpec {
        WorkerSpec {
            id: WorkerId(self.id.clone()),
            role: WorkerRole::Decode,
            address: self.address(),
        }
    }
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
    let alpha = Sim::start("alpha-0", &model_dir, dir.path(), &artifacts);
    let beta = Sim::start("beta-0", &model_dir, dir.path(), &artifacts);
    let pools = dir.path().join("pools.yaml");
    // beta names its tokenizer folder; alpha takes --model-dir's.
    std::fs::write(
        &pools,
        format!(
            "health: {{ interval_ms: 200, timeout_ms: 200, unhealthy_after: 2 }}\nmetrics: {{ interval_ms: 200 }}\nmodels:\n  - name: {}\n    block_size: 64\n    workers:\n{}  - name: {}\n    model_dir: {model_dir}\n    block_size: 64\n    workers:\n{}",
            MODELS[0],
            alpha.declared(),
            MODELS[1],
            beta.declared()
        ),
    )
    .expect("pool file");
    let mut stack = start_stack(
        StackBuilder::new()
            .decode_workers(0)
            .pool_file(pools, vec![alpha.spec(), beta.spec()])
            .route_timeout_ms(1_000),
    )
    .await;
    let http = client();
    let gateway = format!("{}/v1/chat/completions", stack.gateway_url());
    let cp = stack.control_plane_url();

    // Each model's cluster has its worker (the fail-open leg below needs them).
    let clusters = format!("{}/clusters", stack.admin_url());
    for (model, sim) in MODELS.iter().zip([&alpha, &beta]) {
        let cluster = model_cluster(DECODE_CLUSTER, model);
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
