//! Which wire a worker speaks, and the vLLM wire's settings.

use switchyard_adapters::vllm::encode::EncodeOptions;

/// vLLM's default `buffer_steps`: batches its replay socket can re-send.
pub const DEFAULT_BUFFER_STEPS: usize = 10_000;

/// The topic the vLLM deployment in `docs/vllm.md` configures (vLLM's own default is `""`).
pub const DEFAULT_TOPIC: &str = "kv-events";

/// The protocols a worker speaks besides its OpenAI HTTP API.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Wire {
    /// Switchyard's own: heartbeats (registration), load reports, KV event batches and
    /// resyncs on NATS.
    #[default]
    Switchyard,
    /// vLLM's: no NATS at all; KV events on a ZMQ PUB socket in vLLM's msgpack, replay on a
    /// ZMQ ROUTER socket, load on `/metrics` only.
    Vllm(VllmWireConfig),
}

/// The vLLM wire's sockets and format (vLLM's `--kv-events-config`).
#[derive(Debug, Clone, PartialEq)]
pub struct VllmWireConfig {
    /// Where the PUB socket binds (vLLM's `endpoint`), e.g. `tcp://127.0.0.1:5557`; port 0
    /// picks a free one (see [`crate::RunningWorker::kv_events_endpoint`]).
    pub events_endpoint: String,
    /// Where the ROUTER replay socket binds (vLLM's `replay_endpoint`); `None`: no replay.
    pub replay_endpoint: Option<String>,
    /// The topic frame of every message (vLLM's `topic`).
    pub topic: String,
    /// Most recent batches kept for replay (vLLM's `buffer_steps`).
    pub buffer_steps: usize,
    /// Event and hash encoding.
    pub encoding: EncodeOptions,
}

impl VllmWireConfig {
    /// vLLM 0.32's defaults (map events, integer hashes, 10,000 buffered steps) with the
    /// topic `kv-events`, publishing at `events_endpoint` and replaying at `replay_endpoint`.
    pub fn new(events_endpoint: impl Into<String>, replay_endpoint: Option<String>) -> Self {
        VllmWireConfig {
            events_endpoint: events_endpoint.into(),
            replay_endpoint,
            topic: DEFAULT_TOPIC.to_owned(),
            buffer_steps: DEFAULT_BUFFER_STEPS,
            encoding: EncodeOptions::default(),
        }
    }

    /// Checks what binding would not.
    ///
    /// # Errors
    /// A message naming the bad setting.
    pub fn validate(&self) -> Result<(), String> {
        for endpoint in std::iter::once(&self.events_endpoint).chain(&self.replay_endpoint) {
            if !endpoint.starts_with("tcp://") {
                return Err(format!(
                    "KV event endpoint {endpoint:?} must be tcp://HOST:PORT (the only ZMQ transport here)"
                ));
            }
        }
        // Port 0 asks for a free port each time, so only a fixed port can clash.
        let fixed = !self.events_endpoint.ends_with(":0");
        if fixed && self.replay_endpoint.as_ref() == Some(&self.events_endpoint) {
            return Err(format!(
                "the KV events and replay endpoints are both {}",
                self.events_endpoint
            ));
        }
        Ok(())
    }
}
