//! Which runs a comparison makes, with what workers and arrival scale (pure).
//!
//! Two clocks meet here, and mixing them up is the easiest way to publish wrong numbers:
//! the workload's planned arrival times and the modelled hardware's time, in which every
//! reported number is given. A run at load level `L` multiplies the planned arrival times by
//! `arrival_scale / L` (modelled time): `L = 2` offers twice the load. A backend whose
//! engines run faster than modelled converts that to its wall clock itself
//! ([`ArrivalScale::on_wall_clock`]).

use serde::Serialize;
use switchyard_protocol::route::ServingMode;

use crate::{ArrivalScale, LoadLevel};

/// How many of the workers prefill in disagg and conditional mode.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum PrefillWorkers {
    /// `round(workers × share)`, clamped so that both pools have at least one worker.
    Share(f64),
    /// Exactly this many.
    Count(u32),
}

/// Worker roles of one mode's deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WorkerSplit {
    /// Aggregated workers (agg mode only).
    pub agg: usize,
    /// Prefill workers (disagg and conditional).
    pub prefill: usize,
    /// Decode workers (disagg and conditional).
    pub decode: usize,
}

impl WorkerSplit {
    /// All workers, every role.
    pub fn total(&self) -> usize {
        self.agg + self.prefill + self.decode
    }
}

/// A comparison that cannot run as set.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// No modes.
    #[error("no modes to run")]
    NoModes,
    /// No load levels.
    #[error("no load levels")]
    NoLoadLevels,
    /// A mode listed twice.
    #[error("mode {0} given twice")]
    RepeatedMode(&'static str),
    /// A load level listed twice: two runs would share one label and one run folder.
    #[error("load level {0} given twice")]
    RepeatedLoadLevel(LoadLevel),
    /// No workers.
    #[error("--workers must be at least 1")]
    NoWorkers,
    /// A prefill share outside (0, 1).
    #[error("--prefill-ratio must be strictly between 0 and 1, got {0}")]
    PrefillShare(f64),
    /// A split mode with a single worker.
    #[error("{0} mode needs at least 2 workers (one prefill, one decode)")]
    TooFewWorkers(&'static str),
    /// An exact prefill count that leaves a pool empty.
    #[error("{mode} mode needs 1 to {max} prefill workers out of {workers}, got {prefill}")]
    PrefillCount {
        /// The mode.
        mode: &'static str,
        /// Most prefill workers possible.
        max: u32,
        /// Workers in all.
        workers: u32,
        /// Prefill workers asked for.
        prefill: u32,
    },
}

/// The workers of `mode` out of `workers` in all: agg gets them all as agg workers; disagg
/// and conditional split them into prefill and decode workers as `prefill` says.
///
/// # Errors
/// [`PlanError`] without workers, with fewer than two for a split mode, with a share outside
/// (0, 1) or a count that leaves a pool empty.
pub fn worker_split(
    mode: ServingMode,
    workers: u32,
    prefill: PrefillWorkers,
) -> Result<WorkerSplit, PlanError> {
    if workers == 0 {
        return Err(PlanError::NoWorkers);
    }
    let n = workers as usize;
    if mode == ServingMode::Agg {
        return Ok(WorkerSplit {
            agg: n,
            prefill: 0,
            decode: 0,
        });
    }
    let prefill = match prefill {
        PrefillWorkers::Share(share) => {
            if !(share > 0.0 && share < 1.0) {
                return Err(PlanError::PrefillShare(share));
            }
            if n < 2 {
                return Err(PlanError::TooFewWorkers(mode.as_str()));
            }
            ((n as f64 * share).round() as usize).clamp(1, n - 1)
        }
        PrefillWorkers::Count(count) => {
            if count == 0 || count >= workers {
                return Err(PlanError::PrefillCount {
                    mode: mode.as_str(),
                    max: workers.saturating_sub(1),
                    workers,
                    prefill: count,
                });
            }
            count as usize
        }
    };
    Ok(WorkerSplit {
        agg: 0,
        prefill,
        decode: n - prefill,
    })
}

/// Modes × load levels on one set of workers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ComparisonPlan {
    /// Modes, in run order.
    pub modes: Vec<ServingMode>,
    /// Offered-load multipliers; every mode runs once per level.
    pub load_levels: Vec<LoadLevel>,
    /// The arrival scale at level 1, modelled time.
    pub arrival_scale: ArrivalScale,
    /// Workers in every mode (equal GPUs).
    pub workers: u32,
    /// How many of them prefill in disagg and conditional mode.
    pub prefill: PrefillWorkers,
}

/// One run of a comparison: a mode at a load level.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannedRun {
    /// `<mode>@x<level>`, also the run's folder name.
    pub label: String,
    /// The serving mode.
    pub mode: ServingMode,
    /// Offered-load multiplier of this run.
    pub load_level: LoadLevel,
    /// Multiplies planned arrival and think times, modelled time (`arrival_scale / level`).
    pub arrival_scale: ArrivalScale,
    /// The deployment's workers.
    pub split: WorkerSplit,
}

/// The first of `values` that an earlier one equals: a mode or load level given twice would
/// run the same points twice, or silently once.
pub fn first_repeat<T: PartialEq>(values: &[T]) -> Option<&T> {
    values
        .iter()
        .enumerate()
        .find(|(i, v)| values[..*i].contains(v))
        .map(|(_, v)| v)
}

