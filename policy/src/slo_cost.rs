//! `slo_cost`: bypass iff, by the router's timing model, a bypass is predicted to reach the
//! first token no later than disaggregation **and** the stall its prefill adds to the decode
//! worker's running streams fits their ITL budget. No token thresholds: the SLOs and the
//! engine's coefficients (`ConditionalDisaggConfig`'s `slo_itl_ms`, `prefill_*`, `decode_*`,
//! `kv_transfer_*` fields, defaulting to the simulated GB200 FP8 TEP4 worker) decide.
//!
//! **Timing model** (docs/sim-model.md's, reduced to what the router knows). Prefilling `n`
//! new tokens after `c` cached ones, in chunks of `prefill_chunk_tokens`:
//!
//! ```text
//! prefill(n, c) = ceil(n / chunk)·prefill_iteration_ms + prefill_ms_per_token·n
//!               + prefill_attention_ms_per_token_pair·n·(c + n/2)
//! step(B)       = decode_step_ms + decode_step_ms_per_stream·B      (0 for B = 0)
//! ```
//!
//! Queued prefill tokens are costed by `queue(q)`: as cold prompts of one chunk each,
//! `chunks(q)·prefill_iteration_ms + prefill_ms_per_token·q + pair·q·min(q, chunk)/2`. A queue
//! is many prompts, and the router does not know their contexts; costing it as *one* prompt of
//! `q` tokens (what this did before) made its attention term quadratic in the queue: a 2 M-token
//! queue came out at 18 minutes against 5 of real work, and the learned prefill factor, fitted
//! to that, sank to its floor and shrank every bypass's predicted stall with it
//! (docs/benchmarks.md, "Agentic sessions that saturate 4 workers"). Linear, the queue of
//! long-context prompts is underestimated instead, and the learned factor makes up for it.
//!
//! - **Disagg TTFT** = `queue(q_p)` of the prefill worker + `prefill(isl − p_cached, p_cached)` + the
//!   KV transfer of what the decode worker lacks (`kv_transfer_ms_per_token·eff_isl`, as vLLM's
//!   NixlConnector reads only those blocks) + one decode step on the
//!   decode worker with this stream added.
//! - **Bypass TTFT** = `queue(q_d)` of the decode worker + `prefill(eff_isl, isl −
//!   eff_isl)`, where every prefill iteration also carries the running streams' decode step
//!   (a mixed iteration costs the sum, docs/sim-model.md).
//! - **Stall**: the prefill time this bypass adds to the decode worker's iterations: its own
//!   prefill, not the queue ahead of it. That queue delays its first token (it is in the bypass
//!   TTFT) and stalls the same streams, but each bypass in it was charged its own prefill
//!   against its own share of the budget when it was routed; charging the queue again to every
//!   later bypass counted the same stall many times over, and made a short prompt behind a
//!   queue look like a long one. Past saturation that sent short prompts to a prefill pool
//!   whose queue lost them: on the Mooncake slice at 4× load, 110 prompts of ≤ 1,024 uncached
//!   tokens went to prefill workers and 1 of them met the TTFT objective, where a static
//!   policy that bypassed every prompt that short served three quarters of them within both
//!   objectives (docs/benchmarks.md, "Agentic traffic at every load"). A long queue still
//!   turns a bypass into disagg, through the TTFT comparison.
//!
//! **ITL budget.** Goodput counts a stream's *mean* time per output token. A stream decoding at
//! `step(B)` per token has `slo_itl_ms − step(B)` of slack per token it emits, so over its
//! `itl_stall_horizon_tokens` output tokens it can absorb `(slo_itl_ms − step(B))·horizon` of
//! stall and still meet the objective. It does not absorb it for one bypass only: by Little's
//! law a worker holding `B` streams sees about `B` new requests arrive over one stream's life,
//! each a possible bypass, so one bypass may take `1/B` of it:
//! `budget = (slo_itl_ms − step(B))·horizon / B`. The rule keeps no memory of past stalls; the
//! split is what makes a stream of bypasses, each within budget, stay within the objective
//! together. A per-step bound
//! (no iteration longer than the ITL objective) would forbid every bypass of more than a few
//! hundred tokens next to a running stream, though goodput does not measure the per-step
//! tail. A decode worker with no running stream has nothing to stall: no bound. The
//! horizon is the one number the workload shapes (the streams' remaining output); its
//! default, 256, is below the Mooncake conversation slice's mean output (352 tokens). (A first
//! version gave each bypass the whole `(slo − step)·horizon`; in virtual time its decode
//! workers broke the ITL objective under load: docs/policies.md, "slo_cost".) `B` counts
//! streams past their first token only: a request still waiting for its prefill stalls
//! nothing, and counting it starved saturated runs of bypasses.
//!
//! **The rescue.** When disaggregation would bring the request to its first token after
//! `slo_ttft_ms`, the request is lost that way (a prefill pool past saturation, its queue
//! minutes long), while the `1/B` share above still assumes the alternative is free. Such a
//! request may then stall its decode worker by up to `budget · rescue`, where `rescue`
//! (`PolicyInput::stall_rescue_scale`, ≥ 1) is learned online from finished streams' ITL
//! (`crate::learn::RescueScale`): it grows while streams meet the ITL objective and shrinks as
//! soon as more than 5 % miss it. So the rescue spends exactly the ITL slack the streams have
//! left, which the fixed `1/B` split cannot know. Without it, past saturation the ITL rule
//! sent the turns with the largest local prefills — the longest contexts — to a prefill worker
//! whose queue was minutes long, where each was lost and kept its whole session waiting.
//!
//! Decision: disagg (`disagg:slo_cost_ttft`) when the bypass TTFT is strictly larger; else
//! bypass (`bypass:slo_cost`) when the stall fits the budget; else bypass
//! (`bypass:slo_cost_rescue`) when disagg would miss the TTFT objective and the stall fits the
//! rescued budget; else disagg (`disagg:slo_cost_itl_stall`). "Disagg would break the TTFT
//! objective while bypass would not" needs no rule of its own: it implies the bypass TTFT is
//! the smaller one, which the comparison already bypasses; and when both would break it, the
//! faster choice is still the better one.

