//! boot
