//! Server-sent events from OpenAI-style streaming responses, parsed without I/O.
//!
//! The client feeds raw body bytes in whatever pieces the network delivers; [`SseParser`]
//! yields complete events, and [`interpret`] says what an event means for the measurements
//! (content arrived, usage counts, an in-stream error, the end).

use serde_json::Value;

/// Splits a byte stream into SSE `data:` payloads.
#[derive(Debug, Default)]
pub struct SseParser {
    buffer: Vec<u8>,
}

impl SseParser {
    /// Appends bytes and returns the `data` payloads of every event completed by them.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some((end, sep)) = find_event_end(&self.buffer) {
            let raw: Vec<u8> = self.buffer.drain(..end + sep).take(end).collect();
            if let Some(data) = event_data(&String::from_utf8_lossy(&raw)) {
                events.push(data);
            }
        }
        events
    }

    /// Whatever is left unterminated when the stream ends, as a final event if it has data.
    pub fn finish(&mut self) -> Option<String> {
        let rest = std::mem::take(&mut self.buffer);
        event_data(&String::from_utf8_lossy(&rest))
    }
}

/// Position and length of the first blank-line separator (`\n\n` or `\r\n\r\n`).
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|p| (p, 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| (p, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// The joined `data:` lines of one event, if any (comments and other fields are ignored).
fn event_data(event: &str) -> Option<String> {
    let lines: Vec<&str> = event
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// Token counts from a `usage` object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// `prompt_tokens`.
    pub prompt_tokens: Option<u32>,
    /// `completion_tokens`.
    pub completion_tokens: Option<u32>,
    /// `prompt_tokens_details.cached_tokens`.
    pub cached_tokens: Option<u32>,
}

/// What one event means for the measurements.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamEvent {
    /// The chunk carries generated text (or reasoning text): counts for TTFT and chunks.
    pub content: bool,
    /// Usage counts, when the chunk has them (the final chunk with `include_usage`).
    pub usage: Option<Usage>,
    /// `finish_reason` of the first choice, when set.
    pub finish_reason: Option<String>,
    /// An error object inside the stream.
    pub error: Option<String>,
    /// `[DONE]`: the stream is over.
    pub done: bool,
}

/// Interprets one `data` payload of a chat or completions stream.
pub fn interpret(data: &str) -> StreamEvent {
    let data = data.trim();
    if data == "[DONE]" {
        return StreamEvent {
            done: true,
            ..StreamEvent::default()
        };
    }
    let value: Value = match serde_json::from_str(data) {
        Ok(v) => v,
        Err(e) => {
            return StreamEvent {
                error: Some(format!("unparseable stream chunk ({e}): {}", clip(data))),
                ..StreamEvent::default()
            }
        }
    };
    let mut event = StreamEvent::default();
    if let Some(err) = value.get("error") {
        let message = err
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| clip(&err.to_string()));
        event.error = Some(message);
    }
    if let Some(choice) = value.get("choices").and_then(|c| c.get(0)) {
        let non_empty =
            |v: Option<&Value>| v.and_then(Value::as_str).is_some_and(|s| !s.is_empty());
        let delta = choice.get("delta");
        // A reasoning model streams its thinking first: vLLM names it `reasoning` (since
        // 0.19; it dropped `reasoning_content`, the name older servers and SGLang use).
        event.content = non_empty(choice.get("text"))
            || ["content", "reasoning", "reasoning_content"]
                .iter()
                .any(|field| non_empty(delta.and_then(|d| d.get(field))));
        event.finish_reason = choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    if let Some(usage) = value.get("usage").filter(|u| u.is_object()) {
        let count = |v: Option<&Value>| v.and_then(Value::as_u64).map(|n| n as u32);
        event.usage = Some(Usage {
            prompt_tokens: count(usage.get("prompt_tokens")),
            completion_tokens: count(usage.get("completion_tokens")),
            cached_tokens: count(
                usage
                    .get("prompt_tokens_details")
                    .and_then(|d| d.get("cached_tokens")),
            ),
        });
    }
    event
}

/// At most 200 characters of `s`, for error messages.
pub fn clip(s: &str) -> String {
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_reads_are_reassembled() {
        let mut p = SseParser::default();
        assert!(p.push(b"data: {\"a\"").is_empty());
        assert_eq!(
            p.push(b":1}\n\n: comment\n\ndata: [DONE]\r\n\r\n"),
            vec!["{\"a\":1}", "[DONE]"]
        );
        assert_eq!(p.finish(), None);
        p.push(b"data: tail");
        assert_eq!(p.finish().as_deref(), Some("tail"));
    }

    #[test]
    fn interprets_content_usage_and_errors() {
        let chat = interpret(r#"{"choices":[{"delta":{"content":"hi"},"finish_reason":null}]}"#);
        assert!(chat.content && chat.usage.is_none());
        for field in ["reasoning", "reasoning_content"] {
            let thinking = interpret(&format!(
                r#"{{"choices":[{{"delta":{{"{field}":" w"}}}}]}}"#
            ));
            assert!(thinking.content, "{field}");
        }
        let empty_role = interpret(r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#);
        assert!(!empty_role.content);
        let text = interpret(r#"{"choices":[{"text":" a","finish_reason":"length"}]}"#);
        assert!(text.content);
        assert_eq!(text.finish_reason.as_deref(), Some("length"));
        let usage = interpret(
            r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8}}}"#,
        );
        assert_eq!(
            usage.usage,
            Some(Usage {
                prompt_tokens: Some(10),
                completion_tokens: Some(3),
                cached_tokens: Some(8)
            })
        );
        assert_eq!(
            interpret(r#"{"error":{"message":"boom"}}"#)
                .error
                .as_deref(),
            Some("boom")
        );
        assert!(interpret("not json").error.is_some());
        assert!(interpret("[DONE]").done);
    }

    proptest::proptest! {
        /// However the network cuts the stream, the same events come out.
        #[test]
        fn any_split_of_a_stream_yields_the_same_events(cuts in proptest::collection::vec(0usize..400, 0..12)) {
            let stream = "data: {\"a\":1}\n\n: keep-alive\n\ndata: {\"b\":\"x\\n\"}\r\n\r\n\
                          event: e\ndata: one\ndata: two\n\ndata: [DONE]\n\n";
            let bytes = stream.as_bytes();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (bytes.len() + 1)).collect();
            cuts.sort_unstable();
            let mut parser = SseParser::default();
            let mut events = Vec::new();
            let mut from = 0;
            for cut in cuts.into_iter().chain([bytes.len()]) {
                events.extend(parser.push(&bytes[from..cut]));
                from = cut;
            }
            proptest::prop_assert_eq!(events, vec!["{\"a\":1}", "{\"b\":\"x\\n\"}", "one\ntwo", "[DONE]"]);
            proptest::prop_assert_eq!(parser.finish(), None);
        }
    }
}