use crate::config::ConditionalDisaggConfig;
use crate::{BypassPolicy, Decision, PolicyInput, Reason};

/// See the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct SloCost;

/// What the timing model predicts for one request, both ways (ms).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// TTFT if the decode worker prefills the request itself.
    pub bypass_ttft_ms: f64,
    /// TTFT through the prefill worker and a KV transfer.
    pub disagg_ttft_ms: f64,
    /// Prefill time a bypass puts in front of the decode worker's running streams.
    pub bypass_stall_ms: f64,
    /// Stall the running streams can absorb within the ITL objective (infinite with none).
    pub stall_budget_ms: f64,
    /// The budget with the learned rescue applied when disagg would miss the TTFT objective;
    /// else equal to `stall_budget_ms`.
    pub rescue_budget_ms: f64,
}

/// Prefill iterations (chunks) for `new` tokens.
fn chunks(new: u64, cfg: &ConditionalDisaggConfig) -> u64 {
    new.div_ceil(u64::from(cfg.prefill_chunk_tokens.max(1)))
}

/// Prefill time (ms) of `new` tokens after `cached` ones, without decode work.
pub fn prefill_ms(new: u64, cached: u64, cfg: &ConditionalDisaggConfig) -> f64 {
    let n = new as f64;
    chunks(new, cfg) as f64 * cfg.prefill_iteration_ms
        + cfg.prefill_ms_per_token * n
        + cfg.prefill_attention_ms_per_token_pair * n * (cached as f64 + n / 2.0)
}

/// Time (ms) to work through `queued` prefill tokens of unknown prompts, costed as cold prompts
/// of one chunk each: linear in the queue (see the module docs for why not one prompt).
pub fn queue_ms(queued: u64, cfg: &ConditionalDisaggConfig) -> f64 {
    let chunk = u64::from(cfg.prefill_chunk_tokens.max(1));
    let n = queued as f64;
    chunks(queued, cfg) as f64 * cfg.prefill_iteration_ms
        + cfg.prefill_ms_per_token * n
        + cfg.prefill_attention_ms_per_token_pair * n * (queued.min(chunk) as f64 / 2.0)
}

/// One decode iteration (ms) of `streams` running streams; 0 without any.
pub fn step_ms(streams: u32, cfg: &ConditionalDisaggConfig) -> f64 {
    if streams == 0 {
        0.0
    } else {
        cfg.decode_step_ms + cfg.decode_step_ms_per_stream * f64::from(streams)
    }
}

