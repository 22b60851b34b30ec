//! Link step of the exitless binaries: the exit path's functions, which the vmm crate puts in
//! `.text.hot.*` sections, stay together in one output section instead of wherever the code
//! generation units happen to place them. Measured on a PVM host: without it, unrelated
//! changes elsewhere moved the VMM's overhead per userspace exit between ~100 and ~150 ns.
fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,-z,keep-text-section-prefix");
}
