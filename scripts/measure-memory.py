#!/usr/bin/env python3
# Peak RSS (VmHWM) and private dirty memory (Private_Dirty summed over /proc/PID/smaps) of
# several exitless builds on the bench guest, interleaved, sampled 0.4 s after the guest's first
# line (docs/performance.md, "Lean by default"), with private dirty split by mapping so that a
# growth has a name. Usage: measure-memory.py BENCH_ELF ROUNDS LABEL=BINARY [LABEL=BINARY...]
import os, statistics, subprocess, sys, time
from collections import defaultdict

guest, rounds = sys.argv[1], int(sys.argv[2])
builds = [a.split('=', 1) for a in sys.argv[3:]]

def smaps(pid):
    by_map, total, name = defaultdict(int), 0, None
    for line in open(f'/proc/{pid}/smaps'):
        parts = line.split()
        if '-' in parts[0] and not parts[0].endswith(':'):
            name = parts[5] if len(parts) > 5 else '[anon]'
            continue
        if parts[0] == 'Private_Dirty:':
            by_map[name] += int(parts[1])
            total += int(parts[1])
    return total, by_map

def sample(binary):
    p = subprocess.Popen([binary, 'run', '--kernel', guest, '--memory', '512M',
                          '--cmdline', 'case=pio_out iters=3000000'],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    p.stdout.readline()
    time.sleep(0.4)
    status = open(f'/proc/{p.pid}/status').read()
    hwm = int(status.split('VmHWM:')[1].split()[0])
    threads = int(status.split('Threads:')[1].split()[0])
    dirty, by_map = smaps(p.pid)
    p.kill(); p.wait()
    return hwm, dirty, by_map, threads

subprocess.run(['sync'])
# Each binary's text faults in from disk, as after a reboot and as `exitless compare` does: how
# the page cache was filled (a copy, the linker) otherwise moves peak RSS by ~100 kB.
for _, binary in builds:
    fd = os.open(binary, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
results = {label: [] for label, _ in builds}
for r in range(rounds):
    order = builds if r % 2 == 0 else builds[::-1]
    for label, binary in order:
        results[label].append(sample(binary))
for label, runs in results.items():
    hwm = statistics.median(x[0] for x in runs)
    dirty = statistics.median(x[1] for x in runs)
    maps = defaultdict(list)
    for x in runs:
        for k, v in x[2].items():
            maps[k].append(v)
    split = ', '.join(f'{k} {statistics.median(v):g}' for k, v in sorted(maps.items(), key=lambda kv: -max(kv[1])) if max(v) > 0)
    print(f'{label}: {rounds} runs, peak RSS median {hwm:g} kB (min {min(x[0] for x in runs)}, max {max(x[0] for x in runs)}); '
          f'private dirty median {dirty:g} kB; threads {runs[0][3]}; dirty by mapping: {split}')
