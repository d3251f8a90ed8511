//! Virtual-time driver (placeholder).
