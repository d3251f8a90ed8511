//! The done-when: a real nats-server, a prefill and a decode worker, a prefill ->
//! decode handoff driven by hand-built requests, the decode worker's KV events on NATS with
//! the real tokenizer's sequence hashes, failed pulls falling back to local prefill, heartbeats
//! and a resync dump.

use crate::worker_support;

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use switchyard_protocol::hash::{sequence_hashes, BlockSize, HashSeed, SequenceHash};
use switchyard_protocol::kv::{KvEvent, KvEventBatch, ResyncRequest};
use switchyard_protocol::route::ApiKind;
use switchyard_protocol::subjects;
use switchyard_protocol::worker::{LoadReport, WorkerHeartbeat, WorkerId, WorkerRole};
use switchyard_sim_worker::{PullFailure, RunningWorker, WorkerConfig};
use worker_support::{
    base_url, chat_body, config, metric, metrics_text, post_for_json, post_json, start, tokenizer,
    NatsServer, CHAT, COMPLETIONS,
};

const WAIT: Duration = Duration::from_secs(10);

/// The prefill leg's body, as the Switchyard filter (or vLLM's proxy) builds it.
fn prefill_leg(body: &Value) -> Value {
    let mut leg = body.clone();
    leg["max_tokens"] = json!(1);
    leg["stream"] = json!(false);
    leg["kv_transfer_params"] = json!({
        "do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
        "remote_block_ids": null, "remote_host": null, "remote_port": null,
    });
    leg
}

/// POSTs to `path` a request that must succeed; returns who served it and the answer.
async fn post(
    client: &reqwest::Client,
    w: &RunningWorker,
    path: &str,
    body: &Value,
) -> (String, Value) {
    let resp = post_json(client, w, path, body).await;
    assert_eq!(resp.status(), 200);
    let served_by = resp.headers()["x-switchyard-worker"]
        .to_str()
        .unwrap()
        .to_owned();
    (served_by, resp.json().await.unwrap())
}

/// Runs the prefill leg of a request to `path` on `prefill` (which must serve it, with one
/// token) and returns its `kv_transfer_params`.
async fn run_prefill_leg(
    client: &reqwest::Client,
    prefill: &RunningWorker,
    path: &str,
    body: &Value,
) -> Value {
    let (served_by, v) = post(client, prefill, path, &prefill_leg(body)).await;
    assert_eq!(served_by, prefill.id().0);
    assert_eq!(v["usage"]["completion_tokens"], 1);
    v["kv_transfer_params"].clone()
}

