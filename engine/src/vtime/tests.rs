use super::*;
use crate::{Prompt, TransferMode};
use switchyard_protocol::worker::WorkerRole;

fn prompt(seed: u32, len: u32) -> Prompt {
    Prompt::Tokens(
        (0..len)
            .map(|i| seed.wrapping_mul(7_919).wrapping_add(i))
            .collect(),
    )
}

fn collect(cluster: &mut Cluster) -> Vec<ClusterEvent> {
    let mut events = Vec::new();
    cluster.run(&mut |e| events.push(e));
    events
}

fn first_token(events: &[ClusterEvent], engine: EngineIdx, id: u64) -> f64 {
    events
        .iter()
        .find_map(|e| match e {
            ClusterEvent::Output {
                engine: en,
                output: EngineOutput::FirstToken { id: i, at_ms, .. },
            } if *en == engine && *i == id => Some(*at_ms),
            _ => None,
        })
        .expect("first token")
}

/// When `engine` finished request `id`.
fn finished_at(events: &[ClusterEvent], engine: EngineIdx, id: u64) -> f64 {
    events
        .iter()
        .find_map(|e| match e {
            ClusterEvent::Output {
                engine: en,
                output: EngineOutput::Finished { id: i, at_ms, .. },
            } if *en == engine && *i == id => Some(*at_ms),
            _ => None,
        })
        .expect("finished")
}

/// When the first KV transfer completes.
fn transfer_until(events: &[ClusterEvent]) -> f64 {
    events
        .iter()
        .find_map(|e| match e {
            ClusterEvent::TransferStarted { until_ms, .. } => Some(*until_ms),
            _ => None,
        })
        .expect("transfer")
}

/// A cluster of one prefill engine (`pcfg`) and one decode engine (`dcfg`), in that order.
fn prefill_decode(pcfg: EngineConfig, dcfg: EngineConfig) -> (Cluster, EngineIdx, EngineIdx) {
    let mut cluster = Cluster::new();
    let p = cluster.add_engine("prefill-0", pcfg).unwrap();
    let d = cluster.add_engine("decode-0", dcfg).unwrap();
    (cluster, p, d)
}

/// [`prefill_decode`] with default configs.
fn default_prefill_decode() -> (Cluster, EngineIdx, EngineIdx) {
    prefill_decode(
        EngineConfig::new(WorkerRole::Prefill),
        EngineConfig::new(WorkerRole::Decode),
    )
}

#[test]
fn disaggregated_request_prefills_transfers_then_decodes() {
    let (mut cluster, p, d) = default_prefill_decode();
    let req = EngineRequest::local(42, prompt(1, 8_192), 5);
    cluster.schedule(
        100.0,
        Arrival::Disaggregated {
            prefill: p,
            decode: d,
            req,
        },
    );
    let events = collect(&mut cluster);

    let perf = cluster.engine(p).config().perf;
    let prefill_done = first_token(&events, p, 42);
    assert!((prefill_done - 100.0 - perf.prefill_chunk_ms(8_192, 0)).abs() < 1e-6);
    let (tokens, until) = events
        .iter()
        .find_map(|e| match e {
            ClusterEvent::TransferStarted {
                tokens,
                until_ms,
                at_ms,
                ..
            } => {
                assert_eq!(*at_ms, prefill_done);
                Some((*tokens, *until_ms))
            }
            _ => None,
        })
        .expect("transfer");
    assert_eq!(tokens, 8_192);
    let xfer = cluster.engine(p).transfer_time_ms(8_192);
    assert!((until - prefill_done - xfer).abs() < 1e-9);
    // The decode worker's first token: one decode-sized step after the KV lands.
    let decode_first = first_token(&events, d, 42);
    let step = cluster.engine(d).config().perf.decode_ms(1, 8_192.0);
    assert!(
        (decode_first - until - step).abs() < 1e-6,
        "{decode_first} vs {until} + {step}"
    );
    // The decode leg streamed all five tokens and reports the transferred tokens.
    assert!(events.iter().any(|e| matches!(e,
        ClusterEvent::Output { engine, output: EngineOutput::Finished {
            id: 42, completion_tokens: 5, remote_tokens: 8_192, cached_tokens: 0, .. } }
        if *engine == d)));
    // Everything is released: the prefill worker's KV was pulled, the decode worker's freed.
    assert_eq!(cluster.engine(p).load().kv_used_blocks, 0);
    assert!(cluster.engine(p).held_kv(42).is_none());
    assert_eq!(cluster.engine(d).load().kv_used_blocks, 0);
    // The decode worker now caches the prompt: its next turn can bypass.
    assert_eq!(
        cluster.engine(d).cached_prefix_tokens(&prompt(1, 8_192)),
        8_192
    );
}

