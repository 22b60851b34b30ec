#!/usr/bin/env python3
"""The bench guest's virtio_blk case under exitless and under QEMU's virtio-blk-pci, same sitting.

Usage: scripts/blk-vs-qemu.py [--rounds N] [--requests N] [--exitless PATH] [--qemu PATH]

Both VMMs boot the same exported guest ELF (1 vCPU, 128 MiB, a 16 MiB raw image in the page
cache) with `case=virtio_blk qd=Q iters=N hold`. Per VMM and queue depth it reports:
  - requests/s, from the guest's own cycle count for its requests (the TSC frequency from
    exitless's profile);
  - userspace exits per request: the `kvm:kvm_userspace_exit` tracepoint counted by
    `perf stat` (needs root), from two request counts so that boot cancels out;
  - in-kernel exits per request: KVM's `exits` statistic (exitless's profile; QEMU's
    `query-stats` over QMP), from the same two runs;
  - RSS beyond guest memory once the guest is done (VmRSS less the guest RAM mapping's RSS).
Rounds interleave the VMMs; each figure is the median over the rounds (min-max beside it).
`exitless compare` (to come) generalises this; this script is what docs/bench.md quotes.
"""
import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

MEMORY_MIB = 128


def log(msg):
    print(f"[blk-vs-qemu] {msg}", file=sys.stderr, flush=True)


def guest_cmdline(qd, iters):
    return f"case=virtio_blk iters={iters} qd={qd} hold"


def exitless_cmd(args, work, qd, iters):
    return [args.exitless, "run", "--kernel", work["guest"], "--memory", f"{MEMORY_MIB}M",
            "--timeout", "300", "--disk", f"path={work['image']}",
            "--profile-json", work["profile"], "--cmdline", guest_cmdline(qd, iters)]


def qemu_cmd(args, work, qd, iters):
    return [args.qemu, "-accel", "kvm", "-M", "pc", "-nodefaults", "-m", f"{MEMORY_MIB}M",
            "-kernel", work["guest"], "-serial", "stdio", "-display", "none", "-no-reboot",
            "-device", "isa-debug-exit,iobase=0xf4,iosize=4",
            "-device", "virtio-blk-pci,disable-legacy=on,drive=d",
            "-drive", f"file={work['image']},if=none,id=d,format=raw",
            "-qmp", f"unix:{work['qmp']},server=on,wait=off",
            "-append", guest_cmdline(qd, iters)]


def wait_for_done(proc, limit=300):
    """Reads the guest console until EXITLESS DONE; returns the RESULT line's fields."""
    deadline = time.time() + limit
    result = None
    for line in proc.stdout:
        if line.startswith("EXITLESS RESULT"):
            result = dict(kv.split("=", 1) for kv in line.split()[2:] if "=" in kv)
        if "EXITLESS ERROR" in line:
            raise RuntimeError(line.strip())
        if line.startswith("EXITLESS DONE"):
            return result
        if time.time() > deadline:
            break
    raise RuntimeError("the guest did not finish")


def vmm_pid(perf_pid):
    out = subprocess.run(["pgrep", "-P", str(perf_pid)], capture_output=True, text=True)
    return int(out.stdout.split()[0])


def rss_beyond_guest(pid):
    """VmRSS less the RSS of the guest RAM mapping (the one anonymous mapping of its size)."""
    total, guest, size = 0, 0, 0
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
            if m:
                size = int(m.group(2), 16) - int(m.group(1), 16)
            elif line.startswith("Rss:"):
                kib = int(line.split()[1])
                total += kib
                if size >= MEMORY_MIB << 20:
                    guest += kib
    return total - guest


def qmp_exits(path):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    f = s.makefile("rw")
    f.readline()
    for cmd in ({"execute": "qmp_capabilities"},
                {"execute": "query-stats", "arguments": {"target": "vcpu", "providers": [
                    {"provider": "kvm", "names": ["exits"]}]}}):
        f.write(json.dumps(cmd) + "\n")
        f.flush()
        reply = json.loads(f.readline())
    s.close()
    return sum(st["value"] for vcpu in reply["return"] for st in vcpu["stats"])


def profile_exits(path):
    with open(path) as f:
        profile = json.load(f)
    exits = sum(s["delta"] for s in profile["kvm_stats"] if s["name"] == "exits")
    return exits, profile["tsc_khz"]


def perf_count(path):
    with open(path) as f:
        for line in f:
            fields = line.strip().split(",")
            if len(fields) > 2 and fields[2] == "kvm:kvm_userspace_exit":
                return int(fields[0])
    raise RuntimeError("perf counted nothing")


