//! The walking skeleton end to end: a client request through real Envoy and the Switchyard
//! filter reaches the worker the control plane chose, streams back chunk by chunk, survives a
//! slow or dead control plane (fail open), and a client cannot pick the upstream itself.
//!
//! Needs `cargo build -p switchyard-filter --target wasm32-wasip1 --profile wasm && cargo
//! build --workspace --bins` first (the tests build nothing).

use std::collections::HashMap;
use std::time::Duration;

use switchyard_e2e::probe::{self, known_workers};
use switchyard_e2e::{
    chat_body, client, envoy_stats, post_observed, post_raw_observed, start_stack, Component,
    Observed, Signal, DESTINATION_RESPONSE_HEADER, WORKER_HEADER,
};
use switchyard_protocol::route::{DESTINATION_HEADER, ROUTE_HEADER};
use switchyard_stack::{Stack, StackBuilder};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Requests sent while the control plane is gone.
const FAIL_OPEN_REQUESTS: u64 = 12;
const ROUTED_MODES: [&str; 3] = ["bypass", "disagg", "agg"];

/// Waits (bounded) until the control plane lists every worker of the stack.
async fn all_workers(stack: &Stack, http: &reqwest::Client) -> HashMap<String, String> {
    known_workers(stack, http)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Asserts that `response` was routed and served by the worker the control plane chose (its
/// destination header names that worker's address); returns the destination.
#[track_caller]
fn assert_served_by_the_chosen_worker(
    response: &Observed,
    workers: &HashMap<String, String>,
    context: &str,
) -> String {
    let route = response.header(ROUTE_HEADER);
    assert!(
        ROUTED_MODES.contains(&route),
        "{context}: expected a routed request, got {ROUTE_HEADER}: {route:?}"
    );
    let destination = response.header(DESTINATION_RESPONSE_HEADER).to_string();
    let worker = response.header(WORKER_HEADER);
    assert_eq!(
        workers.get(worker),
        Some(&destination),
        "{context}: served by {worker} but the control plane chose {destination}; workers: {workers:?}"
    );
    destination
}

fn assert_complete_stream(response: &Observed) {
    assert_eq!(response.status, 200, "body: {}", response.body());
    let data = response.sse_data();
    assert_eq!(
        data.last().map(String::as_str),
        Some("[DONE]"),
        "stream must end with [DONE]: {data:?}"
    );
    assert!(
        !response.header(WORKER_HEADER).is_empty(),
        "worker header missing: {:?}",
        response.headers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_to_the_chosen_worker_streams_and_ignores_a_forged_destination() {
    let stack = start_stack(StackBuilder::new().decode_workers(2)).await;
    let http = client();
    let workers = all_workers(&stack, &http).await;
    let url = format!("{}/v1/chat/completions", stack.gateway_url());
    let prompt = "Explain in a few sentences why a KV cache makes multi-turn chat cheaper.";
    // (e) Started first, as it waits out the gateway's 10 s header timeout: a client that
    // never finishes its headers gets an OpenAI-style 408, not a plain-text one after 5 min.
    let gateway = stack
        .gateway_url()
        .trim_start_matches("http://")
        .to_string();
    let stalled = tokio::spawn(raw_exchange(
        gateway.clone(),
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: appli".to_vec(),
    ));

    // (a) The request lands on the worker the control plane named, and streams. The client's
    // request id reaches the worker (the simulated worker names its completion after it).
    let request_id = "e2e-skeleton-stream-1";
    let response = post_observed(
        &http,
        &url,
        &chat_body(prompt, 24, true),
        &[("x-request-id", request_id)],
        REQUEST_TIMEOUT,
    )
    .await
    .expect("streamed request");
    assert_complete_stream(&response);
    assert_served_by_the_chosen_worker(&response, &workers, "the streamed request");
    let data = response.sse_data();
    assert!(data.len() >= 4, "expected several SSE events, got {data:?}");
    let arrivals = response.event_arrivals();
    assert!(
        arrivals.len() >= 3,
        "SSE events arrived in {} network read(s): the response was buffered, not streamed",
        arrivals.len()
    );
    assert!(
        response.body().contains(&format!("chatcmpl-{request_id}")),
        "the worker did not see the client's x-request-id: {}",
        response.body()
    );
    assert!(
        arrivals.last() > arrivals.first(),
        "events must arrive at distinct times: {arrivals:?}"
    );

    // (b) A request without a body is refused as the engine would refuse it (it failed open,
    // counted as an outage), under a usable request id like any other: the filter replaced
    // the client's (a space is no id the workers and logs can carry) and answers with it.
    let bodiless = post_raw_observed(
        &http,
        &url,
        Vec::new(),
        &[("x-request-id", "has space")],
        REQUEST_TIMEOUT,
    )
    .await
    .expect("bodiless request");
    assert_eq!(bodiless.status, 400, "{}", bodiless.body());
    assert_eq!(bodiless.header(ROUTE_HEADER), "rejected;reason=empty_body");
    assert!(bodiless.body().contains("no body"), "{}", bodiless.body());
    let seen = bodiless.header("x-request-id");
    assert!(seen.starts_with("switchyard-"), "the client got {seen:?}");

    // (c) A client-supplied destination naming a worker is stripped: each request lands where
    // the control plane says, never where the client asked. The control plane never sees the
    // forged header, so its choices do not depend on it; forging in the pattern A A B B ...
    // differs from any sticky or alternating choice at least once.
    let mut addresses: Vec<&String> = workers.values().collect();
    addresses.sort();
    let mut forged_differed = 0;
    for attempt in 0..8 {
        let forged = addresses[(attempt / 2) % addresses.len()].clone();
        let headers = [
            (DESTINATION_HEADER, forged.as_str()),
            (ROUTE_HEADER, "forged"),
            ("x-switchyard-api", "completions"),
        ];
        let response = post_observed(
            &http,
            &url,
            &chat_body(prompt, 4, true),
            &headers,
            REQUEST_TIMEOUT,
        )
        .await
        .expect("request with forged headers");
        assert_complete_stream(&response);
        let destination = assert_served_by_the_chosen_worker(
            &response,
            &workers,
            &format!("attempt {attempt}, client forged {forged}"),
        );
        if destination != forged {
            forged_differed += 1;
        }
    }
    assert!(
        forged_differed > 0,
        "the control plane picked the forged worker every time; the test proved nothing"
    );

    // Requests the filter does not route pass untouched and unannotated.
    let models = http
        .get(format!("{}/v1/models", stack.gateway_url()))
        .send()
        .await
        .expect("GET /v1/models through Envoy");
    assert_eq!(models.status().as_u16(), 200);
    assert!(
        models.headers().get(ROUTE_HEADER).is_none(),
        "{:?}",
        models.headers()
    );

    let stats = envoy_stats(&http, &stack.admin_url())
        .await
        .expect("envoy stats");
    let stripped = stats
        .get("wasmcustom.switchyard.stripped_headers_total")
        .copied()
        .unwrap_or(0);
    assert!(
        stripped >= 24,
        "3 forged headers x 8 requests must be stripped, stat says {stripped}"
    );
    assert_eq!(
        stats.get("wasmcustom.switchyard.fail_open_total").copied(),
        Some(0),
        "nothing fails open"
    );
    assert_eq!(
        stats
            .get("wasmcustom.switchyard.rejected.empty_body")
            .copied(),
        Some(1),
        "the bodiless request is counted as refused"
    );

    // A body that is not JSON is not sent to the control plane or a worker: the gateway
    // answers the client's mistake itself, and it is not a fail-open.
    let malformed = post_raw_observed(
        &http,
        &url,
        b"{\"model\": \"qwen3\", ".to_vec(),
        &[],
        REQUEST_TIMEOUT,
    )
    .await
    .expect("malformed request");
    assert_eq!(malformed.header(ROUTE_HEADER), "rejected;reason=not_json");
    assert_eq!(malformed.status, 400, "{}", malformed.body());
    assert!(
        malformed.header(WORKER_HEADER).is_empty(),
        "no worker saw it: {:?}",
        malformed.headers
    );
    let stats = envoy_stats(&http, &stack.admin_url())
        .await
        .expect("envoy stats");
    assert_eq!(
        stats.get("wasmcustom.switchyard.rejected.not_json"),
        Some(&1)
    );
    assert_eq!(
        stats.get("wasmcustom.switchyard.fail_open_total"),
        Some(&0),
        "the malformed body is no fail-open"
    );

    // A good body sent as a form (`curl -d`'s content-type), as text, or with no content-type:
    // vLLM refuses each unread, and so does the gateway, on its headers.
    let good = chat_body(prompt, 2, false).to_string();
    for content_type in [
        Some("application/x-www-form-urlencoded"),
        Some("text/plain"),
        None,
    ] {
        let mut request = http.post(&url).body(good.clone()).timeout(REQUEST_TIMEOUT);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let response = request
            .send()
            .await
            .expect("a request without JSON's content-type");
        assert_eq!(response.status(), 400, "{content_type:?}");
        let headers = response.headers().clone();
        assert_eq!(
            headers.get(ROUTE_HEADER).and_then(|v| v.to_str().ok()),
            Some("rejected;reason=not_json_content_type")
        );
        assert!(headers.get(WORKER_HEADER).is_none(), "no worker saw it");
        let text = response.text().await.unwrap_or_default();
        assert!(text.contains("only 'application/json'"), "{text}");
    }
    // Its parameters are its own: a charset is fine.
    let served = http
        .post(&url)
        .header("content-type", "Application/JSON; charset=utf-8")
        .body(good)
        .timeout(REQUEST_TIMEOUT)
        .send()
        .await
        .expect("a JSON request");
    assert_eq!(served.status(), 200);
    let stats = envoy_stats(&http, &stack.admin_url())
        .await
        .expect("envoy stats");
    assert_eq!(
        stats.get("wasmcustom.switchyard.rejected.not_json_content_type"),
        Some(&3)
    );

    // (d) Header values that are not UTF-8 (a Latin-1 `User-Agent`, a request id) are bytes
    // the filter reads as such: once, one such request crashed the VM of its Envoy worker
    // thread. Each goes on a connection of its own, so every worker thread sees some; each is
    // routed under a request id of the filter's, nothing crashes, and a forged destination
    // sent afterwards on any thread is still stripped.
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("an HTTP client");
    let latin1 = reqwest::header::HeaderValue::from_bytes(b"caf\xe9-client/1.0").unwrap();
    for attempt in 0..6 {
        let response = fresh
            .post(&url)
            .header("user-agent", latin1.clone())
            .header("x-request-id", latin1.clone())
            .json(&chat_body(prompt, 2, false))
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .unwrap_or_else(|e| panic!("non-UTF-8 header, attempt {attempt}: {e}"));
        assert_eq!(response.status().as_u16(), 200, "attempt {attempt}");
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        assert!(
            !header(ROUTE_HEADER).is_empty() && !header(ROUTE_HEADER).starts_with("fail-open"),
            "attempt {attempt}: routed, not skipped: {:?}",
            response.headers()
        );
        assert!(
            header("x-request-id").starts_with("switchyard-"),
            "attempt {attempt}: {:?}",
            response.headers()
        );
    }
    for attempt in 0..4 {
        let forged = addresses[attempt % addresses.len()].clone();
        let response = fresh
            .post(&url)
            .header(DESTINATION_HEADER, forged.as_str())
            .json(&chat_body(prompt, 2, false))
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .expect("request after the non-UTF-8 ones");
        assert!(
            response.headers().contains_key(ROUTE_HEADER),
            "attempt {attempt}: the filter still runs: {:?}",
            response.headers()
        );
    }
    let stats = envoy_stats(&http, &stack.admin_url())
        .await
        .expect("envoy stats");
    assert_eq!(
        stats.get("wasm.switchyard.vm_reload_success").copied(),
        Some(0),
        "no filter VM crashed (and was replaced)"
    );

    // (f) An HTTP/1.0 request without a Host header (no default host: a bare 400) is served.
    let body = chat_body(prompt, 2, false).to_string();
    let http10 = raw_exchange(
        gateway,
        format!(
            "POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
    .await;
    assert!(http10.starts_with("HTTP/1.0 200"), "{http10}");
    assert!(http10.contains("x-switchyard-route:"), "{http10}");

    let stalled = stalled.await.expect("the stalled client's task");
    assert!(stalled.starts_with("HTTP/1.1 408"), "{stalled}");
    assert!(
        stalled.contains("content-type: application/json")
            && stalled.contains("RequestTimeoutError"),
        "{stalled}"
    );
}

/// The gateway's whole answer to `request`, sent on a connection of its own (bounded to
/// 30 s), or what went wrong.
async fn raw_exchange(address: String, request: Vec<u8>) -> String {
    let timeout = Duration::from_secs(30);
    match probe::raw_exchange(&address, "/v1/chat/completions", &request, timeout).await {
        Ok((head, body)) => format!("{head}\r\n\r\n{body}"),
        Err(e) => e,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_open_when_the_control_plane_is_frozen_or_gone() {
    let mut stack = start_stack(StackBuilder::new().decode_workers(2).route_timeout_ms(200)).await;
    let http = client();
    let known = all_workers(&stack, &http).await;
    let url = format!("{}/v1/chat/completions", stack.gateway_url());
    let body = chat_body("Say hello.", 8, true);

    let baseline = post_observed(&http, &url, &body, &[], REQUEST_TIMEOUT)
        .await
        .expect("baseline");
    assert_complete_stream(&baseline);
    assert!(
        ROUTED_MODES.contains(&baseline.header(ROUTE_HEADER)),
        "baseline: {:?}",
        baseline.headers
    );

    // Frozen: the kernel still accepts connections, nobody answers -> the route call times out.
    stack
        .freeze(Component::ControlPlane)
        .expect("SIGSTOP the control plane");
    let frozen = post_observed(&http, &url, &body, &[], REQUEST_TIMEOUT).await;
    stack
        .signal(Component::ControlPlane, Signal::Cont)
        .expect("SIGCONT the control plane");
    let frozen = frozen.expect("request while the control plane is frozen");
    assert_complete_stream(&frozen);
    assert_eq!(frozen.header(ROUTE_HEADER), "fail-open;reason=timeout");
    assert_eq!(
        frozen.header(DESTINATION_RESPONSE_HEADER),
        "",
        "a failed-open request names no destination"
    );

    // Gone: connections are refused -> Envoy's fallback load balancer serves every request.
    // This is where stripping matters most: with no verdict to overwrite it, a forged
    // destination that got through would pin every request to the forged worker.
    stack.stop_component(Component::ControlPlane);
    let (forged_id, forged_address) = known.iter().min().expect("a worker");
    let forged = [(DESTINATION_HEADER, forged_address.as_str())];
    let mut served_by = Vec::new();
    for _ in 0..FAIL_OPEN_REQUESTS {
        let response = post_observed(&http, &url, &body, &forged, REQUEST_TIMEOUT)
            .await
            .expect("request without control plane");
        assert_complete_stream(&response);
        assert_eq!(
            response.header(ROUTE_HEADER),
            "fail-open;reason=control_plane_unavailable"
        );
        served_by.push(response.header(WORKER_HEADER).to_string());
    }
    assert!(
        served_by.iter().all(|w| known.contains_key(w)),
        "served by unknown workers: {served_by:?}"
    );
    // The fallback picks between two idle workers at random: all 12 on the forged one has a
    // chance of 1 in 4096 if the header is stripped, and is certain if it is not.
    assert!(
        served_by.iter().any(|w| w != forged_id),
        "every request went to the forged destination {forged_address}: {served_by:?}"
    );

    let stats = envoy_stats(&http, &stack.admin_url())
        .await
        .expect("envoy stats");
    let stat = |name: &str| {
        stats
            .get(&format!("wasmcustom.switchyard.{name}"))
            .copied()
            .unwrap_or(0)
    };
    assert!(
        stat("fail_open_total") > FAIL_OPEN_REQUESTS,
        "stats: fail_open_total={}",
        stat("fail_open_total")
    );
    assert!(stat("fail_open.timeout") >= 1, "stats: {stats:?}");
    assert!(
        stat("fail_open.control_plane_unavailable") >= FAIL_OPEN_REQUESTS,
        "stats: {stats:?}"
    );
}
