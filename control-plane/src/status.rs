//! What the status page shows besides the workers: the most recent verdicts and the bypass
//! share over time. Pure and bounded: a ring of the last [`RECENT_DECISIONS`] verdicts and
//! [`SHARE_BUCKETS`] time buckets of [`SHARE_BUCKET_MS`] each; time is an argument
//! (milliseconds on the service's monotonic clock).
//!
//! A verdict the policy gave is recorded with the policy's call (its inputs and the config in
//! force), so that the page's what-if can decide it again under other thresholds with the
//! same code (`whatif/`).

use std::collections::VecDeque;

use serde::Serialize;
use switchyard_protocol::route::RouteMode;

use crate::policy::PolicyCall;
use crate::router::Routed;

/// Verdicts kept for the page.
pub const RECENT_DECISIONS: usize = 50;
/// Width of one bypass-share bucket.
pub const SHARE_BUCKET_MS: u64 = 10_000;
/// Buckets kept: ten minutes.
pub const SHARE_BUCKETS: usize = 60;

/// One verdict as the page lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecisionRecord {
    /// When it was given (service clock, ms).
    pub at_ms: u64,
    /// The request's id.
    pub request_id: String,
    /// The declared model it was for, if the pool file declares models.
    pub model: Option<String>,
    /// `bypass`, `disagg` or `agg`.
    pub mode: &'static str,
    /// Why, e.g. `bypass:isl_bounding`.
    pub reason: &'static str,
    /// The decode worker.
    pub decode: String,
    /// The prefill worker, for `disagg`.
    pub prefill: Option<String>,
    /// Prompt tokens.
    pub isl: u32,
    /// Of which cached on the decode worker.
    pub cached_tokens: u32,
    /// What the decode worker would prefill itself.
    pub eff_isl: u32,
    /// What the policy saw and the config it decided under; `null` when the serving mode or
    /// the request (`n > 1`) decided, not the policy.
    pub policy: Option<PolicyCall>,
}

impl DecisionRecord {
    /// The record of `routed`, given at `at_ms`.
    pub fn of(routed: &Routed, model: Option<String>, at_ms: u64) -> Self {
        let verdict = &routed.verdict;
        DecisionRecord {
            at_ms,
            request_id: verdict.request_id.clone(),
            model,
            mode: verdict.mode.as_str(),
            reason: verdict.reason.as_str(),
            decode: verdict.decode.worker_id.0.clone(),
            prefill: verdict.prefill.as_ref().map(|p| p.worker_id.0.clone()),
            isl: verdict.isl,
            cached_tokens: verdict.cached_tokens,
            eff_isl: verdict.eff_isl,
            policy: routed.policy,
        }
    }
}

/// Verdicts in one time bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ShareBucket {
    /// The bucket's start (service clock, ms; a multiple of [`SHARE_BUCKET_MS`]).
    pub start_ms: u64,
    /// Bypassed verdicts in it.
    pub bypass: u64,
    /// All verdicts in it.
    pub total: u64,
}

/// The recent verdicts and the bypass share per bucket.
#[derive(Debug, Default)]
pub struct RecentDecisions {
    recent: VecDeque<DecisionRecord>,
    buckets: VecDeque<ShareBucket>,
}

/// What `GET /v1/status` shows of the verdicts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecisionsView {
    /// Newest first.
    pub recent: Vec<DecisionRecord>,
    /// Oldest first, only buckets within the window that saw a verdict.
    pub bypass_share: Vec<ShareBucket>,
    /// The verdicts of the last minute: the buckets that overlap it, so a verdict up to one
    /// bucket older than a minute may count, and none younger is left out.
    pub last_minute: VerdictCount,
}

/// Verdicts over a span of time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct VerdictCount {
    /// Bypassed ones.
    pub bypass: u64,
    /// All of them.
    pub total: u64,
}

/// The span `DecisionsView::last_minute` covers.
const LAST_MINUTE_MS: u64 = 60_000;

impl RecentDecisions {
    /// Records a verdict given at `record.at_ms`.
    pub fn record(&mut self, record: DecisionRecord) {
        let start_ms = record.at_ms - record.at_ms % SHARE_BUCKET_MS;
        match self.buckets.back_mut() {
            Some(last) if last.start_ms == start_ms => {
                last.total += 1;
                last.bypass += u64::from(record.mode == RouteMode::Bypass.as_str());
            }
            _ => self.buckets.push_back(ShareBucket {
                start_ms,
                bypass: u64::from(record.mode == RouteMode::Bypass.as_str()),
                total: 1,
            }),
        }
        while self.buckets.len() > SHARE_BUCKETS {
            self.buckets.pop_front();
        }
        self.recent.push_front(record);
        self.recent.truncate(RECENT_DECISIONS);
    }

