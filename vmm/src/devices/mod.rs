//! Device models: state machines behind the bus, testable without KVM.

pub mod bench_ports;
pub mod i8042;
pub mod serial;
