use std::collections::{BTreeMap, BTreeSet};

use super::*;

fn blocks(hashes: &[u64], first_id: u64) -> Vec<StoredBlock> {
    hashes
        .iter()
        .enumerate()
        .map(|(i, &h)| StoredBlock {
            seq_hash: SequenceHash(h),
            block_id: EngineBlockId(first_id + i as u64),
        })
        .collect()
}

fn query(index: &KvIndex, hashes: &[u64]) -> BTreeMap<u16, u32> {
    let hashes: Vec<SequenceHash> = hashes.iter().map(|&h| SequenceHash(h)).collect();
    let mut out = OverlapScores::default();
    index.find_matches(&hashes, &mut out);
    out.matches.iter().map(|(s, n)| (s.0, *n)).collect()
}

fn index_with(workers: u16) -> KvIndex {
    let mut index = KvIndex::new();
    for w in 0..workers {
        index.add_worker(WorkerSlot(w));
    }
    index
}

#[test]
fn longest_prefix_per_worker() {
    let mut index = index_with(3);
    index.store(WorkerSlot(0), &blocks(&[1, 2, 3, 4], 100));
    index.store(WorkerSlot(1), &blocks(&[1, 2], 200));
    index.store(WorkerSlot(2), &blocks(&[9], 300));
    assert_eq!(
        query(&index, &[1, 2, 3, 4, 5]),
        BTreeMap::from([(0, 4), (1, 2)])
    );
    assert_eq!(query(&index, &[1, 7, 3]), BTreeMap::from([(0, 1), (1, 1)]));
    assert!(
        query(&index, &[5, 1, 2]).is_empty(),
        "first block missing: no match"
    );
    assert!(query(&index, &[]).is_empty());
}

#[test]
fn a_gap_ends_the_match_even_if_later_blocks_are_cached() {
    let mut index = index_with(1);
    index.store(WorkerSlot(0), &blocks(&[1, 2, 3, 4], 0));
    index.remove(WorkerSlot(0), &[EngineBlockId(1)]); // hash 2
    assert_eq!(query(&index, &[1, 2, 3, 4]), BTreeMap::from([(0, 1)]));
}

#[test]
fn many_holders_use_the_arena_and_match_exactly() {
    let mut index = index_with(130);
    let shared = [10, 11, 12];
    for w in 0..130u16 {
        index.store(WorkerSlot(w), &blocks(&shared, 0));
        if w % 3 == 0 {
            index.store(WorkerSlot(w), &blocks(&[13], 3));
        }
    }
    assert_eq!(index.holders_of(SequenceHash(10)), 130);
    let got = query(&index, &[10, 11, 12, 13]);
    assert_eq!(got.len(), 130);
    for (w, n) in got {
        assert_eq!(n, if w % 3 == 0 { 4 } else { 3 }, "worker {w}");
    }
    assert_eq!(index.stats().pairs, 130 * 3 + 44);
}

#[test]
fn removal_by_engine_id_only_touches_that_worker() {
    let mut index = index_with(2);
    index.store(WorkerSlot(0), &blocks(&[1, 2], 0));
    index.store(WorkerSlot(1), &blocks(&[1, 2], 0)); // same engine ids, other worker
    let counts = index.remove(WorkerSlot(0), &[EngineBlockId(0), EngineBlockId(77)]);
    assert_eq!(counts.removed, 1);
    assert_eq!(counts.unknown_removals, 1);
    assert_eq!(query(&index, &[1, 2]), BTreeMap::from([(1, 2)]));
}

#[test]
fn a_hash_stored_twice_survives_one_removal() {
    let mut index = index_with(1);
    index.store(WorkerSlot(0), &blocks(&[1], 0));
    index.store(WorkerSlot(0), &blocks(&[1], 5));
    assert_eq!(index.stats().pairs, 1);
    index.remove(WorkerSlot(0), &[EngineBlockId(0)]);
    assert_eq!(query(&index, &[1]), BTreeMap::from([(0, 1)]));
    index.remove(WorkerSlot(0), &[EngineBlockId(5)]);
    assert!(query(&index, &[1]).is_empty());
    assert_eq!(index.stats().distinct_hashes, 0);
}

