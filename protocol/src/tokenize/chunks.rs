//! Cutting long segments into chunks the tokenizer encodes independently.
//!
//! A growing prompt (one long message that gains text every turn, as in trace replays and many
//! agent frameworks) is one segment between added tokens, different every turn, so the segment
//! cache alone re-tokenizes all of it every turn. Cutting each segment into chunks of about
//! [`DEFAULT_CHUNK_BYTES`] at places where the tokenizer provably splits anyway makes every chunk
//! but the last one of the previous turn a cache hit, and lets a cold prompt's chunks be encoded
//! in parallel.
//!
//! Where is a cut exact? HF's BPE tokenizers run a normalizer over the text, cut it into
//! pre-tokens with a regex, and encode each pre-token alone. For the regexes of the byte-level
//! BPE families below, the pre-token holding a letter is a run of letters (optionally led by one
//! non-letter, non-newline character, or a contraction like `'s`), greedily as long as it can be;
//! so between an ASCII letter and a space that is followed by an ASCII letter, one pre-token
//! always ends and the next (` word`) begins, whatever comes before or after. The regexes have no
//! look-behind, so matching resumes at the cut exactly as it does in the whole text. NFC (the only
//! normalizer accepted) cannot compose across a space. So `encode(a) ++ encode(b) ==
//! encode(a ++ b)` whenever `a` ends in an ASCII letter and `b` starts with a space and an ASCII
//! letter.
//!
//! That argument holds only for the pre-tokenizers it names, so [`ChunkCutter::for_tokenizer`]
//! reads the tokenizer's configuration and returns `None` for anything else; load-time probes
//! (`probes::chunks_exactly`) and a property test against whole-text encoding check it as well.

use serde_json::Value;
use tokenizers::Tokenizer;

/// Default chunk size: a growing prompt re-tokenizes at most about this much of its old text
/// per turn (the chunk it ended in), and a 128k-token prompt is ~500 cache entries.
pub const DEFAULT_CHUNK_BYTES: usize = 1024;

/// Split regexes whose letter runs are greedy and end only at a non-letter (see module docs):
/// Qwen2/Qwen3 and Llama 3 (which differs only in grouping digits by three).
const KNOWN_SPLIT_PATTERNS: &[&str] = &[
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// Cuts text at exact chunk boundaries (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkCutter {
    /// A cut is made at the first exact boundary at least this many bytes after the last one.
    target_bytes: usize,
}

impl ChunkCutter {
    /// A cutter if the tokenizer's normalizer and pre-tokenizer are ones the exactness argument
    /// covers, `None` otherwise (then segments are encoded whole, as before).
    pub(crate) fn for_tokenizer(tokenizer: &Tokenizer, target_bytes: usize) -> Option<Self> {
        if target_bytes == 0 {
            return None;
        }
        let normalizer = serde_json::to_value(tokenizer.get_normalizer()).ok()?;
        let pre_tokenizer = serde_json::to_value(tokenizer.get_pre_tokenizer()).ok()?;
        (normalizer_is_safe(&normalizer) && pre_tokenizer_is_known(&pre_tokenizer))
            .then_some(ChunkCutter { target_bytes })
    }

    /// The same kind of cutter, cutting at every boundary it may (the load-time probes).
    pub(crate) fn finest(self) -> Self {
        ChunkCutter { target_bytes: 1 }
    }

    /// A cutter whatever the tokenizer (tests of the cutting itself).
    #[cfg(test)]
    pub(crate) fn unchecked(target_bytes: usize) -> Self {
        ChunkCutter { target_bytes }
    }

    /// Calls `emit` with consecutive chunks of `text` (all of it, in order; never an empty
    /// chunk unless `text` is empty, in which case nothing is emitted).
    pub(crate) fn cut<'t, E>(
        &self,
        text: &'t str,
        mut emit: impl FnMut(&'t str) -> Result<(), E>,
    ) -> Result<(), E> {
        let bytes = text.as_bytes();
        let mut start = 0;
        let mut at = self.target_bytes.max(1);
        while at + 1 < bytes.len() {
            if bytes[at] == b' '
                && bytes[at - 1].is_ascii_alphabetic()
                && bytes[at + 1].is_ascii_alphabetic()
            {
                // `at` is a space, so a char boundary.
                emit(&text[start..at])?;
                start = at;
                at = start + self.target_bytes.max(1);
            } else {
                at += 1;
            }
        }
        if start < bytes.len() {
            emit(&text[start..])?;
        }
        Ok(())
    }
}

