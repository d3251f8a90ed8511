//! The disaggregated path end to end: real Envoy with the filter, nats-server, the control
//! plane in `conditional` mode with its default `isl_bounding` policy, and simulated prefill
//! and decode workers (simulated: a GB200 performance model, no GPU).
//!
//! - A cold long prompt (> 2048 tokens) goes prefill -> decode: the prefill worker the verdict
//!   named holds the KV (`override_host` honoured by `dispatch_http_call`), the decode worker
//!   pulls it (its `cached_tokens` equals the prompt), tokens stream chunk by chunk.
//! - The conversation's next turn (few new tokens) bypasses to the same decode worker.
//! - Lifecycle reports free the control plane's predicted load promptly.
//! - Client-supplied `kv_transfer_params` are removed; invalid bodies pass through; an
//!   oversized body gets the filter's 413.
//! - With the prefill workers killed, requests still succeed through local prefill.
//!
//! Needs `cargo build -p switchyard-filter --target wasm32-wasip1 --profile wasm && cargo
//! build --workspace --bins` first (the tests build nothing).

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};
use switchyard_e2e::{
    client, envoy_stats, post_observed, post_raw_observed, prom_sum, start_stack, worker_addresses,
    worker_metrics, Component, Observed, Signal, DESTINATION_RESPONSE_HEADER, WORKER_HEADER,
};
use switchyard_protocol::route::ROUTE_HEADER;
use switchyard_stack::{ServingMode, Stack, StackBuilder};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
const PREFILL_HEADER: &str = "x-switchyard-prefill";
/// The filter's body limit in this stack (Envoy buffers up to 16 MiB).
const MAX_BODY_BYTES: u64 = 1 << 20;
/// The filter's prefill-leg timeout in this stack: far above a simulated 4k-token prefill
/// (tens of milliseconds), short enough for the hung-prefill case to finish quickly.
const PREFILL_TIMEOUT_MS: u64 = 2_000;

/// About 4,000 tokens of text unique to `topic`: cold everywhere, above the 2048-token
/// `eff_isl_threshold`.
fn long_prompt(topic: &str) -> String {
    let mut text = format!("Read these notes about {topic} and summarise them.\n");
    for i in 0..320u32 {
        text.push_str(&format!(
            "Note {i} on {topic}: item {i} follows item {} and precedes {}.\n",
            i.saturating_sub(1),
            i + 1
        ));
    }
    text
}