/// A missing-suffix handoff of `asked` (request 2) to a decode worker that first served
/// `warm` itself (request 1): the tokens the transfer moved, and request 2's finish on the
/// decode worker.
fn hand_off_after_warming(warm: Prompt, asked: Prompt) -> (Option<u64>, Option<EngineOutput>) {
    let mut pcfg = EngineConfig::new(WorkerRole::Prefill);
    pcfg.transfer.mode = TransferMode::MissingSuffix;
    let (mut cluster, p, d) = prefill_decode(pcfg, EngineConfig::new(WorkerRole::Decode));
    let warm = EngineRequest::local(1, warm, 1);
    cluster.schedule(
        0.0,
        Arrival::Direct {
            engine: d,
            req: warm,
        },
    );
    let req = EngineRequest::local(2, asked, 3);
    cluster.schedule(
        1_000.0,
        Arrival::Disaggregated {
            prefill: p,
            decode: d,
            req,
        },
    );
    let events = collect(&mut cluster);
    let moved = events.iter().find_map(|e| match e {
        ClusterEvent::TransferStarted { tokens, .. } => Some(*tokens),
        _ => None,
    });
    let finished = events.into_iter().find_map(|e| match e {
        ClusterEvent::Output { engine, output }
            if engine == d && matches!(output, EngineOutput::Finished { id: 2, .. }) =>
        {
            Some(output)
        }
        _ => None,
    });
    (moved, finished)
}

#[test]
fn missing_suffix_transfer_moves_only_what_decode_lacks() {
    // The decode worker warmed with the first 4,096 tokens.
    let (moved, finished) = hand_off_after_warming(prompt(9, 4_096), prompt(9, 6_000));
    assert_eq!(moved, Some(6_000 - 4_096));
    let cached = match finished {
        Some(EngineOutput::Finished { cached_tokens, .. }) => Some(cached_tokens),
        _ => None,
    };
    assert_eq!(cached, Some(4_096));
}

/// A decode worker that caches a prompt of whole blocks still computes its last token, so it
/// pulls the last block: the transfer moves what the engine then counts as pulled.
#[test]
fn a_decode_worker_holding_the_whole_prompt_pulls_its_last_block() {
    let (moved, finished) = hand_off_after_warming(prompt(7, 4_096), prompt(7, 4_096));
    let pulled = match finished {
        Some(EngineOutput::Finished { remote_tokens, .. }) => Some(u64::from(remote_tokens)),
        _ => None,
    };
    let block = u64::from(EngineConfig::new(WorkerRole::Decode).block_size);
    assert_eq!((moved, pulled), (Some(block), Some(block)));
}

#[test]
fn events_arrive_in_time_order_and_kv_events_are_forwarded() {
    let mut cluster = Cluster::new();
    cluster.set_forward_kv_events(true);
    let a = cluster
        .add_engine("a", EngineConfig::new(WorkerRole::Agg))
        .unwrap();
    let b = cluster
        .add_engine("b", EngineConfig::new(WorkerRole::Agg))
        .unwrap();
    for i in 0..20u64 {
        let engine = if i % 2 == 0 { a } else { b };
        let req = EngineRequest::local(i, prompt(i as u32, 500 + 100 * i as u32), 10 + i as u32);
        cluster.schedule(37.0 * i as f64, Arrival::Direct { engine, req });
    }
    let mut last = f64::NEG_INFINITY;
    let mut finished = 0;
    let mut stored_blocks = 0;
    cluster.run(&mut |e| match e {
        ClusterEvent::Output { output, .. } => {
            assert!(output.at_ms() >= last, "time went backwards");
            last = output.at_ms();
            if matches!(output, EngineOutput::Finished { .. }) {
                finished += 1;
            }
        }
        ClusterEvent::KvBatches { batches, .. } => {
            for ev in batches.into_iter().flat_map(|b| b.events) {
                if let switchyard_protocol::kv::KvEvent::Stored { blocks, .. } = ev {
                    stored_blocks += blocks.len();
                }
            }
        }
        other => panic!("unexpected {other:?}"),
    });
    assert_eq!(finished, 20);
    // Every full prompt block was stored once (no shared prefixes across these prompts),
    // plus blocks completed by generated tokens.
    let prompt_blocks: usize = (0..20).map(|i| (500 + 100 * i) / 64).sum();
    assert!(stored_blocks >= prompt_blocks);
    assert!(cluster.next_event_ms().is_none());
}

