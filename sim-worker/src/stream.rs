//! The SSE body of a streamed completion: one `data: {chunk}` event per token as the engine
//! produces it, a finish chunk, an optional usage chunk, then `data: [DONE]`.
//!
//! The stream owns an [`AbortGuard`]: when the client disconnects, hyper drops the body, the
//! guard aborts the request in the engine, and its KV blocks are freed at once.
//!
//! A stream the engine stops before its end (the worker shutting down past its drain limit)
//! ends in an error, so the connection is cut rather than ended cleanly: a client must not
//! read a truncated answer as a complete one (OpenAI clients do not require `[DONE]`).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use serde_json::Value;
use tokio::sync::mpsc;

use super::openai::{filler_token, ResponseMeta, Usage};
use super::runtime::{EngineHandle, RequestEvent};

/// Aborts a request in the engine when dropped before [`AbortGuard::disarm`].
#[derive(Debug)]
pub struct AbortGuard {
    engine: EngineHandle,
    id: u64,
    armed: bool,
}

impl AbortGuard {
    /// Guards request `id`.
    pub fn new(engine: EngineHandle, id: u64) -> Self {
        AbortGuard {
            engine,
            id,
            armed: true,
        }
    }

    /// The request finished: nothing to abort.
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if self.armed {
            self.engine.abort(self.id);
        }
    }
}

/// A streamed completion's body.
#[derive(Debug)]
pub struct SseStream {
    events: mpsc::UnboundedReceiver<RequestEvent>,
    meta: ResponseMeta,
    include_usage: bool,
    generated: u32,
    pending: VecDeque<Bytes>,
    done: bool,
    /// The engine stopped before the request finished: the body ends in [`StreamCut`].
    cut: bool,
    guard: AbortGuard,
}

/// The engine stopped streaming a request before its end.
#[derive(Debug, thiserror::Error)]
#[error("the worker stopped before the stream's end")]
pub struct StreamCut;

impl SseStream {
    /// Streams the events of one request.
    pub fn new(
        events: mpsc::UnboundedReceiver<RequestEvent>,
        meta: ResponseMeta,
        include_usage: bool,
        guard: AbortGuard,
    ) -> Self {
        SseStream {
            events,
            meta,
            include_usage,
            generated: 0,
            pending: VecDeque::new(),
            done: false,
            cut: false,
            guard,
        }
    }

    fn push(&mut self, chunk: &Value) {
        self.pending
            .push_back(Bytes::from(format!("data: {chunk}\n\n")));
    }

    fn on_event(&mut self, event: RequestEvent) {
        match event {
            RequestEvent::FirstToken | RequestEvent::Token => {
                let first = self.generated == 0;
                let chunk = self.meta.text_chunk(filler_token(self.generated), first);
                self.generated += 1;
                self.push(&chunk);
            }
            RequestEvent::Finished {
                prompt_tokens,
                completion_tokens,
                cached_tokens,
                remote_tokens,
                ..
            } => {
                self.guard.disarm();
                let finish = self.meta.finish_chunk();
                self.push(&finish);
                if self.include_usage {
                    let usage = Usage {
                        prompt_tokens,
                        completion_tokens,
                        cached_tokens: (cached_tokens + remote_tokens).min(prompt_tokens),
                    };
                    let chunk = self.meta.usage_chunk(usage);
                    self.push(&chunk);
                }
                self.pending
                    .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                self.done = true;
            }
        }
    }
}

impl Stream for SseStream {
    type Item = Result<Bytes, StreamCut>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(bytes) = self.pending.pop_front() {
                return Poll::Ready(Some(Ok(bytes)));
            }
            if self.done {
                return Poll::Ready(None);
            }
            if self.cut {
                // Said once; hyper then closes the connection without the chunked body's end.
                self.done = true;
                return Poll::Ready(Some(Err(StreamCut)));
            }
            match self.events.poll_recv(cx) {
                Poll::Ready(Some(event)) => self.on_event(event),
                // The engine stopped (shutdown): cut the body without `[DONE]`, as a worker
                // that dies mid-stream would.
                Poll::Ready(None) => self.cut = true,
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
