//! One TensorRT-LLM worker's polled events → Switchyard [`KvEventBatch`]es: the per-worker
//! state a control plane keeps, pure.
//!
//! The caller polls `POST /kv_cache_events`, decodes the answer
//! ([`super::decode::decode_body`]) and hands it to [`TrtllmFeed::on_poll`], which returns the
//! batches to publish.
//!
//! # Rules
//! - Batches go out numbered 1, 2, 3, ... by the feed itself; the first is a resync batch
//!   starting with `Cleared`, as after [`TrtllmFeed::rejoin`] (the worker registered again):
//!   the router rebuilds the worker from what follows.
//! - `event_id`s go up by one per event (per attention-DP rank). TensorRT-LLM keeps no replay
//!   buffer, and its queue drops events when full (`event_buffer_max_size`), so a gap cannot
//!   be filled: the worker's blocks are dropped (`Cleared`, [`TrtllmCounters::gaps`]) and
//!   rebuilt from what comes next, as vLLM's feed does when its replay falls short. A block
//!   whose parent was lost with the gap cannot be hashed; the mapper refuses it and its chain,
//!   which only costs cache hits. A malformed event is a lost event too.
//! - An `event_id` lower than the last one means the engine restarted: its cache is empty
//!   ([`TrtllmCounters::restarts`]). The same id again is ignored.
//! - Models with sliding-window layers announce blocks once per attention window
//!   (`window_size`). Only the largest window's events are indexed (a shorter window's
//!   blocks are not a reusable prefix); a larger window appearing drops what was indexed.
//! - A rejoin does not replay anything: TensorRT-LLM cannot resend what it already handed
//!   out, so after one the router knows only the blocks stored from then on.

use std::collections::BTreeMap;

use switchyard_protocol::hash::BlockSize;
use switchyard_protocol::kv::{KvEvent, KvEventBatch};
use switchyard_protocol::worker::WorkerId;

use crate::outgoing::{bump, Outgoing};

use super::decode::Decoded;
use super::mapper::to_mapper_event;
use super::TrtllmEvent;
use crate::vllm::mapper::{HashMapper, MapperConfig, Outcome};

/// What happened to the stream so far (for metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrtllmCounters {
    /// Gaps in the event ids (events the engine dropped, or lost in transit): the worker's
    /// blocks were dropped and rebuilt.
    pub gaps: u64,
    /// Engine restarts seen (event ids going back).
    pub restarts: u64,
    /// Events that did not decode (each drops the worker's blocks, as a gap does).
    pub malformed_events: u64,
    /// Events the mapper refused (wrong block size) or could not chain (unknown parent).
    pub refused_events: u64,
    /// Partly filled blocks left out of stored chains.
    pub partial_blocks: u64,
    /// Events of a shorter attention window, ignored.
    pub other_window: u64,
    /// Events seen twice, ignored.
    pub duplicates: u64,
}

/// Where an event's id stands against the last one of its rank.
enum Order {
    Next,
    Duplicate,
    Gap,
    Restarted,
}

/// One worker's feed (see the module docs).
#[derive(Debug, Clone)]
pub struct TrtllmFeed {
    outgoing: Outgoing,
    block_size: BlockSize,
    mapper: HashMapper,
    /// The last event id seen, per attention-DP rank.
    last_ids: BTreeMap<Option<i64>, u64>,
    /// The largest attention window seen.
    window: Option<u64>,
    counters: TrtllmCounters,
}

impl TrtllmFeed {
    /// A feed for `worker_id` (registered as `instance_id`) that has seen nothing.
    pub fn new(worker_id: WorkerId, instance_id: u64, config: MapperConfig) -> Self {
        TrtllmFeed {
            outgoing: Outgoing::new(worker_id, instance_id),
            block_size: config.block_size,
            mapper: HashMapper::new(config),
            last_ids: BTreeMap::new(),
            window: None,
            counters: TrtllmCounters::default(),
        }
    }

    /// Counters so far.
    pub fn counters(&self) -> TrtllmCounters {
        self.counters
    }

