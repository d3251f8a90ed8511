//! The point of Switchyard, end to end: KV events published on NATS the way a worker does
//! (sequence hashes of the tokens it cached, computed with the real Qwen3 tokenizer) steer a
//! conversation's second turn back to the worker holding its first turn, and the policy
//! bypasses the prefill pool for it; a cold long prompt is disaggregated; a decode worker
//! whose load report says it is nearly full gets no bypass.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use switchyard_control_plane::settings::Settings;
use switchyard_protocol::hash::{sequence_hashes, BlockSize, HashSeed};
use switchyard_protocol::kv::{EngineBlockId, KvEvent, KvEventBatch, StoredBlock};
use switchyard_protocol::lifecycle::{LifecycleBatch, LifecycleEvent};
use switchyard_protocol::route::{ApiKind, Reason, RouteMode, Verdict};
use switchyard_protocol::subjects;
use switchyard_protocol::worker::{LoadReport, WorkerId, WorkerInfo, WorkerRole};

const WAIT: Duration = Duration::from_secs(10);

/// Deterministic prose of roughly `words` words, different for each `topic`.
fn prose(topic: &str, words: usize) -> String {
    let vocab = [
        "cluster", "latency", "prefix", "cache", "decode", "prefill", "token", "worker", "router",
        "policy", "stream", "block", "session", "agent", "context", "window",
    ];
    (0..words)
        .map(|i| {
            if i % 12 == 0 {
                format!("{topic} note {i}:")
            } else {
                vocab[(i * 7 + topic.len()) % vocab.len()].to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn first_turn() -> Value {
    json!({"model": "qwen3", "messages": [
        {"role": "system", "content": prose("handbook", 2_400)},
        {"role": "user", "content": "Summarise the handbook's advice on prefix caching."}
    ]})
}

fn second_turn() -> Value {
    let mut body = first_turn();
    let messages = body["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": "Keep sessions on the worker that holds their prefix."}));
    messages.push(json!({"role": "user", "content": "And what about long cold prompts?"}));
    body
}

async fn route_json(base: &str, id: &str, body: &Value) -> Verdict {
    let resp = route(base, "chat", Some(id), body.to_string()).await;
    assert_eq!(resp.status(), 200, "{id}");
    resp.json().await.unwrap()
}

/// Publishes what a worker publishes after caching `tokens`: one batch of `stored` events
/// carrying the sequence hashes of the tokens' full blocks.
async fn publish_stored(
    nats: &async_nats::Client,
    worker: &WorkerInfo,
    seq: u64,
    tokens: &[u32],
) -> usize {
    let bs = BlockSize::try_new(worker.block_size).unwrap();
    let blocks: Vec<StoredBlock> = sequence_hashes(tokens, bs, HashSeed::default())
        .into_iter()
        .enumerate()
        .map(|(i, seq_hash)| StoredBlock {
            seq_hash,
            block_id: EngineBlockId(seq * 1_000_000 + i as u64),
        })
        .collect();
    let n = blocks.len();
    let batch = KvEventBatch {
        v: 1,
        worker_id: worker.worker_id.clone(),
        instance_id: worker.instance_id,
        seq,
        resync: false,
        events: vec![KvEvent::Stored {
            parent: None,
            parent_block_id: None,
            blocks,
            block_size: worker.block_size,
        }],
    };
    nats.publish(
        subjects::kv_events(&worker.worker_id),
        serde_json::to_vec(&batch).unwrap().into(),
    )
    .await
    .unwrap();
    nats.flush().await.unwrap();
    n
}

async fn cached_blocks(svc: &Service, id: &WorkerId) -> u64 {
    let doc = svc.get_json("/v1/workers").await;
    doc["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["info"]["worker_id"] == id.0.as_str())
        .map(|w| w["cached_blocks"].as_u64().unwrap_or(0))
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_turn_goes_home_and_bypasses_cold_prompts_disaggregate_busy_decoders_do_not_bypass()
{
    let (_server, svc, nats) = service_with_nats(Settings::for_tests()).await;
    let decoders = [
        register_worker(&svc, &nats, "decode-0", WorkerRole::Decode, 9001).await,
        register_worker(&svc, &nats, "decode-1", WorkerRole::Decode, 9002).await,
    ];
    let prefill = register_worker(&svc, &nats, "prefill-0", WorkerRole::Prefill, 9100).await;
    let http = reqwest::Client::new();

    // Turn 1: a cold ~3k-token prompt. Too much to prefill on a decode worker: disaggregated.
    let turn1 = first_turn();
    let v1 = route_json(&svc.base, "turn-1", &turn1).await;
    assert_eq!(v1.mode, RouteMode::Disagg, "{v1:?}");
    assert!(v1.isl > 2_048, "a long first turn: {v1:?}");
    assert_eq!(v1.cached_tokens, 0);
    assert_eq!(v1.prefill.as_ref().unwrap().worker_id, prefill.worker_id);
    let home = decoders
        .iter()
        .find(|w| w.worker_id == v1.decode.worker_id)
        .unwrap();
    let other = decoders
        .iter()
        .find(|w| w.worker_id != home.worker_id)
        .unwrap();

    // The decode worker now holds turn 1's KV and says so on NATS; the filter reports done.
    let turn1_tokens = tokenizer().tokenize(ApiKind::Chat, &turn1).unwrap();
    assert_eq!(
        turn1_tokens.len() as u32,
        v1.isl,
        "test and service tokenize alike"
    );
    let stored = publish_stored(&nats, home, 1, &turn1_tokens).await;
    eventually(WAIT, "turn 1 blocks indexed", || async {
        cached_blocks(&svc, &home.worker_id).await == stored as u64
    })
    .await;
    eventually(WAIT, "stored blocks counted", || async {
        metric_value(&svc.metrics().await, "switchyard_kv_blocks_stored_total") == stored as f64
    })
    .await;
    let done = LifecycleBatch {
        v: 1,
        events: vec![
            LifecycleEvent::FirstToken {
                request_id: "turn-1".into(),
            },
            LifecycleEvent::Done {
                request_id: "turn-1".into(),
                prompt_tokens: Some(v1.isl),
                completion_tokens: Some(12),
                ok: true,
                failed_open: false,
                route_call: None,
            },
        ],
    };
    let resp = http
        .post(format!("{}/v1/lifecycle", svc.base))
        .json(&done)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    // Turn 2: same conversation plus a short exchange. It goes home and bypasses.
    let v2 = route_json(&svc.base, "turn-2", &second_turn()).await;
    assert_eq!(v2.decode.worker_id, home.worker_id, "{v2:?}");
    assert_eq!(v2.mode, RouteMode::Bypass, "{v2:?}");
    assert_eq!(v2.reason, Reason::BypassIslBounding);
    assert_eq!(v2.cached_tokens as usize, stored * 16, "{v2:?}");
    assert!(
        v2.eff_isl < 200,
        "only the new exchange is uncached: {v2:?}"
    );
    assert!(v2.prefill.is_none());

    // The same turn with a `cache_salt`: the engine keys its blocks by the salt, so turn 1's
    // blocks are no hit for it, and a bypass would prefill the whole prompt on the decode
    // worker. Its load is given back at once.
    let mut salted = second_turn();
    salted["cache_salt"] = json!("tenant-b-4f1c");
    let v_salted = route_json(&svc.base, "turn-2-salted", &salted).await;
    assert_eq!(v_salted.cached_tokens, 0, "{v_salted:?}");
    assert_eq!(v_salted.mode, RouteMode::Disagg, "{v_salted:?}");
    // The same turn asking for prompt logprobs (chat's `echo`, or `prompt_logprobs`): vLLM
    // reads no cached prefix for it, nor one handed over, so it matches no cache and stays
    // on a decode worker that computes it whole.
    let mut echoed = second_turn();
    echoed["echo"] = json!(true);
    let mut logprobs = second_turn();
    logprobs["prompt_logprobs"] = json!(0);
    let mut recomputed = Vec::new();
    for (id, body) in [("turn-2-echo", echoed), ("turn-2-logprobs", logprobs)] {
        let v = route_json(&svc.base, id, &body).await;
        assert_eq!(
            (v.mode, v.reason, v.cached_tokens, v.eff_isl),
            (RouteMode::Bypass, Reason::BypassPromptLogprobs, 0, v2.isl),
            "{v:?}"
        );
        recomputed.push(id);
    }
    let gone = LifecycleBatch {
        v: 1,
        events: ["turn-2-salted"]
            .into_iter()
            .chain(recomputed)
            .map(|id| LifecycleEvent::Done {
                request_id: id.into(),
                prompt_tokens: None,
                completion_tokens: None,
                ok: false,
                failed_open: false,
                route_call: None,
            })
            .collect(),
    };
    let resp = http
        .post(format!("{}/v1/lifecycle", svc.base))
        .json(&gone)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    // A cold long prompt elsewhere: disaggregated, whatever worker decodes it.
    let cold = json!({"model": "qwen3", "messages": [
        {"role": "user", "content": prose("unrelated", 3_000)}
    ]});
    let v3 = route_json(&svc.base, "cold", &cold).await;
    assert_eq!(v3.mode, RouteMode::Disagg, "{v3:?}");
    assert_eq!(v3.reason, Reason::DisaggEffIslAboveThreshold);
    assert_eq!(v3.cached_tokens, 0);

    // Decode workers nearly full (load reports) and the decode-busy guard on: the home
    // worker still decodes turn 2 (its cache is there) but gets no bypass (the prefill worker
    // continuing decode off: the guard alone).
    let resp = svc
        .put_config(&json!({"decode_busy_threshold": 0.8, "prefill_continues_decode": false}))
        .await;
    assert_eq!(resp.status(), 200);
    for w in [home, other] {
        let report = LoadReport {
            v: 1,
            worker_id: w.worker_id.clone(),
            instance_id: None,
            running: 40,
            waiting: 0,
            kv_used_blocks: 9_500,
            kv_total_blocks: 10_000,
            queued_prefill_tokens: Some(0),
            kv_waiting_blocks: 0,
        };
        nats.publish(subjects::LOAD, serde_json::to_vec(&report).unwrap().into())
            .await
            .unwrap();
    }
    nats.flush().await.unwrap();
    eventually(WAIT, "load reports applied", || async {
        let doc = svc.get_json("/v1/workers").await;
        doc["workers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| w["load"]["reported"] == true)
            .count()
            == 2
    })
    .await;
    let v4 = route_json(&svc.base, "turn-2-again", &second_turn()).await;
    assert_ne!(v4.mode, RouteMode::Bypass, "{v4:?}");
    assert_eq!(v4.decode.worker_id, home.worker_id, "{v4:?}");
    assert_eq!(v4.reason, Reason::DisaggDecodeBusy, "{v4:?}");
    // With it on (the default), no decode worker can take the request: the prefill worker
    // serves it whole.
    let resp = svc
        .put_config(&json!({"prefill_continues_decode": true}))
        .await;
    assert_eq!(resp.status(), 200);
    let v5 = route_json(&svc.base, "turn-2-pool-full", &second_turn()).await;
    assert_eq!(v5.mode, RouteMode::Agg, "{v5:?}");
    assert_eq!(v5.reason, Reason::AggDecodePoolFull, "{v5:?}");
    assert_eq!(v5.decode.worker_id, prefill.worker_id, "{v5:?}");
    assert!(v5.decode_on_prefill && v5.prefill.is_none(), "{v5:?}");

    let m = svc.metrics().await;
    assert_metric(
        &m,
        "switchyard_route_decisions_total{mode=\"bypass\",reason=\"bypass:isl_bounding\"}",
        1.0,
    );
    assert_metric(
        &m,
        "switchyard_route_decisions_total{mode=\"disagg\",reason=\"disagg:decode_busy\"}",
        1.0,
    );
    assert_metric(
        &m,
        "switchyard_route_decisions_total{mode=\"agg\",reason=\"agg:decode_pool_full\"}",
        1.0,
    );
    assert_metric(&m, "switchyard_kv_batches_applied_total", 1.0);
    assert!(
        metric_value(&m, "switchyard_tokenizer_cache_hits_total") > 0.0,
        "turn 2 reused turn 1's segments: {m}"
    );
    svc.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_in_kv_batches_asks_the_worker_for_a_resync() {
    use futures::StreamExt;
    let (_server, svc, nats) = service_with_nats(Settings::for_tests()).await;
    let decode = register_worker(&svc, &nats, "decode-0", WorkerRole::Decode, 9001).await;
    let mut resyncs = nats
        .subscribe(subjects::kv_resync(&decode.worker_id))
        .await
        .unwrap();
    nats.flush().await.unwrap();
    // Past the new-worker resync's rate-limit window.
    tokio::time::sleep(switchyard_control_plane::consumers::RESYNC_MIN_INTERVAL).await;

    let tokens: Vec<u32> = (0..64).collect();
    publish_stored(&nats, &decode, 1, &tokens).await;
    publish_stored(&nats, &decode, 3, &tokens[..32]).await; // batch 2 never arrived
    let msg = tokio::time::timeout(WAIT, resyncs.next())
        .await
        .expect("a resync request")
        .unwrap();
    let req: switchyard_protocol::kv::ResyncRequest = serde_json::from_slice(&msg.payload).unwrap();
    assert_eq!(req.reason, "gap");
    // A replayed batch is stale, and events from a worker that never sent a heartbeat have
    // nowhere to go: both rejected and counted, nothing else happens.
    publish_stored(&nats, &decode, 3, &tokens).await;
    let ghost = worker("ghost", WorkerRole::Decode, 9099, 1);
    publish_stored(&nats, &ghost, 1, &tokens).await;
    eventually(WAIT, "stale batch counted", || async {
        let m = svc.metrics().await;
        metric_value(&m, "switchyard_kv_batches_rejected_total{reason=\"stale\"}") == 1.0
            && metric_value(&m, "switchyard_resync_requests_total{reason=\"gap\"}") == 1.0
            && metric_value(
                &m,
                "switchyard_kv_batches_rejected_total{reason=\"unknown_worker\"}",
            ) == 1.0
    })
    .await;
    svc.stop().await;
}

/// A completions batch generates a sequence per prompt, and a KV handoff carries one: a cold
/// long prompt that is disaggregated alone is bypassed in a batch of two, like `n: 2`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completions_batch_is_never_disaggregated() {
    let (_server, svc, nats) = service_with_nats(Settings::for_tests()).await;
    register_worker(&svc, &nats, "decode-0", WorkerRole::Decode, 9001).await;
    register_worker(&svc, &nats, "prefill-0", WorkerRole::Prefill, 9100).await;
    let long = prose("batch", 2_400);
    let verdict = |body: Value| {
        let base = svc.base.clone();
        async move {
            let resp = route(&base, "completions", None, body.to_string()).await;
            assert_eq!(resp.status(), 200);
            resp.json::<Verdict>().await.unwrap()
        }
    };
    let alone = verdict(json!({"model": "qwen3", "prompt": long})).await;
    assert_eq!(alone.mode, RouteMode::Disagg, "{alone:?}");
    for batch in [
        json!({"model": "qwen3", "prompt": [long, "a second prompt"]}),
        json!({"model": "qwen3", "prompt": [[1, 2, 3], [4, 5, 6]]}),
    ] {
        let v = verdict(batch).await;
        assert_eq!(v.mode, RouteMode::Bypass, "{v:?}");
        assert_eq!(v.reason, Reason::BypassMultipleChoices, "{v:?}");
    }
    svc.stop().await;
}
