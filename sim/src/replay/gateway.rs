//! The gateway's CPU time before a request reaches its first engine, as a processor-sharing
//! queue.
//!
//! **Simulated.** On the real stack a request does not reach a worker's engine at the instant
//! the client sends it: Envoy buffers the body, the control plane applies the chat template
//! and tokenizes the whole prompt to route it, and the worker tokenizes it again before
//! submitting it. That work is CPU time proportional to the prompt length, and requests that
//! arrive together share the machine's cores while doing it. Two consequences the engine
//! model alone misses:
//!
//! 1. every TTFT grows by the request's own gateway time (more under a burst), and
//! 2. a burst of simultaneous arrivals reaches the engines **shortest prompt first**: under
//!    processor sharing a short prompt's tokenization finishes before a long one's, so a
//!    single prefill worker's FCFS queue ends up ordered by length, not by arrival order.
//!
//! The second effect is what made the real stack's disaggregated TTFT p50 35–45 % lower than
//! virtual time on the Mooncake trace (bursts of ten requests with the same timestamp, one
//! prefill worker; `docs/benchmarks.md`). The default [`GatewayModel::FREE`] turns the stage
//! off (the modelled GPUs only, as a production gateway on many cores would be close to);
//! the real-stack cross-check sets it from a measurement of the tokenizer on the same machine.

/// CPU cost of the gateway path per request, and the cores it runs on.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct GatewayModel {
    /// CPU time per prompt token on the path to the first engine (all tokenizations
    /// together), in the run's time unit (modelled ms).
    pub ms_per_prompt_token: f64,
    /// Cores the gateway work shares (processor sharing: `n` requests in the stage each
    /// progress at `min(1, cpus / n)`).
    pub cpus: u32,
    /// CPU time per prompt token a disaggregated request spends between its prefill leg and
    /// its KV transfer (the decode worker tokenizes the decode leg's body), modelled ms; not
    /// shared, see [`crate::vtime::Cluster::set_handoff_cpu_ms_per_prompt_token`].
    pub decode_leg_ms_per_prompt_token: f64,
}

impl GatewayModel {
    /// No gateway cost: a request reaches the router and its engine when it is sent.
    pub const FREE: GatewayModel = GatewayModel {
        ms_per_prompt_token: 0.0,
        cpus: 1,
        decode_leg_ms_per_prompt_token: 0.0,
    };

    /// Whether the stage costs nothing (then requests skip it).
    pub fn is_free(&self) -> bool {
        self.ms_per_prompt_token <= 0.0
    }

    /// CPU work of a prompt of `prompt_tokens` tokens, ms.
    pub fn work_ms(&self, prompt_tokens: u64) -> f64 {
        self.ms_per_prompt_token.max(0.0) * prompt_tokens as f64
    }

    /// Checks the fields.
    ///
    /// # Errors
    /// A message naming the bad field.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.ms_per_prompt_token.is_finite() && self.ms_per_prompt_token >= 0.0) {
            return Err(format!(
                "gateway ms per prompt token must be finite and >= 0, got {}",
                self.ms_per_prompt_token
            ));
        }
        if !(self.decode_leg_ms_per_prompt_token.is_finite()
            && self.decode_leg_ms_per_prompt_token >= 0.0)
        {
            return Err(format!(
                "decode-leg ms per prompt token must be finite and >= 0, got {}",
                self.decode_leg_ms_per_prompt_token
            ));
        }
        if self.cpus == 0 {
            return Err("gateway cpus must be at least 1".into());
        }
        Ok(())
    }
}

impl Default for GatewayModel {
    fn default() -> Self {
        GatewayModel::FREE
    }
}

/// Work below this (ms) counts as done, absorbing floating-point rounding.
const DONE_EPS_MS: f64 = 1e-9;

/// One request in the stage.
#[derive(Debug, Clone, Copy)]
struct Job {
    id: usize,
    sent_ms: f64,
    remaining_ms: f64,
}

/// Requests in the gateway stage, processor-shared over the model's cores. Pure: times are
/// passed in and never go backwards.
#[derive(Debug)]
pub(crate) struct GatewayQueue {
    cpus: f64,
    now_ms: f64,
    jobs: Vec<Job>,
}

impl GatewayQueue {
    pub(crate) fn new(model: GatewayModel) -> Self {
        GatewayQueue {
            cpus: f64::from(model.cpus.max(1)),
            now_ms: 0.0,
            jobs: Vec::new(),
        }
    }