#[test]
fn rejected_arrivals_are_reported_not_lost() {
    let mut cluster = Cluster::new();
    let a = cluster
        .add_engine("a", EngineConfig::new(WorkerRole::Agg))
        .unwrap();
    cluster.schedule(
        5.0,
        Arrival::Direct {
            engine: a,
            req: EngineRequest::local(1, prompt(1, 0), 3),
        },
    );
    let events = collect(&mut cluster);
    assert!(matches!(events.as_slice(),
        [ClusterEvent::Rejected { id: 1, error: EngineError::EmptyPrompt { id: 1 }, at_ms, .. }]
        if *at_ms == 5.0));
}

#[test]
fn step_next_lets_the_caller_react_at_event_time() {
    // A closed loop: every finish immediately submits the next request on the same engine.
    let mut cluster = Cluster::new();
    let a = cluster
        .add_engine("a", EngineConfig::new(WorkerRole::Agg))
        .unwrap();
    cluster
        .submit(Arrival::Direct {
            engine: a,
            req: EngineRequest::local(0, prompt(0, 256), 4),
        })
        .unwrap();
    let mut next_id = 1u64;
    let mut finish_times = Vec::new();
    while next_id < 10 {
        let mut finished = Vec::new();
        cluster.step_next(&mut |e| {
            if let ClusterEvent::Output {
                output: EngineOutput::Finished { at_ms, .. },
                ..
            } = e
            {
                finished.push(at_ms);
            }
        });
        for at in finished {
            assert_eq!(cluster.now_ms(), at);
            finish_times.push(at);
            let req = EngineRequest::local(next_id, prompt(next_id as u32, 256), 4);
            cluster.submit(Arrival::Direct { engine: a, req }).unwrap();
            next_id += 1;
        }
    }
    assert_eq!(finish_times.len(), 9);
    assert!(finish_times.windows(2).all(|w| w[1] > w[0]));
}

#[test]
fn trace_rows_sharing_hash_ids_share_engine_blocks() {
    let seed = switchyard_protocol::hash::HashSeed::default();
    let a = trace_block_hashes(&[0, 1, 2, 3], 2_000, 512, 64, seed);
    let b = trace_block_hashes(&[0, 1, 9], 1_300, 512, 64, seed);
    assert_eq!(a.len(), 31); // 2,000 / 64
    assert_eq!(b.len(), 20);
    assert_eq!(
        a[..16],
        b[..16],
        "two shared 512-token blocks = 16 engine blocks"
    );
    assert!(a[16..20].iter().zip(&b[16..20]).all(|(x, y)| x != y));
    // Deterministic, and different positions of the same id differ.
    assert_eq!(a, trace_block_hashes(&[0, 1, 2, 3], 2_000, 512, 64, seed));
    let c = trace_block_hashes(&[5], 512, 512, 64, seed);
    let mut unique = c.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), c.len());
}

#[test]
fn prefill_worker_holds_the_kv_until_the_transfer_lands() {
    let mut pcfg = EngineConfig::new(WorkerRole::Prefill);
    pcfg.transfer = crate::TransferModel::gb200_cross_rack(); // a visible transfer
    let (mut cluster, p, d) = prefill_decode(pcfg, EngineConfig::new(WorkerRole::Decode));
    let req = EngineRequest::local(5, prompt(5, 100_000), 2);
    cluster.schedule(
        0.0,
        Arrival::Disaggregated {
            prefill: p,
            decode: d,
            req,
        },
    );
    let mut until = None;
    while until.is_none() {
        cluster.step_next(&mut |e| {
            if let ClusterEvent::TransferStarted { until_ms, .. } = e {
                until = Some(until_ms);
            }
        });
    }
    let until = until.unwrap();
    // In flight: the prefill worker still pins the prompt, the decode worker has nothing.
    assert!(cluster.engine(p).held_kv(5).is_some());
    assert_eq!(cluster.engine(p).load().kv_used_blocks, 1_563); // 100,001 tokens / 64
    assert!(!cluster.engine(d).contains(5));
    assert!(
        (until - cluster.now_ms() - 34.0).abs() < 1.0,
        "~34 ms across racks"
    );
    cluster.run_until(until, &mut |_| {});
    assert!(cluster.engine(p).held_kv(5).is_none());
    assert!(cluster.engine(d).contains(5));
}

