//! Builds the bench guest (the C and assembly beside this file) into a standalone ELF with a
//! PVH note, which the library embeds with `include_bytes!`.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCES: &[&str] = &[
    "entry.S",
    "bench.c",
    "runtime.c",
    "cpu.c",
    "smp.c",
    "pci.c",
    "virtio.c",
    "virtio_cases.c",
    "virtio_net.c",
    "virtio_vsock.c",
    "hotplug.c",
    "memory_hotplug.c",
    "ipi.c",
    "virtio_hostile.c",
    "virtio_fs.c",
    "snapshot.c",
    "snapshot_hotplug.c",
    "virtio_balloon.c",
    "virtio_pmem.c",
    "operations.c",
    "dirty.c",
    "migrate.c",
];
const HEADERS: &[&str] = &["layout.h", "guest.h", "virtio.h", "link.ld"];
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
    for f in SOURCES.iter().chain(HEADERS) {
        println!("cargo:rerun-if-changed={f}");
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
    build_guest(&out);
}

fn build_guest(out: &Path) {
    let mut build = cc::Build::new();
    build
        .files(SOURCES)
        .include(".")
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
        .arg("-Wl,-T,link.ld")
        .arg("-o")
        .arg(&elf)
        .args(&objects)
        .status()
        .expect("the C compiler runs to link the bench guest");
    assert!(status.success(), "linking the bench guest failed");
}
