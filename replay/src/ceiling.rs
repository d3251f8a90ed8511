//! The goodput ceiling of a workload (simulated model): an upper bound on the goodput **any**
//! deployment, of any size and under any routing policy, can reach on it in virtual time.
//!
//! Goodput is requests within the SLOs per second of the run's window (first send to the last
//! successful completion, or the last send if later). In a closed loop the window is set by
//! the sessions' chains of turns, so a deployment that served every turn faster would both
//! finish sooner and send the next turns sooner. The bound serves every request alone on an
//! idle worker with a perfect prefix cache and counts every servable request as good:
//!
//! - **first token** ≥ one prefill iteration of the tokens no other request's prompt holds
//!   (nothing can have cached them), with everything else counted as cached; a prompt with
//!   no such tokens still computes one token, at least a one-sequence decode step;
//! - **every later token** ≥ a one-sequence decode step at its context (`isl + k`): a batch
//!   of more sequences, more context or prefill work beside it only costs more (the model's
//!   coefficients are all positive);
//! - **sends** as the tracker makes them: a request without dependencies at its scaled
//!   arrival, one with dependencies its scaled think time after the last of them completes;
//! - a request whose prompt and output exceed a worker's KV capacity fails in every run, and
//!   so does one the model's context refuses (an output above it, or a prompt that leaves no
//!   room for a token): it is not counted, and it "completes" at its send (no run can serve
//!   it, and its dependents may go on at once); an output longer than the context leaves is
//!   cut as the runs cut it.
//!
//! Each bound is at most what the engine model charges, so by induction over the
//! dependencies every request completes no earlier here than in any run, the window is no
//! shorter, and `requests ÷ window` is at least any run's goodput. Chat-template tokens and KV
//! transfers are left out, which only lowers the bound's times.
//!
//! What it is for: a bar that asks a policy for more than this ceiling asks for more than
//! the engine model can serve (`docs/benchmarks.md`, bar (b)).

use std::collections::HashMap;

use serde::Serialize;
use switchyard_engine::PerfModel;
use switchyard_loadgen::{ArrivalScale, Workload};

use crate::stack::context_allows;
use crate::tracker::send_time;

/// The bound for one workload at one arrival scale.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GoodputCeiling {
    /// The shortest window any run can have, s.
    pub window_s: f64,
    /// Requests ÷ that window: no run's goodput is higher, req/s.
    pub requests_per_s: f64,
}

/// The ceiling of `workload` on workers of `perf` holding `kv_capacity_tokens` each, for a
/// model of `max_model_len` tokens' context, at `scale` (see the module doc).
pub fn goodput_ceiling(
    workload: &Workload,
    perf: &PerfModel,
    (kv_capacity_tokens, max_model_len): (u64, u32),
    scale: ArrivalScale,
) -> GoodputCeiling {
    let requests = &workload.requests;
    let uncacheable = tokens_no_other_prompt_holds(workload);
    let mut done_ms = vec![f64::NAN; requests.len()];
    let mut first_send = f64::INFINITY;
    let mut last_done = f64::NEG_INFINITY;
    let mut servable = 0usize;
    for index in dependency_order(workload) {
        let r = &requests[index];
        // Dependencies outside the workload are ignored, as the tracker ignores them.
        let deps_done = r
            .after
            .iter()
            .filter_map(|&d| done_ms.get(d).copied())
            .fold(f64::NEG_INFINITY, f64::max);
        let sent = send_time(r, scale, deps_done);
        let isl = usize::try_from(r.isl()).unwrap_or(usize::MAX);
        let done = match context_allows(isl, r.osl, max_model_len) {
            Ok(osl) if r.isl() + u64::from(osl) <= kv_capacity_tokens => {
                servable += 1;
                sent + service_floor_ms(perf, r.isl(), uncacheable[index], osl)
            }
            _ => sent,
        };
        done_ms[index] = done;
        first_send = first_send.min(sent);
        last_done = last_done.max(done);
    }
    let window_s = if last_done > first_send {
        (last_done - first_send) / 1000.0
    } else {
        0.0
    };
    GoodputCeiling {
        window_s,
        requests_per_s: if window_s > 0.0 {
            servable as f64 / window_s
        } else {
            0.0
        },
    }
}

