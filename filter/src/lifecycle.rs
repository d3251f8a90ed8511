//! Lifecycle reports: the bounded per-VM queue of events, and the cheap `usage` scan of a
//! response's tail (pure).
//!
//! Requests only push events (never block, never wait for the control plane); the root
//! context's timer drains the queue in batches. A batch the control plane did not take (no
//! answer, a 502, 503 or 504: [`answer`]) goes back to the front and is sent again: a `done`
//! lost there would leave its request counted in flight until the control plane's request
//! timeout, minutes later. A root context finishing after a configuration swap has no timer
//! left to send it again, so there such a batch is dropped with the rest of the queue
//! ([`LifecycleQueue::clear`]). When the control plane is away the queue fills up to its
//! bound and further events are dropped and counted: a filter that grows without bound is
//! worse than load expired late.

use std::collections::VecDeque;

use serde::Deserialize;
use switchyard_protocol::lifecycle::{LifecycleBatch, LifecycleEvent};
use switchyard_protocol::PROTOCOL_VERSION;

/// The bounded queue of events not yet sent.
#[derive(Debug, Clone)]
pub struct LifecycleQueue {
    events: VecDeque<LifecycleEvent>,
    max: usize,
}

impl LifecycleQueue {
    /// An empty queue holding at most `max` events (at least one).
    pub fn new(max: usize) -> Self {
        LifecycleQueue {
            events: VecDeque::new(),
            max: max.max(1),
        }
    }

    /// Queues an event; false (the event is dropped) when the queue is full. A `failed_open`
    /// report may fill only half of it: such a report matters only when the control plane
    /// holds a late route call, and an outage makes one for every request, which would
    /// otherwise crowd out the `done` reports that free load counted on a worker.
    pub fn push(&mut self, event: LifecycleEvent) -> bool {
        let room = if event.is_failed_open() {
            (self.max / 2).max(1)
        } else {
            self.max
        };
        if self.events.len() >= room {
            return false;
        }
        self.events.push_back(event);
        true
    }

    /// Takes up to `max_events` of the oldest events as a batch, or `None` when empty.
    pub fn take_batch(&mut self, max_events: usize) -> Option<LifecycleBatch> {
        if self.events.is_empty() {
            return None;
        }
        let n = max_events.max(1).min(self.events.len());
        Some(LifecycleBatch {
            v: PROTOCOL_VERSION,
            events: self.events.drain(..n).collect(),
        })
    }

    /// Puts a batch whose POST failed back at the front, in order, as far as the bound
    /// allows (the newest of it are dropped first); returns how many were dropped. The control
    /// plane applies each event once per request id, so a batch it did get is harmless again.
    pub fn requeue(&mut self, events: Vec<LifecycleEvent>) -> usize {
        let room = self.max.saturating_sub(self.events.len());
        let kept = events.len().min(room);
        let dropped = events.len() - kept;
        for event in events.into_iter().take(kept).rev() {
            self.events.push_front(event);
        }
        dropped
    }

    /// Changes the bound (events already queued stay, even above a lower bound).
    pub fn set_max(&mut self, max: usize) {
        self.max = max.max(1);
    }

