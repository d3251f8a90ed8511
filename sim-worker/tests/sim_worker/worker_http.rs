//! The simulated worker's OpenAI HTTP API, over real HTTP to an in-process worker.

use crate::worker_support;

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use switchyard_protocol::worker::WorkerRole;
use tokio::time::Instant;
use worker_support::{
    base_url, chat_body, config, eventually, get, metric, metrics_text, post_for_json, post_json,
    start, tokenizer, CHAT, COMPLETIONS,
};

/// Reads an SSE body, returning each `data:` payload with the time it arrived.
async fn read_sse(resp: reqwest::Response) -> Vec<(Instant, String)> {
    let mut out = Vec::new();
    let mut buf = String::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        buf.push_str(std::str::from_utf8(&chunk.expect("body chunk")).expect("utf-8"));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let data = event
                .trim_end()
                .strip_prefix("data: ")
                .expect("data: line")
                .to_owned();
            out.push((Instant::now(), data));
        }
    }
    assert!(
        buf.trim().is_empty(),
        "trailing bytes after the last event: {buf:?}"
    );
    out
}

#[tokio::test]
async fn streamed_chat_arrives_token_by_token_and_ends_with_usage_and_done() {
    let tok = tokenizer();
    let w = start(config(WorkerRole::Agg, "agg-stream"), &tok, None).await;
    let client = reqwest::Client::new();
    let mut body = chat_body("stream", 40, 12);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let resp = post_json(&client, &w, CHAT, &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-switchyard-worker"], "agg-stream");
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let events = read_sse(resp).await;
    let (last_at, last) = events.last().unwrap();
    assert_eq!(last, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    // 12 token chunks, a finish chunk, a usage chunk.
    assert_eq!(chunks.len(), 14, "{chunks:#?}");
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["id"], chunks[0]["id"]);
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks[..12]
        .iter()
        .map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert!(!text.is_empty());
    assert_eq!(chunks[12]["choices"][0]["finish_reason"], "length");
    let usage = &chunks[13]["usage"];
    assert_eq!(chunks[13]["choices"], json!([]));
    assert_eq!(usage["completion_tokens"], 12);
    let prompt_tokens = tok
        .tokenize_request(switchyard_protocol::route::ApiKind::Chat, &body)
        .unwrap()
        .len();
    assert_eq!(usage["prompt_tokens"], prompt_tokens);
    assert_eq!(usage["total_tokens"], prompt_tokens + 12);
    assert!(usage["prompt_tokens_details"]["cached_tokens"].is_u64());
    // Tokens are flushed as generated: each decode iteration takes simulated milliseconds, so
    // the first chunk arrives strictly before the last one.
    assert!(events[0].0 < *last_at);
}

/// Each token leaves as it is made, also on a connection reused for the next request. With
/// Nagle's algorithm on (warp's own server), a token written while the previous write was
/// unacknowledged waited for the client's delayed ACK (up to 40 ms): on a reused connection
/// the tokens came in bursts, or all at once after ~45 ms of apparent TTFT, which is not what
/// the model computed.
#[tokio::test]
async fn tokens_are_not_held_back_on_a_reused_connection() {
    const TOKENS: u32 = 24;
    let tok = tokenizer();
    // Ten times faster than modelled, as the demo runs: decode steps of about a millisecond,
    // well inside a delayed ACK.
    let mut cfg = config(WorkerRole::Agg, "agg-nodelay");
    cfg.speed_up = switchyard_engine::SpeedUp::new(10.0).expect("a valid speed-up");
    let w = start(cfg, &tok, None).await;
    // One client: its pooled connection is reused by every request below.
    let client = reqwest::Client::new();
    let mut spreads = Vec::new();
    for i in 0..4 {
        let started = Instant::now();
        let mut body = chat_body(&format!("reuse {i}"), 40, TOKENS);
        body["stream"] = json!(true);
        let resp = post_json(&client, &w, CHAT, &body).await;
        assert_eq!(resp.status(), 200);
        let events = read_sse(resp).await;
        let arrivals: Vec<Instant> = events
            .iter()
            .filter(|(_, data)| data.contains("\"content\""))
            .map(|(at, _)| *at)
            .collect();
        assert!(arrivals.len() >= TOKENS as usize - 1, "{events:?}");
        // Time to the first token and the tokens' spread: held back, they come at once.
        let first = arrivals[0] - started;
        let spread = *arrivals.last().unwrap() - arrivals[0];
        eprintln!("request {i}: first token after {first:?}, tokens over {spread:?}");
        spreads.push(spread);
        // The next request comes soon after, as a load generator's would.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The model spreads 24 tokens over about 20 ms at this speed; held back, they arrived
    // within a fraction of a millisecond.
    assert!(
        spreads
            .iter()
            .all(|&spread| spread >= Duration::from_millis(5)),
        "tokens arriving at once on a reused connection: spreads {spreads:?}"
    );
}

#[tokio::test]
async fn non_streamed_chat_and_completions_answer_one_json_with_usage() {
    let tok = tokenizer();
    let w = start(config(WorkerRole::Agg, "agg-json"), &tok, None).await;
    let client = reqwest::Client::new();

    let chat = chat_body("json", 30, 5);
    let resp = post_json(&client, &w, CHAT, &chat).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-switchyard-worker"], "agg-json");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "Qwen/Qwen3-235B-A22B");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert!(v.get("kv_transfer_params").is_none());

    // max_completion_tokens wins over max_tokens on chat, as in vLLM.
    let mut chat2 = chat_body("json2", 30, 5);
    chat2["max_completion_tokens"] = json!(3);
    let v = post_for_json(&client, &w, CHAT, &chat2).await;
    assert_eq!(v["usage"]["completion_tokens"], 3);

    let comp = json!({"model": "m", "prompt": "The quick brown fox jumps over the lazy dog", "max_tokens": 4});
    let v = post_for_json(&client, &w, COMPLETIONS, &comp).await;
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], "m");
    assert!(v["choices"][0]["text"].as_str().unwrap().len() > 4);
    assert_eq!(v["usage"]["completion_tokens"], 4);
    let prompt_tokens = tok
        .tokenize_request(switchyard_protocol::route::ApiKind::Completions, &comp)
        .unwrap()
        .len();
    assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens);

    // A shared x-request-id names the response and is echoed back, as in vLLM.
    let resp = client
        .post(format!("{}/v1/completions", base_url(&w)))
        .header("x-request-id", "req-42")
        .json(&comp)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-request-id"], "req-42");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["id"], "cmpl-req-42");

    // Without max_tokens: the documented default.
    let v = post_for_json(&client, &w, COMPLETIONS, &json!({"prompt": "hello"})).await;
    assert_eq!(
        v["usage"]["completion_tokens"],
        switchyard_sim_worker::openai::DEFAULT_MAX_TOKENS
    );
}

