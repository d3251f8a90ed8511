//! The disaggregated path end to end: real Envoy with the filter, nats-server, the control
//! plane in `conditional` mode with its default `isl_bounding` policy, and simulated prefill
//! and decode workers (simulated: a GB200 performance model, no GPU).
//!
//! - A cold long prompt (> 2048 tokens) goes prefill -> decode: the prefill worker the verdict
//!   named holds the KV (`override_host` honoured by `dispatch_http_call`), the decode worker
//!   pulls it (its `cached_tokens` equals the prompt), tokens stream chunk by chunk; the same
//!   for a body uploaded chunked.
//! - The conversation's next turn (few new tokens) bypasses to the same decode worker.
//! - Lifecycle reports free the control plane's predicted load promptly.
//! - When no decode worker can take a request (here: the decode-busy guard at 0, so every
//!   decode worker counts as full), the prefill worker serves it whole: the verdict is `agg`
//!   (`agg:decode_pool_full`), the filter sends it to the prefill cluster, and it streams from
//!   a prefill worker.
//!
//! Bad input and prefill failures are in `e2e_disagg_failures.rs`. Needs `cargo build -p
//! switchyard-filter --target wasm32-wasip1 --profile wasm && cargo build --workspace --bins`
//! first (the tests build nothing).

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};
use switchyard_e2e::probe::{
    assert_streamed, assistant_text, disagg_stack, filter_stat as stat, known_workers, long_prompt,
    post_chunked, prefill_addresses, sse_usage, streamed_chat as chat, usage, wait_until_idle,
    worker_metric as metric, PREFILL_HEADER,
};
use switchyard_e2e::{
    client, envoy_stats, post_observed, DESTINATION_RESPONSE_HEADER, WORKER_HEADER,
};
use switchyard_protocol::route::ROUTE_HEADER;
use switchyard_stack::Component;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_prompts_disaggregate_and_next_turns_bypass_to_the_same_worker() {
    let mut stack = disagg_stack(&[]).await;
    let http = client();
    let workers = known_workers(&stack, &http)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let address_of = |id: &str| workers.get(id).cloned().unwrap_or_default();
    let id_of = |address: &str| {
        workers
            .iter()
            .find(|(_, a)| a.as_str() == address)
            .map(|(id, _)| id.clone())
            .unwrap_or_default()
    };
    let url = format!("{}/v1/chat/completions", stack.gateway_url());
    let prefill_addresses = prefill_addresses(&stack);

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
    let response = post_chunked(
        &http,
        &url,
        chunked.to_string().into_bytes(),
        REQUEST_TIMEOUT,
    )
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
        wait_until_idle(&stack, &http)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
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
    wait_until_idle(&stack, &http)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
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

    // (4) A full decode pool: the prefill worker keeps the request and decodes it itself.
    let config_url = format!("{}/v1/config", stack.control_plane_admin_url());
    let put = |patch: Value| {
        http.put(&config_url)
            .json(&patch)
            .bearer_auth(stack.control_plane_admin_token())
            .send()
    };
    let answer = put(json!({"decode_busy_threshold": 0.0}))
        .await
        .expect("PUT /v1/config");
    assert!(answer.status().is_success(), "{answer:?}");
    let messages = json!([{"role": "user", "content": long_prompt("lighthouse lenses")}]);
    let response = post_observed(&http, &url, &chat(messages, 12), &[], REQUEST_TIMEOUT)
        .await
        .expect("request on a full decode pool");
    assert_streamed(&response);
    assert_eq!(
        response.header(ROUTE_HEADER),
        "agg",
        "{:?}",
        response.headers
    );
    let worker = response.header(WORKER_HEADER).to_string();
    assert!(worker.starts_with("prefill-"), "served by {worker}");
    assert!(
        prefill_addresses.contains(&response.header(DESTINATION_RESPONSE_HEADER).to_string()),
        "{:?}",
        response.headers
    );
    assert_eq!(response.header(PREFILL_HEADER), "");
    let answer = put(json!({"decode_busy_threshold": null}))
        .await
        .expect("PUT /v1/config");
    assert!(answer.status().is_success(), "{answer:?}");
    wait_until_idle(&stack, &http)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let stats = envoy_stats(&http, &stack.admin_url()).await.expect("stats");
    assert_eq!(stat(&stats, "routed.agg"), 1);

    // (5) No decode worker at all (the pool is down): the prefill pool serves requests whole
    // rather than no one. Until the control plane has seen the workers go, a request fails
    // open to the emptied decode cluster; once it has, each is served.
    stack.stop_component(Component::Workers);
    let messages =
        json!([{"role": "user", "content": "A question while the decode pool is down."}]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let response = loop {
        let response = post_observed(
            &http,
            &url,
            &chat(messages.clone(), 4),
            &[],
            REQUEST_TIMEOUT,
        )
        .await
        .expect("request without a decode pool");
        if response.header(ROUTE_HEADER) == "agg" || tokio::time::Instant::now() > deadline {
            break response;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(response.status, 200, "{}", response.body());
    assert_eq!(
        response.header(ROUTE_HEADER),
        "agg",
        "{:?}",
        response.headers
    );
    let worker = response.header(WORKER_HEADER).to_string();
    assert!(worker.starts_with("prefill-"), "served by {worker}");
    assert_streamed(&response);
}