    /// Starts over for a worker registered (again) as `instance_id`: the router's view and the
    /// mapper's are cleared (nothing can be replayed; see the module docs). The event ids seen
    /// are kept, so the next poll's are still checked for gaps.
    pub fn rejoin(&mut self, instance_id: u64) -> Vec<KvEventBatch> {
        self.outgoing.restart(instance_id);
        self.window = None;
        vec![self.reset_batch()]
    }

    /// One poll's events, in the engine's order; the batches to publish.
    pub fn on_poll(&mut self, events: &[Decoded]) -> Vec<KvEventBatch> {
        let mut out = Vec::new();
        if self.outgoing.nothing_published() {
            out.push(self.reset_batch());
        }
        let mut pending = Vec::new();
        for item in events {
            match item {
                Ok(event) => self.apply(event, &mut pending, &mut out),
                Err(_) => {
                    bump(&mut self.counters.malformed_events);
                    // Its rank may be unreadable too: the next event of every rank starts
                    // afresh rather than counting the same loss again as a gap.
                    self.last_ids.clear();
                    self.reset(&mut pending, &mut out);
                }
            }
        }
        self.flush(&mut pending, &mut out);
        out
    }

    fn apply(
        &mut self,
        event: &TrtllmEvent,
        pending: &mut Vec<KvEvent>,
        out: &mut Vec<KvEventBatch>,
    ) {
        match self.order(event) {
            Order::Next => {}
            Order::Duplicate => {
                bump(&mut self.counters.duplicates);
                return;
            }
            Order::Gap => {
                bump(&mut self.counters.gaps);
                self.reset(pending, out);
            }
            Order::Restarted => {
                bump(&mut self.counters.restarts);
                // A new engine may run with other attention windows: its largest is learned
                // again (kept, a window the old engine had and the new one lacks dropped
                // every event for good).
                self.window = None;
                self.reset(pending, out);
            }
        }
        if let Some(window) = event.window_size {
            match self.window {
                Some(largest) if window < largest => {
                    bump(&mut self.counters.other_window);
                    return;
                }
                Some(largest) if window > largest => {
                    self.window = Some(window);
                    self.reset(pending, out);
                }
                Some(_) => {}
                None => self.window = Some(window),
            }
        }
        let converted = match to_mapper_event(&event.data, self.block_size) {
            Ok(converted) => converted,
            Err(_) => {
                bump(&mut self.counters.refused_events);
                return;
            }
        };
        self.counters.partial_blocks = self
            .counters
            .partial_blocks
            .saturating_add(u64::try_from(converted.partial_blocks).unwrap_or(u64::MAX));
        let Some(mapper_event) = converted.event else {
            return;
        };
        match self.mapper.apply(&mapper_event) {
            Ok(Outcome::Forward { event, .. }) => pending.push(event),
            Ok(Outcome::Ignored(_)) => {}
            Ok(Outcome::ResyncNeeded { .. }) | Err(_) => bump(&mut self.counters.refused_events),
        }
    }

    fn order(&mut self, event: &TrtllmEvent) -> Order {
        let id = event.event_id;
        match self.last_ids.insert(event.attention_dp_rank, id) {
            None => Order::Next,
            Some(last) if last.checked_add(1) == Some(id) => Order::Next,
            Some(last) if last == id => Order::Duplicate,
            Some(last) if id < last => Order::Restarted,
            Some(_) => Order::Gap,
        }
    }

    /// Publishes what is pending, then drops the worker's blocks.
    fn reset(&mut self, pending: &mut Vec<KvEvent>, out: &mut Vec<KvEventBatch>) {
        self.flush(pending, out);
        out.push(self.reset_batch());
    }

