//! The TensorRT-LLM and SGLang handoffs end to end, through real Envoy with the filter,
//! nats-server and the control plane in `conditional` mode, with simulated workers speaking
//! each engine's protocol (`--engine`; simulated: the GB200 timing model, no GPU; the wire
//! fields are TensorRT-LLM's and SGLang's, docs/engines.md). vLLM's handoff has its own
//! suites (`e2e_disagg.rs`, `e2e_vllm.rs` against a real vLLM).
//!
//! For each engine: a cold long prompt is disaggregated (the prefill worker the verdict named
//! holds the KV, the decode worker fetches all of it), the conversation's next turn bypasses
//! to the same decode worker, and a dead prefill worker gives the defined outcome:
//! - TensorRT-LLM (sequential legs): the context leg fails before the generation leg leaves,
//!   so the decode worker prefills locally (`fallback;reason=prefill_failed`, a 200).
//! - SGLang (both legs at once): the decode leg is already waiting for KV that will not come
//!   and cannot prefill instead, so the client gets the gateway's 502
//!   (`error;reason=prefill_failed`) at once, not a hang; once the control plane expires the
//!   prefill worker, requests are served aggregated again.
//!
//! And a mixed deployment: one model on vLLM workers, another on TensorRT-LLM workers, behind
//! one gateway; each model's requests run their own engine's handoff.
//!
//! Needs `cargo build -p switchyard-filter --target wasm32-wasip1 --profile wasm && cargo
//! build --workspace --bins` first (the tests build nothing).

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};
use switchyard_e2e::probe::{
    assert_streamed, assistant_text, filter_stat as stat, known_workers, long_prompt,
    prefill_addresses, streamed_chat as chat, usage, wait_until_idle, worker_metric as metric,
    PREFILL_HEADER,
};
use switchyard_e2e::{
    client, envoy_stats, eventually, get_text, index_keeps_heads_only, post_observed, start_stack,
    worker_addresses, DESTINATION_RESPONSE_HEADER, WORKER_HEADER,
};
use switchyard_protocol::route::ROUTE_HEADER;
use switchyard_protocol::worker::Engine;
use switchyard_stack::envoy::{healthy_hosts, model_cluster, PREFILL_CLUSTER};
use switchyard_stack::{
    Artifacts, Component, Profile, ServingMode, Stack, StackBuilder, SIMULATED_MODEL,
};
use switchyard_support::{free_port, Process, TempDir};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(20);

/// Two decode workers and one prefill worker speaking `engine`'s protocol.
fn engine_stack(engine: Engine) -> StackBuilder {
    StackBuilder::new()
        .decode_workers(2)
        .prefill_workers(1)
        .serving_mode(ServingMode::Conditional)
        .engine(engine)
        // Tokenizing a cold 4k-token prompt in a debug build takes tens of milliseconds.
        .route_timeout_ms(3_000)
}

