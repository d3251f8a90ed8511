use proptest::prelude::*;
use switchyard_protocol::hash::{sequence_hashes, BlockSize, HashSeed};
use switchyard_protocol::kv::{EngineBlockId, KvEvent, KvEventBatch, StoredBlock};
use switchyard_protocol::lifecycle::LifecycleEvent;
use switchyard_protocol::route::{Reason, RouteMode};
use switchyard_protocol::worker::{LoadReport, WorkerId, WorkerInfo, WorkerRole};

use super::*;
use crate::config::ServingMode;

const BS: u32 = 16;

fn info(id: &str, role: WorkerRole) -> WorkerInfo {
    WorkerInfo {
        worker_id: WorkerId(id.into()),
        instance_id: 1,
        role,
        address: format!("{id}:8000"),
        model: "m".into(),
        block_size: BS,
        kv_capacity_blocks: 10_000,
        engine: Default::default(),
        bootstrap_port: None,
    }
}

fn router_with(workers: &[(&str, WorkerRole)]) -> Router {
    let mut r = Router::with_config(RouterConfig::default(), 7);
    for (id, role) in workers {
        assert_eq!(
            r.upsert_worker(&info(id, *role), 3_000, 0),
            WorkerChange::New
        );
    }
    r
}

fn pool() -> Router {
    router_with(&[
        ("decode-0", WorkerRole::Decode),
        ("decode-1", WorkerRole::Decode),
        ("prefill-0", WorkerRole::Prefill),
    ])
}

/// A prompt of `n` tokens, distinct per `salt`.
fn prompt(salt: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| salt.wrapping_mul(1_000_003).wrapping_add(i * 7 + 3))
        .collect()
}

/// The batch a worker publishes after caching `tokens`.
fn stored(worker: &str, seq: u64, tokens: &[u32]) -> KvEventBatch {
    stored_in_blocks_of(BS, worker, seq, tokens)
}

/// The batch a worker with `block_size`-token blocks publishes after caching `tokens`.
fn stored_in_blocks_of(block_size: u32, worker: &str, seq: u64, tokens: &[u32]) -> KvEventBatch {
    let bs = BlockSize::try_new(block_size).unwrap();
    let hashes = sequence_hashes(tokens, bs, HashSeed::default());
    batch(
        worker,
        seq,
        vec![KvEvent::Stored {
            parent: None,
            parent_block_id: None,
            blocks: hashes
                .iter()
                .enumerate()
                .map(|(i, &seq_hash)| StoredBlock {
                    seq_hash,
                    block_id: EngineBlockId(seq * 100_000 + i as u64),
                })
                .collect(),
            block_size,
        }],
    )
}

fn batch(worker: &str, seq: u64, events: Vec<KvEvent>) -> KvEventBatch {
    KvEventBatch {
        v: 1,
        worker_id: WorkerId(worker.into()),
        instance_id: 1,
        seq,
        resync: false,
        events,
    }
}

fn done(id: &str) -> LifecycleEvent {
    LifecycleEvent::completed(id)
}

#[test]
fn second_turn_returns_to_the_cache_holder_and_bypasses() {
    let mut r = pool();
    let turn1 = prompt(1, 4096);
    let v1 = r.route("t1", &turn1, 10).unwrap();
    assert_eq!(
        v1.mode,
        RouteMode::Disagg,
        "cold 4096 tokens: {}",
        v1.reason
    );
    assert_eq!(v1.reason, Reason::DisaggEffIslAboveThreshold);
    assert_eq!(v1.cached_tokens, 0);
    let holder = v1.decode.worker_id.0.clone();
    assert_eq!(
        r.apply_kv_batch(&stored(&holder, 1, &turn1)),
        Ok(KvApplyOutcome::Applied)
    );
    r.apply_lifecycle(&done("t1"), 30);

    let mut turn2 = turn1.clone();
    turn2.extend(prompt(2, 200));
    let v2 = r.route("t2", &turn2, 40).unwrap();
    assert_eq!(v2.decode.worker_id.0, holder);
    assert_eq!(v2.mode, RouteMode::Bypass);
    assert_eq!(v2.reason, Reason::BypassIslBounding);
    assert_eq!(v2.prefill, None);
    assert_eq!((v2.isl, v2.cached_tokens, v2.eff_isl), (4296, 4096, 200));
}

#[test]
fn the_cache_holder_wins_even_when_the_other_worker_is_idle() {
    let mut r = pool();
    let base = prompt(1, 1600);
    r.apply_kv_batch(&stored("decode-1", 1, &base)).unwrap();
    // Some load on decode-1 that its cache (100 blocks) outweighs.
    r.route("busy", &prompt(9, 640), 0).unwrap();
    let v = r.route("x", &base, 1).unwrap();
    assert_eq!(v.decode.worker_id.0, "decode-1");
    assert_eq!(v.cached_tokens, 1600);
}

#[test]
fn predicted_load_spreads_cold_requests() {
    let mut r = router_with(&[
        ("decode-0", WorkerRole::Decode),
        ("decode-1", WorkerRole::Decode),
    ]);
    let a = r.route("a", &prompt(1, 3000), 0).unwrap();
    let b = r.route("b", &prompt(2, 3000), 0).unwrap();
    assert_ne!(a.decode.worker_id, b.decode.worker_id);
    assert_eq!(r.tracked_requests(), 2);
    r.apply_lifecycle(
        &LifecycleEvent::FirstToken {
            request_id: "a".into(),
        },
        1,
    );
    r.apply_lifecycle(&done("a"), 2);
    r.apply_lifecycle(&done("b"), 2);
    assert_eq!(r.tracked_requests(), 0);
    assert!(r
        .worker_stats()
        .iter()
        .all(|w| w.load.active_blocks == 0 && w.load.in_flight == 0));
}

#[test]
fn a_route_call_after_its_request_failed_open_is_answered_but_not_counted() {
    let mut r = pool();
    let idle = |r: &Router| {
        r.worker_stats().iter().all(|w| {
            w.load.active_blocks == 0 && w.load.in_flight == 0 && w.load.prefill_tokens == 0
        })
    };
    // The report first (the call waited in a stopped control plane's socket), then the call.
    r.apply_lifecycle(&LifecycleEvent::failed_open("late"), 0);
    let v = r.route("late", &prompt(1, 3000), 1).unwrap();
    assert_eq!(v.request_id, "late", "answered all the same");
    assert_eq!(r.tracked_requests(), 0);
    assert!(idle(&r), "{:?}", r.worker_stats());
    assert_eq!(r.late_routes(), 1);
    // Its blocks are not predicted on the verdict's workers either: the request went where
    // Envoy sent it.
    let next = r.route("next", &prompt(1, 3000), 2).unwrap();
    assert_eq!(next.cached_tokens, 0);
    r.apply_lifecycle(&done("next"), 3);
    // The call first (a verdict the filter could not use), then the report: freed.
    r.route("early", &prompt(2, 3000), 4).unwrap();
    assert_eq!(r.tracked_requests(), 1);
    r.apply_lifecycle(&LifecycleEvent::failed_open("early"), 5);
    assert_eq!(r.tracked_requests(), 0);
    assert!(idle(&r), "{:?}", r.worker_stats());
    assert_eq!(r.late_routes(), 1);
    // A new request reusing an id is tracked again once the late call took the report.
    r.route("late", &prompt(3, 3000), 6).unwrap();
    assert_eq!(r.tracked_requests(), 1);
}