/// The timing model's prediction for `input` (see the module docs).
pub fn predict(input: &PolicyInput, cfg: &ConditionalDisaggConfig) -> Prediction {
    let isl = u64::from(input.isl);
    let eff_isl = u64::from(input.eff_isl.min(input.isl));
    let p_cached = u64::from(input.prefill_cached_tokens.min(input.isl));
    let running = input.decode_running_streams;

    let disagg_ttft_ms = queue_ms(input.prefill_queued_tokens, cfg)
        + prefill_ms(isl - p_cached, p_cached, cfg)
        + cfg.kv_transfer_ms_per_token * eff_isl as f64
        + step_ms(running.saturating_add(1), cfg);

    let queue = input.decode_queued_tokens;
    // The queue ahead delays this request's first token, but its stall was charged to the
    // bypasses that queued it: this one adds only its own prefill (module docs, "Stall").
    let bypass_stall_ms = prefill_ms(eff_isl, isl - eff_isl, cfg);
    let iterations = chunks(queue, cfg) + chunks(eff_isl, cfg).max(1);
    let bypass_ttft_ms =
        queue_ms(queue, cfg) + bypass_stall_ms + iterations as f64 * step_ms(running, cfg);

    let stall_budget_ms = if running == 0 {
        f64::INFINITY
    } else {
        // Each stream shares its life with about `running` later arrivals (Little's law), any
        // of which may stall it: its slack over its output is split between them.
        (cfg.slo_itl_ms - step_ms(running, cfg)).max(0.0) * f64::from(cfg.itl_stall_horizon_tokens)
            / f64::from(running)
    };
    // Disaggregation would lose the request for TTFT: its bypass may spend the learned
    // rescue of the streams' slack (a scale below 1, as an absent field reads, is none).
    let rescue_budget_ms = if disagg_ttft_ms > cfg.slo_ttft_ms {
        stall_budget_ms * input.stall_rescue_scale.max(1.0)
    } else {
        stall_budget_ms
    };
    Prediction {
        bypass_ttft_ms,
        disagg_ttft_ms,
        bypass_stall_ms,
        stall_budget_ms,
        rescue_budget_ms,
    }
}

