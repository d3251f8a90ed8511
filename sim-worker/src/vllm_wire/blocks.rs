//! The engine's KV events → vLLM's, with the token ids vLLM announces (pure; no I/O).
//!
//! vLLM's `BlockStored` carries each block's token ids, and a Switchyard control plane in
//! front of vLLM computes its own block hashes from them. The engine keeps no token values
//! (its blocks are known by sequence hash only), so the [`BlockBook`] keeps the prompt tokens
//! of every live request, block by block, until the request ends *and* the step's events have
//! been converted; then the request's blocks are forgotten unless another live request shares
//! them.
//!
//! vLLM's own block hash is opaque to Switchyard; the book derives one from the engine's
//! sequence hash ([`vllm_block_hash`]): chained (it names the block and its prefix, as
//! vLLM's does), the same on every worker and across restarts (as vLLM's, so a decode worker's
//! hashes for KV it received equal the prefill worker's), and different from Switchyard's
//! hash, so a consumer that mistook one for the other would fail its tests.
//!
//! What is *not* announced: blocks filled by generated tokens (the simulation generates no
//! token values; its synthetic blocks are never reused by another request either) and any
//! block after one that was not announced in the same chain. Their removals are not announced
//! either, so every event a consumer sees is about a block it was told of.

use std::collections::{HashMap, HashSet};

use switchyard_adapters::vllm::VllmEvent;
use switchyard_engine::Prompt;
use switchyard_protocol::hash::{sequence_hashes, BlockSize, HashSeed, SequenceHash};
use switchyard_protocol::kv::{EngineBlockId, KvEvent, StoredBlock};

/// vLLM's `medium` for blocks in accelerator memory, which is where the simulated cache is.
pub const MEDIUM: &str = "GPU";

