//! Splitting text on added tokens, and the cache of each segment's token ids.
//!
//! HF tokenizers first cuts the input at every added token (`<|im_start|>`, `<think>`, ...)
//! and tokenizes the text between them independently. A rendered chat is mostly such
//! segments, one or two per message, and in multi-turn or agentic traffic all but the newest
//! few were already seen in the previous turn. Caching ids per segment means a request only
//! runs the tokenizer over its new messages.
//!
//! The split is exact only for added tokens matched on the raw text (`normalized: false`) with
//! no `lstrip` / `rstrip` / `single_word` (every token of Qwen, Llama 3, Mistral...). If a
//! tokenizer has others, [`AddedTokenSplitter::new`] disables splitting and each whole text is
//! one segment: still correct, just no incremental saving.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokenizers::AddedToken;

/// One piece of a text cut at added tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Piece<'a> {
    /// Ordinary text between added tokens (never empty).
    Text(&'a str),
    /// An added token, by id.
    Added(u32),
}

/// Finds added tokens in text, leftmost-longest like HF's matcher.
#[derive(Debug)]
pub(crate) struct AddedTokenSplitter {
    /// Candidate tokens by first byte, longest first.
    by_first_byte: HashMap<u8, Vec<(Box<str>, u32)>>,
    /// Fast reject of positions no token can start at.
    first_bytes: [bool; 256],
    /// The same bytes as a list: with three or fewer (Qwen's tokens all start with `<`), the
    /// scan for the next candidate is a SIMD `memchr` instead of a byte-by-byte loop, which
    /// was the largest single cost of routing a cached 128k-token prompt.
    first_byte_list: Vec<u8>,
}

impl Default for AddedTokenSplitter {
    fn default() -> Self {
        AddedTokenSplitter {
            by_first_byte: HashMap::new(),
            first_bytes: [false; 256],
            first_byte_list: Vec::new(),
        }
    }
}

impl AddedTokenSplitter {
    /// A splitter for the tokenizer's added tokens (`id -> token`).
    pub(crate) fn new<'a>(added: impl IntoIterator<Item = (u32, &'a AddedToken)>) -> Self {
        let added: Vec<(u32, &AddedToken)> = added.into_iter().collect();
        let raw: Vec<&(u32, &AddedToken)> = added.iter().filter(|(_, t)| !t.normalized).collect();
        if raw
            .iter()
            .any(|(_, t)| t.lstrip || t.rstrip || t.single_word)
        {
            return AddedTokenSplitter::default();
        }
        let mut splitter = AddedTokenSplitter::default();
        for (id, token) in raw {
            let Some(&first) = token.content.as_bytes().first() else {
                continue;
            };
            splitter.first_bytes[first as usize] = true;
            splitter
                .by_first_byte
                .entry(first)
                .or_default()
                .push((token.content.as_str().into(), *id));
        }
        splitter.first_byte_list = (0..=255u8)
            .filter(|b| splitter.first_bytes[*b as usize])
            .collect();
        for candidates in splitter.by_first_byte.values_mut() {
            candidates.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        }
        splitter
    }

    /// Whether the splitter knows any token (false: every text is one segment).
    pub(crate) fn is_active(&self) -> bool {
        !self.by_first_byte.is_empty()
    }

    /// Calls `emit` for each piece of `text` in order.
    pub(crate) fn split<'t, E>(
        &self,
        text: &'t str,
        mut emit: impl FnMut(Piece<'t>) -> Result<(), E>,
    ) -> Result<(), E> {
        let bytes = text.as_bytes();
        let mut segment_start = 0;
        let mut i = 0;
        while let Some(at) = self.next_candidate(bytes, i) {
            i = at;
            if let Some((len, id)) = self.match_at(&bytes[i..]) {
                if segment_start < i {
                    emit(Piece::Text(&text[segment_start..i]))?;
                }
                emit(Piece::Added(id))?;
                i += len;
                segment_start = i;
                continue;
            }
            i += 1;
        }
        if segment_start < bytes.len() {
            emit(Piece::Text(&text[segment_start..]))?;
        }
        Ok(())
    }

    /// The first position at or after `from` where some token could start.
    fn next_candidate(&self, bytes: &[u8], from: usize) -> Option<usize> {
        let rest = bytes.get(from..)?;
        let found = match *self.first_byte_list.as_slice() {
            [] => None,
            [a] => memchr::memchr(a, rest),
            [a, b] => memchr::memchr2(a, b, rest),
            [a, b, c] => memchr::memchr3(a, b, c, rest),
            _ => rest.iter().position(|b| self.first_bytes[*b as usize]),
        };
        found.map(|at| from + at)
    }

    fn match_at(&self, rest: &[u8]) -> Option<(usize, u32)> {
        self.by_first_byte
            .get(&rest[0])?
            .iter()
            .find(|(token, _)| rest.starts_with(token.as_bytes()))
            .map(|(token, id)| (token.len(), *id))
    }
}

