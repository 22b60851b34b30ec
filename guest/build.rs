//! Builds the bench guest (C and assembly under guest/) into a standalone ELF with a PVH note,
//! and the floor VMM (floor/floor.c) into a freestanding static host executable; the library
//! embeds both with `include_bytes!`.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCES: &[&str] = &[
    "guest/entry.S",
    "guest/bench.c",
    "guest/runtime.c",
    "guest/cpu.c",
    "guest/smp.c",
    "guest/pci.c",
    "guest/virtio.c",
    "guest/virtio_cases.c",
    "guest/virtio_net.c",
    "guest/virtio_vsock.c",
    "guest/hotplug.c",
    "guest/memory_hotplug.c",
    "guest/ipi.c",
    "guest/virtio_hostile.c",
    "guest/virtio_fs.c",
    "guest/snapshot.c",
    "guest/virtio_balloon.c",
];
const HEADERS: &[&str] = &[
    "guest/layout.h",
    "guest/guest.h",
    "guest/virtio.h",
    "guest/link.ld",
];
/// The floor VMM: one C file and its ABI header.
const FLOOR_SOURCE: &str = "floor/floor.c";
const FLOOR_HEADER: &str = "floor/kvm_abi.h";
const FLAGS: &[&str] = &[
    "-ffreestanding",
    "-fno-pic",
    "-fno-pie",
    "-fno-stack-protector",
    // cc adds -fsanitize=address when the Rust code is built with ASan (cargo fuzz); the
    // guest has no sanitizer runtime.
    "-fno-sanitize=all",
    "-fno-asynchronous-unwind-tables",
    "-mno-red-zone",
    "-mgeneral-regs-only",
    "-mcmodel=small",
    "-O2",
    "-Wall",
    "-Wextra",
];

fn main() {
    for f in SOURCES
        .iter()
        .chain(HEADERS)
        .chain(&[FLOOR_SOURCE, FLOOR_HEADER])
    {
        println!("cargo:rerun-if-changed={f}");
    }
    // The bench guest belongs to the lab: the core alone does not build it.
    if env::var_os("CARGO_FEATURE_LAB").is_none() {
        return;
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
    build_guest(&out);
    build_floor(&out);
}

fn build_guest(out: &Path) {
    let mut build = cc::Build::new();
    build
        .files(SOURCES)
        .include("guest")
        .pic(false)
        // A freestanding guest: no -C target-cpu or the like from RUSTFLAGS.
        .inherit_rustflags(false)
        .warnings_into_errors(true);
    for f in FLAGS {
        build.flag(f);
    }
    let objects = build.compile_intermediates();
    let compiler = build.get_compiler();
    let elf = out.join("bench-guest.elf");
    let status = Command::new(compiler.path())
        .args(["-nostdlib", "-static", "-no-pie", "-Wl,--build-id=none"])
        .arg("-Wl,-T,guest/link.ld")
        .arg("-o")
        .arg(&elf)
        .args(&objects)
        .status()
        .expect("the C compiler runs to link the bench guest");
    assert!(status.success(), "linking the bench guest failed");
}

/// The floor VMM: freestanding (its own `_start`, raw system calls, no libc), static, not
/// position-independent, so that what it measures is the kernel and KVM, not a C runtime.
fn build_floor(out: &Path) {
    let mut build = cc::Build::new();
    build
        .file(FLOOR_SOURCE)
        .pic(false)
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