/// Collects batches from `sub` until `done` holds for what arrived (bounded by [`WAIT`]).
async fn collect_batches(
    sub: &mut async_nats::Subscriber,
    out: &mut Vec<KvEventBatch>,
    done: impl Fn(&[KvEventBatch]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done(out) {
        let msg = tokio::time::timeout_at(deadline, sub.next())
            .await
            .expect("KV events did not arrive in time")
            .expect("subscription open");
        out.push(serde_json::from_slice(&msg.payload).expect("a KvEventBatch"));
    }
}

/// A worker config whose heartbeats and load reports come every 100 ms.
fn reporting_often(role: WorkerRole, id: &str) -> WorkerConfig {
    let mut cfg = config(role, id);
    cfg.heartbeat_interval_ms = 100;
    cfg.load_interval_ms = 100;
    cfg
}

/// Failed pulls for `reason` in a decode worker's `/metrics` text.
fn pull_failures(text: &str, reason: &str) -> f64 {
    metric(
        text,
        "switchyard_kv_pull_failures_total",
        Some(&format!("reason=\"{reason}\"")),
    )
}

/// Successful pulls the decode worker counted.
fn kv_pulls(w: &RunningWorker) -> u64 {
    w.metrics()
        .kv_pulls
        .load(std::sync::atomic::Ordering::Relaxed)
}

fn stored_hashes(batches: &[KvEventBatch]) -> Vec<SequenceHash> {
    batches
        .iter()
        .flat_map(|b| &b.events)
        .filter_map(|e| match e {
            KvEvent::Stored { blocks, .. } => Some(blocks.iter().map(|b| b.seq_hash)),
            _ => None,
        })
        .flatten()
        .collect()
}

#[tokio::test]
async fn prefill_to_decode_handoff_over_real_http_with_kv_events_on_nats() {
    let nats_server = NatsServer::start();
    let observer = async_nats::connect(&nats_server.url).await.unwrap();
    let mut heartbeats = observer.subscribe(subjects::HEARTBEAT_ALL).await.unwrap();
    let mut loads = observer.subscribe(subjects::LOAD_ALL).await.unwrap();
    let decode_id = WorkerId("decode-0".into());
    let mut decode_events = observer
        .subscribe(subjects::kv_events(&decode_id))
        .await
        .unwrap();
    observer.flush().await.unwrap();

    let tok = tokenizer();
    let workers_nats = switchyard_bus::connect(
        &switchyard_bus::NatsArgs::plain(nats_server.url.clone()),
        "test-workers",
        switchyard_bus::ignore_event,
    )
    .await
    .unwrap();
    let prefill_cfg = reporting_often(WorkerRole::Prefill, "prefill-0");
    let prefill = start(prefill_cfg, &tok, Some(&workers_nats)).await;
    let decode_cfg = reporting_often(WorkerRole::Decode, "decode-0");
    let decode = start(decode_cfg, &tok, Some(&workers_nats)).await;

    // Heartbeats register both workers with their real addresses.
    let mut seen = HashSet::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while seen.len() < 2 {
        let msg = tokio::time::timeout_at(deadline, heartbeats.next())
            .await
            .expect("heartbeats")
            .unwrap();
        let hb: WorkerHeartbeat = serde_json::from_slice(&msg.payload).unwrap();
        let w = if hb.worker.worker_id == decode_id {
            &decode
        } else {
            &prefill
        };
        assert_eq!(hb.worker.address, w.local_addr().to_string());
        assert_eq!(hb.worker.instance_id, w.instance_id());
        assert_eq!(hb.worker.block_size, 64);
        assert!(hb.worker.kv_capacity_blocks > 0);
        assert_eq!(hb.interval_ms, 100);
        let expected_role = if hb.worker.worker_id == decode_id {
            WorkerRole::Decode
        } else {
            WorkerRole::Prefill
        };
        assert_eq!(hb.worker.role, expected_role);
        seen.insert(hb.worker.worker_id);
    }
    let msg = tokio::time::timeout(WAIT, loads.next())
        .await
        .expect("load reports")
        .unwrap();
    let load: LoadReport = serde_json::from_slice(&msg.payload).unwrap();
    assert!(load.kv_total_blocks > 0);

    let client = reqwest::Client::new();
    let body = chat_body("handoff", 600, 8);
    let tokens = tok.tokenize_request(ApiKind::Chat, &body).unwrap();
    let expected_hashes = sequence_hashes(
        &tokens,
        BlockSize::try_new(64).unwrap(),
        HashSeed::default(),
    );
    assert!(
        expected_hashes.len() >= 5,
        "prompt of {} tokens is too short",
        tokens.len()
    );

    // 1. Prefill leg: vLLM NixlConnector's response fields, naming the prefill worker.
    let params = run_prefill_leg(&client, &prefill, CHAT, &body).await;
    assert_eq!(params["do_remote_prefill"], true);
    assert_eq!(params["do_remote_decode"], false);
    assert_eq!(params["remote_engine_id"], "prefill-0");
    assert_eq!(params["remote_host"], "127.0.0.1");
    assert_eq!(params["remote_port"], prefill.local_addr().port());
    assert_eq!(params["tp_size"], 1);
    assert!(params["remote_request_id"]
        .as_str()
        .is_some_and(|s| !s.is_empty()));
    let blocks = params["remote_block_ids"].as_array().unwrap();
    assert!(blocks.len() >= tokens.len() / 64, "{blocks:?}");
    let text = metrics_text(&client, &prefill).await;
    assert_eq!(metric(&text, "switchyard_kv_held_requests", None), 1.0);

    // 2. Decode leg: the prefill response's params go verbatim into the decode request.
    let mut decode_req = body.clone();
    decode_req["kv_transfer_params"] = params.clone();
    let (served_by, v) = post(&client, &decode, CHAT, &decode_req).await;
    assert_eq!(served_by, "decode-0");
    assert_eq!(v["usage"]["completion_tokens"], 8);
    assert_eq!(v["usage"]["prompt_tokens"], tokens.len());
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"],
        tokens.len()
    );
    assert!(v.get("kv_transfer_params").is_none());

    // The decode worker reports the transfer and did no prefill of its own.
    let text = metrics_text(&client, &decode).await;
    assert_eq!(metric(&text, "switchyard_kv_pulls_total", None), 1.0);
    assert_eq!(
        metric(&text, "switchyard_kv_transfer_tokens_total", None),
        tokens.len() as f64
    );
    assert!(metric(&text, "switchyard_kv_transfer_seconds_total", None) > 0.0);
    assert_eq!(
        metric(&text, "switchyard_local_prefill_tokens_total", None),
        0.0
    );
    for reason in PullFailure::ALL {
        assert_eq!(pull_failures(&text, reason.as_str()), 0.0);
    }
    // The prefill worker released the hold.
    let text = metrics_text(&client, &prefill).await;
    assert_eq!(metric(&text, "switchyard_kv_holds_pulled_total", None), 1.0);
    assert_eq!(metric(&text, "switchyard_kv_held_requests", None), 0.0);

    // 3. The decode worker's KV events: Stored for every prompt block, with the sequence
    //    hashes the control plane computes from the same tokenizer, seqs 1, 2, ...
    let mut batches = Vec::new();
    let want = expected_hashes.clone();
    collect_batches(&mut decode_events, &mut batches, |b| {
        let got: HashSet<_> = stored_hashes(b).into_iter().collect();
        want.iter().all(|h| got.contains(h))
    })
    .await;
    assert_eq!(
        stored_hashes(&batches)[..expected_hashes.len()],
        expected_hashes[..]
    );
    for (i, b) in batches.iter().enumerate() {
        assert_eq!(b.seq, i as u64 + 1);
        assert_eq!(b.worker_id, decode_id);
        assert_eq!(b.instance_id, decode.instance_id());
        assert!(!b.resync);
    }

    // 4. Pulling the same hold again fails (already released): local prefill, counted.
    let (_, v) = post(&client, &decode, CHAT, &decode_req).await;
    assert_eq!(v["usage"]["completion_tokens"], 8);
    let text = metrics_text(&client, &decode).await;
    assert_eq!(pull_failures(&text, "not_held"), 1.0);
    assert_eq!(metric(&text, "switchyard_kv_pulls_total", None), 1.0);

    // 5. A resync request is answered on the event subject: Cleared, then the cached blocks,
    //    resync: true, sequence numbers continuing the stream.
    let last_seq = batches.last().unwrap().seq;
    let req = ResyncRequest {
        v: 1,
        worker_id: decode_id.clone(),
        reason: "test".into(),
    };
    observer
        .publish(
            subjects::kv_resync(&decode_id),
            serde_json::to_vec(&req).unwrap().into(),
        )
        .await
        .unwrap();
    let mut dump = Vec::new();
    collect_batches(&mut decode_events, &mut dump, |b| {
        b.iter().any(|x| x.resync)
    })
    .await;
    // Step 4 may have published ordinary batches first; numbering stays gap-free across both.
    let mut prev = last_seq;
    for b in &dump {
        assert_eq!(b.seq, prev + 1);
        prev = b.seq;
    }
    let dump: Vec<KvEventBatch> = dump.into_iter().skip_while(|b| !b.resync).collect();
    assert_eq!(dump[0].events[0], KvEvent::Cleared);
    let dumped: HashSet<_> = stored_hashes(&dump).into_iter().collect();
    assert!(expected_hashes.iter().all(|h| dumped.contains(h)));
    for pair in dump.windows(2) {
        assert_eq!(pair[1].seq, pair[0].seq + 1);
    }
    assert_eq!(
        decode
            .metrics()
            .kv_resyncs
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test]
async fn failed_pulls_fall_back_to_local_prefill_and_are_counted() {
    let tok = tokenizer();
    let client = reqwest::Client::new();
    // A lease of 50 model-ms: the hold expires before the decode request arrives.
    let mut short_lease = config(WorkerRole::Prefill, "prefill-lease");
    short_lease.engine.prefill_hold_lease_ms = 50.0;
    let prefill_lease = start(short_lease, &tok, None).await;
    let gone = start(config(WorkerRole::Prefill, "prefill-gone"), &tok, None).await;
    let decode = start(config(WorkerRole::Decode, "decode-fallback"), &tok, None).await;

    // Lease expired.
    let body = chat_body("lease", 300, 4);
    let params = run_prefill_leg(&client, &prefill_lease, CHAT, &body).await;
    let released =
        worker_support::eventually(WAIT, || async { prefill_lease.engine().load().held == 0 })
            .await;
    assert!(released, "the lease never expired");
    let mut req = body.clone();
    req["kv_transfer_params"] = params;
    let (served_by, v) = post(&client, &decode, CHAT, &req).await;
    assert_eq!(served_by, "decode-fallback");
    assert_eq!(v["usage"]["completion_tokens"], 4);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let prompt_tokens = v["usage"]["prompt_tokens"].as_f64().unwrap();

    // Prefill worker gone.
    let body2 = chat_body("gone", 300, 4);
    let params = run_prefill_leg(&client, &gone, CHAT, &body2).await;
    gone.stop();
    let mut req2 = body2.clone();
    req2["kv_transfer_params"] = params;
    let (_, v2) = post(&client, &decode, CHAT, &req2).await;
    assert_eq!(v2["usage"]["completion_tokens"], 4);

    // Params naming nobody.
    let mut req3 = chat_body("nobody", 50, 2);
    req3["kv_transfer_params"] = json!({"do_remote_prefill": true});
    post(&client, &decode, CHAT, &req3).await;

    let text = metrics_text(&client, &decode).await;
    for reason in ["not_held", "unreachable", "invalid_params"] {
        assert_eq!(pull_failures(&text, reason), 1.0, "{reason}");
    }
    assert_eq!(metric(&text, "switchyard_kv_pulls_total", None), 0.0);
    // Every prompt was prefilled here.
    let local = metric(&text, "switchyard_local_prefill_tokens_total", None);
    assert!(local >= prompt_tokens + v2["usage"]["prompt_tokens"].as_f64().unwrap());
    assert_eq!(decode.metrics().pull_failures(PullFailure::Mismatch), 0);
}

/// `POST /switchyard/kv/release` with the body the docs show frees the hold at once; a
/// second release finds nothing held, which is no error (nothing stays held, as asked: the
/// gateway releases a non-streamed request's hold when its client leaves, not knowing the
/// decode worker pulled it), while another worker's hold id is refused.
#[tokio::test]
async fn a_release_frees_the_hold_once() {
    let tok = tokenizer();
    let client = reqwest::Client::new();
    let prefill = start(config(WorkerRole::Prefill, "prefill-release"), &tok, None).await;
    let params = run_prefill_leg(&client, &prefill, CHAT, &chat_body("release", 300, 4)).await;
    assert_eq!(prefill.engine().load().held, 1);
    let url = format!("{}/switchyard/kv/release", base_url(&prefill));
    let body = json!({"remote_request_id": params["remote_request_id"]});
    let first = client.post(&url).json(&body).send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(prefill.engine().load().held, 0);
    let again = client.post(&url).json(&body).send().await.unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(
        again.json::<serde_json::Value>().await.unwrap()["released"],
        serde_json::Value::Null
    );
    let foreign = json!({"remote_request_id": "someone-else-1-2"});
    let refused = client.post(&url).json(&foreign).send().await.unwrap();
    assert_eq!(refused.status(), 404);
    let text = metrics_text(&client, &prefill).await;
    assert_eq!(
        metric(&text, "switchyard_kv_holds_released_total", None),
        1.0
    );
    // Only the foreign id counts as a bad request.
    assert_eq!(metric(&text, "switchyard_bad_requests_total", None), 1.0);
}

#[tokio::test]
async fn a_pull_of_kv_not_held_yet_is_a_404_but_no_bad_request() {
    let client = reqwest::Client::new();
    let prefill = start(
        config(WorkerRole::Prefill, "prefill-not-yet"),
        &tokenizer(),
        None,
    )
    .await;
    let url = format!("{}/switchyard/kv/pull", base_url(&prefill));
    // An SGLang decode worker asks for its room until the prefill leg, which runs at the
    // same time, holds it: part of the handoff, which counted as a bad request each time.
    let early = json!({"remote_request_id": "room-7"});
    let answer = client.post(&url).json(&early).send().await.unwrap();
    assert_eq!(answer.status(), 404);
    let text = metrics_text(&client, &prefill).await;
    assert_eq!(metric(&text, "switchyard_bad_requests_total", None), 0.0);
}

#[tokio::test]
async fn a_pull_for_a_different_prompt_is_a_mismatch() {
    let tok = tokenizer();
    let client = reqwest::Client::new();
    let prefill = start(config(WorkerRole::Prefill, "prefill-mm"), &tok, None).await;
    let decode = start(config(WorkerRole::Decode, "decode-mm"), &tok, None).await;

    // A different length.
    let params = run_prefill_leg(&client, &prefill, CHAT, &chat_body("one", 200, 2)).await;
    let mut other = chat_body("another prompt entirely", 50, 2);
    other["kv_transfer_params"] = params;
    let (_, v) = post(&client, &decode, CHAT, &other).await;
    assert_eq!(v["usage"]["completion_tokens"], 2);
    assert_eq!(decode.metrics().pull_failures(PullFailure::Mismatch), 1);

    // The same length, different tokens (completions with token-id prompts).
    let ids = |t: u32| json!((0..300).map(|i| 1_000 + i * 7 + t).collect::<Vec<u32>>());
    let params = run_prefill_leg(&client, &prefill, COMPLETIONS, &json!({"prompt": ids(0)})).await;
    assert_eq!(params["do_remote_prefill"], true);
    let decode_req = json!({"prompt": ids(1), "max_tokens": 2, "kv_transfer_params": params});
    let resp = post_json(&client, &decode, COMPLETIONS, &decode_req).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(decode.metrics().pull_failures(PullFailure::Mismatch), 2);
    assert_eq!(kv_pulls(&decode), 0);

    // And the matching prompt pulls fine.
    let params = run_prefill_leg(&client, &prefill, COMPLETIONS, &json!({"prompt": ids(2)})).await;
    let decode_req = json!({"prompt": ids(2), "max_tokens": 2, "kv_transfer_params": params});
    let v = post_for_json(&client, &decode, COMPLETIONS, &decode_req).await;
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 300);
    assert_eq!(kv_pulls(&decode), 1);
}

