//! The iteration loop: vLLM v1's scheduling policy (continuous batching, chunked prefill,
//! prefix reuse, recompute preemption) and what happens when an iteration ends.

use switchyard_protocol::hash::chain_hash;

use super::output::{EngineOutput, FinishReason, HeldKv};
use super::seq::{synthetic_local_hash, Phase};
use super::Engine;

/// One request's work in the iteration in flight.
#[derive(Debug, Clone, Copy)]
pub(super) struct Planned {
    slot: u32,
    tokens: u32,
}

/// One attention rank's share of an iteration (DEP workers have several; TEP one).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RankWork {
    prefill_new: f64,
    prefill_attn: f64,
    batch: u32,
    ctx: f64,
}

/// Ceiling division for block counts.
fn blocks_for(tokens: u32, block_size: u32) -> usize {
    tokens.div_ceil(block_size) as usize
}

impl Engine {
    /// Handles the event at `t` (iteration end, lease expiry, or an idle engine's start);
    /// returns whether an iteration ended.
    pub(super) fn advance_to(&mut self, t: f64, out: &mut Vec<EngineOutput>) -> bool {
        self.clock_ms = self.clock_ms.max(t);
        let mut ended = false;
        if let Some(end) = self.current_end_ms {
            if end <= t {
                self.complete_iteration(end, out);
                ended = true;
            }
        }
        self.expire_leases(self.clock_ms);
        if self.current_end_ms.is_none() {
            self.start_iteration(self.clock_ms, out);
        }
        ended
    }

    fn expire_leases(&mut self, now_ms: f64) {
        while let Some(&(bits, id)) = self.leases.first() {
            if f64::from_bits(bits) > now_ms {
                break;
            }
            self.leases.pop_first();
            self.release_held(id);
        }
    }

    /// Forms the iteration starting at `t`, as vLLM v1's scheduler does.
    fn start_iteration(&mut self, t: f64, out: &mut Vec<EngineOutput>) {
        let bs = self.block_size.get();
        let ranks = self.rank_running.len();
        let per_rank_tokens = (self.cfg.max_num_batched_tokens / ranks as u32).max(1);
        let per_rank_seqs = (self.cfg.max_num_seqs / ranks as u32).max(1);
        // Reused per-rank scratch (budget, then the work that sets the iteration's time).
        let mut work = std::mem::take(&mut self.rank_work);
        work.clear();
        work.resize(ranks, RankWork::default());
        let mut budget = std::mem::take(&mut self.rank_budget);
        budget.clear();
        budget.resize(ranks, per_rank_tokens);
        let mut preempted = false;

        // 1. Running requests in admission order; on KV shortage preempt the newest.
        let mut i = 0;
        while i < self.running.len() {
            let slot = self.running[i];
            let seq = self.slots[slot as usize].as_ref().expect("running slot");
            let rank = seq.rank as usize;
            let tokens = (seq.num_tokens() - seq.computed).min(budget[rank]);
            if tokens == 0 {
                i += 1;
                continue;
            }
            let needed = blocks_for(seq.computed + tokens, bs).saturating_sub(seq.blocks.len());
            let mut self_preempted = false;
            while self.kv.free() < needed as u64 {
                let victim = *self.running.last().expect("running is not empty");
                self.preempt_newest(t, out);
                preempted = true;
                if victim == slot {
                    self_preempted = true;
                    break;
                }
            }
            if self_preempted {
                break;
            }
            self.allocate(slot, needed);
            budget[rank] -= tokens;
            self.plan_work(slot, tokens);
            i += 1;
        }

        // 2. Waiting requests in arrival order, unless this step had to preempt (vLLM).
        while !preempted && self.running.len() < self.cfg.max_num_seqs as usize {
            let Some(&slot) = self.waiting.front() else {
                break;
            };
            let seq = self.slots[slot as usize].as_ref().expect("waiting slot");
            if seq.arrival_ms > t {
                break;
            }
            let rank = (0..ranks)
                .filter(|&r| self.rank_running[r] < per_rank_seqs && budget[r] > 0)
                .min_by_key(|&r| self.rank_running[r]);
            let Some(rank) = rank else { break };
            let num_tokens = seq.num_tokens();
            // At least one token is always computed to sample from (vLLM caps hits likewise).
            let max_hit = if seq.reads_cache {
                ((num_tokens - 1) / bs) as usize
            } else {
                0
            };
            let hit = self
                .kv
                .match_prefix(&seq.hashes[..max_hit.min(seq.hashes.len())]);
            let hit_tokens = hit as u32 * bs;
            let (start, tokens) = if seq.remote_pending {
                (num_tokens - 1, 1)
            } else {
                (hit_tokens, (num_tokens - hit_tokens).min(budget[rank]))
            };
            let needed = blocks_for(start + tokens, bs) - hit;
            let available = self.kv.free() - self.kv.unreferenced_among(&seq.hashes[..hit]);
            if available < needed as u64 {
                break; // Head-of-line waits for KV, as in vLLM.
            }
            self.waiting.pop_front();
            let seq = self.slots[slot as usize].as_mut().expect("waiting slot");
            for h in &seq.hashes[..hit] {
                let b = self.kv.acquire_cached(*h).expect("matched block is cached");
                seq.blocks.push(b);
            }
            seq.computed = start;
            seq.registered = hit as u32;
            if seq.cached_tokens.is_none() {
                seq.cached_tokens = Some(hit_tokens);
                self.stats.prefix_queries += u64::from(seq.prompt_len);
                self.stats.prefix_hits += u64::from(hit_tokens);
            }
            if seq.remote_pending {
                seq.remote_pending = false;
                seq.remote_tokens = seq.prompt_len - hit_tokens;
            }
            seq.phase = Phase::Running;
            seq.rank = rank as u32;
            self.rank_running[rank] += 1;
            self.running.push(slot);
            self.allocate(slot, needed);
            // Transferred KV is computed KV: publish it now.
            self.register_computed(slot);
            budget[rank] -= tokens;
            self.plan_work(slot, tokens);
        }

        self.rank_budget = budget;
        if self.plan.is_empty() {
            self.rank_work = work;
            // Nothing fits: an idle engine waits for KV to be released (or for arrivals).
            let head_due = self
                .waiting
                .front()
                .and_then(|&s| self.seq(s))
                .is_some_and(|s| s.arrival_ms <= t);
            self.blocked = head_due;
            return;
        }
        let duration = self.iteration_ms(&mut work);
        self.rank_work = work;
        self.current_end_ms = Some(t + duration);
    }