#[test]
fn clear_and_remove_worker_drop_everything_of_that_worker() {
    let mut index = index_with(2);
    index.store(WorkerSlot(0), &blocks(&[1, 2, 3], 0));
    index.store(WorkerSlot(1), &blocks(&[1, 2], 0));
    index.clear_worker(WorkerSlot(0));
    assert_eq!(query(&index, &[1, 2, 3]), BTreeMap::from([(1, 2)]));
    assert!(index.has_worker(WorkerSlot(0)));
    index.remove_worker(WorkerSlot(1));
    assert!(!index.has_worker(WorkerSlot(1)));
    assert_eq!(index.stats().pairs, 0);
    assert_eq!(index.stats().distinct_hashes, 0);
    // Events for an untracked worker are ignored.
    assert_eq!(index.store(WorkerSlot(1), &blocks(&[1], 0)).stored, 0);
}

#[test]
fn an_engine_id_reused_for_new_content_replaces_the_old_block() {
    let mut index = index_with(1);
    index.store(WorkerSlot(0), &blocks(&[1], 0));
    index.store(WorkerSlot(0), &blocks(&[2], 0));
    assert!(query(&index, &[1]).is_empty());
    assert_eq!(query(&index, &[2]), BTreeMap::from([(0, 1)]));
    assert_eq!(index.stats().pairs, 1);
}

#[test]
fn an_engine_id_reused_within_one_event_for_the_next_block_keeps_the_chain_reachable() {
    let sb = |hash, id| StoredBlock {
        seq_hash: SequenceHash(hash),
        block_id: EngineBlockId(id),
    };
    let mut index = index_with(2);
    // Worker 0 stores block 1 then block 2 under one engine id: 2 replaces 1, its parent.
    index.store_after(WorkerSlot(0), None, None, &[sb(1, 0), sb(2, 0)]);
    index.store_after(WorkerSlot(1), None, None, &[sb(1, 10), sb(2, 11)]);
    index.store_after(WorkerSlot(0), None, None, &[sb(1, 5)]);
    assert_eq!(index.stats().pairs, 4);
    assert_eq!(query(&index, &[1, 2]), BTreeMap::from([(0, 2), (1, 2)]));
    assert_eq!(index.stats().distinct_hashes, 2, "one record per hash");
}

#[test]
fn compaction_keeps_every_match() {
    let mut index = index_with(2);
    let chain: Vec<u64> = (1..=3000).collect();
    index.store(WorkerSlot(0), &blocks(&chain, 0));
    index.store(WorkerSlot(1), &blocks(&chain[..100], 0));
    // Evict the tail of worker 0's chain: 2000 dead records, more than a quarter.
    let ids: Vec<EngineBlockId> = (1000..3000).map(EngineBlockId).collect();
    index.remove(WorkerSlot(0), &ids);
    assert_eq!(query(&index, &chain), BTreeMap::from([(0, 1000), (1, 100)]));
    assert_eq!(index.stats().pairs, 1100);
    // Engine ids still resolve after indices moved.
    index.remove(WorkerSlot(0), &[EngineBlockId(500)]);
    assert_eq!(query(&index, &chain), BTreeMap::from([(0, 500), (1, 100)]));
    index.store(WorkerSlot(0), &blocks(&chain[500..501], 500));
    assert_eq!(
        query(&index, &chain[..1000]),
        BTreeMap::from([(0, 1000), (1, 100)])
    );
}

/// A naive model: per worker, engine id -> hash.
#[derive(Default)]
struct Model {
    workers: BTreeMap<u16, BTreeMap<u64, u64>>,
}

impl Model {
    fn holds(&self, w: u16, h: u64) -> bool {
        self.workers[&w].values().any(|&x| x == h)
    }
    fn query(&self, hashes: &[u64]) -> BTreeMap<u16, u32> {
        let mut out = BTreeMap::new();
        for &w in self.workers.keys() {
            let n = hashes.iter().take_while(|&&h| self.holds(w, h)).count() as u32;
            if n > 0 {
                out.insert(w, n);
            }
        }
        out
    }
    fn pairs(&self) -> u64 {
        self.workers
            .values()
            .map(|m| m.values().collect::<BTreeSet<_>>().len() as u64)
            .sum()
    }
}

