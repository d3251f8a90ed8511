//! What the client measured for one request.

use serde::{Deserialize, Serialize};

/// One request as sent and measured. Every request the client sends gets a record, failed or
/// not; requests never sent (caps reached, dependencies never finished) get none and are
/// counted in the run summary instead.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// [`super::PlannedRequest::id`].
    pub id: usize,
    /// Session of the planned request.
    pub session: u64,
    /// Turn of the planned request.
    pub turn: u32,
    /// Agent (0 = main) of the planned request.
    pub agent: u32,
    /// When the request became ready to send (arrival time reached, dependencies done and
    /// think time over), ms since the run started.
    pub ready_ms: f64,
    /// When it was sent, ms since the run started; `sent_ms - ready_ms` is time spent waiting
    /// for the concurrency cap, not included in TTFT.
    pub sent_ms: f64,
    /// Time to first token: send to the first chunk carrying generated text, ms.
    pub ttft_ms: Option<f64>,
    /// End-to-end latency: send to the end of the stream, ms.
    pub e2e_ms: Option<f64>,
    /// Prompt content tokens planned (the trace's `input_length`).
    pub planned_isl: u64,
    /// Prompt tokens expected on the server: planned content plus chat-template tokens.
    pub expected_prompt_tokens: u64,
    /// Output tokens requested.
    pub planned_osl: u32,
    /// `usage.prompt_tokens` reported by the server.
    pub prompt_tokens: Option<u32>,
    /// `usage.completion_tokens` reported by the server.
    pub completion_tokens: Option<u32>,
    /// `usage.prompt_tokens_details.cached_tokens` reported by the server.
    pub cached_tokens: Option<u32>,
    /// Stream chunks that carried generated text.
    pub content_chunks: u32,
    /// `x-switchyard-route` response header (`bypass`, `disagg`, `agg`, `fail-open;reason=…`).
    pub route: Option<String>,
    /// `x-switchyard-worker` response header: the worker that served the request.
    pub worker: Option<String>,
    /// HTTP status, if a response arrived.
    pub status: Option<u16>,
    /// Why the request failed (connection, status, in-stream error, truncated stream,
    /// timeout); `None` for a success.
    pub error: Option<String>,
}

impl RequestRecord {
    /// Succeeded: a 2xx response whose stream ended cleanly with generated text.
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.status.is_some_and(|s| (200..300).contains(&s))
    }

    /// Output tokens: the server's count, else the number of content chunks.
    pub fn output_tokens(&self) -> u32 {
        self.completion_tokens.unwrap_or(self.content_chunks)
    }

    /// Inter-token latency, `(E2E − TTFT) / (output_tokens − 1)` ms; `None` for fewer than
    /// two output tokens or a failed request.
    pub fn itl_ms(&self) -> Option<f64> {
        let out = self.output_tokens();
        match (self.ok(), self.ttft_ms, self.e2e_ms) {
            (true, Some(ttft), Some(e2e)) if out >= 2 => Some((e2e - ttft) / f64::from(out - 1)),
            _ => None,
        }
    }

    /// Completion time, ms since the run started.
    pub fn done_ms(&self) -> Option<f64> {
        self.e2e_ms.map(|e| self.sent_ms + e)
    }
}
