//! Tokens → verdict: hash the prompt per block size, match the KV index, pick the decode
//! (and prefill) worker by cost, let the serving mode and policy decide, record the load.

use switchyard_protocol::hash::{sequence_hashes, BlockSize, HashSeed, SequenceHash};
use switchyard_protocol::route::{Endpoint, Reason, RouteMode, Verdict};
use switchyard_protocol::worker::{Engine, WorkerRole};

use super::{RouteError, Router};
use crate::chains::Chain;
use crate::config::ServingMode;
use crate::index::WorkerSlot;
use crate::learning::PathLoad;
use crate::load::{Leg, RoutedLoad, WorkerLoad};
use crate::policy::decode_busy::can_take;
use crate::policy::{Decision, PolicyCall, PolicyInput};
use crate::select::{self, DecodeInputs, PrefillInputs};

/// A verdict and, when the policy gave it, what the policy saw and the config in force: the
/// status page re-decides recorded verdicts under other thresholds from these.
#[derive(Debug, Clone, PartialEq)]
pub struct Routed {
    /// The verdict.
    pub verdict: Verdict,
    /// The policy's call, when the verdict is its decision (conditional serving, a prefill
    /// worker live, one choice); `None` when the serving mode or the request decided.
    pub policy: Option<PolicyCall>,
}

/// A request's prompt as the router gets it: token ids (the control plane tokenized the body),
/// or block hashes a filter computed from the same ids at one block size (the filter
/// tokenized: see `switchyard_protocol::route_input`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prompt<'a> {
    /// The prompt's token ids.
    Tokens(&'a [u32]),
    /// The prompt's length and the sequence hashes of its full blocks of `block_size`.
    Hashed {
        /// Prompt tokens.
        isl: u32,
        /// The block size the hashes were made at.
        block_size: BlockSize,
        /// Sequence hashes of the full blocks.
        hashes: &'a [SequenceHash],
    },
    /// A prompt of `isl` tokens the engine computes whole whatever it caches: vLLM reads no
    /// cached prefix for a request asking prompt logprobs, neither its own nor one a prefill
    /// worker hands over. No cache helps it, and it is never disaggregated.
    Recomputed {
        /// Prompt tokens.
        isl: u32,
    },
}

impl Prompt<'_> {
    /// Prompt length in tokens.
    pub fn isl(&self) -> u32 {
        match self {
            Prompt::Tokens(tokens) => u32::try_from(tokens.len()).unwrap_or(u32::MAX),
            Prompt::Hashed { isl, .. } | Prompt::Recomputed { isl } => *isl,
        }
    }

    /// The sequence hashes at `block_size`. A hashed prompt has them at its own block size
    /// only; a worker with another block size gets none, and so matches as if it cached
    /// nothing (docs/tokenization.md, "Tokenizing in the filter").
    fn hashes_at(&self, block_size: BlockSize) -> Chain {
        match self {
            Prompt::Tokens(tokens) => {
                sequence_hashes(tokens, block_size, HashSeed::default()).into()
            }
            Prompt::Hashed {
                block_size: made_at,
                hashes,
                ..
            } if *made_at == block_size => Chain::from(*hashes),
            Prompt::Hashed { .. } | Prompt::Recomputed { .. } => Chain::from([]),
        }
    }
}

impl<'a> From<&'a [u32]> for Prompt<'a> {
    fn from(tokens: &'a [u32]) -> Self {
        Prompt::Tokens(tokens)
    }
}

impl<'a> From<&'a Vec<u32>> for Prompt<'a> {
    fn from(tokens: &'a Vec<u32>) -> Self {
        Prompt::Tokens(tokens)
    }
}

/// Whether a route call decides the request's route or only shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Intent {
    Decide,
    Preview,
}

