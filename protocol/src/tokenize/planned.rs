//! Encoding in two steps: [`ModelTokenizer::plan_text`] cuts a prompt into added tokens and
//! chunks and looks every chunk up in the segment cache; [`ModelTokenizer::finish`] encodes
//! what the cache lacked and joins the ids.
//!
//! The split lets a caller pay for a warm prompt where it is: a multi-turn prompt whose earlier
//! turns are cached leaves a few hundred bytes to encode, less work than handing the prompt to
//! another thread and waking it (docs/performance.md). A [`PlannedPrompt`] owns its text, or
//! can be made to ([`PlannedPrompt::into_owned`]), so the rest can move to a blocking thread.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use super::segments::Piece;
use super::{ModelTokenizer, TokenizeError};

/// Below this many uncached bytes in one prompt, encoding them on the calling thread is
/// faster than handing chunks to the thread pool.
const PARALLEL_ENCODE_MIN_BYTES: usize = 16 << 10;

/// A prompt on its way to ids: what the segment cache had, and what is left to encode.
#[derive(Debug)]
pub struct PlannedPrompt<'t> {
    plan: Plan<'t>,
}

#[derive(Debug)]
enum Plan<'t> {
    /// Ids given as they are (a completions prompt of token ids).
    Ids(Vec<u32>),
    /// A text encoded in one call with the post-processor's special tokens: the tokenizer's
    /// wrapping could not be derived, so the text is not cut or cached.
    Whole(Cow<'t, str>),
    /// The text as added tokens and chunks, in order.
    Parts {
        text: Cow<'t, str>,
        parts: Vec<Part>,
        /// Whether the post-processor's ids go around the text (`special_wrap`).
        wrapped: bool,
        missing_bytes: usize,
    },
}

/// One piece of a text on its way to ids.
#[derive(Debug)]
enum Part {
    /// An added token's id.
    Added(u32),
    /// A chunk's ids, from the cache or just encoded.
    Cached(Arc<[u32]>),
    /// A chunk still to encode: its byte range in the text.
    Missing(Range<usize>),
}

impl PlannedPrompt<'_> {
    pub(super) fn ids(ids: Vec<u32>) -> PlannedPrompt<'static> {
        PlannedPrompt {
            plan: Plan::Ids(ids),
        }
    }

    /// Bytes of text [`ModelTokenizer::finish`] still has to encode.
    pub fn missing_bytes(&self) -> usize {
        match &self.plan {
            Plan::Ids(_) => 0,
            Plan::Whole(text) => text.len(),
            Plan::Parts { missing_bytes, .. } => *missing_bytes,
        }
    }

    /// The same plan owning its text (a copy only for a completions prompt borrowed from
    /// its body; a rendered chat already owns it).
    pub fn into_owned(self) -> PlannedPrompt<'static> {
        let plan = match self.plan {
            Plan::Ids(ids) => Plan::Ids(ids),
            Plan::Whole(text) => Plan::Whole(Cow::Owned(text.into_owned())),
            Plan::Parts {
                text,
                parts,
                wrapped,
                missing_bytes,
            } => Plan::Parts {
                text: Cow::Owned(text.into_owned()),
                parts,
                wrapped,
                missing_bytes,
            },
        };
        PlannedPrompt { plan }
    }
}

