//! kvm
