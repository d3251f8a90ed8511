//! How much faster than the modelled hardware a real-time engine runs.
//!
//! One of the two time factors of the project, kept apart by type so they cannot be mixed
//! up: this one is the *engine's* speed-up (a real-time worker sleeps `model_ms / s` of wall
//! time per modelled millisecond, and every latency measured from outside is multiplied by
//! `s` to get back to modelled time). The other one, the load generator's `ArrivalScale`,
//! stretches or compresses the workload's arrival gaps and never touches the engines.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Factor between modelled time and wall time: `s > 1` runs the engine `s` times faster than
/// the modelled GB200 (10 = a 100 ms iteration takes 10 ms of wall time). Finite and > 0.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct SpeedUp(f64);

/// A speed-up outside [`SpeedUp::MIN`, `SpeedUp::MAX`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the speed-up must be a number from 0.001 to 1000, got {0}")]
pub struct InvalidSpeedUp(pub String);

impl SpeedUp {
    /// Real speed: one modelled millisecond per wall millisecond.
    pub const REAL: SpeedUp = SpeedUp(1.0);
    /// The slowest: a thousand times slower than the hardware. Below it a modelled
    /// iteration would take minutes of wall time, and a factor such as 1e-300 turns every
    /// wait into no `Duration` at all.
    pub const MIN: f64 = 1e-3;
    /// The fastest: beyond it a modelled iteration is below the timer's resolution.
    pub const MAX: f64 = 1e3;

    /// A speed-up of `factor`.
    ///
    /// # Errors
    /// [`InvalidSpeedUp`] unless `factor` is within [`SpeedUp::MIN`, `SpeedUp::MAX`].
    pub fn new(factor: f64) -> Result<Self, InvalidSpeedUp> {
        if (Self::MIN..=Self::MAX).contains(&factor) {
            Ok(SpeedUp(factor))
        } else {
            Err(InvalidSpeedUp(factor.to_string()))
        }
    }

    /// The factor.
    pub fn factor(self) -> f64 {
        self.0
    }

    /// Wall milliseconds for `model_ms` of modelled time.
    pub fn wall_ms(self, model_ms: f64) -> f64 {
        model_ms / self.0
    }

    /// Modelled milliseconds for `wall_ms` of wall time.
    pub fn model_ms(self, wall_ms: f64) -> f64 {
        wall_ms * self.0
    }
}

impl Default for SpeedUp {
    fn default() -> Self {
        SpeedUp::REAL
    }
}

impl TryFrom<f64> for SpeedUp {
    type Error = InvalidSpeedUp;
    fn try_from(factor: f64) -> Result<Self, Self::Error> {
        SpeedUp::new(factor)
    }
}

impl From<SpeedUp> for f64 {
    fn from(s: SpeedUp) -> f64 {
        s.0
    }
}

impl FromStr for SpeedUp {
    type Err = InvalidSpeedUp;
    /// Parses a command-line value such as `4` or `0.5`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let factor: f64 = s
            .trim()
            .parse()
            .map_err(|_| InvalidSpeedUp(s.to_string()))?;
        SpeedUp::new(factor)
    }
}

impl fmt::Display for SpeedUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speed_up_converts_both_ways() {
        let s = SpeedUp::new(10.0).unwrap();
        assert_eq!(s.wall_ms(158.0), 15.8);
        assert_eq!(s.model_ms(15.8), 158.0);
        assert_eq!(SpeedUp::REAL.wall_ms(3.0), 3.0);
        assert!(SpeedUp::new(0.0).is_err());
        assert!(SpeedUp::new(-1.0).is_err());
        assert!(SpeedUp::new(f64::NAN).is_err());
        assert!(SpeedUp::new(f64::INFINITY).is_err());
        // Bounded: 1e-300 made every wait no Duration at all, and the engine task panicked.
        assert!(SpeedUp::new(1e-300).is_err());
        assert!(SpeedUp::new(1e6).is_err());
        assert!(SpeedUp::new(SpeedUp::MIN).is_ok() && SpeedUp::new(SpeedUp::MAX).is_ok());
    }

    #[test]
    fn speed_up_parses_and_round_trips_as_a_number() {
        assert_eq!("4".parse::<SpeedUp>().unwrap().factor(), 4.0);
        let err = "0".parse::<SpeedUp>().unwrap_err().to_string();
        assert!(err.contains("from 0.001 to 1000"), "{err}");
        assert!("fast".parse::<SpeedUp>().is_err());
        let s = SpeedUp::new(2.5).unwrap();
        assert_eq!(serde_json::to_string(&s).unwrap(), "2.5");
        assert_eq!(serde_json::from_str::<SpeedUp>("2.5").unwrap(), s);
        assert!(serde_json::from_str::<SpeedUp>("0").is_err());
    }
}
