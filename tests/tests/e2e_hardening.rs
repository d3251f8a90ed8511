//! The hardening bugs, each reproduced as a user or an attacker would on a real stack (Envoy
//! with the filter, nats-server with a token, the control plane, simulated workers), and
//! refused or survived:
//!
//! - a trailing slash (or another spelling of the API path) no longer carries a client's
//!   `kv_transfer_params` to a decode worker, and worker-internal endpoints are not reachable
//!   through the gateway;
//! - a stray NATS publisher can neither connect without the token nor register a worker with
//!   it (the heartbeat is not signed with the registration secret);
//! - requests the engine would refuse cost no prefill and leave no KV held; a prompt beyond
//!   the context is refused at once;
//! - a prefill whose decode leg never comes gives its KV back at once;
//! - four turns of one conversation sent back to back stay on one decode worker;
//! - NATS down for 30 s under streaming load fails no request; a control plane stopped for
//!   longer than the heartbeat window comes back with every worker.
//!
//! Needs `cargo build -p switchyard-filter --target wasm32-wasip1 --profile wasm && cargo
//! build --workspace --bins` first (the tests build nothing).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use switchyard_e2e::probe::{
    assert_streamed, filter_stat as stat, known_workers, long_prompt, raw_chunked_post,
    raw_http10_post, raw_pipelined_posts, streamed_chat as chat, worker_metric as metric,
};
use switchyard_e2e::{
    client, envoy_stats, get_text, post_observed, post_raw_observed, start_stack, Component,
    Signal, DESTINATION_RESPONSE_HEADER,
};
use switchyard_protocol::registration::{unix_now_ms, RegistrationSecret};
use switchyard_protocol::route::ROUTE_HEADER;
use switchyard_protocol::worker::{WorkerHeartbeat, WorkerId, WorkerInfo, WorkerRole};
use switchyard_stack::{ServingMode, StackBuilder};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Context of the stack's model in the first test: small, so a prompt beyond it is cheap.
const CONTEXT: u32 = 16_384;

/// A TCP listener that counts connections: where an attacker wants the workers to connect.
struct Trap {
    port: u16,
    connections: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Trap {
    async fn new() -> Trap {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicU64::new(0));
        let counted = connections.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::Relaxed);
                drop(stream);
            }
        });
        Trap {
            port,
            connections,
            task,
        }
    }

    fn hits(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }
}

