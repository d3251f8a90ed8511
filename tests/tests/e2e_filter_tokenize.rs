//! The filter tokenizing prompts itself (`"tokenize": "filter"`), end to end through real
//! Envoy: before its VM has the tokenizer the route call carries the body and requests are
//! routed as ever; once loaded, route calls carry block hashes, a conversation's next turn goes
//! to the worker holding its prefix, the control plane answers a hashed prompt exactly as it
//! answers the body, and bad requests get the same refusals.
//!
//! Needs `cargo build -p switchyard-filter --target wasm32-wasip1 --profile wasm && cargo
//! build --workspace --bins` first (the tests build nothing).

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use switchyard_e2e::probe::wait_until_idle;
use switchyard_e2e::{admin_get_json, client, envoy_stats, post_observed, start_stack, Observed};
use switchyard_protocol::hash::BlockSize;
use switchyard_protocol::lifecycle::{LifecycleBatch, LifecycleEvent, LIFECYCLE_PATH};
use switchyard_protocol::route::{
    ApiKind, Verdict, API_HEADER, MODEL_HEADER, REJECT_HEADER, REQUEST_ID_HEADER, ROUTE_HEADER,
};
use switchyard_protocol::route_input::{
    HashedPrompt, ROUTE_INPUT_HASHES, ROUTE_INPUT_HEADER, TOKENIZER_PATH,
};
use switchyard_protocol::tokenize::{ModelTokenizer, TokenizerBundle};
use switchyard_stack::{Stack, StackBuilder};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// A VM parses ~12 MB of bundle and builds the tokenizer once; generous for a loaded machine.
const LOAD_TIMEOUT: Duration = Duration::from_secs(120);

/// A first turn of about 3k tokens, different from its first words on per conversation.
fn first_turn(conversation: &str) -> Value {
    let text = format!(
        "Conversation {conversation}. {}",
        "The quick brown fox jumps over the lazy dog near the river bank. ".repeat(220)
    );
    json!({
        "model": "qwen3",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 4,
        "stream": false,
    })
}

/// The control plane's record of its decision for `request_id`, from its status page.
async fn recent_decision(http: &reqwest::Client, stack: &Stack, request_id: &str) -> Value {
    let status = admin_get_json(http, stack, "/v1/status")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    status["decisions"]["recent"]
        .as_array()
        .and_then(|recent| recent.iter().find(|d| d["request_id"] == request_id))
        .cloned()
        .unwrap_or_else(|| panic!("{request_id}'s decision in {status}"))
}

/// The next turn of `first`: its messages, the answer, a new question.
fn next_turn(first: &Value) -> Value {
    let mut next = first.clone();
    if let Some(messages) = next["messages"].as_array_mut() {
        messages.push(json!({"role": "assistant", "content": "A fox, a dog and a river."}));
        messages.push(json!({"role": "user", "content": "And what did the dog do next?"}));
    }
    next
}

