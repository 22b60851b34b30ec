#!/usr/bin/env python3
# Live migration of the bench guest (case=snapshot) between two exitless processes on this host,
# each figure as the source logs it with -v (vm.send-migration: total time from the request to
# the destination's OK to Complete, downtime from the pause to that OK, memory bytes sent, passes)
# and the client's time for the whole vm.send-migration request. Rows:
#   rest     touch_mib=8, long rounds of exits (iters=20000): nearly idle memory
#   writing  dirty=1 touch_mib=N: every round writes its N MiB again (iters=2000)
#   local    as rest, memory shared=on, local=true (memory as fds)
# Usage: measure-migration.py EXITLESS BENCH_ELF ROUNDS [WRITING_MIB [REST_MIB [ROWS]]]
#   (docs/migration.md, "Figures"; REST_MIB is what rest and local touch, 8 by default; ROWS a
#   comma-separated choice of rest,writing,local)
import os, re, statistics, subprocess, sys, tempfile, threading, time

from measure_api import request

EXITLESS, GUEST, ROUNDS = sys.argv[1], sys.argv[2], int(sys.argv[3])
MIB = int(sys.argv[4]) if len(sys.argv) > 4 else 64
REST_MIB = int(sys.argv[5]) if len(sys.argv) > 5 else 8
ROWS = sys.argv[6].split(',') if len(sys.argv) > 6 else ['rest', 'writing', 'local']
WORK = tempfile.mkdtemp(prefix='exitless-measure-mig-')


def call(sock, method, path, body=None):
    """An /api/v1/ request (a migration may take minutes): (body, ms)."""
    _, data, ms = request(sock, method, '/api/v1/' + path, body, timeout=600)
    return data, ms


def vmm(name):
    sock = os.path.join(WORK, name + '.sock')
    p = subprocess.Popen([EXITLESS, '-v', '--api-socket', sock], stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while not os.path.exists(sock):
        assert time.time() - t0 < 10
        time.sleep(0.01)
    return p, sock


def wait_serial(path, text, limit=120):
    t0 = time.time()
    while time.time() - t0 < limit:
        if os.path.exists(path) and text in open(path, errors='replace').read():
            return
        time.sleep(0.02)
    raise RuntimeError(f'no {text} in {path}')


def one(row, i):
    serial = os.path.join(WORK, f'{row}-{i}.log')
    memory = {'size': 512 << 20}
    if row == 'writing':
        cmdline = f'case=snapshot ticks=1000000 iters=2000 touch_mib={MIB} dirty=1 hold'
    else:
        cmdline = f'case=snapshot ticks=1000000 iters=20000 touch_mib={REST_MIB} hold'
    if row == 'local':
        memory['shared'] = True
    src, ssock = vmm(f'src-{row}-{i}')
    dst, dsock = vmm(f'dst-{row}-{i}')
    call(ssock, 'PUT', 'vm.create', {'cpus': {'boot_vcpus': 1, 'max_vcpus': 1}, 'memory': memory,
                                     'payload': {'kernel': GUEST, 'cmdline': cmdline},
                                     'serial': {'mode': 'File', 'file': serial}})
    call(ssock, 'PUT', 'vm.boot')
    wait_serial(serial, 'TICK n=2 ')
    url = 'unix:' + os.path.join(WORK, f'm-{row}-{i}.sock')
    t = threading.Thread(target=call, args=(dsock, 'PUT', 'vm.receive-migration', {'receiver_url': url}))
    t.start()
    while not os.path.exists(url[5:]):
        time.sleep(0.005)
    _, ms = call(ssock, 'PUT', 'vm.send-migration', {'destination_url': url, 'local': row == 'local'})
    t.join()
    src.wait(timeout=30)
    log = src.stderr.read()
    m = re.search(r'complete in ([\d.]+) ms, downtime ([\d.]+) ms, (\d+) MiB of memory in (\d+) passes', log)
    n0 = open(serial, errors='replace').read().count('TICK')
    wait_serial(serial, f'TICK n={n0 + 1} ')
    call(dsock, 'PUT', 'vmm.shutdown')
    dst.wait(timeout=30)
    return float(m[1]), float(m[2]), int(m[3]), int(m[4]), ms


def med(xs):
    return f'{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})'


for row in ROWS:
    runs = [one(row, i) for i in range(ROUNDS)]
    total, down, mib, passes, client = zip(*runs)
    print(f'{row}: total {med(total)} ms, downtime {med(down)} ms, client {med(client)} ms, '
          f'memory {med(mib)} MiB, passes {med(passes)}')