    /// Duration of the planned iteration: per rank, prefill chunks plus the decode batch
    /// (a one-token step counts as a decode token); the busiest rank sets the pace.
    fn iteration_ms(&self, work: &mut [RankWork]) -> f64 {
        for p in &self.plan {
            let seq = self.slots[p.slot as usize].as_ref().expect("planned slot");
            let w = &mut work[seq.rank as usize];
            let c = f64::from(seq.computed);
            if p.tokens == 1 && seq.computed + 1 == seq.num_tokens() {
                w.batch += 1;
                w.ctx += c + 1.0;
            } else {
                let n = f64::from(p.tokens);
                w.prefill_new += n;
                w.prefill_attn += n * (c + n / 2.0);
            }
        }
        let perf = &self.cfg.perf;
        work.iter()
            .map(|w| {
                perf.prefill_ms(w.prefill_new, w.prefill_attn) + perf.decode_ms(w.batch, w.ctx)
            })
            .fold(0.0, f64::max)
    }

    fn plan_work(&mut self, slot: u32, tokens: u32) {
        if let Some(seq) = self.slots[slot as usize].as_mut() {
            seq.planned = true;
        }
        self.plan.push(Planned { slot, tokens });
    }

    /// Gives `slot` `n` fresh blocks (the caller checked they are free).
    fn allocate(&mut self, slot: u32, n: usize) {
        let seq = self.slots[slot as usize].as_mut().expect("live slot");
        for _ in 0..n {
            let b = self.kv.allocate().expect("caller checked free blocks");
            seq.blocks.push(b);
        }
    }

    /// Recompute preemption of the newest running request: its blocks are freed (full ones
    /// stay cached), it returns to the queue's front and later recomputes prompt + output.
    fn preempt_newest(&mut self, t: f64, out: &mut Vec<EngineOutput>) {
        let Some(slot) = self.running.pop() else {
            return;
        };
        self.leave_running(slot);
        let seq = self.slots[slot as usize].as_mut().expect("running slot");
        let blocks = std::mem::take(&mut seq.blocks);
        self.kv.release(&blocks);
        seq.computed = 0;
        seq.registered = 0;
        seq.phase = Phase::Waiting;
        self.stats.preemptions += 1;
        out.push(EngineOutput::Preempted {
            id: seq.id,
            at_ms: t,
        });
        self.waiting.push_front(slot);
    }