async fn stats(http: &reqwest::Client, admin: &str) -> HashMap<String, u64> {
    envoy_stats(http, admin)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

fn stat(stats: &HashMap<String, u64>, name: &str) -> u64 {
    stats
        .get(&format!("wasmcustom.switchyard.{name}"))
        .copied()
        .unwrap_or(0)
}

async fn post(http: &reqwest::Client, url: &str, body: &Value) -> Observed {
    post_observed(http, url, body, &[], REQUEST_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

#[track_caller]
fn assert_routed(response: &Observed, context: &str) -> String {
    assert_eq!(response.status, 200, "{context}: {}", response.body());
    let route = response.header(ROUTE_HEADER);
    assert!(
        ["agg", "bypass", "disagg"].contains(&route),
        "{context}: not routed: {route:?}"
    );
    response.header("x-switchyard-destination").to_string()
}

/// `POST /v1/route` straight to the control plane, as the filter would send it.
async fn route_call(
    http: &reqwest::Client,
    control_plane: &str,
    body: Vec<u8>,
    hashed: bool,
    request_id: &str,
) -> (u16, Option<String>, String) {
    let mut request = http
        .post(format!("{control_plane}/v1/route"))
        .header(API_HEADER, "chat")
        .header(REQUEST_ID_HEADER, request_id)
        .body(body);
    if hashed {
        request = request.header(ROUTE_INPUT_HEADER, ROUTE_INPUT_HASHES);
    }
    let response = request.send().await.expect("route call");
    let status = response.status().as_u16();
    let reject = response
        .headers()
        .get(REJECT_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    (status, reject, response.text().await.expect("route answer"))
}

/// Tells the control plane request `request_id` is done, as the filter's lifecycle report
/// would (route calls made here have no filter to report them).
async fn report_done(http: &reqwest::Client, control_plane: &str, request_id: &str) {
    let batch = LifecycleBatch::new(vec![LifecycleEvent::completed(request_id)]);
    let response = http
        .post(format!("{control_plane}{LIFECYCLE_PATH}"))
        .json(&batch)
        .send()
        .await
        .expect("lifecycle report");
    assert!(response.status().is_success(), "{}", response.status());
}

async fn idle(stack: &Stack, http: &reqwest::Client) {
    wait_until_idle(stack, http)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The hashed prompt of `body`, made here with the control plane's tokenizer code at
/// `block_size`.
fn hashed(tokenizer: &ModelTokenizer, block_size: BlockSize, body: &Value) -> Vec<u8> {
    let tokens = tokenizer
        .tokenize_request(ApiKind::Chat, body)
        .expect("tokenizes");
    HashedPrompt::of(&tokens, block_size, body.as_object().expect("an object")).encode()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_filter_tokenizes_once_loaded_and_routes_as_the_control_plane_would() {
    // One Envoy worker thread: one VM, so "loaded" is one event.
    let stack = start_stack(
        StackBuilder::new()
            .decode_workers(2)
            .envoy_concurrency(1)
            .filter_setting("tokenize", "filter"),
    )
    .await;
    let http = client();
    let url = format!("{}/v1/chat/completions", stack.gateway_url());
    let admin = stack.admin_url();

    // (a) Before the VM has a tokenizer: the body goes to the control plane, the request is
    // routed as in the default mode, and the fallback is counted; the request starts the fetch.
    let warm_up = first_turn("A");
    assert_routed(&post(&http, &url, &warm_up).await, "before loading");
    let before = stats(&http, &admin).await;
    assert_eq!(stat(&before, "route_input.body.not_loaded"), 1);
    assert_eq!(stat(&before, "route_input.hashes_total"), 0);
    let waited = tokio::time::Instant::now();
    loop {
        let now = stats(&http, &admin).await;
        if stat(&now, "tokenizer.loads_total") == 1 {
            break;
        }
        assert_eq!(stat(&now, "tokenizer.load_failures_total"), 0, "{now:?}");
        assert!(
            waited.elapsed() < LOAD_TIMEOUT,
            "tokenizer not loaded within {LOAD_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // (b) Loaded: route calls carry hashes; the next turn goes where its prefix is.
    let first = first_turn("B");
    let destination = assert_routed(&post(&http, &url, &first).await, "turn 1");
    // The worker's KV events reach the index and the first turn's load is freed (lifecycle
    // reports), so the KV-affine choice is not outweighed by load.
    idle(&stack, &http).await;
    let second = next_turn(&first);
    let turn_2 = post_observed(
        &http,
        &url,
        &second,
        &[(REQUEST_ID_HEADER, "e2e-tokenize-turn-2")],
        REQUEST_TIMEOUT,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let next_destination = assert_routed(&turn_2, "turn 2");
    assert_eq!(
        next_destination, destination,
        "the next turn must go to the worker holding its prefix"
    );
    // The filter's hashes matched the first turn's blocks (at the workers' block size).
    let decision = recent_decision(&http, &stack, "e2e-tokenize-turn-2").await;
    assert!(
        decision["cached_tokens"].as_u64() > Some(3_000),
        "turn 2 found turn 1's prefix: {decision}"
    );
    let after = stats(&http, &admin).await;
    assert_eq!(stat(&after, "route_input.hashes_total"), 2);
    assert_eq!(stat(&after, "fail_open_total"), 0);
    let bytes = stat(&after, "route_call_bytes_total") - stat(&before, "route_call_bytes_total");
    let bodies = first.to_string().len() + second.to_string().len();
    assert!(
        bytes * 4 < bodies as u64,
        "hashed route calls ({bytes} B) should be far smaller than the bodies ({bodies} B)"
    );

    // (c) The control plane answers a hashed prompt as it answers the body: the second turn
    // again (served, so its blocks are in the index and a route call predicts nothing new),
    // each call's load freed before the next so both see the same state.
    let control_plane = stack.control_plane_url();
    // What the VM loaded: the model's files, and the block size its workers registered.
    let bundle: TokenizerBundle = http
        .get(format!("{control_plane}{TOKENIZER_PATH}"))
        .header(MODEL_HEADER, "qwen3")
        .send()
        .await
        .expect("bundle")
        .json()
        .await
        .expect("a tokenizer bundle");
    let block_size = BlockSize::try_new(bundle.block_size).expect("a block size");
    assert_eq!(block_size.get(), 64, "the simulated workers' block size");
    let tokenizer = ModelTokenizer::from_files(&bundle.files, Path::new("bundle"), 1 << 20)
        .expect("the bundle makes a tokenizer");
    idle(&stack, &http).await;
    let (status, _, by_body) = route_call(
        &http,
        &control_plane,
        second.to_string().into_bytes(),
        false,
        "compare-body",
    )
    .await;
    assert_eq!(status, 200, "{by_body}");
    report_done(&http, &control_plane, "compare-body").await;
    idle(&stack, &http).await;
    let (status, _, by_hashes) = route_call(
        &http,
        &control_plane,
        hashed(&tokenizer, block_size, &second),
        true,
        "compare-hashes",
    )
    .await;
    assert_eq!(status, 200, "{by_hashes}");
    report_done(&http, &control_plane, "compare-hashes").await;
    let by_body: Verdict = serde_json::from_str(&by_body).expect("a verdict");
    let by_hashes: Verdict = serde_json::from_str(&by_hashes).expect("a verdict");
    assert!(by_body.cached_tokens > 0, "{by_body:?}");
    let essentials = |v: &Verdict| {
        (
            v.mode,
            v.decode.clone(),
            v.isl,
            v.cached_tokens,
            v.eff_isl,
            v.reason,
        )
    };
    assert_eq!(essentials(&by_hashes), essentials(&by_body));

    // (d) Refusals: a field the engine refuses is found in the hashed prompt's fields; a body
    // the tokenizer refuses goes as the body. Both get the control plane's answer for the body.
    let mut bad_max_tokens = first_turn("C");
    bad_max_tokens["max_tokens"] = json!(0);
    let mut bad_content = first_turn("D");
    bad_content["messages"][0]["content"] = json!(42);
    let mut bad_tool_choice = with_tools(first_turn("D2"));
    bad_tool_choice["tool_choice"] = json!({"type": "function", "function": {"name": "other"}});
    for (bad, hashed_call) in [
        (bad_max_tokens, true),
        (bad_content, false),
        (bad_tool_choice, true),
    ] {
        let before = stats(&http, &admin).await;
        let response = post(&http, &url, &bad).await;
        let (status, reject, answer) = route_call(
            &http,
            &control_plane,
            bad.to_string().into_bytes(),
            false,
            "compare-refusal",
        )
        .await;
        assert_eq!(response.status, status, "{}", response.body());
        assert_eq!(response.body(), answer);
        assert_eq!(
            response.header(ROUTE_HEADER),
            format!("rejected;reason={}", reject.expect("a reject reason"))
        );
        let after = stats(&http, &admin).await;
        let delta = |name| stat(&after, name) - stat(&before, name);
        assert_eq!(
            (
                delta("route_input.hashes_total"),
                delta("route_input.body.invalid_request")
            ),
            if hashed_call { (1, 0) } else { (0, 1) },
            "{bad}"
        );
    }

    // (e) A request that asks the engine to cut its prompt goes as the body (`-1` resolves
    // against the model's context, which the control plane knows) and is routed on the
    // tokens the engine keeps: the last 100 of the ~3,000, which the worker serves.
    let mut cut = first_turn("E");
    cut["truncate_prompt_tokens"] = json!(100);
    let before = stats(&http, &admin).await;
    let response = post_observed(
        &http,
        &url,
        &cut,
        &[(REQUEST_ID_HEADER, "e2e-tokenize-cut")],
        REQUEST_TIMEOUT,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_routed(&response, "a cut prompt");
    let answer: Value = serde_json::from_str(&response.body()).expect("a JSON answer");
    assert_eq!(answer["usage"]["prompt_tokens"], 100, "{answer}");
    let after = stats(&http, &admin).await;
    let delta = |name| stat(&after, name) - stat(&before, name);
    assert_eq!(
        (
            delta("route_input.body.truncated"),
            delta("route_input.hashes_total")
        ),
        (1, 0)
    );
    let decision = recent_decision(&http, &stack, "e2e-tokenize-cut").await;
    assert_eq!(decision["isl"], 100, "{decision}");

    // (f) Agentic requests: a `tool_choice` is checked against the tools it names, whose
    // names the hashed prompt's fields keep, so each of these is routed on its hashes.
    for (i, choice) in [
        json!("auto"),
        json!("required"),
        json!({"type": "function", "function": {"name": "lookup"}}),
    ]
    .into_iter()
    .enumerate()
    {
        let mut body = with_tools(first_turn(&format!("F{i}")));
        body["tool_choice"] = choice;
        let before = stats(&http, &admin).await;
        assert_routed(
            &post(&http, &url, &body).await,
            &body["tool_choice"].to_string(),
        );
        let after = stats(&http, &admin).await;
        assert_eq!(
            stat(&after, "route_input.hashes_total") - stat(&before, "route_input.hashes_total"),
            1,
            "{}",
            body["tool_choice"]
        );
    }
}

/// `body` offering one tool.
fn with_tools(mut body: Value) -> Value {
    body["tools"] = json!([{"type": "function", "function": {
        "name": "lookup",
        "description": "Looks a word up",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}
    }}]);
    body
}