#[test]
fn a_new_request_reusing_a_failed_open_id_is_counted_and_the_late_call_is_not() {
    let mut r = pool();
    let failed_open = |call: u64| LifecycleEvent::Done {
        request_id: "dup".into(),
        prompt_tokens: None,
        completion_tokens: None,
        ok: false,
        failed_open: true,
        route_call: Some(call),
    };
    // Call 1 was failed open (its client left, or it timed out) before it was routed here.
    r.apply_lifecycle(&failed_open(1), 0);
    // The client retries under the same x-request-id: call 2, a new request, counted.
    r.route_numbered("dup", Some(2), &prompt(1, 3000), 1, None, 1)
        .unwrap();
    assert_eq!(r.tracked_requests(), 1);
    // Call 1 arrives late: answered, not counted.
    r.route_numbered("dup", Some(1), &prompt(2, 3000), 1, None, 2)
        .unwrap();
    assert_eq!(r.tracked_requests(), 1);
    assert_eq!(r.late_routes(), 1);
}

#[test]
fn a_busy_decode_worker_gets_no_bypass() {
    let mut r = router_with(&[
        ("decode-0", WorkerRole::Decode),
        ("prefill-0", WorkerRole::Prefill),
    ]);
    let mut cfg = r.config().clone();
    cfg.conditional.decode_busy_threshold = Some(0.8);
    // The guard alone: with the prefill worker continuing, the only decode worker being busy
    // keeps the request on the prefill worker (the next test).
    cfg.prefill_continues_decode = false;
    r.set_config(cfg).unwrap();
    let turn1 = prompt(1, 1024);
    r.apply_kv_batch(&stored("decode-0", 1, &turn1)).unwrap();
    let mut turn2 = turn1.clone();
    turn2.extend(prompt(2, 100));
    // Idle: bypass.
    assert_eq!(
        r.route("a", &turn2, 1).unwrap().reason,
        Reason::BypassIslBounding
    );
    r.apply_lifecycle(&done("a"), 2);
    // The worker reports 7,950 of 10,000 blocks in use: +71 blocks would exceed 80 %.
    let report = LoadReport {
        v: 1,
        worker_id: WorkerId("decode-0".into()),
        instance_id: None,
        running: 40,
        waiting: 0,
        kv_used_blocks: 7_950,
        kv_total_blocks: 10_000,
        queued_prefill_tokens: Some(0),
        kv_waiting_blocks: 0,
    };
    // A second process under the worker's id (refused at its heartbeat) reports it busy:
    // ignored, it is not the registered worker's load.
    let other_process = LoadReport {
        instance_id: Some(2),
        ..report.clone()
    };
    assert!(!r.apply_load_report(&other_process, 0));
    assert_eq!(
        r.route("c", &turn2, 3).unwrap().reason,
        Reason::BypassIslBounding
    );
    r.apply_lifecycle(&done("c"), 3);
    // The registered process's own report counts, as does one that names no process.
    for instance_id in [Some(1), None] {
        assert!(r.apply_load_report(
            &LoadReport {
                instance_id,
                ..report.clone()
            },
            0
        ));
    }
    let v = r.route("b", &turn2, 4).unwrap();
    assert_eq!(v.mode, RouteMode::Disagg);
    assert_eq!(v.reason, Reason::DisaggDecodeBusy);
    assert_eq!(v.prefill.unwrap().worker_id.0, "prefill-0");
}

fn kv_report(worker: &str, used: u64, total: u64) -> LoadReport {
    LoadReport {
        v: 1,
        worker_id: WorkerId(worker.into()),
        instance_id: None,
        running: 40,
        waiting: 0,
        kv_used_blocks: used,
        kv_total_blocks: total,
        queued_prefill_tokens: Some(0),
        kv_waiting_blocks: 0,
    }
}

#[test]
fn the_prefill_worker_keeps_a_request_no_decode_worker_can_take() {
    let mut r = pool();
    let cold = prompt(1, 1600); // 100 blocks
                                // Room on one decode worker: disaggregated there, whatever the other's state.
    r.apply_load_report(&kv_report("decode-0", 9_950, 10_000), 0);
    let v = r.route("a", &cold, 1).unwrap();
    assert_eq!(v.mode, RouteMode::Disagg);
    assert_eq!(v.decode.worker_id.0, "decode-1");
    assert!(!v.decode_on_prefill);
    r.apply_lifecycle(&done("a"), 2);
    // Both decode workers full (100 more blocks would pass 10,000): the prefill worker
    // prefills and decodes it, as an aggregated request, and its load says so.
    r.apply_load_report(&kv_report("decode-1", 9_901, 10_000), 0);
    for mode in [ServingMode::Conditional, ServingMode::Disagg] {
        let mut cfg = r.config().clone();
        cfg.serving_mode = mode;
        r.set_config(cfg).unwrap();
        let routed = r.route_traced("b", &cold, 1, None, 3).unwrap();
        let v = routed.verdict;
        assert_eq!(v.mode, RouteMode::Agg, "{mode:?}");
        assert_eq!(v.reason, Reason::AggDecodePoolFull);
        assert_eq!(v.decode.worker_id.0, "prefill-0");
        assert_eq!(v.prefill, None);
        assert!(v.decode_on_prefill);
        // Cached and effective ISL are the prefill worker's (it prefilled "a"'s prompt).
        assert_eq!((v.cached_tokens, v.eff_isl), (1600, 0));
        assert_eq!(routed.policy, None, "the pool decided, not the policy");
        let stats = r.worker_stats();
        let prefill = stats.iter().find(|w| w.worker_id.0 == "prefill-0").unwrap();
        assert_eq!(prefill.load.prefill_tokens, 0);
        assert_eq!(prefill.load.in_flight, 1);
        r.apply_lifecycle(&done("b"), 4);
    }
    // The wire form names the prefill pool; a verdict without the field reads as false.
    let v = r.route("c", &cold, 5).unwrap();
    let json = serde_json::to_value(&v).unwrap();
    assert_eq!(json["decode_on_prefill"], true);
    assert_eq!(json["reason"], "agg:decode_pool_full");
    r.apply_lifecycle(&done("c"), 6);
    // Off: today's behaviour, onto the full pool.
    let mut cfg = r.config().clone();
    cfg.prefill_continues_decode = false;
    r.set_config(cfg.clone()).unwrap();
    let v = r.route("d", &cold, 7).unwrap();
    assert_eq!(v.mode, RouteMode::Disagg);
    let json = serde_json::to_value(&v).unwrap();
    assert!(json.get("decode_on_prefill").is_none());
    r.apply_lifecycle(&done("d"), 8);
    // A full prefill worker keeps nothing either.
    cfg.prefill_continues_decode = true;
    r.set_config(cfg).unwrap();
    r.apply_load_report(&kv_report("prefill-0", 9_950, 10_000), 0);
    assert_eq!(r.route("e", &cold, 9).unwrap().mode, RouteMode::Disagg);
}

#[test]
fn the_guard_makes_a_decode_worker_full_for_the_prefill_worker_too() {
    let mut r = pool();
    let mut cfg = r.config().clone();
    cfg.conditional.decode_busy_threshold = Some(0.5);
    r.set_config(cfg).unwrap();
    r.apply_load_report(&kv_report("decode-0", 5_000, 10_000), 0);
    r.apply_load_report(&kv_report("decode-1", 4_950, 10_000), 0);
    let cold = prompt(1, 1600);
    // decode-1 still fits 100 blocks under half its capacity (5,050 > 5,000 does not).
    let v = r.route("a", &cold, 1).unwrap();
    assert_eq!(v.reason, Reason::AggDecodePoolFull);
    r.apply_load_report(&kv_report("decode-1", 4_000, 10_000), 0);
    let v = r.route("b", &cold, 2).unwrap();
    assert_eq!(
        (v.mode, v.decode.worker_id.0.as_str()),
        (RouteMode::Disagg, "decode-1")
    );
    // Several choices stay on a decode worker: the verdict is the request's.
    r.apply_load_report(&kv_report("decode-1", 5_000, 10_000), 0);
    assert_eq!(
        r.route_request("c", &cold, 2, 3).unwrap().reason,
        Reason::BypassMultipleChoices
    );
}

