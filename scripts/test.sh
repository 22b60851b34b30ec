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

bash scripts/fetch-guest.sh guest
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release -- -D warnings
cargo test --workspace --release
