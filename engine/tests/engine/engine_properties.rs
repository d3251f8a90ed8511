//! Properties of the engine under random workloads: no KV block leaks, every request streams
//! exactly `max_tokens` tokens, outputs are in time order, and the KV event stream always
//! describes exactly what the cache holds, each chained block naming a held parent (what the
//! router's index relies on).

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;
use switchyard_engine::{Engine, EngineConfig, EngineOutput, EngineRequest, KvSource, Prompt};
use switchyard_protocol::kv::KvEvent;
use switchyard_protocol::worker::WorkerRole;

/// One generated request.
#[derive(Debug, Clone)]
struct Spec {
    arrival_ms: f64,
    /// Which of a few shared prefixes it starts with, and how long that prefix is.
    prefix: u32,
    prefix_len: u32,
    suffix_len: u32,
    max_tokens: u32,
    remote: bool,
    hold: bool,
    /// Asks prompt logprobs: reads no cached KV.
    recompute: bool,
    /// Abort this long after arrival, if set.
    abort_after_ms: Option<f64>,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        0.0..2_000.0f64,
        0..3u32,
        0..700u32,
        1..600u32,
        1..120u32,
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.1),
        prop::option::weighted(0.15, 0.0..500.0f64),
    )
        .prop_map(
            |(
                arrival_ms,
                prefix,
                prefix_len,
                suffix_len,
                max_tokens,
                remote,
                hold,
                recompute,
                abort,
            )| Spec {
                arrival_ms,
                prefix,
                prefix_len,
                suffix_len,
                max_tokens,
                remote,
                hold,
                recompute,
                abort_after_ms: abort,
            },
        )
}

fn prompt(id: u64, s: &Spec) -> Prompt {
    let head = (0..s.prefix_len).map(|i| s.prefix * 100_000 + i);
    let tail = (0..s.suffix_len).map(|i| 1_000_000 + id as u32 * 1_000 + i);
    Prompt::Tokens(head.chain(tail).collect())
}

