//! Load generator and trace replayer.
//!
//! A run has three stages kept apart so that each can be reused on its own:
//!
//! 1. **Workload** (pure, seeded): [`trace`] turns a Mooncake trace into a [`Workload`],
//!    [`sessions`] a multi-turn session trace ([`trace_file`] reads either form),
//!    [`agentic`] synthesizes agentic sessions; session workloads are closed loop through
//!    one mechanism ([`closed_loop`]). A [`PlannedRequest`] says *when* (arrival
//!    time, dependencies on earlier requests), *what* (a [`prompts::PromptSpec`]: which content
//!    blocks, how many tokens of each) and how many tokens to generate. [`prompts`] turns a
//!    spec into text that tokenizes exactly as planned (see [`vocab`]), and into the request
//!    body. The virtual-time simulator consumes the same workload without HTTP.
//! 2. **Client** ([`client`]): replays a workload against any OpenAI-compatible endpoint with
//!    streaming, records one [`record::RequestRecord`] per request sent, failures included.
//! 3. **Report** ([`report`], [`markdown`]): latency percentiles, interactivity, throughput
//!    per GPU, goodput, route shares of one run; markdown and JSON.
//! 4. **Comparison** ([`compare`]): serving modes × load levels run by one harness over a
//!    backend (virtual time or the real stack), with one table, plot and output module.
//!
//! `docs/loadgen.md` explains the choices (token-exact prompts, metric definitions).

#![deny(missing_docs)]

pub mod agentic;
pub mod args;
pub mod arrival;
pub mod client;
pub mod closed_loop;
pub mod compare;
pub mod markdown;
pub mod prompts;
pub mod record;
pub mod report;
pub mod reuse;
pub mod sessions;
pub mod sse;
pub mod stats;
pub mod summary;
pub mod tokenizer;
pub mod trace;
pub mod trace_file;
pub mod vocab;

use serde::{Deserialize, Serialize};

use prompts::PromptSpec;

pub use args::WorkloadArgs;
pub use arrival::{ArrivalScale, LoadLevel};

/// One request of a workload, before it is sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedRequest {
    /// Index in [`Workload::requests`].
    pub id: usize,
    /// Earliest send time in ms after the start of the run (unscaled). For a request with
    /// dependencies this is the planner's estimate; the real send time is when they finish.
    pub arrival_ms: u64,
    /// Conversation or agent session this request belongs to.
    pub session: u64,
    /// Turn number within its session (and agent), from 0.
    pub turn: u32,
    /// 0 for a session's main agent, `k > 0` for its k-th sub-agent.
    pub agent: u32,
    /// Requests that must complete before this one is sent (closed-loop sessions); empty for
    /// open-loop traces.
    pub after: Vec<usize>,
    /// Pause after the last dependency completes (tool execution, user think time), unscaled.
    pub think_ms: u64,
    /// The prompt's content blocks; its token ids follow from the workload's content seed.
    pub prompt: PromptSpec,
    /// Output tokens to generate (`max_tokens`, with EOS ignored).
    pub osl: u32,
}

impl PlannedRequest {
    /// Prompt content tokens, without chat-template tokens (the trace's `input_length`).
    pub fn isl(&self) -> u64 {
        self.prompt.tokens()
    }
}

/// A list of planned requests plus what is needed to render their prompts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// Human-readable description, e.g. `mooncake:conversation` or `agentic:seed=7`.
    pub name: String,
    /// Seed of the block contents: equal (seed, block id) means equal tokens.
    pub content_seed: u64,
    /// Requests, sorted by `arrival_ms`, `id` = index.
    pub requests: Vec<PlannedRequest>,
}

impl Workload {
    /// Offered load: requests ÷ the arrival span scaled by `arrival`, requests/s; `None`
    /// when everything arrives at once, or when requests wait for earlier ones (closed loop:
    /// a turn is sent only after the turns it follows complete, so the rate is the served
    /// system's, not the workload's, and planned arrivals only order the requests).
    pub fn offered_rps(&self, arrival: ArrivalScale) -> Option<f64> {
        if self.requests.iter().any(|r| !r.after.is_empty()) {
            return None;
        }
        let first = self.requests.first()?.arrival_ms;
        let last = self.requests.iter().map(|r| r.arrival_ms).max()?;
        let span_ms = arrival.scale_ms(last.saturating_sub(first) as f64);
        (span_ms > 0.0).then(|| self.requests.len() as f64 / (span_ms / 1000.0))
    }

    /// A warning when the planned arrivals span more than a day: usually rows that mix
    /// Unix-epoch and relative timestamps, or a delay in the wrong unit. Such a workload
    /// still runs (virtual time skips the idle stretch; a real run waits or hits its
    /// duration cap), but its rates are those of that span.
    pub fn span_warning(&self) -> Option<String> {
        const DAY_MS: u64 = 86_400_000;
        let span = self.arrival_span_ms()?;
        (span > DAY_MS).then(|| {
            format!(
                "warning: {}'s planned arrivals span {:.1} days; rows mixing Unix-epoch and \
                 relative timestamps, or delays in the wrong unit, look like this",
                self.name,
                span as f64 / DAY_MS as f64
            )
        })
    }