    /// The view at `now_ms`: buckets older than the window are left out.
    pub fn view(&self, now_ms: u64) -> DecisionsView {
        let window = SHARE_BUCKET_MS * SHARE_BUCKETS as u64;
        let last_minute = self
            .buckets
            .iter()
            .filter(|b| b.start_ms + SHARE_BUCKET_MS + LAST_MINUTE_MS > now_ms)
            .fold(VerdictCount::default(), |n, b| VerdictCount {
                bypass: n.bypass + b.bypass,
                total: n.total + b.total,
            });
        DecisionsView {
            recent: self.recent.iter().cloned().collect(),
            bypass_share: self
                .buckets
                .iter()
                .filter(|b| b.start_ms + window > now_ms)
                .copied()
                .collect(),
            last_minute,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(at_ms: u64, mode: &'static str, id: usize) -> DecisionRecord {
        DecisionRecord {
            at_ms,
            request_id: format!("r-{id}"),
            model: None,
            mode,
            reason: if mode == "bypass" {
                "bypass:isl_bounding"
            } else {
                "disagg:eff_isl_above_threshold"
            },
            decode: "decode-0".into(),
            prefill: (mode == "disagg").then(|| "prefill-0".into()),
            isl: 100,
            cached_tokens: 64,
            eff_isl: 36,
            policy: None,
        }
    }

    #[test]
    fn a_policy_verdict_carries_its_inputs_and_config_for_the_what_if() {
        use crate::config::ConditionalDisaggConfig;
        use crate::policy::PolicyInput;
        let mut r = record(5, "bypass", 1);
        r.policy = Some(PolicyCall {
            input: PolicyInput {
                isl: 100,
                eff_isl: 36,
                prefill_queued_tokens: 7,
                decode_projected_blocks: 9,
                decode_capacity_blocks: 1000,
                ..PolicyInput::default()
            },
            config: ConditionalDisaggConfig::default(),
        });
        let json = serde_json::to_value(&r).unwrap();
        // The shape the page's what-if (whatif/) reads back.
        assert_eq!(json["policy"]["input"]["eff_isl"], 36);
        assert_eq!(json["policy"]["input"]["prefill_queued_tokens"], 7);
        assert_eq!(json["policy"]["config"]["policy"], "isl_bounding");
        assert_eq!(json["policy"]["config"]["eff_isl_ratio_threshold"], 0.7);
        assert!(json["policy"]["config"]["decode_busy_threshold"].is_null());
        let back: PolicyCall = serde_json::from_value(json["policy"].clone()).unwrap();
        assert_eq!(Some(back), r.policy);
        assert!(serde_json::to_value(record(5, "agg", 2)).unwrap()["policy"].is_null());
    }

    #[test]
    fn recent_verdicts_are_newest_first_and_bounded() {
        let mut recent = RecentDecisions::default();
        for i in 0..RECENT_DECISIONS + 7 {
            recent.record(record(i as u64, "bypass", i));
        }
        let view = recent.view(100);
        assert_eq!(view.recent.len(), RECENT_DECISIONS);
        assert_eq!(
            view.recent[0].request_id,
            format!("r-{}", RECENT_DECISIONS + 6)
        );
        assert_eq!(view.recent.last().unwrap().request_id, "r-7");
    }

    #[test]
    fn bypass_share_is_counted_per_bucket_within_the_window() {
        let mut recent = RecentDecisions::default();
        recent.record(record(1_000, "bypass", 0));
        recent.record(record(9_999, "disagg", 1));
        recent.record(record(10_000, "bypass", 2));
        recent.record(record(25_000, "bypass", 3));
        recent.record(record(25_001, "bypass", 4));
        let view = recent.view(30_000);
        assert_eq!(
            view.bypass_share,
            vec![
                ShareBucket {
                    start_ms: 0,
                    bypass: 1,
                    total: 2
                },
                ShareBucket {
                    start_ms: 10_000,
                    bypass: 1,
                    total: 1
                },
                ShareBucket {
                    start_ms: 20_000,
                    bypass: 2,
                    total: 2
                },
            ]
        );
        assert_eq!(
            view.last_minute,
            VerdictCount {
                bypass: 4,
                total: 5
            }
        );
        // Verdicts 56 s old are in the last minute, though their bucket began 61 s ago.
        assert_eq!(
            recent.view(81_000).last_minute,
            VerdictCount {
                bypass: 2,
                total: 2
            }
        );
        assert_eq!(recent.view(90_000).last_minute, VerdictCount::default());
        // Ten minutes on, only the buckets still inside the window are shown.
        let later = recent.view(20_000 + SHARE_BUCKET_MS * SHARE_BUCKETS as u64 - 1);
        assert_eq!(later.bypass_share.len(), 1);
        assert_eq!(later.bypass_share[0].start_ms, 20_000);
        // At most SHARE_BUCKETS buckets are kept however long it runs.
        for i in 0..SHARE_BUCKETS as u64 + 5 {
            recent.record(record(100_000 + i * SHARE_BUCKET_MS, "disagg", 9));
        }
        assert!(recent.buckets.len() <= SHARE_BUCKETS);
    }
}