#[test]
fn the_policy_call_is_traced_when_the_policy_decides_and_decides_the_same_again() {
    let mut r = router_with(&[
        ("decode-0", WorkerRole::Decode),
        ("prefill-0", WorkerRole::Prefill),
    ]);
    let mut cfg = r.config().clone();
    cfg.conditional.decode_busy_threshold = Some(0.8);
    r.set_config(cfg.clone()).unwrap();
    let turn1 = prompt(1, 1024);
    r.apply_kv_batch(&stored("decode-0", 1, &turn1)).unwrap();
    let mut turn2 = turn1.clone();
    turn2.extend(prompt(2, 100));
    let routed = r.route_traced("a", &turn2, 1, None, 1).unwrap();
    let call = routed.policy.expect("the policy decided");
    assert_eq!(call.config, cfg.conditional);
    assert_eq!(
        call.input,
        policy::PolicyInput {
            isl: 1124,
            eff_isl: 100,
            prefill_queued_tokens: 0,
            // The request's 71 blocks on an idle worker.
            decode_projected_blocks: 71,
            decode_capacity_blocks: 10_000,
            prefill_cached_tokens: 0,
            decode_queued_tokens: 0,
            decode_running_streams: 0,
            // Only slo_cost learns a rescue factor; this router runs isl_bounding.
            stall_rescue_scale: 1.0,
        }
    );
    assert_eq!(call.decide().reason(), routed.verdict.reason);
    assert_eq!(routed.verdict.reason, Reason::BypassIslBounding);
    // The prefill leg's queued tokens are what the policy sees next.
    let cold = r.route_traced("b", &prompt(3, 4096), 1, None, 2).unwrap();
    assert_eq!(cold.verdict.mode, RouteMode::Disagg);
    let next = r.route_traced("c", &prompt(4, 100), 1, None, 3).unwrap();
    assert_eq!(next.policy.unwrap().input.prefill_queued_tokens, 4096);

    // Decided by the request or the serving mode, not the policy: nothing to re-decide.
    assert_eq!(
        r.route_traced("d", &turn2, 2, None, 4).unwrap().policy,
        None
    );
    for mode in [ServingMode::Agg, ServingMode::Disagg] {
        cfg.serving_mode = mode;
        r.set_config(cfg.clone()).unwrap();
        assert_eq!(
            r.route_traced("e", &turn2, 1, None, 5).unwrap().policy,
            None
        );
    }
}

#[test]
fn a_decode_worker_without_capacity_gets_no_bypass_under_the_guard() {
    let mut r = Router::with_config(
        RouterConfig::from_json(&serde_json::json!({"decode_busy_threshold": 0.9})).unwrap(),
        1,
    );
    let mut d = info("decode-0", WorkerRole::Decode);
    d.kv_capacity_blocks = 0;
    r.upsert_worker(&d, 3_000, 0);
    r.upsert_worker(&info("prefill-0", WorkerRole::Prefill), 3_000, 0);
    let v = r.route("a", &prompt(1, 10), 0).unwrap();
    // isl 10 has no full block: eff_isl 10, ratio 1.0 → isl_bounding says disagg anyway.
    assert_eq!(v.reason, Reason::DisaggEffIslRatioAboveThreshold);
    let turn = prompt(2, 320);
    r.apply_kv_batch(&stored("decode-0", 1, &turn)).unwrap();
    let v = r.route("b", &turn, 1).unwrap();
    assert_eq!(v.reason, Reason::DisaggDecodeCapacityUnknown);
}

#[test]
fn a_decode_worker_takes_kv_only_from_a_prefill_worker_of_its_engine() {
    use switchyard_protocol::worker::Engine;
    let mut r = Router::with_config(
        RouterConfig {
            serving_mode: ServingMode::Disagg,
            ..RouterConfig::default()
        },
        7,
    );
    let workers = [
        ("trt-decode", WorkerRole::Decode, Engine::Trtllm, None),
        ("vllm-prefill", WorkerRole::Prefill, Engine::Vllm, None),
        (
            "sglang-prefill",
            WorkerRole::Prefill,
            Engine::Sglang,
            Some(8998),
        ),
        ("trt-prefill", WorkerRole::Prefill, Engine::Trtllm, None),
    ];
    for (id, role, engine, bootstrap_port) in workers {
        let worker = WorkerInfo {
            engine,
            bootstrap_port,
            ..info(id, role)
        };
        r.upsert_worker(&worker, 3_000, 0);
    }
    for salt in 0..20 {
        let v = r
            .route(&format!("r{salt}"), &prompt(salt, 3000), 0)
            .unwrap();
        assert_eq!(v.engine, Engine::Trtllm);
        assert_eq!(v.prefill.unwrap().worker_id.0, "trt-prefill", "salt {salt}");
    }
    // An SGLang pool: the verdict names the engine and the prefill worker's bootstrap port.
    r.remove_worker(&WorkerId("trt-decode".into()));
    let sglang_decode = WorkerInfo {
        engine: Engine::Sglang,
        ..info("sglang-decode", WorkerRole::Decode)
    };
    r.upsert_worker(&sglang_decode, 3_000, 0);
    let v = r.route("s", &prompt(99, 3000), 0).unwrap();
    assert_eq!(v.engine, Engine::Sglang);
    let prefill = v.prefill.unwrap();
    assert_eq!(
        (prefill.worker_id.0.as_str(), prefill.bootstrap_port),
        ("sglang-prefill", Some(8998))
    );
    // No prefill worker of its engine: served aggregated, never handed another engine's KV.
    r.remove_worker(&WorkerId("sglang-prefill".into()));
    let v = r.route("t", &prompt(98, 3000), 0).unwrap();
    assert_eq!(
        (v.mode, v.reason.as_str()),
        (RouteMode::Agg, "agg:no_prefill_workers")
    );
}

#[test]
fn serving_modes_and_fallbacks() {
    let mut r = pool();
    let long = prompt(1, 5000);
    r.set_config(RouterConfig {
        serving_mode: ServingMode::Agg,
        ..RouterConfig::default()
    })
    .unwrap();
    let v = r.route("a", &long, 0).unwrap();
    assert_eq!(
        (v.mode, v.reason.as_str(), v.prefill.is_none()),
        (RouteMode::Agg, "agg:serving_mode", true)
    );
    assert_ne!(v.decode.worker_id.0, "prefill-0");

    r.set_config(RouterConfig {
        serving_mode: ServingMode::Disagg,
        ..RouterConfig::default()
    })
    .unwrap();
    let short = prompt(2, 64);
    let v = r.route("b", &short, 0).unwrap();
    assert_eq!(
        (v.mode, v.reason.as_str()),
        (RouteMode::Disagg, "disagg:always")
    );
    assert_eq!(v.prefill.unwrap().worker_id.0, "prefill-0");

    r.remove_worker(&WorkerId("prefill-0".into()));
    for mode in [ServingMode::Disagg, ServingMode::Conditional] {
        r.set_config(RouterConfig {
            serving_mode: mode,
            ..RouterConfig::default()
        })
        .unwrap();
        let v = r.route("c", &long, 0).unwrap();
        assert_eq!(
            (v.mode, v.reason.as_str()),
            (RouteMode::Agg, "agg:no_prefill_workers")
        );
    }
}

