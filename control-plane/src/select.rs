//! select (placeholder).