    /// Share of one core each job gets now.
    fn rate(&self) -> f64 {
        if self.jobs.is_empty() {
            1.0
        } else {
            (self.cpus / self.jobs.len() as f64).min(1.0)
        }
    }

    fn advance_to(&mut self, t: f64) {
        if t > self.now_ms {
            let done = (t - self.now_ms) * self.rate();
            for job in &mut self.jobs {
                job.remaining_ms -= done;
            }
            self.now_ms = t;
        }
    }

    /// Request `id`, sent at `sent_ms`, enters the stage at `t` with `work_ms` of CPU work.
    pub(crate) fn push(&mut self, t: f64, id: usize, sent_ms: f64, work_ms: f64) {
        self.advance_to(t);
        self.jobs.push(Job {
            id,
            sent_ms,
            remaining_ms: work_ms.max(0.0),
        });
    }

    /// When the next request leaves the stage (at the current sharing).
    pub(crate) fn next_done_ms(&self) -> Option<f64> {
        let least = self
            .jobs
            .iter()
            .map(|j| j.remaining_ms)
            .min_by(f64::total_cmp)?;
        Some(self.now_ms + least.max(0.0) / self.rate())
    }

    /// Advances to `t` and removes the requests done by then, as `(id, sent_ms)` in the order
    /// they entered.
    pub(crate) fn take_done(&mut self, t: f64) -> Vec<(usize, f64)> {
        self.advance_to(t);
        let mut done = Vec::new();
        self.jobs.retain(|j| {
            if j.remaining_ms <= DONE_EPS_MS {
                done.push((j.id, j.sent_ms));
                false
            } else {
                true
            }
        });
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(ms_per_token: f64, cpus: u32) -> GatewayModel {
        GatewayModel {
            ms_per_prompt_token: ms_per_token,
            cpus,
            decode_leg_ms_per_prompt_token: 0.0,
        }
    }

    fn drain(q: &mut GatewayQueue) -> Vec<(usize, f64)> {
        let mut out = Vec::new();
        while let Some(t) = q.next_done_ms() {
            for (id, _) in q.take_done(t) {
                out.push((id, t));
            }
        }
        out
    }

    #[test]
    fn a_burst_leaves_shortest_first_under_processor_sharing() {
        let m = model(0.01, 1);
        let mut q = GatewayQueue::new(m);
        // Sent together, longest first (as a trace burst in id order can be).
        for (id, tokens) in [(0, 3000u64), (1, 1000), (2, 2000)] {
            q.push(0.0, id, 0.0, m.work_ms(tokens));
        }
        let out = drain(&mut q);
        let order: Vec<usize> = out.iter().map(|o| o.0).collect();
        assert_eq!(order, vec![1, 2, 0]);
        // One core shared three ways: the 10 ms job ends at 30 ms, the 20 ms one at
        // 30 + 10·2 = 50 ms, the 30 ms one at 50 + 10 = 60 ms (total work 60 ms).
        let times: Vec<f64> = out.iter().map(|o| o.1).collect();
        for (got, want) in times.iter().zip([30.0, 50.0, 60.0]) {
            assert!((got - want).abs() < 1e-6, "{times:?}");
        }
        assert_eq!(q.next_done_ms(), None);
    }

    #[test]
    fn spare_cores_do_not_speed_up_one_request() {
        let m = model(0.01, 4);
        let mut q = GatewayQueue::new(m);
        q.push(5.0, 7, 5.0, m.work_ms(1000));
        q.push(5.0, 8, 5.0, m.work_ms(500));
        assert_eq!(q.next_done_ms(), Some(10.0));
        assert_eq!(q.take_done(10.0), vec![(8, 5.0)]);
        assert_eq!(q.next_done_ms(), Some(15.0));
        assert!(q.take_done(14.0).is_empty(), "not done before its time");
        assert_eq!(q.take_done(15.0), vec![(7, 5.0)]);
    }

    #[test]
    fn validation_and_free_model() {
        assert!(GatewayModel::FREE.is_free());
        assert!(GatewayModel::FREE.validate().is_ok());
        assert!(model(-1.0, 1).validate().is_err());
        assert!(model(f64::NAN, 1).validate().is_err());
        assert!(model(0.01, 0).validate().is_err());
        let mut bad_leg = model(0.01, 1);
        bad_leg.decode_leg_ms_per_prompt_token = -0.5;
        assert!(bad_leg.validate().is_err());
        assert_eq!(model(0.5, 2).work_ms(10), 5.0);
    }
}
