#!/usr/bin/env python3
# Snapshot and restore of the bench guest (case=snapshot: 10 MiB touched of 512 MiB, then a console
# line every couple of milliseconds), exitless beside Firecracker, interleaved round by round:
#   create   vm.snapshot of the paused VM / PUT /snapshot/create (Full)
#   restore  in a fresh process: vm.restore then vm.resume / PUT /snapshot/load then PATCH /vm
#            Resumed (each request's reply timed from the client)
#   spawn    spawn to the guest's next console line: `exitless run --restore DIR`, exitless
#            --api-socket with vm.restore {"resume": true}, firecracker --api-sock with
#            PUT /snapshot/load {"resume_vm": true}
#   clones   Private_Dirty summed over /proc/PID/smaps of each of 10 clones of one snapshot,
#            running at once, 1 s after their start
# Usage: measure-snapshot.py EXITLESS FIRECRACKER BENCH_ELF ROUNDS  (docs/snapshot.md, "Figures")
import json, os, shutil, socket, statistics, subprocess, sys, tempfile, time

from measure_api import request

EXITLESS, FIRECRACKER, GUEST, ROUNDS = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
CMDLINE = 'case=snapshot ticks=100000000 iters=20 touch_mib=10'
WORK = tempfile.mkdtemp(prefix='exitless-measure-snap-')


def call(sock, method, path, body=None):
    """One request; (status, body, ms)."""
    return request(sock, method, path, body)


def wait_socket(sock, limit=10):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit:
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sock)
            s.close()
            return
        except OSError:
            time.sleep(0.0005)
    raise RuntimeError(f'no socket {sock}')


def next_tick(p):
    while True:
        line = p.stdout.readline()
        if not line:
            raise RuntimeError('console ended')
        if b'EXITLESS TICK' in line:
            return line


def private_dirty(pid):
    return sum(int(l.split()[1]) for l in open(f'/proc/{pid}/smaps') if l.startswith('Private_Dirty:'))


def stop(p):
    p.kill()
    p.wait()


# ---- exitless ----

def ex_template(d):
    sock = f'{d}/t.sock'
    p = subprocess.Popen([EXITLESS, 'run', '--kernel', GUEST, '--memory', '512M', '--cmdline', CMDLINE,
                          '--api-socket', sock], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         stdin=subprocess.DEVNULL)
    for _ in range(50):
        next_tick(p)
    call(sock, 'PUT', '/api/v1/vm.pause')
    snap = f'{d}/ex'
    os.makedirs(snap)
    ms = call(sock, 'PUT', '/api/v1/vm.snapshot', {'destination_url': f'file://{snap}'})[2]
    stop(p)
    cfg = json.load(open(f'{snap}/config.json'))
    cfg['serial'] = {'mode': 'Tty'}
    json.dump(cfg, open(f'{snap}/config.json', 'w'))
    return snap, ms


