//! Decisions shared between control-plane replicas (see [`switchyard_protocol::replica`]): a
//! routed request's load in worker ids and block hashes, out of this router and into another.
//! A peer's decision is applied exactly as if this router had made it, so the next route call
//! here sees the load it put on its workers and the blocks it will soon hold.

use switchyard_protocol::replica::SharedLeg;
use switchyard_protocol::worker::WorkerId;

use crate::load::{Leg, RoutedLoad};
use crate::Router;

/// Why a peer's decision was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerRouteError {
    /// The peer routed to a worker this router does not know (yet, or any more): nothing is
    /// recorded for the request, and the worker's next load report carries what it holds.
    #[error("unknown worker {0}")]
    UnknownWorker(WorkerId),
}

impl Router {
    /// The load that routing `request_id` put on its workers, to share with peers; `None`
    /// when the request is not tracked (routing failed, or it is done).
    pub fn shared_route(&self, request_id: &str) -> Option<(SharedLeg, Option<SharedLeg>)> {
        let routed = self.load.routed(request_id)?;
        let decode = self.shared_leg(&routed.decode)?;
        let prefill = match &routed.prefill {
            Some(leg) => Some(self.shared_leg(leg)?),
            None => None,
        };
        Some((decode, prefill))
    }

    fn shared_leg(&self, leg: &Leg) -> Option<SharedLeg> {
        let worker = self.workers.values().find(|w| w.slot == leg.slot)?;
        Some(SharedLeg {
            worker_id: worker.info.worker_id.clone(),
            prefill_tokens: leg.prefill_tokens,
            blocks: leg.blocks.to_vec(),
            tail_blocks: leg.tail_blocks,
        })
    }

    /// Applies a peer's routing decision: its load on the workers and its KV predictions, as
    /// [`Router::route_model`] records its own.
    ///
    /// # Errors
    /// [`PeerRouteError::UnknownWorker`] if either leg names a worker not registered here;
    /// nothing is applied then.
    pub fn apply_peer_route(
        &mut self,
        request_id: &str,
        decode: &SharedLeg,
        prefill: Option<&SharedLeg>,
        now_ms: u64,
    ) -> Result<(), PeerRouteError> {
        let decode = self.local_leg(decode)?;
        let prefill = prefill.map(|p| self.local_leg(p)).transpose()?;
        // A peer's share names no route call: any mark of the id is taken.
        if self.load.take_failed_open(request_id, None) {
            self.late_routes += 1;
            return Ok(());
        }
        let ttl = self.config.load.kv_prediction_ms;
        for leg in std::iter::once(&decode).chain(prefill.as_ref()) {
            self.predictions.predict(leg.slot, &leg.blocks, now_ms, ttl);
        }
        self.load.expire(now_ms, &self.config.load);
        self.load
            .on_route(request_id, RoutedLoad { decode, prefill }, now_ms);
        Ok(())
    }

    fn local_leg(&self, leg: &SharedLeg) -> Result<Leg, PeerRouteError> {
        let worker = self
            .workers
            .get(&leg.worker_id)
            .ok_or_else(|| PeerRouteError::UnknownWorker(leg.worker_id.clone()))?;
        Ok(Leg {
            slot: worker.slot,
            prefill_tokens: leg.prefill_tokens,
            blocks: leg.blocks.as_slice().into(),
            tail_blocks: leg.tail_blocks,
        })
    }
}

#[cfg(test)]
mod tests {
    use switchyard_protocol::lifecycle::LifecycleEvent;
    use switchyard_protocol::worker::{WorkerInfo, WorkerRole};

    use super::*;
    use crate::config::{RouterConfig, ServingMode};

    fn worker(id: &str, role: WorkerRole) -> WorkerInfo {
        WorkerInfo {
            worker_id: WorkerId(id.into()),
            instance_id: 1,
            role,
            address: format!("127.0.0.1:{}", 9000 + id.len()),
            model: "m".into(),
            block_size: 16,
            kv_capacity_blocks: 1_000,
            engine: Default::default(),
            bootstrap_port: None,
        }
    }

    /// Two routers that registered the same workers in different orders (so their slots
    /// differ), as two replicas that started at different times do.
    fn two_replicas() -> (Router, Router) {
        let config = RouterConfig {
            serving_mode: ServingMode::Disagg,
            ..RouterConfig::default()
        };
        let mut a = Router::with_config(config.clone(), 1);
        let mut b = Router::with_config(config, 2);
        let ids = [
            ("decode-0", WorkerRole::Decode),
            ("decode-1", WorkerRole::Decode),
            ("prefill-0", WorkerRole::Prefill),
        ];
        for (id, role) in ids {
            a.upsert_worker(&worker(id, role), 3_000, 0);
        }
        for (id, role) in ids.iter().rev() {
            b.upsert_worker(&worker(id, *role), 3_000, 0);
        }
        (a, b)
    }

