//! One vLLM publisher's stream → Switchyard [`KvEventBatch`]es, gaps repaired by replay: the
//! whole per-worker state machine a control plane needs, pure.
//!
//! The caller owns the sockets: it hands the feed every live message
//! ([`KvFeed::on_live`]), every replay answer ([`KvFeed::on_replay`]) and replay timeouts
//! ([`KvFeed::on_replay_failed`]), and carries out the [`FeedAction`]s it gets back: publish a
//! batch to the router, or ask the worker's ROUTER socket for a replay.
//!
//! # Rules
//! - Batches go out numbered 1, 2, 3, ... by the feed itself, and the first one is always a
//!   resync batch starting with `Cleared`: the router rebuilds the worker from it whatever it
//!   knew before, so the feed never depends on the router's view of vLLM's numbers.
//! - A gap in vLLM's numbers asks for a replay from the first missed batch; live batches
//!   that arrive meanwhile wait (up to [`MAX_HELD_BATCHES`]). When the replay covers the gap,
//!   the missed batches are applied first, then the held ones: nothing is lost.
//! - When it cannot (the first replayed batch is past the gap: vLLM's buffer no longer holds
//!   it; the replay times out; too many batches wait), the worker's blocks are dropped
//!   (`Cleared`, counted in [`FeedCounters::unrecoverable_gaps`]) and rebuilt from live events.
//!   A block whose parent was lost with the gap cannot be hashed; the mapper skips it and its
//!   chain, which only costs cache hits.
//! - vLLM restarting (its numbers back to 0) drops the worker's blocks the same way: the new
//!   engine's cache starts empty. A live number older than the last one is a restart too,
//!   whose first batches were lost: the blocks are dropped and the new engine's batches
//!   replayed from 0.
//! - [`KvFeed::rejoin`] (the worker registered, or registered again) clears the router's view
//!   and asks for every batch vLLM still buffers, up to the first live one: an idle engine's
//!   cache is indexed at once, and a control plane that restarted rebuilds its index.

use switchyard_protocol::kv::{KvEvent, KvEventBatch};
use switchyard_protocol::worker::WorkerId;

use crate::outgoing::{bump, Outgoing};

use super::mapper::{HashMapper, MapperConfig};
use super::replay::ReplayFrame;
use super::sequence::{SeqStatus, SequenceTracker};
use super::VllmBatch;

/// Live batches held while a replay is under way; past this the replay is abandoned (the
/// worker publishes faster than it replays, or the replay hangs).
pub const MAX_HELD_BATCHES: usize = 4_096;

/// What the caller must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FeedAction {
    /// Send this batch to the router.
    Publish(KvEventBatch),
    /// Ask the worker's replay socket for every buffered batch from this vLLM sequence number.
    RequestReplay {
        /// First vLLM sequence number wanted.
        from: u64,
    },
}

/// What happened to the stream so far (for metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FeedCounters {
    /// Gaps seen in vLLM's sequence numbers.
    pub gaps: u64,
    /// Gaps the replay filled.
    pub replayed_gaps: u64,
    /// Gaps that could not be filled: the worker's blocks were dropped and rebuilt.
    pub unrecoverable_gaps: u64,
    /// Rejoins whose replay no longer reached back to the engine's first batch: blocks
    /// stored before the oldest buffered batch are not indexed.
    pub partial_rejoins: u64,
    /// Engine restarts seen (numbers back to 0).
    pub restarts: u64,
    /// Reconnections of the live socket to its publisher (each one a rejoin).
    pub reconnects: u64,
    /// Batches seen twice or out of date, ignored.
    pub ignored_batches: u64,
    /// Events the mapper refused (wrong block size or token count) or could not chain.
    pub refused_events: u64,
}

/// Why a replay was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReplayFor {
    /// Batches `from..=to` were missed.
    Gap,
    /// The feed (re)joined: everything the engine still buffers, up to the first live batch.
    Rejoin,
    /// The live socket (re)subscribed: whatever the engine published after the last batch
    /// seen, up to the first live batch (nothing is known to be missing).
    CatchUp,
}