def one_run(args, work, vmm, qd, iters):
    build = exitless_cmd if vmm == "exitless" else qemu_cmd
    cmd = ["perf", "stat", "-x,", "-o", work["perf"], "-e", "kvm:kvm_userspace_exit", "--"]
    cmd += build(args, work, qd, iters)
    perf = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        result = wait_for_done(perf)
        pid = vmm_pid(perf.pid)
        rss = rss_beyond_guest(pid)
        exits, tsc_khz = (qmp_exits(work["qmp"]), None) if vmm == "qemu" else (None, None)
        os.kill(pid, signal.SIGTERM if vmm == "exitless" else signal.SIGKILL)
        perf.wait(60)
    finally:
        if perf.poll() is None:
            perf.kill()
    if vmm == "exitless":
        exits, tsc_khz = profile_exits(work["profile"])
    return {"cycles": int(result["cycles"]), "exits": exits, "user": perf_count(work["perf"]),
            "rss_kib": rss, "tsc_khz": tsc_khz}


def summarise(runs, requests, tsc_khz):
    """Per-request figures from pairs of runs (small, large) of one VMM and queue depth."""
    extra = requests - requests // 5
    per = {"requests_per_s": [], "user_exits": [], "kernel_exits": [], "rss_kib": []}
    for a, b in runs:
        per["requests_per_s"].append(tsc_khz * 1000 * requests / b["cycles"])
        per["user_exits"].append((b["user"] - a["user"]) / extra)
        per["kernel_exits"].append((b["exits"] - a["exits"]) / extra)
        per["rss_kib"].append(b["rss_kib"])
    return {k: (min(v), statistics.median(v), max(v)) for k, v in per.items()}


def check_tools(args):
    """One clear line for each thing the comparison cannot do without."""
    for tool in (args.exitless, args.qemu, "perf"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0 \
                and not os.access(tool, os.X_OK):
            sys.exit(f"blk-vs-qemu: {tool} not found (perf: apt-get install linux-perf)")
    if not os.path.isdir("/sys/kernel/tracing/events/kvm"):
        subprocess.run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"],
                       capture_output=True)
    probe = subprocess.run(["perf", "stat", "-e", "kvm:kvm_userspace_exit", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        sys.exit("blk-vs-qemu: perf cannot count kvm:kvm_userspace_exit (needs root and "
                 f"tracefs): {probe.stderr.strip().splitlines()[-1] if probe.stderr else ''}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--exitless", default="target/release/exitless")
    p.add_argument("--qemu", default="qemu-system-x86_64")
    args = p.parse_args()
    if args.rounds < 1 or args.requests < 10:
        p.error("--rounds must be at least 1 and --requests at least 10")
    check_tools(args)
    tmp = tempfile.mkdtemp(prefix="blk-vs-qemu-")
    work = {k: os.path.join(tmp, v) for k, v in {
        "guest": "guest.elf", "image": "disk.img", "profile": "profile.json",
        "qmp": "qmp.sock", "perf": "perf.csv"}.items()}
    subprocess.run([args.exitless, "bench", "--export-guest", work["guest"]], check=True,
                   stdout=subprocess.DEVNULL)
    with open(work["image"], "wb") as f:
        f.truncate(16 << 20)
    runs = {}
    tsc_khz = None
    for r in range(args.rounds):
        for qd in (1, 32):
            for vmm in ("exitless", "qemu"):
                log(f"round {r + 1}/{args.rounds}: {vmm} qd={qd}")
                pair = [one_run(args, work, vmm, qd, n)
                        for n in (args.requests // 5, args.requests)]
                tsc_khz = tsc_khz or pair[0]["tsc_khz"]
                runs.setdefault((vmm, qd), []).append(pair)
    rows = {key: summarise(v, args.requests, tsc_khz) for key, v in runs.items()}
    print(f"virtio_blk, {args.requests} 4 KiB random requests, {args.rounds} rounds "
          f"(median, min-max)")
    print(f"{'VMM':9} {'qd':>3} {'requests/s':>26} {'user exits/req':>15} "
          f"{'kernel exits/req':>17} {'RSS beyond guest':>17} {'vs QEMU':>8}")
    for (vmm, qd), row in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        lo, med, hi = row["requests_per_s"]
        ratio = med / rows[("qemu", qd)]["requests_per_s"][1]
        print(f"{vmm:9} {qd:>3} {med:>10.0f} ({lo:>6.0f}-{hi:>6.0f}) "
              f"{row['user_exits'][1]:>15.3f} {row['kernel_exits'][1]:>17.3f} "
              f"{row['rss_kib'][1] / 1024:>13.1f} MiB {ratio:>7.2f}x")


if __name__ == "__main__":
    main()
