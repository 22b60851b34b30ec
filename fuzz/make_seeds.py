#!/usr/bin/env python3
"""Writes the seed corpus of each fuzz target (fuzz/corpus/NAME/seed-*): inputs that reach deep
into each parser, so the short runs of the test suite start from real traffic."""
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
LEN = {1: 0, 2: 1, 4: 2, 8: 3, 3: 5, 0: 6}


def access(write, offset, length, value=0):
    """One step of exitless_lab::fuzzing's access stream: op, offset (u16), length code, value (u64)."""
    return struct.pack("<BHBQ", 1 if write else 0, offset, LEN[length], value)


def save(target, name, data):
    os.makedirs(os.path.join(ROOT, target), exist_ok=True)
    with open(os.path.join(ROOT, target, name), "wb") as f:
        f.write(data)


def serial():
    init = [access(True, 3, 1, 0x80), access(True, 0, 1, 1), access(True, 1, 1, 0),
            access(True, 3, 1, 0x03), access(True, 1, 1, 0x0f)]
    text = [access(True, 0, 1, c) for c in b"EXITLESS\n"]
    reads = [access(False, r, 1) for r in range(8)] + [access(False, 9, 4), access(True, 7, 2, 1)]
    save("serial", "seed-init", b"\x04ab\n\x00" + b"".join(init + text))
    save("serial", "seed-reads", b"".join(reads))


def i8042():
    save("i8042", "seed-reset", b"".join([access(False, 4, 1), access(True, 4, 1, 0xfe)]))
    save("i8042", "seed-data", b"".join([access(True, 0, 1, 0xf4), access(False, 0, 1),
                                         access(True, 4, 1, 0x60), access(True, 0, 1, 0x47)]))


def acpi_registers():
    # op bit 0: write, bit 1: sleep register (else the GED), bit 7: power button pressed first.
    def step(op, length, value=0):
        return struct.pack("<BBQ", op, LEN[length], value)
    save("acpi_registers", "seed-power-off", b"".join([step(0x80, 1), step(0, 1), step(3, 1, 0x80),
                                                        step(3, 1, 0x34)]))
    save("acpi_registers", "seed-refused", b"".join([step(3, 1, 0x2c), step(3, 2, 0x34), step(2, 4),
                                                      step(1, 8, 0xff), step(0x84, 1)]))


def cf8(bus, slot, fn, reg):
    return 0x80000000 | bus << 16 | slot << 11 | fn << 8 | reg


def pci_config():
    steps = []
    for reg in range(0, 0x40, 4):  # the virtio function at slot 1, through 0xCF8/0xCFC
        steps += [access(True, 0, 4, cf8(0, 1, 0, reg)), access(False, 4, 4)]
    steps += [access(True, 0, 4, cf8(0, 1, 0, 0x10)), access(True, 4, 4, 0xffffffff),
              access(False, 4, 4), access(True, 4, 4, 0xc8000000),
              access(True, 0, 4, cf8(0, 1, 0, 0x04)), access(True, 4, 2, 0x0006)]
    half = b"".join(steps)
    ecam = [access(False, (1 << 15) | reg, 4) for reg in range(0, 0x100, 4)]
    ecam += [access(True, (1 << 15) | 0x10, 4, 0xffffffff), access(False, (1 << 15) | 0x10, 4)]
    ecam_bytes = b"".join(ecam)
    pad = max(len(half), len(ecam_bytes))
    save("pci_config", "seed-ports-ecam", half.ljust(pad, b"\0") + ecam_bytes.ljust(pad, b"\0"))


def virtio_transport():
    s = [access(True, 0x14, 1, 0), access(True, 0x14, 1, 1), access(True, 0x14, 1, 3),
         access(True, 0x00, 4, 0), access(False, 0x04, 4), access(True, 0x00, 4, 1),
         access(False, 0x04, 4), access(True, 0x08, 4, 1), access(True, 0x0c, 4, 1),
         access(True, 0x14, 1, 11), access(False, 0x14, 1),
         access(True, 0x16, 2, 0), access(False, 0x18, 2), access(True, 0x18, 2, 8),
         access(True, 0x1a, 2, 0), access(True, 0x20, 8, 0x1000), access(True, 0x28, 8, 0x2000),
         access(True, 0x30, 8, 0x3000), access(True, 0x1c, 2, 1), access(True, 0x14, 1, 15),
         access(False, 0x1e, 2), access(True, 0x1000, 2, 0), access(False, 0x800, 1),
         access(True, 0x2000, 4, 0xfee00000), access(True, 0x200c, 4, 0)]
    save("virtio_transport", "seed-driver", b"".join(s))