/// Where the feed is.
#[derive(Debug, Clone, PartialEq)]
enum State {
    /// Applying live batches as they come.
    Live,
    /// Waiting for the replay of `from..=to`; `held` are the live batches since.
    Replaying {
        why: ReplayFor,
        from: u64,
        /// Last batch wanted; for a rejoin, open (`u64::MAX`) until a live batch arrives.
        to: u64,
        /// The first replayed batch's number, once one arrived.
        first_seq: Option<u64>,
        held: Vec<VllmBatch>,
    },
}

/// One publisher's feed (see the module docs). One per (worker, data-parallel rank).
#[derive(Debug, Clone)]
pub struct KvFeed {
    outgoing: Outgoing,
    tracker: SequenceTracker,
    mapper: HashMapper,
    state: State,
    counters: FeedCounters,
}

impl KvFeed {
    /// A feed for `worker_id` (registered as `instance_id`) that has seen nothing.
    pub fn new(worker_id: WorkerId, instance_id: u64, config: MapperConfig) -> Self {
        KvFeed {
            outgoing: Outgoing::new(worker_id, instance_id),
            tracker: SequenceTracker::new(),
            mapper: HashMapper::new(config),
            state: State::Live,
            counters: FeedCounters::default(),
        }
    }

    /// Counters so far.
    pub fn counters(&self) -> FeedCounters {
        self.counters
    }

    /// Whether a replay is outstanding.
    pub fn replaying(&self) -> bool {
        matches!(self.state, State::Replaying { .. })
    }

    /// Starts over for a worker registered (again) as `instance_id`: everything known is
    /// forgotten, the router's view is cleared, and the engine is asked for every batch it
    /// still buffers, so an idle engine's cache is indexed without waiting for its next
    /// event.
    pub fn rejoin(&mut self, instance_id: u64) -> Vec<FeedAction> {
        self.outgoing.restart(instance_id);
        self.tracker.reset();
        self.state = State::Replaying {
            why: ReplayFor::Rejoin,
            from: 0,
            to: u64::MAX,
            first_seq: None,
            held: Vec::new(),
        };
        vec![
            FeedAction::Publish(self.reset_batch()),
            FeedAction::RequestReplay { from: 0 },
        ]
    }

    /// The live SUB socket reconnected to its publisher by itself: the engine's PUB socket
    /// went away and came back. That is an engine restart unless it was a network blip, and
    /// a restarted engine that stays quiet sends nothing that would show it. So the worker
    /// rejoins under its registration: the router's view is cleared and rebuilt from what
    /// the engine buffers (all of it after a blip, nothing stale after a restart; the cost of
    /// a blip is at most the blocks older than the engine's replay buffer, as cache hits the
    /// router does not see, never a wrong one).
    pub fn on_reconnected(&mut self) -> Vec<FeedAction> {
        bump(&mut self.counters.reconnects);
        let instance_id = self.outgoing.instance_id();
        self.rejoin(instance_id)
    }

    /// The live SUB socket (re)subscribed. A PUB socket drops what it publishes while nobody
    /// is subscribed, and the feed only learns of a lost batch from the next one, which a
    /// quiet engine may not send for a long time (a control plane that subscribed late
    /// would index nothing of what the engine stored meanwhile). So it asks the replay
    /// socket for everything after the last batch seen; a replay already under way covers
    /// it.
    pub fn on_subscribed(&mut self) -> Vec<FeedAction> {
        if self.replaying() {
            return Vec::new();
        }
        let from = self.tracker.next_expected();
        self.state = State::Replaying {
            why: ReplayFor::CatchUp,
            from,
            to: u64::MAX,
            first_seq: None,
            held: Vec::new(),
        };
        vec![FeedAction::RequestReplay { from }]
    }