#[test]
fn no_decode_workers_is_an_error_and_expired_workers_are_not_routed_to() {
    let mut r = router_with(&[("prefill-0", WorkerRole::Prefill)]);
    // The prefill worker serving such requests whole is
    // `with_no_decode_worker_live_a_prefill_worker_serves_the_request_whole`.
    let mut cfg = r.config().clone();
    cfg.prefill_continues_decode = false;
    r.set_config(cfg).unwrap();
    assert_eq!(
        r.route("a", &prompt(1, 100), 0),
        Err(RouteError::NoDecodeWorkers)
    );
    r.upsert_worker(&info("agg-0", WorkerRole::Agg), 1_000, 0);
    assert!(r.route("b", &prompt(1, 100), 1_000).is_ok());
    assert_eq!(
        r.route("c", &prompt(1, 100), 1_001),
        Err(RouteError::NoDecodeWorkers)
    );
    assert_eq!(r.expire_workers(5_000).len(), 2);
    assert!(r.workers().is_empty());
}

#[test]
fn a_worker_routing_passes_over_is_not_listed_as_live_before_the_expiry_sweep() {
    let mut r = router_with(&[]);
    r.upsert_worker(&info("decode-0", WorkerRole::Decode), 1_000, 100);
    r.upsert_worker(&info("decode-1", WorkerRole::Decode), 1_050, 100);
    let live = |r: &Router, now_ms| -> Vec<String> {
        r.live_workers(now_ms)
            .into_iter()
            .map(|w| w.info.worker_id.0)
            .collect()
    };
    assert_eq!(live(&r, 1_100), ["decode-0", "decode-1"]);
    // decode-0 is past its window: routing skips it, so EDS and the API must not list it,
    // though no sweep has removed it yet.
    assert_eq!(live(&r, 1_101), ["decode-1"]);
    assert_eq!(r.workers().len(), 2);
    assert_eq!(
        r.route("a", &prompt(1, 100), 1_101)
            .unwrap()
            .decode
            .worker_id
            .0,
        "decode-1"
    );
}

#[test]
fn every_verdict_reason_is_registered() {
    let mut r = pool();
    for (i, n) in [0usize, 15, 16, 100, 2047, 2048, 9000]
        .into_iter()
        .enumerate()
    {
        let v = r.route(&i.to_string(), &prompt(i as u32, n), 0).unwrap();
        assert!(Reason::ALL.contains(&v.reason), "{}", v.reason);
        assert!(v.reason.mode() == Some(v.mode));
        assert_eq!(v.prefill.is_some(), v.mode == RouteMode::Disagg);
        assert_eq!(v.eff_isl, v.isl - v.cached_tokens);
    }
}

#[test]
fn same_seed_same_verdicts() {
    let run = || {
        let mut r = router_with(&[
            ("a", WorkerRole::Decode),
            ("b", WorkerRole::Decode),
            ("c", WorkerRole::Decode),
        ]);
        (0..30)
            .map(|i| {
                let v = r.route(&i.to_string(), &prompt(i, 500), i.into()).unwrap();
                r.apply_lifecycle(&done(&i.to_string()), i.into());
                v.decode.worker_id.0
            })
            .collect::<Vec<_>>()
    };
    let first = run();
    assert_eq!(first, run());
    assert!(
        first.iter().any(|w| w != &first[0]),
        "ties spread: {first:?}"
    );
}

#[test]
fn a_worker_whose_events_pass_its_capacity_is_dropped_from_the_index() {
    let mut r = Router::with_config(RouterConfig::default(), 7);
    let mut small = info("decode-0", WorkerRole::Decode);
    small.kv_capacity_blocks = 10;
    assert_eq!(r.upsert_worker(&small, 3_000, 0), WorkerChange::New);
    let limit = held_blocks_limit(10);
    let cached = |r: &Router| r.worker_stats()[0].cached_blocks;
    let at_limit = prompt(1, (BS as u64 * limit) as usize);
    assert_eq!(
        r.apply_kv_batch(&stored("decode-0", 1, &at_limit)),
        Ok(KvApplyOutcome::Applied),
        "up to the limit is kept"
    );
    assert_eq!(cached(&r), limit);
    assert_eq!(
        r.apply_kv_batch(&stored("decode-0", 2, &prompt(2, BS as usize))),
        Ok(KvApplyOutcome::OverCapacity {
            held: limit + 1,
            limit
        })
    );
    assert_eq!(cached(&r), 0, "every block dropped");
    assert_eq!(r.index_stats().pairs, 0);
    assert_eq!(r.kv_counters().over_capacity_drops, 1);
    // A resync dump within the capacity rebuilds it.
    let mut dump = stored("decode-0", 3, &prompt(3, 4 * BS as usize));
    dump.resync = true;
    dump.events.insert(0, KvEvent::Cleared);
    assert_eq!(r.apply_kv_batch(&dump), Ok(KvApplyOutcome::Applied));
    assert_eq!(cached(&r), 4);
}

#[test]
fn the_held_blocks_limit_is_twice_the_capacity_and_bounded_when_unknown() {
    assert_eq!(held_blocks_limit(1_000), 2_000 + 4_096);
    assert_eq!(held_blocks_limit(0), 1 << 22);
    assert_eq!(held_blocks_limit(u64::MAX), u64::MAX, "no overflow");
}

#[test]
fn kv_batch_ordering_rules() {
    let mut r = pool();
    let t = prompt(1, 64);
    assert_eq!(
        r.apply_kv_batch(&stored("ghost", 1, &t)),
        Err(KvEventError::UnknownWorker(WorkerId("ghost".into())))
    );
    let mut wrong = stored("decode-0", 1, &t);
    if let KvEvent::Stored { block_size, .. } = &mut wrong.events[0] {
        *block_size = 64;
    }
    assert!(matches!(
        r.apply_kv_batch(&wrong),
        Err(KvEventError::BlockSizeMismatch {
            got: 64,
            registered: 16,
            ..
        })
    ));
    assert_eq!(r.index_stats().pairs, 0, "nothing applied on error");

    assert_eq!(
        r.apply_kv_batch(&stored("decode-0", 1, &t)),
        Ok(KvApplyOutcome::Applied)
    );
    assert_eq!(
        r.apply_kv_batch(&stored("decode-0", 2, &t)),
        Ok(KvApplyOutcome::Applied)
    );
    assert!(matches!(
        r.apply_kv_batch(&stored("decode-0", 2, &t)),
        Err(KvEventError::Stale {
            seq: 2,
            applied: 2,
            ..
        })
    ));
    assert_eq!(
        r.apply_kv_batch(&stored("decode-0", 5, &t)),
        Ok(KvApplyOutcome::NeedsResync)
    );
    assert_eq!(
        r.apply_kv_batch(&stored("decode-0", 6, &t)),
        Ok(KvApplyOutcome::Applied),
        "one gap, one resync"
    );
    // First batch seen mid-stream: applied, but resync asked.
    assert_eq!(
        r.apply_kv_batch(&stored("decode-1", 40, &t)),
        Ok(KvApplyOutcome::NeedsResync)
    );
    // Another instance's batch: not applied, and no resync of the registered one.
    let mut other = stored("decode-1", 41, &prompt(3, 64));
    other.instance_id = 2;
    assert!(matches!(
        r.apply_kv_batch(&other),
        Err(KvEventError::OtherInstance {
            got: 2,
            registered: 1,
            ..
        })
    ));
    assert_eq!(
        r.worker_stats()
            .iter()
            .find(|w| w.worker_id.0 == "decode-1")
            .unwrap()
            .cached_blocks,
        4
    );
}