#[tokio::test]
async fn streamed_completions_use_text_completion_chunks() {
    let tok = tokenizer();
    let w = start(config(WorkerRole::Decode, "decode-stream"), &tok, None).await;
    let client = reqwest::Client::new();
    let body = json!({"prompt": "Once upon a time", "max_tokens": 3, "stream": true});
    let resp = post_json(&client, &w, COMPLETIONS, &body).await;
    let events = read_sse(resp).await;
    // 3 tokens, finish, [DONE]; no usage chunk without stream_options.
    assert_eq!(events.len(), 5);
    assert_eq!(events[4].1, "[DONE]");
    for (_, d) in &events[..4] {
        let c: Value = serde_json::from_str(d).unwrap();
        assert_eq!(c["object"], "text_completion");
        assert!(c.get("usage").is_none());
    }
}

#[tokio::test]
async fn prompts_beyond_the_models_context_are_refused_as_vllm_refuses_them() {
    let tok = tokenizer();
    let mut cfg = config(WorkerRole::Agg, "agg-short");
    cfg.max_model_len = 64;
    let w = start(cfg, &tok, None).await;
    let client = reqwest::Client::new();
    let long = json!({"messages": [{"role": "user", "content": "many words here ".repeat(40)}], "max_tokens": 2});
    let resp = post_json(&client, &w, CHAT, &long).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["param"], "input_tokens", "{v}");
    let short =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "2", "stream": "no"});
    let resp = post_json(&client, &w, CHAT, &short).await;
    assert_eq!(resp.status(), 200, "lax values vLLM accepts are accepted");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 2, "{v}");
    // More than the context leaves is clamped to what it leaves, as vLLM does: the whole
    // sequence stays within the model's 64 tokens.
    let greedy = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64});
    let resp = post_json(&client, &w, CHAT, &greedy).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    let (prompt, generated) = (
        v["usage"]["prompt_tokens"].as_u64().unwrap(),
        v["usage"]["completion_tokens"].as_u64().unwrap(),
    );
    assert_eq!(
        (prompt + generated, v["usage"]["total_tokens"].as_u64()),
        (64, Some(64)),
        "{v}"
    );
}

