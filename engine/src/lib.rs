//! Switchyard's simulated engine: the core of a simulated vLLM worker, and the virtual-time
//! cluster that advances several of them. Pure: no I/O, no async runtime, no wall clock.
//!
//! # Layout
//! - The engine core ([`Engine`]): a pure state machine advanced by the caller's clock
//!   (this page), with [`perf`] (the GB200 timing model), its config, KV cache and scheduler.
//! - [`kv_batches`]: engine KV events -> numbered batches and resync dumps, as a worker
//!   publishes them.
//! - [`worker_core`]: a simulated worker apart from its transport: the engine plus the KV
//!   event batches, dumps, load reports and heartbeats it publishes (both clocks drive it).
//! - [`vtime`]: the virtual-time cluster (several worker cores, the disaggregated handoff).
//! - [`queue`]: the one event queue every discrete-event loop uses.
//!
//! # The engine core
//!
//! **Simulated.** No model runs and no token values are produced: the engine models *when*
//! a vLLM v1 worker would emit each token of each request, what its paged KV cache holds, and
//! which KV events it would publish. Iteration times come from the GB200 model in
//! [`perf`] (see `docs/sim-model.md`).
//!
//! The caller owns the clock and the loop: [`Engine::submit`] queues work, [`Engine::step`]
//! runs every iteration that ends by `now_ms` and returns its outputs, and
//! [`Engine::next_event_ms`] says when to call `step` next. The same core runs in real time
//! behind HTTP (the `switchyard-sim-worker` crate) and in virtual time ([`vtime`]).
//!
//! Iterations are discrete, as in vLLM: one starts when the previous ends (or when work
//! arrives at an idle engine), the scheduler fills it at its start (running requests in
//! admission order, so decodes before the newest prefill chunks, then waiting requests,
//! within `max_num_batched_tokens` and `max_num_seqs`), its duration comes from
//! [`PerfModel`], and all its outputs happen at its end. A request submitted at `t` can only
//! join an iteration that starts at or after `t`.

#![deny(missing_docs)]

mod config;
mod error;
pub mod kv_batches;
mod kv_cache;
mod output;
pub mod perf;
pub mod queue;
mod request;
mod scheduler;
mod seq;
pub mod speed_up;
pub mod vtime;
pub mod worker_core;

use std::collections::{BTreeSet, HashMap, VecDeque};

use switchyard_protocol::hash::{BlockSize, SequenceHash};
use switchyard_protocol::kv::{KvEvent, StoredBlock};

pub use config::{
    EngineConfig, DEFAULT_LOAD_INTERVAL_MS, DEFAULT_MAX_MODEL_LEN, DEFAULT_MODEL_NAME,
    DEFAULT_PREFILL_HOLD_LEASE_MS,
};
pub use error::EngineError;
pub use output::{EngineOutput, FinishReason, HeldKv, LoadSnapshot, StepOutcome};
pub use perf::{PerfModel, PerfPreset, TransferMode, TransferModel, KV_BYTES_PER_TOKEN_FP8};
pub use request::{EngineRequest, KvSource, Prompt};
pub use speed_up::{InvalidSpeedUp, SpeedUp};

use kv_cache::KvCache;
use scheduler::{Planned, RankWork};
use seq::{Phase, Seq};

/// Counters behind [`LoadSnapshot`].
#[derive(Debug, Clone, Copy, Default)]
struct Stats {
    prefix_queries: u64,
    prefix_hits: u64,
    preemptions: u64,
    iterations: u64,
}

/// One simulated vLLM engine (one worker). See the module docs for the time model.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    block_size: BlockSize,
    kv: KvCache,
    /// Request state by slot; slots are reused.
    slots: Vec<Option<Seq>>,
    free_slots: Vec<u32>,
    by_id: HashMap<u64, u32>,
    /// Queue in arrival order (preempted requests go back to its front).
    waiting: VecDeque<u32>,
    /// Scheduled requests in admission order.
    running: Vec<u32>,
    /// Running requests per attention rank (DEP), for admission balancing.
    rank_running: Vec<u32>,
    /// Per-rank scratch reused by every iteration (no allocation per step).
    rank_work: Vec<RankWork>,
    rank_budget: Vec<u32>,
    /// Held prefill legs by (lease expiry as f64 bits, id): expiries are non-negative, so
    /// the bit patterns order like the numbers.
    leases: BTreeSet<(u64, u64)>,
    held: HashMap<u64, HeldKv>,
    /// The iteration in flight: its work and end time.
    plan: Vec<Planned>,
    current_end_ms: Option<f64>,
    /// Latest time the engine has advanced to.
    clock_ms: f64,
    /// Latest arrival, so the queue stays in arrival order even if the caller's clock jitters.
    last_arrival_ms: f64,
    /// The queue's head could not be scheduled on an idle engine; wait for a state change.
    blocked: bool,
    stats: Stats,
}

