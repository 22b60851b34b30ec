//! exitless's exit lab: `exitless bench` (what each kind of VM exit costs), `exitless compare`
//! (exitless beside the peer VMMs), and the fuzz targets' bodies. Stands on the core (`vmm`,
//! through what it names as the lab's entry points: docs/architecture.md), the control plane
//! (compare drives VMMs through the API's schema) and the bench guest; only the binary's `lab`
//! feature and the fuzz crate pull it in.
#![deny(clippy::undocumented_unsafe_blocks)]

/// The exit lab (`exitless bench`).
pub mod bench;
/// `exitless compare`: exitless beside the peer VMMs.
pub mod compare;
/// Fuzz targets' bodies (they include the lab's result-line parser).
pub mod fuzzing;