#[tokio::test]
async fn missing_suffix_mode_transfers_only_what_the_decode_worker_lacks() {
    let tok = tokenizer();
    let client = reqwest::Client::new();
    let prefill = start(config(WorkerRole::Prefill, "prefill-sfx"), &tok, None).await;
    let mut decode_cfg = config(WorkerRole::Decode, "decode-sfx");
    decode_cfg.engine.transfer.mode = switchyard_engine::TransferMode::MissingSuffix;
    let decode = start(decode_cfg, &tok, None).await;
    let ids: Vec<u32> = (0..1_000).map(|i| 500 + i * 3).collect();

    // The decode worker already holds the first 640 tokens (10 blocks) from an earlier turn.
    let warm = json!({"prompt": ids[..640], "max_tokens": 1});
    let resp = post_json(&client, &decode, COMPLETIONS, &warm).await;
    assert_eq!(resp.status(), 200);

    let params = run_prefill_leg(&client, &prefill, COMPLETIONS, &json!({"prompt": ids})).await;
    let req = json!({"prompt": ids, "max_tokens": 2, "kv_transfer_params": params});
    let v = post_for_json(&client, &decode, COMPLETIONS, &req).await;
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 1_000);
    let text = metrics_text(&client, &decode).await;
    assert_eq!(metric(&text, "switchyard_kv_pulls_total", None), 1.0);
    assert_eq!(
        metric(&text, "switchyard_kv_transfer_tokens_total", None),
        360.0
    );
    // Only the warm-up turn was prefilled here (640 prompt tokens, all computed locally).
    assert_eq!(
        metric(&text, "switchyard_local_prefill_tokens_total", None),
        640.0
    );
}

