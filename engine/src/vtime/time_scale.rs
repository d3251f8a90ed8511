//! Model time versus wall time for the real-time worker (see [`super`] docs).

/// Factor between model time and wall time for the real-time worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimeScale(f64);

impl TimeScale {
    /// Real speed: one model millisecond per wall millisecond.
    pub const REAL: TimeScale = TimeScale(1.0);

    /// A scale factor; `None` unless finite and positive.
    pub fn new(factor: f64) -> Option<Self> {
        (factor.is_finite() && factor > 0.0).then_some(TimeScale(factor))
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
