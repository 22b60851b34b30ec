//! vcpu