    #[test]
    fn a_peers_decision_puts_the_same_load_on_the_same_workers() {
        let (mut a, mut b) = two_replicas();
        let tokens: Vec<u32> = (0..100).collect();
        let verdict = a.route("r-1", &tokens, 10).unwrap();
        let (decode, prefill) = a.shared_route("r-1").expect("tracked");
        assert_eq!(decode.worker_id, verdict.decode.worker_id);
        assert_eq!(decode.blocks.len(), 6, "100 tokens: 6 full blocks of 16");
        assert_eq!(decode.tail_blocks, 1);
        b.apply_peer_route("r-1", &decode, prefill.as_ref(), 11)
            .unwrap();
        let load = |r: &Router| {
            let mut stats = r.worker_stats();
            stats.sort_by(|x, y| x.worker_id.cmp(&y.worker_id));
            stats
                .into_iter()
                .map(|s| (s.worker_id, s.load))
                .collect::<Vec<_>>()
        };
        assert_eq!(load(&a), load(&b), "same load, whatever the slots");
        assert!(load(&b).iter().any(|(_, l)| l.in_flight == 1));
        // The filter's lifecycle report, wherever it lands, frees it on both.
        let done = LifecycleEvent::completed("r-1");
        a.apply_lifecycle(&done, 20);
        b.apply_lifecycle(&done, 20);
        assert_eq!(load(&a), load(&b));
        assert!(load(&b).iter().all(|(_, l)| l.in_flight == 0));
        assert!(b.shared_route("r-1").is_none());
    }

    #[test]
    fn a_peers_late_route_of_a_failed_open_request_is_not_counted() {
        let (mut a, mut b) = two_replicas();
        // The filter's report reached `b` (shared from `a`) before `a` routed the late call.
        let failed_open = LifecycleEvent::failed_open("r-1");
        b.apply_lifecycle(&failed_open, 5);
        let tokens: Vec<u32> = (0..100).collect();
        a.route("r-1", &tokens, 10).unwrap();
        let (decode, prefill) = a.shared_route("r-1").expect("tracked");
        b.apply_peer_route("r-1", &decode, prefill.as_ref(), 11)
            .unwrap();
        assert!(b.shared_route("r-1").is_none());
        assert!(b.worker_stats().iter().all(|w| w.load.in_flight == 0));
        assert_eq!(b.late_routes(), 1);
        // And `a`, when the shared report reaches it, frees its own.
        a.apply_lifecycle(&failed_open, 12);
        assert!(a.worker_stats().iter().all(|w| w.load.in_flight == 0));
    }

    #[test]
    fn a_peers_route_that_arrives_after_the_request_finished_is_not_counted() {
        let (mut a, mut b) = two_replicas();
        let tokens: Vec<u32> = (0..100).collect();
        a.route("r-2", &tokens, 10).unwrap();
        let (decode, prefill) = a.shared_route("r-2").expect("tracked");
        // The request ends, and its `done` reaches `b` before `a`'s decision does (held back
        // while NATS was down).
        let done = LifecycleEvent::completed("r-2");
        a.apply_lifecycle(&done, 20);
        b.apply_lifecycle(&done, 20);
        b.apply_peer_route("r-2", &decode, prefill.as_ref(), 30)
            .unwrap();
        assert!(b.shared_route("r-2").is_none());
        assert!(b.worker_stats().iter().all(|w| w.load.in_flight == 0));
    }

    #[test]
    fn a_peers_route_steers_the_next_similar_request_to_the_same_worker() {
        let (mut a, mut b) = two_replicas();
        let tokens: Vec<u32> = (0..4_096).collect();
        let first = a.route("r-1", &tokens, 10).unwrap();
        let (decode, prefill) = a.shared_route("r-1").unwrap();
        b.apply_peer_route("r-1", &decode, prefill.as_ref(), 11)
            .unwrap();
        // B has seen no KV event yet, but predicts the blocks on A's choice.
        let second = b.route("r-2", &tokens, 12).unwrap();
        assert_eq!(second.decode.worker_id, first.decode.worker_id);
        assert!(
            second.cached_tokens > 0,
            "predicted cached on the peer's worker"
        );
    }

    #[test]
    fn a_decision_naming_an_unknown_worker_is_refused_whole() {
        let (mut a, mut b) = two_replicas();
        a.upsert_worker(&worker("decode-9", WorkerRole::Decode), 3_000, 0);
        let mut leg = SharedLeg {
            worker_id: WorkerId("decode-9".into()),
            prefill_tokens: 5,
            blocks: vec![],
            tail_blocks: 1,
        };
        assert_eq!(
            b.apply_peer_route("r-1", &leg, None, 1),
            Err(PeerRouteError::UnknownWorker(WorkerId("decode-9".into())))
        );
        assert_eq!(b.tracked_requests(), 0);
        leg.worker_id = WorkerId("decode-0".into());
        b.apply_peer_route("r-1", &leg, None, 1).unwrap();
        assert_eq!(b.tracked_requests(), 1);
    }
}
