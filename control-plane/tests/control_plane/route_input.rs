//! The hashed route input of a filter that tokenizes itself (`tokenize: filter`): the
//! tokenizer bundle names the live workers' block size, a hashed prompt gets the verdict the
//! body gets, and its fields are validated as the body is.

use crate::common;

use std::path::Path;

use common::*;
use serde_json::{json, Value};
use switchyard_control_plane::settings::Settings;
use switchyard_protocol::hash::BlockSize;
use switchyard_protocol::lifecycle::{LifecycleBatch, LifecycleEvent, LIFECYCLE_PATH};
use switchyard_protocol::route::{ApiKind, Verdict, API_HEADER, REJECT_HEADER, REQUEST_ID_HEADER};
use switchyard_protocol::route_input::{
    HashedPrompt, ROUTE_INPUT_HASHES, ROUTE_INPUT_HEADER, TOKENIZER_PATH,
};
use switchyard_protocol::tokenize::{ModelTokenizer, TokenizerBundle};
use switchyard_protocol::worker::WorkerRole;

async fn route_hashed(base: &str, request_id: &str, bytes: Vec<u8>) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}/v1/route"))
        .header(API_HEADER, "chat")
        .header(REQUEST_ID_HEADER, request_id)
        .header(ROUTE_INPUT_HEADER, ROUTE_INPUT_HASHES)
        .body(bytes)
        .send()
        .await
        .expect("route call")
}

/// Frees a routed request's load, as the filter's lifecycle report would.
async fn done(base: &str, request_id: &str) {
    let batch = LifecycleBatch::new(vec![LifecycleEvent::completed(request_id)]);
    let response = reqwest::Client::new()
        .post(format!("{base}{LIFECYCLE_PATH}"))
        .json(&batch)
        .send()
        .await
        .expect("lifecycle");
    assert!(response.status().is_success());
}

fn hashed(tokenizer: &ModelTokenizer, block_size: BlockSize, body: &Value) -> HashedPrompt {
    let tokens = tokenizer
        .tokenize_request(ApiKind::Chat, body)
        .expect("tokenizes");
    HashedPrompt::of(&tokens, block_size, body.as_object().expect("an object"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hashed_prompt_is_routed_and_refused_as_its_body_is() {
    let mut settings = Settings::for_tests();
    settings.max_model_len = Some(4_096);
    let (_server, svc, nats) = service_with_nats(settings).await;
    let mut info = worker("decode-0", WorkerRole::Decode, 9001, 1);
    info.block_size = 32;
    register(&svc, &nats, &info, 60_000).await;

    // The bundle: the model's files, at the live worker's block size.
    let bundle: TokenizerBundle = reqwest::get(format!("{}{TOKENIZER_PATH}", svc.base))
        .await
        .expect("bundle")
        .json()
        .await
        .expect("a bundle");
    assert_eq!(bundle.block_size, 32);
    let block_size = BlockSize::try_new(32).unwrap();
    let tokenizer =
        ModelTokenizer::from_files(&bundle.files, Path::new("bundle"), 1 << 20).expect("loads");

    // The same request by body and by hashes, each seeing the same router state (the first
    // call's predicted blocks, no load): the same verdict.
    let body = json!({
        "model": "qwen3",
        "messages": [{"role": "user", "content": "Blocks and hashes. ".repeat(100)}],
        "max_tokens": 8,
    });
    let by_body = |id: &'static str| {
        let base = svc.base.clone();
        let text = body.to_string();
        async move { route(&base, "chat", Some(id), text).await }
    };
    assert_eq!(by_body("first").await.status(), 200);
    done(&svc.base, "first").await;
    let prompt = hashed(&tokenizer, block_size, &body);
    let response = route_hashed(&svc.base, "by-hashes", prompt.encode()).await;
    assert_eq!(response.status(), 200);
    let by_hashes: Verdict = response.json().await.unwrap();
    done(&svc.base, "by-hashes").await;
    let by_body: Verdict = by_body("by-body").await.json().await.unwrap();
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
    assert!(by_body.cached_tokens > 0, "{by_body:?}");
    // Only a body the control plane parsed can be vouched for.
    assert!(by_body.steering_free && !by_hashes.steering_free);
    assert_eq!(essentials(&by_hashes), essentials(&by_body));

    // Refusals come from the same checks: a field the engine refuses, a prompt too long.
    let mut bad = body.clone();
    bad["max_tokens"] = json!(0);
    let refused_body = route(&svc.base, "chat", Some("bad-body"), bad.to_string()).await;
    let refused_hashes = route_hashed(
        &svc.base,
        "bad-hashes",
        hashed(&tokenizer, block_size, &bad).encode(),
    )
    .await;
    assert_eq!(refused_hashes.status(), refused_body.status());
    assert_eq!(
        refused_hashes.headers().get(REJECT_HEADER),
        refused_body.headers().get(REJECT_HEADER)
    );
    assert_eq!(
        refused_hashes.text().await.unwrap(),
        refused_body.text().await.unwrap()
    );
    let mut long = hashed(&tokenizer, block_size, &body);
    long.isl = 4_097;
    long.hashes = vec![long.hashes[0]; 4_097 / 32];
    let too_long = route_hashed(&svc.base, "too-long", long.encode()).await;
    assert_eq!(too_long.status(), 400);
    assert_eq!(
        too_long.headers().get(REJECT_HEADER).unwrap(),
        "prompt_too_long"
    );

    // Bytes that are not a hashed prompt: the filter's bug, a 400 of our own, counted.
    let garbage = route_hashed(
        &svc.base,
        "garbage",
        br#"{"model": "qwen3", "messages": []}"#.to_vec(),
    )
    .await;
    assert_eq!(garbage.status(), 400);
    let error: Value = garbage.json().await.unwrap();
    assert_eq!(error["code"], "bad_route_input", "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("magic"),
        "{error}"
    );
    assert_metric(
        &svc.metrics().await,
        "switchyard_route_bad_requests_total{code=\"bad_route_input\"}",
        1.0,
    );
    svc.stop().await;
}
