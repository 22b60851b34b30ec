//! Builds the floor VMM (floor/floor.c) into a freestanding static host executable, which
//! `compare` embeds with `include_bytes!`.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The floor VMM: one C file and its ABI header.
const FLOOR_SOURCE: &str = "floor/floor.c";
const FLOOR_HEADER: &str = "floor/kvm_abi.h";

fn main() {
    for f in [FLOOR_SOURCE, FLOOR_HEADER] {
        println!("cargo:rerun-if-changed={f}");
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
    build_floor(&out);
}

/// The floor VMM: freestanding (its own `_start`, raw system calls, no libc), static, not
/// position-independent, so that what it measures is the kernel and KVM, not a C runtime.
fn build_floor(out: &Path) {
    let mut build = cc::Build::new();
    build
        .file(FLOOR_SOURCE)
        .pic(false)
        // The same executable in every profile (the dev profile's `-g` made it 70 kB).
        .debug(false)
        .opt_level(2)
        .inherit_rustflags(false)
        .warnings_into_errors(true);
    for f in [
        "-ffreestanding",
        "-fno-pie",
        "-fno-stack-protector",
        "-fno-sanitize=all",
        "-fno-asynchronous-unwind-tables",
        "-O2",
        "-Wall",
        "-Wextra",
    ] {
        build.flag(f);
    }
    let objects = build.compile_intermediates();
    let status = Command::new(build.get_compiler().path())
        .args(["-nostdlib", "-static", "-no-pie", "-Wl,--build-id=none"])
        .args(["-Wl,-z,noexecstack", "-o"])
        .arg(out.join("floor"))
        .args(&objects)
        .status()
        .expect("the C compiler runs to link the floor VMM");
    assert!(status.success(), "linking the floor VMM failed");
}