    /// Drops every event waiting; returns how many.
    pub fn clear(&mut self) -> usize {
        let dropped = self.events.len();
        self.events.clear();
        dropped
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

/// What became of a lifecycle POST, from its `:status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// A 2xx: the events are applied.
    Taken,
    /// No answer (the call failed), or a 502/503/504 (Envoy's own when the control plane is
    /// unreachable or too slow, or the control plane unavailable): worth sending again.
    NotTaken,
    /// Anything else: the control plane refused the batch, and would again.
    Refused,
}

/// Classifies a lifecycle POST's `:status`.
pub fn answer(status: Option<&str>) -> Answer {
    match status.map(|s| s.trim().parse::<u16>()) {
        None | Some(Err(_)) => Answer::NotTaken,
        Some(Ok(200..=299)) => Answer::Taken,
        Some(Ok(502..=504)) => Answer::NotTaken,
        Some(Ok(_)) => Answer::Refused,
    }
}

/// Whether the first body bytes of a response with this `:status` are its first token: only
/// a 2xx's. An error body means the engine refused the prompt (a bad field, too long), so
/// nothing of it is cached; the `done` that follows then withdraws what the verdict predicted.
/// Taken for a first token, it made the corrected retry a bypass onto an empty cache.
pub fn is_first_token(status: Option<u16>) -> bool {
    status.is_some_and(|code| (200..300).contains(&code))
}

/// The last bytes of a response body, kept while it streams past untouched. The usage of a
/// streamed response is in its last SSE chunk before `[DONE]`, that of a JSON response near its
/// end, so a few KiB of tail find it without buffering the response.
#[derive(Debug, Clone, Default)]
pub struct Tail {
    bytes: Vec<u8>,
}

/// How much of a response's end is kept for the usage scan.
pub const TAIL_BYTES: usize = 4096;

impl Tail {
    /// Appends a chunk, keeping only the last [`TAIL_BYTES`].
    pub fn push(&mut self, chunk: &[u8]) {
        if chunk.len() >= TAIL_BYTES {
            self.bytes.clear();
            self.bytes
                .extend_from_slice(&chunk[chunk.len() - TAIL_BYTES..]);
            return;
        }
        let overflow = (self.bytes.len() + chunk.len()).saturating_sub(TAIL_BYTES);
        self.bytes.drain(..overflow.min(self.bytes.len()));
        self.bytes.extend_from_slice(chunk);
    }