/// The least time one request of `isl` prompt tokens, `new` of which no cache can hold, and
/// `osl` output tokens takes from send to last token on an idle worker, ms.
pub fn service_floor_ms(perf: &PerfModel, isl: u64, new: u64, osl: u32) -> f64 {
    let first_token = if new > 0 {
        perf.prefill_chunk_ms(new, isl.saturating_sub(new))
    } else {
        perf.decode_ms(1, isl as f64)
    };
    // Σ over k = 1..osl-1 of decode_ms(1, isl + k): a one-sequence step is affine in its
    // context, so the sum is the steps at `isl` plus b3 × (1 + … + (osl − 1)).
    let later = u64::from(osl.saturating_sub(1));
    let steps =
        later as f64 * perf.decode_ms(1, isl as f64) + perf.b3 * (later * (later + 1) / 2) as f64;
    first_token + if later > 0 { steps } else { 0.0 }
}

/// Per request, the prompt tokens in content blocks that appear in no other request's prompt.
fn tokens_no_other_prompt_holds(workload: &Workload) -> Vec<u64> {
    let mut holders: HashMap<u64, usize> = HashMap::new();
    for r in &workload.requests {
        let mut blocks: Vec<u64> = r.prompt.segments.iter().map(|s| s.block).collect();
        blocks.sort_unstable();
        blocks.dedup();
        for b in blocks {
            *holders.entry(b).or_insert(0) += 1;
        }
    }
    workload
        .requests
        .iter()
        .map(|r| {
            r.prompt
                .segments
                .iter()
                .filter(|s| holders.get(&s.block).copied().unwrap_or(0) <= 1)
                .map(|s| u64::from(s.tokens))
                .sum()
        })
        .collect()
}