/// A `cache_salt` keys a prompt's blocks apart, as vLLM does: the same tokens hit the cache
/// only under the same salt, and a salted prompt's KV hands over to a decode worker that
/// asks with that salt.
#[tokio::test]
async fn a_cache_salt_keys_the_prompts_blocks_apart() {
    let tok = tokenizer();
    let client = reqwest::Client::new();
    let worker = start(config(WorkerRole::Decode, "decode-salt"), &tok, None).await;
    let ids: Vec<u32> = (0..640).map(|i| 700 + i * 5).collect();
    let cached = |body: serde_json::Value| {
        let (client, worker) = (&client, &worker);
        async move {
            let v = post_for_json(client, worker, COMPLETIONS, &body).await;
            v["usage"]["prompt_tokens_details"]["cached_tokens"].clone()
        }
    };
    let plain = json!({"prompt": ids, "max_tokens": 1});
    let salted = |salt: &str| json!({"prompt": ids, "max_tokens": 1, "cache_salt": salt});
    assert_eq!(cached(plain.clone()).await, 0);
    assert_eq!(
        cached(plain).await,
        576,
        "unsalted: the full blocks but the last"
    );
    assert_eq!(
        cached(salted("tenant-a")).await,
        0,
        "no hit on unsalted blocks"
    );
    assert_eq!(
        cached(salted("tenant-a")).await,
        576,
        "a hit under its own salt"
    );
    assert_eq!(cached(salted("tenant-b")).await, 0, "none under another");
    // Prompt logprobs, asked outright or through `echo` with `logprobs`: as in vLLM, no
    // cached prefix is read (the prompt is computed whole), though one is there.
    for asks in [
        json!({"prompt": ids, "max_tokens": 1, "prompt_logprobs": 0}),
        json!({"prompt": ids, "max_tokens": 1, "echo": true, "logprobs": 1}),
    ] {
        assert_eq!(cached(asks.clone()).await, 0, "{asks}");
    }
    assert_eq!(
        cached(json!({"prompt": ids, "max_tokens": 1, "echo": true})).await,
        576,
        "echo alone asks no prompt logprobs of completions"
    );

    // A salted handoff: the decode worker finds the prefill worker's KV under the salt.
    let prefill = start(config(WorkerRole::Prefill, "prefill-salt"), &tok, None).await;
    let leg = json!({"prompt": ids, "cache_salt": "tenant-c"});
    let params = run_prefill_leg(&client, &prefill, COMPLETIONS, &leg).await;
    let decode_req = json!({"prompt": ids, "max_tokens": 2, "cache_salt": "tenant-c", "kv_transfer_params": params});
    let v = post_for_json(&client, &worker, COMPLETIONS, &decode_req).await;
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 640);
    assert_eq!(worker.metrics().pull_failures(PullFailure::Mismatch), 0);
}
