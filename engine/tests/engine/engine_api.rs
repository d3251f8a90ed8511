//! The engine's contract with its callers: validation, the prefill/decode handoff, aborts,
//! KV events and resync dumps, and how iterations are formed.

use switchyard_engine::{
    Engine, EngineConfig, EngineError, EngineOutput, EngineRequest, KvSource, PerfPreset, Prompt,
};
use switchyard_protocol::hash::SequenceHash;
use switchyard_protocol::kv::KvEvent;
use switchyard_protocol::worker::WorkerRole;

fn tokens(seed: u32, len: u32) -> Vec<u32> {
    (0..len)
        .map(|i| seed.wrapping_mul(1_000_003).wrapping_add(i))
        .collect()
}

fn agg() -> Engine {
    Engine::new(EngineConfig::new(WorkerRole::Agg)).unwrap()
}

fn run_to_idle(engine: &mut Engine) -> Vec<EngineOutput> {
    let mut out = Vec::new();
    for _ in 0..1_000_000 {
        let Some(t) = engine.next_event_ms() else {
            return out;
        };
        engine.step_into(t, &mut out);
    }
    panic!("engine did not go idle");
}

#[test]
fn invalid_requests_get_typed_errors_and_change_nothing() {
    let mut e = agg();
    let ok = EngineRequest::local(1, Prompt::Tokens(tokens(1, 100)), 4);
    e.submit(ok.clone(), 0.0).unwrap();
    assert_eq!(e.submit(ok, 0.0), Err(EngineError::DuplicateId { id: 1 }));
    assert_eq!(
        e.submit(EngineRequest::local(2, Prompt::Tokens(vec![]), 4), 0.0),
        Err(EngineError::EmptyPrompt { id: 2 })
    );
    assert_eq!(
        e.submit(
            EngineRequest::local(3, Prompt::Tokens(tokens(3, 10)), 0),
            0.0
        ),
        Err(EngineError::ZeroMaxTokens { id: 3 })
    );
    let hashed = Prompt::Hashed {
        tokens: 200,
        block_hashes: vec![SequenceHash(1)],
    };
    assert!(matches!(
        e.submit(EngineRequest::local(4, hashed, 1), 0.0),
        Err(EngineError::BlockHashCount {
            id: 4,
            expected: 3,
            got: 1,
            ..
        })
    ));
    let huge = Prompt::Hashed {
        tokens: 64 * 70_000,
        block_hashes: (0..70_000).map(SequenceHash).collect(),
    };
    assert!(matches!(
        e.submit(EngineRequest::local(5, huge, 1), 0.0),
        Err(EngineError::ExceedsKvCapacity { id: 5, .. })
    ));
    assert!(matches!(
        e.submit(
            EngineRequest::local(6, Prompt::Tokens(tokens(6, 10)), 1),
            f64::NAN
        ),
        Err(EngineError::InvalidTime(_))
    ));
    assert_eq!(e.load().waiting, 1);
    let mut bad = EngineConfig::new(WorkerRole::Agg);
    bad.block_size = 0;
    assert!(matches!(
        Engine::new(bad),
        Err(EngineError::InvalidConfig(_))
    ));
}

#[test]
fn hashed_prompts_behave_like_token_prompts() {
    let cfg = EngineConfig::new(WorkerRole::Agg);
    let bs = cfg.block_size().unwrap();
    let toks = tokens(5, 3_000);
    let hashes = switchyard_protocol::hash::sequence_hashes(&toks, bs, cfg.hash_seed);
    let run = |prompt: Prompt| {
        let mut e = Engine::new(cfg.clone()).unwrap();
        e.submit(EngineRequest::local(1, prompt, 3), 0.0).unwrap();
        (run_to_idle(&mut e), e.cached_blocks())
    };
    let a = run(Prompt::Tokens(toks));
    let b = run(Prompt::Hashed {
        tokens: 3_000,
        block_hashes: hashes,
    });
    assert_eq!(a, b);
}