    /// `Err` with why when the planned arrivals, scaled by `scale` (the workload's own
    /// times: [`ArrivalScale::PLANNED`]), span more than [`trace::MAX_ROW_MS`]: virtual time,
    /// a float of milliseconds, no longer resolves the replay's steps out there, and a replay
    /// would not end (rows' timestamps and delays are bounded each, but a session's delays
    /// add up, and a huge scale or a tiny load level stretches them further).
    ///
    /// # Errors
    /// The message, naming the span.
    pub fn check_span(&self, scale: ArrivalScale) -> Result<(), String> {
        let span = scale.scale_ms(self.arrival_span_ms().unwrap_or(0) as f64);
        if span.is_nan() || span > trace::MAX_ROW_MS as f64 {
            let scaled = if scale == ArrivalScale::PLANNED {
                String::new()
            } else {
                format!(" at arrival scale {:.3e}", scale.scale_ms(1.0))
            };
            return Err(format!(
                "{}'s planned arrivals span {span:.3e} ms{scaled}, more than {} ms",
                self.name,
                trace::MAX_ROW_MS
            ));
        }
        Ok(())
    }

    /// [`Workload::check_span`] at each of `levels` on `scale`, the error naming the
    /// flags that set them (`--arrival-scale`, `--load-levels`), as every tool that replays
    /// at load levels says it.
    ///
    /// # Errors
    /// The message of the first level that stretches the run too far.
    pub fn check_load_levels(
        &self,
        scale: ArrivalScale,
        levels: &[LoadLevel],
    ) -> Result<(), String> {
        for &level in levels {
            self.check_span(scale.at_level(level))
                .map_err(|e| format!("--arrival-scale / --load-levels: {e}"))?;
        }
        Ok(())
    }

    /// From the first planned arrival to the last (ms); `None` without requests.
    fn arrival_span_ms(&self) -> Option<u64> {
        let last = self.requests.iter().map(|r| r.arrival_ms).max()?;
        let first = self.requests.iter().map(|r| r.arrival_ms).min()?;
        Some(last - first)
    }

    /// Measures arrivals from the earliest one: a trace whose timestamps are, say, Unix
    /// milliseconds would otherwise wait decades before its first request. Every planned
    /// arrival moves, also those of requests that follow their dependencies: theirs were
    /// planned from the dependencies' own, and a send waits for the planned arrival too (the
    /// HTTP client and the virtual-time tracker both), so one left unmoved held every later
    /// turn of a session back by the trace's first timestamp.
    pub fn start_at_zero(&mut self) {
        let origin = self
            .requests
            .iter()
            .filter(|r| r.after.is_empty())
            .map(|r| r.arrival_ms)
            .min()
            .unwrap_or(0);
        for r in &mut self.requests {
            r.arrival_ms = r.arrival_ms.saturating_sub(origin);
        }
    }

    /// Keeps the first `n` requests (by arrival), dropping dependencies on removed ones.
    pub fn truncate(&mut self, n: usize) {
        self.requests.truncate(n);
        for r in &mut self.requests {
            r.after.retain(|&d| d < n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::prompts::Segment;
    use super::*;

    fn at(id: usize, arrival_ms: u64, after: Vec<usize>) -> PlannedRequest {
        PlannedRequest {
            id,
            arrival_ms,
            session: 0,
            turn: id as u32,
            agent: 0,
            after,
            think_ms: 0,
            prompt: PromptSpec {
                segments: vec![Segment {
                    block: 1,
                    tokens: 4,
                }],
            },
            osl: 1,
        }
    }

    #[test]
    fn offered_load_scales_with_the_arrival_scale() {
        let w = Workload {
            name: "w".into(),
            content_seed: 0,
            requests: vec![
                at(0, 1_000, vec![]),
                at(1, 2_000, vec![]),
                at(2, 3_000, vec![]),
            ],
        };
        let scale = |x: f64| ArrivalScale::new(x).unwrap();
        assert_eq!(w.offered_rps(scale(1.0)), Some(1.5));
        assert_eq!(w.offered_rps(scale(0.5)), Some(3.0));
        assert_eq!(w.offered_rps(scale(0.0)), None);
        let mut cut = w.clone();
        cut.truncate(2);
        assert_eq!(cut.requests.len(), 2);
        assert_eq!(cut.offered_rps(scale(1.0)), Some(2.0));
        // Closed loop: a turn that waits for another is sent when the system lets it.
        let mut closed = w.clone();
        closed.requests[2].after = vec![1];
        assert_eq!(closed.offered_rps(scale(1.0)), None);
    }
}
