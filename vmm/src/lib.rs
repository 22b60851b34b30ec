//! exitless: a KVM virtual machine monitor built around the cost of VM exits.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod api;
/// The exit lab (`exitless bench`): a layer on the core, left out without the `lab` feature.
#[cfg(feature = "lab")]
pub mod bench;
pub mod boot;
pub mod builder;
pub mod bus;
/// `exitless compare`: exitless beside the peer VMMs (part of the lab).
#[cfg(feature = "lab")]
pub mod compare;
pub mod config;
pub mod control;
pub mod device_manager;
pub mod devices;
pub mod event_loop;
/// Fuzz targets' bodies (they include the lab's result-line parser).
#[cfg(feature = "lab")]
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
pub mod wake;
