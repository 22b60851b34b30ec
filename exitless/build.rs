//! Link step of the exitless binaries: the exit path's functions, which the vmm crate puts in
//! `.text.hot.exitless_exit_path` sections, stay together in one page-aligned output section
//! ahead of the rest of the code (`exit_path.ld`) instead of wherever the code generation
//! units and the size of the code before them happen to place them. Measured on a PVM host:
//! without keeping them together, unrelated changes elsewhere moved the VMM's overhead per
//! userspace exit between ~100 and ~150 ns; kept together but placed after the cold code
//! (`.text.unlikely`, which GNU ld puts first), a change that shrank the cold code by 9.8 kB
//! moved it from ~65 to ~80 ns (2026-11-27).
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=exit_path.ld");
    println!("cargo:rustc-link-arg-bins=-Wl,-z,keep-text-section-prefix");
    println!("cargo:rustc-link-arg-bins=-Wl,-T,{dir}/exit_path.ld");
}
