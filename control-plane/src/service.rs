//! service (placeholder).