/// Applies KV events to a model of the worker's cache (its engine block ids), checking each is
/// consistent; the first inconsistency is the error.
pub(crate) fn apply_kv_events(
    model: &mut HashSet<u64>,
    events: Vec<KvEvent>,
) -> Result<(), String> {
    let check = |ok: bool, what: String| if ok { Ok(()) } else { Err(what) };
    for ev in events {
        match ev {
            KvEvent::Stored {
                parent,
                parent_block_id,
                blocks,
                ..
            } => {
                // A chained block names its parent's engine id, which the cache holds: the
                // router's index finds parents by it.
                if parent.is_some() {
                    let id = parent_block_id.map(|id| id.0);
                    check(
                        id.is_some_and(|id| model.contains(&id)),
                        format!("parent {parent:?} named by {id:?}, not a held block"),
                    )?;
                }
                for b in blocks {
                    check(model.insert(b.block_id.0), format!("stored twice: {b:?}"))?;
                }
            }
            KvEvent::Removed { block_ids } => {
                for id in block_ids {
                    check(model.remove(&id.0), format!("removed unknown block {id:?}"))?;
                }
            }
            KvEvent::Cleared => model.clear(),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn random_workloads_keep_every_invariant(
        specs in prop::collection::vec(spec(), 1..25),
        kv_blocks in 12u64..100,
        budget in prop::sample::select(vec![64u32, 512, 8_192]),
        max_seqs in 1u32..16,
    ) {
        let mut cfg = EngineConfig::new(WorkerRole::Agg);
        cfg.kv_capacity_blocks = kv_blocks;
        cfg.max_num_batched_tokens = budget;
        cfg.max_num_seqs = max_seqs;
        cfg.prefill_hold_lease_ms = 300.0;
        let mut engine = Engine::new(cfg).unwrap();

        // Timeline of arrivals and aborts, in time order.
        let mut timeline: Vec<(f64, u64, bool)> = Vec::new();
        for (i, s) in specs.iter().enumerate() {
            timeline.push((s.arrival_ms, i as u64, false));
            if let Some(after) = s.abort_after_ms {
                timeline.push((s.arrival_ms + after, i as u64, true));
            }
        }
        timeline.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.2.cmp(&b.2)));

        let mut accepted = HashSet::new();
        let mut aborted_at: HashMap<u64, f64> = HashMap::new();
        let mut out = Vec::new();
        let mut model = HashSet::new();
        let mut next = 0;
        for _ in 0..1_000_000 {
            let engine_next = engine.next_event_ms();
            let due = timeline.get(next).map(|e| e.0);
            let t = match (engine_next, due) {
                (None, None) => break,
                (Some(a), Some(b)) => a.min(b),
                (a, b) => a.or(b).unwrap(),
            };
            engine.step_into(t, &mut out);
            while let Some(&(at, id, is_abort)) = timeline.get(next) {
                if at > t { break; }
                next += 1;
                let s = &specs[id as usize];
                if is_abort {
                    if accepted.contains(&id) && engine.abort(id, at) {
                        aborted_at.insert(id, at);
                    }
                    continue;
                }
                let req = EngineRequest {
                    id,
                    prompt: prompt(id, s),
                    max_tokens: s.max_tokens,
                    kv: if s.remote { KvSource::Remote } else { KvSource::Local },
                    hold_for_remote_decode: s.hold,
                    reads_prefix_cache: !s.recompute,
                };
                if engine.submit(req, at).is_ok() {
                    accepted.insert(id);
                }
            }
            apply_kv_events(&mut model, engine.drain_kv_events()).map_err(TestCaseError::fail)?;
        }
        prop_assert!(engine.next_event_ms().is_none(), "engine went idle");
        prop_assert!(engine.is_idle());

        // No block leaks: nothing is referenced once every request is done and leases ran out.
        let load = engine.load();
        prop_assert_eq!(load.kv_used_blocks, 0);
        prop_assert_eq!((load.running, load.waiting, load.held), (0, 0, 0));
        prop_assert!(load.prefix_cache_hits <= load.prefix_cache_queries);

        // The event stream describes exactly the cache.
        let dumped: HashSet<u64> = engine.cached_blocks().iter().map(|(_, b)| b.block_id.0).collect();
        prop_assert_eq!(&model, &dumped);

        // Outputs: time order; per request exactly max_tokens tokens and one finish, unless
        // aborted (then nothing after the abort).
        let mut last = f64::NEG_INFINITY;
        let mut streamed: HashMap<u64, u32> = HashMap::new();
        let mut finished: HashMap<u64, u32> = HashMap::new();
        for o in &out {
            prop_assert!(o.at_ms() >= last);
            last = o.at_ms();
            if let Some(&abort) = aborted_at.get(&o.id()) {
                prop_assert!(o.at_ms() <= abort, "output after abort: {:?}", o);
            }
            match *o {
                EngineOutput::FirstToken { id, .. } => {
                    prop_assert_eq!(streamed.insert(id, 1), None, "two first tokens");
                }
                EngineOutput::Token { id, .. } => {
                    let n = streamed.get_mut(&id);
                    prop_assert!(n.is_some(), "token before first token");
                    if let Some(n) = n { *n += 1; }
                }
                EngineOutput::Finished { id, completion_tokens, .. } => {
                    prop_assert_eq!(finished.insert(id, completion_tokens), None);
                    prop_assert_eq!(streamed.get(&id).copied(), Some(completion_tokens));
                }
                EngineOutput::Preempted { .. } => {}
            }
        }
        for id in &accepted {
            if aborted_at.contains_key(id) && !finished.contains_key(id) {
                continue;
            }
            let s = &specs[*id as usize];
            let want = if s.hold { 1 } else { s.max_tokens };
            prop_assert_eq!(finished.get(id).copied(), Some(want), "request {}", id);
        }
    }
}
