//! The filter is never the reason a request fails, on the disaggregated path: bad input and
//! a failing prefill pool, end to end on a real stack (Envoy with the filter, nats-server, the
//! control plane in `conditional` mode, simulated prefill and decode workers).
//!
//! - A client's own `kv_transfer_params` never reach a worker.
//! - Bodies that are not JSON objects get the filter's 400 without a route call; a body the
//!   engine would refuse gets the control plane's 400; an oversized body gets the filter's
//!   JSON 413. None is a fail-open.
//! - A hung prefill pool (SIGSTOP) costs two bounded attempts, then local prefill.
//! - A dead prefill pool: local prefill until the control plane expires it, then `agg`.
//!
//! Needs `cargo build -p switchyard-filter --target wasm32-wasip1 --profile wasm && cargo
//! build --workspace --bins` first (the tests build nothing).

use std::time::Duration;

use serde_json::{json, Value};
use switchyard_e2e::probe::{
    assert_streamed, disagg_stack, filter_stat as stat, known_workers, long_prompt, post_chunked,
    prefill_addresses, streamed_chat as chat, usage, worker_metric as metric,
};
use switchyard_e2e::{
    client, envoy_stats, post_observed, post_raw_observed, Component, Signal, WORKER_HEADER,
};
use switchyard_protocol::route::ROUTE_HEADER;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// The filter's body limit in this stack (Envoy buffers up to 16 MiB).
const MAX_BODY_BYTES: u64 = 1 << 20;
/// The filter's prefill-leg timeout in this stack: far above a simulated 4k-token prefill
/// (tens of milliseconds), short enough for the hung-prefill case to finish quickly.
const PREFILL_TIMEOUT_MS: u64 = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_a_failing_prefill_pool_never_fail_a_request() {
    let mut stack = disagg_stack(&[
        ("max_body_bytes", MAX_BODY_BYTES),
        ("prefill_timeout_ms", PREFILL_TIMEOUT_MS),
    ])
    .await;
    let http = client();
    let workers = known_workers(&stack, &http)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let address_of = |id: &str| workers.get(id).cloned().unwrap_or_default();
    let url = format!("{}/v1/chat/completions", stack.gateway_url());
    let prefill_addresses = prefill_addresses(&stack);

    // (1) A client's own kv_transfer_params never reach a worker (else the decode worker
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

    // (2) Bodies the filter cannot screen get its own 400 without reaching a worker: one that
    // does not even start as an object before any route call, a truncated object once the
    // control plane could not parse it (its verdict never vouches for a body it could not
    // read, so the filter screens it). Bodies the engine would refuse get the control plane's
    // 400, relayed as it is; oversized ones get the filter's 413.
    let before = envoy_stats(&http, &stack.admin_url()).await.expect("stats");
    assert_eq!(
        stat(&before, "deferred_screens_total"),
        1,
        "the forged body was screened after its route call"
    );
    for (bad, reason) in [
        (&b"{\"model\": \"qwen3\", "[..], "not_json"),
        (&b"[1,2]"[..], "not_an_object"),
        (&br#"{"model":"qwen3"}"#[..], "invalid_request"),
    ] {
        let response = post_raw_observed(&http, &url, bad.to_vec(), &[], REQUEST_TIMEOUT)
            .await
            .expect("invalid body");
        assert_eq!(response.status, 400, "{}", response.body());
        assert_eq!(
            response.header(ROUTE_HEADER),
            format!("rejected;reason={reason}")
        );
        assert!(
            response.header(WORKER_HEADER).is_empty(),
            "no worker saw it"
        );
        let error: Value = serde_json::from_str(&response.body()).expect("JSON error");
        assert_eq!(error["error"]["code"], 400, "{error}");
    }
    let huge = chat(
        json!([{"role": "user", "content": "x".repeat(MAX_BODY_BYTES as usize)}]),
        4,
    );
    let response = post_observed(
        &http,
        &url,
        &huge,
        &[("x-request-id", "oversized-1")],
        REQUEST_TIMEOUT,
    )
    .await
    .expect("oversized");
    assert_eq!(response.status, 413, "{}", response.body());
    let error: Value = serde_json::from_str(&response.body()).expect("JSON error");
    assert_eq!(error["error"]["code"], 413, "{error}");
    // Refused from its content-length, before the body: still with the client's request id.
    assert_eq!(response.header("x-request-id"), "oversized-1");
    // Uploaded chunked (no content-length to refuse early on): refused once the buffered
    // size passes the limit.
    let response = post_chunked(&http, &url, huge.to_string().into_bytes(), REQUEST_TIMEOUT)
        .await
        .expect("chunked oversized");
    assert_eq!(response.status().as_u16(), 413);
    let error: Value = response.json().await.expect("the filter's JSON 413");
    assert_eq!(error["error"]["code"], 413, "{error}");
    let after = envoy_stats(&http, &stack.admin_url()).await.expect("stats");
    assert_eq!(stat(&after, "rejected.not_json"), 1);
    assert_eq!(stat(&after, "rejected.not_an_object"), 1);
    assert_eq!(stat(&after, "rejected.invalid_request"), 1);
    assert_eq!(stat(&after, "rejected.too_large"), 2);
    assert_eq!(stat(&after, "rejected_total"), 5);
    assert_eq!(stat(&after, "client_steering_stripped_total"), 1);
    assert_eq!(
        stat(&after, "route_calls_total"),
        stat(&before, "route_calls_total") + 2,
        "the array did not go to the control plane"
    );
    assert_eq!(
        stat(&after, "deferred_screens_total"),
        3,
        "bodies with a refusal for a verdict are screened"
    );
    assert_eq!(
        stat(&after, "fail_open_total"),
        0,
        "refusals are not fail-opens"
    );

    // (3) The prefill pool hangs (SIGSTOP): each attempt times out after
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

    // (4) The prefill pool dies: the control plane still names it until heartbeats expire,
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
    assert_eq!(
        stat(&stats, "deferred_screens_total"),
        3,
        "a routed body the verdict vouches for is not screened by the filter"
    );
}
