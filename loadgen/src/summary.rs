//! The shape of a workload before anything is sent: lengths, sessions, reuse.

use std::collections::HashSet;
use std::fmt::Write as _;

use serde::Serialize;

use super::reuse::{prefix_reuse, ReuseStats};
use super::stats::Summary;
use super::Workload;

/// Cache block sizes the summary reports reuse at: vLLM's default, our simulated workers',
/// the Mooncake trace's.
pub const REUSE_BLOCK_SIZES: [u32; 3] = [16, 64, 512];

/// What a workload asks of a server.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadSummary {
    /// Workload name.
    pub name: String,
    /// Requests.
    pub requests: usize,
    /// Distinct sessions.
    pub sessions: usize,
    /// Last planned arrival, s (unscaled; an estimate for closed-loop turns).
    pub span_s: f64,
    /// Prompt content tokens.
    pub isl: Summary,
    /// Shortest prompt.
    pub isl_min: u64,
    /// Longest prompt.
    pub isl_max: u64,
    /// Output tokens.
    pub osl: Summary,
    /// Reuse under an unlimited prefix cache, per block size in [`REUSE_BLOCK_SIZES`].
    pub reuse: Vec<(u32, ReuseStats)>,
}

impl WorkloadSummary {
    /// Summarises `workload`.
    pub fn of(workload: &Workload) -> Self {
        let r = &workload.requests;
        let sessions: HashSet<u64> = r.iter().map(|q| q.session).collect();
        WorkloadSummary {
            name: workload.name.clone(),
            requests: r.len(),
            sessions: sessions.len(),
            span_s: r.iter().map(|q| q.arrival_ms).max().unwrap_or(0) as f64 / 1000.0,
            isl: Summary::of(r.iter().map(|q| q.isl() as f64)),
            isl_min: r.iter().map(|q| q.isl()).min().unwrap_or(0),
            isl_max: r.iter().map(|q| q.isl()).max().unwrap_or(0),
            osl: Summary::of(r.iter().map(|q| f64::from(q.osl))),
            reuse: REUSE_BLOCK_SIZES
                .iter()
                .map(|&b| (b, prefix_reuse(workload, b)))
                .collect(),
        }
    }

    /// Plain-text rendering for the terminal.
    pub fn render(&self) -> String {
        let fmt = |s: &Summary| {
            let v = |x: Option<f64>| x.map_or_else(|| "–".into(), |x| format!("{x:.0}"));
            format!(
                "p50 {}, p90 {}, p99 {}, mean {}",
                v(s.p50),
                v(s.p90),
                v(s.p99),
                v(s.mean)
            )
        };
        let mut out = String::new();
        let _ = writeln!(
            out,
            "workload {}: {} requests, {} sessions, planned arrivals over {:.1} s (unscaled)",
            self.name, self.requests, self.sessions, self.span_s
        );
        let _ = writeln!(
            out,
            "ISL tokens: {}; min {}, max {}",
            fmt(&self.isl),
            self.isl_min,
            self.isl_max
        );
        let _ = writeln!(out, "OSL tokens: {}", fmt(&self.osl));
        for (block, reuse) in &self.reuse {
            let _ = writeln!(
                out,
                "prefix reuse, unlimited cache, {block}-token blocks: {:.1} % of {} input tokens",
                reuse.share * 100.0,
                reuse.input_tokens
            );
        }
        out
    }
}
