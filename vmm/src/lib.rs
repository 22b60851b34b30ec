//! exitless's core: a KVM virtual machine monitor built around the cost of VM exits (KVM,
//! memory, boot, the bus, devices, the device manager, vCPUs, the builder, the launch,
//! snapshots). The layers above it are crates of their own (docs/architecture.md): the
//! control plane (`exitless-control`) and the exit lab (`exitless-lab`) import from this crate,
//! never the other way round.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod boot;
pub mod builder;
pub mod bus;
pub mod config;
pub mod device_manager;
pub mod devices;
pub mod event_loop;
pub mod kvm;
pub mod launch;
pub mod memory;
pub mod profile;
pub mod seccomp;
pub mod snapshot;
pub mod startup;
pub mod terminal;
pub mod test_skip;
pub mod vcpu;
pub mod vm;
pub mod wake;
