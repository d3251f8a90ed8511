//! consumers (placeholder).
