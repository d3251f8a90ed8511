//! The word vocabulary synthetic prompts are written in.
//!
//! A synthetic prompt must have a token count we know in advance and token blocks that repeat
//! exactly when the workload says they repeat. Both hold when every word of the text is one
//! token and the tokenizer never merges across words: then `n` words are `n` tokens and equal
//! word sequences are equal token sequences. Byte-level BPE tokenizers (Qwen, Llama 3, GPT)
//! pre-split text on `" ?letters"`, so a lowercase word with a leading space that is a single
//! token stays one token next to any other such word. [`CANDIDATE_WORDS`] was picked once from
//! the most frequent `" word"` tokens of the Qwen3 tokenizer (fragments, code keywords and
//! offensive words removed); [`Vocabulary::from_tokenizer`] keeps the first
//! [`VOCABULARY_SIZE`] of them that the configured tokenizer maps to exactly one token, and the
//! tests check that whole synthesized prompts tokenize word by word.

use super::tokenizer::TextTokenizer;

/// Number of words in a vocabulary: a power of two, so two words can name 2^18 blocks
/// (see `prompts.rs`, block headers).
pub const VOCABULARY_SIZE: usize = 512;

/// Errors building a vocabulary.
#[derive(Debug, thiserror::Error)]
pub enum VocabularyError {
    /// The tokenizer failed on a candidate word.
    #[error("tokenizer failed on {word:?}: {message}")]
    Tokenizer {
        /// The word.
        word: String,
        /// The tokenizer's error.
        message: String,
    },
    /// Too few candidate words are single tokens for this tokenizer.
    #[error(
        "only {found} of {candidates} candidate words are single tokens for this tokenizer; \
         {needed} are needed (is it a byte-level BPE tokenizer?)"
    )]
    TooFewSingleTokenWords {
        /// Single-token words found.
        found: usize,
        /// Candidates tried.
        candidates: usize,
        /// Words needed.
        needed: usize,
    },
}

/// [`VOCABULARY_SIZE`] words, each with the token id it encodes to (leading space included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vocabulary {
    /// `" word"` strings, leading space included.
    words: Vec<String>,
    /// Token id of each word under the tokenizer the vocabulary was built for.
    ids: Vec<u32>,
}

impl Vocabulary {
    /// Keeps the first [`VOCABULARY_SIZE`] candidates that `tokenizer` encodes to one token.
    ///
    /// # Errors
    /// [`VocabularyError::Tokenizer`] if encoding fails, [`VocabularyError::TooFewSingleTokenWords`]
    /// if the tokenizer splits too many candidates.
    pub fn from_tokenizer(tokenizer: &dyn TextTokenizer) -> Result<Self, VocabularyError> {
        let mut words = Vec::with_capacity(VOCABULARY_SIZE);
        let mut ids = Vec::with_capacity(VOCABULARY_SIZE);
        for word in CANDIDATE_WORDS {
            let spaced = format!(" {word}");
            let encoded =
                tokenizer
                    .encode_text(&spaced)
                    .map_err(|message| VocabularyError::Tokenizer {
                        word: spaced.clone(),
                        message,
                    })?;
            if let [id] = encoded[..] {
                words.push(spaced);
                ids.push(id);
                if words.len() == VOCABULARY_SIZE {
                    return Ok(Vocabulary { words, ids });
                }
            }
        }
        Err(VocabularyError::TooFewSingleTokenWords {
            found: words.len(),
            candidates: CANDIDATE_WORDS.len(),
            needed: VOCABULARY_SIZE,
        })
    }

    /// A vocabulary whose token ids are just the word indices: for tests and for simulations
    /// that never meet a real tokenizer (the token *structure* is the same, the ids are not
    /// a real model's).
    pub fn synthetic() -> Self {
        let words: Vec<String> = CANDIDATE_WORDS[..VOCABULARY_SIZE]
            .iter()
            .map(|w| format!(" {w}"))
            .collect();
        let ids = (0..VOCABULARY_SIZE as u32).collect();
        Vocabulary { words, ids }
    }

