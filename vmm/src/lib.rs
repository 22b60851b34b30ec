//! exitless's core: a KVM virtual machine monitor built around the cost of VM exits (KVM,
//! memory, boot, the bus, devices, the device manager, vCPUs, the builder, the launch,
//! snapshots). The layers above it are crates of their own (docs/architecture.md): the
//! control plane (`exitless-control`) and the exit lab (`exitless-lab`) import from this crate,
//! never the other way round.
//!
//! # The lab's entry points
//!
//! Beyond what the binary and the control plane use (`launch`, `config`, `snapshot`,
//! `profile`'s reports, `startup`, `seccomp`), the lab builds and runs VMs itself. What it
//! reaches, each item's documentation saying so: the builder ([`builder::VmBuilder`], and
//! `builder::KernelImage::Embedded` under the `embedded` feature) and the VM it yields
//! ([`vm::Vm`]); the exit path's observer ([`vcpu::ExitObserver`]) and dispatch
//! ([`vcpu::exit::dispatch`], [`vcpu::handle_exit`]), a vCPU's fd for the exit-path ablation's
//! own loop ([`vcpu::Vcpu::fd_mut`]); the buses ([`bus::BusBuilder`], [`bus::Buses`]), the device
//! manager ([`device_manager::DeviceManager`]) and the devices event loop
//! ([`event_loop::EventLoop`]); the device models themselves (`devices`: the bench's virtio
//! cases and the fuzz targets build them); the coalesced ring's entries
//! ([`kvm::ring::CoalescedWrite`]); the clocks ([`profile::rdtsc`],
//! [`profile::estimate_tsc_khz`], [`profile::per_exit_work_ns`]); the host's PV features
//! ([`boot::cpuid::kvm_pv_features`]). A change to these is a change to the lab's API.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod boot;
pub mod builder;
pub mod bus;
pub mod config;
pub mod coredump;
pub mod device_manager;
pub mod devices;
pub mod event_loop;
pub mod kvm;
pub mod launch;
pub mod memory;
pub mod migration;
pub mod profile;
pub mod seccomp;
pub mod snapshot;
pub mod startup;
pub mod terminal;
pub mod test_skip;
pub mod vcpu;
pub mod vm;
pub mod wake;
