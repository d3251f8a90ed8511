//! index (placeholder).