#[test]
fn a_resync_dump_rebuilds_the_worker() {
    let mut r = pool();
    r.apply_kv_batch(&stored("decode-0", 1, &prompt(1, 64)))
        .unwrap();
    let mut dump = stored("decode-0", 10, &prompt(2, 32));
    dump.resync = true;
    dump.events.insert(0, KvEvent::Cleared);
    assert_eq!(r.apply_kv_batch(&dump), Ok(KvApplyOutcome::Applied));
    let mut next = stored("decode-0", 11, &prompt(3, 16));
    next.resync = true;
    assert_eq!(r.apply_kv_batch(&next), Ok(KvApplyOutcome::Applied));
    assert_eq!(
        r.index_stats().pairs,
        3,
        "old blocks gone, dump's 2 + 1 kept"
    );
    assert_eq!(r.kv_counters().clears, 1);
}

/// A batch numbered far ahead (a bad or forged one: KV events are not signed) asks for a
/// resync, and the worker's dump must be taken whatever its own, lower, number; before, it
/// was refused as stale with every later batch, and the worker's cache stayed hidden until
/// the control plane restarted.
#[test]
fn a_resync_dump_recovers_from_a_batch_numbered_ahead() {
    let mut r = pool();
    r.apply_kv_batch(&stored("decode-0", 1, &prompt(1, 64)))
        .unwrap();
    let ahead = batch("decode-0", u64::MAX, vec![]);
    assert_eq!(r.apply_kv_batch(&ahead), Ok(KvApplyOutcome::NeedsResync));
    assert!(matches!(
        r.apply_kv_batch(&stored("decode-0", 2, &prompt(2, 16))),
        Err(KvEventError::Stale { .. })
    ));
    let mut dump = stored("decode-0", 2, &prompt(2, 32));
    dump.resync = true;
    dump.events.insert(0, KvEvent::Cleared);
    assert_eq!(r.apply_kv_batch(&dump), Ok(KvApplyOutcome::Applied));
    // The worker's own numbering goes on from its dump.
    assert_eq!(
        r.apply_kv_batch(&stored("decode-0", 3, &prompt(3, 16))),
        Ok(KvApplyOutcome::Applied)
    );
    assert_eq!(
        r.index_stats().pairs,
        3,
        "the dump's 2 blocks and the next 1"
    );
}

#[test]
fn a_restart_forgets_the_cache_and_removal_events_apply() {
    let mut r = pool();
    let t = prompt(1, 64);
    r.apply_kv_batch(&stored("decode-0", 1, &t)).unwrap();
    let removed = batch(
        "decode-0",
        2,
        vec![KvEvent::Removed {
            block_ids: vec![EngineBlockId(100_000 + 3), EngineBlockId(1)],
        }],
    );
    assert_eq!(r.apply_kv_batch(&removed), Ok(KvApplyOutcome::Applied));
    assert_eq!(r.kv_counters().blocks_removed, 1);
    assert_eq!(r.kv_counters().unknown_removals, 1);
    assert_eq!(r.index_stats().pairs, 3);
    let mut restarted = info("decode-0", WorkerRole::Decode);
    restarted.instance_id = 2;
    assert_eq!(
        r.upsert_worker(&restarted, 3_000, 1),
        WorkerChange::Restarted
    );
    assert_eq!(r.index_stats().pairs, 0);
    assert_eq!(
        r.kv_counters().blocks_removed,
        4,
        "the restart dropped the other 3"
    );
    assert_eq!(
        r.upsert_worker(&restarted, 3_000, 2),
        WorkerChange::Refreshed
    );
    let mut bad = info("x", WorkerRole::Decode);
    bad.block_size = 0;
    assert_eq!(r.upsert_worker(&bad, 3_000, 2), WorkerChange::Rejected);
}

fn any_event() -> impl Strategy<Value = KvEvent> {
    prop_oneof![
        3 => (proptest::option::of(0u64..50), proptest::collection::vec((0u64..50, 0u64..50), 0..8), prop_oneof![Just(16u32), 0u32..70])
            .prop_map(|(parent, b, block_size)| KvEvent::Stored {
                parent: parent.map(SequenceHash),
                parent_block_id: None,
                blocks: b.into_iter().map(|(h, id)| StoredBlock { seq_hash: SequenceHash(h), block_id: EngineBlockId(id) }).collect(),
                block_size,
            }),
        2 => proptest::collection::vec(0u64..50, 0..8)
            .prop_map(|ids| KvEvent::Removed { block_ids: ids.into_iter().map(EngineBlockId).collect() }),
        1 => Just(KvEvent::Cleared),
    ]
}

use switchyard_protocol::hash::SequenceHash;

proptest! {
    #[test]
    fn arbitrary_batches_never_panic_and_routing_still_works(
        batches in proptest::collection::vec(
            (0usize..4, 0u64..3, prop_oneof![0u64..6, Just(u64::MAX)], proptest::bool::ANY, proptest::collection::vec(any_event(), 0..5)),
            0..40,
        )
    ) {
        let mut r = pool();
        let names = ["decode-0", "decode-1", "prefill-0", "ghost"];
        for (w, instance, seq, resync, events) in batches {
            let b = KvEventBatch { v: 1, worker_id: WorkerId(names[w].into()), instance_id: instance, seq, resync, events };
            let _ = r.apply_kv_batch(&b);
        }
        let stats = r.index_stats();
        let per_worker: u64 = r.worker_stats().iter().map(|w| w.cached_blocks).sum();
        prop_assert_eq!(stats.pairs, per_worker);
        let counted = r.kv_counters();
        prop_assert_eq!(counted.blocks_stored - counted.blocks_removed, stats.pairs);
        let v = r.route("x", &prompt(1, 300), 0).unwrap();
        prop_assert!(Reason::ALL.contains(&v.reason));
        for id in names {
            r.remove_worker(&WorkerId(id.into()));
        }
        prop_assert_eq!(r.index_stats().pairs, 0);
    }
}

#[test]
fn slo_cost_sees_the_decode_workers_streams_and_queue() {
    let mut r = router_with(&[
        ("decode-0", WorkerRole::Decode),
        ("prefill-0", WorkerRole::Prefill),
    ]);
    let cfg = RouterConfig::from_json(&serde_json::json!({"policy": "slo_cost"})).unwrap();
    r.set_config(cfg).unwrap();
    // An idle decode worker: no stream to stall, no transfer to wait for: bypass.
    let a = r.route_traced("a", &prompt(1, 32_768), 1, None, 0).unwrap();
    assert_eq!(a.verdict.reason, Reason::BypassSloCost);
    // Now `a`'s prefill is queued there: a second cold prompt would wait behind it, so the
    // idle prefill worker is faster. `a` stalls no stream yet: it has no first token.
    let b = r.route_traced("b", &prompt(2, 32_768), 1, None, 0).unwrap();
    let input = b.policy.expect("the policy decided").input;
    assert_eq!(input.decode_running_streams, 0);
    assert_eq!(input.decode_queued_tokens, 32_768);
    assert_eq!(input.prefill_cached_tokens, 0);
    assert_eq!(
        (b.verdict.mode, b.verdict.reason.as_str()),
        (RouteMode::Disagg, "disagg:slo_cost_ttft")
    );
    // The prefill worker is predicted to cache `b` now: a follow-up sees it.
    let mut turn2 = prompt(2, 32_768);
    turn2.extend(prompt(3, 100));
    let c = r.route_traced("c", &turn2, 1, None, 0).unwrap();
    assert_eq!(c.policy.unwrap().input.prefill_cached_tokens, 32_768);
    // `a`'s first token: it decodes now, and a local prefill would stall it.
    r.apply_lifecycle(
        &LifecycleEvent::FirstToken {
            request_id: "a".into(),
        },
        1,
    );
    let d = r.route_traced("d", &prompt(4, 100), 1, None, 1).unwrap();
    assert_eq!(d.policy.unwrap().input.decode_running_streams, 1);
    r.apply_lifecycle(&done("a"), 2);
    let e = r.route_traced("e", &prompt(5, 100), 1, None, 2).unwrap();
    assert_eq!(e.policy.unwrap().input.decode_running_streams, 0);
}