fn chat(messages: Value, max_tokens: u32) -> Value {
    json!({
        "model": "qwen3",
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

/// The `usage` object of a streamed response (its last chunk with one).
fn usage(response: &Observed) -> Value {
    sse_usage(&response.body())
}

/// The last non-null `usage` of an SSE body.
fn sse_usage(body: &str) -> Value {
    switchyard_e2e::sse_data(body)
        .iter()
        .rev()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v.get("usage").cloned())
        .find(|u| !u.is_null())
        .unwrap_or(Value::Null)
}

/// POSTs `body` with chunked transfer encoding, 8 KiB at a time with 20 ms between pieces,
/// so Envoy sees several data frames.
async fn post_chunked(
    http: &reqwest::Client,
    url: &str,
    body: Vec<u8>,
) -> Result<reqwest::Response, reqwest::Error> {
    let pieces: Vec<Vec<u8>> = body.chunks(8 << 10).map(<[u8]>::to_vec).collect();
    let stream = futures::stream::unfold(pieces.into_iter(), |mut pieces| async move {
        let piece = pieces.next()?;
        tokio::time::sleep(Duration::from_millis(20)).await;
        Some((Ok::<_, std::io::Error>(piece), pieces))
    });
    let request = http
        .post(url)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(stream));
    tokio::time::timeout(REQUEST_TIMEOUT, request.send())
        .await
        .expect("chunked request sent in time")
}

/// The assistant text of a streamed chat response.
fn assistant_text(response: &Observed) -> String {
    response
        .sse_data()
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

fn assert_streamed(response: &Observed) {
    assert_eq!(response.status, 200, "body: {}", response.body());
    let data = response.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let arrivals = response.event_arrivals();
    assert!(
        arrivals.len() >= 3 && arrivals.last() > arrivals.first(),
        "tokens must stream in several reads at distinct times: {arrivals:?}"
    );
}

async fn metric(http: &reqwest::Client, address: &str, name: &str) -> f64 {
    let text = worker_metrics(http, address)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    prom_sum(&text, name)
}

async fn known_workers(stack: &Stack, http: &reqwest::Client) -> HashMap<String, String> {
    for _ in 0..100 {
        if let Ok(found) = worker_addresses(http, &stack.control_plane_url()).await {
            if stack.workers().iter().all(|w| found.contains_key(&w.id.0)) {
                return found;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the control plane never listed every worker");
}

/// `GET /v1/workers` as worker id -> (in_flight + active KV blocks, cached_blocks).
async fn worker_state(stack: &Stack, http: &reqwest::Client) -> HashMap<String, (u64, u64)> {
    let url = format!("{}/v1/workers", stack.control_plane_url());
    let json: Value = http
        .get(&url)
        .send()
        .await
        .expect("GET /v1/workers")
        .json()
        .await
        .expect("workers JSON");
    json["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| {
            let id = w["info"]["worker_id"].as_str()?.to_string();
            let in_flight = w["in_flight"].as_u64().unwrap_or(0)
                + w["load"]["active_blocks"].as_u64().unwrap_or(0);
            let cached = w["cached_blocks"].as_u64().unwrap_or(0);
            Some((id, (in_flight, cached)))
        })
        .collect()
}

/// Waits (at most 5 s) until no worker has requests in flight or active KV blocks in the
/// control plane's view. The control plane only learns that a request finished from the
/// filter's lifecycle reports (its own expiry is 600 s), so this also checks they arrive.
async fn wait_until_idle(stack: &Stack, http: &reqwest::Client) {
    let mut last = HashMap::new();
    for _ in 0..50 {
        last = worker_state(stack, http).await;
        if last.values().all(|(busy, _)| *busy == 0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("predicted load not freed within 5 s: {last:?}");
}

fn stat(stats: &HashMap<String, u64>, name: &str) -> u64 {
    stats
        .get(&format!("wasmcustom.switchyard.{name}"))
        .copied()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_prompts_disaggregate_next_turns_bypass_and_dead_prefill_falls_back() {
    let mut stack = start_stack(
        StackBuilder::new()
            .decode_workers(2)
            .prefill_workers(2)
            .serving_mode(ServingMode::Conditional)
            // Tokenizing a cold 4k-token prompt in a debug build takes tens of milliseconds.
            .route_timeout_ms(3_000)
            .filter_setting("max_body_bytes", MAX_BODY_BYTES)
            .filter_setting("prefill_timeout_ms", PREFILL_TIMEOUT_MS),
    )
    .await;
    let http = client();
    let workers = known_workers(&stack, &http).await;
    let address_of = |id: &str| workers.get(id).cloned().unwrap_or_default();
    let id_of = |address: &str| {
        workers
            .iter()
            .find(|(_, a)| a.as_str() == address)
            .map(|(id, _)| id.clone())
            .unwrap_or_default()
    };
    let url = format!("{}/v1/chat/completions", stack.gateway_url());
    let prefill_addresses: Vec<String> = stack
        .workers()
        .iter()
        .filter(|w| w.id.0.starts_with("prefill"))
        .map(|w| w.address.clone())
        .collect();

    // (1) Cold long prompts: prefill leg on the named prefill worker, KV pulled by the decode
    // worker, tokens streamed.
    let mut first_turns = Vec::new();
    let topics = [
        "harbour cranes",
        "alpine railways",
        "tidal mills",
        "salt pans",
    ];
    for topic in topics {
        let mut holds_before = HashMap::new();
        for address in &prefill_addresses {
            let holds = metric(&http, address, "switchyard_kv_holds_total").await;
            holds_before.insert(address.clone(), holds);
        }
        let prompt = long_prompt(topic);
        let messages = json!([{"role": "user", "content": prompt}]);
        let response = post_observed(
            &http,
            &url,
            &chat(messages.clone(), 24),
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
        let prefill = response.header(PREFILL_HEADER).to_string();
        assert!(prefill_addresses.contains(&prefill), "prefill {prefill:?}");
        // dispatch_http_call honoured the override: the prefill worker the verdict named, and
        // only it, now holds one more prompt (Envoy's fallback balancer would pick either).
        for address in &prefill_addresses {
            let holds = metric(&http, address, "switchyard_kv_holds_total").await;
            let expected = holds_before[address] + f64::from(u8::from(*address == prefill));
            assert_eq!(
                holds, expected,
                "holds on {address}; the verdict named {prefill}"
            );
        }
        let destination = response.header(DESTINATION_RESPONSE_HEADER).to_string();
        assert_eq!(id_of(&destination), response.header(WORKER_HEADER));
        // The decode worker computed none of the prompt: the KV came from the prefill worker.
        let usage = usage(&response);
        let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap_or(0);
        assert!(
            prompt_tokens > 2048,
            "a cold prompt above the threshold: {usage}"
        );
        assert_eq!(
            usage["prompt_tokens_details"]["cached_tokens"].as_u64(),
            Some(prompt_tokens),
            "the decode worker must have pulled the whole prompt's KV: {usage}"
        );
        first_turns.push((messages, assistant_text(&response), destination));
    }
    // Every hold was generated with one token (`max_tokens: 1`) and pulled.
    let mut holds = 0.0;
    for address in &prefill_addresses {
        let held = metric(&http, address, "switchyard_kv_holds_total").await;
        holds += held;
        assert_eq!(
            metric(&http, address, "switchyard_kv_holds_pulled_total").await,
            held
        );
        assert_eq!(
            metric(&http, address, "vllm:generation_tokens_total").await,
            held,
            "one token per prefill leg on {address}"
        );
    }
    assert_eq!(holds, topics.len() as f64);
    let mut pulls = 0.0;
    for id in ["decode-0", "decode-1"] {
        let address = address_of(id);
        pulls += metric(&http, &address, "switchyard_kv_pulls_total").await;
        assert_eq!(
            metric(&http, &address, "switchyard_kv_pull_failures_total").await,
            0.0
        );
    }
    assert_eq!(pulls, topics.len() as f64);

    // (1b) The same path for a body sent chunked, in pieces with pauses between them: the
    // filter routes on the whole buffered body, and the rewritten body (no content-length to
    // fix) reaches the decode worker intact.
    let chunked = chat(
        json!([{"role": "user", "content": long_prompt("chunked kilns")}]),
        8,
    );
    let response = post_chunked(&http, &url, chunked.to_string().into_bytes())
        .await
        .expect("chunked cold request");
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response
            .headers()
            .get(ROUTE_HEADER)
            .and_then(|v| v.to_str().ok()),
        Some("disagg")
    );
    let text = tokio::time::timeout(REQUEST_TIMEOUT, response.text())
        .await
        .expect("chunked response in time")
        .expect("chunked response body");
    let chunked_usage = sse_usage(&text);
    assert!(chunked_usage["prompt_tokens"].as_u64() > Some(2048));
    assert_eq!(
        chunked_usage["prompt_tokens_details"]["cached_tokens"], chunked_usage["prompt_tokens"],
        "the decode worker pulled the KV of the chunked request: {chunked_usage}"
    );

    // (2) The next turn of each conversation adds a few tokens: bypass to the same worker.
    for (messages, answer, destination) in &first_turns {
        let worker = id_of(destination);
        // The decode worker's KV events (blocks stored after the pull) reach the index, and
        // the previous request's load is gone (lifecycle reports), so the KV-affine choice is
        // not outweighed by load.
        wait_until_idle(&stack, &http).await;
        let mut next = messages.as_array().cloned().unwrap_or_default();
        next.push(json!({"role": "assistant", "content": answer}));
        next.push(json!({"role": "user", "content": "Thanks. Now in one sentence?"}));
        let response = post_observed(
            &http,
            &url,
            &chat(Value::Array(next), 16),
            &[],
            REQUEST_TIMEOUT,
        )
        .await
        .expect("second turn");
        assert_streamed(&response);
        assert_eq!(
            response.header(ROUTE_HEADER),
            "bypass",
            "{:?}",
            response.headers
        );
        assert_eq!(response.header(WORKER_HEADER), worker, "same decode worker");
        assert_eq!(response.header(PREFILL_HEADER), "");
    }

    // (3) Lifecycle reports free the predicted load: every worker's in_flight returns to 0
    // long before the control plane's 600 s expiry would.
    wait_until_idle(&stack, &http).await;
    let stats = envoy_stats(&http, &stack.admin_url()).await.expect("stats");
    let turns = topics.len() as u64;
    // first_token + done for each of the 2 x 4 requests.
    assert!(
        stat(&stats, "lifecycle.reports_sent_total") >= 4 * turns,
        "{stats:?}"
    );
    assert_eq!(stat(&stats, "lifecycle.reports_dropped_total"), 0);
    assert_eq!(
        stat(&stats, "prefill.handoffs_total"),
        turns + 1,
        "+1: the chunked request"
    );
    assert_eq!(stat(&stats, "routed.disagg"), turns + 1);
    assert_eq!(stat(&stats, "routed.bypass"), turns);

    // (4) A client's own kv_transfer_params never reach a worker (else the decode worker
    // would try to pull a hold that does not exist, and count a failure).
    let forged = json!({
        "model": "qwen3",
        "messages": [{"role": "user", "content": "Hi there."}],
        "max_tokens": 4,
        "kv_transfer_params": {"do_remote_prefill": true, "remote_host": "127.0.0.1",
            "remote_port": prefill_addresses[0].rsplit(':').next().unwrap_or("1").parse::<u16>().unwrap_or(1),
            "remote_request_id": "forged", "remote_engine_id": "x", "remote_block_ids": []}
    });
    let response = post_observed(&http, &url, &forged, &[], REQUEST_TIMEOUT)
        .await
        .expect("forged params");
    assert_eq!(response.status, 200, "{}", response.body());
    let mut failures = 0.0;
    for id in ["decode-0", "decode-1"] {
        failures += metric(&http, &address_of(id), "switchyard_kv_pull_failures_total").await;
    }
    assert_eq!(failures, 0.0, "a forged pull was attempted");

    // (5) Invalid bodies pass through to a worker, which answers with its own error; oversized
    // ones get the filter's 413 without reaching anyone.
    let before = envoy_stats(&http, &stack.admin_url()).await.expect("stats");
    for bad in [
        &b"{\"model\": \"qwen3\", "[..],
        br#"{"model":"qwen3"}"#,
        b"[1,2]",
    ] {
        let response = post_raw_observed(&http, &url, bad.to_vec(), &[], REQUEST_TIMEOUT)
            .await
            .expect("invalid body");
        assert_eq!(
            response.status,
            400,
            "the worker's own error: {}",
            response.body()
        );
        assert_eq!(
            response.header(ROUTE_HEADER),
            "pass-through;reason=invalid_body"
        );
        assert!(!response.header(WORKER_HEADER).is_empty());
    }
    let huge = chat(
        json!([{"role": "user", "content": "x".repeat(MAX_BODY_BYTES as usize)}]),
        4,
    );
    let response = post_observed(&http, &url, &huge, &[], REQUEST_TIMEOUT)
        .await
        .expect("oversized");
    assert_eq!(response.status, 413, "{}", response.body());
    let error: Value = serde_json::from_str(&response.body()).expect("JSON error");
    assert_eq!(error["error"]["code"], 413, "{error}");
    let after = envoy_stats(&http, &stack.admin_url()).await.expect("stats");
    assert_eq!(stat(&after, "invalid_body_total"), 3);
    assert_eq!(stat(&after, "oversized_body_total"), 1);
    assert_eq!(stat(&after, "client_kv_params_stripped_total"), 1);
    assert_eq!(
        stat(&after, "route_calls_total"),
        stat(&before, "route_calls_total"),
        "invalid and oversized bodies are not sent to the control plane"
    );

    // (6a) The prefill pool hangs (SIGSTOP): each attempt times out after
    // `prefill_timeout_ms` (Envoy's synthetic 504, retried once), then the decode worker
    // prefills locally. Bounded: two attempts of PREFILL_TIMEOUT_MS.
    stack
        .freeze(Component::PrefillWorkers)
        .expect("SIGSTOP the prefill workers");
    let frozen = post_observed(
        &http,
        &url,
        &chat(
            json!([{"role": "user", "content": long_prompt("glass furnaces")}]),
            8,
        ),
        &[],
        REQUEST_TIMEOUT,
    )
    .await;
    stack
        .signal(Component::PrefillWorkers, Signal::Cont)
        .expect("SIGCONT the prefill workers");
    let frozen = frozen.expect("request while the prefill pool hangs");
    assert_streamed(&frozen);
    assert_eq!(
        frozen.header(ROUTE_HEADER),
        "fallback;reason=prefill_failed",
        "{:?}",
        frozen.headers
    );
    let took = frozen.chunks.last().map(|c| c.at).unwrap_or_default();
    assert!(
        took >= Duration::from_millis(2 * PREFILL_TIMEOUT_MS),
        "two timed-out attempts before the fallback, took {took:?}"
    );

    // (6) The prefill pool dies: the control plane still names it until heartbeats expire,
    // the prefill leg fails (503, retried once), and the decode worker prefills locally.
    stack.stop_component(Component::PrefillWorkers);
    let response = post_observed(
        &http,
        &url,
        &chat(
            json!([{"role": "user", "content": long_prompt("lighthouse optics")}]),
            24,
        ),
        &[],
        REQUEST_TIMEOUT,
    )
    .await
    .expect("request without prefill workers");
    assert_streamed(&response);
    assert_eq!(
        response.header(ROUTE_HEADER),
        "fallback;reason=prefill_failed",
        "{:?}",
        response.headers
    );
    let usage = usage(&response);
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"].as_u64(),
        Some(0),
        "local prefill computes the whole cold prompt: {usage}"
    );
    // Once the control plane expires them, cold prompts are served aggregated; either way
    // every request succeeds.
    for i in 0..4 {
        let response = post_observed(
            &http,
            &url,
            &chat(
                json!([{"role": "user", "content": long_prompt(&format!("canal locks {i}"))}]),
                8,
            ),
            &[],
            REQUEST_TIMEOUT,
        )
        .await
        .expect("request after the prefill pool died");
        assert_streamed(&response);
        let route = response.header(ROUTE_HEADER);
        assert!(
            ["fallback;reason=prefill_failed", "agg"].contains(&route),
            "{route}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let stats = envoy_stats(&http, &stack.admin_url()).await.expect("stats");
    assert!(stat(&stats, "fallback.prefill_failed") >= 1, "{stats:?}");
    assert!(stat(&stats, "prefill.failures_total") >= 1);
    assert!(
        stat(&stats, "prefill.retries_total") >= 1,
        "a 503 is retried"
    );
    assert_eq!(stat(&stats, "fail_open_total"), 0, "{stats:?}");
}