impl BypassPolicy for SloCost {
    fn decide(&self, input: &PolicyInput, cfg: &ConditionalDisaggConfig) -> Decision {
        let p = predict(input, cfg);
        if p.bypass_ttft_ms > p.disagg_ttft_ms {
            Decision::Disagg(Reason::DisaggSloCostTtft)
        } else if p.bypass_stall_ms <= p.stall_budget_ms {
            Decision::Bypass(Reason::BypassSloCost)
        } else if p.bypass_stall_ms <= p.rescue_budget_ms {
            Decision::Bypass(Reason::BypassSloCostRescue)
        } else {
            Decision::Disagg(Reason::DisaggSloCostItlStall)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::input;

    fn cfg() -> ConditionalDisaggConfig {
        ConditionalDisaggConfig {
            policy: crate::config::PolicyKind::SloCost,
            ..ConditionalDisaggConfig::default()
        }
    }

    /// A request of `isl` tokens, `eff_isl` uncached on the decode worker, `p_cached` cached
    /// on the prefill worker, with `running` streams on the decode worker.
    fn req(isl: u32, eff_isl: u32, p_cached: u32, running: u32) -> PolicyInput {
        PolicyInput {
            prefill_cached_tokens: p_cached,
            decode_running_streams: running,
            ..input(isl, eff_isl)
        }
    }

    #[test]
    fn the_model_matches_the_sim_models_spot_checks() {
        // docs/sim-model.md: 32,768 cold tokens in 8,192-token chunks take 857 ms.
        let c = cfg();
        assert!((prefill_ms(32_768, 0, &c) - 857.0).abs() < 5.0);
        // 8,192 cold tokens in one pass: 159.7 ms.
        assert!((prefill_ms(8_192, 0, &c) - 159.7).abs() < 0.5);
        assert_eq!(prefill_ms(0, 1000, &c), 0.0);
        assert_eq!(step_ms(0, &c), 0.0);
    }

    #[test]
    fn a_warm_prompt_bypasses_and_a_cold_one_on_a_busy_decode_worker_disaggregates() {
        // Turn two of a session: both workers cache the history; the decode worker skips the
        // transfer and wins.
        assert_eq!(
            SloCost.decide(&req(20_000, 500, 19_500, 8), &cfg()),
            Decision::Bypass(Reason::BypassSloCost)
        );
        // Cold 32k prompt next to running streams: four mixed iterations lose to one pass
        // on the idle prefill worker plus a 1.2 ms transfer.
        assert_eq!(
            SloCost.decide(&req(32_768, 32_768, 0, 8), &cfg()),
            Decision::Disagg(Reason::DisaggSloCostTtft)
        );
        // An idle decode worker: no steps interleave, no transfer: bypass.
        assert_eq!(
            SloCost.decide(&req(32_768, 32_768, 0, 0), &cfg()),
            Decision::Bypass(Reason::BypassSloCost)
        );
    }

    #[test]
    fn the_prefill_queue_turns_disagg_into_bypass_at_the_predicted_crossover() {
        let c = cfg();
        // One running stream: its ITL budget (2.2 s) holds the whole prefill.
        let base = req(32_768, 32_768, 0, 1);
        let p = predict(&base, &c);
        let gap = p.bypass_ttft_ms - p.disagg_ttft_ms;
        assert!(gap > 0.0);
        // Find the smallest queue that closes the gap; one token less still disaggregates.
        let (mut lo, mut hi) = (0u64, 10_000_000u64);
        let with = |q: u64| {
            SloCost.decide(
                &PolicyInput {
                    prefill_queued_tokens: q,
                    ..base
                },
                &c,
            )
        };
        while lo + 1 < hi {
            let mid = (lo + hi) / 2;
            if with(mid).is_bypass() {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        assert_eq!(with(lo), Decision::Disagg(Reason::DisaggSloCostTtft));
        assert_eq!(with(hi), Decision::Bypass(Reason::BypassSloCost));
        let at = predict(
            &PolicyInput {
                prefill_queued_tokens: hi,
                ..base
            },
            &c,
        );
        assert!(at.bypass_ttft_ms <= at.disagg_ttft_ms);
    }

    #[test]
    fn the_itl_budget_boundary() {
        // Fully warm on the decode worker, cold on the prefill worker: bypass is faster, so
        // only the stall decides. Budget with 10 streams: (25 − 16.443) × 320 / 10 = 273.8 ms.
        let c = ConditionalDisaggConfig {
            itl_stall_horizon_tokens: 320,
            ..cfg()
        };
        let budget = (25.0 - step_ms(10, &c)) * 320.0 / 10.0;
        assert!((predict(&req(1, 1, 0, 10), &c).stall_budget_ms - budget).abs() < 1e-9);
        let mut i = req(100_000, 2_000, 0, 10);
        let stall = predict(&i, &c).bypass_stall_ms;
        assert!(stall < budget, "{stall} {budget}");
        assert_eq!(
            SloCost.decide(&i, &c),
            Decision::Bypass(Reason::BypassSloCost)
        );
        // Queued prefill on the decode worker was charged to the bypasses that queued it: it
        // delays this bypass's first token, but its stall is this request's own prefill.
        i.decode_queued_tokens = 8_192;
        let queued = predict(&i, &c);
        assert_eq!(queued.bypass_stall_ms, stall);
        assert!(queued.bypass_ttft_ms > predict(&req(100_000, 2_000, 0, 10), &c).bypass_ttft_ms);
        assert_eq!(
            SloCost.decide(&i, &c),
            Decision::Bypass(Reason::BypassSloCost)
        );
        // A queue long enough to make the prefill worker the faster way still disaggregates.
        i.decode_queued_tokens = 400_000;
        assert_eq!(
            SloCost.decide(&i, &c),
            Decision::Disagg(Reason::DisaggSloCostTtft)
        );
        // A step already at the objective leaves no slack at all.
        let tight = ConditionalDisaggConfig {
            slo_itl_ms: step_ms(10, &c),
            ..c
        };
        let i = req(100_000, 1, 0, 10);
        assert_eq!(
            SloCost.decide(&i, &tight),
            Decision::Disagg(Reason::DisaggSloCostItlStall)
        );
        // Nothing to prefill stalls nothing.
        let i = req(100_000, 0, 0, 10);
        assert_eq!(
            SloCost.decide(&i, &tight),
            Decision::Bypass(Reason::BypassSloCost)
        );
    }

    #[test]
    fn a_queue_costs_in_proportion_to_its_tokens() {
        let c = cfg();
        let chunk = u64::from(c.prefill_chunk_tokens);
        // Whole chunks: each costs what one cold chunk-sized prompt does.
        assert!((queue_ms(chunk, &c) - prefill_ms(chunk, 0, &c)).abs() < 1e-9);
        assert!((queue_ms(100 * chunk, &c) - 100.0 * queue_ms(chunk, &c)).abs() < 1e-6);
        // Below a chunk it is one cold prompt; above, never more than one long prompt would be.
        assert!((queue_ms(1_000, &c) - prefill_ms(1_000, 0, &c)).abs() < 1e-9);
        assert!(queue_ms(2_000_000, &c) < prefill_ms(2_000_000, 0, &c) / 10.0);
        assert_eq!(queue_ms(0, &c), 0.0);
    }

    #[test]
    fn the_rescue_applies_only_when_disagg_would_miss_the_ttft_objective() {
        let c = cfg();
        // A warm turn next to 40 streams: its ~200 ms stall is over the 1/B share (~51 ms).
        let base = PolicyInput {
            stall_rescue_scale: 8.0,
            ..req(60_000, 4_000, 56_000, 40)
        };
        let p = predict(&base, &c);
        assert!(p.bypass_stall_ms > p.stall_budget_ms, "{p:?}");
        assert!(p.bypass_stall_ms < 8.0 * p.stall_budget_ms, "{p:?}");
        // The prefill worker is idle: disagg meets the objective, no rescue.
        assert!(p.disagg_ttft_ms <= c.slo_ttft_ms);
        assert_eq!(p.rescue_budget_ms, p.stall_budget_ms);
        assert_eq!(
            SloCost.decide(&base, &c),
            Decision::Disagg(Reason::DisaggSloCostItlStall)
        );
        // Its queue is minutes long: disagg loses the request, the rescued budget takes it.
        let hopeless = PolicyInput {
            prefill_queued_tokens: 5_000_000,
            ..base
        };
        let p = predict(&hopeless, &c);
        assert!(p.disagg_ttft_ms > c.slo_ttft_ms);
        assert!(p.bypass_ttft_ms <= p.disagg_ttft_ms);
        assert_eq!(p.rescue_budget_ms, 8.0 * p.stall_budget_ms);
        assert_eq!(
            SloCost.decide(&hopeless, &c),
            Decision::Bypass(Reason::BypassSloCostRescue)
        );
        // No learned rescue (1, or 0 as an old record reads): the ITL rule as before.
        for scale in [1.0, 0.0] {
            let none = PolicyInput {
                stall_rescue_scale: scale,
                ..hopeless
            };
            assert_eq!(
                SloCost.decide(&none, &c),
                Decision::Disagg(Reason::DisaggSloCostItlStall)
            );
        }
        // A stall beyond even the rescued budget still disaggregates.
        let cold = PolicyInput {
            eff_isl: 60_000,
            ..hopeless
        };
        let p = predict(&cold, &c);
        assert!(p.bypass_stall_ms > p.rescue_budget_ms, "{p:?}");
        assert!(!SloCost.decide(&cold, &c).is_bypass());
    }

    #[test]
    fn equal_ttfts_bypass_and_the_empty_prompt_bypasses() {
        // Zero transfer, zero decode step: an idle decode worker and an idle prefill worker
        // with the same cache predict the same TTFT; equality bypasses.
        let c = ConditionalDisaggConfig {
            kv_transfer_ms_per_token: 0.0,
            decode_step_ms: 0.0,
            decode_step_ms_per_stream: 0.0,
            ..cfg()
        };
        let i = req(10_000, 4_000, 6_000, 0);
        let p = predict(&i, &c);
        assert_eq!(p.bypass_ttft_ms, p.disagg_ttft_ms);
        assert!(SloCost.decide(&i, &c).is_bypass());
        assert!(SloCost.decide(&req(0, 0, 0, 50), &cfg()).is_bypass());
    }
}