def virtio_status():
    """exitless_lab::fuzzing::virtio_status: a device byte (0 rng, 1 blk), then ops (op % 10 and its
    bytes): 9 init, 8 settle, 0 any status, 2 reset, 7 notify, 1 set one more bit."""
    toggle = [9, 0, 4, 8, 7, 0, 8, 0, 0x0b, 8, 1, 2, 8, 2, 8]
    for device, name in ((0, "seed-toggles-rng"), (1, "seed-toggles-blk")):
        save("virtio_status", name, bytes([device] + toggle * 4 + [9, 1, 3, 2, 9, 2, 3, 8]))
    # A queue reprogrammed while live, a reset while starting, odd sizes and addresses.
    odd = [0, 0, 1, 0, 1, 1, 0, 3, 3, 0, 4, 7, 6, 0, 0x34, 0x12, 3, 5, 1, 0, 0x0f, 2, 9, 5, 9,
           4, 3, 6, 1, 0xff, 0xff, 7, 8, 0, 0xff, 8]
    save("virtio_status", "seed-odd", bytes(odd))


def desc(addr, length, flags, nxt):
    return struct.pack("<QIHH", addr, length, flags, nxt)


NEXT, WRITE, INDIRECT = 1, 2, 4


def image(descs, heads, extra):
    """Guest memory as exitless_lab::fuzzing's queue targets read it: descriptors at 0, avail at 0x100."""
    mem = bytearray(0x4000)
    table = b"".join(descs)
    mem[0:len(table)] = table
    avail = struct.pack("<HH", 0, len(heads)) + b"".join(struct.pack("<H", h) for h in heads)
    mem[0x100:0x100 + len(avail)] = avail
    for addr, data in extra:
        mem[addr:addr + len(data)] = data
    return bytes(mem)


def blk_request():
    read = [desc(0x1000, 16, NEXT, 1), desc(0x2000, 512, WRITE | NEXT, 2), desc(0x3000, 1, WRITE, 0)]
    header_in = struct.pack("<IIQ", 0, 0, 2)
    save("blk_request", "seed-read", image(read, [0], [(0x1000, header_in)]))
    write = [desc(0x1000, 16, NEXT, 1), desc(0x2000, 4096, NEXT, 2), desc(0x3000, 1, WRITE, 0)]
    save("blk_request", "seed-write", image(write, [0], [(0x1000, struct.pack("<IIQ", 1, 0, 60))]))
    table = b"".join(read)
    save("blk_request", "seed-indirect",
         image([desc(0x3800, len(table), INDIRECT, 0)], [0], [(0x1000, header_in), (0x3800, table)]))
    loop = [desc(0x1000, 16, NEXT, 1), desc(0x2000, 512, WRITE | NEXT, 0)]
    save("blk_request", "seed-loop", image(loop, [0, 1], [(0x1000, header_in)]))


def net_chains():
    # Even chains are transmitted, odd ones are receive buffers.
    tx = [desc(0x1000, 12, NEXT, 1), desc(0x1010, 60, 0, 0)]
    rx = [desc(0x2000, 600, WRITE | NEXT, 3), desc(0x2400, 600, WRITE, 0)]
    bad = [desc(0x3000, 4, 0, 0), desc(0x3100, 100, 0, 0), desc(0x7fffffff, 70000, WRITE, 0)]
    save("net_chains", "seed-frames", image(tx + rx + bad, [0, 2, 4, 5, 6, 0], []))


def balloon_chains():
    # Chains are taken in turn as a report, an inflate and a deflate.
    report = [desc(0x10000, 0x8000, WRITE | NEXT, 1), desc(0x20000, 0x1000, 0, 0)]
    inflate = [desc(0x3000, 16, 0, 0)]
    deflate = [desc(0x3000, 8, 0, 0)]
    bad_report = [desc(0x30800, 0x1000, WRITE | NEXT, 5), desc(0xff000, 0x4000, WRITE, 0)]
    bad_inflate = [desc(0x3000, 6, WRITE, 0)]
    pfns = struct.pack("<IIII", 0x10, 0x11, 0x12, 0x400)
    save("balloon_chains", "seed-report-inflate-deflate",
         image(report + inflate + deflate + bad_report + bad_inflate, [0, 2, 3, 4, 6], [(0x3000, pfns)]))


def pmem_request():
    # A flush (type 0, then its 4-byte answer), an unknown type, a request without an answer,
    # the answer first, an answer outside memory.
    flush = [desc(0x3000, 4, NEXT, 1), desc(0x3100, 4, WRITE, 0)]
    unknown = [desc(0x3004, 4, NEXT, 3), desc(0x3104, 4, WRITE, 0)]
    no_answer = [desc(0x3000, 4, 0, 0)]
    answer_first = [desc(0x3108, 4, WRITE | NEXT, 6), desc(0x3000, 4, 0, 0)]
    outside = [desc(0x3000, 4, NEXT, 8), desc(0x7ffffff0, 4, WRITE, 0)]
    types = struct.pack("<II", 0, 7)
    save("pmem_request", "seed-flush-and-hostile",
         image(flush + unknown + no_answer + answer_first + outside, [0, 2, 4, 5, 7], [(0x3000, types)]))


