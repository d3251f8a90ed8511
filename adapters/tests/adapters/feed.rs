//! The per-publisher feed: numbering, gaps filled by replay, gaps that cannot be, restarts.

use switchyard_adapters::vllm::feed::{FeedAction, KvFeed};
use switchyard_adapters::vllm::mapper::MapperConfig;
use switchyard_adapters::vllm::replay::ReplayFrame;
use switchyard_adapters::vllm::{VllmBatch, VllmEvent};
use switchyard_protocol::hash::{sequence_hashes, BlockSize, HashSeed, SequenceHash};
use switchyard_protocol::kv::{KvEvent, KvEventBatch};
use switchyard_protocol::worker::WorkerId;

const BS: u32 = 4;

fn feed() -> KvFeed {
    KvFeed::new(
        WorkerId("vllm-0".into()),
        7,
        MapperConfig::new(BlockSize::try_new(BS).unwrap()),
    )
}

/// Batch `seq` storing block `n` (vLLM hash 100 + n, tokens n*4 .. n*4+3) after block n - 1.
fn stored(seq: u64, n: u64) -> VllmBatch {
    let first = u32::try_from(n * 4).unwrap();
    VllmBatch {
        topic: String::new(),
        seq,
        ts: 0.0,
        events: vec![VllmEvent::BlockStored {
            block_hashes: vec![100 + n],
            parent: n.checked_sub(1).map(|p| 100 + p),
            token_ids: (first..first + 4).collect(),
            block_size: BS,
            lora_id: None,
            medium: Some("GPU".into()),
            group_idx: None,
            hashed_with_extra_keys: false,
        }],
        data_parallel_rank: None,
        skipped: vec![],
    }
}

/// Switchyard's hash of block `n` of the chain 0, 1, 2, ...
fn our_hash(n: u64) -> SequenceHash {
    let tokens: Vec<u32> = (0..u32::try_from((n + 1) * 4).unwrap()).collect();
    sequence_hashes(
        &tokens,
        BlockSize::try_new(BS).unwrap(),
        HashSeed::default(),
    )[n as usize]
}

fn published(actions: &[FeedAction]) -> Vec<&KvEventBatch> {
    actions
        .iter()
        .filter_map(|a| match a {
            FeedAction::Publish(b) => Some(b),
            FeedAction::RequestReplay { .. } => None,
        })
        .collect()
}

/// The Switchyard hashes stored by these batches, in order.
fn stored_hashes(batches: &[&KvEventBatch]) -> Vec<SequenceHash> {
    batches
        .iter()
        .flat_map(|b| &b.events)
        .filter_map(|e| match e {
            KvEvent::Stored { blocks, .. } => Some(blocks.iter().map(|b| b.seq_hash)),
            _ => None,
        })
        .flatten()
        .collect()
}

fn is_reset(batch: &KvEventBatch) -> bool {
    batch.resync && batch.events == vec![KvEvent::Cleared]
}

