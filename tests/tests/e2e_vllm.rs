//! Switchyard in front of a real vLLM prefill/decode pair: vLLM 0.32's CPU build serving the
//! tiny local Qwen3 (`scripts/setup-vllm.sh`), NixlConnector moving KV between them on CPU,
//! each engine pinned to its own core. Real Envoy with the filter, nats-server and the
//! control plane with a pool file declaring both engines; vLLM never registers anywhere, so
//! everything Switchyard knows comes from health polls, `/metrics` and the ZMQ KV events.
//!
//! One test, one pair of engines (each takes about 90 s to start), checks in order:
//! 1. a cold long prompt is disaggregated: the prefill engine serves the first leg and the
//!    decode engine pulls the KV over NIXL (its `local_compute` prompt tokens do not grow),
//!    and the streamed answer equals the same request served by one engine alone;
//! 2. the conversation's next turn bypasses to the same decode engine, which reports the
//!    cached prefix;
//! 3. the control plane's cached-token estimate for a prompt is what vLLM then reports;
//! 4. with the prefill engine killed, requests are still served (local prefill);
//! 5. a restarted control plane rebuilds its index from vLLM's replay.
//!
//! Ignored by default: `scripts/test.sh` runs it after the rest of the suite, since idle
//! NIXL engines busy-poll the machine's cores (`cargo test -p switchyard-e2e --test e2e_vllm
//! -- --ignored`).

use std::time::Duration;

use serde_json::{json, Value};
use switchyard_e2e::probe::{assistant_text, usage, PREFILL_HEADER};
use switchyard_e2e::vllm::{
    EngineSpec, VllmEngine, VllmInstall, BLOCK_SIZE, MAX_MODEL_LEN, MODEL_NAME,
};
use switchyard_e2e::{
    admin_get_json, client, eventually, eventually_ok, index_keeps_heads_only, post_observed,
    prom_sum, start_stack, Observed,
};
use switchyard_e2e::{worker_metrics, DESTINATION_RESPONSE_HEADER};
use switchyard_protocol::route::ROUTE_HEADER;
use switchyard_protocol::worker::{WorkerId, WorkerRole};
use switchyard_stack::{Stack, StackBuilder, WorkerSpec};
use switchyard_support::{free_listen_port, TempDir};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// The warm-up handoff's legs: past the engines' 120 s KV lease, which a stalled first
/// handshake waits out.
const WARM_UP_TIMEOUT: Duration = Duration::from_secs(180);
/// Cold prompts above this many uncached tokens disaggregate; the next turns stay below.
const THRESHOLD: u32 = 512;
/// vLLM's prompt-token counter by where the KV came from.
const BY_SOURCE: &str = "vllm:prompt_tokens_by_source_total";

/// About 1,500 tokens unique to `topic`.
fn cold_prompt(topic: &str) -> String {
    let mut text = format!("Read these notes about {topic} and summarise them.\n");
    for i in 0..110u32 {
        text.push_str(&format!(
            "Note {i} on {topic}: item {i} comes after item {}.\n",
            i.saturating_sub(1)
        ));
    }
    text
}

