//! The task that owns one worker's engine core and drives it in real time.
//!
//! The worker core ([`WorkerCore`]: the engine and the batches it publishes) is pure; this
//! task gives it a clock. It sleeps until the engine's next event (scaled by the time scale)
//! or a command, steps the core to "now", routes each output to its request's channel,
//! hands the step's KV event batches to the worker's [`KvSink`] (NATS or the vLLM wire), and
//! publishes a load snapshot. Everyone else talks to it
//! through an [`EngineHandle`] (one command enum, `oneshot` replies).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use switchyard_engine::worker_core::WorkerCore;
use switchyard_engine::{
    EngineError, EngineOutput, EngineRequest, HeldKv, LoadSnapshot, Prompt, SpeedUp,
};

use super::kv_sink::KvSink;
use super::metrics::WorkerMetrics;

/// Batches (vLLM wire: steps) waiting for the publisher; beyond this the newest are dropped
/// (counted) and the control plane sees the gap in sequence numbers (Switchyard's wire: it
/// asks for a resync; vLLM's: it replays or resets).
pub const KV_PUBLISH_QUEUE: usize = 1_024;

/// Maps the engine's milliseconds to tokio instants. A speed-up > 1 runs the model faster
/// than real time (a 100 ms iteration takes 100 / speed-up ms of wall time).
#[derive(Debug, Clone, Copy)]
pub struct EngineClock {
    start: Instant,
    speed_up: SpeedUp,
}

impl EngineClock {
    /// A clock at engine time 0 now.
    pub fn new(speed_up: SpeedUp) -> Self {
        EngineClock {
            start: Instant::now(),
            speed_up,
        }
    }

    /// Engine time now, ms.
    pub fn now_ms(&self) -> f64 {
        self.speed_up
            .model_ms(self.start.elapsed().as_secs_f64() * 1e3)
    }

    /// The instant at which engine time reaches `ms`.
    pub fn instant_at(&self, ms: f64) -> Instant {
        self.start + self.real_duration(ms)
    }

    /// Wall-clock duration of `ms` of engine time (at most a day: no engine waits longer,
    /// and an absurd model time must not panic the engine task).
    pub fn real_duration(&self, ms: f64) -> std::time::Duration {
        const LONGEST: std::time::Duration = std::time::Duration::from_secs(86_400);
        std::time::Duration::try_from_secs_f64(self.speed_up.wall_ms(ms).max(0.0) / 1e3)
            .map_or(LONGEST, |wait| wait.min(LONGEST))
    }
}

/// What a request's channel receives.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestEvent {
    /// First token generated.
    FirstToken,
    /// Another token generated.
    Token,
    /// Done.
    Finished {
        /// Prompt length.
        prompt_tokens: u32,
        /// Tokens generated.
        completion_tokens: u32,
        /// Prompt tokens from the local prefix cache.
        cached_tokens: u32,
        /// Prompt tokens whose KV was pulled from a prefill worker.
        remote_tokens: u32,
        /// The KV held for a decode worker, on a prefill leg.
        held: Option<HeldKv>,
    },
}

enum Command {
    Submit {
        req: EngineRequest,
        events: mpsc::UnboundedSender<RequestEvent>,
        reply: oneshot::Sender<Result<(), EngineError>>,
    },
    Abort {
        id: u64,
    },
    ReleaseHeld {
        id: u64,
        reply: oneshot::Sender<Option<HeldKv>>,
    },
    ReadablePrefix {
        prompt: Prompt,
        reply: oneshot::Sender<u32>,
    },
    Resync,
}

/// The engine task went away (the worker is shutting down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the worker's engine has stopped")]
pub struct EngineStopped;

/// Cheap, cloneable access to one worker's engine task.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    commands: mpsc::UnboundedSender<Command>,
    load: watch::Receiver<LoadSnapshot>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Command::Submit { .. } => "Submit",
            Command::Abort { .. } => "Abort",
            Command::ReleaseHeld { .. } => "ReleaseHeld",
            Command::ReadablePrefix { .. } => "ReadablePrefix",
            Command::Resync => "Resync",
        })
    }
}