impl ComparisonPlan {
    /// Every run, load levels outer and modes inner (so an interrupted comparison has all
    /// modes of the first level).
    ///
    /// # Errors
    /// [`PlanError`] for no modes or levels, a repeated mode or level, or a worker split that
    /// cannot work.
    pub fn runs(&self) -> Result<Vec<PlannedRun>, PlanError> {
        if self.modes.is_empty() {
            return Err(PlanError::NoModes);
        }
        if self.load_levels.is_empty() {
            return Err(PlanError::NoLoadLevels);
        }
        if let Some(m) = first_repeat(&self.modes) {
            return Err(PlanError::RepeatedMode(m.as_str()));
        }
        if let Some(level) = first_repeat(&self.load_levels) {
            return Err(PlanError::RepeatedLoadLevel(*level));
        }
        let mut runs = Vec::new();
        for &load_level in &self.load_levels {
            for &mode in &self.modes {
                runs.push(PlannedRun {
                    label: format!("{}@x{load_level}", mode.as_str()),
                    mode,
                    load_level,
                    arrival_scale: self.arrival_scale.at_level(load_level),
                    split: worker_split(mode, self.workers, self.prefill)?,
                });
            }
        }
        Ok(runs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(x: f64) -> LoadLevel {
        LoadLevel::new(x).unwrap()
    }

    fn plan() -> ComparisonPlan {
        ComparisonPlan {
            modes: vec![
                ServingMode::Agg,
                ServingMode::Disagg,
                ServingMode::Conditional,
            ],
            load_levels: vec![LoadLevel::PLANNED],
            arrival_scale: ArrivalScale::PLANNED,
            workers: 4,
            prefill: PrefillWorkers::Share(0.25),
        }
    }

    #[test]
    fn every_mode_gets_the_same_number_of_workers() {
        let share = PrefillWorkers::Share(0.25);
        for workers in 2..=9 {
            let agg = worker_split(ServingMode::Agg, workers, share).unwrap();
            let disagg = worker_split(ServingMode::Disagg, workers, share).unwrap();
            let cond = worker_split(ServingMode::Conditional, workers, share).unwrap();
            assert_eq!(agg.total(), workers as usize);
            assert_eq!(disagg, cond);
            assert_eq!(disagg.total(), workers as usize);
            assert!(disagg.prefill >= 1 && disagg.decode >= 1, "{disagg:?}");
        }
        let split = worker_split(ServingMode::Disagg, 8, share).unwrap();
        assert_eq!((split.prefill, split.decode), (2, 6));
        // A ratio that rounds to every worker still leaves one decode worker.
        let split = worker_split(ServingMode::Conditional, 4, PrefillWorkers::Share(0.9)).unwrap();
        assert_eq!((split.prefill, split.decode), (3, 1));
        let split = worker_split(ServingMode::Disagg, 8, PrefillWorkers::Count(3)).unwrap();
        assert_eq!((split.prefill, split.decode), (3, 5));
    }

    #[test]
    fn splits_that_cannot_work_are_refused() {
        let share = PrefillWorkers::Share(0.25);
        assert!(worker_split(ServingMode::Agg, 0, share).is_err());
        assert!(worker_split(ServingMode::Disagg, 1, share).is_err());
        assert!(worker_split(ServingMode::Conditional, 4, PrefillWorkers::Share(0.0)).is_err());
        assert!(worker_split(ServingMode::Conditional, 4, PrefillWorkers::Share(1.0)).is_err());
        assert!(worker_split(ServingMode::Agg, 1, PrefillWorkers::Share(0.0)).is_ok());
        let e = worker_split(ServingMode::Disagg, 2, PrefillWorkers::Count(2)).unwrap_err();
        assert!(e.to_string().contains("prefill workers"), "{e}");
        assert!(worker_split(ServingMode::Disagg, 2, PrefillWorkers::Count(0)).is_err());
    }

    #[test]
    fn levels_scale_arrivals_in_modelled_time() {
        let mut p = plan();
        p.arrival_scale = ArrivalScale::new(0.5).unwrap();
        p.load_levels = vec![level(1.0), level(2.0)];
        let runs = p.runs().unwrap();
        let labels: Vec<&str> = runs.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "agg@x1",
                "disagg@x1",
                "conditional@x1",
                "agg@x2",
                "disagg@x2",
                "conditional@x2"
            ]
        );
        // Level 2 doubles the rate: arrival times half of level 1's.
        assert_eq!(runs[0].arrival_scale.factor(), 0.5);
        assert_eq!(runs[3].arrival_scale.factor(), 0.25);
        assert_eq!(runs[3].mode, ServingMode::Agg);
        assert_eq!(runs[3].load_level, level(2.0));
    }

    #[test]
    fn bad_plans_are_named() {
        type Breaks = fn(&mut ComparisonPlan);
        let cases: Vec<(Breaks, &str)> = vec![
            (|p| p.modes.clear(), "no modes"),
            (|p| p.load_levels.clear(), "no load levels"),
            (
                |p| p.modes = vec![ServingMode::Agg, ServingMode::Agg],
                "twice",
            ),
            (|p| p.workers = 1, "at least 2 workers"),
            (|p| p.workers = 0, "--workers must be at least 1"),
            (
                |p| p.load_levels = vec![level(0.5), level(1.0), level(1.0)],
                "load level 1 given twice",
            ),
        ];
        for (break_it, needle) in cases {
            let mut p = plan();
            break_it(&mut p);
            let message = p.runs().unwrap_err().to_string();
            assert!(message.contains(needle), "{needle}: {message}");
        }
    }
}