impl Engine {
    /// An idle engine with an empty cache.
    ///
    /// # Errors
    /// [`EngineError::InvalidConfig`] when [`EngineConfig::validate`] fails.
    pub fn new(cfg: EngineConfig) -> Result<Self, EngineError> {
        cfg.validate()?;
        let block_size = cfg.block_size()?;
        let capacity = u32::try_from(cfg.kv_capacity_blocks)
            .map_err(|_| EngineError::InvalidConfig("kv_capacity_blocks too large".into()))?;
        Ok(Engine {
            kv: KvCache::new(capacity, block_size.get()),
            block_size,
            slots: Vec::new(),
            free_slots: Vec::new(),
            by_id: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            rank_running: vec![0; cfg.perf.dp_ranks as usize],
            rank_work: Vec::new(),
            rank_budget: Vec::new(),
            leases: BTreeSet::new(),
            held: HashMap::new(),
            plan: Vec::new(),
            current_end_ms: None,
            clock_ms: f64::NEG_INFINITY,
            last_arrival_ms: f64::NEG_INFINITY,
            blocked: false,
            stats: Stats::default(),
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Queues a request that arrived at `now_ms`. It joins the first iteration that starts
    /// at or after `now_ms`; call [`Engine::step`] to let an idle engine start one.
    /// A request with `hold_for_remote_decode` always generates exactly one token.
    ///
    /// # Errors
    /// A typed [`EngineError`] for a duplicate id, an empty prompt, `max_tokens` 0, a hash
    /// count that does not match the prompt length, a request that can never fit in the KV
    /// cache, or a non-finite time. The engine is unchanged on error.
    pub fn submit(&mut self, mut req: EngineRequest, now_ms: f64) -> Result<(), EngineError> {
        if !now_ms.is_finite() {
            return Err(EngineError::InvalidTime(now_ms));
        }
        let id = req.id;
        if self.by_id.contains_key(&id) {
            return Err(EngineError::DuplicateId { id });
        }
        let tokens = req.prompt.len();
        if tokens == 0 {
            return Err(EngineError::EmptyPrompt { id });
        }
        if req.max_tokens == 0 {
            return Err(EngineError::ZeroMaxTokens { id });
        }
        let max_tokens = if req.hold_for_remote_decode {
            1
        } else {
            req.max_tokens
        };
        let expected = self.block_size.full_blocks(tokens as usize);
        if let Prompt::Hashed { block_hashes, .. } = &req.prompt {
            if block_hashes.len() != expected {
                return Err(EngineError::BlockHashCount {
                    id,
                    tokens,
                    expected,
                    got: block_hashes.len(),
                });
            }
        }
        let total = u64::from(tokens) + u64::from(max_tokens);
        // Token counts are u32 inside the engine, so the cap never exceeds u32::MAX.
        let capacity_tokens =
            (self.kv.capacity() * u64::from(self.block_size.get())).min(u64::from(u32::MAX));
        if total > capacity_tokens {
            return Err(EngineError::ExceedsKvCapacity {
                id,
                tokens: total,
                capacity_tokens,
            });
        }
        let hashes = match std::mem::replace(&mut req.prompt, Prompt::Tokens(Vec::new())) {
            Prompt::Tokens(t) => {
                switchyard_protocol::hash::sequence_hashes(&t, self.block_size, self.cfg.hash_seed)
            }
            Prompt::Hashed { block_hashes, .. } => block_hashes,
        };
        let arrival_ms = now_ms.max(self.last_arrival_ms);
        self.last_arrival_ms = arrival_ms;
        let seq = Seq::new(&req, tokens, max_tokens, hashes, arrival_ms);
        let slot = self.insert_slot(seq);
        self.by_id.insert(id, slot);
        self.waiting.push_back(slot);
        self.blocked = false;
        Ok(())
    }

    /// Runs every iteration that ends at or before `now_ms` (starting new ones as work
    /// allows) and expires held KV whose lease ran out; returns the outputs in time order.
    pub fn step(&mut self, now_ms: f64) -> StepOutcome {
        let mut outputs = Vec::new();
        let iterations = self.step_into(now_ms, &mut outputs);
        StepOutcome {
            outputs,
            iterations,
        }
    }

    /// [`Engine::step`] appending to a caller-owned buffer (no allocation per call);
    /// returns the number of iterations that ended.
    pub fn step_into(&mut self, now_ms: f64, out: &mut Vec<EngineOutput>) -> u32 {
        let mut iterations = 0;
        while let Some(t) = self.next_event_ms() {
            // `now_ms` NaN compares false and stops the loop like a past time would.
            if t.partial_cmp(&now_ms).is_none_or(|o| o.is_gt()) {
                break;
            }
            if self.advance_to(t, out) {
                iterations += 1;
            }
        }
        iterations
    }

    /// When `step` next has something to do: the end of the iteration in flight, the start
    /// of one on an idle engine with queued work, or a held-KV lease expiry. `None` when the
    /// engine has nothing scheduled (idle, or its queue waits for KV to be released).
    pub fn next_event_ms(&self) -> Option<f64> {
        let mut next = self.current_end_ms;
        if next.is_none() && !self.blocked {
            if let Some(seq) = self.waiting.front().and_then(|&s| self.seq(s)) {
                next = Some(seq.arrival_ms.max(self.clock_ms));
            }
        }
        if let Some(&(bits, _)) = self.leases.first() {
            let expiry = f64::from_bits(bits);
            next = Some(next.map_or(expiry, |n| n.min(expiry)));
        }
        next
    }

    /// Whether request `id` is in the engine (waiting, running, or holding KV).
    pub fn contains(&self, id: u64) -> bool {
        self.by_id.contains_key(&id)
    }

    /// Whether the engine has no request running, waiting or held.
    pub fn is_idle(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Cancels a request wherever it is (queued, running, or held KV); its blocks are freed
    /// (full ones stay cached). Returns whether the id was known. No output is emitted.
    pub fn abort(&mut self, id: u64, now_ms: f64) -> bool {
        let _ = now_ms; // Aborts take effect at once; the time is kept for API symmetry.
        let Some(&slot) = self.by_id.get(&id) else {
            return false;
        };
        self.blocked = false;
        let Some(phase) = self.seq(slot).map(|s| s.phase) else {
            return false;
        };
        match phase {
            Phase::Held => {
                self.release_held(id);
            }
            Phase::Waiting => {
                self.waiting.retain(|&s| s != slot);
                self.remove_slot(slot);
            }
            Phase::Running => {
                self.running.retain(|&s| s != slot);
                self.leave_running(slot);
                let seq = self.slots[slot as usize].as_mut().expect("running slot");
                let blocks = std::mem::take(&mut seq.blocks);
                self.kv.release(&blocks);
                if seq.planned {
                    // The iteration in flight still lists it; its slot is freed at the end.
                    seq.phase = Phase::Aborted;
                    self.by_id.remove(&id);
                } else {
                    self.remove_slot(slot);
                }
            }
            Phase::Aborted => return false,
        }
        true
    }

    /// The decode worker pulled the KV of prefill leg `id`: unpin its blocks (full ones stay
    /// as ordinary cached blocks) and return what was held.
    pub fn release_held(&mut self, id: u64) -> Option<HeldKv> {
        let held = self.held.remove(&id)?;
        self.leases.remove(&(held.expires_at_ms.to_bits(), id));
        if let Some(slot) = self.by_id.get(&id).copied() {
            if let Some(seq) = self.slots[slot as usize].as_mut() {
                let blocks = std::mem::take(&mut seq.blocks);
                self.kv.release(&blocks);
            }
            self.remove_slot(slot);
        }
        self.blocked = false;
        Some(held)
    }

    /// The KV held for prefill leg `id`, if still held.
    pub fn held_kv(&self, id: u64) -> Option<&HeldKv> {
        self.held.get(&id)
    }

    /// KV events since the last call: Stored (our sequence hashes with engine block ids and
    /// the parent), Removed (engine block ids), in the order they happened.
    pub fn drain_kv_events(&mut self) -> Vec<KvEvent> {
        self.kv.drain_events()
    }

    /// Drops recorded KV events without handing them out (keeps the buffer), for callers
    /// that do not publish them.
    pub fn discard_kv_events(&mut self) {
        self.kv.discard_events();
    }

    /// Every cached block as `(parent, block)`, parents before children: the body of a
    /// resync dump (after a [`KvEvent::Cleared`]).
    pub fn cached_blocks(&self) -> Vec<(Option<SequenceHash>, StoredBlock)> {
        self.kv.dump()
    }

    /// Tokens of `prompt`'s prefix this engine caches now (whole blocks), e.g. to size a
    /// missing-suffix transfer.
    pub fn cached_prefix_tokens(&self, prompt: &Prompt) -> u32 {
        let blocks = match prompt {
            Prompt::Hashed { block_hashes, .. } => self.kv.match_prefix(block_hashes),
            Prompt::Tokens(_) => {
                let hashes = prompt.block_hashes(self.block_size, self.cfg.hash_seed);
                self.kv.match_prefix(&hashes)
            }
        };
        u32::try_from(blocks as u64 * u64::from(self.block_size.get())).unwrap_or(u32::MAX)
    }

    /// Tokens of `prompt`'s prefix this engine would read from its cache if it scheduled the
    /// prompt now: [`Engine::cached_prefix_tokens`], less the last block when that is the
    /// prompt's end (at least one token is always computed, as in vLLM). What a
    /// missing-suffix transfer need not move: a decode worker holding a prompt of whole blocks
    /// still pulls its last one, which it then counts as pulled.
    pub fn readable_prefix_tokens(&self, prompt: &Prompt) -> u32 {
        let bs = self.block_size.get();
        let readable = prompt.len().saturating_sub(1) / bs * bs;
        self.cached_prefix_tokens(prompt).min(readable)
    }

    /// Load as a vLLM worker's metrics would show it.
    pub fn load(&self) -> LoadSnapshot {
        let queued_prefill_tokens = self
            .waiting
            .iter()
            .chain(self.running.iter())
            .filter_map(|&s| self.seq(s))
            .map(|s| u64::from(s.prefill_remaining()))
            .sum();
        let block = u64::from(self.block_size.get());
        let kv_waiting_blocks = self
            .waiting
            .iter()
            .filter_map(|&s| self.seq(s))
            .map(|s| u64::from(s.num_tokens()).div_ceil(block))
            .sum();
        LoadSnapshot {
            running: self.running.len() as u32,
            waiting: self.waiting.len() as u32,
            held: self.held.len() as u32,
            kv_used_blocks: self.kv.used(),
            kv_cached_blocks: self.kv.cached_free(),
            kv_total_blocks: self.kv.capacity(),
            kv_waiting_blocks,
            queued_prefill_tokens,
            prefix_cache_queries: self.stats.prefix_queries,
            prefix_cache_hits: self.stats.prefix_hits,
            preemptions: self.stats.preemptions,
            iterations: self.stats.iterations,
        }
    }

    /// Modelled time (ms) to move `tokens` tokens of KV between workers.
    pub fn transfer_time_ms(&self, tokens: u64) -> f64 {
        self.cfg.transfer.time_ms(tokens)
    }

    fn seq(&self, slot: u32) -> Option<&Seq> {
        self.slots.get(slot as usize).and_then(Option::as_ref)
    }

    fn insert_slot(&mut self, seq: Seq) -> u32 {
        match self.free_slots.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(seq);
                slot
            }
            None => {
                self.slots.push(Some(seq));
                (self.slots.len() - 1) as u32
            }
        }
    }

    /// Forgets a request (its blocks must already be released).
    fn remove_slot(&mut self, slot: u32) {
        if let Some(seq) = self.slots[slot as usize].take() {
            if self.by_id.get(&seq.id) == Some(&slot) {
                self.by_id.remove(&seq.id);
            }
            self.free_slots.push(slot);
        }
    }
}
