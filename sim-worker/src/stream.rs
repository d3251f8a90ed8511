//! The SSE body of a streamed completion: one `data: {chunk}` event per token as the engine
//! produces it, a finish chunk, an optional usage chunk, then `data: [DONE]`.
//!
//! The stream owns an [`AbortGuard`]: when the client disconnects, hyper drops the body, the
//! guard aborts the request in the engine, and its KV blocks are freed at once.

use std::collections::VecDeque;
use std::convert::Infallible;
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
    guard: AbortGuard,
}

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
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(bytes) = self.pending.pop_front() {
                return Poll::Ready(Some(Ok(bytes)));
            }
            if self.done {
                return Poll::Ready(None);
            }
            match self.events.poll_recv(cx) {
                Poll::Ready(Some(event)) => self.on_event(event),
                // The engine stopped (shutdown): end the body without `[DONE]`, as a worker
                // that dies mid-stream would.
                Poll::Ready(None) => self.done = true,
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