#[test]
fn a_request_arriving_mid_iteration_waits_for_the_next_one() {
    let mut e = agg();
    e.submit(
        EngineRequest::local(1, Prompt::Tokens(tokens(1, 8_192)), 2),
        0.0,
    )
    .unwrap();
    let first = e.step(0.0);
    assert!(first.outputs.is_empty());
    let end = e.next_event_ms().unwrap();
    assert!(end > 150.0);
    e.submit(
        EngineRequest::local(2, Prompt::Tokens(tokens(2, 64)), 1),
        10.0,
    )
    .unwrap();
    // Stepping before the end changes nothing.
    assert_eq!(e.step(end - 1.0).iterations, 0);
    let out = run_to_idle(&mut e);
    let ft2 = out
        .iter()
        .find_map(|o| match o {
            EngineOutput::FirstToken { id: 2, at_ms, .. } => Some(*at_ms),
            _ => None,
        })
        .unwrap();
    assert!(
        ft2 > end,
        "request 2 joined only the iteration after the one in flight"
    );
}

#[test]
fn chunked_prefill_respects_the_token_budget() {
    let mut cfg = EngineConfig::new(WorkerRole::Agg);
    cfg.max_num_batched_tokens = 2_048;
    let perf = cfg.perf;
    let mut e = Engine::new(cfg).unwrap();
    e.submit(
        EngineRequest::local(1, Prompt::Tokens(tokens(1, 8_192)), 1),
        0.0,
    )
    .unwrap();
    let out = run_to_idle(&mut e);
    // Four chunks of 2,048 tokens, each attending to the chunks before it.
    let want: f64 = (0..4)
        .map(|k| perf.prefill_chunk_ms(2_048, 2_048 * k))
        .sum();
    assert!(
        (out[0].at_ms() - want).abs() < 1e-6,
        "{} vs {want}",
        out[0].at_ms()
    );
    assert_eq!(e.load().iterations, 4);
}

#[test]
fn max_num_seqs_caps_the_running_batch() {
    let mut cfg = EngineConfig::new(WorkerRole::Agg);
    cfg.max_num_seqs = 3;
    let mut e = Engine::new(cfg).unwrap();
    for id in 0..5 {
        e.submit(
            EngineRequest::local(id, Prompt::Tokens(tokens(id as u32, 100)), 50),
            0.0,
        )
        .unwrap();
    }
    e.step(0.0);
    let load = e.load();
    assert_eq!((load.running, load.waiting), (3, 2));
    run_to_idle(&mut e);
    assert_eq!(e.load().running, 0);
}

#[test]
fn prefill_leg_holds_kv_until_released() {
    let mut e = Engine::new(EngineConfig::new(WorkerRole::Prefill)).unwrap();
    let mut req = EngineRequest::prefill_for_remote_decode(9, Prompt::Tokens(tokens(9, 1_000)));
    req.max_tokens = 50; // ignored: a prefill leg generates exactly one token
    e.submit(req, 0.0).unwrap();
    let out = e.step(10_000.0).outputs; // well before the 480 s lease runs out
    assert!(matches!(
        out.as_slice(),
        [
            EngineOutput::FirstToken { id: 9, .. },
            EngineOutput::Finished {
                id: 9,
                completion_tokens: 1,
                kv_held: true,
                ..
            },
        ]
    ));
    let held = e.held_kv(9).expect("held").clone();
    assert_eq!(held.prompt_tokens, 1_000);
    assert_eq!(held.block_ids.len(), 16); // 1,000 tokens + the sampled one's slot: 16 blocks
    assert_eq!(e.load().kv_used_blocks, 16);
    assert_eq!(e.load().held, 1);
    assert!(e.contains(9));
    // The lease is the only thing left to happen.
    assert_eq!(e.next_event_ms(), Some(held.expires_at_ms));
    assert_eq!(e.release_held(9), Some(held));
    assert!(e.held_kv(9).is_none() && !e.contains(9));
    let load = e.load();
    assert_eq!(load.kv_used_blocks, 0);
    assert_eq!(
        load.kv_cached_blocks, 15,
        "full blocks stay cached after release"
    );
    assert_eq!(e.next_event_ms(), None);
    assert_eq!(e.release_held(9), None);
}

#[test]
fn held_kv_is_released_when_the_lease_expires() {
    let mut cfg = EngineConfig::new(WorkerRole::Prefill);
    cfg.prefill_hold_lease_ms = 1_000.0;
    let mut e = Engine::new(cfg).unwrap();
    e.submit(
        EngineRequest::prefill_for_remote_decode(1, Prompt::Tokens(tokens(1, 640))),
        0.0,
    )
    .unwrap();
    run_to_idle(&mut e);
    assert!(
        e.held_kv(1).is_none(),
        "the lease ran out while stepping to idle"
    );
    assert_eq!(e.load().kv_used_blocks, 0);
    assert_eq!(e.load().kv_cached_blocks, 10);
}