#[test]
fn prefill_load_bypasses_when_the_prefill_pool_is_busy() {
    let mut r = router_with(&[
        ("decode-0", WorkerRole::Decode),
        ("prefill-0", WorkerRole::Prefill),
    ]);
    let cfg = RouterConfig::from_json(&serde_json::json!({
        "policy": "prefill_load", "prefill_queue_budget_tokens": 10_000, "prefill_busy_threshold": 0.5
    }))
    .unwrap();
    r.set_config(cfg).unwrap();
    // 4,000 queued tokens: busyness 0.4, not busy.
    let a = r.route("a", &prompt(1, 4_000), 0).unwrap();
    assert_eq!(
        (a.mode, a.reason.as_str()),
        (RouteMode::Disagg, "disagg:prefill_not_busy")
    );
    // +2,000 more: 0.6 > 0.5, busy: the next request prefills on its decode worker.
    let b = r.route("b", &prompt(2, 2_000), 0).unwrap();
    assert_eq!(b.reason, Reason::DisaggPrefillNotBusy, "decided at 0.4");
    let c = r.route("c", &prompt(3, 2_000), 0).unwrap();
    assert_eq!(
        (c.mode, c.reason.as_str()),
        (RouteMode::Bypass, "bypass:prefill_busy")
    );
    // The prefill leg's first token frees the pool again.
    r.apply_lifecycle(
        &LifecycleEvent::FirstToken {
            request_id: "a".into(),
        },
        1,
    );
    let d = r.route("d", &prompt(4, 2_000), 1).unwrap();
    assert_eq!(d.reason, Reason::DisaggPrefillNotBusy);
}

proptest! {
    #[test]
    fn verdicts_are_consistent_under_any_config(
        mode in 0usize..3, policy in 0usize..3, threshold in 0u32..5_000, ratio in 0.0f64..=1.0,
        guard in proptest::option::of(0.0f64..1.0), temperature in prop_oneof![Just(0.0), 0.0f64..100.0],
        lens in proptest::collection::vec(0usize..6_000, 1..8), seed in 0u64..1_000,
    ) {
        let serving_mode = ["agg", "disagg", "conditional"][mode];
        let policy = ["isl_bounding", "prefill_load", "isl_or_load"][policy];
        let cfg = RouterConfig::from_json(&serde_json::json!({
            "serving_mode": serving_mode,
            "policy": policy,
            "eff_isl_threshold": threshold,
            "eff_isl_ratio_threshold": ratio,
            "decode_busy_threshold": guard,
            "selection": {"temperature": temperature},
        })).unwrap();
        let mut r = Router::with_config(cfg, seed);
        for (id, role) in [("decode-0", WorkerRole::Decode), ("agg-0", WorkerRole::Agg), ("prefill-0", WorkerRole::Prefill)] {
            r.upsert_worker(&info(id, role), 3_000, 0);
        }
        r.apply_kv_batch(&stored("decode-0", 1, &prompt(0, 3_000))).unwrap();
        for (i, n) in lens.iter().enumerate() {
            let v = r.route(&i.to_string(), &prompt(i as u32 % 2, *n), i as u64).unwrap();
            prop_assert!(Reason::ALL.contains(&v.reason));
            prop_assert!(v.reason.mode() == Some(v.mode));
            prop_assert_eq!(v.prefill.is_some(), v.mode == RouteMode::Disagg);
            prop_assert_eq!(v.isl as usize, *n);
            prop_assert!(v.cached_tokens <= v.isl);
            prop_assert_eq!(v.eff_isl, v.isl - v.cached_tokens);
            // Only a verdict the full decode pool made names the prefill worker to decode.
            prop_assert_eq!(v.decode.worker_id.0 == "prefill-0", v.decode_on_prefill);
            prop_assert_eq!(v.decode_on_prefill, v.reason == Reason::AggDecodePoolFull);
        }
    }
}

proptest! {
    /// A preview between decisions changes none of them: not the load or predicted cache it
    /// would have booked, nor the random draw of a selection with a temperature.
    #[test]
    fn previews_leave_every_decision_as_it_was(
        temperature in prop_oneof![Just(0.0), 0.1f64..10.0],
        lens in proptest::collection::vec(1usize..4_000, 1..8), seed in 0u64..1_000,
    ) {
        let cfg = RouterConfig::from_json(&serde_json::json!({
            "selection": {"temperature": temperature},
        })).unwrap();
        let fresh = || {
            let mut r = Router::with_config(cfg.clone(), seed);
            for (id, role) in [("decode-0", WorkerRole::Decode), ("decode-1", WorkerRole::Decode), ("prefill-0", WorkerRole::Prefill)] {
                r.upsert_worker(&info(id, role), 3_000, 0);
            }
            r
        };
        let (mut decided, mut previewed) = (fresh(), fresh());
        for (i, n) in lens.iter().enumerate() {
            let id = i.to_string();
            let tokens = prompt(i as u32 % 3, *n);
            let now = i as u64 * 10;
            let shown = previewed.preview(&id, &tokens, 1, None, now).unwrap().verdict;
            let theirs = previewed.route(&id, &tokens, now).unwrap();
            let ours = decided.route(&id, &tokens, now).unwrap();
            prop_assert_eq!(&theirs, &ours);
            // With no draw to differ by, the preview is the decision.
            if temperature == 0.0 {
                prop_assert_eq!(&shown, &ours);
            }
        }
        prop_assert_eq!(previewed.worker_stats(), decided.worker_stats());
        prop_assert_eq!(previewed.tracked_requests(), decided.tracked_requests());
    }
}

#[test]
fn workers_with_different_block_sizes_are_matched_in_their_own_hashes() {
    let mut r = router_with(&[("decode-0", WorkerRole::Decode)]);
    let mut big = info("decode-64", WorkerRole::Decode);
    big.block_size = 64;
    r.upsert_worker(&big, 3_000, 0);
    let turn = prompt(5, 1_000);
    // decode-64 caches the whole prompt's 15 full 64-token blocks (960 tokens).
    let mut b = stored_in_blocks_of(64, "decode-64", 1, &turn);
    assert_eq!(r.apply_kv_batch(&b), Ok(KvApplyOutcome::Applied));
    let v = r.route("a", &turn, 1).unwrap();
    assert_eq!(v.decode.worker_id.0, "decode-64");
    assert_eq!((v.cached_tokens, v.eff_isl), (960, 40));
    // A 16-token worker's events cannot claim 64-token blocks.
    b.worker_id = WorkerId("decode-0".into());
    assert!(matches!(
        r.apply_kv_batch(&b),
        Err(KvEventError::BlockSizeMismatch { .. })
    ));
}

#[test]
fn lost_lifecycle_reports_expire_with_routing_time() {
    let mut r = router_with(&[("decode-0", WorkerRole::Decode)]);
    r.route("lost", &prompt(1, 640), 0).unwrap();
    let load = |r: &Router| r.worker_stats()[0].load;
    assert_eq!(load(&r).prefill_tokens, 640);
    // The next route, past the prefill timeout, frees the lost request's prefill tokens...
    r.upsert_worker(&info("decode-0", WorkerRole::Decode), 3_000, 60_000);
    r.route("next", &prompt(2, 16), 60_000).unwrap();
    assert_eq!(load(&r).prefill_tokens, 16);
    // ...and past the request timeout, its blocks.
    r.upsert_worker(&info("decode-0", WorkerRole::Decode), 3_000, 600_000);
    r.route("later", &prompt(3, 16), 600_000).unwrap();
    assert_eq!(r.tracked_requests(), 2, "`lost` forgotten");
    assert_eq!(load(&r).in_flight, 2);
}

