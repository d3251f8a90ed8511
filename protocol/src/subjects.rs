//! NATS subject names. Per-worker subjects end in the worker id, so a consumer can subscribe
//! to all workers with the `*` wildcard.

use crate::worker::WorkerId;

/// Prefix of every Switchyard subject.
pub const PREFIX: &str = "switchyard";
/// Heartbeats (which double as registrations) of workers that publish them on one shared
/// subject, as workers did before [`heartbeat`] (still taken). A worker on a shared subject
/// can publish for any worker, so NATS permissions cannot confine it to its own.
pub const HEARTBEAT: &str = "switchyard.workers.heartbeat";
/// Load reports on one shared subject, as workers published them before [`load`] (still
/// taken).
pub const LOAD: &str = "switchyard.workers.load";
/// Wildcard for every worker's heartbeats.
pub const HEARTBEAT_ALL: &str = "switchyard.workers.heartbeat.*";
/// Wildcard for every worker's load reports.
pub const LOAD_ALL: &str = "switchyard.workers.load.*";

/// Subject of one worker's heartbeats: its own, so NATS permissions can let a worker
/// publish for itself only, and a message naming another worker is refused.
pub fn heartbeat(worker: &WorkerId) -> String {
    format!("{HEARTBEAT}.{worker}")
}

/// Subject of one worker's load reports (see [`heartbeat`]).
pub fn load(worker: &WorkerId) -> String {
    format!("{LOAD}.{worker}")
}
/// Wildcard for every worker's KV events.
pub const KV_EVENTS_ALL: &str = "switchyard.kv.events.*";
/// Wildcard for every worker's resync requests.
pub const KV_RESYNC_ALL: &str = "switchyard.kv.resync.*";

/// Subject of one worker's KV event batches.
pub fn kv_events(worker: &WorkerId) -> String {
    format!("switchyard.kv.events.{worker}")
}

/// Subject on which a worker listens for resync requests.
pub fn kv_resync(worker: &WorkerId) -> String {
    format!("switchyard.kv.resync.{worker}")
}

/// Whether a worker id can be used as one NATS subject token (no dots, wildcards or
/// whitespace), checked by workers at start-up.
pub fn is_valid_worker_token(id: &str) -> bool {
    !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_worker_subjects_match_wildcards() {
        let w = WorkerId("decode-0".into());
        assert_eq!(kv_events(&w), "switchyard.kv.events.decode-0");
        assert!(kv_events(&w).starts_with(KV_EVENTS_ALL.trim_end_matches('*')));
        assert!(kv_resync(&w).starts_with(KV_RESYNC_ALL.trim_end_matches('*')));
    }

    #[test]
    fn worker_tokens_reject_subject_syntax() {
        assert!(is_valid_worker_token("decode-0"));
        assert!(!is_valid_worker_token("a.b"));
        assert!(!is_valid_worker_token("a*"));
        assert!(!is_valid_worker_token(""));
        assert!(!is_valid_worker_token("a b"));
    }
}
