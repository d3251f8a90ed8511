//! Percentiles and summaries of samples.

use serde::{Deserialize, Serialize};

/// The `p`-th percentile (0–100) of `sorted` by linear interpolation between closest ranks
/// (NumPy's default): rank `p/100 · (n − 1)`. `None` for no samples.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = (p.clamp(0.0, 100.0) / 100.0) * (n - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64))
}

/// Mean, p50, p90 and p99 of a sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Samples.
    pub count: usize,
    /// Arithmetic mean.
    pub mean: Option<f64>,
    /// Median.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
}

impl Summary {
    /// Summarises `samples` (any order; NaNs are dropped).
    pub fn of(samples: impl IntoIterator<Item = f64>) -> Self {
        let mut v: Vec<f64> = samples.into_iter().filter(|x| !x.is_nan()).collect();
        v.sort_by(f64::total_cmp);
        Summary {
            count: v.len(),
            mean: (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64),
            p50: percentile(&v, 50.0),
            p90: percentile(&v, 90.0),
            p99: percentile(&v, 99.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_between_ranks() {
        let v = [10.0, 20.0, 30.0, 40.0];
        assert_eq!(percentile(&v, 50.0), Some(25.0));
        assert_eq!(percentile(&v, 0.0), Some(10.0));
        assert_eq!(percentile(&v, 100.0), Some(40.0));
        assert!((percentile(&v, 90.0).unwrap() - 37.0).abs() < 1e-9);
        assert_eq!(percentile(&[], 50.0), None);
        let s = Summary::of([3.0, 1.0, 2.0]);
        assert_eq!((s.count, s.mean, s.p50), (3, Some(2.0), Some(2.0)));
    }
}