#[test]
fn while_heartbeats_cannot_arrive_no_worker_expires_and_each_gets_a_window_after() {
    let mut r = router_with(&[("decode-0", WorkerRole::Decode)]);
    // Heard at 0, expires after 3 s; NATS goes away at 1 s and is back at 60 s.
    r.set_heartbeats_reachable(false, 1_000);
    assert!(r.expire_workers(59_000).is_empty());
    assert!(
        r.route("a", &prompt(1, 100), 59_000).is_ok(),
        "still routable"
    );
    r.set_heartbeats_reachable(true, 60_000);
    assert!(
        r.expire_workers(62_999).is_empty(),
        "a full window from the return"
    );
    assert!(r.route("b", &prompt(1, 100), 63_000).is_ok());
    assert_eq!(
        r.expire_workers(63_001).len(),
        1,
        "then silence counts again"
    );
}

#[test]
fn a_stall_of_the_caller_grants_every_worker_a_fresh_window() {
    let mut r = router_with(&[
        ("decode-0", WorkerRole::Decode),
        ("decode-1", WorkerRole::Decode),
    ]);
    // The process was stopped from 500 ms to 5.5 s; nobody was heard meanwhile.
    r.grant_liveness_grace(5_500);
    assert!(r.expire_workers(5_600).is_empty());
    // One worker's heartbeat arrives, the other has really gone.
    r.upsert_worker(&info("decode-0", WorkerRole::Decode), 3_000, 7_000);
    assert_eq!(r.expire_workers(8_501), vec![WorkerId("decode-1".into())]);
}

#[test]
fn back_to_back_turns_stay_on_one_worker_before_its_kv_events_arrive() {
    let mut r = router_with(&[
        ("decode-0", WorkerRole::Decode),
        ("decode-1", WorkerRole::Decode),
        ("prefill-0", WorkerRole::Prefill),
    ]);
    // Four turns of a growing conversation, sent with no gap: no KV event arrives between.
    let conversation = prompt(3, 4_000);
    let mut workers = Vec::new();
    for (turn, len) in [1_000, 2_000, 3_000, 4_000].into_iter().enumerate() {
        let v = r
            .route(&format!("t{turn}"), &conversation[..len], turn as u64)
            .unwrap();
        workers.push(v.decode.worker_id.0.clone());
        if turn > 0 {
            assert!(
                v.cached_tokens as usize >= (len - 1_000) / BS as usize * BS as usize,
                "turn {turn} counts the earlier turns as cached: {v:?}"
            );
        }
    }
    assert!(workers.iter().all(|w| *w == workers[0]), "{workers:?}");
}

#[test]
fn a_request_that_ends_before_its_first_token_withdraws_its_prediction() {
    let abandoned = |id: &str| LifecycleEvent::Done {
        request_id: id.into(),
        prompt_tokens: None,
        completion_tokens: None,
        ok: false,
        failed_open: false,
        route_call: None,
    };
    let mut r = pool();
    let p = prompt(6, 3_000);
    // The client left during the prefill leg: the decode worker never saw the prompt.
    r.route("left", &p, 0).unwrap();
    r.apply_lifecycle(&abandoned("left"), 10);
    assert_eq!(
        r.route("retry", &p, 20).unwrap().cached_tokens,
        0,
        "the retry is not bypassed onto a cache that is not there"
    );
    // Past its first token the worker has the prompt: an error later keeps the prediction.
    r.apply_lifecycle(
        &LifecycleEvent::FirstToken {
            request_id: "retry".into(),
        },
        30,
    );
    r.apply_lifecycle(&abandoned("retry"), 40);
    assert!(r.route("third", &p, 50).unwrap().cached_tokens > 0);
    r.apply_lifecycle(&done("third"), 60);
    // A request the filter failed open went where Envoy sent it: its prediction goes too.
    let q = prompt(7, 3_000);
    r.route("open", &q, 70).unwrap();
    r.apply_lifecycle(&LifecycleEvent::failed_open("open"), 80);
    assert_eq!(r.route("after", &q, 90).unwrap().cached_tokens, 0);
}

#[test]
fn once_a_worker_announces_a_prompt_its_events_alone_say_what_it_holds() {
    let mut r = pool();
    let p = prompt(8, 1_024);
    let v = r.route("a", &p, 0).unwrap();
    r.apply_lifecycle(&done("a"), 1);
    let worker = v.decode.worker_id.0.clone();
    // The worker stores the prompt, then evicts it (a small cache), within the prediction's
    // time: the next route must not count it cached.
    let stored = stored(&worker, 1, &p);
    let ids: Vec<EngineBlockId> = match &stored.events[0] {
        KvEvent::Stored { blocks, .. } => blocks.iter().map(|b| b.block_id).collect(),
        _ => unreachable!(),
    };
    assert_eq!(r.apply_kv_batch(&stored), Ok(KvApplyOutcome::Applied));
    assert!(
        r.route("b", &p, 2).unwrap().cached_tokens > 0,
        "the index has it"
    );
    r.apply_lifecycle(&done("b"), 3);
    let evicted = batch(&worker, 2, vec![KvEvent::Removed { block_ids: ids }]);
    assert_eq!(r.apply_kv_batch(&evicted), Ok(KvApplyOutcome::Applied));
    assert_eq!(
        r.route("c", &p, 4).unwrap().cached_tokens,
        0,
        "evicted: no prediction hides it"
    );
}

#[test]
fn predictions_run_out_and_can_be_turned_off() {
    let mut r = pool();
    // Heartbeats keep coming for this whole test; only predictions run out.
    r.set_heartbeats_reachable(false, 0);
    let p = prompt(4, 1_000);
    r.route("a", &p, 0).unwrap();
    let ttl = r.config().load.kv_prediction_ms;
    assert!(r.route("b", &p, ttl - 1).unwrap().cached_tokens > 0);
    assert_eq!(
        r.route("c", &p, 2 * ttl + 1).unwrap().cached_tokens,
        0,
        "b's prediction ran out too"
    );
    let mut config = r.config().clone();
    config.load.kv_prediction_ms = 0;
    r.set_config(config).unwrap();
    let q = prompt(5, 1_000);
    r.route("d", &q, 3 * ttl).unwrap();
    assert_eq!(r.route("e", &q, 3 * ttl + 1).unwrap().cached_tokens, 0);
}

#[test]
fn several_choices_are_never_disaggregated() {
    let mut r = pool();
    let cold = prompt(6, 8_000);
    let v = r.route_request("n2", &cold, 2, 0).unwrap();
    assert_eq!(v.mode, RouteMode::Bypass);
    assert_eq!(v.reason, Reason::BypassMultipleChoices);
    assert!(v.prefill.is_none());
    assert_eq!(
        r.route_request("n1", &prompt(7, 8_000), 1, 0).unwrap().mode,
        RouteMode::Disagg
    );
}

#[test]
fn a_prompt_the_engine_recomputes_matches_no_cache_and_is_never_disaggregated() {
    let mut r = pool();
    let tokens = prompt(8, 8_000);
    r.apply_kv_batch(&stored("decode-0", 1, &tokens)).unwrap();
    // Asked plainly, the prompt is found cached.
    let plain = r.route("plain", &tokens, 1).unwrap();
    assert_eq!(
        (plain.decode.worker_id.0.as_str(), plain.cached_tokens),
        ("decode-0", 8_000)
    );
    r.apply_lifecycle(&done("plain"), 2);
    let recomputed = Prompt::Recomputed { isl: 8_000 };
    for (i, mode) in [ServingMode::Conditional, ServingMode::Disagg]
        .into_iter()
        .enumerate()
    {
        let mut cfg = r.config().clone();
        cfg.serving_mode = mode;
        r.set_config(cfg).unwrap();
        let id = format!("logprobs-{i}");
        let v = r.route_traced(&id, recomputed, 1, None, 3).unwrap().verdict;
        assert_eq!(
            (v.mode, v.reason, v.cached_tokens, v.eff_isl, v.isl),
            (
                RouteMode::Bypass,
                Reason::BypassPromptLogprobs,
                0,
                8_000,
                8_000
            ),
            "{mode:?}"
        );
        assert!(v.prefill.is_none());
        r.apply_lifecycle(&done(&id), 4);
    }
}

