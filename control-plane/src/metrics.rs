//! metrics (placeholder).
