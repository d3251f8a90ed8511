//! Load-time probes of the HF tokenizer: is segment-wise encoding exact for it, and which ids
//! does its post-processor add around a text?

use tokenizers::Tokenizer;

use super::chunks::ChunkCutter;
use super::error::TokenizeError;
use super::segments::{AddedTokenSplitter, Piece};

/// The ids a post-processor puts around one text with `add_special_tokens=True` (e.g.
/// Llama's BOS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SpecialWrap {
    /// Ids before the text.
    pub prefix: Vec<u32>,
    /// Ids after the text.
    pub suffix: Vec<u32>,
}

fn encode(
    tokenizer: &Tokenizer,
    text: &str,
    add_special_tokens: bool,
) -> Result<Vec<u32>, TokenizeError> {
    let encoding = tokenizer
        .encode_fast(text, add_special_tokens)
        .map_err(|e| TokenizeError::Tokenizer(e.to_string()))?;
    Ok(encoding.get_ids().to_vec())
}

/// Texts that mix a few of the tokenizer's added tokens with words, spaces and newlines, to
/// check that tokenizing segments apart gives what tokenizing the whole text gives.
pub(crate) fn splitter_probes(tokenizer: &Tokenizer) -> Vec<String> {
    let mut added: Vec<(u32, String)> = tokenizer
        .get_added_tokens_decoder()
        .into_iter()
        .map(|(id, t)| (id, t.content))
        .collect();
    added.sort();
    added
        .iter()
        .take(4)
        .map(|(_, t)| format!("Hi there{t}user\n hello  world{t}{t} x\n\n{t}  end ünï"))
        .collect()
}

pub(crate) fn splits_exactly(
    tokenizer: &Tokenizer,
    splitter: &AddedTokenSplitter,
    probes: &[String],
) -> Result<bool, TokenizeError> {
    for probe in probes {
        let mut pieced = Vec::new();
        splitter.split(probe, |piece| {
            match piece {
                Piece::Added(id) => pieced.push(id),
                Piece::Text(segment) => pieced.extend(encode(tokenizer, segment, false)?),
            }
            Ok::<(), TokenizeError>(())
        })?;
        if pieced != encode(tokenizer, probe, false)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Texts with every kind of neighbour a chunk cut can have: contractions, digits,
/// punctuation, runs of spaces and newlines, non-ASCII letters and marks.
const CHUNK_PROBES: &[&str] = &[
    "It's what they'd said: don't cut 12345 words, or 3.14 of them; we'll see.",
    "a b  c   d\n e\n\nf \tg h\r\ni j!k l?m (n) o'p q's r'LL s",
    "naïve café e\u{301}t ünïcode 数据 and Ωmega x 😀 y \u{200b}z",
    "fn main() { let x = foo(bar, baz); } // done with it\n    indented code here",
];

/// Whether encoding `CHUNK_PROBES` cut at every boundary `cutter` allows gives the ids of
/// encoding them whole.
pub(crate) fn chunks_exactly(
    tokenizer: &Tokenizer,
    cutter: ChunkCutter,
) -> Result<bool, TokenizeError> {
    for probe in CHUNK_PROBES {
        let mut pieced = Vec::new();
        cutter.cut(probe, |chunk| {
            pieced.extend(encode(tokenizer, chunk, false)?);
            Ok::<(), TokenizeError>(())
        })?;
        if pieced != encode(tokenizer, probe, false)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The ids the post-processor adds around one text (e.g. Llama's BOS), found by encoding a
/// probe with and without special tokens.
pub(crate) fn special_wrap(tokenizer: &Tokenizer) -> Result<Option<SpecialWrap>, TokenizeError> {
    const PROBE: &str = "Hello world";
    let (plain, wrapped) = (
        encode(tokenizer, PROBE, false)?,
        encode(tokenizer, PROBE, true)?,
    );
    if plain.is_empty() || wrapped.len() < plain.len() {
        return Ok(None);
    }
    Ok((0..=wrapped.len() - plain.len())
        .find(|&at| wrapped[at..at + plain.len()] == plain[..])
        .map(|at| SpecialWrap {
            prefix: wrapped[..at].to_vec(),
            suffix: wrapped[at + plain.len()..].to_vec(),
        }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;
    use tokenizers::AddedToken;

    /// A word-level tokenizer with one added token and a Metaspace pre-tokenizer.
    fn word_level_tokenizer() -> Tokenizer {
        let json = r#"{
          "version": "1.0", "truncation": null, "padding": null,
          "added_tokens": [{"id": 2, "content": "<sep>", "single_word": false, "lstrip": false,
                            "rstrip": false, "normalized": false, "special": true}],
          "normalizer": null,
          "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true},
          "post_processor": null, "decoder": null,
          "model": {"type": "WordLevel", "unk_token": "[UNK]",
                    "vocab": {"▁Hi": 0, "Hi": 1, "<sep>": 2, "▁user": 3, "user": 4, "[UNK]": 5, "▁hello": 6}}
        }"#;
        Tokenizer::from_str(json).expect("tokenizer json")
    }

    #[test]
    fn probes_accept_the_tokenizers_own_added_tokens() {
        // HF tokenizes the pieces between added tokens as separate inputs (even Metaspace's
        // "first word" rule applies per piece), so cutting on them is exact.
        let tok = word_level_tokenizer();
        let splitter = AddedTokenSplitter::new(
            tok.get_added_tokens_decoder()
                .iter()
                .map(|(id, t)| (*id, t)),
        );
        assert!(splitter.is_active());
        let probes = splitter_probes(&tok);
        assert_eq!(probes.len(), 1);
        assert!(splits_exactly(&tok, &splitter, &probes).unwrap());
    }

    #[test]
    fn probes_reject_cuts_the_tokenizer_does_not_make() {
        // Cutting before "hello" loses the word boundary the whole-text encode sees.
        let tok = word_level_tokenizer();
        let fake = AddedToken::from(" ", true).normalized(false);
        let splitter = AddedTokenSplitter::new([(5, &fake)]);
        assert!(!splits_exactly(&tok, &splitter, &splitter_probes(&tok)).unwrap());
    }

    #[test]
    fn wrap_is_empty_without_a_post_processor() {
        let wrap = special_wrap(&word_level_tokenizer()).unwrap();
        assert_eq!(
            wrap,
            Some(SpecialWrap {
                prefix: vec![],
                suffix: vec![]
            })
        );
    }
}