impl EngineHandle {
    /// Whether the engine task still runs (it stops on shutdown, or if it failed).
    pub fn is_running(&self) -> bool {
        !self.commands.is_closed()
    }

    /// Queues a request; its outputs arrive on the returned channel.
    ///
    /// # Errors
    /// `Ok(Err(_))` when the engine refuses the request; `Err(EngineStopped)` on shutdown.
    pub async fn submit(
        &self,
        req: EngineRequest,
    ) -> Result<Result<mpsc::UnboundedReceiver<RequestEvent>, EngineError>, EngineStopped> {
        let (events, rx) = mpsc::unbounded_channel();
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Submit { req, events, reply })
            .map_err(|_| EngineStopped)?;
        let accepted = answer.await.map_err(|_| EngineStopped)?;
        Ok(accepted.map(|()| rx))
    }

    /// Cancels a request (no-op when it already finished).
    pub fn abort(&self, id: u64) {
        let _ = self.commands.send(Command::Abort { id });
    }

    /// Releases KV held for a decode worker, returning what was held (`None`: not held, e.g.
    /// the lease expired or it was already pulled).
    ///
    /// # Errors
    /// [`EngineStopped`] on shutdown.
    pub async fn release_held(&self, id: u64) -> Result<Option<HeldKv>, EngineStopped> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::ReleaseHeld { id, reply })
            .map_err(|_| EngineStopped)?;
        answer.await.map_err(|_| EngineStopped)
    }

    /// Tokens of `prompt`'s prefix this worker would read from its cache now (see
    /// `Engine::readable_prefix_tokens`): what a missing-suffix transfer need not move.
    ///
    /// # Errors
    /// [`EngineStopped`] on shutdown.
    pub async fn readable_prefix_tokens(&self, prompt: Prompt) -> Result<u32, EngineStopped> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::ReadablePrefix { prompt, reply })
            .map_err(|_| EngineStopped)?;
        answer.await.map_err(|_| EngineStopped)
    }

    /// Asks for a resync dump on the KV event stream.
    pub fn request_resync(&self) {
        let _ = self.commands.send(Command::Resync);
    }

    /// The engine's load after its latest step.
    pub fn load(&self) -> LoadSnapshot {
        *self.load.borrow()
    }
}

/// Starts the engine task. KV events go to `kv_out`; the task ends when every handle is
/// dropped.
pub fn spawn_engine(
    core: WorkerCore,
    clock: EngineClock,
    kv_out: Box<dyn KvSink>,
    metrics: Arc<WorkerMetrics>,
) -> (EngineHandle, tokio::task::JoinHandle<()>) {
    let (commands, rx) = mpsc::unbounded_channel();
    let (load_tx, load) = watch::channel(core.engine().load());
    let task = EngineTask {
        core,
        clock,
        kv_out,
        metrics,
        load_tx,
        requests: HashMap::new(),
        outputs: Vec::new(),
    };
    let join = tokio::spawn(task.run(rx));
    (EngineHandle { commands, load }, join)
}

struct EngineTask {
    core: WorkerCore,
    clock: EngineClock,
    kv_out: Box<dyn KvSink>,
    metrics: Arc<WorkerMetrics>,
    load_tx: watch::Sender<LoadSnapshot>,
    requests: HashMap<u64, mpsc::UnboundedSender<RequestEvent>>,
    outputs: Vec<EngineOutput>,
}

