//! The workload's clock: how far apart requests arrive, and how much load that offers.
//!
//! One of the two time factors of the project, kept apart by type (the other is
//! [`switchyard_engine::SpeedUp`], how much faster than the modelled hardware a simulated
//! engine runs). Both here are in *modelled* time, the clock every report is given in:
//! - [`ArrivalScale`] multiplies the planned arrival and think times (0.5 = arrivals twice as
//!   dense = twice the offered load; 0 = everything at once);
//! - [`LoadLevel`] is an offered-load multiplier (2 = twice the load), what a comparison's
//!   `--load-levels` list and its tables speak in.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use switchyard_engine::SpeedUp;

/// Multiplier on the workload's planned arrival and think times, modelled time. Finite and
/// ≥ 0.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct ArrivalScale(f64);

/// An offered-load multiplier: > 1 offers more load than the workload's own rate. Finite and
/// > 0.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct LoadLevel(f64);

/// A time factor out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidFactor {
    /// An arrival scale that is negative or not a finite number.
    #[error("the arrival scale must be a finite number >= 0, got {0}")]
    ArrivalScale(String),
    /// A load level that is not a finite number > 0.
    #[error("a load level must be a finite number > 0, got {0}")]
    LoadLevel(String),
}

impl ArrivalScale {
    /// The workload's own arrival times.
    pub const PLANNED: ArrivalScale = ArrivalScale(1.0);

    /// An arrival scale of `factor`.
    ///
    /// # Errors
    /// [`InvalidFactor::ArrivalScale`] unless `factor` is finite and ≥ 0.
    pub fn new(factor: f64) -> Result<Self, InvalidFactor> {
        if factor.is_finite() && factor >= 0.0 {
            Ok(ArrivalScale(factor))
        } else {
            Err(InvalidFactor::ArrivalScale(factor.to_string()))
        }
    }

    /// The factor.
    pub fn factor(self) -> f64 {
        self.0
    }

    /// `ms` of planned time, scaled.
    pub fn scale_ms(self, ms: f64) -> f64 {
        ms * self.0
    }

    /// This scale at offered-load multiplier `level`: arrival gaps ÷ `level`.
    pub fn at_level(self, level: LoadLevel) -> ArrivalScale {
        ArrivalScale(self.0 / level.0)
    }

    /// The same arrivals on the wall clock of engines running `speed_up` times faster than
    /// modelled: the client must send that much faster too.
    pub fn on_wall_clock(self, speed_up: SpeedUp) -> ArrivalScale {
        ArrivalScale(speed_up.wall_ms(self.0))
    }
}

impl Default for ArrivalScale {
    fn default() -> Self {
        ArrivalScale::PLANNED
    }
}

impl LoadLevel {
    /// The workload's own rate.
    pub const PLANNED: LoadLevel = LoadLevel(1.0);

    /// A load level of `factor`.
    ///
    /// # Errors
    /// [`InvalidFactor::LoadLevel`] unless `factor` is finite and > 0.
    pub fn new(factor: f64) -> Result<Self, InvalidFactor> {
        if factor.is_finite() && factor > 0.0 {
            Ok(LoadLevel(factor))
        } else {
            Err(InvalidFactor::LoadLevel(factor.to_string()))
        }
    }

    /// The multiplier.
    pub fn factor(self) -> f64 {
        self.0
    }
}

/// The conversions both factors share: from and to a plain number (serde, arithmetic) and
/// from a command-line string, which is refused with the factor's own error.
macro_rules! factor_conversions {
    ($t:ident, $invalid:path) => {
        impl TryFrom<f64> for $t {
            type Error = InvalidFactor;
            fn try_from(factor: f64) -> Result<Self, Self::Error> {
                $t::new(factor)
            }
        }
        impl From<$t> for f64 {
            fn from(x: $t) -> f64 {
                x.0
            }
        }
        impl FromStr for $t {
            type Err = InvalidFactor;
            /// Parses a command-line value such as `1.5`.
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let factor: f64 = s.trim().parse().map_err(|_| $invalid(s.to_string()))?;
                $t::new(factor)
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

factor_conversions!(ArrivalScale, InvalidFactor::ArrivalScale);
factor_conversions!(LoadLevel, InvalidFactor::LoadLevel);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_divide_the_arrival_gaps() {
        let half = ArrivalScale::new(0.5).unwrap();
        let double = LoadLevel::new(2.0).unwrap();
        assert_eq!(half.at_level(double).factor(), 0.25);
        assert_eq!(half.at_level(LoadLevel::PLANNED), half);
        // Workers 4x faster: the client sends 4x faster still.
        let wall = half
            .at_level(double)
            .on_wall_clock(SpeedUp::new(4.0).unwrap());
        assert_eq!(wall.factor(), 0.0625);
        assert_eq!(half.scale_ms(1000.0), 500.0);
    }

    #[test]
    fn out_of_range_factors_are_refused_by_name() {
        assert!(ArrivalScale::new(0.0).is_ok(), "0 sends everything at once");
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            assert!(ArrivalScale::new(bad).is_err());
            assert!(LoadLevel::new(bad).is_err());
        }
        assert!(LoadLevel::new(0.0).is_err());
        let e = "x".parse::<LoadLevel>().unwrap_err().to_string();
        assert!(e.contains("load level") && e.ends_with("got x"), "{e}");
        let e = "-2".parse::<ArrivalScale>().unwrap_err().to_string();
        assert!(e.contains("arrival scale"), "{e}");
        assert_eq!(
            serde_json::to_string(&LoadLevel::new(1.5).unwrap()).unwrap(),
            "1.5"
        );
        assert!(serde_json::from_str::<LoadLevel>("0").is_err());
    }
}
