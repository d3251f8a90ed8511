//! What a run and a comparison produced, whichever backend ran them.

use serde::Serialize;

use super::plan::PlannedRun;
use crate::record::RequestRecord;
use crate::report::RunReport;

/// What a backend keeps of a run beyond the common result, and the extra files it is written
/// as next to the run's records and report.
pub trait RunDetail: Serialize {
    /// `(file name, contents)` to write into the run's folder.
    fn files(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }
}

/// Nothing beyond the common result.
impl RunDetail for () {}

/// One run's results.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult<D> {
    /// What was run.
    pub run: PlannedRun,
    /// The load generator's report, in modelled time.
    pub report: RunReport,
    /// One record per request sent, as measured (wall times for sped-up workers).
    #[serde(skip)]
    pub records: Vec<RequestRecord>,
    /// Wall seconds the run took.
    pub wall_s: f64,
    /// Problems seen around the run (a process that exited, most requests failing open, ...).
    pub notes: Vec<String>,
    /// The backend's own part.
    pub detail: D,
}

/// Every run of a comparison, in plan order.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison<D> {
    /// The runs.
    pub runs: Vec<RunResult<D>>,
}

impl<D> Comparison<D> {
    /// The runs' reports, in plan order.
    pub fn reports(&self) -> Vec<RunReport> {
        self.runs.iter().map(|r| r.report.clone()).collect()
    }
}