/// One live worker considered for this request.
struct Candidate {
    slot: WorkerSlot,
    block_size: u32,
    /// Index into the per-block-size hash lists.
    hashes: usize,
    /// Leading blocks the index holds there (its own events).
    indexed_blocks: u32,
    /// Leading blocks held there: indexed, or predicted.
    overlap_blocks: u32,
    load: WorkerLoad,
    /// The worker's engine: a decode worker takes KV only from a prefill worker of its own.
    engine: Engine,
    endpoint: Endpoint,
}

impl Router {
    /// Decides where and how to serve a one-choice request whose prompt is `tokens` (see
    /// [`Router::route_request`]).
    ///
    /// # Errors
    /// [`RouteError::NoDecodeWorkers`] when no live worker can decode.
    pub fn route(
        &mut self,
        request_id: &str,
        tokens: &[u32],
        now_ms: u64,
    ) -> Result<Verdict, RouteError> {
        self.route_request(request_id, tokens, 1, now_ms)
    }

    /// Decides where and how to serve a request whose prompt is `tokens` and that asks for
    /// `choices` choices (`n`), among every live worker whatever its model (one model behind
    /// the gateway; see [`Router::route_model`]).
    ///
    /// # Errors
    /// [`RouteError::NoDecodeWorkers`] when no live worker can decode.
    pub fn route_request(
        &mut self,
        request_id: &str,
        tokens: &[u32],
        choices: u32,
        now_ms: u64,
    ) -> Result<Verdict, RouteError> {
        self.route_model(request_id, tokens, choices, None, now_ms)
    }

    /// Decides where and how to serve a request whose prompt is `tokens` and that asks for
    /// `choices` choices (`n`). A request of more than one choice is never disaggregated:
    /// the KV handoffs carry one sequence.
    ///
    /// With `model`, only workers serving that model ([`WorkerInfo::model`]) are candidates,
    /// for both legs: several models share one router (one registry, one index, one load
    /// tracker), and a worker of another model can neither decode nor prefill the prompt,
    /// whose tokens are that model's. `None` considers every worker.
    ///
    /// [`WorkerInfo::model`]: switchyard_protocol::worker::WorkerInfo::model
    ///
    /// # Errors
    /// [`RouteError::NoDecodeWorkers`] when no live worker (of `model`) can decode.
    pub fn route_model(
        &mut self,
        request_id: &str,
        tokens: &[u32],
        choices: u32,
        model: Option<&str>,
        now_ms: u64,
    ) -> Result<Verdict, RouteError> {
        self.route_traced(request_id, tokens, choices, model, now_ms)
            .map(|routed| routed.verdict)
    }