def ex_restore(d, snap):
    sock = f'{d}/r.sock'
    p = subprocess.Popen([EXITLESS, '--api-socket', sock], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    wait_socket(sock)
    a = call(sock, 'PUT', '/api/v1/vm.restore', {'source_url': f'file://{snap}'})[2]
    b = call(sock, 'PUT', '/api/v1/vm.resume')[2]
    next_tick(p)
    stop(p)
    os.unlink(sock)
    return a, b


def ex_spawn_run(snap):
    t0 = time.perf_counter()
    p = subprocess.Popen([EXITLESS, 'run', '--restore', snap], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    next_tick(p)
    ms = (time.perf_counter() - t0) * 1e3
    stop(p)
    return ms


def ex_spawn_api(d, snap):
    sock = f'{d}/s.sock'
    t0 = time.perf_counter()
    p = subprocess.Popen([EXITLESS, '--api-socket', sock], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    wait_socket(sock)
    req = call(sock, 'PUT', '/api/v1/vm.restore', {'source_url': f'file://{snap}', 'resume': True})[2]
    next_tick(p)
    ms = (time.perf_counter() - t0) * 1e3
    stop(p)
    os.unlink(sock)
    return ms, req


def ex_clones(snap):
    ps = [subprocess.Popen([EXITLESS, 'run', '--restore', snap], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL) for _ in range(10)]
    time.sleep(1)
    kb = [private_dirty(p.pid) for p in ps]
    for p in ps:
        stop(p)
    return kb


# ---- Firecracker ----

def fc_start(sock):
    return subprocess.Popen([FIRECRACKER, '--api-sock', sock, '--level', 'Error'],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)


def fc_template(d):
    sock = f'{d}/ft.sock'
    p = fc_start(sock)
    wait_socket(sock)
    call(sock, 'PUT', '/boot-source', {'kernel_image_path': GUEST, 'boot_args': CMDLINE})
    call(sock, 'PUT', '/machine-config', {'vcpu_count': 1, 'mem_size_mib': 512})
    call(sock, 'PUT', '/actions', {'action_type': 'InstanceStart'})
    for _ in range(50):
        next_tick(p)
    call(sock, 'PATCH', '/vm', {'state': 'Paused'})
    snap = f'{d}/fc'
    os.makedirs(snap)
    ms = call(sock, 'PUT', '/snapshot/create', {'snapshot_type': 'Full', 'snapshot_path': f'{snap}/vmstate',
                                                'mem_file_path': f'{snap}/mem'})[2]
    stop(p)
    return snap, ms


def fc_load(sock, snap, resume):
    return call(sock, 'PUT', '/snapshot/load', {'snapshot_path': f'{snap}/vmstate', 'resume_vm': resume,
                                                'mem_backend': {'backend_type': 'File',
                                                                'backend_path': f'{snap}/mem'}})[2]


def fc_restore(d, snap):
    sock = f'{d}/fr.sock'
    p = fc_start(sock)
    wait_socket(sock)
    a = fc_load(sock, snap, False)
    b = call(sock, 'PATCH', '/vm', {'state': 'Resumed'})[2]
    next_tick(p)
    stop(p)
    os.unlink(sock)
    return a, b


def fc_spawn(d, snap):
    sock = f'{d}/fs.sock'
    t0 = time.perf_counter()
    p = fc_start(sock)
    wait_socket(sock)
    req = fc_load(sock, snap, True)
    next_tick(p)
    ms = (time.perf_counter() - t0) * 1e3
    stop(p)
    os.unlink(sock)
    return ms, req


def fc_clones(d, snap):
    ps = []
    for i in range(10):
        sock = f'{d}/fc{i}.sock'
        p = fc_start(sock)
        wait_socket(sock)
        fc_load(sock, snap, True)
        ps.append((p, sock))
    time.sleep(1)
    kb = [private_dirty(p.pid) for p, _ in ps]
    for p, sock in ps:
        stop(p)
        os.unlink(sock)
    return kb


def med(xs):
    return f'median {statistics.median(xs):.1f} (min {min(xs):.1f}, max {max(xs):.1f}, n={len(xs)})'


res = {k: [] for k in ['ex_create', 'fc_create', 'ex_restore', 'ex_resume', 'ex_both', 'fc_load', 'fc_resume',
                       'fc_both', 'ex_restore_resume_true', 'fc_load_resume_true', 'ex_spawn_run',
                       'ex_spawn_api', 'fc_spawn', 'ex_dirty', 'fc_dirty', 'ex_written', 'fc_written']}
try:
    for r in range(ROUNDS):
        d = f'{WORK}/{r}'
        os.makedirs(d)
        order = ['ex', 'fc'] if r % 2 == 0 else ['fc', 'ex']
        snaps = {}
        for who in order:
            if who == 'ex':
                snaps['ex'], ms = ex_template(d)
                res['ex_create'].append(ms)
                st = os.stat(f"{snaps['ex']}/guest-ram")
                res['ex_written'].append(st.st_blocks * 512 / 2**20)
            else:
                snaps['fc'], ms = fc_template(d)
                res['fc_create'].append(ms)
                st = os.stat(f"{snaps['fc']}/mem")
                res['fc_written'].append(st.st_blocks * 512 / 2**20)
        for who in order:
            if who == 'ex':
                a, b = ex_restore(d, snaps['ex'])
                res['ex_restore'].append(a); res['ex_resume'].append(b); res['ex_both'].append(a + b)
                res['ex_spawn_run'].append(ex_spawn_run(snaps['ex']))
                ms, req = ex_spawn_api(d, snaps['ex'])
                res['ex_spawn_api'].append(ms)
                res['ex_restore_resume_true'].append(req)
                if r < 3:
                    res['ex_dirty'].extend(ex_clones(snaps['ex']))
            else:
                a, b = fc_restore(d, snaps['fc'])
                res['fc_load'].append(a); res['fc_resume'].append(b); res['fc_both'].append(a + b)
                ms, req = fc_spawn(d, snaps['fc'])
                res['fc_spawn'].append(ms)
                res['fc_load_resume_true'].append(req)
                if r < 3:
                    res['fc_dirty'].extend(fc_clones(d, snaps['fc']))
        shutil.rmtree(d)
        print(f'round {r} done', file=sys.stderr)
finally:
    shutil.rmtree(WORK, ignore_errors=True)

for k, v in res.items():
    if v:
        print(f'{k}: {med(v)}')
ratio = lambda a, b: statistics.median(res[a]) / statistics.median(res[b])
print(f"create ratio exitless/firecracker: {ratio('ex_create', 'fc_create'):.3f}")
print(f"restore+resume ratio: {ratio('ex_both', 'fc_both'):.3f}; exitless restore+resume / fc load(resume_vm=false)+resume")
print(f"restore alone / load alone: {ratio('ex_restore', 'fc_load'):.3f}; restore+resume / load(resume_vm=true): {ratio('ex_both', 'fc_load_resume_true'):.3f}; one request each (resume true): {ratio('ex_restore_resume_true', 'fc_load_resume_true'):.3f}")
print(f"spawn->next line ratio (api vs api): {ratio('ex_spawn_api', 'fc_spawn'):.3f}; run --restore vs fc: {ratio('ex_spawn_run', 'fc_spawn'):.3f}")
print(f"private dirty per clone ratio: {ratio('ex_dirty', 'fc_dirty'):.3f}")