impl EngineTask {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        loop {
            let deadline = self
                .core
                .next_event_ms()
                .map(|ms| self.clock.instant_at(ms));
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(cmd) => {
                        self.handle(cmd);
                        // Take whatever else queued up before stepping once.
                        while let Ok(cmd) = rx.try_recv() {
                            self.handle(cmd);
                        }
                    }
                    None => break,
                },
                _ = sleep_until_opt(deadline) => {}
            }
            self.step();
        }
    }

    fn handle(&mut self, cmd: Command) {
        let now = self.clock.now_ms();
        match cmd {
            Command::Submit { req, events, reply } => {
                let id = req.id;
                self.kv_out.request_submitted(id, &req.prompt);
                let result = self.core.submit(req, now);
                if result.is_ok() {
                    self.requests.insert(id, events);
                } else {
                    self.kv_out.request_ended(id);
                }
                let _ = reply.send(result);
            }
            Command::Abort { id } => {
                if self.requests.remove(&id).is_some() {
                    self.kv_out.request_ended(id);
                    if self.core.engine_mut().abort(id, now) {
                        self.metrics
                            .requests_aborted
                            .fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Command::ReleaseHeld { id, reply } => {
                let _ = reply.send(self.core.engine_mut().release_held(id));
            }
            Command::ReadablePrefix { prompt, reply } => {
                let _ = reply.send(self.core.engine().readable_prefix_tokens(&prompt));
            }
            Command::Resync => {
                self.metrics.kv_resyncs.fetch_add(1, Ordering::Relaxed);
                let dump = self.core.resync_dump();
                self.kv_out.publish_step(dump);
            }
        }
    }

    fn step(&mut self) {
        let now = self.clock.now_ms();
        let mut outputs = std::mem::take(&mut self.outputs);
        outputs.clear();
        self.core.step_into(now, &mut outputs);
        for output in outputs.drain(..) {
            self.route(output, now);
        }
        self.outputs = outputs;
        self.flush_kv_events();
        self.load_tx.send_replace(self.core.engine().load());
    }

    fn route(&mut self, output: EngineOutput, now: f64) {
        let id = output.id();
        // Token counters move as the work is done, as vLLM's do: a stream its client leaves
        // still computed its prompt and the tokens it got.
        let m = &self.metrics;
        let event = match output {
            EngineOutput::FirstToken {
                prompt_tokens,
                cached_tokens,
                remote_tokens,
                ..
            } => {
                m.prompt_tokens
                    .fetch_add(u64::from(prompt_tokens), Ordering::Relaxed);
                let local = prompt_tokens.saturating_sub(cached_tokens + remote_tokens);
                m.local_prefill_tokens
                    .fetch_add(u64::from(local), Ordering::Relaxed);
                m.cached_prompt_tokens
                    .fetch_add(u64::from(cached_tokens), Ordering::Relaxed);
                m.remote_prompt_tokens
                    .fetch_add(u64::from(remote_tokens), Ordering::Relaxed);
                m.generation_tokens.fetch_add(1, Ordering::Relaxed);
                RequestEvent::FirstToken
            }
            EngineOutput::Token { .. } => {
                m.generation_tokens.fetch_add(1, Ordering::Relaxed);
                RequestEvent::Token
            }
            EngineOutput::Preempted { .. } => return,
            EngineOutput::Finished {
                prompt_tokens,
                completion_tokens,
                cached_tokens,
                remote_tokens,
                kv_held,
                ..
            } => {
                m.requests_finished.fetch_add(1, Ordering::Relaxed);
                self.kv_out.request_ended(id);
                let held = if kv_held {
                    self.core.engine().held_kv(id).cloned()
                } else {
                    None
                };
                let event = RequestEvent::Finished {
                    prompt_tokens,
                    completion_tokens,
                    cached_tokens,
                    remote_tokens,
                    held,
                };
                if let Some(tx) = self.requests.remove(&id) {
                    if tx.send(event).is_err() && kv_held {
                        // Nobody will hand these blocks to a decode worker: free them now.
                        self.core.engine_mut().release_held(id);
                    }
                }
                return;
            }
        };
        let delivered = self
            .requests
            .get(&id)
            .is_some_and(|tx| tx.send(event).is_ok());
        if !delivered && self.requests.remove(&id).is_some() {
            // The HTTP side dropped its receiver: the client went away.
            self.kv_out.request_ended(id);
            if self.core.engine_mut().abort(id, now) {
                self.metrics
                    .requests_aborted
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn flush_kv_events(&mut self) {
        // Called every step, even without events: a sink may have work deferred to the step's
        // end (the vLLM wire forgets ended requests' tokens only after their last stores).
        let batches = self.core.kv_batches();
        self.kv_out.publish_step(batches);
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