def vsock_packets():
    def pkt(flags, src_port, length, op, shut=0, dst_port=None, buf_alloc=0x1000, fwd=0):
        b = struct.pack("<BH", flags, src_port)
        if dst_port is not None:
            b += struct.pack("<H", dst_port)
        return b + struct.pack("<HBBHH", length, op, shut, buf_alloc, fwd)
    to_port, drain = 0x20, 0x04
    good = [pkt(to_port | drain, 5000, 0, 1), pkt(to_port, 5000, 5, 5), pkt(to_port | drain, 5000, 0, 7),
            pkt(to_port, 5000, 0, 6), pkt(to_port | drain, 5000, 0, 4, 3), pkt(to_port, 5000, 0, 3)]
    bad = [pkt(drain, 7, 0, 1, dst_port=999), pkt(to_port | 0x08, 6000, 100, 5),
           pkt(to_port | 3, 6001, 0xffff, 5), pkt(to_port, 6002, 0, 9), pkt(0x10 | to_port, 1, 0, 1) + b"\x02\x00"]
    save("vsock_packets", "seed-session", b"".join(good))
    save("vsock_packets", "seed-hostile", b"".join(bad + good))


def coalesced_ring():
    e = lambda addr, length, value, pio: struct.pack("<QBQB", addr, length, value, pio)
    save("coalesced_ring", "seed-mixed", e(0xd0000000, 4, 0x600dcafe, 0) + e(0x7e0, 4, 1, 1)
         + e(0x7e4, 200, 7, 1) + e(0xffffffffffffffff, 8, 0, 0))


def bench_line():
    lines = ["EXITLESS START version=1",
             "EXITLESS RESULT case=pio_out cpl=3 iters=5000 cycles=123456 empty=10 ipis=0 uds=0",
             "EXITLESS RESULT case=virtio_blk cpl=3 iters=5000 cycles=1 empty=1 ipis=1 uds=0 qd=32 notifies=3 io_errors=0",
             "EXITLESS SKIP case=hlt reason=no lapic", "EXITLESS ERROR exception vector=14 cr2=0x10",
             "EXITLESS DONE", "EXITLESS RESULT case= iters=-1 cycles=99999999999999999999999"]
    save("bench_line", "seed-lines", "\n".join(lines).encode())


def kata_requests():
    """The requests of ../shared/kata-wire-sequence.json (beside the project), if present."""
    import json
    path = os.path.join(os.path.dirname(ROOT), "..", "..", "shared", "kata-wire-sequence.json")
    if not os.path.exists(path):
        return []
    return json.load(open(path))["requests"]


def http_request(method, path, body):
    body = b"" if body is None else json_bytes(body)
    head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def json_bytes(value):
    import json
    return json.dumps(value).encode()


def api_http():
    requests = kata_requests()
    stream = b"".join(http_request(r["method"], r["path"], r["body"]) for r in requests)
    save("api_http", "seed-kata-sequence", stream)
    save("api_http", "seed-odd", b"GET /api/v1/vmm.ping HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
         b"PUT /api/v1/vm.resize HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}x"
         b"PUT /api/v1/vm.add-fs HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")


def api_config():
    for r in kata_requests():
        if r["body"] is not None:
            save("api_config", "seed-" + r["path"].rsplit("/", 1)[1], json_bytes(r["body"]))
    save("api_config", "seed-refused", json_bytes({"payload": {"kernel": "/k"}, "fs": [{"tag": "x"}],
                                                     "memory": {"size": 1}, "cpus": {"boot_vcpus": 3, "max_vcpus": 2}}))


def migration_request(command, payload=b"", length=None):
    """A migration request: the 16-byte header (u16 command, 6 bytes, u64 length), then its payload."""
    return struct.pack("<H6xQ", command, len(payload) if length is None else length) + payload


def migration_receiver():
    """A whole migration as a source sends it; the state is the snapshot_state seed."""
    config = json_bytes({"config": {"payload": {"kernel": "/k"}},
                         "regions": [{"slot": 0, "gpa": 0, "size": 0x10000},
                                     {"slot": 1, "gpa": 0x20000, "size": 0x1000}]})
    table = struct.pack("<QQQQ", 0x1000, 0x2000, 0x20000, 0x1000)
    memory = migration_request(4, table) + bytes(range(256)) * 48
    with open(os.path.join(ROOT, "snapshot_state", "seed-bench-guest"), "rb") as f:
        state = f.read()
    start = migration_request(1)
    save("migration_receiver", "seed-precopy", start + migration_request(2, config) + memory
         + migration_request(3, state) + migration_request(5))
    save("migration_receiver", "seed-local", start + migration_request(7, struct.pack("<I", 0))
         + migration_request(7, struct.pack("<I", 1)) + migration_request(2, config) + migration_request(8))
    save("migration_receiver", "seed-abandon", start + migration_request(2, config) + migration_request(6))


for make in (serial, i8042, acpi_registers, pci_config, virtio_transport, virtio_status, blk_request, net_chains, balloon_chains,
             pmem_request,
             vsock_packets,
             coalesced_ring, bench_line, api_http, api_config, migration_receiver):
    make()
