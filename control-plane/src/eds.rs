//! eds (placeholder).