    /// The word at `index` (`index < VOCABULARY_SIZE`), leading space included.
    pub fn word(&self, index: usize) -> &str {
        &self.words[index]
    }

    /// The token id of the word at `index` (`index < VOCABULARY_SIZE`).
    pub fn id(&self, index: usize) -> u32 {
        self.ids[index]
    }

    /// All words, leading spaces included.
    pub fn words(&self) -> &[String] {
        &self.words
    }
}

/// Common lowercase English words that are single `" word"` tokens in Qwen3's tokenizer,
/// most frequent first. Other byte-level BPE tokenizers split a few; see
/// [`Vocabulary::from_tokenizer`].
pub const CANDIDATE_WORDS: &[&str] = &[
    "the", "and", "for", "this", "that", "with", "return", "you", "new", "from", "are", "class",
    "not", "was", "public", "have", "get", "can", "self", "all", "will", "your", "out", "has",
    "but", "function", "set", "else", "more", "his", "they", "per", "data", "one", "name", "true",
    "end", "their", "private", "who", "time", "man", "which", "any", "false", "value", "app",
    "about", "add", "string", "over", "type", "part", "work", "when", "use", "off", "other",
    "been", "had", "were", "file", "would", "our", "year", "some", "there", "said", "her", "like",
    "let", "also", "than", "static", "just", "result", "them", "into", "what", "list", "case",
    "first", "import", "act", "char", "only", "print", "its", "back", "need", "sub", "start",
    "user", "under", "then", "may", "org", "how", "people", "ind", "should", "test", "make",
    "after", "right", "long", "min", "array", "she", "read", "form", "trans", "want", "number",
    "require", "col", "key", "two", "size", "where", "while", "look", "could", "know", "hand",
    "most", "try", "now", "him", "break", "every", "point", "error", "text", "show", "find",
    "current", "used", "play", "log", "see", "help", "these", "pass", "down", "even", "item",
    "don", "did", "through", "last", "event", "again", "high", "line", "does", "before", "because",
    "dist", "state", "here", "final", "run", "very", "model", "way", "call", "well", "object",
    "years", "default", "view", "many", "being", "good", "using", "request", "child", "echo",
    "person", "style", "method", "expect", "found", "post", "such", "think", "differ", "much",
    "count", "check", "open", "next", "follow", "car", "game", "path", "each", "support", "own",
    "sign", "those", "system", "best", "same", "create", "made", "mark", "group", "fin", "world",
    "process", "main", "color", "report", "take", "day", "top", "free", "action", "index", "real",
    "max", "build", "message", "input", "art", "between", "table", "head", "must", "order", "mov",
    "say", "ter", "product", "double", "place", "week", "prop", "program", "response", "code",
    "without", "sol", "ref", "still", "assert", "cap", "rep", "field", "team", "second", "going",
    "range", "fam", "fact", "home", "left", "direct", "allow", "page", "around", "really", "image",
    "target", "both", "put", "level", "document", "local", "content", "float", "develop", "too",
    "extends", "great", "month", "super", "title", "context", "met", "life", "catch", "pay",
    "change", "position", "old", "book", "version", "three", "law", "base", "during", "console",
    "against", "power", "width", "label", "project", "element", "success", "date", "big", "map",
    "pop", "few", "match", "node", "another", "sit", "care", "effect", "fun", "leg", "service",
    "since", "non", "los", "full", "turn", "body", "stand", "block", "keep", "throw", "things",
    "red", "control", "come", "custom", "source", "eas", "mill", "ask", "output", "email",
    "business", "required", "might", "never", "hard", "called", "options", "height", "small",
    "access", "job", "address", "sum", "little", "fri", "port", "status", "update", "link",
    "given", "better", "feel", "already", "always", "parent", "got", "less", "account", "lot",
    "valid", "bit", "sure", "search", "says", "temp", "rest", "interest", "perform", "die", "site",
    "values", "won", "video", "cell", "player", "cost", "total", "stat", "load", "clear", "row",
    "seem", "short", "override", "company", "done", "health", "children", "days", "initial",
    "online", "instance", "reason", "within", "design", "cent", "school", "consider", "include",
    "stop", "later", "client", "love", "able", "men", "give", "copy", "either", "lead", "family",
    "option", "exist", "offer", "water", "step", "display", "times", "four", "far", "present",
    "room", "once", "results", "continue", "talk", "grow", "mass", "mean", "until", "market",
    "area", "length", "kind", "light", "side", "example", "camp", "miss", "based", "plan", "away",
    "button", "render", "near", "country", "author", "specific", "along", "express", "begin",
    "software", "win", "thing", "why", "single", "rights", "women", "season", "dest", "possible",
    "sent", "command", "recent", "money", "told", "auto", "working", "query", "window", "least",
    "column", "record", "making", "close", "percent", "past", "write", "move", "special", "city",
    "tell", "select", "font", "course", "late", "amount", "enough", "looking", "hold", "property",
    "low", "para", "price", "today", "means", "story", "meet", "mom", "sort", "thought", "task",
    "review", "switch", "above", "question", "word", "provide", "research", "publish", "cover",
    "whether", "having", "employ", "large", "created", "host", "role", "web", "deal", "problem",
    "press", "though", "points", "ever", "services", "actually", "million", "happen", "server",
    "files", "often", "info", "space", "password", "store", "format", "details", "face", "save",
    "items", "social", "major", "expected", "yet", "food", "members", "bar", "send", "become",
    "makes", "global", "contact", "except", "certain", "news", "device", "previous", "material",
    "below", "media", "fail", "black", "added", "buy", "came", "delete", "card", "root", "handle",
    "getting", "comput", "claim", "air", "enter", "location", "night", "doing", "pick", "watch",
    "human", "dam", "tax", "girl", "box", "strong", "house", "track", "pack", "section", "wait",
    "together", "throws", "terms", "apply", "session", "others", "fund", "several", "template",
    "subject", "history", "users", "future", "started", "mode", "took", "games", "products", "bad",
    "needs", "known", "seen", "border", "live", "variable", "provided", "filename", "hope",
    "young", "website", "study", "network", "limit", "cut", "went", "fire", "across", "official",
    "visit", "received", "token", "months", "anim",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_distinct_lowercase_words() {
        let mut seen = std::collections::HashSet::new();
        for w in CANDIDATE_WORDS {
            assert!(w.chars().all(|c| c.is_ascii_lowercase()), "{w}");
            assert!(seen.insert(*w), "duplicate {w}");
        }
        assert!(CANDIDATE_WORDS.len() >= VOCABULARY_SIZE);
    }

    /// Pretends words longer than `max_letters` split into two tokens.
    struct SplitsLongWords {
        max_letters: usize,
    }
    impl TextTokenizer for SplitsLongWords {
        fn encode_text(&self, text: &str) -> Result<Vec<u32>, String> {
            let letters = text.trim_start().len();
            Ok(if letters > self.max_letters {
                vec![1, 2]
            } else {
                vec![letters as u32]
            })
        }
        fn tokenize_body(
            &self,
            _: switchyard_protocol::route::ApiKind,
            _: &serde_json::Value,
        ) -> Result<Vec<u32>, String> {
            Err("unused".into())
        }
    }

    #[test]
    fn from_tokenizer_keeps_only_single_token_words() {
        let vocab = Vocabulary::from_tokenizer(&SplitsLongWords { max_letters: 7 }).unwrap();
        assert_eq!(vocab.words().len(), VOCABULARY_SIZE);
        assert!(vocab
            .words()
            .iter()
            .all(|w| w.len() <= 8 && w.starts_with(' ')));
        assert_eq!(vocab.id(0), vocab.word(0).len() as u32 - 1);
    }

    #[test]
    fn from_tokenizer_reports_too_few_words() {
        let err = Vocabulary::from_tokenizer(&SplitsLongWords { max_letters: 3 }).unwrap_err();
        assert!(matches!(
            err,
            VocabularyError::TooFewSingleTokenWords { found, needed: VOCABULARY_SIZE, .. }
                if found < VOCABULARY_SIZE
        ));
    }
}