/// No normalizer, or NFC alone.
fn normalizer_is_safe(normalizer: &Value) -> bool {
    match normalizer {
        Value::Null => true,
        other => other.get("type").and_then(Value::as_str) == Some("NFC"),
    }
}

/// `Sequence[Split(known regex, Isolated), ByteLevel(use_regex: false)]`, as Qwen and Llama 3
/// ship it.
fn pre_tokenizer_is_known(pre_tokenizer: &Value) -> bool {
    let Some(parts) = pre_tokenizer
        .get("pretokenizers")
        .and_then(Value::as_array)
        .filter(|_| pre_tokenizer.get("type").and_then(Value::as_str) == Some("Sequence"))
    else {
        return false;
    };
    let [split, byte_level] = parts.as_slice() else {
        return false;
    };
    let split_ok = split.get("type").and_then(Value::as_str) == Some("Split")
        && split.get("behavior").and_then(Value::as_str) == Some("Isolated")
        && split.get("invert").and_then(Value::as_bool) == Some(false)
        && split
            .get("pattern")
            .and_then(|p| p.get("Regex"))
            .and_then(Value::as_str)
            .is_some_and(|regex| KNOWN_SPLIT_PATTERNS.contains(&regex));
    let byte_level_ok = byte_level.get("type").and_then(Value::as_str) == Some("ByteLevel")
        && byte_level.get("use_regex").and_then(Value::as_bool) == Some(false)
        && byte_level.get("add_prefix_space").and_then(Value::as_bool) == Some(false);
    split_ok && byte_level_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(cutter: ChunkCutter, text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        cutter
            .cut(text, |c| {
                out.push(c);
                Ok::<(), ()>(())
            })
            .unwrap();
        out
    }

    #[test]
    fn cuts_only_between_a_letter_and_a_spaced_letter() {
        let cutter = ChunkCutter::unchecked(1);
        assert_eq!(
            chunks(cutter, "ab cd  ef,g h1 i é j"),
            ["ab", " cd  ef,g", " h1 i é j"]
        );
        assert_eq!(chunks(cutter, ""), Vec::<&str>::new());
        assert_eq!(chunks(cutter, "a b"), ["a", " b"]);
    }

    #[test]
    fn waits_for_the_target_size_and_keeps_every_byte() {
        let text = "one two three four five six seven eight nine ten";
        let cut = chunks(ChunkCutter::unchecked(10), text);
        assert_eq!(cut.concat(), text);
        assert!(
            cut[..cut.len() - 1].iter().all(|c| c.len() >= 10),
            "{cut:?}"
        );
        assert_eq!(
            cut,
            [
                "one two three",
                " four five",
                " six seven",
                " eight nine",
                " ten"
            ]
        );
    }

    #[test]
    fn a_growing_text_keeps_its_earlier_cuts() {
        let cutter = ChunkCutter::unchecked(8);
        let short = "alpha beta gamma delta epsilon";
        let long = format!("{short} zeta eta theta");
        let (a, b) = (chunks(cutter, short), chunks(cutter, &long));
        assert_eq!(a[..a.len() - 1], b[..a.len() - 1]);
    }

    #[test]
    fn only_known_pre_tokenizers_are_cut() {
        let qwen = serde_json::json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": KNOWN_SPLIT_PATTERNS[0]}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]});
        assert!(pre_tokenizer_is_known(&qwen));
        let mut other = qwen.clone();
        other["pretokenizers"][0]["pattern"]["Regex"] = "\\s+|\\S+".into();
        assert!(!pre_tokenizer_is_known(&other));
        assert!(!pre_tokenizer_is_known(
            &serde_json::json!({"type": "Metaspace"})
        ));
        assert!(normalizer_is_safe(&Value::Null));
        assert!(normalizer_is_safe(&serde_json::json!({"type": "NFC"})));
        assert!(!normalizer_is_safe(
            &serde_json::json!({"type": "Lowercase"})
        ));
    }
}
