//! exitless: a KVM virtual machine monitor built around the cost of VM exits.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod api;
pub mod bench;
pub mod boot;
pub mod builder;
pub mod bus;
pub mod compare;
pub mod config;
pub mod control;
pub mod device_manager;
pub mod devices;
pub mod event_loop;
pub mod fuzzing;
pub mod kvm;
pub mod launch;
pub mod memory;
pub mod profile;
pub mod seccomp;
pub mod startup;
pub mod terminal;
pub mod test_skip;
pub mod vcpu;
pub mod vm;
