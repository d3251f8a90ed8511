//! What control-plane replicas tell each other, so that several of them can serve one gateway
//! (active-active) without each seeing only its own share of the traffic.
//!
//! Every replica builds its own KV index from the workers' events (NATS fans them out, and each
//! replica reads a vLLM worker's ZMQ feed itself), so the index needs no sharing. What a
//! replica alone cannot know is the load the *other* replicas just put on a worker: between two
//! load reports, the router predicts each worker's load from its own routing decisions and the
//! filter's lifecycle reports, and two replicas that each think a worker idle would both send it
//! a burst. So each replica publishes, on [`SYNC_SUBJECT`], every decision it makes (with the
//! load it puts on each worker, in worker ids and block hashes, which mean the same to every
//! replica) and every lifecycle report it receives; the others apply them as if they were their
//! own.

use serde::{Deserialize, Serialize};

use crate::hash::SequenceHash;
use crate::lifecycle::LifecycleEvent;
use crate::worker::WorkerId;

/// The one subject every replica publishes its updates on and subscribes to.
pub const SYNC_SUBJECT: &str = "switchyard.replicas.sync";

/// The NATS KV bucket that holds the router config all replicas share.
pub const CONFIG_BUCKET: &str = "switchyard_config";

/// The key of the router config in [`CONFIG_BUCKET`].
pub const CONFIG_KEY: &str = "router";

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One update from one replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaSync {
    /// Protocol version.
    #[serde(default = "crate::default_version")]
    pub v: u32,
    /// The sending replica's id (`--replica-id`): a replica skips its own updates.
    pub replica: String,
    /// A number the sending process drew at start: two processes started under one id (a
    /// misconfiguration) tell each other's updates from their own by it. 0 (absent) from
    /// replicas older than the field.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub process: u64,
    /// When it was sent, Unix milliseconds on the sender's clock: receivers measure how stale
    /// their view of the others is.
    pub sent_at_unix_ms: u64,
    /// What happened.
    pub update: ReplicaUpdate,
}

/// A routing decision or lifecycle milestones, as another replica should apply them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReplicaUpdate {
    /// A request was routed: the load it puts on its workers.
    Routed {
        /// The request's id (lifecycle reports name it).
        request_id: String,
        /// The decode worker's share.
        decode: SharedLeg,
        /// The prefill worker's share, when disaggregated.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prefill: Option<SharedLeg>,
    },
    /// Lifecycle reports the filter sent this replica.
    Lifecycle {
        /// In the order they happened.
        events: Vec<LifecycleEvent>,
    },
}

/// One worker's share of a routed request, in terms every replica understands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedLeg {
    /// The worker.
    pub worker_id: WorkerId,
    /// Prompt tokens it must prefill.
    pub prefill_tokens: u64,
    /// The prompt's full blocks, as sequence hashes in this worker's block size.
    pub blocks: Vec<SequenceHash>,
    /// Unshareable blocks besides (the partial last block: 0 or 1).
    pub tail_blocks: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_routed_update_round_trips_and_names_its_kind() {
        let sync = ReplicaSync {
            v: 1,
            replica: "cp-0".into(),
            process: 7,
            sent_at_unix_ms: 1_700_000_000_000,
            update: ReplicaUpdate::Routed {
                request_id: "r-1".into(),
                decode: SharedLeg {
                    worker_id: WorkerId("decode-0".into()),
                    prefill_tokens: 12,
                    blocks: vec![SequenceHash(u64::MAX), SequenceHash(7)],
                    tail_blocks: 1,
                },
                prefill: None,
            },
        };
        let json = serde_json::to_string(&sync).unwrap();
        assert!(json.contains(r#""kind":"routed""#), "{json}");
        assert!(
            !json.contains("prefill\":"),
            "no prefill leg on bypass: {json}"
        );
        assert_eq!(serde_json::from_str::<ReplicaSync>(&json).unwrap(), sync);
    }

    #[test]
    fn lifecycle_updates_carry_the_filters_events() {
        let json = r#"{"replica":"cp-1","sent_at_unix_ms":5,"update":{"kind":"lifecycle","events":[{"event":"first_token","request_id":"r"}]}}"#;
        let sync: ReplicaSync = serde_json::from_str(json).unwrap();
        assert_eq!(sync.v, 1);
        assert_eq!(
            sync.update,
            ReplicaUpdate::Lifecycle {
                events: vec![LifecycleEvent::FirstToken {
                    request_id: "r".into()
                }]
            }
        );
    }
}
