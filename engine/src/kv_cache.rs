//! The paged KV cache with prefix caching (simulated: blocks hold no data, only bookkeeping).
//!
//! Like vLLM v1's block pool: a fixed number of physical blocks; a block whose KV is fully
//! computed is registered under its sequence hash so later requests with the same prefix
//! reuse it; a block nobody references sits in the free queue *and* stays reusable until
//! allocation pops it from the queue's head, which evicts it (LRU: freed blocks join the
//! tail, a request's blocks in reverse order so its tail goes first). Every registration and
//! eviction is recorded as a [`KvEvent`] for the worker to publish.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use switchyard_protocol::hash::SequenceHash;
use switchyard_protocol::kv::{EngineBlockId, KvEvent, StoredBlock};

/// Marks "no block" in the intrusive free list.
const NIL: u32 = u32::MAX;

/// Sequence hashes are already 64-bit hashes, so one multiply spreads them enough (and keeps
/// callers' small synthetic ids, as trace replays use, from clustering in the table).
#[derive(Default)]
pub(crate) struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(26)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A map keyed by already-hashed values.
pub(crate) type IdentityMap<K, V> = HashMap<K, V, BuildHasherDefault<IdentityHasher>>;

/// What the cache knows about one physical block.
#[derive(Debug, Clone, Copy)]
struct Block {
    /// Requests using it (running or held).
    ref_count: u32,
    /// Free-queue neighbours (valid while `ref_count == 0`).
    prev: u32,
    next: u32,
    /// Registered content, if the block is a reusable prefix block.
    cached: Option<CachedContent>,
}

/// The identity of a registered block.
#[derive(Debug, Clone, Copy)]
struct CachedContent {
    hash: SequenceHash,
    parent: Option<SequenceHash>,
    engine_id: EngineBlockId,
    /// Position in its sequence (0 = first block), so dumps can list parents first.
    depth: u32,
}

/// The block pool.
#[derive(Debug)]
pub(crate) struct KvCache {
    block_size: u32,
    blocks: Vec<Block>,
    free_head: u32,
    free_tail: u32,
    free_len: u64,
    /// Unreferenced blocks that are registered (reusable), a subset of the free queue.
    cached_free: u64,
    by_hash: IdentityMap<SequenceHash, u32>,
    next_engine_id: u64,
    events: Vec<KvEvent>,
}

impl KvCache {
    /// A pool of `capacity` empty blocks of `block_size` tokens.
    pub(crate) fn new(capacity: u32, block_size: u32) -> Self {
        let blocks = (0..capacity)
            .map(|i| Block {
                ref_count: 0,
                prev: if i == 0 { NIL } else { i - 1 },
                next: if i + 1 == capacity { NIL } else { i + 1 },
                cached: None,
            })
            .collect();
        KvCache {
            block_size,
            blocks,
            free_head: if capacity == 0 { NIL } else { 0 },
            free_tail: capacity.checked_sub(1).unwrap_or(NIL),
            free_len: u64::from(capacity),
            cached_free: 0,
            by_hash: IdentityMap::default(),
            next_engine_id: 1,
            events: Vec::new(),
        }
    }

    /// Total blocks.
    pub(crate) fn capacity(&self) -> u64 {
        self.blocks.len() as u64
    }

    /// Blocks referenced by some request.
    pub(crate) fn used(&self) -> u64 {
        self.capacity() - self.free_len
    }

    /// Blocks that can be handed out (empty or evictable).
    pub(crate) fn free(&self) -> u64 {
        self.free_len
    }

    /// Unreferenced blocks still holding reusable prefix KV.
    pub(crate) fn cached_free(&self) -> u64 {
        self.cached_free
    }

