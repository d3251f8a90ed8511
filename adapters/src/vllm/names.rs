//! vLLM's names on the wire: the event type tags and the map keys of each event, in the order
//! vLLM 0.32 writes them. The decoder reads by these names and the encoder writes them, so
//! the two cannot drift apart.

/// Tag of a store event.
pub(crate) const BLOCK_STORED: &str = "BlockStored";
/// Tag of a removal event.
pub(crate) const BLOCK_REMOVED: &str = "BlockRemoved";
/// Tag of a clear event.
pub(crate) const ALL_BLOCKS_CLEARED: &str = "AllBlocksCleared";

/// Map key naming the event type (vLLM 0.32's map form).
pub(crate) const TYPE: &str = "type";
pub(crate) const BLOCK_HASHES: &str = "block_hashes";
pub(crate) const PARENT_BLOCK_HASH: &str = "parent_block_hash";
pub(crate) const TOKEN_IDS: &str = "token_ids";
pub(crate) const BLOCK_SIZE: &str = "block_size";
pub(crate) const LORA_ID: &str = "lora_id";
pub(crate) const MEDIUM: &str = "medium";
pub(crate) const LORA_NAME: &str = "lora_name";
pub(crate) const EXTRA_KEYS: &str = "extra_keys";
pub(crate) const GROUP_IDX: &str = "group_idx";
pub(crate) const KV_CACHE_SPEC_KIND: &str = "kv_cache_spec_kind";

/// The only `kv_cache_spec_kind` Switchyard models (no sliding-window or Mamba groups).
pub(crate) const FULL_ATTENTION: &str = "full_attention";

/// Keys of a `BlockStored` map, in vLLM 0.32's order. `lora_name` is covered by `lora_id` and
/// `extra_keys`, `kv_cache_spec_kind` by `group_idx`: read past, but written.
pub(crate) const STORED_KEYS: &[&str] = &[
    TYPE,
    BLOCK_HASHES,
    PARENT_BLOCK_HASH,
    TOKEN_IDS,
    BLOCK_SIZE,
    LORA_ID,
    MEDIUM,
    LORA_NAME,
    EXTRA_KEYS,
    GROUP_IDX,
    KV_CACHE_SPEC_KIND,
];
/// Keys of a `BlockRemoved` map, in vLLM 0.32's order.
pub(crate) const REMOVED_KEYS: &[&str] = &[TYPE, BLOCK_HASHES, MEDIUM, GROUP_IDX];
/// Keys of an `AllBlocksCleared` map.
pub(crate) const CLEARED_KEYS: &[&str] = &[TYPE];

/// Items of the older tag-first array form of each event type, tag included:
/// `[tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
/// extra_keys, group_idx]`, `[tag, block_hashes, medium, group_idx]`, `[tag]`.
pub(crate) const STORED_ITEMS: usize = 10;
pub(crate) const REMOVED_ITEMS: usize = 4;
pub(crate) const CLEARED_ITEMS: usize = 1;
