//! settings (placeholder).
