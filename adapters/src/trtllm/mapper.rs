//! TensorRT-LLM events → the events of the vLLM adapter's
//! [`HashMapper`](crate::vllm::mapper::HashMapper), which keys blocks by Switchyard sequence
//! hashes computed from their token ids.
//!
//! Both engines name a block by a hash chained over its prefix that the router cannot
//! compute, and both send the token ids with it; so one mapper serves both, and this module
//! only reshapes TensorRT-LLM's events:
//! - `stored`: a chain after `parent_hash`, each block with its own tokens → one
//!   `BlockStored` with the tokens flattened. TensorRT-LLM also announces the last, partly
//!   filled block of a sequence; a router matches whole blocks only, so the chain stops before
//!   it ([`Converted::partial_blocks`]). Its later removal names a hash the mapper never saw,
//!   which the mapper ignores. A block that holds *more* tokens than the block size means the
//!   engine's block size is not the pool file's: refused.
//! - `removed` → `BlockRemoved`.
//! - `created` (a new cache: the engine started) → `AllBlocksCleared`.
//! - `updated` (a block's priority or cache level changed; it is still cached) and unknown
//!   types → nothing.
//!
//! Blocks whose tokens carry extra ids or that list `mm_keys` (multimodal inputs), and blocks
//! with a `cache_salt`, are marked as hashed with more than their token ids, so the mapper
//! keeps them out of the index. LoRA adapters are not in
//! TensorRT-LLM's events yet (its serializer leaves `lora_id` out): blocks computed with one
//! look like plain blocks.

use switchyard_protocol::hash::BlockSize;

use super::event::{TrtllmBlock, TrtllmData};
use crate::vllm::mapper::MapError;
use crate::vllm::VllmEvent;

/// What one event becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Converted {
    /// The event for the mapper, if any.
    pub event: Option<VllmEvent>,
    /// Partly filled blocks left out of a `stored` chain.
    pub partial_blocks: usize,
}

/// Converts `data` for a worker whose blocks hold `block_size` tokens.
///
/// # Errors
/// [`MapError::BlockSizeMismatch`] when a stored block holds more tokens than `block_size`,
/// or a block before the last is not full (the engine's block size is not the worker's).
pub fn to_mapper_event(data: &TrtllmData, block_size: BlockSize) -> Result<Converted, MapError> {
    let converted = |event| Converted {
        event: Some(event),
        partial_blocks: 0,
    };
    match data {
        TrtllmData::Stored {
            parent_hash,
            blocks,
        } => stored(*parent_hash, blocks, block_size),
        TrtllmData::Removed { block_hashes } => Ok(converted(VllmEvent::BlockRemoved {
            block_hashes: block_hashes.clone(),
            medium: None,
            group_idx: None,
        })),
        TrtllmData::Created { .. } => Ok(converted(VllmEvent::AllBlocksCleared)),
        TrtllmData::Updated { .. } | TrtllmData::Unknown { .. } => Ok(Converted {
            event: None,
            partial_blocks: 0,
        }),
    }
}

fn stored(
    parent: Option<u64>,
    blocks: &[TrtllmBlock],
    block_size: BlockSize,
) -> Result<Converted, MapError> {
    let size = usize::try_from(block_size.get()).unwrap_or(usize::MAX);
    let full = blocks
        .iter()
        .take_while(|b| b.token_ids.len() == size)
        .count();
    let (whole, rest) = blocks.split_at(full);
    if let Some(odd) = rest
        .iter()
        .enumerate()
        .find(|(i, b)| b.token_ids.len() > size || i.saturating_add(1) < rest.len())
    {
        return Err(MapError::BlockSizeMismatch {
            expected: block_size.get(),
            got: u32::try_from(odd.1.token_ids.len()).unwrap_or(u32::MAX),
        });
    }
    let event = (!whole.is_empty()).then(|| VllmEvent::BlockStored {
        block_hashes: whole.iter().map(|b| b.block_hash).collect(),
        parent,
        token_ids: whole
            .iter()
            .flat_map(|b| b.token_ids.iter().copied())
            .collect(),
        block_size: block_size.get(),
        lora_id: None,
        medium: None,
        group_idx: None,
        hashed_with_extra_keys: whole.iter().any(|b| b.hashed_with_extra_keys),
    });
    Ok(Converted {
        event,
        partial_blocks: rest.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(hash: u64, tokens: std::ops::Range<u32>) -> TrtllmBlock {
        TrtllmBlock {
            block_hash: hash,
            token_ids: tokens.collect(),
            hashed_with_extra_keys: false,
        }
    }

    fn four() -> BlockSize {
        BlockSize::try_new(4).unwrap()
    }

    #[test]
    fn full_blocks_become_one_chain_and_the_partial_tail_is_left_out() {
        let data = TrtllmData::Stored {
            parent_hash: Some(9),
            blocks: vec![block(1, 0..4), block(2, 4..8), block(3, 8..10)],
        };
        let converted = to_mapper_event(&data, four()).unwrap();
        assert_eq!(converted.partial_blocks, 1);
        assert_eq!(
            converted.event,
            Some(VllmEvent::BlockStored {
                block_hashes: vec![1, 2],
                parent: Some(9),
                token_ids: (0..8).collect(),
                block_size: 4,
                lora_id: None,
                medium: None,
                group_idx: None,
                hashed_with_extra_keys: false,
            })
        );
        let only_partial = TrtllmData::Stored {
            parent_hash: None,
            blocks: vec![block(3, 0..2)],
        };
        let converted = to_mapper_event(&only_partial, four()).unwrap();
        assert_eq!((converted.event, converted.partial_blocks), (None, 1));
    }

    #[test]
    fn another_block_size_is_refused() {
        let larger = TrtllmData::Stored {
            parent_hash: None,
            blocks: vec![block(1, 0..8)],
        };
        assert_eq!(
            to_mapper_event(&larger, four()),
            Err(MapError::BlockSizeMismatch {
                expected: 4,
                got: 8
            })
        );
        let short_in_the_middle = TrtllmData::Stored {
            parent_hash: None,
            blocks: vec![block(1, 0..2), block(2, 2..4)],
        };
        assert!(to_mapper_event(&short_in_the_middle, four()).is_err());
    }

    #[test]
    fn removals_clears_and_updates() {
        let removed = TrtllmData::Removed {
            block_hashes: vec![1, 2],
        };
        assert!(matches!(
            to_mapper_event(&removed, four()).unwrap().event,
            Some(VllmEvent::BlockRemoved { .. })
        ));
        let created = TrtllmData::Created {
            num_blocks_per_cache_level: vec![10],
        };
        assert_eq!(
            to_mapper_event(&created, four()).unwrap().event,
            Some(VllmEvent::AllBlocksCleared)
        );
        let updated = TrtllmData::Updated { block_hash: None };
        assert_eq!(to_mapper_event(&updated, four()).unwrap().event, None);
    }
}