    fn flush(&mut self, pending: &mut Vec<KvEvent>, out: &mut Vec<KvEventBatch>) {
        if !pending.is_empty() {
            let events = std::mem::take(pending);
            out.push(self.batch(events, false));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trtllm::decode::{decode_body, Limits};
    use switchyard_protocol::hash::{sequence_hashes, HashSeed};
    use switchyard_protocol::kv::{EngineBlockId, StoredBlock};

    const BS: u32 = 4;

    fn feed() -> TrtllmFeed {
        let mut feed = TrtllmFeed::new(
            WorkerId("t".into()),
            7,
            MapperConfig::new(BlockSize::try_new(BS).unwrap()),
        );
        assert_eq!(feed.rejoin(7).len(), 1);
        feed
    }

    fn tokens_json(tokens: &[u32]) -> String {
        let items: Vec<String> = tokens
            .iter()
            .map(|t| format!(r#"{{"type": "unique_token", "token_id": {t}, "token_extra_id": 0}}"#))
            .collect();
        format!("[{}]", items.join(","))
    }

    /// A `stored` event of `tokens` in blocks of [`BS`] (the last may be partial), hashed
    /// `first_hash`, `first_hash + 1`, ...
    fn stored(id: u64, parent: Option<u64>, first_hash: u64, tokens: &[u32]) -> String {
        let blocks: Vec<String> = tokens
            .chunks(BS as usize)
            .enumerate()
            .map(|(i, chunk)| {
                format!(
                    r#"{{"type": "stored_block", "block_hash": {}, "tokens": {}, "cache_level": 0, "priority": 35}}"#,
                    first_hash + i as u64,
                    tokens_json(chunk)
                )
            })
            .collect();
        let parent = parent.map_or("null".to_string(), |p| p.to_string());
        format!(
            r#"{{"event_id": {id}, "window_size": 256, "data": {{"type": "stored", "parent_hash": {parent}, "blocks": [{}]}}}}"#,
            blocks.join(",")
        )
    }

    fn removed(id: u64, hashes: &[u64]) -> String {
        format!(
            r#"{{"event_id": {id}, "window_size": 256, "data": {{"type": "removed", "block_hashes": {hashes:?}}}}}"#
        )
    }

    fn poll(feed: &mut TrtllmFeed, events: &[String]) -> Vec<KvEventBatch> {
        let body = format!("[{}]", events.join(","));
        let decoded = decode_body(body.as_bytes(), &Limits::DEFAULT).unwrap();
        feed.on_poll(&decoded)
    }

    fn seq_hashes(tokens: &[u32]) -> Vec<switchyard_protocol::hash::SequenceHash> {
        sequence_hashes(tokens, BlockSize::try_new(BS).unwrap(), HashSeed::default())
    }

    #[test]
    fn a_stored_chain_gets_the_routers_hashes_and_a_continuation_chains_on() {
        let mut feed = feed();
        let prompt: Vec<u32> = (100..110).collect();
        let batches = poll(
            &mut feed,
            &[
                r#"{"event_id": 0, "window_size": 256, "data": {"type": "created", "num_blocks_per_cache_level": [64]}}"#.to_string(),
                stored(1, None, 1000, &prompt),
            ],
        );
        let want = seq_hashes(&prompt);
        assert_eq!(want.len(), 2, "the partial third block is not a block");
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].seq, 2, "after the rejoin's resync batch");
        assert!(!batches[0].resync);
        assert_eq!(
            batches[0].events,
            vec![
                KvEvent::Cleared,
                KvEvent::Stored {
                    parent: None,
                    parent_block_id: None,
                    blocks: vec![
                        StoredBlock {
                            seq_hash: want[0],
                            block_id: EngineBlockId(1000)
                        },
                        StoredBlock {
                            seq_hash: want[1],
                            block_id: EngineBlockId(1001)
                        },
                    ],
                    block_size: BS,
                },
            ]
        );
        assert_eq!(feed.counters().partial_blocks, 1);

        // The conversation goes on: the next blocks chain after block 1001.
        let longer: Vec<u32> = (100..116).collect();
        let batches = poll(&mut feed, &[stored(2, Some(1001), 2000, &longer[8..])]);
        let want = seq_hashes(&longer);
        let KvEvent::Stored { parent, blocks, .. } = &batches[0].events[0] else {
            panic!("stored: {batches:?}")
        };
        assert_eq!(*parent, Some(want[1]));
        assert_eq!(blocks[0].seq_hash, want[2]);
        assert_eq!(blocks[1].seq_hash, want[3]);

        // Removals name the engine's blocks; the partial block's removal is no one's business.
        let batches = poll(&mut feed, &[removed(3, &[2001, 1002])]);
        assert_eq!(
            batches[0].events,
            vec![KvEvent::Removed {
                block_ids: vec![EngineBlockId(2001)]
            }]
        );
        assert_eq!(
            feed.counters(),
            TrtllmCounters {
                partial_blocks: 1,
                ..Default::default()
            }
        );
        assert!(
            poll(&mut feed, &[]).is_empty(),
            "an idle poll publishes nothing"
        );
    }

    #[test]
    fn a_gap_drops_the_workers_blocks_and_orphans_are_refused() {
        let mut feed = feed();
        let prompt: Vec<u32> = (0..8).collect();
        poll(&mut feed, &[stored(10, None, 1, &prompt)]);
        let batches = poll(&mut feed, &[stored(12, Some(2), 3, &[8, 9, 10, 11])]);
        assert_eq!(batches.len(), 1);
        assert!(batches[0].resync);
        assert_eq!(batches[0].events, vec![KvEvent::Cleared]);
        let counters = feed.counters();
        assert_eq!((counters.gaps, counters.refused_events), (1, 1));
        // New prompts are indexed again.
        let batches = poll(&mut feed, &[stored(13, None, 50, &[1, 1, 1, 1])]);
        assert!(matches!(batches[0].events[0], KvEvent::Stored { .. }));
    }

    #[test]
    fn restarts_duplicates_malformed_events_and_other_windows() {
        let mut feed = feed();
        poll(&mut feed, &[stored(5, None, 1, &[1, 2, 3, 4])]);
        assert!(poll(&mut feed, &[stored(5, None, 1, &[1, 2, 3, 4])]).is_empty());
        assert_eq!(feed.counters().duplicates, 1);
        let batches = poll(&mut feed, &[stored(0, None, 1, &[1, 2, 3, 4])]);
        assert_eq!(
            batches[0].events,
            vec![KvEvent::Cleared],
            "restarted: clean slate"
        );
        assert!(matches!(batches[1].events[0], KvEvent::Stored { .. }));
        assert_eq!(feed.counters().restarts, 1);

        let batches = poll(
            &mut feed,
            &[
                r#"{"event_id": 1, "data": {"type": "removed"}}"#.to_string(),
                removed(2, &[1]),
            ],
        );
        assert_eq!(
            batches.len(),
            1,
            "the loss clears, the removal of a forgotten block is moot"
        );
        assert_eq!(batches[0].events, vec![KvEvent::Cleared]);
        assert_eq!(feed.counters().malformed_events, 1);
        assert_eq!(feed.counters().gaps, 0, "not counted twice");

        let short_window = r#"{"event_id": 3, "window_size": 16, "data": {"type": "stored", "parent_hash": null,
            "blocks": [{"block_hash": 9, "tokens": [{"token_id": 1}, {"token_id": 2}, {"token_id": 3}, {"token_id": 4}]}]}}"#;
        assert!(poll(&mut feed, &[short_window.to_string()]).is_empty());
        assert_eq!(feed.counters().other_window, 1);
    }

