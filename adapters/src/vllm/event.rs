//! One event of a batch, in either encoding vLLM has used:
//! - vLLM 0.32: a map keyed by field name, with `"type"` naming the event; fields at their
//!   defaults may be omitted;
//! - older vLLM: a tag-first array, `["BlockStored", block_hashes, parent_block_hash,
//!   token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx]`,
//!   `["BlockRemoved", block_hashes, medium, group_idx]`, `["AllBlocksCleared"]`; the oldest
//!   versions stop before `medium`, later ones before `group_idx`. An item in `group_idx`'s
//!   place is read as the group only when it is an integer: publishers that mirror the array
//!   form are not all strict about what follows `extra_keys`.
//!   SGLang writes the same arrays up to `medium`; for a salted prompt its `BlockStored`
//!   carries a map `{"cache_salt": ...}` where vLLM has `lora_name` (a string or nil), which
//!   marks the blocks as hashed with more than their token ids. Its pages under speculative
//!   decoding give each token as a pair with its successor ([`fields::token_ids`]).
//!
//! Both are read into the same field references and converted by the same code.

use rmpv::ValueRef;

use super::batch::{Skipped, VllmEvent};
use super::error::{EventError, Kind};
use super::fields;
use super::frame::Limits;
use super::names::{
    ALL_BLOCKS_CLEARED, BLOCK_HASHES, BLOCK_REMOVED, BLOCK_SIZE, BLOCK_STORED, CLEARED_ITEMS,
    CLEARED_KEYS, EXTRA_KEYS, GROUP_IDX, LORA_ID, MEDIUM, PARENT_BLOCK_HASH, REMOVED_ITEMS,
    REMOVED_KEYS, STORED_ITEMS, STORED_KEYS, TOKEN_IDS, TYPE,
};

/// The raw fields of a `BlockStored`, whichever the encoding.
struct StoredFields<'v, 'a> {
    block_hashes: Option<&'v ValueRef<'a>>,
    parent: Option<&'v ValueRef<'a>>,
    token_ids: Option<&'v ValueRef<'a>>,
    block_size: Option<&'v ValueRef<'a>>,
    lora_id: Option<&'v ValueRef<'a>>,
    medium: Option<&'v ValueRef<'a>>,
    extra_keys: Option<&'v ValueRef<'a>>,
    group_idx: Option<&'v ValueRef<'a>>,
    /// SGLang's `metadata` in the array form (vLLM's `lora_name` place), if a map.
    sglang_metadata: Option<&'v ValueRef<'a>>,
}

/// The raw fields of a `BlockRemoved`, whichever the encoding.
struct RemovedFields<'v, 'a> {
    block_hashes: Option<&'v ValueRef<'a>>,
    medium: Option<&'v ValueRef<'a>>,
    group_idx: Option<&'v ValueRef<'a>>,
}

/// Decodes the event at position `index`; `Ok(None)` for an event type we do not know (noted
/// in `skipped`).
pub(crate) fn decode(
    index: usize,
    value: &ValueRef<'_>,
    limits: &Limits,
    skipped: &mut Vec<Skipped>,
) -> Result<Option<VllmEvent>, EventError> {
    match value {
        ValueRef::Map(entries) => from_map(index, entries, limits, skipped),
        ValueRef::Array(items) => from_array(index, items, limits, skipped),
        other => Err(EventError::NotMapOrArray {
            got: Kind::of(other),
        }),
    }
}

fn tag<'v>(value: &'v ValueRef<'_>) -> Result<&'v str, EventError> {
    fields::as_str(value).ok_or(EventError::TypeNotString {
        got: Kind::of(value),
    })
}

fn unknown_type(index: usize, tag: &str, skipped: &mut Vec<Skipped>) -> Option<VllmEvent> {
    skipped.push(Skipped::UnknownEventType {
        event: index,
        tag: fields::note_text(tag),
    });
    None
}

// === map form (vLLM 0.32) ===

/// The value under `key`, if present; a key given twice is an error (which one would vLLM
/// have meant?).
fn field<'v, 'a>(
    entries: &'v [(ValueRef<'a>, ValueRef<'a>)],
    key: &'static str,
) -> Result<Option<&'v ValueRef<'a>>, EventError> {
    let mut found = None;
    for (k, v) in entries {
        if fields::as_str(k) == Some(key) {
            if found.is_some() {
                return Err(EventError::DuplicateField { field: key });
            }
            found = Some(v);
        }
    }
    Ok(found)
}

fn note_unknown_keys(
    index: usize,
    entries: &[(ValueRef<'_>, ValueRef<'_>)],
    known: &[&str],
    skipped: &mut Vec<Skipped>,
) {
    for (k, _) in entries {
        let field = match fields::as_str(k) {
            Some(name) if known.contains(&name) => continue,
            Some(name) => fields::note_text(name),
            None => fields::describe_key(k),
        };
        skipped.push(Skipped::UnknownField {
            event: index,
            field,
        });
    }
}

