//! The device manager: what a VM's devices need from KVM and from each other. It owns GSI
//! allocation and routing, ioeventfd and irqfd registration, bus assembly with stable names,
//! and each device's ACPI part.

pub mod routing;