/// Indices with every request after its dependencies (Kahn's order; dependencies outside the
/// workload are ignored, as the tracker ignores them, and requests on a cycle, which the
/// tracker never sends, are left out).
fn dependency_order(workload: &Workload) -> Vec<usize> {
    let n = workload.requests.len();
    let mut waiting_on = vec![0usize; n];
    let mut dependents = vec![Vec::new(); n];
    for r in &workload.requests {
        for &d in r.after.iter().filter(|&&d| d < n) {
            waiting_on[r.id] += 1;
            dependents[d].push(r.id);
        }
    }
    let mut order: Vec<usize> = (0..n).filter(|&i| waiting_on[i] == 0).collect();
    let mut next = 0;
    while let Some(&i) = order.get(next) {
        next += 1;
        for &j in &dependents[i] {
            waiting_on[j] -= 1;
            if waiting_on[j] == 0 {
                order.push(j);
            }
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_loadgen::prompts::{PromptSpec, Segment};
    use switchyard_loadgen::PlannedRequest;

    fn request(
        id: usize,
        arrival_ms: u64,
        after: Vec<usize>,
        think_ms: u64,
        blocks: &[u64],
    ) -> PlannedRequest {
        PlannedRequest {
            id,
            arrival_ms,
            session: 0,
            turn: 0,
            agent: 0,
            after,
            think_ms,
            prompt: PromptSpec {
                segments: blocks
                    .iter()
                    .map(|&block| Segment {
                        block,
                        tokens: 1_000,
                    })
                    .collect(),
            },
            osl: 100,
        }
    }

    fn workload(requests: Vec<PlannedRequest>) -> Workload {
        Workload {
            name: "ceiling".into(),
            content_seed: 0,
            requests,
        }
    }

    #[test]
    fn a_chain_of_turns_waits_for_each_turn_and_its_think_time() {
        let perf = PerfModel::default();
        // Turn 1's prompt (block 1) is in turn 2's prompt, so only block 2 is new there.
        let workload = workload(vec![
            request(0, 0, vec![], 0, &[1]),
            request(1, 0, vec![0], 500, &[1, 2]),
        ]);
        let c = goodput_ceiling(
            &workload,
            &perf,
            (u64::MAX, u32::MAX),
            ArrivalScale::PLANNED,
        );
        let first = service_floor_ms(&perf, 1_000, 0, 100);
        let second = service_floor_ms(&perf, 2_000, 1_000, 100);
        let window_ms = first + 500.0 + second;
        assert!((c.window_s * 1000.0 - window_ms).abs() < 1e-6);
        assert!((c.requests_per_s - 2.0 / (window_ms / 1000.0)).abs() < 1e-9);
        // Half the think time: a shorter window.
        let faster = goodput_ceiling(
            &workload,
            &perf,
            (u64::MAX, u32::MAX),
            ArrivalScale::new(0.5).unwrap(),
        );
        assert!((faster.window_s * 1000.0 - (window_ms - 250.0)).abs() < 1e-6);
    }

    #[test]
    fn the_service_floor_is_the_engine_models_own_steps() {
        let perf = PerfModel::default();
        // 1,000 new tokens after 3,000 cached, then 9 decode steps at contexts 4,001..4,009.
        let expected = perf.prefill_chunk_ms(1_000, 3_000)
            + (1..10)
                .map(|k| perf.decode_ms(1, (4_000 + k) as f64))
                .sum::<f64>();
        assert!((service_floor_ms(&perf, 4_000, 1_000, 10) - expected).abs() < 1e-9);
        // A fully cached prompt still computes one token.
        assert_eq!(
            service_floor_ms(&perf, 4_000, 0, 1),
            perf.decode_ms(1, 4_000.0)
        );
    }

    #[test]
    fn open_loop_requests_keep_their_arrivals() {
        let perf = PerfModel::default();
        let workload = workload(vec![
            request(0, 0, vec![], 0, &[1]),
            request(1, 10_000, vec![], 0, &[2]),
        ]);
        let c = goodput_ceiling(
            &workload,
            &perf,
            (u64::MAX, u32::MAX),
            ArrivalScale::PLANNED,
        );
        let last = 10_000.0 + service_floor_ms(&perf, 1_000, 1_000, 100);
        assert!((c.window_s * 1000.0 - last).abs() < 1e-6);
    }

    /// A request no worker can hold fails in every run: counted, it put the bound below
    /// the goodput runs served (its service floor took the window far past every run's).
    #[test]
    fn a_request_beyond_every_workers_kv_is_neither_counted_nor_waited_for() {
        let perf = PerfModel::default();
        let mut too_large = request(1, 5_000, vec![], 0, &[2; 8]);
        too_large.prompt.segments[0].tokens = 9_000;
        let workload = workload(vec![request(0, 0, vec![], 0, &[1]), too_large]);
        // Request 0 needs 1,100 tokens of KV, request 1 16,100: capacity 10,000.
        let c = goodput_ceiling(&workload, &perf, (10_000, u32::MAX), ArrivalScale::PLANNED);
        let served = service_floor_ms(&perf, 1_000, 1_000, 100);
        let window_ms = served.max(5_000.0);
        assert!((c.window_s * 1000.0 - window_ms).abs() < 1e-6, "{c:?}");
        assert!((c.requests_per_s - 1.0 / (window_ms / 1000.0)).abs() < 1e-9);
    }

    /// The model's context holds as in the runs: a prompt beyond it is refused (not counted,
    /// not waited for), and an output longer than the context leaves is cut.
    #[test]
    fn the_context_refuses_and_cuts_as_the_runs_do() {
        let perf = PerfModel::default();
        let mut too_long = request(1, 100, vec![], 0, &[2; 8]);
        too_long.prompt.segments[0].tokens = 9_000;
        let workload = workload(vec![request(0, 0, vec![], 0, &[1]), too_long]);
        // Request 0: 1,000 prompt tokens and 100 asked, of which a 1,050-token context
        // leaves 50; request 1's prompt is past it, and sent before request 0 ends.
        let c = goodput_ceiling(&workload, &perf, (u64::MAX, 1_050), ArrivalScale::PLANNED);
        let window_ms = service_floor_ms(&perf, 1_000, 1_000, 50);
        assert!(window_ms > 100.0 && window_ms < service_floor_ms(&perf, 1_000, 1_000, 100));
        assert!((c.window_s * 1000.0 - window_ms).abs() < 1e-6, "{c:?}");
        assert!((c.requests_per_s - 1.0 / (window_ms / 1000.0)).abs() < 1e-9);
    }
}