#[test]
fn remote_kv_skips_prefill_and_publishes_the_blocks() {
    let cfg = EngineConfig::new(WorkerRole::Decode);
    let perf = cfg.perf;
    let mut e = Engine::new(cfg).unwrap();
    let req = EngineRequest::decode_with_remote_kv(3, Prompt::Tokens(tokens(3, 32_768)), 4);
    assert_eq!(req.kv, KvSource::Remote);
    e.submit(req, 500.0).unwrap();
    e.step(500.0);
    // The blocks are stored as soon as the KV is placed, before any compute.
    let events = e.drain_kv_events();
    let stored: usize = events
        .iter()
        .map(|ev| match ev {
            KvEvent::Stored { blocks, .. } => blocks.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(stored, 511); // 32,767 tokens placed; the last one is computed by the first step
    let out = run_to_idle(&mut e);
    let EngineOutput::FirstToken {
        at_ms,
        cached_tokens,
        ..
    } = out[0]
    else {
        panic!("{out:?}")
    };
    assert_eq!(cached_tokens, 0);
    // One decode-sized step, not a 788 ms prefill.
    assert!((at_ms - 500.0 - perf.decode_ms(1, 32_768.0)).abs() < 1e-9);
    assert!(out.iter().any(|o| matches!(
        o,
        EngineOutput::Finished {
            remote_tokens: 32_768,
            completion_tokens: 4,
            ..
        }
    )));
}

#[test]
fn aborts_free_everything_wherever_the_request_is() {
    let mut e = agg();
    e.submit(
        EngineRequest::local(1, Prompt::Tokens(tokens(1, 4_000)), 100),
        0.0,
    )
    .unwrap();
    e.submit(
        EngineRequest::local(2, Prompt::Tokens(tokens(2, 4_000)), 100),
        0.0,
    )
    .unwrap();
    e.submit(
        EngineRequest::local(3, Prompt::Tokens(tokens(3, 4_000)), 100),
        1.0,
    )
    .unwrap();
    e.step(0.0); // 1 and 2 run (8,000 of the 8,192 budget), 3 has not arrived yet
    assert!(e.abort(1, 5.0)); // running, listed in the iteration in flight
    assert!(e.abort(3, 5.0)); // waiting
    assert!(!e.abort(77, 5.0));
    let out = run_to_idle(&mut e);
    assert!(
        out.iter().all(|o| o.id() == 2),
        "aborted requests report nothing more"
    );
    assert!(out
        .iter()
        .any(|o| matches!(o, EngineOutput::Finished { id: 2, .. })));
    assert_eq!(e.load().kv_used_blocks, 0);
    assert!(e.is_idle());
    // The id can be reused at once.
    e.submit(
        EngineRequest::local(1, Prompt::Tokens(tokens(1, 64)), 1),
        10_000.0,
    )
    .unwrap();
    run_to_idle(&mut e);
}

#[test]
fn resync_dump_lists_parents_before_children() {
    let mut e = agg();
    let shared = tokens(4, 1_280);
    for (id, suffix) in [(1u64, 11u32), (2, 12)] {
        let mut p = shared.clone();
        p.extend(tokens(suffix, 640));
        e.submit(EngineRequest::local(id, Prompt::Tokens(p), 1), 0.0)
            .unwrap();
    }
    run_to_idle(&mut e);
    let dump = e.cached_blocks();
    assert_eq!(dump.len(), 20 + 2 * 10); // the shared 20 blocks once, two 10-block suffixes
    let mut seen = std::collections::HashSet::new();
    for (parent, block) in &dump {
        if let Some(p) = parent {
            assert!(seen.contains(p), "parent listed before child");
        }
        seen.insert(block.seq_hash);
    }
    // The events tell the same story as the dump.
    let mut stored = 0;
    for ev in e.drain_kv_events() {
        if let KvEvent::Stored {
            blocks, block_size, ..
        } = ev
        {
            assert_eq!(block_size, 64);
            stored += blocks.len();
        }
    }
    assert_eq!(stored, dump.len());
}

#[test]
fn dep4_spreads_requests_over_attention_ranks() {
    // Four equal prefills on a DEP4 worker run in parallel ranks: one chunk's time, not four.
    let cfg = EngineConfig::with_preset(WorkerRole::Agg, PerfPreset::Gb200Fp8Dep4);
    let perf = cfg.perf;
    let mut e = Engine::new(cfg).unwrap();
    for id in 0..4 {
        e.submit(
            EngineRequest::local(id, Prompt::Tokens(tokens(id as u32, 4_096)), 1),
            0.0,
        )
        .unwrap();
    }
    let out = run_to_idle(&mut e);
    let want = perf.prefill_chunk_ms(4_096, 0);
    for o in out
        .iter()
        .filter(|o| matches!(o, EngineOutput::FirstToken { .. }))
    {
        assert!((o.at_ms() - want).abs() < 1e-9);
    }
}

#[test]
fn a_block_computed_twice_at_once_outlives_its_registered_twin_and_chains_on() {
    // Two requests prefill the same 4 blocks in one iteration: the first's copies are
    // registered, the second's stay anonymous. The first finishes and the second's next chunk
    // evicts the first's copies; the second's next block then names its parent by the
    // second's own copy, registered now, not by nothing.
    let mut cfg = EngineConfig::new(WorkerRole::Agg);
    cfg.block_size = 16;
    cfg.kv_capacity_blocks = 12;
    cfg.max_num_batched_tokens = 128;
    let mut engine = Engine::new(cfg).unwrap();
    let shared: Vec<u32> = (0..64).collect();
    let longer: Vec<u32> = shared.iter().copied().chain(1_000..1_096).collect();
    for (id, prompt) in [(1, shared), (2, longer)] {
        let request = EngineRequest {
            id,
            prompt: Prompt::Tokens(prompt),
            max_tokens: 1,
            kv: KvSource::Local,
            hold_for_remote_decode: false,
            reads_prefix_cache: true,
        };
        engine.submit(request, 0.0).unwrap();
    }
    let mut held = std::collections::HashSet::new();
    let mut out = Vec::new();
    while let Some(t) = engine.next_event_ms() {
        engine.step_into(t, &mut out);
        // Every chained block names a held parent (checked with the rest of the stream).
        crate::engine_properties::apply_kv_events(&mut held, engine.drain_kv_events()).unwrap();
    }
    assert_eq!(
        out.iter()
            .filter(|o| matches!(o, EngineOutput::Finished { .. }))
            .count(),
        2
    );
}

#[test]
fn a_request_that_reads_no_cache_computes_its_whole_prompt() {
    let first_token = |out: &[EngineOutput], id: u64| {
        out.iter()
            .find_map(|o| match o {
                EngineOutput::FirstToken {
                    id: i,
                    at_ms,
                    cached_tokens,
                    ..
                } if *i == id => Some((*at_ms, *cached_tokens)),
                _ => None,
            })
            .expect("a first token")
    };
    let mut e = agg();
    let prompt = tokens(4, 8_192);
    e.submit(
        EngineRequest::local(1, Prompt::Tokens(prompt.clone()), 1),
        0.0,
    )
    .unwrap();
    let (cold_at, _) = first_token(&run_to_idle(&mut e), 1);
    e.submit(
        EngineRequest::local(2, Prompt::Tokens(prompt.clone()), 1),
        1_000.0,
    )
    .unwrap();
    let (warm_at, warm_cached) = first_token(&run_to_idle(&mut e), 2);
    assert!(warm_cached >= 8_000, "{warm_cached}");
    let recomputing = EngineRequest::local(3, Prompt::Tokens(prompt.clone()), 1).recomputing();
    e.submit(recomputing, 2_000.0).unwrap();
    let (recomputed_at, recomputed_cached) = first_token(&run_to_idle(&mut e), 3);
    assert_eq!(recomputed_cached, 0);
    // As long as the cold prefill, far longer than the cached one.
    assert!(
        (recomputed_at - 2_000.0 - cold_at).abs() < 1e-6,
        "{recomputed_at} vs {cold_at}"
    );
    assert!(warm_at - 1_000.0 < cold_at / 4.0);
    // KV handed over is not read either: the prompt is computed here.
    let remote = EngineRequest::decode_with_remote_kv(4, Prompt::Tokens(tokens(5, 8_192)), 1);
    e.submit(remote.recomputing(), 3_000.0).unwrap();
    let (remote_at, _) = first_token(&run_to_idle(&mut e), 4);
    assert!(
        (remote_at - 3_000.0 - cold_at).abs() < 1e-6,
        "{remote_at} vs {cold_at}"
    );
}
