//! The worker core: what a simulated worker is, apart from its transport — its engine, and
//! how it turns the engine's changes into the messages it publishes (numbered KV event
//! batches, resync dumps, load reports, heartbeats).
//!
//! The real-time worker (the `switchyard-sim-worker` crate) drives one from a tokio task and
//! publishes its messages on NATS; the virtual-time cluster ([`crate::vtime`]) drives several
//! and hands the messages straight to the control core. Both number batches, dump caches and
//! report load through this one type.

use switchyard_protocol::kv::KvEventBatch;
use switchyard_protocol::worker::{LoadReport, WorkerHeartbeat, WorkerInfo};
use switchyard_protocol::PROTOCOL_VERSION;

use crate::kv_batches::KvBatcher;
use crate::{Engine, EngineConfig, EngineError, EngineOutput, EngineRequest};

/// One simulated worker's core (see the module docs).
#[derive(Debug)]
pub struct WorkerCore {
    info: WorkerInfo,
    engine: Engine,
    batcher: KvBatcher,
}

impl WorkerCore {
    /// A cold worker described by `info` running an engine configured by `cfg`. The engine's
    /// role is the worker's; `info`'s block size and KV capacity should be the engine's (they
    /// are what the control plane hashes and budgets with).
    ///
    /// # Errors
    /// [`EngineError::InvalidConfig`] from [`Engine::new`].
    pub fn new(info: WorkerInfo, mut cfg: EngineConfig) -> Result<Self, EngineError> {
        cfg.role = info.role;
        let batcher = KvBatcher::new(info.worker_id.clone(), info.instance_id, cfg.block_size);
        Ok(WorkerCore {
            engine: Engine::new(cfg)?,
            batcher,
            info,
        })
    }

    /// Who the worker is.
    pub fn info(&self) -> &WorkerInfo {
        &self.info
    }

    /// The engine, for queries (load, cached prefix, config).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The engine, for requests (submit, abort, release held KV). Stepping goes through
    /// [`WorkerCore::step_into`], so no KV event escapes the batches.
    pub fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    /// Queues a request at `now_ms`.
    ///
    /// # Errors
    /// The engine's refusal.
    pub fn submit(&mut self, req: EngineRequest, now_ms: f64) -> Result<(), EngineError> {
        self.engine.submit(req, now_ms)
    }

    /// When the engine's next event is due.
    pub fn next_event_ms(&self) -> Option<f64> {
        self.engine.next_event_ms()
    }

    /// Runs every iteration that ends by `now_ms`, appending their outputs.
    pub fn step_into(&mut self, now_ms: f64, outputs: &mut Vec<EngineOutput>) {
        self.engine.step_into(now_ms, outputs);
    }

    /// The KV events recorded since the last call, as numbered batches (none when nothing
    /// changed).
    pub fn kv_batches(&mut self) -> Vec<KvEventBatch> {
        let events = self.engine.drain_kv_events();
        if events.is_empty() {
            return Vec::new();
        }
        self.batcher.batch_events(events)
    }

    /// Drops the KV events recorded since the last call (nobody listens).
    pub fn discard_kv_events(&mut self) {
        self.engine.discard_kv_events();
    }

    /// A full dump of the cache (`Cleared`, then every cached block), after the events so
    /// far (returned first, so the dump reflects everything before it).
    pub fn resync_dump(&mut self) -> Vec<KvEventBatch> {
        let mut batches = self.kv_batches();
        batches.extend(self.batcher.resync_dump(self.engine.cached_blocks()));
        batches
    }

    /// The load report the worker publishes.
    pub fn load_report(&self) -> LoadReport {
        self.engine
            .load()
            .to_load_report(self.info.worker_id.clone(), self.info.instance_id)
    }

    /// The heartbeat the worker publishes every `interval_ms` (unsigned; see [`heartbeat`]).
    pub fn heartbeat(&self, interval_ms: u64, sent_at_ms: u64) -> WorkerHeartbeat {
        heartbeat(&self.info, interval_ms, sent_at_ms)
    }
}

/// A worker's heartbeat: its whole description (so it is also its registration), the
/// interval it promises, and when it was sent. The signature, when the deployment has a
/// registration secret, is the transport's to add.
pub fn heartbeat(info: &WorkerInfo, interval_ms: u64, sent_at_ms: u64) -> WorkerHeartbeat {
    WorkerHeartbeat {
        v: PROTOCOL_VERSION,
        worker: info.clone(),
        interval_ms,
        sent_at_ms,
        signature: None,
    }
}

#[cfg(test)]
mod tests {
    use switchyard_protocol::kv::KvEvent;
    use switchyard_protocol::worker::{WorkerId, WorkerRole};

    use super::*;
    use crate::Prompt;

    fn core() -> WorkerCore {
        let cfg = EngineConfig::new(WorkerRole::Decode);
        let info = WorkerInfo {
            worker_id: WorkerId("decode-0".into()),
            instance_id: 3,
            role: WorkerRole::Decode,
            address: "x:1".into(),
            model: "m".into(),
            block_size: cfg.block_size,
            kv_capacity_blocks: cfg.kv_capacity_blocks,
            engine: Default::default(),
            bootstrap_port: None,
        };
        WorkerCore::new(info, cfg).unwrap()
    }

    #[test]
    fn kv_events_leave_as_gap_free_batches_and_a_dump_follows_them() {
        let mut w = core();
        assert!(w.kv_batches().is_empty());
        w.submit(
            EngineRequest::local(1, Prompt::Tokens((0..640).collect()), 2),
            0.0,
        )
        .unwrap();
        let mut out = Vec::new();
        let mut t = 0.0;
        while let Some(next) = w.next_event_ms() {
            t = next;
            w.step_into(t, &mut out);
        }
        let batches = w.kv_batches();
        assert!(!batches.is_empty());
        assert_eq!(batches[0].seq, 1);
        assert_eq!(batches[0].instance_id, 3);
        let dump = w.resync_dump();
        assert!(dump[0].resync);
        assert_eq!(dump[0].seq, batches.last().unwrap().seq + 1);
        assert!(matches!(dump[0].events[0], KvEvent::Cleared));
        assert_eq!(w.load_report().worker_id.0, "decode-0");
        assert!(t > 0.0);
        let hb = w.heartbeat(1_000, 7);
        assert_eq!(
            (hb.interval_ms, hb.sent_at_ms, hb.signature),
            (1_000, 7, None)
        );
    }
}