    #[test]
    fn a_restarted_engine_with_a_smaller_window_is_indexed_again() {
        let mut feed = feed();
        poll(&mut feed, &[stored(5, None, 1, &[1, 2, 3, 4])]);
        let wider = stored(6, None, 20, &[5, 6, 7, 8]).replace("256", "8192");
        poll(&mut feed, &[wider]);
        // The engine restarts (its ids from 0) with windows of 256 only.
        let batches = poll(
            &mut feed,
            &[
                r#"{"event_id": 0, "window_size": 256, "data": {"type": "created", "num_blocks_per_cache_level": [64]}}"#.to_string(),
                stored(1, None, 40, &[1, 2, 3, 4]),
            ],
        );
        assert!(
            batches
                .iter()
                .flat_map(|b| &b.events)
                .any(|e| matches!(e, KvEvent::Stored { .. })),
            "{batches:?}"
        );
        assert_eq!(feed.counters().other_window, 0);
    }

    #[test]
    fn a_block_size_other_than_the_workers_is_refused() {
        let mut feed = feed();
        assert!(poll(
            &mut feed,
            &[stored(1, None, 1, &[0; 8]).replace(
                r#"{"type": "unique_token", "token_id": 0, "token_extra_id": 0}"#,
                r#"{"token_id": 0}, {"token_id": 0}"#
            )]
        )
        .is_empty());
        assert_eq!(feed.counters().refused_events, 1);
    }
}
