//! Numbering and splitting of KV event batches, and resync dumps (pure logic).

use switchyard_engine::kv_batches::KvBatcher;
use switchyard_protocol::hash::SequenceHash;
use switchyard_protocol::kv::{
    EngineBlockId, KvEvent, KvEventBatch, StoredBlock, MAX_BLOCKS_PER_BATCH,
};
use switchyard_protocol::worker::WorkerId;

fn block(i: u64) -> StoredBlock {
    StoredBlock {
        seq_hash: SequenceHash(1_000 + i),
        block_id: EngineBlockId(i),
    }
}

fn stored(parent: Option<u64>, range: std::ops::Range<u64>) -> KvEvent {
    KvEvent::Stored {
        parent: parent.map(|p| SequenceHash(1_000 + p)),
        parent_block_id: parent.map(EngineBlockId),
        blocks: range.map(block).collect(),
        block_size: 64,
    }
}

fn batcher() -> KvBatcher {
    KvBatcher::new(WorkerId("w".into()), 7, 64)
}

fn blocks_in(batch: &KvEventBatch) -> usize {
    batch
        .events
        .iter()
        .map(|e| match e {
            KvEvent::Stored { blocks, .. } => blocks.len(),
            KvEvent::Removed { block_ids } => block_ids.len(),
            KvEvent::Cleared => 0,
        })
        .sum()
}

#[test]
fn batches_are_numbered_from_one_without_gaps() {
    let mut b = batcher();
    assert!(b.batch_events(Vec::new()).is_empty(), "no events, no batch");
    let first = b.batch_events(vec![stored(None, 0..3)]);
    let second = b.batch_events(vec![KvEvent::Removed {
        block_ids: vec![EngineBlockId(0)],
    }]);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].seq, 1);
    assert_eq!(second[0].seq, 2);
    assert_eq!(first[0].worker_id, WorkerId("w".into()));
    assert_eq!(first[0].instance_id, 7);
    assert!(!first[0].resync);
    assert_eq!(b.next_seq(), 3);
}

#[test]
fn large_events_split_into_chains_of_at_most_the_limit() {
    let mut b = batcher().with_max_blocks(4);
    let batches = b.batch_events(vec![
        stored(None, 0..10),
        KvEvent::Removed {
            block_ids: (0..5).map(EngineBlockId).collect(),
        },
    ]);
    assert!(batches.iter().all(|x| blocks_in(x) <= 4));
    let seqs: Vec<u64> = batches.iter().map(|x| x.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    // The Stored pieces chain: each continues from the previous piece's last block, named by
    // its hash and its engine id.
    let mut expected_parent = None;
    let mut all = Vec::new();
    for e in batches.iter().flat_map(|x| &x.events) {
        if let KvEvent::Stored {
            parent,
            parent_block_id,
            blocks,
            ..
        } = e
        {
            assert_eq!(*parent, expected_parent.map(|b: StoredBlock| b.seq_hash));
            assert_eq!(*parent_block_id, expected_parent.map(|b| b.block_id));
            expected_parent = blocks.last().copied();
            all.extend(blocks.iter().copied());
        }
    }
    assert_eq!(all, (0..10).map(block).collect::<Vec<_>>());
    let removed: usize = batches
        .iter()
        .flat_map(|x| &x.events)
        .map(|e| match e {
            KvEvent::Removed { block_ids } => block_ids.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(removed, 5);
}

#[test]
fn default_limit_is_the_protocol_limit() {
    let mut b = batcher();
    let n = MAX_BLOCKS_PER_BATCH as u64 + 1;
    let batches = b.batch_events(vec![stored(None, 0..n)]);
    assert_eq!(batches.len(), 2);
    assert_eq!(blocks_in(&batches[0]), MAX_BLOCKS_PER_BATCH);
    assert_eq!(blocks_in(&batches[1]), 1);
}

#[test]
fn resync_dump_is_cleared_then_chains_with_consecutive_seqs() {
    let mut b = batcher().with_max_blocks(3);
    b.batch_events(vec![stored(None, 0..1)]); // seq 1
                                              // Two chains: 0 -> 1 -> 2 -> 3 and a branch 1 -> 10 -> 11 (parents before children).
    let dump_input = vec![
        (None, block(0)),
        (Some(SequenceHash(1_000)), block(1)),
        (Some(SequenceHash(1_001)), block(2)),
        (Some(SequenceHash(1_002)), block(3)),
        (Some(SequenceHash(1_001)), block(10)),
        (Some(SequenceHash(1_010)), block(11)),
    ];
    let dump = b.resync_dump(dump_input);
    assert!(dump.iter().all(|x| x.resync));
    assert_eq!(dump[0].seq, 2);
    for pair in dump.windows(2) {
        assert_eq!(pair[1].seq, pair[0].seq + 1);
    }
    assert_eq!(dump[0].events[0], KvEvent::Cleared);
    assert!(dump.iter().all(|x| blocks_in(x) <= 3));
    // Replaying the Stored events rebuilds every (parent, block) edge of the input; each
    // chain names its parent's engine id too (block `i`'s is `i`).
    let mut edges = Vec::new();
    for e in dump.iter().flat_map(|x| &x.events) {
        if let KvEvent::Stored {
            parent,
            parent_block_id,
            blocks,
            ..
        } = e
        {
            assert_eq!(*parent_block_id, parent.map(|p| EngineBlockId(p.0 - 1_000)));
            let mut p = *parent;
            for blk in blocks {
                edges.push((p, blk.seq_hash));
                p = Some(blk.seq_hash);
            }
        }
    }
    let want: Vec<(Option<SequenceHash>, SequenceHash)> = vec![
        (None, SequenceHash(1_000)),
        (Some(SequenceHash(1_000)), SequenceHash(1_001)),
        (Some(SequenceHash(1_001)), SequenceHash(1_002)),
        (Some(SequenceHash(1_002)), SequenceHash(1_003)),
        (Some(SequenceHash(1_001)), SequenceHash(1_010)),
        (Some(SequenceHash(1_010)), SequenceHash(1_011)),
    ];
    assert_eq!(edges, want);
    // Numbering continues after the dump.
    let after = b.batch_events(vec![stored(None, 20..21)]);
    assert_eq!(after[0].seq, dump.last().unwrap().seq + 1);
}

#[test]
fn an_empty_cache_dumps_a_single_cleared() {
    let mut b = batcher();
    let dump = b.resync_dump(Vec::new());
    assert_eq!(dump.len(), 1);
    assert_eq!(dump[0].events, vec![KvEvent::Cleared]);
    assert_eq!(dump[0].seq, 1);
}