#[derive(Debug, Clone)]
enum Op {
    Store(u16, Vec<(u64, u64)>),
    Remove(u16, Vec<u64>),
    Clear(u16),
    Query(Vec<u64>),
    /// `reserve_total(n)`, which the router calls as workers register.
    Reserve(usize),
}

/// Hashes of long chain `c` (chains longer than the index's prefetch group and query
/// chunk), with engine ids that may collide with other chains' ids on the same worker.
fn chain(c: u64, from: u64, len: u64) -> Vec<(u64, u64)> {
    (from..from + len)
        .map(|i| (1_000 * (c + 1) + i, 100 + 20 * c + i))
        .collect()
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    // Few workers (some above 64 to cross a bitset word), few hashes and ids, so that
    // sharing, duplicates and removals collide often.
    let worker = prop_oneof![0u16..4, 64u16..67];
    prop_oneof![
        4 => (worker.clone(), proptest::collection::vec((0u64..12, 0u64..16), 1..6))
            .prop_map(|(w, b)| Op::Store(w, b)),
        2 => (worker.clone(), proptest::collection::vec(0u64..16, 1..4))
            .prop_map(|(w, ids)| Op::Remove(w, ids)),
        1 => worker.clone().prop_map(Op::Clear),
        3 => proptest::collection::vec(0u64..12, 0..6).prop_map(Op::Query),
        2 => (worker.clone(), 0u64..3, 0u64..8, 1u64..45)
            .prop_map(|(w, c, from, len)| Op::Store(w, chain(c, from, len))),
        1 => (worker, proptest::collection::vec(90u64..200, 1..40))
            .prop_map(|(w, ids)| Op::Remove(w, ids)),
        2 => (0u64..3, 1u64..60).prop_map(|(c, len)| {
            Op::Query(chain(c, 0, len).into_iter().map(|(h, _)| h).collect())
        }),
        1 => (0usize..300).prop_map(Op::Reserve),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
    /// Hashes here are arbitrary: one may follow different blocks in different events, which
    /// sequence hashes never do. So the index is made to keep every hash in its table before
    /// each store (as it does once a parent cannot be found); `agrees_with_a_naive_model_on_chained_events` covers the
    /// table of heads. With `with_parents`, stores say which blocks start a prompt
    /// (`store_after`), as the router's do: hashes below 4 are prompts' first blocks (only
    /// ever `blocks[0]` of an event without parent), every other hash sits after one. A
    /// query can then only start with a first block; one that starts with another hash is a
    /// miss.
    #[test]
    fn agrees_with_a_naive_model(
        ops in proptest::collection::vec(op(), 1..120),
        with_parents in proptest::bool::ANY,
    ) {
        let mut index = KvIndex::new();
        let mut model = Model::default();
        for w in [0u16, 1, 2, 3, 64, 65, 66] {
            index.add_worker(WorkerSlot(w));
            model.workers.insert(w, BTreeMap::new());
        }
        for op in ops {
            match op {
                Op::Store(w, b) => {
                    // Hashes below 4 only as an event's first block (see above).
                    let b: Vec<(u64, u64)> = b.iter().enumerate().map(|(i, &(h, id))| {
                        (if with_parents && i > 0 && h < 4 { h + 100 } else { h }, id)
                    }).collect();
                    let stored: Vec<StoredBlock> = b.iter().map(|&(h, id)| StoredBlock {
                        seq_hash: SequenceHash(h),
                        block_id: EngineBlockId(id),
                    }).collect();
                    // Every hash in the table (the index goes back to heads only
                    // whenever it empties).
                    index.keep_every_hash();
                    if with_parents {
                        let first = stored.first().map_or(0, |s| s.seq_hash.0);
                        let parent = (first >= 4).then_some(SequenceHash(7));
                        index.store_after(WorkerSlot(w), parent, None, &stored);
                    } else {
                        index.store(WorkerSlot(w), &stored);
                    }
                    let m = model.workers.get_mut(&w).unwrap();
                    for (h, id) in b {
                        m.insert(id, h);
                    }
                }
                Op::Remove(w, ids) => {
                    let ids: Vec<EngineBlockId> = ids.into_iter().map(EngineBlockId).collect();
                    index.remove(WorkerSlot(w), &ids);
                    let m = model.workers.get_mut(&w).unwrap();
                    for id in ids {
                        m.remove(&id.0);
                    }
                }
                Op::Clear(w) => {
                    index.clear_worker(WorkerSlot(w));
                    model.workers.get_mut(&w).unwrap().clear();
                }
                Op::Query(q) => {
                    let expected = if with_parents && q.first().is_some_and(|&h| h >= 4) {
                        BTreeMap::new()
                    } else {
                        model.query(&q)
                    };
                    proptest::prop_assert_eq!(query(&index, &q), expected);
                }
                Op::Reserve(n) => index.reserve_total(n),
            }
            proptest::prop_assert_eq!(index.stats().pairs, model.pairs());
        }
        for w in [0u16, 1, 2, 3, 64, 65, 66] {
            index.remove_worker(WorkerSlot(w));
        }
        proptest::prop_assert_eq!(index.stats().distinct_hashes, 0);
    }
}

/// A dying block's hash stays in the hash table until the pending dead entries are flushed:
/// lookups skip it, storing the hash again reuses the entry (which the flush then keeps),
/// and counts leave it out.
#[test]
fn dead_entries_are_invisible_reused_and_flushed() {
    let mut index = index_with(2);
    index.store(WorkerSlot(0), &blocks(&[1, 2, 3], 0));
    index.remove(WorkerSlot(0), &[EngineBlockId(1), EngineBlockId(2)]); // hashes 2, 3
    assert_eq!(index.pending.len(), 2);
    assert_eq!(index.holders.len(), 3);
    assert_eq!(index.stats().distinct_hashes, 1);
    assert_eq!(index.holders_of(SequenceHash(2)), 0);
    assert_eq!(query(&index, &[1, 2, 3]), BTreeMap::from([(0, 1)]));
    assert!(query(&index, &[2]).is_empty());
    // Hash 2 stored again (by the other worker): the entry is live again.
    index.store(WorkerSlot(1), &blocks(&[2], 7));
    assert_eq!(query(&index, &[2, 3]), BTreeMap::from([(1, 1)]));
    assert_eq!(index.stats().distinct_hashes, 2);
    // Removing a worker leaves its hashes pending too; a flush removes all but the reused.
    index.remove_worker(WorkerSlot(0));
    assert_eq!(index.pending.len(), 3);
    index.flush_dead();
    assert!(index.pending.is_empty());
    assert_eq!(index.holders.len(), 1);
    assert_eq!(query(&index, &[2, 3]), BTreeMap::from([(1, 1)]));
    index.compact();
    assert_eq!(query(&index, &[2, 3]), BTreeMap::from([(1, 1)]));
    assert_eq!(index.stats().distinct_hashes, 1);
}

/// When pending dead entries leave the hash table no room for a `Stored` event, they are
/// flushed instead of the table growing.
#[test]
fn dead_entries_are_flushed_before_the_table_grows() {
    let mut index = index_with(1);
    index.reserve_total(5000);
    let table_bytes = index.holders.heap_bytes();
    let spare = index.holders.spare();
    let hashes: Vec<u64> = (1..=spare as u64 - 500).collect();
    index.store(WorkerSlot(0), &blocks(&hashes, 0));
    // Fewer dead records than a flush takes: they stay in the table.
    let ids: Vec<EngineBlockId> = (0..15).map(EngineBlockId).collect();
    index.remove(WorkerSlot(0), &ids);
    assert_eq!(index.pending.len(), 15);
    let more: Vec<u64> = (100_000..100_490).collect();
    index.store(WorkerSlot(0), &blocks(&more, 1_000_000));
    assert_eq!(index.pending.len(), 15);
    assert_eq!(index.holders.spare(), 10);
    // No room for 12 more: the dead entries go, the table keeps its size.
    let last: Vec<u64> = (200_000..200_012).collect();
    index.store(WorkerSlot(0), &blocks(&last, 2_000_000));
    assert!(index.pending.is_empty());
    assert_eq!(index.holders.heap_bytes(), table_bytes);
    assert_eq!(query(&index, &last).get(&0), Some(&12));
    assert_eq!(
        query(&index, &hashes[15..]).get(&0),
        Some(&(hashes.len() as u32 - 15))
    );
    assert!(query(&index, &hashes).is_empty());
}

/// The root table: a query whose first block was never stored as a prompt's first is a miss
/// without a hash-table probe; roots whose block died leave at compaction; `store` turns
/// the check off.
#[test]
fn prompt_first_blocks_gate_queries() {
    let mut index = index_with(2);
    index.store_after(WorkerSlot(0), None, None, &blocks(&[1, 2, 3], 0));
    index.store_after(WorkerSlot(1), Some(SequenceHash(3)), None, &blocks(&[4], 0));
    assert_eq!(index.roots.len(), 1);
    assert_eq!(query(&index, &[1, 2, 3, 4]), BTreeMap::from([(0, 3)]));
    // Hash 4 is held, but no prompt starts with it.
    assert!(query(&index, &[4]).is_empty());
    index.remove(WorkerSlot(0), &[EngineBlockId(0)]);
    index.compact();
    assert_eq!(index.roots.len(), 0);
    assert!(query(&index, &[1, 2]).is_empty());
    index.store_after(WorkerSlot(1), None, None, &blocks(&[1], 9));
    assert_eq!(query(&index, &[1, 2]), BTreeMap::from([(1, 1)]));
    index.store(WorkerSlot(1), &blocks(&[4], 10));
    assert_eq!(query(&index, &[4]), BTreeMap::from([(1, 1)]));
}

/// A hit takes the first block's record from the root table; an entry whose record died
/// (before compaction removes it) is a miss, and storing the block again as a prompt's first
/// points the entry at the new record.
#[test]
fn a_root_entry_names_the_live_record_or_misses() {
    let mut index = index_with(2);
    index.store_after(WorkerSlot(0), None, None, &blocks(&[1, 2], 0));
    assert_eq!(index.root(1), index.lookup(1));
    index.remove(WorkerSlot(0), &[EngineBlockId(0)]); // hash 1 dies, its entry stays
    assert_eq!(index.roots.len(), 1);
    assert_eq!(index.root(1), None);
    assert!(query(&index, &[1, 2]).is_empty());
    index.store_after(WorkerSlot(1), None, None, &blocks(&[1], 5));
    let live = index.lookup(1);
    assert!(live.is_some());
    assert_eq!(index.root(1), live);
    assert_eq!(query(&index, &[1, 2]), BTreeMap::from([(1, 1)]));
}

/// Prompts whose blocks' hashes name their prefix, as sequence hashes do: prompt 1 shares
/// prompt 0's first 3 blocks, prompts 2 and 3 its first 20, and 2 and 3 part at block 30.
const PROMPTS: u64 = 4;
const PROMPT_BLOCKS: u64 = 50;

fn token(prompt: u64, block: u64) -> u64 {
    let shared = [PROMPT_BLOCKS, 3, 20, 20][prompt as usize];
    match prompt {
        3 if (20..30).contains(&block) => 2_000 + block, // prompt 2's, after the parting
        _ if block < shared => block,
        _ => 1_000 * (prompt + 1) + block,
    }
}

/// The sequence hash of `prompt`'s first `block + 1` blocks.
fn chained_hash(prompt: u64, block: u64) -> u64 {
    (0..=block).fold(0x5eed_u64, |h, b| {
        let mut x = (h ^ token(prompt, b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 29;
        x.wrapping_mul(0xBF58_476D_1CE4_E5B9) | 1 // never 0, the dead records' hash
    })
}

/// A worker's engine id for a block: ids of different prompts collide (an engine reusing an
/// id for other content), and the shared blocks of two prompts get two ids (two copies).
fn engine_id(prompt: u64, block: u64) -> u64 {
    20 * prompt + block
}

#[derive(Debug, Clone)]
enum ChainOp {
    /// Store the next `len` blocks of `prompt` after what the worker holds of it.
    StoreNext(u16, u64, u64),
    /// Store `len` blocks of `prompt` from a block the worker holds the parent of (`at` picks
    /// it), so some are stored again.
    StoreAgain(u16, u64, u64, u64),
    /// Remove the last `n` blocks the worker holds of `prompt`, last first (an engine evicts
    /// a sequence's tail first).
    RemoveTail(u16, u64, u64),
    /// Remove these engine ids, in this order (parents before children, sometimes).
    Remove(u16, Vec<u64>),
    Clear(u16),
    /// Query the first `len` blocks of `prompt`.
    Query(u64, u64),
    Reserve(usize),
}

fn chain_op() -> impl proptest::strategy::Strategy<Value = ChainOp> {
    use proptest::prelude::*;
    let worker = prop_oneof![0u16..3, 64u16..66];
    let prompt = 0..PROMPTS;
    prop_oneof![
        5 => (worker.clone(), prompt.clone(), 1u64..30).prop_map(|(w, p, n)| ChainOp::StoreNext(w, p, n)),
        2 => (worker.clone(), prompt.clone(), 0u64..50, 1u64..30)
            .prop_map(|(w, p, at, n)| ChainOp::StoreAgain(w, p, at, n)),
        2 => (worker.clone(), prompt.clone(), 1u64..20).prop_map(|(w, p, n)| ChainOp::RemoveTail(w, p, n)),
        2 => (worker.clone(), proptest::collection::vec(0u64..110, 1..12))
            .prop_map(|(w, ids)| ChainOp::Remove(w, ids)),
        1 => worker.prop_map(ChainOp::Clear),
        4 => (prompt, 1u64..=PROMPT_BLOCKS).prop_map(|(p, n)| ChainOp::Query(p, n)),
        1 => (0usize..300).prop_map(ChainOp::Reserve),
    ]
}

impl Model {
    /// How many leading blocks of `prompt` worker `w` holds.
    fn held_prefix(&self, w: u16, prompt: u64) -> u64 {
        (0..PROMPT_BLOCKS)
            .take_while(|&b| self.holds(w, chained_hash(prompt, b)))
            .count() as u64
    }

    /// An engine id under which `w` holds `hash`.
    fn id_of(&self, w: u16, hash: u64) -> Option<u64> {
        self.workers[&w]
            .iter()
            .find(|(_, &h)| h == hash)
            .map(|(&id, _)| id)
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1000))]
    /// Events as engines send them (sequence hashes that name their prefix, the parent's
    /// engine id, tails evicted first or anything removed in any order): the index keeps
    /// heads only and answers every query and count as the model does.
    #[test]
    fn agrees_with_a_naive_model_on_chained_events(
        ops in proptest::collection::vec(chain_op(), 1..100),
    ) {
        let mut index = KvIndex::new();
        let mut model = Model::default();
        for w in [0u16, 1, 2, 64, 65] {
            index.add_worker(WorkerSlot(w));
            model.workers.insert(w, BTreeMap::new());
        }
        for op in ops {
            let store = |from: u64, n: u64, w: u16, prompt: u64, index: &mut KvIndex, model: &mut Model| {
                let to = (from + n).min(PROMPT_BLOCKS);
                if from >= to {
                    return;
                }
                let parent = (from > 0).then(|| chained_hash(prompt, from - 1));
                let parent_block = parent.and_then(|h| model.id_of(w, h)).map(EngineBlockId);
                let stored: Vec<StoredBlock> = (from..to).map(|b| StoredBlock {
                    seq_hash: SequenceHash(chained_hash(prompt, b)),
                    block_id: EngineBlockId(engine_id(prompt, b)),
                }).collect();
                index.store_after(WorkerSlot(w), parent.map(SequenceHash), parent_block, &stored);
                let m = model.workers.get_mut(&w).unwrap();
                for b in &stored {
                    m.insert(b.block_id.0, b.seq_hash.0);
                }
            };
            match op {
                ChainOp::StoreNext(w, prompt, n) => {
                    let from = model.held_prefix(w, prompt);
                    store(from, n, w, prompt, &mut index, &mut model);
                }
                ChainOp::StoreAgain(w, prompt, at, n) => {
                    let from = at % (model.held_prefix(w, prompt) + 1);
                    store(from, n, w, prompt, &mut index, &mut model);
                }
                ChainOp::RemoveTail(w, prompt, n) => {
                    let held = model.held_prefix(w, prompt);
                    let ids: Vec<EngineBlockId> = (held.saturating_sub(n)..held)
                        .rev()
                        .filter_map(|b| model.id_of(w, chained_hash(prompt, b)))
                        .map(EngineBlockId)
                        .collect();
                    index.remove(WorkerSlot(w), &ids);
                    let m = model.workers.get_mut(&w).unwrap();
                    for id in ids {
                        m.remove(&id.0);
                    }
                }
                ChainOp::Remove(w, ids) => {
                    let ids: Vec<EngineBlockId> = ids.into_iter().map(EngineBlockId).collect();
                    index.remove(WorkerSlot(w), &ids);
                    let m = model.workers.get_mut(&w).unwrap();
                    for id in ids {
                        m.remove(&id.0);
                    }
                }
                ChainOp::Clear(w) => {
                    index.clear_worker(WorkerSlot(w));
                    model.workers.get_mut(&w).unwrap().clear();
                }
                ChainOp::Query(prompt, n) => {
                    let q: Vec<u64> = (0..n).map(|b| chained_hash(prompt, b)).collect();
                    proptest::prop_assert_eq!(query(&index, &q), model.query(&q));
                }
                ChainOp::Reserve(n) => index.reserve_total(n),
            }
            proptest::prop_assert_eq!(index.stats().pairs, model.pairs());
            // Every parent was found through its engine id: heads only.
            proptest::prop_assert!(!index.every_hash);
        }
        for prompt in 0..PROMPTS {
            let q: Vec<u64> = (0..PROMPT_BLOCKS).map(|b| chained_hash(prompt, b)).collect();
            proptest::prop_assert_eq!(query(&index, &q), model.query(&q));
        }
        for w in [0u16, 1, 2, 64, 65] {
            index.remove_worker(WorkerSlot(w));
        }
        proptest::prop_assert_eq!(index.stats().distinct_hashes, 0);
    }
}

/// A stored chain is one head however many workers store it, and one more per event that
/// does not land right after its parent's record.
#[test]
fn a_chain_is_one_head() {
    let mut index = index_with(3);
    let chain: Vec<u64> = (1..=40).collect();
    index.store_after(WorkerSlot(0), None, None, &blocks(&chain, 0));
    index.store_after(WorkerSlot(1), None, None, &blocks(&chain[..20], 100));
    assert_eq!(index.holders.len(), 1);
    // Worker 1 goes on where worker 0's chain went: it steps from its parent's record.
    index.store_after(
        WorkerSlot(1),
        Some(SequenceHash(20)),
        Some(EngineBlockId(119)),
        &blocks(&chain[20..], 120),
    );
    assert_eq!(index.holders.len(), 1);
    // A branch after block 20: new records, after another chain's; one head.
    index.store_after(WorkerSlot(2), None, None, &blocks(&chain[..20], 200));
    index.store_after(
        WorkerSlot(2),
        Some(SequenceHash(20)),
        Some(EngineBlockId(219)),
        &blocks(&[900, 901, 902], 220),
    );
    assert_eq!(index.holders.len(), 2);
    assert!(!index.every_hash);
    assert_eq!(
        query(&index, &chain),
        BTreeMap::from([(0, 40), (1, 40), (2, 20)])
    );
    let branch: Vec<u64> = chain[..20].iter().copied().chain([900, 901, 902]).collect();
    assert_eq!(
        query(&index, &branch),
        BTreeMap::from([(0, 20), (1, 20), (2, 23)])
    );
}

/// A block whose parent dies first becomes a head, so that a later store after the parent's
/// new record, and queries through it, still find it (rather than storing it twice).
#[test]
fn a_dying_parent_makes_its_child_a_head() {
    let mut index = index_with(2);
    index.store_after(WorkerSlot(0), None, None, &blocks(&[1, 2, 3, 4], 0));
    assert_eq!(index.holders.len(), 1);
    index.remove(WorkerSlot(0), &[EngineBlockId(1)]); // hash 2 dies; 3 is reached from 2
    assert_eq!(index.holders.len(), 2);
    assert!(index.lookup(3).is_some());
    assert_eq!(query(&index, &[1, 2, 3]), BTreeMap::from([(0, 1)]));
    index.store_after(WorkerSlot(1), None, None, &blocks(&[1], 10));
    index.store_after(
        WorkerSlot(1),
        Some(SequenceHash(1)),
        Some(EngineBlockId(10)),
        &blocks(&[2], 11),
    );
    index.store_after(
        WorkerSlot(1),
        Some(SequenceHash(2)),
        Some(EngineBlockId(11)),
        &blocks(&[3], 12),
    );
    assert_eq!(index.stats().distinct_hashes, 4, "hash 3 has one record");
    assert_eq!(
        query(&index, &[1, 2, 3, 4]),
        BTreeMap::from([(0, 1), (1, 3)])
    );
    // Worker 0 stores 2 again: the chain is whole on it once more.
    index.store_after(
        WorkerSlot(0),
        Some(SequenceHash(1)),
        Some(EngineBlockId(0)),
        &blocks(&[2], 1),
    );
    assert_eq!(
        query(&index, &[1, 2, 3, 4]),
        BTreeMap::from([(0, 4), (1, 3)])
    );
    // Removing a worker's whole chain promotes nothing of it (children go first).
    index.remove_worker(WorkerSlot(1));
    index.remove_worker(WorkerSlot(0));
    assert_eq!(index.stats().distinct_hashes, 0);
}

/// A parent the index cannot find (no engine id, or one the worker does not hold, and not a
/// head) could hide an earlier record of the block: the index keeps every hash from then on,
/// and answers stay right.
#[test]
fn an_unknown_parent_keeps_every_hash() {
    let mut index = index_with(2);
    index.store_after(WorkerSlot(0), None, None, &blocks(&[1, 2, 3, 4], 0));
    assert!(!index.every_hash);
    // Worker 1 stores 3 after 2 without saying which engine id 2 has.
    index.store_after(
        WorkerSlot(1),
        Some(SequenceHash(2)),
        None,
        &blocks(&[3, 4], 10),
    );
    assert!(index.every_hash);
    assert_eq!(index.holders.len(), 4);
    assert_eq!(
        index.stats().distinct_hashes,
        4,
        "3 and 4 are not recorded twice"
    );
    assert_eq!(index.stats().pairs, 6);
    index.store_after(WorkerSlot(1), None, None, &blocks(&[1, 2], 20));
    assert_eq!(
        query(&index, &[1, 2, 3, 4]),
        BTreeMap::from([(0, 4), (1, 4)])
    );
    index.remove_worker(WorkerSlot(0));
    assert_eq!(query(&index, &[1, 2, 3, 4]), BTreeMap::from([(1, 4)]));
    assert!(index.every_hash);
    // Once nothing is held (every worker cleared, as for a resync), heads only again.
    index.clear_worker(WorkerSlot(1));
    assert!(!index.every_hash);
    index.store_after(WorkerSlot(1), None, None, &blocks(&[1, 2, 3], 30));
    index.flush_dead();
    assert_eq!(index.stats().table_hashes, 1, "one chain, one head");
    assert_eq!(query(&index, &[1, 2, 3]), BTreeMap::from([(1, 3)]));
}