#[test]
fn with_no_decode_worker_live_a_prefill_worker_serves_the_request_whole() {
    let mut r = router_with(&[("prefill-0", WorkerRole::Prefill)]);
    let tokens = prompt(9, 3_000);
    for mode in [ServingMode::Conditional, ServingMode::Disagg] {
        let mut cfg = r.config().clone();
        cfg.serving_mode = mode;
        r.set_config(cfg).unwrap();
        let v = r
            .route_traced("alone", &tokens, 1, None, 1)
            .unwrap()
            .verdict;
        assert_eq!(
            (v.mode, v.reason, v.decode.worker_id.0.as_str()),
            (RouteMode::Agg, Reason::AggNoDecodeWorkers, "prefill-0"),
            "{mode:?}"
        );
        assert!(
            v.decode_on_prefill,
            "the filter sends it to the prefill cluster"
        );
        assert!(v.prefill.is_none());
        r.apply_lifecycle(&done("alone"), 2);
    }
    // Not when the prefill worker is not to decode, nor in agg serving mode.
    let mut cfg = r.config().clone();
    cfg.serving_mode = ServingMode::Conditional;
    cfg.prefill_continues_decode = false;
    r.set_config(cfg).unwrap();
    assert_eq!(r.route("off", &tokens, 3), Err(RouteError::NoDecodeWorkers));
    let mut cfg = r.config().clone();
    cfg.serving_mode = ServingMode::Agg;
    cfg.prefill_continues_decode = true;
    r.set_config(cfg).unwrap();
    assert_eq!(r.route("agg", &tokens, 4), Err(RouteError::NoDecodeWorkers));
}

#[test]
fn a_model_is_served_by_its_own_workers_only() {
    let mut r = Router::with_config(RouterConfig::default(), 7);
    let of = |id: &str, role, model: &str| WorkerInfo {
        model: model.into(),
        ..info(id, role)
    };
    for w in [
        of("a-decode", WorkerRole::Decode, "a"),
        of("a-prefill", WorkerRole::Prefill, "a"),
        of("b-decode", WorkerRole::Decode, "b"),
    ] {
        assert_eq!(r.upsert_worker(&w, 3_000, 0), WorkerChange::New);
    }
    // b's decode worker caches the prompt: the index must not draw a's request to it.
    let p = prompt(8, 2_000);
    r.apply_kv_batch(&stored("b-decode", 1, &p)).unwrap();
    for i in 0..8 {
        let v = r
            .route_model(&format!("a{i}"), &p, 1, Some("a"), 1)
            .unwrap();
        assert_eq!(v.decode.worker_id.0, "a-decode");
        assert!(v.prefill.iter().all(|p| p.worker_id.0 == "a-prefill"));
        let v = r
            .route_model(&format!("b{i}"), &p, 1, Some("b"), 1)
            .unwrap();
        assert_eq!(v.decode.worker_id.0, "b-decode");
        assert_eq!(
            (v.mode, v.reason),
            (RouteMode::Agg, Reason::AggNoPrefillWorkers),
            "a's prefill worker never prefills b's prompt"
        );
    }
    assert_eq!(
        r.route_model("c", &p, 1, Some("c"), 1),
        Err(RouteError::NoDecodeWorkers),
        "a model nobody serves has no decode worker"
    );
    // No model: every worker, as with one model.
    let v = r.route_model("any", &p, 1, None, 1).unwrap();
    assert_eq!(v.decode.worker_id.0, "b-decode", "the cache holder");
}

#[test]
fn slo_cost_learns_a_preset_twice_too_slow_from_the_lifecycle_reports() {
    let truth = RouterConfig::from_json(&serde_json::json!({"policy": "slo_cost"})).unwrap();
    let off = RouterConfig::from_json(&serde_json::json!({
        "policy": "slo_cost",
        "prefill_iteration_ms": 39.0, "prefill_ms_per_token": 0.02978,
        "prefill_attention_ms_per_token_pair": 1.084e-6,
        "decode_step_ms": 32.56, "decode_step_ms_per_stream": 0.0326,
    }))
    .unwrap();
    let mut r = pool();
    // No heartbeats in this test: nobody expires.
    r.set_heartbeats_reachable(false, 0);
    r.set_config(off.clone()).unwrap();
    assert_eq!(r.effective_conditional(), off.conditional);
    let mut now = 0u64;
    for i in 0..40u32 {
        let id = format!("r{i}");
        let n = 2_000 + 500 * (i as usize % 5);
        let v = r.route(&id, &prompt(100 + i, n), now).unwrap();
        // Idle workers: the truth's TTFT is its prefill (plus a transfer when disaggregated);
        // one stream decodes at the truth's step.
        let prefill = policy::slo_cost::prefill_ms(n as u64, 0, &truth.conditional);
        let ttft = prefill.round() as u64 + u64::from(v.mode == RouteMode::Disagg);
        now += ttft;
        r.apply_lifecycle(
            &LifecycleEvent::FirstToken {
                request_id: id.clone(),
            },
            now,
        );
        let step = policy::slo_cost::step_ms(1, &truth.conditional);
        now += (step * 99.0).round() as u64;
        r.apply_lifecycle(
            &LifecycleEvent::Done {
                request_id: id,
                prompt_tokens: None,
                completion_tokens: Some(100),
                ok: true,
                failed_open: false,
                route_call: None,
            },
            now,
        );
        now += 1_000;
    }
    let learned = r.learned_timing();
    assert!((learned.prefill.scale() - 0.5).abs() < 0.02, "{learned:?}");
    assert!((learned.decode.scale() - 0.5).abs() < 0.02, "{learned:?}");
    let eff = r.effective_conditional();
    let rel = |a: f64, b: f64| (a / b - 1.0).abs();
    assert!(
        rel(
            eff.prefill_ms_per_token,
            truth.conditional.prefill_ms_per_token
        ) < 0.04
    );
    assert!(rel(eff.decode_step_ms, truth.conditional.decode_step_ms) < 0.04);
    // Every stream met the ITL objective (a 16 ms step against 25 ms): the rescue factor
    // grew, one step per stream.
    assert_eq!(learned.rescue.samples(), 40);
    assert!(learned.rescue.scale() > 1.0, "{learned:?}");
    // The policy decides under the learned coefficients and rescue, and says so in its call.
    let routed = r
        .route_traced("x", &prompt(1, 3_000), 1, None, now)
        .unwrap();
    let call = routed.policy.unwrap();
    assert_eq!(call.config, eff);
    assert_eq!(call.input.stall_rescue_scale, learned.rescue.scale());
    // Learning off, or new coefficients: the configured model as it is, and no rescue.
    let mut no = off.clone();
    no.learn_timing = false;
    r.set_config(no.clone()).unwrap();
    assert_eq!(r.effective_conditional(), off.conditional);
    let routed = r
        .route_traced("y", &prompt(2, 3_000), 1, None, now)
        .unwrap();
    assert_eq!(routed.policy.unwrap().input.stall_rescue_scale, 1.0);
    r.set_config(truth.clone()).unwrap();
    assert_eq!(r.learned_timing().prefill.samples(), 0);
}