    /// The kept bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// Token counts from a response's `usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    #[serde(default)]
    pub prompt_tokens: Option<u32>,
    /// Generated tokens.
    #[serde(default)]
    pub completion_tokens: Option<u32>,
}

/// How many `"usage"` occurrences the scan tries, from the end (streamed chunks may carry
/// `"usage": null`; the real one is the last that parses).
const MAX_USAGE_CANDIDATES: usize = 8;

/// Finds the last parsable `"usage": {...}` object in `tail`. Never panics; `None` when there
/// is none (the usage then stays unknown, which the control plane accepts).
pub fn usage_from_tail(tail: &[u8]) -> Option<Usage> {
    const KEY: &[u8] = b"\"usage\"";
    let mut end = tail.len();
    for _ in 0..MAX_USAGE_CANDIDATES {
        let start = find_last(&tail[..end], KEY)?;
        if let Some(usage) = parse_usage_after(&tail[start + KEY.len()..]) {
            return Some(usage);
        }
        end = start;
    }
    None
}

fn find_last(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    (0..=haystack.len() - needle.len())
        .rev()
        .find(|&i| haystack[i..].starts_with(needle))
}

fn parse_usage_after(rest: &[u8]) -> Option<Usage> {
    let colon = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    if rest.get(colon) != Some(&b':') {
        return None;
    }
    let value = &rest[colon + 1..];
    let open = value.iter().position(|b| !b.is_ascii_whitespace())?;
    if value.get(open) != Some(&b'{') {
        return None;
    }
    // Reads exactly one JSON value and ignores what follows (the rest of the chunk).
    let mut values = serde_json::Deserializer::from_slice(&value[open..]).into_iter::<Usage>();
    let usage = values.next()?.ok()?;
    (usage.prompt_tokens.is_some() || usage.completion_tokens.is_some()).then_some(usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first(id: &str) -> LifecycleEvent {
        LifecycleEvent::FirstToken {
            request_id: id.into(),
        }
    }

    #[test]
    fn only_a_successful_responses_first_bytes_are_a_first_token() {
        assert!(is_first_token(Some(200)));
        assert!(!is_first_token(Some(400)));
        assert!(!is_first_token(Some(503)));
        assert!(!is_first_token(None));
    }

    #[test]
    fn the_queue_is_bounded_and_drains_oldest_first_in_batches() {
        let mut queue = LifecycleQueue::new(3);
        assert!(queue.push(first("a")));
        assert!(queue.push(first("b")));
        assert!(queue.push(first("c")));
        assert!(!queue.push(first("d")), "a full queue drops");
        let batch = queue.take_batch(2).expect("batch");
        assert_eq!(batch.events, vec![first("a"), first("b")]);
        assert_eq!(batch.v, PROTOCOL_VERSION);
        assert_eq!(queue.len(), 1);
        assert_eq!(queue.take_batch(10).unwrap().events, vec![first("c")]);
        assert!(queue.take_batch(10).is_none());
        assert!(queue.is_empty());
    }

    #[test]
    fn clearing_drops_every_waiting_event_and_says_how_many() {
        let mut queue = LifecycleQueue::new(4);
        assert_eq!(queue.clear(), 0);
        assert!(queue.push(first("a")));
        assert!(queue.push(LifecycleEvent::completed("b")));
        assert_eq!(queue.clear(), 2);
        assert!(queue.is_empty());
        assert!(queue.take_batch(10).is_none());
    }

    #[test]
    fn failed_open_reports_leave_half_the_queue_to_the_others() {
        let mut queue = LifecycleQueue::new(4);
        assert!(queue.push(LifecycleEvent::failed_open("a")));
        assert!(queue.push(LifecycleEvent::failed_open("b")));
        assert!(
            !queue.push(LifecycleEvent::failed_open("c")),
            "half full of them: dropped"
        );
        assert!(queue.push(LifecycleEvent::completed("d")));
        assert!(queue.push(first("e")));
        assert!(!queue.push(first("f")), "full");
        assert_eq!(queue.len(), 4);
        // A queue of one still takes one.
        assert!(LifecycleQueue::new(1).push(LifecycleEvent::failed_open("x")));
    }

    #[test]
    fn only_a_batch_the_control_plane_did_not_get_is_sent_again() {
        assert_eq!(answer(Some("200")), Answer::Taken);
        assert_eq!(answer(Some("204")), Answer::Taken);
        for status in [None, Some("503"), Some("504"), Some("502"), Some("")] {
            assert_eq!(answer(status), Answer::NotTaken, "{status:?}");
        }
        for status in ["400", "413", "500", "301"] {
            assert_eq!(answer(Some(status)), Answer::Refused, "{status}");
        }
    }

    #[test]
    fn a_failed_batch_goes_back_first_and_in_order_as_far_as_the_bound_allows() {
        let mut queue = LifecycleQueue::new(4);
        for id in ["a", "b", "c"] {
            assert!(queue.push(first(id)));
        }
        let batch = queue.take_batch(2).expect("batch");
        assert!(queue.push(first("d")));
        assert_eq!(queue.requeue(batch.events), 0);
        let order: Vec<_> = queue.take_batch(10).unwrap().events;
        assert_eq!(order, vec![first("a"), first("b"), first("c"), first("d")]);
        // Full meanwhile: the oldest of the batch go back, its newest are dropped.
        let mut queue = LifecycleQueue::new(3);
        for id in ["a", "b", "c"] {
            assert!(queue.push(first(id)));
        }
        let batch = queue.take_batch(3).expect("batch");
        assert!(queue.push(first("x")));
        assert!(queue.push(first("y")));
        assert_eq!(queue.requeue(batch.events), 2);
        assert_eq!(
            queue.take_batch(10).unwrap().events,
            vec![first("a"), first("x"), first("y")]
        );
    }

    #[test]
    fn the_tail_keeps_the_last_bytes() {
        let mut tail = Tail::default();
        tail.push(b"abc");
        tail.push(&vec![b'x'; TAIL_BYTES - 1]);
        assert_eq!(tail.as_bytes().len(), TAIL_BYTES);
        assert_eq!(tail.as_bytes()[0], b'c');
        tail.push(&vec![b'y'; TAIL_BYTES + 5]);
        assert_eq!(tail.as_bytes(), vec![b'y'; TAIL_BYTES].as_slice());
    }

    #[test]
    fn usage_is_found_in_an_sse_tail_and_a_json_body() {
        let sse = b"data: {\"choices\":[{\"delta\":{}}],\"usage\":null}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":5,\"total_tokens\":17}}\n\ndata: [DONE]\n\n";
        assert_eq!(
            usage_from_tail(sse),
            Some(Usage {
                prompt_tokens: Some(12),
                completion_tokens: Some(5)
            })
        );
        let json = br#"{"id":"x","usage" : {"prompt_tokens":3,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}},"kv_transfer_params":null}"#;
        assert_eq!(usage_from_tail(json).unwrap().prompt_tokens, Some(3));
        let only_null = b"data: {\"usage\":null}\n\ndata: [DONE]";
        assert_eq!(usage_from_tail(only_null), None);
        assert_eq!(usage_from_tail(b"\"usage\""), None);
        assert_eq!(usage_from_tail(b"ge\":{\"prompt_tokens\":1}}"), None);
    }
}