    /// A message from the live PUB stream.
    pub fn on_live(&mut self, batch: VllmBatch) -> Vec<FeedAction> {
        let mut out = Vec::new();
        if self.outgoing.nothing_published() {
            out.push(FeedAction::Publish(self.reset_batch()));
        }
        if let State::Replaying { to, held, why, .. } = &mut self.state {
            if matches!(why, ReplayFor::Rejoin | ReplayFor::CatchUp) && held.is_empty() {
                // What the live stream carries from here on is not wanted from the replay.
                *to = (*to).min(batch.seq.saturating_sub(1));
            }
            if held.len() < MAX_HELD_BATCHES {
                held.push(batch);
            } else {
                self.give_up(&mut out);
                self.apply(&batch, &mut out);
            }
            return out;
        }
        match self.tracker.observe(batch.seq) {
            SeqStatus::InOrder => self.apply(&batch, &mut out),
            SeqStatus::Gap { from, to } => self.replay_gap(from, to, batch, &mut out),
            SeqStatus::Restarted { .. } => {
                bump(&mut self.counters.restarts);
                out.push(FeedAction::Publish(self.reset_batch()));
                self.apply(&batch, &mut out);
            }
            SeqStatus::Stale { .. } => {
                // The live PUB stream keeps one publisher's order, and replayed batches never
                // come this way: an older number here is an engine that restarted and whose
                // first batches were lost (published before the socket reconnected). Its
                // cache started empty: drop the old engine's blocks and replay the new one's
                // from its start, holding this batch.
                bump(&mut self.counters.restarts);
                out.push(FeedAction::Publish(self.reset_batch()));
                self.tracker.reset();
                self.tracker.observe(batch.seq);
                self.replay_gap(0, batch.seq.saturating_sub(1), batch, &mut out);
            }
            SeqStatus::Duplicate => bump(&mut self.counters.ignored_batches),
        }
        out
    }

    /// Batches `from..=to` were missed before `batch`: hold it and ask for them.
    fn replay_gap(&mut self, from: u64, to: u64, batch: VllmBatch, out: &mut Vec<FeedAction>) {
        bump(&mut self.counters.gaps);
        self.state = State::Replaying {
            why: ReplayFor::Gap,
            from,
            to,
            first_seq: None,
            held: vec![batch],
        };
        out.push(FeedAction::RequestReplay { from });
    }

    /// One answer on the replay socket.
    pub fn on_replay(&mut self, frame: ReplayFrame) -> Vec<FeedAction> {
        let mut out = Vec::new();
        let State::Replaying {
            why,
            from,
            to,
            first_seq,
            ..
        } = &mut self.state
        else {
            // A late answer to an abandoned replay.
            bump(&mut self.counters.ignored_batches);
            return out;
        };
        let (why, from, to) = (*why, *from, *to);
        match frame {
            ReplayFrame::Batch(batch) => {
                let first = first_seq.is_none();
                first_seq.get_or_insert(batch.seq);
                if first && batch.seq > from {
                    // The engine's buffer starts past what was wanted: those batches are gone.
                    // Start clean and index what is still there.
                    match why {
                        ReplayFor::Gap => {
                            bump(&mut self.counters.unrecoverable_gaps);
                            out.push(FeedAction::Publish(self.reset_batch()));
                        }
                        // Batches after the last one seen are gone: as for a gap.
                        ReplayFor::CatchUp if self.tracker.last().is_some() => {
                            bump(&mut self.counters.unrecoverable_gaps);
                            out.push(FeedAction::Publish(self.reset_batch()));
                        }
                        ReplayFor::Rejoin | ReplayFor::CatchUp => {
                            bump(&mut self.counters.partial_rejoins)
                        }
                    }
                }
                if batch.seq >= from && batch.seq <= to {
                    // Only the rejoin's tracker has not seen the live stream yet; for a gap
                    // this is an older number and leaves the tracker where it is.
                    self.tracker.observe(batch.seq);
                    self.apply(&batch, &mut out);
                } else {
                    bump(&mut self.counters.ignored_batches);
                }
            }
            ReplayFrame::End => {
                match (why, *first_seq) {
                    (ReplayFor::Gap, None) => {
                        self.give_up(&mut out);
                        return out;
                    }
                    (ReplayFor::Gap, Some(first)) if first == from => {
                        bump(&mut self.counters.replayed_gaps)
                    }
                    // Counted (and the blocks dropped) when the first batch came.
                    (ReplayFor::Gap, Some(_)) => {}
                    (ReplayFor::Rejoin, _) => {}
                    // Batches were missed while unsubscribed, and replayed.
                    (ReplayFor::CatchUp, Some(first)) if first == from => {
                        bump(&mut self.counters.replayed_gaps)
                    }
                    (ReplayFor::CatchUp, _) => {}
                }
                self.release_held(&mut out);
            }
        }
        out
    }