/// The vLLM-style hash the sim publishes for the block Switchyard calls `seq` (see the module
/// docs): splitmix64's finaliser over the sequence hash, salted.
pub fn vllm_block_hash(seq: SequenceHash) -> u64 {
    let mut z = seq.0 ^ 0x5157_4954_4348_5944; // "SWITCHYD": any fixed salt works.
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A prompt block some live request has.
#[derive(Debug)]
struct LiveBlock {
    tokens: Box<[u32]>,
    /// Live requests whose prompt has it.
    refs: u32,
}

/// Tokens of live requests' blocks, and which blocks the consumer was told of.
#[derive(Debug)]
pub struct BlockBook {
    block_size: BlockSize,
    seed: HashSeed,
    live: HashMap<SequenceHash, LiveBlock>,
    requests: HashMap<u64, Vec<SequenceHash>>,
    /// Requests that ended during the current step; forgotten at its end.
    ended: Vec<u64>,
    /// Announced blocks, by the engine's id (removals name blocks by it).
    announced: HashMap<EngineBlockId, SequenceHash>,
    announced_hashes: HashSet<SequenceHash>,
}

impl BlockBook {
    /// A book for an engine hashing with `block_size` and `seed`.
    pub fn new(block_size: BlockSize, seed: HashSeed) -> Self {
        BlockBook {
            block_size,
            seed,
            live: HashMap::new(),
            requests: HashMap::new(),
            ended: Vec::new(),
            announced: HashMap::new(),
            announced_hashes: HashSet::new(),
        }
    }

    /// Request `id` starts with `prompt`: keep its full blocks' tokens. A prompt known only by
    /// hashes (trace replay) has none to keep; its blocks will not be announced.
    pub fn request_submitted(&mut self, id: u64, prompt: &Prompt) {
        let Prompt::Tokens(tokens) = prompt else {
            return;
        };
        let hashes = sequence_hashes(tokens, self.block_size, self.seed);
        let size = self.block_size.get() as usize;
        for (hash, chunk) in hashes.iter().zip(tokens.chunks_exact(size)) {
            self.live
                .entry(*hash)
                .or_insert_with(|| LiveBlock {
                    tokens: chunk.into(),
                    refs: 0,
                })
                .refs += 1;
        }
        self.requests.insert(id, hashes);
    }

    /// Request `id` ended; its tokens stay until [`BlockBook::end_step`], so the stores of the
    /// step it ended in are still announced with them.
    pub fn request_ended(&mut self, id: u64) {
        self.ended.push(id);
    }

    /// The vLLM events for one step's engine events, in order.
    pub fn convert(&mut self, events: &[KvEvent]) -> Vec<VllmEvent> {
        let mut out = Vec::new();
        for event in events {
            match event {
                KvEvent::Stored { parent, blocks, .. } => out.extend(self.stored(*parent, blocks)),
                KvEvent::Removed { block_ids } => {
                    // vLLM sends one BlockRemoved per evicted block.
                    for id in block_ids {
                        if let Some(seq) = self.announced.remove(id) {
                            self.announced_hashes.remove(&seq);
                            out.push(VllmEvent::BlockRemoved {
                                block_hashes: vec![vllm_block_hash(seq)],
                                medium: Some(MEDIUM.to_owned()),
                                group_idx: Some(0),
                            });
                        }
                    }
                }
                KvEvent::Cleared => {
                    self.announced.clear();
                    self.announced_hashes.clear();
                    out.push(VllmEvent::AllBlocksCleared);
                }
            }
        }
        out
    }

    /// Forgets the tokens of requests that ended during the step (after [`Self::convert`]).
    pub fn end_step(&mut self) {
        for id in std::mem::take(&mut self.ended) {
            for hash in self.requests.remove(&id).unwrap_or_default() {
                if let Some(block) = self.live.get_mut(&hash) {
                    block.refs = block.refs.saturating_sub(1);
                    if block.refs == 0 {
                        self.live.remove(&hash);
                    }
                }
            }
        }
    }

    /// Distinct prompt blocks whose tokens are kept (live requests').
    pub fn live_blocks(&self) -> usize {
        self.live.len()
    }

    /// Blocks announced and not yet removed.
    pub fn announced_blocks(&self) -> usize {
        self.announced.len()
    }

    /// The announced part of one engine store: the longest prefix of the chain whose tokens
    /// are known, if it continues an announced block (or starts a prompt).
    fn stored(
        &mut self,
        parent: Option<SequenceHash>,
        blocks: &[StoredBlock],
    ) -> Option<VllmEvent> {
        if parent.is_some_and(|p| !self.announced_hashes.contains(&p)) {
            return None;
        }
        let mut block_hashes = Vec::new();
        let mut token_ids = Vec::new();
        for block in blocks {
            let Some(live) = self.live.get(&block.seq_hash) else {
                break;
            };
            token_ids.extend_from_slice(&live.tokens);
            block_hashes.push(vllm_block_hash(block.seq_hash));
            self.announced.insert(block.block_id, block.seq_hash);
            self.announced_hashes.insert(block.seq_hash);
        }
        if block_hashes.is_empty() {
            return None;
        }
        Some(VllmEvent::BlockStored {
            block_hashes,
            parent: parent.map(vllm_block_hash),
            token_ids,
            block_size: self.block_size.get(),
            lora_id: None,
            medium: Some(MEDIUM.to_owned()),
            group_idx: Some(0),
            hashed_with_extra_keys: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: u32 = 4;

    fn book() -> BlockBook {
        BlockBook::new(BlockSize::try_new(BS).unwrap(), HashSeed::default())
    }

    fn hashes(tokens: &[u32]) -> Vec<SequenceHash> {
        sequence_hashes(tokens, BlockSize::try_new(BS).unwrap(), HashSeed::default())
    }

    fn stored(parent: Option<SequenceHash>, blocks: &[(SequenceHash, u64)]) -> KvEvent {
        KvEvent::Stored {
            parent,
            parent_block_id: None,
            blocks: blocks
                .iter()
                .map(|&(seq_hash, id)| StoredBlock {
                    seq_hash,
                    block_id: EngineBlockId(id),
                })
                .collect(),
            block_size: BS,
        }
    }

    #[test]
    fn a_prompt_is_announced_with_its_tokens_and_chained_hashes() {
        let tokens: Vec<u32> = (0..10).collect(); // 2 full blocks and a partial one
        let h = hashes(&tokens);
        let mut b = book();
        b.request_submitted(1, &Prompt::Tokens(tokens.clone()));
        let first = b.convert(&[stored(None, &[(h[0], 1)])]);
        let second = b.convert(&[stored(Some(h[0]), &[(h[1], 2)])]);
        assert_eq!(
            first,
            [VllmEvent::BlockStored {
                block_hashes: vec![vllm_block_hash(h[0])],
                parent: None,
                token_ids: tokens[..4].to_vec(),
                block_size: BS,
                lora_id: None,
                medium: Some("GPU".into()),
                group_idx: Some(0),
                hashed_with_extra_keys: false,
            }]
        );
        let VllmEvent::BlockStored {
            parent, token_ids, ..
        } = &second[0]
        else {
            panic!("{second:?}")
        };
        assert_eq!(*parent, Some(vllm_block_hash(h[0])));
        assert_eq!(token_ids, &tokens[4..8]);
        assert_ne!(vllm_block_hash(h[0]), h[0].0);
    }

    #[test]
    fn tokens_outlive_the_request_until_the_step_ends() {
        let tokens: Vec<u32> = (0..8).collect();
        let h = hashes(&tokens);
        let mut b = book();
        b.request_submitted(1, &Prompt::Tokens(tokens.clone()));
        b.request_ended(1);
        assert_eq!(b.convert(&[stored(None, &[(h[0], 1), (h[1], 2)])]).len(), 1);
        b.end_step();
        assert_eq!(b.live_blocks(), 0);
        assert_eq!(b.announced_blocks(), 2);
    }

    #[test]
    fn shared_blocks_stay_while_any_request_has_them() {
        let tokens: Vec<u32> = (0..8).collect();
        let mut b = book();
        b.request_submitted(1, &Prompt::Tokens(tokens.clone()));
        b.request_submitted(2, &Prompt::Tokens(tokens[..4].to_vec()));
        b.request_ended(1);
        b.end_step();
        assert_eq!(b.live_blocks(), 1);
        b.request_ended(2);
        b.end_step();
        assert_eq!(b.live_blocks(), 0);
    }

    #[test]
    fn generated_blocks_and_their_descendants_are_not_announced() {
        let tokens: Vec<u32> = (0..4).collect();
        let h = hashes(&tokens);
        let (generated, next) = (SequenceHash(77), SequenceHash(78));
        let mut b = book();
        b.request_submitted(1, &Prompt::Tokens(tokens));
        let out = b.convert(&[stored(None, &[(h[0], 1), (generated, 2)])]);
        let VllmEvent::BlockStored { block_hashes, .. } = &out[0] else {
            panic!("{out:?}")
        };
        assert_eq!(block_hashes.len(), 1);
        assert!(b
            .convert(&[stored(Some(generated), &[(next, 3)])])
            .is_empty());
        // Removing a block never announced says nothing; an announced one, one event each.
        let removed = b.convert(&[KvEvent::Removed {
            block_ids: vec![EngineBlockId(2), EngineBlockId(1)],
        }]);
        assert_eq!(
            removed,
            [VllmEvent::BlockRemoved {
                block_hashes: vec![vllm_block_hash(h[0])],
                medium: Some("GPU".into()),
                group_idx: Some(0),
            }]
        );
        assert_eq!(b.announced_blocks(), 0);
        assert_eq!(
            b.convert(&[KvEvent::Cleared]),
            [VllmEvent::AllBlocksCleared]
        );
    }
}