/// A cold long prompt is disaggregated through `prefill` (its only prefill worker), and the
/// conversation's next turn bypasses to the same decode worker. Requests name `model`.
async fn cold_disaggregates_and_next_turn_bypasses(
    stack: &Stack,
    http: &reqwest::Client,
    model: &str,
) {
    let chat = |messages, max_tokens| {
        let mut body = chat(messages, max_tokens);
        body["model"] = model.into();
        body
    };
    let workers = known_workers(stack, http)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let id_of = |address: &str| {
        workers
            .iter()
            .find(|(_, a)| a.as_str() == address)
            .map(|(id, _)| id.clone())
            .unwrap_or_default()
    };
    let url = format!("{}/v1/chat/completions", stack.gateway_url());
    let prefill = prefill_addresses(stack).remove(0);

    let messages = json!([{"role": "user", "content": long_prompt("river ferries")}]);
    let response = post_observed(
        http,
        &url,
        &chat(messages.clone(), 16),
        &[],
        REQUEST_TIMEOUT,
    )
    .await
    .expect("cold request");
    assert_streamed(&response);
    assert_eq!(
        response.header(ROUTE_HEADER),
        "disagg",
        "{:?}",
        response.headers
    );
    assert_eq!(response.header(PREFILL_HEADER), prefill);
    let destination = response.header(DESTINATION_RESPONSE_HEADER).to_string();
    assert_eq!(id_of(&destination), response.header(WORKER_HEADER));
    // The prefill worker held the prompt's KV and the decode worker fetched all of it, in
    // the engine's own protocol (a worker ignores another engine's fields and would have
    // served the legs whole: no hold, no pull).
    assert_eq!(
        metric(http, &prefill, "switchyard_kv_holds_total").await,
        1.0
    );
    assert_eq!(
        metric(http, &prefill, "switchyard_kv_holds_pulled_total").await,
        1.0
    );
    assert_eq!(
        metric(http, &destination, "switchyard_kv_pulls_total").await,
        1.0
    );
    assert_eq!(
        metric(http, &destination, "switchyard_kv_pull_failures_total").await,
        0.0
    );
    let usage = usage(&response);
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap_or(0);
    assert!(prompt_tokens > 2048, "{usage}");
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"].as_u64(),
        Some(prompt_tokens),
        "the decode worker computed none of the prompt: {usage}"
    );

    // The next turn adds a few tokens: bypass, to the worker that holds the conversation.
    wait_until_idle(stack, http)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut next = messages.as_array().cloned().unwrap_or_default();
    next.push(json!({"role": "assistant", "content": assistant_text(&response)}));
    next.push(json!({"role": "user", "content": "And in one sentence?"}));
    let response = post_observed(
        http,
        &url,
        &chat(Value::Array(next), 8),
        &[],
        REQUEST_TIMEOUT,
    )
    .await
    .expect("next turn");
    assert_streamed(&response);
    assert_eq!(
        response.header(ROUTE_HEADER),
        "bypass",
        "{:?}",
        response.headers
    );
    assert_eq!(response.header(DESTINATION_RESPONSE_HEADER), destination);
    assert_eq!(response.header(PREFILL_HEADER), "");
    index_keeps_heads_only(http, &stack.control_plane_url())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let stats = envoy_stats(http, &stack.admin_url()).await.expect("stats");
    assert_eq!(stat(&stats, "prefill.handoffs_total"), 1);
    assert_eq!(stat(&stats, "prefill.failures_total"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trtllm_context_and_generation_legs_then_bypass_then_local_prefill_without_a_context_server(
) {
    // Servers moving KV with the Python transceiver: each leg must carry a
    // `disagg_request_id` (a simulated worker refuses a leg without one 500), which the pool
    // file asks of the model. Without the setting the legs carry none (the mixed-engine test
    // below: a simulated 1.0 server refuses one 400).
    let dir = TempDir::new("trtllm-e2e").expect("scratch");
    let pools = dir.path().join("pools.yaml");
    std::fs::write(
        &pools,
        format!(
            "models:\n  - name: {SIMULATED_MODEL}\n    block_size: 64\n    trtllm_disagg_request_id: true\n"
        ),
    )
    .expect("pool file");
    let mut stack = start_stack(
        engine_stack(Engine::Trtllm)
            .pool_file(pools, Vec::new())
            .worker_args(vec!["--trtllm-disagg-request-id".into(), "required".into()]),
    )
    .await;
    let http = client();
    cold_disaggregates_and_next_turn_bypasses(&stack, &http, SIMULATED_MODEL).await;

    // The context server dies; until its heartbeats expire the verdicts still name it. The
    // context leg fails before the generation leg leaves: local prefill, a 200.
    stack.stop_component(Component::PrefillWorkers);
    let url = format!("{}/v1/chat/completions", stack.gateway_url());
    let messages = json!([{"role": "user", "content": long_prompt("signal boxes")}]);
    let mut body = chat(messages, 8);
    body["model"] = SIMULATED_MODEL.into();
    let response = post_observed(&http, &url, &body, &[], REQUEST_TIMEOUT)
        .await
        .expect("request without a context server");
    assert_streamed(&response);
    assert_eq!(
        response.header(ROUTE_HEADER),
        "fallback;reason=prefill_failed",
        "{:?}",
        response.headers
    );
    assert_eq!(
        usage(&response)["prompt_tokens_details"]["cached_tokens"].as_u64(),
        Some(0),
        "the decode worker prefilled the whole cold prompt"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_legs_at_once_then_bypass_then_a_502_without_a_prefill_server() {
    let mut stack = start_stack(engine_stack(Engine::Sglang)).await;
    let http = client();
    cold_disaggregates_and_next_turn_bypasses(&stack, &http, "qwen3").await;

    // The prefill server dies while the control plane still names it: the decode leg leaves
    // with the prefill leg and waits for KV that never comes. The client gets the gateway's
    // 502 as soon as the prefill leg fails, not a hang.
    stack.stop_component(Component::PrefillWorkers);
    let url = format!("{}/v1/chat/completions", stack.gateway_url());
    let messages = json!([{"role": "user", "content": long_prompt("tram depots")}]);
    let response = post_observed(&http, &url, &chat(messages, 8), &[], REQUEST_TIMEOUT)
        .await
        .expect("request without a prefill server");
    assert_eq!(response.status, 502, "{}", response.body());
    assert_eq!(
        response.header(ROUTE_HEADER),
        "error;reason=prefill_failed",
        "{:?}",
        response.headers
    );
    let error: Value = serde_json::from_str(&response.body()).expect("a JSON error");
    assert_eq!(error["error"]["type"], "prefill_failed", "{error}");
    let took = response.chunks.last().map(|c| c.at).unwrap_or_default();
    assert!(
        took < Duration::from_secs(10),
        "answered when the prefill leg failed, not at a timeout: {took:?}"
    );
    let stats = envoy_stats(&http, &stack.admin_url()).await.expect("stats");
    assert_eq!(stat(&stats, "prefill.lost_total"), 1);

    // Once the control plane expires the prefill server, requests are served aggregated.
    let mut served = None;
    for i in 0..40 {
        let messages = json!([{"role": "user", "content": long_prompt(&format!("quays {i}"))}]);
        let response = post_observed(&http, &url, &chat(messages, 4), &[], REQUEST_TIMEOUT)
            .await
            .expect("request after the prefill server died");
        if response.header(ROUTE_HEADER) == "agg" {
            served = Some(response);
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_streamed(&served.expect("served aggregated within 10 s of the expiry"));
}

/// Model names of the mixed deployment: the stack's own workers serve the default model on
/// vLLM; a second process serves another on TensorRT-LLM.
const VLLM_MODEL: &str = SIMULATED_MODEL;
const TRTLLM_MODEL: &str = "org/trt-model";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_model_and_a_trtllm_model_each_run_their_own_handoff() {
    let artifacts = Artifacts::locate(Profile::Debug).unwrap_or_else(|e| panic!("{e}"));
    let dir = TempDir::new("engines-e2e").expect("scratch");
    let pools = dir.path().join("pools.yaml");
    // Both models declared, their workers self-registering over NATS.
    std::fs::write(
        &pools,
        format!(
            "models:\n  - name: {VLLM_MODEL}\n    block_size: 64\n  - name: {TRTLLM_MODEL}\n    block_size: 64\n"
        ),
    )
    .expect("pool file");
    let stack = start_stack(
        StackBuilder::new()
            .decode_workers(1)
            .prefill_workers(1)
            .serving_mode(ServingMode::Conditional)
            .pool_file(pools, Vec::new())
            .route_timeout_ms(3_000),
    )
    .await;
    let (decode_port, prefill_port) = (free_port(), free_port());
    let trt_args = [
        "--engine".to_string(),
        "trtllm".into(),
        "--model-name".into(),
        TRTLLM_MODEL.into(),
        "--model-dir".into(),
        artifacts.model_dir.to_string_lossy().into_owned(),
        "--worker".into(),
        format!("decode:trt-decode-0@127.0.0.1:{decode_port}"),
        "--worker".into(),
        format!("prefill:trt-prefill-0@127.0.0.1:{prefill_port}"),
        "--nats-url".into(),
        stack.nats_url(),
        "--nats-token-file".into(),
        stack.nats_token_file().to_string_lossy().into_owned(),
        "--registration-secret-file".into(),
        stack
            .registration_secret_file()
            .to_string_lossy()
            .into_owned(),
    ];
    let _trt = Process::spawn(
        "trt-workers",
        &artifacts.sim_worker,
        &trt_args,
        Some(&dir.path().join("trt-workers.log")),
    )
    .expect("TensorRT-LLM workers start");
    let http = client();
    let trt_prefill = format!("127.0.0.1:{prefill_port}");
    eventually(
        "the control plane lists the TensorRT-LLM workers",
        WAIT,
        || async {
            let workers: HashMap<String, String> =
                worker_addresses(&http, &stack).await.unwrap_or_default();
            workers.contains_key("trt-decode-0") && workers.contains_key("trt-prefill-0")
        },
    )
    .await;
    let clusters = format!("{}/clusters", stack.admin_url());
    // Each model's prefill legs go to its own prefill cluster from the first attempt: a
    // request sent before EDS filled it fell back to local prefill (a flake in CI).
    eventually(
        "Envoy's prefill clusters hold both engines' workers",
        WAIT,
        || async {
            let page = get_text(&http, &clusters).await.unwrap_or_default();
            healthy_hosts(&page, PREFILL_CLUSTER).len() == 2
                && [VLLM_MODEL, TRTLLM_MODEL]
                    .iter()
                    .all(|m| healthy_hosts(&page, &model_cluster(PREFILL_CLUSTER, m)).len() == 1)
        },
    )
    .await;

    let url = format!("{}/v1/chat/completions", stack.gateway_url());
    let vllm_prefill = prefill_addresses(&stack).remove(0);
    for (model, prefill) in [(VLLM_MODEL, &vllm_prefill), (TRTLLM_MODEL, &trt_prefill)] {
        let mut body = chat(
            json!([{"role": "user", "content": long_prompt(&format!("{model} archives"))}]),
            8,
        );
        body["model"] = model.into();
        let response = post_observed(&http, &url, &body, &[], REQUEST_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{model}: {e}"));
        assert_streamed(&response);
        assert_eq!(
            response.header(ROUTE_HEADER),
            "disagg",
            "{model}: {:?}",
            response.headers
        );
        assert_eq!(response.header(PREFILL_HEADER), prefill.as_str(), "{model}");
        // The handoff worked, so it spoke the workers' protocol: the other engine's fields
        // would have been ignored (no hold on the prefill worker, no pull on the decode one).
        let decode = response.header(DESTINATION_RESPONSE_HEADER).to_string();
        assert_eq!(
            metric(&http, prefill, "switchyard_kv_holds_pulled_total").await,
            1.0,
            "{model}"
        );
        assert_eq!(
            metric(&http, &decode, "switchyard_kv_pulls_total").await,
            1.0,
            "{model}"
        );
        let usage = usage(&response);
        assert_eq!(
            usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"],
            "{model}: {usage}"
        );
    }
    let stats = envoy_stats(&http, &stack.admin_url()).await.expect("stats");
    assert_eq!(stat(&stats, "prefill.handoffs_total"), 2);
    assert_eq!(stat(&stats, "prefill.no_kv_params_total"), 0);
}