#[test]
fn the_first_batch_out_clears_the_worker_and_numbers_run_from_one() {
    let mut feed = feed();
    let out = feed.on_live(stored(0, 0));
    let batches = published(&out);
    assert_eq!(batches.len(), 2);
    assert!(is_reset(batches[0]));
    assert_eq!(
        batches.iter().map(|b| b.seq).collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert_eq!(batches[1].instance_id, 7);
    assert_eq!(stored_hashes(&batches), vec![our_hash(0)]);
    let out = feed.on_live(stored(1, 1));
    assert_eq!(published(&out)[0].seq, 3);
    assert_eq!(stored_hashes(&published(&out)), vec![our_hash(1)]);
}

#[test]
fn a_gap_is_filled_by_the_replay_before_the_live_batches_held_meanwhile() {
    let mut feed = feed();
    feed.on_live(stored(0, 0));
    let out = feed.on_live(stored(3, 3));
    assert_eq!(out, vec![FeedAction::RequestReplay { from: 1 }]);
    assert!(feed.replaying());
    assert!(
        feed.on_live(stored(4, 4)).is_empty(),
        "held while replaying"
    );
    let mut all = Vec::new();
    for seq in 1..=4 {
        // vLLM replays from 1 on, including what the feed already holds (3, 4).
        all.extend(feed.on_replay(ReplayFrame::Batch(stored(seq, seq))));
    }
    all.extend(feed.on_replay(ReplayFrame::End));
    assert!(!feed.replaying());
    let batches = published(&all);
    assert!(batches.iter().all(|b| !is_reset(b)), "nothing dropped");
    assert_eq!(
        stored_hashes(&batches),
        (1..=4).map(our_hash).collect::<Vec<_>>(),
        "the chain resolves through the replayed parents, each block once"
    );
    let c = feed.counters();
    assert_eq!((c.gaps, c.replayed_gaps, c.unrecoverable_gaps), (1, 1, 0));
    assert_eq!(c.refused_events, 0);
}

#[test]
fn a_replay_that_starts_past_the_gap_drops_the_worker_and_indexes_what_is_left() {
    let mut feed = feed();
    feed.on_live(stored(0, 0));
    feed.on_live(stored(3, 3));
    // vLLM's buffer starts at 2: batch 1 is gone.
    let out = feed.on_replay(ReplayFrame::Batch(stored(2, 2)));
    let batches = published(&out);
    assert!(is_reset(batches[0]), "blocks dropped: {out:?}");
    assert_eq!(feed.counters().unrecoverable_gaps, 1);
    // Block 2's parent went with the gap: it cannot be hashed, and is not guessed.
    assert!(stored_hashes(&batches).is_empty());
    let out = feed.on_replay(ReplayFrame::End);
    assert!(!feed.replaying());
    assert!(
        stored_hashes(&published(&out)).is_empty(),
        "block 3 neither"
    );
    let c = feed.counters();
    assert_eq!(
        (c.refused_events, c.replayed_gaps, c.unrecoverable_gaps),
        (2, 0, 1)
    );
    // New chains from the live stream are indexed again.
    let fresh = VllmBatch {
        seq: 4,
        ..stored(4, 0)
    };
    assert_eq!(
        stored_hashes(&published(&feed.on_live(fresh))),
        vec![our_hash(0)]
    );
}

#[test]
fn an_empty_replay_or_a_timeout_drops_the_worker() {
    let mut feed = feed();
    feed.on_live(stored(0, 0));
    feed.on_live(stored(2, 2));
    let out = feed.on_replay(ReplayFrame::End);
    assert!(is_reset(published(&out)[0]));

    let mut feed = self::feed();
    feed.on_live(stored(0, 0));
    feed.on_live(stored(2, 2));
    let out = feed.on_replay_failed();
    assert!(is_reset(published(&out)[0]));
    assert_eq!(feed.counters().unrecoverable_gaps, 1);
    assert!(feed.on_replay_failed().is_empty(), "nothing outstanding");
}

#[test]
fn joining_a_running_engine_replays_from_its_first_batch() {
    let mut feed = feed();
    let out = feed.on_live(stored(5, 5));
    assert!(is_reset(published(&out)[0]));
    assert!(out.contains(&FeedAction::RequestReplay { from: 0 }));
    let mut all = Vec::new();
    for seq in 0..=5 {
        all.extend(feed.on_replay(ReplayFrame::Batch(stored(seq, seq))));
    }
    all.extend(feed.on_replay(ReplayFrame::End));
    assert_eq!(
        stored_hashes(&published(&all)),
        (0..=5).map(our_hash).collect::<Vec<_>>()
    );
}

#[test]
fn a_restarted_engine_clears_the_worker_and_duplicates_are_ignored() {
    let mut feed = feed();
    feed.on_live(stored(0, 0));
    feed.on_live(stored(1, 1));
    assert!(published(&feed.on_live(stored(1, 1))).is_empty());
    assert_eq!(feed.counters().ignored_batches, 1);
    let out = feed.on_live(stored(0, 0));
    let batches = published(&out);
    assert!(is_reset(batches[0]));
    assert_eq!(stored_hashes(&batches), vec![our_hash(0)]);
    assert_eq!(feed.counters().restarts, 1);
}

/// An engine back before its health checks withdrew it, whose first batches (0, 1) were
/// published before the live socket reconnected: its next number (2) is older than the old
/// engine's last (5). The old engine's blocks go, and the new one's are replayed from 0.
#[test]
fn a_restart_whose_first_batches_were_lost_clears_the_worker_and_replays_from_zero() {
    let mut feed = feed();
    for seq in 0..=5 {
        feed.on_live(stored(seq, seq));
    }
    let out = feed.on_live(stored(2, 2));
    let batches = published(&out);
    assert_eq!(batches.len(), 1);
    assert!(is_reset(batches[0]), "the old engine's blocks are dropped");
    assert_eq!(out.last(), Some(&FeedAction::RequestReplay { from: 0 }));
    assert!(feed.replaying());
    let mut all = Vec::new();
    for seq in 0..=2 {
        all.extend(feed.on_replay(ReplayFrame::Batch(stored(seq, seq))));
    }
    all.extend(feed.on_replay(ReplayFrame::End));
    all.extend(feed.on_live(stored(3, 3)));
    let batches = published(&all);
    assert!(
        batches.iter().all(|b| !is_reset(b)),
        "the replay covered the gap"
    );
    assert_eq!(
        stored_hashes(&batches),
        (0..=3).map(our_hash).collect::<Vec<_>>(),
        "the new engine's chain, each block once"
    );
    let c = feed.counters();
    assert_eq!(
        (c.restarts, c.replayed_gaps, c.unrecoverable_gaps),
        (1, 1, 0)
    );
    assert_eq!(
        c.ignored_batches, 1,
        "the replayed copy of the held batch 2"
    );
}

/// The live socket reconnected to its publisher: the engine may have restarted and stayed
/// quiet. The old engine's blocks go and the new engine's buffer is replayed from 0; an
/// empty buffer leaves the worker empty, and the new engine's first batch (0) is in order.
#[test]
fn a_reconnected_publisher_clears_the_worker_and_replays_its_buffer() {
    let mut feed = feed();
    for seq in 0..=3 {
        feed.on_live(stored(seq, seq));
    }
    let out = feed.on_reconnected();
    assert_eq!(out.len(), 2);
    assert!(
        is_reset(published(&out)[0]),
        "the old engine's blocks are dropped"
    );
    assert_eq!(out[1], FeedAction::RequestReplay { from: 0 });
    // A quiet new engine buffers nothing: the worker stays empty.
    assert!(published(&feed.on_replay(ReplayFrame::End)).is_empty());
    assert!(!feed.replaying());
    let batches = feed.on_live(stored(0, 0));
    assert_eq!(stored_hashes(&published(&batches)), vec![our_hash(0)]);
    let c = feed.counters();
    assert_eq!((c.reconnects, c.restarts, c.ignored_batches), (1, 0, 0));
}

#[test]
fn rejoining_clears_renumbers_and_replays_everything_buffered() {
    let mut feed = feed();
    feed.on_live(stored(0, 0));
    let out = feed.rejoin(8);
    let batches = published(&out);
    assert!(is_reset(batches[0]));
    assert_eq!((batches[0].seq, batches[0].instance_id), (1, 8));
    assert!(out.contains(&FeedAction::RequestReplay { from: 0 }));
    // An idle engine: the replay alone rebuilds the index.
    let mut all = Vec::new();
    all.extend(feed.on_replay(ReplayFrame::Batch(stored(0, 0))));
    all.extend(feed.on_replay(ReplayFrame::Batch(stored(1, 1))));
    all.extend(feed.on_replay(ReplayFrame::End));
    assert_eq!(
        stored_hashes(&published(&all)),
        vec![our_hash(0), our_hash(1)]
    );
    assert!(!feed.replaying());
    // Live batches continue in order after the replay.
    let next = feed.on_live(stored(2, 2));
    assert_eq!(stored_hashes(&published(&next)), vec![our_hash(2)]);
    assert_eq!(feed.counters().gaps, 0);
}

#[test]
fn a_rejoin_holds_live_batches_and_skips_them_in_the_replay() {
    let mut feed = feed();
    feed.rejoin(1);
    assert!(published(&feed.on_live(stored(2, 2))).is_empty(), "held");
    let mut all = Vec::new();
    for seq in 0..=2 {
        all.extend(feed.on_replay(ReplayFrame::Batch(stored(seq, seq))));
    }
    all.extend(feed.on_replay(ReplayFrame::End));
    assert_eq!(
        stored_hashes(&published(&all)),
        (0..=2).map(our_hash).collect::<Vec<_>>(),
        "each block once, in order"
    );
}

#[test]
fn a_rejoin_into_an_empty_or_partial_buffer_is_no_gap() {
    let mut feed = feed();
    feed.rejoin(1);
    assert!(published(&feed.on_replay(ReplayFrame::End)).is_empty());
    assert_eq!(feed.counters().unrecoverable_gaps, 0);
    assert!(!feed.replaying());

    let mut feed = self::feed();
    feed.rejoin(1);
    let out = feed.on_replay(ReplayFrame::Batch(stored(5, 0)));
    assert_eq!(stored_hashes(&published(&out)), vec![our_hash(0)]);
    feed.on_replay(ReplayFrame::End);
    let c = feed.counters();
    assert_eq!((c.partial_rejoins, c.unrecoverable_gaps), (1, 0));
    assert_eq!(
        published(&feed.on_live(stored(6, 1))).len(),
        1,
        "in order after the replayed 5"
    );

    let mut feed = self::feed();
    feed.rejoin(1);
    assert!(
        feed.on_replay_failed().is_empty(),
        "no replay socket: go on live"
    );
    assert!(!feed.replaying());
}

#[test]
fn a_batch_published_before_the_socket_subscribed_is_caught_up_by_replay() {
    let mut feed = feed();
    feed.on_live(stored(0, 0));
    // The socket drops and subscribes again; batch 1 went out meanwhile and no later batch
    // comes to reveal the gap: the feed asks for everything after batch 0.
    let out = feed.on_subscribed();
    assert_eq!(out, vec![FeedAction::RequestReplay { from: 1 }]);
    assert!(feed.on_subscribed().is_empty(), "one replay at a time");
    let mut all = feed.on_replay(ReplayFrame::Batch(stored(1, 1)));
    all.extend(feed.on_replay(ReplayFrame::End));
    assert!(!feed.replaying());
    let batches = published(&all);
    assert!(batches.iter().all(|b| !is_reset(b)), "nothing dropped");
    assert_eq!(stored_hashes(&batches), vec![our_hash(1)]);
    assert_eq!(feed.counters().replayed_gaps, 1);
    // Live batches go on from there.
    assert_eq!(
        stored_hashes(&published(&feed.on_live(stored(2, 2)))),
        vec![our_hash(2)]
    );

    // Subscribed again with nothing missed: the replay ends empty and changes nothing.
    let out = feed.on_subscribed();
    assert_eq!(out, vec![FeedAction::RequestReplay { from: 3 }]);
    assert!(feed.on_replay(ReplayFrame::End).is_empty());
    assert!(!feed.replaying());
    assert_eq!(feed.counters().replayed_gaps, 1);
    assert_eq!(feed.counters().unrecoverable_gaps, 0);
}

#[test]
fn a_catch_up_past_the_engines_buffer_drops_the_workers_blocks() {
    let mut feed = feed();
    feed.on_live(stored(0, 0));
    assert_eq!(
        feed.on_subscribed(),
        vec![FeedAction::RequestReplay { from: 1 }]
    );
    // The engine's buffer starts at 3: batches 1 and 2 are gone.
    let mut all = feed.on_replay(ReplayFrame::Batch(stored(3, 3)));
    all.extend(feed.on_replay(ReplayFrame::End));
    assert!(
        is_reset(published(&all)[0]),
        "the worker's blocks are dropped"
    );
    assert_eq!(feed.counters().unrecoverable_gaps, 1);
    // A replay that fails leaves the feed live, nothing dropped.
    feed.on_subscribed();
    assert!(feed.on_replay_failed().is_empty());
    assert!(!feed.replaying());
}

#[test]
fn a_replayed_batch_that_does_not_decode_drops_the_workers_blocks() {
    let mut feed = feed();
    feed.on_live(stored(0, 0));
    assert_eq!(
        feed.on_live(stored(3, 3)),
        vec![FeedAction::RequestReplay { from: 1 }]
    );
    let mut all = feed.on_replay(ReplayFrame::Batch(stored(1, 1)));
    // Batch 2 (a removal, say) does not decode: what it did is unknown.
    all.extend(feed.on_replay_malformed());
    all.extend(feed.on_replay(ReplayFrame::Batch(stored(3, 3))));
    all.extend(feed.on_replay(ReplayFrame::End));
    let batches = published(&all);
    assert!(
        batches.iter().any(|b| is_reset(b)),
        "the worker's blocks are dropped: {batches:?}"
    );
    assert_eq!(feed.counters().unrecoverable_gaps, 1);
    assert!(!feed.replaying());
    // Not while live: a late malformed answer of an abandoned replay changes nothing.
    assert!(feed.on_replay_malformed().is_empty());
}