    /// [`Router::route_model`], with the policy's call beside the verdict (see [`Routed`]).
    ///
    /// # Errors
    /// [`RouteError::NoDecodeWorkers`] when no live worker (of `model`) can decode.
    pub fn route_traced<'a>(
        &mut self,
        request_id: &str,
        prompt: impl Into<Prompt<'a>>,
        choices: u32,
        model: Option<&str>,
        now_ms: u64,
    ) -> Result<Routed, RouteError> {
        self.route_numbered(request_id, None, prompt, choices, model, now_ms)
    }

    /// [`Router::route_traced`] for route call `route_call` of the request, when the caller
    /// numbers its calls (the filter does: `ROUTE_CALL_HEADER`): a failed-open report of
    /// another call of the same id does not make this one late.
    ///
    /// # Errors
    /// [`RouteError::NoDecodeWorkers`] when no live worker (of `model`) can decode.
    pub fn route_numbered<'a>(
        &mut self,
        request_id: &str,
        route_call: Option<u64>,
        prompt: impl Into<Prompt<'a>>,
        choices: u32,
        model: Option<&str>,
        now_ms: u64,
    ) -> Result<Routed, RouteError> {
        self.route_as(
            Intent::Decide,
            request_id,
            route_call,
            prompt.into(),
            choices,
            model,
            now_ms,
        )
    }

    /// The verdict [`Router::route_traced`] would give now, without deciding it: nothing is
    /// booked on the workers, predicted as cached, learned or tracked, and the selection's
    /// random draw is put back, so the next call decides exactly as it would have without
    /// this one (an operator asking "where would this go?" changes no answer).
    ///
    /// # Errors
    /// [`RouteError::NoDecodeWorkers`] when no live worker (of `model`) can decode.
    pub fn preview<'a>(
        &mut self,
        request_id: &str,
        prompt: impl Into<Prompt<'a>>,
        choices: u32,
        model: Option<&str>,
        now_ms: u64,
    ) -> Result<Routed, RouteError> {
        let draws = self.rng.clone();
        let previewed = self.route_as(
            Intent::Preview,
            request_id,
            None,
            prompt.into(),
            choices,
            model,
            now_ms,
        );
        self.rng = draws;
        previewed
    }

    #[allow(clippy::too_many_arguments)]
    fn route_as(
        &mut self,
        intent: Intent,
        request_id: &str,
        route_call: Option<u64>,
        prompt: Prompt<'_>,
        choices: u32,
        model: Option<&str>,
        now_ms: u64,
    ) -> Result<Routed, RouteError> {
        self.load.expire(now_ms, &self.config.load);
        let mode = self.config.serving_mode;
        let mut by_size: Vec<(u32, Chain)> = Vec::new();
        let mut decode = Vec::new();
        let mut prefill = Vec::new();
        let serves = |w: &&crate::WorkerState| model.is_none_or(|m| w.info.model == m);
        for w in self
            .workers
            .values()
            .filter(serves)
            .filter(|w| self.is_live(w, now_ms))
        {
            let is_prefill = w.info.role == WorkerRole::Prefill;
            if !(w.info.role.serves_decode() || (is_prefill && mode != ServingMode::Agg)) {
                continue;
            }
            let bs = w.info.block_size;
            let hashes = match by_size.iter().position(|(s, _)| *s == bs) {
                Some(i) => i,
                None => {
                    // Registration validated the block size; an invalid one hashes nothing.
                    let h = BlockSize::try_new(bs)
                        .map(|b| prompt.hashes_at(b))
                        .unwrap_or_else(|_| Chain::from([]));
                    by_size.push((bs, h));
                    by_size.len() - 1
                }
            };
            let c = Candidate {
                slot: w.slot,
                block_size: bs,
                hashes,
                indexed_blocks: 0,
                overlap_blocks: 0,
                load: self.load.load(w.slot),
                engine: w.info.engine,
                endpoint: Endpoint {
                    worker_id: w.info.worker_id.clone(),
                    address: w.info.address.clone(),
                    bootstrap_port: w.info.bootstrap_port,
                },
            };
            if is_prefill {
                prefill.push(c);
            } else {
                decode.push(c);
            }
        }
        // No decode worker live at all (the pool is down, or not up yet): a prefill worker
        // serves the request whole, as when every decode worker is full, rather than no one.
        let no_decode_pool = decode.is_empty();
        if no_decode_pool {
            if !self.config.prefill_continues_decode || prefill.is_empty() {
                return Err(RouteError::NoDecodeWorkers);
            }
            decode = std::mem::take(&mut prefill);
        }
        for (i, (_, hashes)) in by_size.iter().enumerate() {
            self.index.find_matches(hashes, &mut self.scores);
            for c in decode.iter_mut().chain(prefill.iter_mut()) {
                if c.hashes == i {
                    let cached = self.scores.blocks_for(c.slot);
                    c.indexed_blocks = cached;
                    c.overlap_blocks = self.predictions.extend(c.slot, hashes, cached, now_ms);
                }
            }
        }

        let isl = prompt.isl();
        let weights = &self.config.selection;
        let costs: Vec<f64> = decode
            .iter()
            .map(|c| {
                select::decode_cost(
                    &DecodeInputs {
                        block_size: c.block_size,
                        overlap_blocks: c.overlap_blocks,
                        request_blocks: request_blocks(isl, c.block_size),
                        shared_active_blocks: self.load.active_prefix(c.slot, &by_size[c.hashes].1),
                        load: c.load,
                    },
                    weights,
                )
            })
            .collect();
        let d = select::pick(&costs, weights.temperature, &mut self.rng).unwrap_or(0);
        let d = &decode[d];
        let cached = cached_tokens(d, isl);
        let eff_isl = isl - cached;

        // The handoff is the engine's protocol: only a prefill worker of the decode worker's
        // engine can hand it KV (a model's pools normally share one engine).
        let engine = d.engine;
        prefill.retain(|c| c.engine == engine);
        let chosen_prefill = if mode == ServingMode::Agg {
            None
        } else {
            let costs: Vec<f64> = prefill
                .iter()
                .map(|c| {
                    select::prefill_cost(
                        &PrefillInputs {
                            block_size: c.block_size,
                            overlap_blocks: c.overlap_blocks,
                            load: c.load,
                        },
                        weights,
                    )
                })
                .collect();
            select::pick(&costs, weights.temperature, &mut self.rng).map(|i| &prefill[i])
        };

        let decode_request_blocks = request_blocks(isl, d.block_size);
        let mut call = None;
        let (route_mode, reason, p) = match (mode, chosen_prefill) {
            (ServingMode::Agg, _) => (RouteMode::Agg, Reason::AggServingMode, None),
            (_, None) => (RouteMode::Agg, Reason::AggNoPrefillWorkers, None),
            (_, Some(_)) if choices > 1 => (RouteMode::Bypass, Reason::BypassMultipleChoices, None),
            (_, Some(_)) if matches!(prompt, Prompt::Recomputed { .. }) => {
                (RouteMode::Bypass, Reason::BypassPromptLogprobs, None)
            }
            (ServingMode::Disagg, Some(p)) => (RouteMode::Disagg, Reason::DisaggAlways, Some(p)),
            (ServingMode::Conditional, Some(p)) => {
                let policy_call = call.insert(PolicyCall {
                    input: PolicyInput {
                        isl,
                        eff_isl,
                        prefill_queued_tokens: p.load.prefill_tokens,
                        decode_projected_blocks: d
                            .load
                            .active_blocks
                            .saturating_add(decode_request_blocks),
                        decode_capacity_blocks: d.load.kv_capacity_blocks,
                        prefill_cached_tokens: cached_tokens(p, isl),
                        decode_queued_tokens: d.load.prefill_tokens,
                        decode_running_streams: d.load.decoding,
                        stall_rescue_scale: if self.learns_timing() {
                            self.learning.scales().rescue.scale()
                        } else {
                            1.0
                        },
                    },
                    config: self.effective_conditional(),
                });
                match policy_call.decide() {
                    Decision::Bypass(r) => (RouteMode::Bypass, r, None),
                    Decision::Disagg(r) => (RouteMode::Disagg, r, Some(p)),
                }
            }
        };

        // No decode worker can take it: the prefill worker keeps it and decodes it itself,
        // rather than queueing it for KV behind a full decode pool (docs/policies.md, "The
        // prefill worker continues"). Not for several choices, which the decode worker serves
        // whatever the pool (the verdict is the request's, not the pool's).
        let keeper = match chosen_prefill {
            Some(pw)
                if self.config.prefill_continues_decode
                    && mode != ServingMode::Agg
                    && choices <= 1
                    && !decode.iter().any(|c| self.decode_can_take(c, isl))
                    && can_take(
                        pw.load
                            .active_blocks
                            .saturating_add(pw.load.waiting_blocks)
                            .saturating_add(request_blocks(isl, pw.block_size)),
                        pw.load.kv_capacity_blocks,
                        None,
                    ) =>
            {
                Some(pw)
            }
            _ => None,
        };
        let (d, route_mode, reason, p) = match keeper {
            Some(pw) => {
                call = None;
                (pw, RouteMode::Agg, Reason::AggDecodePoolFull, None)
            }
            None if no_decode_pool => (d, RouteMode::Agg, Reason::AggNoDecodeWorkers, None),
            None => (d, route_mode, reason, p),
        };
        let cached = cached_tokens(d, isl);
        let eff_isl = isl - cached;

        let leg = |c: &Candidate, prefill_tokens: u64| Leg {
            slot: c.slot,
            prefill_tokens,
            blocks: by_size[c.hashes].1.clone(),
            tail_blocks: u64::from(!isl.is_multiple_of(c.block_size.max(1))),
        };
        let routed = RoutedLoad {
            decode: leg(d, if p.is_some() { 0 } else { u64::from(eff_isl) }),
            prefill: p.map(|p| leg(p, u64::from(isl - cached_tokens(p, isl)))),
        };
        let verdict = Verdict {
            v: switchyard_protocol::PROTOCOL_VERSION,
            request_id: request_id.to_string(),
            mode: route_mode,
            decode: d.endpoint.clone(),
            prefill: p.map(|p| p.endpoint.clone()),
            isl,
            cached_tokens: cached,
            eff_isl,
            reason,
            decode_on_prefill: keeper.is_some() || no_decode_pool,
            engine: d.engine,
            // The router never sees the body; the control plane's API sets it.
            steering_free: false,
            // A setting of the model's in the pool file, which the control plane's API adds.
            disagg_request_id: false,
            model: None,
        };
        if intent == Intent::Preview {
            return Ok(Routed {
                verdict,
                policy: call,
            });
        }
        if self.load.take_failed_open(request_id, route_call) {
            // A late call: the filter failed the request open and sent it to a worker of
            // Envoy's choosing already. Nothing here will be freed by a report.
            self.late_routes += 1;
            return Ok(Routed {
                verdict,
                policy: call,
            });
        }
        // A prompt its worker's events already show whole needs no prediction: one would
        // outlive the blocks' eviction, which the events then show and it would hide.
        let ttl = self.config.load.kv_prediction_ms;
        for c in std::iter::once(d).chain(p) {
            let chain = &by_size[c.hashes].1;
            if (c.indexed_blocks as usize) < chain.len() {
                self.predictions.predict(c.slot, chain, now_ms, ttl);
            }
        }
        if self.learns_timing() {
            let path = PathLoad {
                isl: u64::from(isl),
                new_tokens: u64::from(match p {
                    Some(p) => isl - cached_tokens(p, isl),
                    None => eff_isl,
                }),
                queued_tokens: p.map_or(d.load.prefill_tokens, |p| p.load.prefill_tokens),
                streams: d.load.decoding,
                disagg: p.is_some(),
                transferred_tokens: u64::from(eff_isl),
            };
            self.learning.on_route(
                request_id,
                path,
                d.slot,
                &self.config.conditional,
                now_ms,
                self.config.load.request_timeout_ms,
            );
        }
        self.load.on_route(request_id, routed, now_ms);
        Ok(Routed {
            verdict,
            policy: call,
        })
    }
}

impl Router {
    /// Whether decode worker `c` can take a request of `isl` tokens: its active KV blocks with
    /// the request's fit its capacity, and the decode-busy guard's fraction of it when set.
    fn decode_can_take(&self, c: &Candidate, isl: u32) -> bool {
        can_take(
            c.load
                .active_blocks
                .saturating_add(c.load.waiting_blocks)
                .saturating_add(request_blocks(isl, c.block_size)),
            c.load.kv_capacity_blocks,
            self.config.conditional.decode_busy_threshold,
        )
    }
}

/// Blocks a prompt of `isl` tokens occupies (the partial last block included).
fn request_blocks(isl: u32, block_size: u32) -> u64 {
    u64::from(isl).div_ceil(u64::from(block_size.max(1)))
}

/// Cached leading tokens on a worker, capped at the prompt length.
fn cached_tokens(c: &Candidate, isl: u32) -> u32 {
    let tokens = u64::from(c.overlap_blocks) * u64::from(c.block_size);
    u32::try_from(tokens.min(u64::from(isl))).unwrap_or(isl)
}
