//! Typed reads of msgpack values, each failing with an error that names the field.

use rmpv::ValueRef;

use super::block_hash;
use super::error::{EventError, Kind};

/// Longest text kept in a [`super::Skipped`] note, so notes stay log-sized.
const NOTE_MAX_BYTES: usize = 64;

type Result<T> = std::result::Result<T, EventError>;

fn wrong(field: &'static str, expected: &'static str, value: &ValueRef<'_>) -> EventError {
    EventError::FieldType {
        field,
        expected,
        got: Kind::of(value),
    }
}

/// The string inside `value`, if it is a UTF-8 string.
pub(crate) fn as_str<'v>(value: &'v ValueRef<'_>) -> Option<&'v str> {
    match value {
        ValueRef::String(s) => s.as_str(),
        _ => None,
    }
}

/// One block hash: an integer (uint64, or int64 reinterpreted) or a byte string.
pub(crate) fn hash(field: &'static str, value: &ValueRef<'_>) -> Result<u64> {
    match value {
        ValueRef::Integer(i) => i
            .as_u64()
            .or_else(|| i.as_i64().map(block_hash::from_i64))
            .ok_or(EventError::OutOfRange {
                field,
                expected: "u64",
            }),
        ValueRef::Binary(bytes) => {
            block_hash::from_bytes(bytes).ok_or(EventError::HashBytesLength {
                field,
                got: bytes.len(),
            })
        }
        other => Err(wrong(field, "an integer or bytes hash", other)),
    }
}

/// A hash that may be nil (`parent_block_hash` at a prompt's start).
pub(crate) fn opt_hash(field: &'static str, value: Option<&ValueRef<'_>>) -> Result<Option<u64>> {
    match value {
        None | Some(ValueRef::Nil) => Ok(None),
        Some(v) => hash(field, v).map(Some),
    }
}

/// The items of an array field, at most `max` of them.
fn items<'v, 'a>(
    field: &'static str,
    value: &'v ValueRef<'a>,
    max: usize,
) -> Result<&'v [ValueRef<'a>]> {
    match value {
        ValueRef::Array(items) if items.len() > max => Err(EventError::TooMany {
            field,
            got: items.len(),
            max,
        }),
        ValueRef::Array(items) => Ok(items),
        other => Err(wrong(field, "an array", other)),
    }
}

/// A list of block hashes, at most `max`.
pub(crate) fn hash_list(field: &'static str, value: &ValueRef<'_>, max: usize) -> Result<Vec<u64>> {
    items(field, value, max)?
        .iter()
        .map(|v| hash(field, v))
        .collect()
}

/// A list of token ids, at most `max`. Each is an integer, or a pair `[token, next token]`:
/// SGLang's pages under speculative decoding (EAGLE keys its radix tree by bigrams) give every
/// token with its successor. The page holds the KV of the first tokens of its pairs, so a pair
/// reads as its first token, and the page chains and hashes as a plain engine's would.
pub(crate) fn token_ids(field: &'static str, value: &ValueRef<'_>, max: usize) -> Result<Vec<u32>> {
    items(field, value, max)?
        .iter()
        .map(|v| match v {
            ValueRef::Array(pair) => match pair.as_slice() {
                [token, next] => {
                    u32_value(field, next)?;
                    u32_value(field, token)
                }
                _ => Err(wrong(field, "an integer or a pair of integers", v)),
            },
            other => u32_value(field, other),
        })
        .collect()
}

/// A non-negative integer that fits `u32`.
pub(crate) fn u32_value(field: &'static str, value: &ValueRef<'_>) -> Result<u32> {
    match value {
        ValueRef::Integer(i) => {
            i.as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .ok_or(EventError::OutOfRange {
                    field,
                    expected: "u32",
                })
        }
        other => Err(wrong(field, "an integer", other)),
    }
}

/// An optional signed integer: absent or nil is `None`.
pub(crate) fn opt_i64(field: &'static str, value: Option<&ValueRef<'_>>) -> Result<Option<i64>> {
    match value {
        None | Some(ValueRef::Nil) => Ok(None),
        Some(ValueRef::Integer(i)) => i.as_i64().map(Some).ok_or(EventError::OutOfRange {
            field,
            expected: "i64",
        }),
        Some(other) => Err(wrong(field, "an integer or nil", other)),
    }
}

/// An optional UTF-8 string: absent or nil is `None`.
pub(crate) fn opt_string(
    field: &'static str,
    value: Option<&ValueRef<'_>>,
) -> Result<Option<String>> {
    match value {
        None | Some(ValueRef::Nil) => Ok(None),
        Some(v) => as_str(v)
            .map(|s| Some(s.to_owned()))
            .ok_or_else(|| wrong(field, "a UTF-8 string or nil", v)),
    }
}

/// Whether `extra_keys` (nil, or one entry per block) holds anything but nil.
pub(crate) fn any_extra_keys(field: &'static str, value: Option<&ValueRef<'_>>) -> Result<bool> {
    match value {
        None | Some(ValueRef::Nil) => Ok(false),
        Some(ValueRef::Array(per_block)) => {
            Ok(per_block.iter().any(|v| !matches!(v, ValueRef::Nil)))
        }
        Some(other) => Err(wrong(field, "an array or nil", other)),
    }
}

/// `text` cut to at most [`NOTE_MAX_BYTES`] on a character boundary.
pub(crate) fn note_text(text: &str) -> String {
    let mut end = text.len().min(NOTE_MAX_BYTES);
    while !text.is_char_boundary(end) {
        end = end.saturating_sub(1);
    }
    text.get(..end).unwrap_or_default().to_owned()
}

/// A short description of a map key that is not a UTF-8 string, for a note.
pub(crate) fn describe_key(key: &ValueRef<'_>) -> String {
    note_text(&format!("<{} key>", Kind::of(key)))
}
