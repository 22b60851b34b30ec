#!/usr/bin/env python3
# Start-up (spawn to the guest's first line) and memory (VmHWM, private dirty, the guest RAM memfd's
# smaps) of private against shared guest memory, interleaved. Usage: EXITLESS N BENCH_ELF
# (docs/performance.md, "Shared guest memory").
import subprocess, time, os, sys, statistics, signal
B=sys.argv[1]; N=int(sys.argv[2]); guest=sys.argv[3]
modes={'private':'512M','shared':'size=512M,shared=on'}
res={m:[] for m in modes}
def smaps(pid):
    priv=0; memfd={'Rss':0,'Shared_Dirty':0,'Private_Dirty':0}; cur=None
    for line in open(f'/proc/{pid}/smaps'):
        parts=line.split()
        if not parts[0].endswith(':') or len(parts)>3 and '-' in parts[0]:
            cur = 'memfd' if 'memfd:exitless-guest-ram' in line else None
            continue
        if '-' in parts[0] and not parts[0].endswith(':'):
            cur=None; continue
        k=parts[0][:-1]
        if k=='Private_Dirty': priv+=int(parts[1])
        if cur=='memfd' and k in memfd: memfd[k]+=int(parts[1])
    return priv, memfd
for i in range(N):
    for m in (modes if i%2==0 else list(modes)[::-1]):
        t0=time.perf_counter()
        p=subprocess.Popen([B,'run','--kernel',guest,'--memory',modes[m],'--cmdline','case=pio_out iters=3000000'],stdout=subprocess.PIPE,stderr=subprocess.DEVNULL,stdin=subprocess.DEVNULL)
        p.stdout.readline(); t1=time.perf_counter()
        time.sleep(0.4)
        hwm=[l for l in open(f'/proc/{p.pid}/status') if l.startswith('VmHWM')][0].split()[1]
        priv,memfd=smaps(p.pid)
        p.kill(); p.wait()
        res[m].append(((t1-t0)*1000,int(hwm),priv,memfd))
for m,r in res.items():
    st=statistics.median([x[0] for x in r]); hwm=statistics.median([x[1] for x in r]); pd=statistics.median([x[2] for x in r])
    mf={k:statistics.median([x[3][k] for x in r]) for k in r[0][3]}
    print(f"{m}: n={len(r)} spawn->first line median {st:.2f} ms (min {min(x[0] for x in r):.2f}, max {max(x[0] for x in r):.2f}); VmHWM {hwm} kB; private dirty {pd} kB; memfd mapping {mf}")