fn chat(messages: &Value, max_tokens: u32) -> Value {
    json!({
        "model": MODEL_NAME,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

fn engine(name: &str, kv_role: Option<&'static str>, core: u32) -> EngineSpec {
    EngineSpec {
        name: name.into(),
        // Below the ephemeral range: vLLM binds these seconds after they are chosen.
        port: free_listen_port(),
        kv_events_port: free_listen_port(),
        kv_replay_port: free_listen_port(),
        kv_role,
        nixl_port: free_listen_port(),
        core,
        num_blocks: 256,
    }
}

fn pool_file(prefill: &VllmEngine, decode: &VllmEngine) -> String {
    let worker = |id: &str, role: &str, e: &VllmEngine| {
        format!(
            "      - id: {id}\n        role: {role}\n        address: {}\n        engine: vllm\n        kv_events_listen: tcp://127.0.0.1:{}\n        kv_replay: tcp://127.0.0.1:{}\n",
            e.address(),
            e.spec().kv_events_port,
            e.spec().kv_replay_port
        )
    };
    format!(
        // A CPU engine computing a whole prompt's logprobs (step 3b) on a loaded machine
        // answered /health late twice in a row and was withdrawn, its index with it: give
        // it the defaults' three misses and 2 s each (a killed engine is refused at once).
        "health: {{ interval_ms: 500, timeout_ms: 2000, unhealthy_after: 3 }}\nmetrics: {{ interval_ms: 500 }}\nmodels:\n  - name: {MODEL_NAME}\n    block_size: {BLOCK_SIZE}\n    workers:\n{}{}",
        worker("prefill-0", "prefill", prefill),
        worker("decode-0", "decode", decode)
    )
}

async fn source_tokens(http: &reqwest::Client, address: &str, source: &str) -> f64 {
    let text = worker_metrics(http, address)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    text.lines()
        .filter(|l| l.starts_with(BY_SOURCE) && l.contains(&format!("source=\"{source}\"")))
        .map(|l| prom_sum(l, BY_SOURCE))
        .sum()
}

async fn post(http: &reqwest::Client, url: &str, body: &Value) -> Observed {
    let response = post_observed(http, url, body, &[], REQUEST_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(response.status, 200, "{url}: {}", response.body());
    response
}

fn cached_tokens(response: &Observed) -> u64 {
    usage(response)["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

/// The verdict the control plane would give `body` now (a dry run: nothing booked or
/// predicted, so the requests the test then sends are routed as without it).
async fn verdict(http: &reqwest::Client, control_plane: &str, body: &Value) -> Value {
    let response = http
        .post(format!("{control_plane}/v1/route?dry_run=true"))
        .header("x-switchyard-api", "chat")
        .json(body)
        .send()
        .await
        .expect("route call");
    assert!(
        response.status().is_success(),
        "route: {}",
        response.status()
    );
    response.json().await.expect("verdict JSON")
}

/// One handoff straight between the engines, before anything is measured: a decode engine's
/// first NIXL handshake after start-up once took two minutes on a loaded machine (vLLM's
/// own, with no gateway involved; the prefill engine's lease ran out meanwhile), and the
/// steps below test routing, not that. Its outcome is not checked.
async fn warm_up_handoff(http: &reqwest::Client, prefill: &VllmEngine, decode: &VllmEngine) {
    let messages = json!([{"role": "user", "content": cold_prompt("warming up")}]);
    let mut leg = chat(&messages, 1);
    leg["stream"] = json!(false);
    if let Some(fields) = leg.as_object_mut() {
        fields.remove("stream_options");
    }
    leg["kv_transfer_params"] = json!({
        "do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
        "remote_block_ids": null, "remote_host": null, "remote_port": null,
    });
    let url = |e: &VllmEngine| format!("http://{}/v1/chat/completions", e.address());
    let Ok(answer) = post_observed(http, &url(prefill), &leg, &[], WARM_UP_TIMEOUT).await else {
        return;
    };
    let params = serde_json::from_str::<Value>(&answer.body())
        .ok()
        .map(|a| a["kv_transfer_params"].clone())
        .unwrap_or(Value::Null);
    let mut decode_leg = chat(&messages, 2);
    decode_leg["kv_transfer_params"] = params;
    let _ = post_observed(http, &url(decode), &decode_leg, &[], WARM_UP_TIMEOUT).await;
}

/// Blocks the control plane's index holds for `worker`.
async fn indexed_blocks(http: &reqwest::Client, stack: &Stack, worker: &str) -> u64 {
    let workers = admin_get_json(http, stack, "/v1/workers")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    workers["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|w| w["info"]["worker_id"] == worker)
        .and_then(|w| w["cached_blocks"].as_u64())
        .unwrap_or(0)
}

/// vLLM reports a prompt's cached tokens in whole blocks and always computes the prompt's
/// last token itself: a fully cached prompt reports one block less.
fn vllm_would_report(estimate: u64, prompt_tokens: u64) -> u64 {
    if estimate >= prompt_tokens {
        estimate.saturating_sub(u64::from(BLOCK_SIZE))
    } else {
        estimate
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "starts real vLLM engines: scripts/test.sh runs it after the rest"]
async fn a_real_vllm_prefill_decode_pair_behind_switchyard() {
    let install = VllmInstall::locate();
    let scratch = TempDir::new("vllm-e2e").expect("scratch dir");
    let http = client();
    let mut prefill = VllmEngine::start(
        &install,
        engine("prefill", Some("kv_producer"), 0),
        scratch.path(),
    );
    let mut decode = VllmEngine::start(
        &install,
        engine("decode", Some("kv_consumer"), 1),
        scratch.path(),
    );
    prefill.wait_healthy(&http).await;
    decode.wait_healthy(&http).await;
    warm_up_handoff(&http, &prefill, &decode).await;

    let pools = scratch.path().join("pools.yaml");
    std::fs::write(&pools, pool_file(&prefill, &decode)).expect("pool file");
    let declared = vec![
        WorkerSpec {
            id: WorkerId("prefill-0".into()),
            role: WorkerRole::Prefill,
            address: prefill.address(),
        },
        WorkerSpec {
            id: WorkerId("decode-0".into()),
            role: WorkerRole::Decode,
            address: decode.address(),
        },
    ];
    let mut stack = start_stack(
        StackBuilder::new()
            .decode_workers(0)
            .pool_file(pools, declared)
            .max_model_len(MAX_MODEL_LEN)
            .conditional_disagg_config(format!(
                r#"{{"policy":"isl_bounding","eff_isl_threshold":{THRESHOLD}}}"#
            ))
            .route_timeout_ms(1_000)
            .filter_setting("prefill_timeout_ms", 60_000u64)
            .ready_timeout(Duration::from_secs(120)),
    )
    .await;
    let gateway = format!("{}/v1/chat/completions", stack.gateway_url());
    let control_plane = stack.control_plane_url();

    // 1. A cold long prompt: prefill engine, then NIXL, then decode. With `min_tokens`,
    // which vLLM refuses above the prefill leg's one token unless the leg drops it (every
    // such request fell back to local prefill).
    let first = json!([{"role": "user", "content": cold_prompt("lighthouses")}]);
    let mut first_body = chat(&first, 16);
    first_body["min_tokens"] = json!(2);
    let alone = post(
        &http,
        &format!("http://{}/v1/chat/completions", prefill.address()),
        &first_body,
    )
    .await;
    let local_before = source_tokens(&http, &decode.address(), "local_compute").await;
    let pulled_before = source_tokens(&http, &decode.address(), "external_kv_transfer").await;
    // The warm-up's blocks are indexed already (the stack is ready once the engines' caches
    // are replayed): the next turns wait for more than these.
    let indexed_before_turn1 = indexed_blocks(&http, &stack, "decode-0").await;
    let turn1 = post(&http, &gateway, &first_body).await;
    assert!(
        turn1.header(ROUTE_HEADER).starts_with("disagg"),
        "a cold {}-token prompt disaggregates: {:?}",
        usage(&turn1)["prompt_tokens"],
        turn1.headers
    );
    assert_eq!(turn1.header(PREFILL_HEADER), prefill.address());
    assert_eq!(turn1.header(DESTINATION_RESPONSE_HEADER), decode.address());
    let prompt_tokens = usage(&turn1)["prompt_tokens"].as_f64().unwrap_or(0.0);
    let local = source_tokens(&http, &decode.address(), "local_compute").await - local_before;
    let pulled =
        source_tokens(&http, &decode.address(), "external_kv_transfer").await - pulled_before;
    assert!(
        local < f64::from(BLOCK_SIZE) && pulled >= prompt_tokens - f64::from(BLOCK_SIZE),
        "the decode engine pulled the prompt's KV ({pulled} tokens) instead of computing it ({local} of {prompt_tokens})"
    );
    let answer = assistant_text(&turn1);
    assert!(!answer.is_empty());
    assert_eq!(
        answer,
        assistant_text(&alone),
        "greedy output equals one engine's"
    );

    // 1b. A cold request the engine refuses for a sampling parameter the gateway leaves to
    // it: the prefill engine refuses the leg, the decode engine the request, and the client
    // gets vLLM's 400, counted as a refused leg, not as a prefill worker's failure.
    let mut refused = chat(
        &json!([{"role": "user", "content": cold_prompt("canals")}]),
        4,
    );
    refused["temperature"] = json!(3.0);
    let refusal = post_observed(&http, &gateway, &refused, &[], REQUEST_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(refusal.status, 400, "{}", refusal.body());
    assert_eq!(
        refusal.header(ROUTE_HEADER),
        "fallback;reason=prefill_refused",
        "{:?}",
        refusal.headers
    );
    assert!(refusal.body().contains("temperature"), "{}", refusal.body());

    // 2. The next turn: few new tokens, so it bypasses to the engine holding the prefix.
    let mut second = first.as_array().cloned().unwrap_or_default();
    second.push(json!({"role": "assistant", "content": answer}));
    second.push(json!({"role": "user", "content": "And which item comes last?"}));
    let second = Value::Array(second);
    wait_for_index(&http, &stack, "decode-0", indexed_before_turn1).await;
    let indexed_before_turn2 = indexed_blocks(&http, &stack, "decode-0").await;
    let turn2 = post(&http, &gateway, &chat(&second, 8)).await;
    assert!(
        turn2.header(ROUTE_HEADER).starts_with("bypass"),
        "{:?}",
        turn2.headers
    );
    assert_eq!(turn2.header(DESTINATION_RESPONSE_HEADER), decode.address());
    assert!(cached_tokens(&turn2) > 0, "usage: {}", usage(&turn2));

    // 3. The index agrees with the engine, to the block.
    let mut third = second.as_array().cloned().unwrap_or_default();
    third.push(json!({"role": "assistant", "content": assistant_text(&turn2)}));
    third.push(json!({"role": "user", "content": "Thanks."}));
    let third = chat(&Value::Array(third), 4);
    wait_for_index(&http, &stack, "decode-0", indexed_before_turn2).await;
    let estimate = verdict(&http, &control_plane, &third).await;
    let direct = post(
        &http,
        &format!("http://{}/v1/chat/completions", decode.address()),
        &third,
    )
    .await;
    let isl = usage(&direct)["prompt_tokens"].as_u64().unwrap_or(0);
    assert_eq!(
        estimate["isl"].as_u64(),
        Some(isl),
        "same tokens: {estimate}"
    );
    assert_eq!(
        vllm_would_report(estimate["cached_tokens"].as_u64().unwrap_or(0), isl),
        cached_tokens(&direct),
        "estimate {estimate} vs vLLM's usage {}",
        usage(&direct)
    );

    // 3b. The same prompt asking for its logprobs: vLLM reads no cached prefix for it, so
    // the verdict counts none and keeps it off the prefill engine, and vLLM computes it all.
    let mut with_logprobs = third.clone();
    with_logprobs["prompt_logprobs"] = json!(0);
    let estimate = verdict(&http, &control_plane, &with_logprobs).await;
    assert_eq!(
        (&estimate["cached_tokens"], &estimate["reason"]),
        (&json!(0), &json!("bypass:prompt_logprobs")),
        "{estimate}"
    );
    let through = post(&http, &gateway, &with_logprobs).await;
    assert_eq!(through.header(PREFILL_HEADER), "", "no prefill leg");
    assert_eq!(cached_tokens(&through), 0, "usage: {}", usage(&through));
    assert_eq!(usage(&through)["prompt_tokens"].as_u64(), Some(isl));

    // 5. A restarted control plane rebuilds the index from vLLM's replay (before 4, which
    // takes the prefill engine away).
    let before = indexed_blocks(&http, &stack, "decode-0").await;
    assert!(before > 0);
    // vLLM's events name each chain's parent by its block hash, which is its engine id:
    // the index keeps only the heads of stored chains in its hash table, not every hash.
    index_keeps_heads_only(&http, &stack.control_plane_url())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // The direct request just stored the third turn's blocks too.
    let estimate = verdict(&http, &control_plane, &third).await;
    stack
        .restart_control_plane()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eventually(
        &format!("the index had {before} blocks for decode-0 and gets them back"),
        Duration::from_secs(30),
        || async { indexed_blocks(&http, &stack, "decode-0").await >= before },
    )
    .await;
    let again = verdict(&http, &control_plane, &third).await;
    assert_eq!(again["cached_tokens"], estimate["cached_tokens"]);
    // vLLM's replay names every chain's parent too.
    let control_plane_url = stack.control_plane_url();
    eventually_ok(
        "the rebuilt index keeps heads only",
        Duration::from_secs(5),
        || index_keeps_heads_only(&http, &control_plane_url),
    )
    .await;

    // 4. Without the prefill engine, a cold prompt is still served (local prefill).
    drop(prefill);
    let cold = json!([{"role": "user", "content": cold_prompt("glaciers")}]);
    let served = post(&http, &gateway, &chat(&cold, 8)).await;
    assert!(!assistant_text(&served).is_empty());
    assert_eq!(served.header(DESTINATION_RESPONSE_HEADER), decode.address());
    stack.shutdown();
    drop(decode);
}

/// Waits until the index holds more than `above` blocks for `worker`: the last request's KV
/// events reached it (they are asynchronous).
async fn wait_for_index(http: &reqwest::Client, stack: &Stack, worker: &str, above: u64) {
    eventually(
        &format!("KV events from {worker} reach the index (more than {above} blocks)"),
        Duration::from_secs(10),
        || async { indexed_blocks(http, stack, worker).await > above },
    )
    .await;
}