#[test]
fn a_full_decode_worker_queues_the_decode_leg_until_kv_frees() {
    let mut dcfg = EngineConfig::new(WorkerRole::Decode);
    dcfg.kv_capacity_blocks = 40; // 2,560 tokens
    let (mut cluster, p, d) = prefill_decode(EngineConfig::new(WorkerRole::Prefill), dcfg);
    // A local request fills most of the decode worker for a while.
    let busy = EngineRequest::local(1, prompt(1, 1_900), 200);
    cluster.schedule(
        0.0,
        Arrival::Direct {
            engine: d,
            req: busy,
        },
    );
    let req = EngineRequest::local(2, prompt(2, 1_500), 3);
    cluster.schedule(
        0.0,
        Arrival::Disaggregated {
            prefill: p,
            decode: d,
            req,
        },
    );
    let events = collect(&mut cluster);
    let finish = |id: u64| finished_at(&events, d, id);
    // Request 1 holds 30-33 of the 40 blocks; the decode leg needs 24. Waiting requests
    // never preempt running ones (vLLM), so the leg waits for request 1 to finish.
    let transfer_done = transfer_until(&events);
    assert!(
        transfer_done < finish(1),
        "the KV arrived while the worker was full"
    );
    assert!(first_token(&events, d, 2) > finish(1));
    assert!(finish(2) > finish(1));
    assert_eq!(cluster.engine(d).load().kv_used_blocks, 0);
    assert_eq!(cluster.engine(p).load().kv_used_blocks, 0);
}

#[test]
fn handoff_cpu_time_delays_the_transfer_by_the_prompt_length() {
    let (mut cluster, p, d) = default_prefill_decode();
    // 0.01 ms per prompt token: a 4,096-token prompt waits 40.96 ms (the decode worker's
    // tokenization) before its KV starts moving.
    cluster.set_handoff_cpu_ms(0.01, 0.0);
    let req = EngineRequest::local(7, prompt(3, 4_096), 2);
    cluster.schedule(
        0.0,
        Arrival::Disaggregated {
            prefill: p,
            decode: d,
            req,
        },
    );
    let events = collect(&mut cluster);
    let prefill_done = first_token(&events, p, 7);
    let until = transfer_until(&events);
    let xfer = cluster.engine(p).transfer_time_ms(4_096);
    assert!(
        (until - prefill_done - 40.96 - xfer).abs() < 1e-9,
        "{until}"
    );
    assert!(first_token(&events, d, 7) > until);
    // Nonsense settings count as no delay.
    cluster.set_handoff_cpu_ms(f64::NAN, -1.0);
    assert_eq!(cluster.handoff_cpu_ms_per_prompt_token, 0.0);
    assert_eq!(cluster.handoff_cpu_ms_per_cached_token, 0.0);
}

/// A decode worker tokenizes a later turn's decode leg mostly from its segment cache: the
/// tokens it caches cost the cached rate. Charging all at the new-token rate made the
/// cross-check's virtual disagg TTFT several times the real stack's.
#[test]
fn handoff_cpu_time_charges_the_decode_workers_cached_tokens_their_own_rate() {
    let (mut cluster, p, d) = default_prefill_decode();
    cluster.set_handoff_cpu_ms(0.01, 0.001);
    // The first turn: nothing cached on the decode worker.
    let first = EngineRequest::local(1, prompt(3, 4_096), 2);
    cluster.schedule(
        0.0,
        Arrival::Disaggregated {
            prefill: p,
            decode: d,
            req: first,
        },
    );
    let events = collect(&mut cluster);
    let cold = transfer_until(&events) - first_token(&events, p, 1);
    // The same prompt again: the decode worker holds all of it now.
    let again = EngineRequest::local(2, prompt(3, 4_096), 2);
    let start = cluster.now_ms() + 1.0;
    cluster.schedule(
        start,
        Arrival::Disaggregated {
            prefill: p,
            decode: d,
            req: again,
        },
    );
    let events = collect(&mut cluster);
    let warm = transfer_until(&events) - first_token(&events, p, 2);
    assert!(
        (cold - 40.96 - cluster.engine(p).transfer_time_ms(4_096)).abs() < 1e-9,
        "{cold}"
    );
    // 4.096 ms of cached-rate tokenization, and only the last block to move (the decode
    // worker computes the prompt's last token, so it reads every block but that one).
    let last_block = cluster.engine(p).transfer_time_ms(64);
    assert!((warm - 4.096 - last_block).abs() < 1e-6, "{warm}");
}