fn from_map(
    index: usize,
    entries: &[(ValueRef<'_>, ValueRef<'_>)],
    limits: &Limits,
    skipped: &mut Vec<Skipped>,
) -> Result<Option<VllmEvent>, EventError> {
    let tag = tag(field(entries, TYPE)?.ok_or(EventError::MissingType)?)?;
    let known = match tag {
        BLOCK_STORED => STORED_KEYS,
        BLOCK_REMOVED => REMOVED_KEYS,
        ALL_BLOCKS_CLEARED => CLEARED_KEYS,
        other => return Ok(unknown_type(index, other, skipped)),
    };
    note_unknown_keys(index, entries, known, skipped);
    let event = match tag {
        BLOCK_STORED => stored(
            StoredFields {
                block_hashes: field(entries, BLOCK_HASHES)?,
                parent: field(entries, PARENT_BLOCK_HASH)?,
                token_ids: field(entries, TOKEN_IDS)?,
                block_size: field(entries, BLOCK_SIZE)?,
                lora_id: field(entries, LORA_ID)?,
                medium: field(entries, MEDIUM)?,
                extra_keys: field(entries, EXTRA_KEYS)?,
                group_idx: field(entries, GROUP_IDX)?,
                sglang_metadata: None,
            },
            limits,
        )?,
        BLOCK_REMOVED => removed(
            RemovedFields {
                block_hashes: field(entries, BLOCK_HASHES)?,
                medium: field(entries, MEDIUM)?,
                group_idx: field(entries, GROUP_IDX)?,
            },
            limits,
        )?,
        _ => VllmEvent::AllBlocksCleared,
    };
    Ok(Some(event))
}

// === array form (older vLLM) ===

fn from_array(
    index: usize,
    items: &[ValueRef<'_>],
    limits: &Limits,
    skipped: &mut Vec<Skipped>,
) -> Result<Option<VllmEvent>, EventError> {
    let tag = tag(items.first().ok_or(EventError::MissingType)?)?;
    let known_items = match tag {
        BLOCK_STORED => STORED_ITEMS,
        BLOCK_REMOVED => REMOVED_ITEMS,
        ALL_BLOCKS_CLEARED => CLEARED_ITEMS,
        other => return Ok(unknown_type(index, other, skipped)),
    };
    if let Some(count) = items.len().checked_sub(known_items).filter(|&n| n > 0) {
        skipped.push(Skipped::ExtraArrayItems {
            event: index,
            count,
        });
    }
    let event = match tag {
        BLOCK_STORED => stored(
            StoredFields {
                block_hashes: items.get(1),
                parent: items.get(2),
                token_ids: items.get(3),
                block_size: items.get(4),
                lora_id: items.get(5),
                medium: items.get(6),
                // items[7] is vLLM's lora_name, covered by lora_id and extra_keys, or
                // SGLang's metadata (a map).
                extra_keys: items.get(8),
                group_idx: group_item(items.get(9)),
                sglang_metadata: items.get(7).filter(|v| matches!(v, ValueRef::Map(_))),
            },
            limits,
        )?,
        BLOCK_REMOVED => removed(
            RemovedFields {
                block_hashes: items.get(1),
                medium: items.get(2),
                group_idx: group_item(items.get(3)),
            },
            limits,
        )?,
        _ => VllmEvent::AllBlocksCleared,
    };
    Ok(Some(event))
}

/// `group_idx`'s place in the array form, if it holds an integer (see the module docs).
fn group_item<'v, 'a>(item: Option<&'v ValueRef<'a>>) -> Option<&'v ValueRef<'a>> {
    item.filter(|v| matches!(v, ValueRef::Integer(_)))
}

// === conversion, shared by both forms ===

fn required<'v, 'a>(
    value: Option<&'v ValueRef<'a>>,
    field: &'static str,
) -> Result<&'v ValueRef<'a>, EventError> {
    value.ok_or(EventError::MissingField { field })
}

fn stored(f: StoredFields<'_, '_>, limits: &Limits) -> Result<VllmEvent, EventError> {
    Ok(VllmEvent::BlockStored {
        block_hashes: fields::hash_list(
            BLOCK_HASHES,
            required(f.block_hashes, BLOCK_HASHES)?,
            limits.max_hashes_per_event,
        )?,
        parent: fields::opt_hash(PARENT_BLOCK_HASH, f.parent)?,
        token_ids: fields::token_ids(
            TOKEN_IDS,
            required(f.token_ids, TOKEN_IDS)?,
            limits.max_token_ids_per_event,
        )?,
        block_size: fields::u32_value(BLOCK_SIZE, required(f.block_size, BLOCK_SIZE)?)?,
        lora_id: fields::opt_i64(LORA_ID, f.lora_id)?,
        medium: fields::opt_string(MEDIUM, f.medium)?,
        group_idx: fields::opt_i64(GROUP_IDX, f.group_idx)?,
        // A salt (SGLang's only metadata so far) changes the engine's hash, not the tokens.
        hashed_with_extra_keys: fields::any_extra_keys(EXTRA_KEYS, f.extra_keys)?
            || matches!(f.sglang_metadata, Some(ValueRef::Map(m)) if !m.is_empty()),
    })
}

fn removed(f: RemovedFields<'_, '_>, limits: &Limits) -> Result<VllmEvent, EventError> {
    Ok(VllmEvent::BlockRemoved {
        block_hashes: fields::hash_list(
            BLOCK_HASHES,
            required(f.block_hashes, BLOCK_HASHES)?,
            limits.max_hashes_per_event,
        )?,
        medium: fields::opt_string(MEDIUM, f.medium)?,
        group_idx: fields::opt_i64(GROUP_IDX, f.group_idx)?,
    })
}