/// Counters of the segment cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentCacheStats {
    /// Segments served from the cache.
    pub hits: u64,
    /// Segments that had to be tokenized.
    pub misses: u64,
    /// Segments cached now.
    pub entries: usize,
    /// Approximate bytes held (segment text + ids + bookkeeping).
    pub bytes: usize,
}

/// Per-entry bookkeeping beyond the ids (key, map slot, Arc, ring slot).
const ENTRY_OVERHEAD: usize = 96;

/// A segment's key: the 128-bit xxh3 hash of its text. Keying by hash instead of by the text
/// halves the memory per cached token and makes a hit one pass over the text instead of a
/// hash plus a full comparison; two texts of a prompt colliding has probability ~2^-128 per
/// pair, far below that of the 64-bit block hashes the KV index already relies on.
type SegmentKey = u128;

fn key_of(text: &str) -> SegmentKey {
    xxhash_rust::xxh3::xxh3_128(text.as_bytes())
}

/// A byte-bounded map from segment text (by its hash) to its token ids, evicting by CLOCK
/// (second chance): an entry used since the hand last passed it survives one more round. That
/// approximates least-recently-used with O(1) bookkeeping per hit, where an exact LRU order
/// (a tree keyed by last use) cost more than the lookup itself for a prompt of 500 chunks.
///
/// One `Mutex`: it is held for one prompt's lookups or one insert, never while tokenizing.
#[derive(Debug)]
pub(crate) struct SegmentCache {
    capacity_bytes: usize,
    inner: Mutex<Clock>,
}

#[derive(Debug, Default)]
struct Clock {
    map: HashMap<SegmentKey, Entry>,
    /// Every cached key once, in insertion order; the front is where the hand is.
    ring: VecDeque<SegmentKey>,
    bytes: usize,
    hits: u64,
    misses: u64,
}

#[derive(Debug)]
struct Entry {
    ids: Arc<[u32]>,
    /// Used since the hand last passed it.
    referenced: bool,
}

fn entry_bytes(ids: &[u32]) -> usize {
    std::mem::size_of_val(ids) + ENTRY_OVERHEAD
}