impl Drop for Trap {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A chat body with `extra` keys set. 16 tokens stream over ~0.2 s, long enough that a
/// client on a busy machine still sees them arrive in several reads (`assert_streamed`).
fn chat_with(prompt: &str, extra: Value) -> Value {
    let mut body = chat(json!([{"role": "user", "content": prompt}]), 16);
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attacks_and_bad_input_are_refused_and_cost_nothing() {
    let mut stack = start_stack(
        StackBuilder::new()
            .decode_workers(2)
            .prefill_workers(1)
            .serving_mode(ServingMode::Conditional)
            .max_model_len(CONTEXT)
            .route_timeout_ms(5_000),
    )
    .await;
    let http = client();
    let workers = known_workers(&stack, &http)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let decode: Vec<String> = ["decode-0", "decode-1"]
        .iter()
        .map(|id| workers[*id].clone())
        .collect();
    let prefill = workers["prefill-0"].clone();
    let gateway = stack.gateway_url();
    let trap = Trap::new().await;

    // (1) The API under other spellings, with a client's kv_transfer_params aimed at the trap:
    // routed like the API, the params stripped, nobody pulls from the trap.
    let forged = json!({"do_remote_prefill": true, "do_remote_decode": false,
        "remote_engine_id": "x", "remote_block_ids": [1], "remote_request_id": "evil",
        "remote_host": "127.0.0.1", "remote_port": trap.port, "tp_size": 1});
    for path in [
        "/v1/chat/completions/",
        "//v1//chat/completions",
        "/v1/chat/%63ompletions",
        "/v1/chat/completions?x=1",
    ] {
        let body = chat_with("hi", json!({ "kv_transfer_params": forged }));
        let response = post_observed(
            &http,
            &format!("{gateway}{path}"),
            &body,
            &[],
            REQUEST_TIMEOUT,
        )
        .await
        .expect(path);
        assert_eq!(response.status, 200, "{path}: {}", response.body());
        assert_streamed(&response);
        let route = response.header(ROUTE_HEADER);
        assert!(
            ["bypass", "disagg", "agg"].contains(&route),
            "{path} is routed: {route}"
        );
    }
    let mut pull_failures = 0.0;
    for address in &decode {
        pull_failures += metric(&http, address, "switchyard_kv_pull_failures_total").await;
    }
    assert_eq!(pull_failures, 0.0, "no worker tried the client's pull");
    assert_eq!(trap.hits(), 0, "nobody connected to the client's host");
    let stats = envoy_stats(&http, &stack.admin_url()).await.unwrap();
    assert_eq!(stat(&stats, "client_steering_stripped_total"), 4);
    assert_eq!(
        stat(&stats, "deferred_screens_total"),
        4,
        "no verdict vouched for a body naming a steering key"
    );

    // (2) Worker-internal endpoints are not part of the gateway, whatever the method.
    for (method, path) in [
        ("GET", "/metrics"),
        ("GET", "/health"),
        ("POST", "/switchyard/kv/pull"),
        ("POST", "/switchyard/kv/release"),
        ("POST", "/v1/embeddings"),
    ] {
        let response = http
            .request(method.parse().unwrap(), format!("{gateway}{path}"))
            .header("content-type", "application/json")
            .body(json!({"remote_request_id": "x", "kv_transfer_params": forged}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 404, "{method} {path}");
        assert!(
            response.headers().get("x-switchyard-worker").is_none(),
            "{method} {path}"
        );
        // The gateway's own OpenAI-style 404, labelled as the JSON it is.
        assert_eq!(
            response.headers()["content-type"],
            "application/json",
            "{method} {path}"
        );
        let error: serde_json::Value = response.json().await.unwrap();
        assert_eq!(error["error"]["code"], 404, "{method} {path}: {error}");
    }
    let models = get_text(&http, &format!("{gateway}/v1/models"))
        .await
        .unwrap();
    assert!(
        models.contains("\"data\""),
        "the API's model list still is: {models}"
    );

    // (3) A stray publisher on NATS: without the token it cannot connect; with it (an insider
    // on the bus) its heartbeat lacks the registration signature and is refused and counted.
    let no_token = tokio::time::timeout(
        Duration::from_secs(5),
        async_nats::connect(stack.nats_url()),
    )
    .await;
    assert!(
        !matches!(no_token, Ok(Ok(_))),
        "NATS accepted a client without the token"
    );
    let token = std::fs::read_to_string(stack.nats_token_file()).unwrap();
    let insider = async_nats::ConnectOptions::with_token(token.trim().to_string())
        .connect(stack.nats_url())
        .await
        .expect("the token connects");
    let fake = WorkerInfo {
        worker_id: WorkerId("decode-9".into()),
        instance_id: 1,
        role: WorkerRole::Decode,
        address: format!("127.0.0.1:{}", trap.port),
        model: "qwen3".into(),
        block_size: 64,
        kv_capacity_blocks: 100_000,
        engine: Default::default(),
        bootstrap_port: None,
    };
    let wrong = RegistrationSecret::new("a-secret-that-is-not-the-stacks").unwrap();
    for signature in [None, Some(wrong.sign(&fake, unix_now_ms()))] {
        let hb = WorkerHeartbeat {
            v: 1,
            worker: fake.clone(),
            interval_ms: 1_000,
            sent_at_ms: unix_now_ms(),
            signature,
        };
        insider
            .publish(
                switchyard_protocol::subjects::HEARTBEAT,
                serde_json::to_vec(&hb).unwrap().into(),
            )
            .await
            .unwrap();
    }
    insider.flush().await.unwrap();
    let cp_metrics = format!("{}/metrics", stack.control_plane_url());
    let rejected = async {
        loop {
            let m = get_text(&http, &cp_metrics).await.unwrap_or_default();
            if switchyard_e2e::prom_sum(&m, "switchyard_workers_rejected_total") >= 2.0 {
                return m;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let m = tokio::time::timeout(Duration::from_secs(10), rejected)
        .await
        .expect("both spoofs counted");
    assert!(
        m.contains("switchyard_workers_rejected_total{reason=\"unsigned\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("switchyard_workers_rejected_total{reason=\"bad_signature\"} 1"),
        "{m}"
    );
    for i in 0..8 {
        let body = chat_with(&format!("spread me {i}"), json!({}));
        let response = post_observed(
            &http,
            &format!("{gateway}/v1/chat/completions"),
            &body,
            &[],
            REQUEST_TIMEOUT,
        )
        .await
        .unwrap();
        assert_eq!(response.status, 200);
    }
    assert_eq!(trap.hits(), 0, "no prompt reached the spoofed worker");
    let listed = switchyard_e2e::worker_addresses(&http, &stack)
        .await
        .unwrap();
    assert!(!listed.contains_key("decode-9"), "{listed:?}");

    // (4) What the engine would refuse is refused by the gateway with the engine's kind of
    // 400, before any prefill; a prompt beyond the context too, at once.
    let url = format!("{gateway}/v1/chat/completions");
    let holds_before = metric(&http, &prefill, "switchyard_kv_holds_total").await;
    let cold = long_prompt("bad inputs");
    for (extra, param) in [
        (json!({"max_tokens": -1}), "max_tokens"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"max_tokens": 1e12}), "max_tokens"),
        (json!({"max_tokens": "x"}), "max_tokens"),
        (json!({"stream": "maybe"}), "stream"),
        (
            json!({"stream": false, "stream_options": {"include_usage": true}}),
            "stream_options",
        ),
        (json!({"n": 0}), "n"),
        // vLLM would serve it, but its reuse reports would leave evicted blocks in the index.
        (
            json!({"vllm_xargs": {"kv_cache_report_mode": "full"}}),
            "vllm_xargs",
        ),
    ] {
        let response = post_observed(
            &http,
            &url,
            &chat_with(&cold, extra.clone()),
            &[],
            REQUEST_TIMEOUT,
        )
        .await
        .unwrap();
        assert_eq!(response.status, 400, "{extra}: {}", response.body());
        assert_eq!(
            response.header(ROUTE_HEADER),
            "rejected;reason=invalid_request",
            "{extra}"
        );
        let error: Value = serde_json::from_str(&response.body()).unwrap();
        assert_eq!(error["error"]["param"], param, "{error}");
        assert_eq!(error["error"]["type"], "BadRequestError");
    }
    let huge = "a few more words ".repeat(CONTEXT as usize);
    let started = tokio::time::Instant::now();
    let response = post_observed(
        &http,
        &url,
        &chat_with(&huge, json!({})),
        &[],
        REQUEST_TIMEOUT,
    )
    .await
    .unwrap();
    assert_eq!(response.status, 400, "{}", response.body());
    assert_eq!(
        response.header(ROUTE_HEADER),
        "rejected;reason=prompt_too_long"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "refused at once: {:?}",
        started.elapsed()
    );
    // Several choices are valid, but never disaggregated (the simulated worker serves n = 1
    // only and says so itself): no prefill for them either.
    let response = post_observed(
        &http,
        &url,
        &chat_with(&cold, json!({"n": 2})),
        &[],
        REQUEST_TIMEOUT,
    )
    .await
    .unwrap();
    assert_eq!(response.header(ROUTE_HEADER), "bypass");
    assert_eq!(
        metric(&http, &prefill, "switchyard_kv_holds_total").await,
        holds_before,
        "no prefill for bad input"
    );
    assert_eq!(
        metric(&http, &prefill, "switchyard_kv_held_requests").await,
        0.0,
        "no KV held"
    );
    let stats = envoy_stats(&http, &stack.admin_url()).await.unwrap();
    assert_eq!(
        stat(&stats, "fail_open_total"),
        0,
        "client errors are not fail-opens"
    );
    assert_eq!(stat(&stats, "rejected.invalid_request"), 8);
    assert_eq!(stat(&stats, "rejected.prompt_too_long"), 1);

    // (5) Four turns of one conversation, each sent the moment the previous one answered: the
    // KV events of a turn may not have arrived yet, the router's prediction keeps them home.
    for session in 0..3 {
        let mut messages =
            vec![json!({"role": "user", "content": long_prompt(&format!("agent loop {session}"))})];
        let mut homes = Vec::new();
        for turn in 0..4 {
            let response =
                post_observed(&http, &url, &chat(json!(messages), 8), &[], REQUEST_TIMEOUT)
                    .await
                    .unwrap();
            assert_streamed(&response);
            homes.push(response.header(DESTINATION_RESPONSE_HEADER).to_string());
            messages.push(json!({"role": "assistant", "content": switchyard_e2e::probe::assistant_text(&response)}));
            messages.push(json!({"role": "user", "content": format!("And step {turn}?")}));
        }
        assert!(
            homes.iter().all(|h| *h == homes[0]),
            "session {session}: {homes:?}"
        );
    }

    // (6) A prefill whose decode leg never comes gives its KV back at once: the decode workers
    // hang (SIGSTOP), the client gives up after the prefill leg is done.
    let holds_before = metric(&http, &prefill, "switchyard_kv_holds_total").await;
    stack
        .freeze(Component::Workers)
        .expect("SIGSTOP the decode workers");
    let gave_up = post_observed(
        &http,
        &url,
        &chat(
            json!([{"role": "user", "content": long_prompt("abandoned")}]),
            8,
        ),
        &[],
        Duration::from_secs(3),
    )
    .await;
    assert!(
        gave_up.is_err(),
        "nobody answers while the decode workers hang"
    );
    let released = async {
        loop {
            let held = metric(&http, &prefill, "switchyard_kv_held_requests").await;
            let released = metric(&http, &prefill, "switchyard_kv_holds_released_total").await;
            if held == 0.0 && released == 1.0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let outcome = tokio::time::timeout(Duration::from_secs(5), released).await;
    stack
        .signal(Component::Workers, Signal::Cont)
        .expect("SIGCONT the decode workers");
    outcome.expect("the hold is released within seconds, not at the end of its lease");
    assert_eq!(
        metric(&http, &prefill, "switchyard_kv_holds_total").await,
        holds_before + 1.0
    );
    let stats = envoy_stats(&http, &stack.admin_url()).await.unwrap();
    assert_eq!(stat(&stats, "prefill.releases_total"), 1);

    // (7) A chunked upload past the body limit, sent as fast as curl sends a file: Envoy's
    // codec hands the filter all that one read brought, which outran 1 MiB of room past the
    // limit (Envoy's own plain-text 413 then won about half the time). Each gets the filter's
    // JSON 413, and no worker sees it.
    let over = chat(
        json!([{"role": "user", "content": "x".repeat(MAX_BODY_BYTES / 32 * 35)}]),
        4,
    );
    for attempt in 0..4 {
        let (head, body) = raw_chunked_post(
            &gateway,
            "/v1/chat/completions",
            &over.to_string(),
            REQUEST_TIMEOUT,
        )
        .await
        .unwrap_or_else(|e| panic!("attempt {attempt}: {e}"));
        assert!(
            head.starts_with("HTTP/1.1 413"),
            "attempt {attempt}: {head}"
        );
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/json"),
            "attempt {attempt}: Envoy's own 413, not the filter's: {head}\n{body}"
        );
        let error: Value = serde_json::from_str(&body).expect("the filter's JSON 413");
        assert_eq!(error["error"]["code"], 413, "{error}");
    }
    let stats = envoy_stats(&http, &stack.admin_url()).await.unwrap();
    assert_eq!(stat(&stats, "rejected.too_large"), 4);

    // (8) An HTTP/1.0 client (nginx's default `proxy_http_version`, ApacheBench) is served
    // and routed like any other; Envoy answered such requests 426.
    let old_client = json!({
        "model": "qwen3",
        "messages": [{"role": "user", "content": "An old client asks."}],
        "max_tokens": 4,
    });
    let (head, body) = raw_http10_post(
        &gateway,
        "/v1/chat/completions",
        &old_client.to_string(),
        REQUEST_TIMEOUT,
    )
    .await
    .expect("answered");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}\n{body}"
    );
    let route = head
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{ROUTE_HEADER}: ")))
        .unwrap_or_default();
    assert!(
        ["bypass", "disagg", "agg"].contains(&route),
        "routed by a verdict: {head}"
    );

    // (11) A compressed body (gzip bytes, as a client that compresses requests sends) is
    // answered 415 with what to do, not the generic `not_json`.
    let gzip_bytes = vec![0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03];
    let response = post_raw_observed(
        &http,
        &url,
        gzip_bytes,
        &[
            ("content-encoding", "gzip"),
            ("x-request-id", "client-refused-1"),
        ],
        REQUEST_TIMEOUT,
    )
    .await
    .expect("answered");
    assert_eq!(response.status, 415, "{}", response.body());
    assert_eq!(
        response.header("x-request-id"),
        "client-refused-1",
        "the gateway's own answers carry the request id, as served ones do"
    );
    assert_eq!(response.header(ROUTE_HEADER), "rejected;reason=encoded");
    assert!(
        response.body().contains("uncompressed"),
        "says what to do: {}",
        response.body()
    );
    // Refused on its headers: a client that waits (as with `Expect: 100-continue`) uploads
    // nothing. Before, the filter read the whole body first.
    let head = headers_only_answer(
        &gateway,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n\
         content-encoding: gzip\r\ncontent-length: 100000\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 415"), "{head}");
    let stats = envoy_stats(&http, &stack.admin_url()).await.unwrap();
    assert_eq!(stat(&stats, "rejected.encoded"), 2);

    // (10) A request the gateway refuses with a 400 leaves the client's connection open: the
    // request behind it on the same connection (pipelined, or the next one of a keep-alive
    // pool) is still answered. Envoy closed HTTP/1 connections after every local 400.
    let answer = raw_pipelined_posts(
        &gateway,
        "/v1/chat/completions",
        &[
            "{\"model\": \"qwen3\", \"messages\": [",
            &old_client.to_string(),
        ],
        REQUEST_TIMEOUT,
    )
    .await
    .expect("answered");
    // A response's body has no line end, so the next status line follows it directly.
    let statuses: Vec<&str> = answer
        .match_indices("HTTP/1.1 ")
        .filter_map(|(at, _)| answer.get(at + 9..at + 12))
        .collect();
    assert_eq!(
        statuses,
        ["400", "200"],
        "both pipelined requests answered on one connection:\n{answer}"
    );
    let refused_head = answer.split("\r\n\r\n").next().unwrap_or_default();
    assert!(
        !refused_head
            .to_ascii_lowercase()
            .contains("connection: close"),
        "the 400 keeps the connection: {refused_head}"
    );

    // (9) A body led by a UTF-8 byte-order mark, which vLLM's JSON reader accepts, is routed
    // and served, not refused as `not_json`.
    let mut with_bom = b"\xEF\xBB\xBF".to_vec();
    with_bom.extend_from_slice(old_client.to_string().as_bytes());
    let response = post_raw_observed(&http, &url, with_bom, &[], REQUEST_TIMEOUT)
        .await
        .expect("answered");
    assert_eq!(response.status, 200, "{}", response.body());
    assert!(
        ["bypass", "disagg", "agg"].contains(&response.header(ROUTE_HEADER)),
        "routed by a verdict: {:?}",
        response.headers
    );
    stack.check_running().expect("every process still runs");
}

/// The stack's default body limit (the filter's `max_body_bytes`).
const MAX_BODY_BYTES: usize = 16 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_outage_and_a_stalled_control_plane_fail_no_request() {
    let mut stack = start_stack(
        StackBuilder::new()
            .decode_workers(2)
            .serving_mode(ServingMode::Conditional)
            .route_timeout_ms(1_000),
    )
    .await;
    let http = client();
    let url = format!("{}/v1/chat/completions", stack.gateway_url());
    let cp_metrics = format!("{}/metrics", stack.control_plane_url());

    // A bounded streaming load: 3 clients, each sending one request after another.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sent = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for c in 0..3 {
        let (http, url, stop, failures, sent) = (
            http.clone(),
            url.clone(),
            stop.clone(),
            failures.clone(),
            sent.clone(),
        );
        clients.push(tokio::spawn(async move {
            for i in 0..400u32 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                sent.fetch_add(1, Ordering::Relaxed);
                let body = chat(
                    json!([{"role": "user", "content": format!("client {c} asks {i}")}]),
                    8,
                );
                match post_observed(&http, &url, &body, &[], REQUEST_TIMEOUT).await {
                    Ok(r)
                        if r.status == 200
                            && r.sse_data().last().map(String::as_str) == Some("[DONE]") => {}
                    Ok(r) => failures
                        .lock()
                        .unwrap()
                        .push(format!("{}: {}", r.status, r.body())),
                    Err(e) => failures.lock().unwrap().push(e),
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    // NATS goes away for 30 s: heartbeats, load reports and KV events stop.
    stack.stop_component(Component::Nats);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let during = get_text(&http, &cp_metrics).await.unwrap();
    assert_eq!(
        switchyard_e2e::prom_sum(&during, "switchyard_workers_expired_total"),
        0.0
    );
    assert_eq!(
        switchyard_e2e::prom_sum(&during, "switchyard_live_workers"),
        2.0,
        "{during}"
    );
    stack
        .restart_nats()
        .await
        .expect("NATS restarts on its port");
    tokio::time::sleep(Duration::from_secs(5)).await;

    // The control plane is stopped for longer than the heartbeat window (3 s): requests fail
    // open meanwhile, and when it runs again nobody is expired.
    stack
        .freeze(Component::ControlPlane)
        .expect("SIGSTOP the control plane");
    tokio::time::sleep(Duration::from_secs(5)).await;
    stack
        .signal(Component::ControlPlane, Signal::Cont)
        .expect("SIGCONT the control plane");
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let failures = failures.lock().unwrap().clone();
    let sent = sent.load(Ordering::Relaxed);
    eprintln!("sent {sent} requests, {} failed", failures.len());
    assert!(sent >= 30, "the load ran throughout: {sent}");
    assert!(
        failures.is_empty(),
        "{} of {sent} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );

    let after = get_text(&http, &cp_metrics).await.unwrap();
    assert_eq!(
        switchyard_e2e::prom_sum(&after, "switchyard_workers_expired_total"),
        0.0,
        "{after}"
    );
    assert!(
        switchyard_e2e::prom_sum(&after, "switchyard_stalls_total") >= 1.0,
        "{after}"
    );
    // Abandoned route calls are the filter's doing, not an error of the control plane's.
    let log = std::fs::read_to_string(stack.log_path(Component::ControlPlane).unwrap()).unwrap();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(errors.is_empty(), "{errors:?}");
    stack.check_running().expect("every process still runs");
}

/// Sends `head` (a request's headers, none of its body) on a new connection to the gateway
/// at `base`, and returns the answer's head, read within 5 s.
async fn headers_only_answer(base: &str, head: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authority = base.trim_start_matches("http://");
    let mut socket = tokio::net::TcpStream::connect(authority).await.unwrap();
    socket.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
    String::from_utf8_lossy(&answer).into_owned()
}