impl ModelTokenizer {
    /// Cuts `text` into added tokens and chunks and looks the chunks up in the segment cache.
    pub(super) fn plan_text<'t>(
        &self,
        text: Cow<'t, str>,
        add_special_tokens: bool,
    ) -> Result<PlannedPrompt<'t>, TokenizeError> {
        if add_special_tokens && self.special_wrap.is_none() {
            return Ok(PlannedPrompt {
                plan: Plan::Whole(text),
            });
        }
        // The splitter and the cutter hand out slices of `text`: a part keeps its byte range,
        // so the plan can own the text and move to another thread.
        let base = text.as_ptr() as usize;
        let range = |piece: &str| {
            let start = piece.as_ptr() as usize - base;
            start..start + piece.len()
        };
        let mut parts: Vec<Part> = Vec::new();
        self.splitter.split(&text, |piece| {
            match piece {
                Piece::Added(id) => parts.push(Part::Added(id)),
                Piece::Text(segment) => {
                    let mut add = |chunk: &str| {
                        parts.push(Part::Missing(range(chunk)));
                        Ok::<(), TokenizeError>(())
                    };
                    match &self.chunker {
                        Some(chunker) => chunker.cut(segment, add)?,
                        None => add(segment)?,
                    }
                }
            }
            Ok::<(), TokenizeError>(())
        })?;
        let chunks: Vec<&str> = parts
            .iter()
            .filter_map(|p| match p {
                Part::Missing(r) => Some(&text[r.clone()]),
                _ => None,
            })
            .collect();
        let mut cached = self.cache.get_many(&chunks).into_iter();
        let mut missing_bytes = 0;
        for part in &mut parts {
            if let Part::Missing(r) = part {
                match cached.next().flatten() {
                    Some(ids) => *part = Part::Cached(ids),
                    None => missing_bytes += r.len(),
                }
            }
        }
        Ok(PlannedPrompt {
            plan: Plan::Parts {
                text,
                parts,
                wrapped: add_special_tokens,
                missing_bytes,
            },
        })
    }

    /// Encodes what `planned` still misses (caching it) and returns the prompt's ids.
    ///
    /// # Errors
    /// [`TokenizeError::Tokenizer`] if the HF tokenizer fails.
    pub fn finish(&self, planned: PlannedPrompt<'_>) -> Result<Vec<u32>, TokenizeError> {
        let (text, mut parts, wrapped, missing_bytes) = match planned.plan {
            Plan::Ids(ids) => return Ok(ids),
            Plan::Whole(text) => return self.encode_uncached(&text, true),
            Plan::Parts {
                text,
                parts,
                wrapped,
                missing_bytes,
            } => (text, parts, wrapped, missing_bytes),
        };
        let (prefix, suffix): (&[u32], &[u32]) = match (&self.special_wrap, wrapped) {
            (Some(wrap), true) => (&wrap.prefix, &wrap.suffix),
            _ => (&[], &[]),
        };
        self.encode_missing(&text, &mut parts, missing_bytes)?;
        // Roughly 4 bytes per token for English text; avoids most regrowth.
        let mut ids = Vec::with_capacity(text.len() / 3 + prefix.len() + suffix.len() + 8);
        ids.extend_from_slice(prefix);
        for part in &parts {
            match part {
                Part::Added(id) => ids.push(*id),
                Part::Cached(chunk_ids) => ids.extend_from_slice(chunk_ids),
                Part::Missing(_) => unreachable!("encode_missing encodes every missing part"),
            }
        }
        ids.extend_from_slice(suffix);
        Ok(ids)
    }

    /// Encodes the parts the cache did not have, in parallel when there is enough of them
    /// (a cold long prompt), and caches them.
    fn encode_missing(
        &self,
        text: &str,
        parts: &mut [Part],
        missing_bytes: usize,
    ) -> Result<(), TokenizeError> {
        let encode = |part: &mut Part| -> Result<(), TokenizeError> {
            if let Part::Missing(r) = part {
                let chunk = &text[r.clone()];
                let ids: Arc<[u32]> = Arc::from(self.encode_uncached(chunk, false)?);
                self.cache.insert(chunk, ids.clone());
                *part = Part::Cached(ids);
            }
            Ok(())
        };
        // wasm32 (the filter's VM) has one thread: no pool to hand chunks to.
        let parallel =
            cfg!(not(target_arch = "wasm32")) && missing_bytes >= PARALLEL_ENCODE_MIN_BYTES;
        if parallel {
            use rayon::prelude::*;
            parts.par_iter_mut().try_for_each(encode)
        } else {
            parts.iter_mut().try_for_each(encode)
        }
    }
}
