//! policy (placeholder).