    /// How many leading `hashes` are cached.
    pub(crate) fn match_prefix(&self, hashes: &[SequenceHash]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.by_hash.contains_key(h))
            .count()
    }

    /// Of the first `n` leading `hashes` (all cached), how many sit unreferenced in the free
    /// queue: taking them shrinks what [`KvCache::free`] can hand out.
    pub(crate) fn unreferenced_among(&self, hashes: &[SequenceHash]) -> u64 {
        hashes
            .iter()
            .filter_map(|h| self.by_hash.get(h))
            .filter(|&&b| self.blocks[b as usize].ref_count == 0)
            .count() as u64
    }

    /// Takes a reference on the cached block `hash` (which must be cached).
    pub(crate) fn acquire_cached(&mut self, hash: SequenceHash) -> Option<u32> {
        let b = *self.by_hash.get(&hash)?;
        if self.blocks[b as usize].ref_count == 0 {
            self.unlink(b);
            self.cached_free -= 1;
        }
        self.blocks[b as usize].ref_count += 1;
        Some(b)
    }

    /// Hands out the least recently freed block, evicting its cached content if any.
    pub(crate) fn allocate(&mut self) -> Option<u32> {
        let b = self.free_head;
        if b == NIL {
            return None;
        }
        self.unlink(b);
        if let Some(content) = self.blocks[b as usize].cached.take() {
            self.cached_free -= 1;
            self.by_hash.remove(&content.hash);
            self.record_removed(content.engine_id);
        }
        self.blocks[b as usize].ref_count = 1;
        Some(b)
    }

    /// Whether some block is registered as `hash`.
    pub(crate) fn holds(&self, hash: SequenceHash) -> bool {
        self.by_hash.contains_key(&hash)
    }

    /// Registers the computed block `b` as `hash` (child of `parent`, at `depth`) so later
    /// requests can reuse it. A block whose hash is already cached elsewhere (two requests
    /// computed the same prefix at once) stays anonymous, so every hash names one block.
    pub(crate) fn register(
        &mut self,
        b: u32,
        hash: SequenceHash,
        parent: Option<SequenceHash>,
        depth: u32,
    ) {
        if self.blocks[b as usize].cached.is_some() || self.by_hash.contains_key(&hash) {
            return;
        }
        let engine_id = EngineBlockId(self.next_engine_id);
        self.next_engine_id += 1;
        self.blocks[b as usize].cached = Some(CachedContent {
            hash,
            parent,
            engine_id,
            depth,
        });
        self.by_hash.insert(hash, b);
        // The parent's engine id: of the block registered under its hash (this request's
        // block, or the one it shares a hash with).
        let parent_block_id = parent
            .and_then(|p| self.by_hash.get(&p))
            .and_then(|&pb| self.blocks[pb as usize].cached)
            .map(|c| c.engine_id);
        self.record_stored(
            parent,
            parent_block_id,
            StoredBlock {
                seq_hash: hash,
                block_id: engine_id,
            },
        );
    }

    /// Drops one reference from each block; blocks nobody uses join the free queue's tail in
    /// reverse order (a sequence's last blocks are evicted first, its shared head last).
    pub(crate) fn release(&mut self, blocks: &[u32]) {
        for &b in blocks.iter().rev() {
            let block = &mut self.blocks[b as usize];
            debug_assert!(block.ref_count > 0, "releasing a free block");
            block.ref_count = block.ref_count.saturating_sub(1);
            if block.ref_count == 0 {
                if block.cached.is_some() {
                    self.cached_free += 1;
                }
                self.push_tail(b);
            }
        }
    }

    /// Takes the events recorded since the last call.
    pub(crate) fn drain_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }

    /// Forgets the recorded events, keeping the buffer's capacity.
    pub(crate) fn discard_events(&mut self) {
        self.events.clear();
    }

    /// Every registered block as `(parent, block)`, parents before children.
    pub(crate) fn dump(&self) -> Vec<(Option<SequenceHash>, StoredBlock)> {
        let mut cached: Vec<CachedContent> = self.blocks.iter().filter_map(|b| b.cached).collect();
        cached.sort_by_key(|c| (c.depth, c.engine_id));
        cached
            .into_iter()
            .map(|c| {
                (
                    c.parent,
                    StoredBlock {
                        seq_hash: c.hash,
                        block_id: c.engine_id,
                    },
                )
            })
            .collect()
    }

    fn record_stored(
        &mut self,
        parent: Option<SequenceHash>,
        parent_block_id: Option<EngineBlockId>,
        block: StoredBlock,
    ) {
        // Extend the previous event when this block continues its chain, as vLLM batches a
        // request's blocks into one BlockStored.
        if let Some(KvEvent::Stored { blocks, .. }) = self.events.last_mut() {
            if parent.is_some() && blocks.last().map(|b| b.seq_hash) == parent {
                blocks.push(block);
                return;
            }
        }
        self.events.push(KvEvent::Stored {
            parent,
            parent_block_id,
            blocks: vec![block],
            block_size: self.block_size,
        });
    }

    fn record_removed(&mut self, id: EngineBlockId) {
        if let Some(KvEvent::Removed { block_ids }) = self.events.last_mut() {
            block_ids.push(id);
            return;
        }
        self.events.push(KvEvent::Removed {
            block_ids: vec![id],
        });
    }

    fn unlink(&mut self, b: u32) {
        let Block { prev, next, .. } = self.blocks[b as usize];
        if prev == NIL {
            self.free_head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.free_tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        self.free_len -= 1;
    }

    fn push_tail(&mut self, b: u32) {
        let tail = self.free_tail;
        let block = &mut self.blocks[b as usize];
        block.prev = tail;
        block.next = NIL;
        if tail == NIL {
            self.free_head = b;
        } else {
            self.blocks[tail as usize].next = b;
        }
        self.free_tail = b;
        self.free_len += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(n: u64) -> SequenceHash {
        SequenceHash(n)
    }

    #[test]
    fn freed_blocks_stay_reusable_until_evicted_lru() {
        let mut kv = KvCache::new(3, 64);
        let a = kv.allocate().unwrap();
        let b = kv.allocate().unwrap();
        kv.register(a, h(1), None, 0);
        kv.register(b, h(2), Some(h(1)), 1);
        kv.release(&[a, b]);
        assert_eq!(kv.used(), 0);
        assert_eq!(kv.cached_free(), 2);
        assert_eq!(kv.match_prefix(&[h(1), h(2)]), 2);
        // The never-used block goes first, then the chain's tail (b), then its head (a).
        let c = kv.allocate().unwrap();
        assert!(c != a && c != b);
        assert_eq!(kv.allocate(), Some(b));
        assert_eq!(kv.match_prefix(&[h(1), h(2)]), 1);
        let events = kv.drain_events();
        assert!(
            matches!(&events[0], KvEvent::Stored { blocks, parent: None, .. } if blocks.len() == 2)
        );
        assert!(matches!(&events[1], KvEvent::Removed { block_ids } if block_ids.len() == 1));
    }

    #[test]
    fn acquiring_a_cached_block_protects_it_from_eviction() {
        let mut kv = KvCache::new(2, 64);
        let a = kv.allocate().unwrap();
        kv.register(a, h(7), None, 0);
        kv.release(&[a]);
        assert_eq!(kv.acquire_cached(h(7)), Some(a));
        assert_eq!(kv.cached_free(), 0);
        let other = kv.allocate().unwrap();
        assert_ne!(other, a);
        assert_eq!(kv.allocate(), None);
        kv.release(&[a, other]);
        assert_eq!(kv.used(), 0);
    }

    #[test]
    fn duplicate_hash_stays_anonymous() {
        let mut kv = KvCache::new(2, 64);
        let a = kv.allocate().unwrap();
        let b = kv.allocate().unwrap();
        kv.register(a, h(9), None, 0);
        kv.register(b, h(9), None, 0);
        assert_eq!(kv.dump().len(), 1);
        kv.release(&[b]);
        assert_eq!(kv.cached_free(), 0);
    }
}
