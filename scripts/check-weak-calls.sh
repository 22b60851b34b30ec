#!/usr/bin/env bash
# Fails when a static binary calls a function that was never linked in.
#
# In the static musl build, a libc function that std declares weak (getrandom, statx,
# memfd_create, copy_file_range, ...) is an undefined weak symbol: nothing pulls its object out
# of libc.a under LTO, the linker leaves its GOT slot 0 and drops the name. std compares such a
# slot with 0 before it calls through it; code that calls the libc function directly jumps to
# address 0 (exitless's virtio-rng did, 2dd7188). This lists every GOT slot that holds 0 and
# the functions that use it, and fails if a function uses one without comparing it with 0.
#
# Usage: scripts/check-weak-calls.sh BINARY...   (needs objdump, from binutils)
set -euo pipefail

check() {
    local bin=$1 zeros
    # The .got's 8-byte slots that hold 0, as hex addresses without leading zeros.
    zeros=$(objdump -s -j .got "$bin" 2>/dev/null | awk '
        /^ [0-9a-f]+ / {
            for (i = 2; i <= 4 && i < NF; i += 2)
                if ($i $(i + 1) == "0000000000000000") print $1, (i - 2) * 4
        }' | while read -r line offset; do printf '%x\n' $((0x$line + offset)); done)
    if [ -z "$zeros" ]; then
        echo "check-weak-calls: $bin: no GOT slot holds 0"
        return 0
    fi
    # Each instruction that names a zero slot ("# 6ebf68 <_GLOBAL_OFFSET_TABLE_+0x340>"), with
    # the function it is in and whether it compares the slot with 0.
    objdump -d -C --no-show-raw-insn "$bin" | awk -v zeros="$zeros" -v bin="$bin" '
        BEGIN { n = split(zeros, z, "\n"); for (i = 1; i <= n; i++) zero[z[i]] = 1 }
        /^[0-9a-f]+ <.*>:$/ { fn = substr($0, index($0, "<") + 1); sub(/>:$/, "", fn); next }
        / # [0-9a-f]+ <_GLOBAL_OFFSET_TABLE_/ {
            slot = $0; sub(/.* # /, "", slot); sub(/ .*/, "", slot)
            if (!(slot in zero)) next
            key = slot SUBSEP fn
            if ($0 ~ /cmpq +\$0x0,/) compared[key] = 1; else used[key] = 1
            fns[key] = fn; slots[key] = slot
        }
        END {
            bad = 0
            for (key in fns) {
                verdict = (key in used && !(key in compared)) ? "UNGUARDED" : "guarded"
                if (verdict == "UNGUARDED") bad++
                printf "  slot %s: %s in %s\n", slots[key], verdict, fns[key]
            }
            if (bad) {
                printf "check-weak-calls: %s calls %d function(s) that were not linked in (address 0); call the system call instead\n", bin, bad
                exit 1
            }
            printf "check-weak-calls: %s: every use of an absent weak symbol is guarded\n", bin
        }'
}

[ $# -gt 0 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }
command -v objdump >/dev/null || { echo "check-weak-calls: needs objdump (binutils)" >&2; exit 2; }
for bin in "$@"; do
    check "$bin"
done