    /// Bookkeeping for a request leaving the running set.
    pub(super) fn leave_running(&mut self, slot: u32) {
        if let Some(seq) = self.slots[slot as usize].as_ref() {
            let r = seq.rank as usize;
            self.rank_running[r] = self.rank_running[r].saturating_sub(1);
        }
    }

    /// Registers every block of `slot` whose KV is now fully computed.
    fn register_computed(&mut self, slot: u32) {
        let bs = self.block_size.get();
        let seed = self.cfg.hash_seed;
        let seq = self.slots[slot as usize].as_mut().expect("live slot");
        let full = (seq.computed / bs) as usize;
        for i in seq.registered as usize..full {
            if i == seq.hashes.len() {
                let parent = seq.hashes.last().copied();
                seq.hashes
                    .push(chain_hash(parent, synthetic_local_hash(seq.id, i), seed));
            }
            // A parent this request computed while another copy was registered stayed
            // anonymous; if that copy has been evicted since, this request's own copy is
            // registered first, so the event names a parent the cache holds (vLLM's events
            // always do, and a parent the router cannot find costs its index the heads-only
            // layout).
            let mut first_missing = i;
            while first_missing > 0 && !self.kv.holds(seq.hashes[first_missing - 1]) {
                first_missing -= 1;
            }
            for j in first_missing..=i {
                let parent = j.checked_sub(1).map(|p| seq.hashes[p]);
                self.kv
                    .register(seq.blocks[j], seq.hashes[j], parent, j as u32);
            }
        }
        seq.registered = seq.registered.max(full as u32);
    }

    /// Applies the iteration that ended at `end`: KV computed, tokens sampled, requests done.
    fn complete_iteration(&mut self, end: f64, out: &mut Vec<EngineOutput>) {
        self.current_end_ms = None;
        self.stats.iterations += 1;
        let mut plan = std::mem::take(&mut self.plan);
        let mut any_finished = false;
        for p in plan.drain(..) {
            let Some(seq) = self.slots[p.slot as usize].as_mut() else {
                continue;
            };
            seq.planned = false;
            if seq.phase == Phase::Aborted {
                self.remove_slot(p.slot);
                continue;
            }
            seq.computed += p.tokens;
            self.register_computed(p.slot);
            let seq = self.slots[p.slot as usize].as_mut().expect("live slot");
            if seq.computed < seq.num_tokens() {
                continue; // A prefill chunk that does not finish the prompt samples nothing.
            }
            seq.output += 1;
            if seq.output == 1 {
                out.push(EngineOutput::FirstToken {
                    id: seq.id,
                    cached_tokens: seq.cached_tokens.unwrap_or(0),
                    prompt_tokens: seq.prompt_len,
                    remote_tokens: seq.remote_tokens,
                    at_ms: end,
                });
            } else if self.cfg.emit_token_outputs {
                out.push(EngineOutput::Token {
                    id: seq.id,
                    at_ms: end,
                });
            }
            if seq.output >= seq.max_tokens {
                out.push(EngineOutput::Finished {
                    id: seq.id,
                    prompt_tokens: seq.prompt_len,
                    completion_tokens: seq.output,
                    cached_tokens: seq.cached_tokens.unwrap_or(0),
                    remote_tokens: seq.remote_tokens,
                    at_ms: end,
                    reason: FinishReason::Length,
                    kv_held: seq.hold,
                });
                self.finish(p.slot, end);
                any_finished = true;
            }
        }
        self.plan = plan;
        if any_finished {
            let slots = &self.slots;
            self.running.retain(|&s| {
                slots[s as usize]
                    .as_ref()
                    .is_some_and(|seq| seq.phase == Phase::Running)
            });
        }
    }

    /// A request generated its last token: pin its KV for a decode worker, or free it.
    fn finish(&mut self, slot: u32, end: f64) {
        self.leave_running(slot);
        let lease = self.cfg.prefill_hold_lease_ms;
        let seq = self.slots[slot as usize].as_mut().expect("live slot");
        if seq.hold {
            seq.phase = Phase::Held;
            let expires_at_ms = (end + lease).max(0.0);
            self.leases.insert((expires_at_ms.to_bits(), seq.id));
            self.held.insert(
                seq.id,
                HeldKv {
                    id: seq.id,
                    prompt_tokens: seq.prompt_len,
                    block_ids: seq.blocks.clone(),
                    held_since_ms: end,
                    expires_at_ms,
                },
            );
        } else {
            let blocks = std::mem::take(&mut seq.blocks);
            self.kv.release(&blocks);
            self.remove_slot(slot);
        }
    }
}