#[tokio::test]
async fn malformed_requests_get_openai_errors_and_are_counted() {
    let tok = tokenizer();
    let w = start(config(WorkerRole::Agg, "agg-bad"), &tok, None).await;
    let client = reqwest::Client::new();
    let chat = format!("{}/v1/chat/completions", base_url(&w));
    let cases: Vec<(&str, String, Option<&str>)> = vec![
        ("not json", "{".into(), None),
        ("not an object", "[1]".into(), None),
        ("n = 2", json!({"messages": [{"role": "user", "content": "hi"}], "n": 2}).to_string(), Some("n")),
        ("max_tokens 0", json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}).to_string(), Some("max_tokens")),
        ("max_tokens not an integer", json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "nine"}).to_string(), Some("max_tokens")),
        ("max_tokens beyond the context", json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e12}).to_string(), Some("max_tokens")),
        ("stream not bool", json!({"messages": [{"role": "user", "content": "hi"}], "stream": "maybe"}).to_string(), Some("stream")),
        ("stream_options without stream", json!({"messages": [{"role": "user", "content": "hi"}], "stream_options": {"include_usage": true}}).to_string(), Some("stream_options")),
        ("no messages", json!({"model": "x"}).to_string(), Some("messages")),
        ("bad kv_transfer_params", json!({"messages": [{"role": "user", "content": "hi"}], "kv_transfer_params": {"do_remote_decode": "yes"}}).to_string(), Some("kv_transfer_params")),
    ];
    for (what, body, param) in &cases {
        let resp = client
            .post(&chat)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{what}");
        assert_eq!(resp.headers()["x-switchyard-worker"], "agg-bad", "{what}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["type"], "BadRequestError", "{what}: {v}");
        assert_eq!(v["error"]["code"], 400, "{what}");
        assert!(
            !v["error"]["message"].as_str().unwrap().is_empty(),
            "{what}"
        );
        if let Some(p) = param {
            assert!(
                v["error"]["param"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with(p),
                "{what}: {v}"
            );
        }
    }
    let resp = post_json(&client, &w, COMPLETIONS, &json!({"max_tokens": 2})).await;
    assert_eq!(resp.status(), 400, "completions without a prompt");
    // A batch is refused, not answered for its first prompt alone.
    for batch in [json!(["a", "b"]), json!([[1, 2, 3], [4]])] {
        let resp = post_json(
            &client,
            &w,
            COMPLETIONS,
            &json!({"prompt": batch, "max_tokens": 1}),
        )
        .await;
        assert_eq!(resp.status(), 400, "{batch}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["param"], "prompt", "{v}");
    }
    let resp = get(&client, &w, CHAT).await;
    assert!(resp.status().is_client_error());
    let resp = get(&client, &w, "/nowhere").await;
    assert_eq!(resp.status(), 404);
    assert_eq!(resp.headers()["x-switchyard-worker"], "agg-bad");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "NotFoundError");

    let text = metrics_text(&client, &w).await;
    let expected = cases.len() as f64 + 5.0;
    assert_eq!(
        metric(&text, "switchyard_bad_requests_total", None),
        expected
    );
    // Nothing reached the engine.
    assert_eq!(
        metric(&text, "switchyard_requests_total", Some("api=\"chat\"")),
        0.0
    );
}

/// Every endpoint answers a method it does not serve with 405 and an `Allow` header naming
/// exactly the methods it serves, and serves every method it names.
#[tokio::test]
async fn a_wrong_method_is_told_which_methods_the_endpoint_serves() {
    let tok = tokenizer();
    let w = start(config(WorkerRole::Decode, "decode-allow"), &tok, None).await;
    let client = reqwest::Client::new();
    let endpoints = switchyard_sim_worker::http::ENDPOINTS;
    for probe in switchyard_support::http_server::method_probes(endpoints) {
        let resp = client
            .request(
                probe.method.parse().unwrap(),
                format!("{}{}", base_url(&w), probe.path),
            )
            .body("{}")
            .send()
            .await
            .unwrap();
        let allow = resp.headers().get("allow").and_then(|v| v.to_str().ok());
        probe
            .check(resp.status().as_u16(), allow)
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

#[tokio::test]
async fn models_health_and_metrics_describe_the_worker() {
    let tok = tokenizer();
    let mut w = start(config(WorkerRole::Agg, "agg-meta"), &tok, None).await;
    let client = reqwest::Client::new();
    let resp = get(&client, &w, "/health").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-switchyard-worker"], "agg-meta");
    let v: Value = get(&client, &w, "/v1/models").await.json().await.unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "Qwen/Qwen3-235B-A22B");

    post_json(&client, &w, CHAT, &chat_body("metrics", 100, 2)).await;
    let text = metrics_text(&client, &w).await;
    for name in [
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} ")),
            "{name} missing:\n{text}"
        );
        assert!(
            text.contains(&format!(
                "{name}{{model_name=\"Qwen/Qwen3-235B-A22B\",worker=\"agg-meta\"}}"
            )),
            "{name}"
        );
    }
    assert_eq!(
        metric(&text, "switchyard_requests_total", Some("api=\"chat\"")),
        1.0
    );
    assert_eq!(metric(&text, "vllm:request_success_total", None), 1.0);
    assert_eq!(metric(&text, "vllm:generation_tokens_total", None), 2.0);
    assert!(metric(&text, "vllm:prefix_cache_queries_total", None) > 100.0);
    assert_eq!(metric(&text, "vllm:num_requests_running", None), 0.0);

    // An HTTP server that outlived its engine is not healthy: a pool polling /health must
    // take the worker out.
    w.stop_engine();
    let stopped = worker_support::eventually(std::time::Duration::from_secs(5), || async {
        get(&client, &w, "/health").await.status() == 503
    })
    .await;
    assert!(stopped, "/health still 200 with the engine stopped");
}

