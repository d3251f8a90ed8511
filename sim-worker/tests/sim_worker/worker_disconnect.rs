//! A non-streamed prefill leg whose client leaves: the worker aborts it, as vLLM's API server
//! aborts a request whose client disconnected, whether it still waited in the queue or was
//! being prefilled, and holds no KV for it afterwards. Each engine's prefill leg.

use crate::worker_support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{json, Value};
use switchyard_engine::SpeedUp;
use switchyard_protocol::worker::{Engine, WorkerRole};
use worker_support::{base_url, chat_body, config, eventually, start, tokenizer, CHAT};

const WAIT: Duration = Duration::from_secs(10);

/// The prefill leg of `body` in `engine`'s protocol.
fn prefill_leg(engine: Engine, body: &Value, room: u64) -> Value {
    let mut leg = body.clone();
    leg["max_tokens"] = json!(1);
    leg["stream"] = json!(false);
    match engine {
        Engine::Vllm => {
            leg["kv_transfer_params"] =
                json!({"do_remote_decode": true, "do_remote_prefill": false});
        }
        Engine::Trtllm => {
            leg["disaggregated_params"] = json!({"request_type": "context_only"});
        }
        Engine::Sglang => {
            leg["bootstrap_host"] = json!("127.0.0.1");
            leg["bootstrap_port"] = json!(1);
            leg["bootstrap_room"] = json!(room);
        }
    }
    leg
}

async fn clients_leaving_a_running_and_a_queued_prefill_leg_leave_nothing_held(engine: Engine) {
    let tok = tokenizer();
    let mut cfg = config(WorkerRole::Prefill, &format!("prefill-leave-{engine:?}"));
    cfg.engine_kind = engine;
    // One request at a time, a hundred times slower than the hardware: the first leg runs
    // for seconds and the second waits behind it.
    cfg.engine.max_num_seqs = 1;
    cfg.speed_up = SpeedUp::new(0.01).unwrap();
    let w = start(cfg, &tok, None).await;
    let url = format!("{}{CHAT}", base_url(&w));
    let legs: Vec<_> = (0..2u64)
        .map(|i| {
            let body = prefill_leg(engine, &chat_body(&format!("leaving{i}"), 2_000, 64), i + 1);
            let url = url.clone();
            // A client of its own each, so each leaves by closing its own connection.
            tokio::spawn(async move { reqwest::Client::new().post(url).json(&body).send().await })
        })
        .collect();
    let engine_handle = w.engine().clone();
    let busy = eventually(WAIT, || async {
        let load = engine_handle.load();
        load.running == 1 && load.waiting == 1
    })
    .await;
    assert!(
        busy,
        "not one leg running and one queued: {:?}",
        w.engine().load()
    );
    for leg in &legs {
        leg.abort();
    }
    let metrics = w.metrics().clone();
    let aborted = eventually(WAIT, || {
        let m = metrics.clone();
        async move { m.requests_aborted.load(Ordering::Relaxed) == 2 }
    })
    .await;
    assert!(
        aborted,
        "{} of 2 legs aborted; load {:?}",
        w.metrics().requests_aborted.load(Ordering::Relaxed),
        w.engine().load()
    );
    let idle = eventually(WAIT, || async {
        let load = engine_handle.load();
        load.running == 0 && load.waiting == 0 && load.held == 0 && load.kv_used_blocks == 0
    })
    .await;
    assert!(idle, "still busy or holding KV: {:?}", w.engine().load());
    assert_eq!(w.metrics().kv_holds.load(Ordering::Relaxed), 0);
    assert_eq!(w.metrics().requests_finished.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn vllm_prefill_legs_whose_clients_leave_are_aborted() {
    clients_leaving_a_running_and_a_queued_prefill_leg_leave_nothing_held(Engine::Vllm).await;
}

#[tokio::test]
async fn trtllm_context_legs_whose_clients_leave_are_aborted() {
    clients_leaving_a_running_and_a_queued_prefill_leg_leave_nothing_held(Engine::Trtllm).await;
}

#[tokio::test]
async fn sglang_prefill_legs_whose_clients_leave_are_aborted() {
    clients_leaving_a_running_and_a_queued_prefill_leg_leave_nothing_held(Engine::Sglang).await;
}