    /// A replayed batch did not decode: whatever it stored or removed is unknown, so the
    /// worker's blocks are dropped, as for a gap the replay cannot fill, and the replay goes
    /// on (its later batches index what they store). Kept, the index claimed blocks that
    /// batch had evicted.
    pub fn on_replay_malformed(&mut self) -> Vec<FeedAction> {
        let mut out = Vec::new();
        if matches!(self.state, State::Replaying { .. }) {
            bump(&mut self.counters.unrecoverable_gaps);
            out.push(FeedAction::Publish(self.reset_batch()));
        }
        out
    }

    /// The replay did not answer in time (or its socket failed): the gap cannot be filled.
    pub fn on_replay_failed(&mut self) -> Vec<FeedAction> {
        let mut out = Vec::new();
        match &self.state {
            State::Replaying {
                why: ReplayFor::Gap,
                ..
            } => self.give_up(&mut out),
            // Nothing was known to be missing: go on from the live stream.
            State::Replaying {
                why: ReplayFor::Rejoin,
                ..
            } => {
                bump(&mut self.counters.partial_rejoins);
                self.release_held(&mut out);
            }
            State::Replaying {
                why: ReplayFor::CatchUp,
                ..
            } => self.release_held(&mut out),
            State::Live => {}
        }
        out
    }

    /// Drops the worker's blocks and goes on with the held live batches.
    fn give_up(&mut self, out: &mut Vec<FeedAction>) {
        bump(&mut self.counters.unrecoverable_gaps);
        out.push(FeedAction::Publish(self.reset_batch()));
        self.release_held(out);
    }

    /// Back to live: applies the batches held during the replay, in order.
    fn release_held(&mut self, out: &mut Vec<FeedAction>) {
        let State::Replaying { held, .. } = std::mem::replace(&mut self.state, State::Live) else {
            return;
        };
        for batch in held {
            // A gap's first held batch revealed it and was observed already; the rest go
            // through the tracker as live batches (in order, unless vLLM restarted
            // meanwhile).
            if self.tracker.last() == Some(batch.seq) {
                self.apply(&batch, out);
                continue;
            }
            let mut more = self.on_live(batch);
            out.append(&mut more);
        }
    }

    fn apply(&mut self, batch: &VllmBatch, out: &mut Vec<FeedAction>) {
        let mapped = self.mapper.apply_batch(batch);
        let refused = mapped
            .outcomes
            .iter()
            .filter(|o| matches!(o, Err(_) | Ok(super::mapper::Outcome::ResyncNeeded { .. })))
            .count();
        self.counters.refused_events = self
            .counters
            .refused_events
            .saturating_add(u64::try_from(refused).unwrap_or(u64::MAX));
        let events: Vec<KvEvent> = mapped.kv_events().cloned().collect();
        if !events.is_empty() {
            out.push(FeedAction::Publish(self.batch(events, false)));
        }
    }

    /// A resync batch that clears the worker's blocks in the router (and the mapper's).
    fn reset_batch(&mut self) -> KvEventBatch {
        self.outgoing.reset(&mut self.mapper)
    }

    fn batch(&mut self, events: Vec<KvEvent>, resync: bool) -> KvEventBatch {
        self.outgoing.batch(events, resync)
    }
}
