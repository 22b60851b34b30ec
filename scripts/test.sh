#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests, and KVM integration tests (which skip with
# a printed reason where /dev/kvm is missing). Fetches the default Linux guest first, because the
# `exitless run` boot test uses it.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cc >/dev/null || ! command -v cargo >/dev/null; then
    echo "test.sh: needs a C compiler (apt-get install build-essential) and cargo (rustup)" >&2
    exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
# The build's target (.cargo/config.toml; rust-toolchain.toml also asks rustup for it).
rustup target add x86_64-unknown-linux-musl >/dev/null 2>&1 || true
# QEMU boots the exported bench guest in one test (skipped with a reason when it is absent).
if ! command -v qemu-system-x86_64 >/dev/null && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -qq qemu-system-x86 >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y -qq qemu-system-x86 >/dev/null; } \
        || echo "test.sh: could not install qemu-system-x86; its test will be skipped" >&2
fi

# The DSDT test decompiles the hotplug AML with ACPICA's iasl (skipped with a reason without it).
if ! command -v iasl >/dev/null && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -qq acpica-tools >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y -qq acpica-tools >/dev/null; } \
        || echo "test.sh: could not install acpica-tools; the DSDT test will be skipped" >&2
fi

# `exitless compare --chart` labels its chart with DejaVu Sans (its test skips the chart without it).
if [ ! -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -qq fonts-dejavu-core >/dev/null 2>&1 || echo "test.sh: could not install fonts-dejavu-core" >&2
fi
# compare reads KVM_RUN turnarounds from tracefs; mounted here so its tests find it at once.
if [ "$(id -u)" -eq 0 ] && [ -d /sys/kernel/tracing ] && [ ! -e /sys/kernel/tracing/instances ]; then
    mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || echo "test.sh: could not mount tracefs" >&2
fi
bash scripts/fetch-guest.sh guest
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --profile ci -- -D warnings
# The VMM without the lab (no bench, compare, bench guest): the core must build on its own.
cargo clippy -p exitless --no-default-features --profile ci -- -D warnings

# Test what ships: the release binaries exactly as the README builds them (static musl, fat
# LTO, panic=abort), the VMM-only one first so that the default build is the one left in
# target/.../release. The end-to-end tests run against these (EXITLESS_BIN, EXITLESS_VMM_BIN),
# not against the test profile's build, which differs in LTO and panic strategy.
shipped_start=$(date +%s)
release=target/x86_64-unknown-linux-musl/release
shipped=target/shipped
mkdir -p "$shipped"
cargo build --release --no-default-features
cp "$release/exitless" "$shipped/exitless-vmm"
cargo build --release
cp "$release/exitless" "$release/exitless-chart" "$shipped/"
bash scripts/check-weak-calls.sh "$shipped/exitless" "$shipped/exitless-vmm"
export EXITLESS_BIN=$PWD/$shipped/exitless EXITLESS_VMM_BIN=$PWD/$shipped/exitless-vmm
echo "test.sh: release builds and their checks took $(( $(date +%s) - shipped_start )) s"
# Tests that cannot run here say why (vmm::test_skip); cargo hides it, so count them here.
skips=$(mktemp)
results=$(mktemp)
trap 'rm -f "$skips" "$results"' EXIT
# --no-fail-fast: one run names every failing test, not only the first failing test binary's.
status=0
EXITLESS_SKIP_LOG=$skips cargo test --workspace --profile ci --no-fail-fast 2>&1 | tee "$results" || status=$?
if [ -s "$skips" ]; then
    echo "test.sh: tests that skipped (they passed without doing their work here):"
    sort "$skips" | uniq -c | sed 's/^/  /'
fi
# One closing line for the whole suite: cargo prints one "test result" per test binary.
awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed, ", p, f }' "$results"
echo "$(sort -u "$skips" | wc -l) skipped"
exit "$status"