#[tokio::test]
async fn a_repeated_prompt_reports_cached_tokens() {
    let tok = tokenizer();
    let w = start(config(WorkerRole::Agg, "agg-cache"), &tok, None).await;
    let client = reqwest::Client::new();
    let body = chat_body("cache", 400, 2);
    let first = post_for_json(&client, &w, CHAT, &body).await;
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let second = post_for_json(&client, &w, CHAT, &body).await;
    let prompt = second["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(prompt > 128);
    // Every full block but the one holding the last token (recomputed to sample from).
    assert_eq!(cached, (prompt - 1) / 64 * 64);
    let text = metrics_text(&client, &w).await;
    assert_eq!(
        metric(&text, "vllm:prefix_cache_hits_total", None),
        cached as f64
    );
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_aborts_its_request() {
    let tok = tokenizer();
    let w = start(config(WorkerRole::Agg, "agg-abort"), &tok, None).await;
    let client = reqwest::Client::new();
    let mut body = chat_body("abort", 20, 5_000);
    body["stream"] = json!(true);
    let resp = post_json(&client, &w, CHAT, &body).await;
    let mut stream = resp.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    let running = eventually(Duration::from_secs(5), || async {
        w.engine().load().running == 1
    })
    .await;
    assert!(running, "the streamed request is not running");
    drop(stream);
    let metrics = w.metrics().clone();
    let aborted = eventually(Duration::from_secs(5), || {
        let m = metrics.clone();
        async move {
            m.requests_aborted
                .load(std::sync::atomic::Ordering::Relaxed)
                == 1
        }
    })
    .await;
    assert!(aborted, "the engine never heard of the disconnect");
    let idle = eventually(Duration::from_secs(5), || async {
        w.engine().load().running == 0
    })
    .await;
    assert!(idle, "the aborted request still runs");
    assert_eq!(
        w.metrics()
            .requests_finished
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    // Its prompt was computed and its tokens generated: counted, as vLLM counts them.
    let text = metrics_text(&client, &w).await;
    assert!(metric(&text, "vllm:prompt_tokens_total", None) >= 20.0);
    assert!(metric(&text, "vllm:generation_tokens_total", None) >= 1.0);
    assert!(metric(&text, "switchyard_local_prefill_tokens_total", None) >= 20.0);
}

#[tokio::test]
async fn chunked_bodies_are_accepted_and_oversized_ones_refused() {
    let tok = tokenizer();
    let w = start(config(WorkerRole::Agg, "agg-chunked"), &tok, None).await;
    let client = reqwest::Client::new();
    // No content-length: Envoy sends a body its filter rewrote this way.
    let body = serde_json::to_vec(&json!({"prompt": "chunked hello", "max_tokens": 2})).unwrap();
    let (a, b) = body.split_at(7);
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> = vec![Ok(a.to_vec()), Ok(b.to_vec())];
    let resp = client
        .post(format!("{}/v1/completions", base_url(&w)))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(pieces)))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 2);

    // The pull side channel takes at most 64 KiB, declared or streamed.
    let big = vec![b' '; 100 << 10];
    let resp = client
        .post(format!("{}/switchyard/kv/pull", base_url(&w)))
        .body(big.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> =
        big.chunks(8 << 10).map(|c| Ok(c.to_vec())).collect();
    let resp = client
        .post(format!("{}/switchyard/kv/pull", base_url(&w)))
        .body(reqwest::Body::wrap_stream(futures::stream::iter(pieces)))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], 413);
}