impl SegmentCache {
    /// A cache holding at most about `capacity_bytes` (0 disables caching).
    pub(crate) fn new(capacity_bytes: usize) -> Self {
        SegmentCache {
            capacity_bytes,
            inner: Mutex::new(Clock::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Clock> {
        // A panic elsewhere while holding the lock cannot leave the map inconsistent in a way
        // that matters (worst case a stale byte count), so keep serving.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The ids of `text` if cached (and marks it used).
    #[cfg(test)]
    pub(crate) fn get(&self, text: &str) -> Option<Arc<[u32]>> {
        self.get_many(&[text]).pop().flatten()
    }

    /// The ids of each text if cached (and marks them used), under one lock.
    pub(crate) fn get_many(&self, texts: &[&str]) -> Vec<Option<Arc<[u32]>>> {
        let keys: Vec<SegmentKey> = texts.iter().map(|t| key_of(t)).collect();
        let mut clock = self.lock();
        let found: Vec<Option<Arc<[u32]>>> = keys
            .iter()
            .map(|key| {
                clock.map.get_mut(key).map(|entry| {
                    entry.referenced = true;
                    entry.ids.clone()
                })
            })
            .collect();
        let hits = found.iter().filter(|f| f.is_some()).count() as u64;
        clock.hits += hits;
        clock.misses += found.len() as u64 - hits;
        found
    }

    /// Caches `ids` for `text`, evicting entries not used since the hand last passed them to
    /// stay in budget. Entries larger than the whole budget are not cached.
    pub(crate) fn insert(&self, text: &str, ids: Arc<[u32]>) {
        let size = entry_bytes(&ids);
        if size > self.capacity_bytes {
            return;
        }
        let key = key_of(text);
        let mut clock = self.lock();
        if clock.map.contains_key(&key) {
            return; // another thread tokenized the same segment meanwhile
        }
        let Clock {
            map, ring, bytes, ..
        } = &mut *clock;
        while *bytes + size > self.capacity_bytes {
            let Some(candidate) = ring.pop_front() else {
                break;
            };
            match map.get_mut(&candidate) {
                Some(entry) if entry.referenced => {
                    entry.referenced = false;
                    ring.push_back(candidate);
                }
                Some(_) => {
                    if let Some(old) = map.remove(&candidate) {
                        *bytes -= entry_bytes(&old.ids);
                    }
                }
                None => {}
            }
        }
        ring.push_back(key);
        map.insert(
            key,
            Entry {
                ids,
                referenced: false,
            },
        );
        *bytes += size;
    }

    /// Current counters.
    pub(crate) fn stats(&self) -> SegmentCacheStats {
        let clock = self.lock();
        SegmentCacheStats {
            hits: clock.hits,
            misses: clock.misses,
            entries: clock.map.len(),
            bytes: clock.bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces<'t>(splitter: &AddedTokenSplitter, text: &'t str) -> Vec<Piece<'t>> {
        let mut out = Vec::new();
        splitter
            .split(text, |p| {
                out.push(p);
                Ok::<(), ()>(())
            })
            .unwrap();
        out
    }

    #[test]
    fn splits_leftmost_longest() {
        let tokens = [
            AddedToken::from("<a>", true),
            AddedToken::from("<a>b", true),
            AddedToken::from("é!", false).normalized(false),
        ];
        let splitter =
            AddedTokenSplitter::new(tokens.iter().enumerate().map(|(i, t)| (i as u32, t)));
        assert_eq!(
            pieces(&splitter, "x<a>b<a>é!<"),
            [
                Piece::Text("x"),
                Piece::Added(1),
                Piece::Added(0),
                Piece::Added(2),
                Piece::Text("<")
            ]
        );
        assert_eq!(pieces(&splitter, ""), []);
    }

    #[test]
    fn finds_tokens_with_many_first_bytes() {
        // More than three distinct first bytes: the scan falls back from memchr to the table.
        let tokens = ["<a>", "[b]", "{c}", "(d)"].map(|t| AddedToken::from(t, true));
        let splitter =
            AddedTokenSplitter::new(tokens.iter().enumerate().map(|(i, t)| (i as u32, t)));
        assert_eq!(
            pieces(&splitter, "x(d)y[b{c}<a>"),
            [
                Piece::Text("x"),
                Piece::Added(3),
                Piece::Text("y[b"),
                Piece::Added(2),
                Piece::Added(0)
            ]
        );
    }

    #[test]
    fn tokens_that_strip_whitespace_disable_splitting() {
        let tokens = [AddedToken::from("<a>", true).lstrip(true)];
        let splitter = AddedTokenSplitter::new(tokens.iter().map(|t| (0, t)));
        assert!(!splitter.is_active());
        assert_eq!(pieces(&splitter, "x <a>"), [Piece::Text("x <a>")]);
    }

    #[test]
    fn evicts_entries_unused_since_the_hand_passed_within_budget() {
        let one = entry_bytes(&[1, 2]);
        let cache = SegmentCache::new(2 * one);
        cache.insert("aaaa", Arc::from(vec![1, 2]));
        cache.insert("bbbb", Arc::from(vec![3, 4]));
        assert!(cache.get("aaaa").is_some()); // "bbbb" is now the oldest
        cache.insert("cccc", Arc::from(vec![5, 6]));
        assert!(cache.get("bbbb").is_none());
        assert_eq!(cache.get("cccc").as_deref(), Some(&[5, 6][..]));
        let stats = cache.stats();
        assert_eq!(
            (stats.entries, stats.bytes, stats.hits, stats.misses),
            (2, 2 * one, 2, 1)
        );
        cache.insert("zzzz", Arc::from(vec![7; 3 * one]));
        assert_eq!(cache.stats().entries, 2, "oversized entries are not cached");
    }
}
