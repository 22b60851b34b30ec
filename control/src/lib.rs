//! exitless's control plane: the API server (HTTP on a Unix socket, Cloud Hypervisor's schema
//! and its conversion to the core's configuration) and the VM an API drives. Stands on the
//! core (`vmm`); the lab and the binary stand on it.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod api;
pub mod control;