/// vLLM's OpenAI endpoints take `application/json` bodies only (any case, with parameters).
#[tokio::test]
async fn bodies_without_jsons_content_type_are_refused_as_vllm_refuses_them() {
    let tok = tokenizer();
    let w = start(config(WorkerRole::Agg, "agg-content-type"), &tok, None).await;
    let client = reqwest::Client::new();
    let body = serde_json::to_vec(&json!({"prompt": "typed hello", "max_tokens": 1})).unwrap();
    for (content_type, status) in [
        (Some("application/x-www-form-urlencoded"), 400),
        (Some("text/plain"), 400),
        (Some("application/vnd.api+json"), 400),
        (None, 400),
        (Some("APPLICATION/JSON; charset=utf-8"), 200),
    ] {
        let mut request = client
            .post(format!("{}/v1/completions", base_url(&w)))
            .body(body.clone());
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let resp = request.send().await.unwrap();
        assert_eq!(resp.status(), status, "{content_type:?}");
        if status == 400 {
            let v: Value = resp.json().await.unwrap();
            let message = v["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains("only 'application/json'"), "{v}");
        }
    }
}

#[tokio::test]
async fn concurrent_streams_all_complete_with_their_own_token_counts() {
    let tok = tokenizer();
    let w = start(config(WorkerRole::Agg, "agg-many"), &tok, None).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", base_url(&w));
    let requests = (0..32u32).map(|i| {
        let mut body = chat_body(&format!("c{i}"), 50 + i as usize * 10, 3 + i % 5);
        body["stream"] = json!(i % 2 == 0);
        let (client, url) = (client.clone(), url.clone());
        async move {
            let resp = client.post(&url).json(&body).send().await.unwrap();
            assert_eq!(resp.status(), 200);
            let tokens = if i % 2 == 0 {
                let events = read_sse(resp).await;
                assert_eq!(events.last().unwrap().1, "[DONE]");
                events.len() as u32 - 2 // minus the finish chunk and [DONE]
            } else {
                let v: Value = resp.json().await.unwrap();
                v["usage"]["completion_tokens"].as_u64().unwrap() as u32
            };
            assert_eq!(tokens, 3 + i % 5, "request {i}");
        }
    });
    tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(requests))
        .await
        .expect("32 requests finish within a minute");
    let text = metrics_text(&client, &w).await;
    assert_eq!(metric(&text, "vllm:request_success_total", None), 32.0);
    assert_eq!(metric(&text, "vllm:num_requests_running", None), 0.0);
    assert_eq!(metric(&text, "vllm:num_requests_waiting", None), 0.0);
}
