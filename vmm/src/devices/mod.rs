//! devices
