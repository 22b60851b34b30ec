/* The bench guest's virtio-fs driver (virtio device 26): FUSE requests on the request queue
 * (queue 1) as Linux's virtiofs sends them, each a chain of a device-readable part (in
 * header, the op's struct, a name or data) and a device-writable part (out header, the op's
 * reply or data); FORGET on the hiprio queue (queue 0), with no writable part. Cases, all at
 * CPL3:
 *   fs_check   checks the tag, reads fs_read whole and checks it holds fs_len bytes of
 *              fs_pattern, creates (or truncates) fs_write and writes the same, flushes,
 *              releases, forgets; "EXITLESS VIRTIO fs result=pass" last (else result=fail
 *              and exit status 3).
 *   virtio_fs  4 KiB reads at random 4 KiB-aligned offsets of fs_read at queue depth qd=,
 *              timed; the result line ends like virtio_blk's: qd= notifies= io_errors=.
 *   fs_hostile malformed chains (fs_bad= picks one), then a valid GETATTR; bounded waits.
 * Options: fs_tag= (kataShared), fs_read= (in.bin), fs_write= (out.bin), fs_len= (65536),
 * qd=, seed=, irq=poll, evidx=off. Names are in the shared directory's root. */
#include "virtio.h"

#define FUSE_LOOKUP 1
#define FUSE_FORGET 2
#define FUSE_GETATTR 3
#define FUSE_OPEN 14
#define FUSE_READ 15
#define FUSE_WRITE 16
#define FUSE_RELEASE 18
#define FUSE_FLUSH 25
#define FUSE_INIT 26
#define FUSE_CREATE 35
#define FUSE_ROOT_ID 1
#define FUSE_MAJOR 7
#define FUSE_MINOR 31 /* the 16-byte fuse_init_in; virtiofsd takes 7.27 and later */

#define L_O_RDONLY 0
#define L_O_WRONLY 1
#define L_O_RDWR 2
#define L_O_CREAT 0100
#define L_O_TRUNC 01000
#define L_S_IFREG 0100000

#define DESC_PER_SLOT 4 /* in+args, write data, out+reply, read data */
#define MAX_QD 32
#define BLOCK 4096
#define CHUNK 65536
#define ARG_MAX 256
#define REPLY_MAX 256
#define NAME_MAX_ 200
#define FS_BAD_REPLY 1 /* fs_answer: no well-formed out header for the request */
#define TAG_LEN 36
#define HOSTILE_WAIT_CYCLES 5000000000UL /* ~2 s at 2.4 GHz */

/* The FUSE wire structs (include/uapi/linux/fuse.h), little-endian. */
struct fuse_in_header {
    u32 len, opcode;
    u64 unique, nodeid;
    u32 uid, gid, pid;
    u16 total_extlen, padding;
};
struct fuse_out_header {
    u32 len;
    int error;
    u64 unique;
};
struct fuse_init_in {
    u32 major, minor, max_readahead, flags;
};
struct fuse_init_out {
    u32 major, minor, max_readahead, flags;
    u16 max_background, congestion_threshold;
    u32 max_write, time_gran;
    u16 max_pages, map_alignment;
    u32 flags2, unused[7];
};
struct fuse_attr {
    u64 ino, size, blocks, atime, mtime, ctime;
    u32 atimensec, mtimensec, ctimensec, mode, nlink, uid, gid, rdev, blksize, flags;
};
struct fuse_entry_out {
    u64 nodeid, generation, entry_valid, attr_valid;
    u32 entry_valid_nsec, attr_valid_nsec;
    struct fuse_attr attr;
};
struct fuse_getattr_in {
    u32 getattr_flags, dummy;
    u64 fh;
};
struct fuse_attr_out {
    u64 attr_valid;
    u32 attr_valid_nsec, dummy;
    struct fuse_attr attr;
};
struct fuse_open_in {
    u32 flags, open_flags;
};
struct fuse_create_in {
    u32 flags, mode, umask, open_flags;
};
struct fuse_open_out {
    u64 fh;
    u32 open_flags, backing_id;
};
struct fuse_io_in { /* fuse_read_in and fuse_write_in */
    u64 fh, offset;
    u32 size, io_flags;
    u64 lock_owner;
    u32 flags, padding;
};
struct fuse_write_out {
    u32 size, padding;
};
struct fuse_flush_in {
    u64 fh;
    u32 unused, padding;
    u64 lock_owner;
};
struct fuse_release_in {
    u64 fh;
    u32 flags, release_flags;
    u64 lock_owner;
};
struct fuse_forget_in {
    u64 nlookup;
};
_Static_assert(sizeof(struct fuse_in_header) == 40, "fuse_in_header");
_Static_assert(sizeof(struct fuse_out_header) == 16, "fuse_out_header");
_Static_assert(sizeof(struct fuse_init_out) == 64, "fuse_init_out");
_Static_assert(sizeof(struct fuse_entry_out) == 128, "fuse_entry_out");
_Static_assert(sizeof(struct fuse_attr_out) == 104, "fuse_attr_out");
_Static_assert(sizeof(struct fuse_io_in) == 40, "fuse_read_in");

/* A request slot: the in header with its arguments right after it (one descriptor), the out
 * header with room for the op's reply right after it (one descriptor). */
struct fs_slot {
    struct fuse_in_header in;
    u8 arg[ARG_MAX];
    struct fuse_out_header out;
    u8 reply[REPLY_MAX];
};

/* One request: `arg_len` bytes of the slot's arg, then `payload` (WRITE); the reply into the
 * slot, or only the out header and then `dest` (READ); none at all with `no_reply`. */
struct fs_req {
    u32 opcode;
    u64 nodeid;
    u32 arg_len;
    const void *payload;
    void *dest;
    u32 data_len;
    int no_reply;
};

static struct fs_slot slots[MAX_QD];
static u8 chunk[CHUNK] __attribute__((aligned(4096)));
static u8 bench_data[MAX_QD][BLOCK] __attribute__((aligned(4096)));

static struct virtio_dev fs;
static struct vring hiprio_vq, req_vq;
static const char *fs_cmdline = "";
static char tag[TAG_LEN + 1];
static u32 request_queues, io_chunk, queue_depth = 1;
static int use_irq, irq_now; /* irq_now: 0 in set-up, where the guest runs with IF=0 */
static u64 next_unique, io_errors, rng_seed = 1;
static u64 bench_node, bench_fh, bench_blocks;

/* What fs_check expects in fs_read and writes to fs_write: byte `i` of the file. */
static u8 fs_pattern(u64 i)
{
    return (u8)((i * 7 + (i >> 8) * 13 + (i >> 16) * 29 + 3) & 0xff);
}

/* ---- output ---- */

static void put_word(const char *w)
{
    while (*w && *w != ' ')
        outb(COM1_PORT, (u8)*w++);
}

static void put_err(int err)
{
    if (err == FS_BAD_REPLY) {
        puts_(" reply=none");
        return;
    }
    puts_(" error=");
    if (err < 0) {
        puts_("-");
        err = -err;
    }
    put_u64((u64)err);
}

/* Ends the case: "EXITLESS ERROR virtio_fs: <what> [<name>] [error=-N]", a fail line,
 * status 3. */
static void fs_fail(const char *what, const char *name, int err)
{
    puts_("EXITLESS ERROR virtio_fs: ");
    puts_(what);
    if (name) {
        puts_(" ");
        put_word(name);
    }
    if (err)
        put_err(err);
    puts_("\nEXITLESS VIRTIO fs result=fail\n");
    guest_exit(3);
}

/* ---- requests ---- */

static u16 desc_add(struct vring *vq, u16 d, const void *addr, u32 len, u16 flags)
{
    vq->desc[d] = (struct vring_desc){(u64)addr, len, (u16)(flags | VRING_DESC_F_NEXT), (u16)(d + 1)};
    return (u16)(d + 1);
}

/* Writes request `r` into slot `slot`'s descriptors; returns the chain's head (not posted). */
static u16 fs_build(struct vring *vq, u32 slot, const struct fs_req *r)
{
    struct fs_slot *s = &slots[slot];
    u16 head = (u16)(DESC_PER_SLOT * slot), d = head;
    u32 wlen = r->payload ? r->data_len : 0;
    s->in = (struct fuse_in_header){(u32)sizeof(s->in) + r->arg_len + wlen, r->opcode, ++next_unique, r->nodeid, 0, 0, 0, 0, 0};
    s->out = (struct fuse_out_header){0, 0, 0};
    d = desc_add(vq, d, &s->in, (u32)sizeof(s->in) + r->arg_len, 0);
    if (wlen)
        d = desc_add(vq, d, r->payload, wlen, 0);
    if (!r->no_reply)
        d = desc_add(vq, d, &s->out, (u32)sizeof(s->out) + (r->dest ? 0 : REPLY_MAX), VRING_DESC_F_WRITE);
    if (r->dest)
        d = desc_add(vq, d, r->dest, r->data_len, VRING_DESC_F_WRITE);
    vq->desc[d - 1].flags &= (u16)~VRING_DESC_F_NEXT;
    return head;
}

/* 0 when slot `slot`'s out header answers its request, else its FUSE error (<0) or
 * FS_BAD_REPLY. */
static int fs_answer(u32 slot, u32 used_len)
{
    const volatile struct fs_slot *s = &slots[slot];
    if (s->out.unique != s->in.unique || s->out.len < sizeof(s->out) || s->out.len > used_len)
        return FS_BAD_REPLY;
    return s->out.error;
}

/* One request in slot 0 of the request queue, waited for; its answer (fs_answer). */
static int fs_call(const struct fs_req *r, const char *what)
{
    struct vring_used_elem e;
    vring_post(&req_vq, fs_build(&req_vq, 0, r));
    vring_kick(&req_vq);
    if (!vring_wait_until(&req_vq, irq_now, &e, VIRTIO_WAIT_CYCLES))
        fs_fail("timeout: no reply within seconds to", what, 0);
    if (e.id != 0)
        fs_fail("a reply for a chain the driver never posted, to", what, 0);
    return fs_answer(0, e.len);
}

/* fs_call that fails the case on an error reply. */
static void fs_must(const struct fs_req *r, const char *what, const char *name)
{
    int err = fs_call(r, what);
    if (err)
        fs_fail(what, name, err);
}

/* The word `name` (up to a space) into slot 0's arg at `at`, NUL-terminated; bytes used. */
static u32 put_name(u32 at, const char *name)
{
    u32 n = 0;
    while (name[n] && name[n] != ' ' && n < NAME_MAX_) {
        slots[0].arg[at + n] = (u8)name[n];
        n++;
    }
    slots[0].arg[at + n] = 0;
    return n + 1;
}

static const char *name_arg(const char *key, const char *fallback)
{
    const char *v = find_arg(fs_cmdline, key);
    return v && *v && *v != ' ' ? v : fallback;
}

/* ---- FUSE operations (slot 0, waited for) ---- */

static u64 fs_lookup(const char *name)
{
    struct fs_req r = {.opcode = FUSE_LOOKUP, .nodeid = FUSE_ROOT_ID, .arg_len = put_name(0, name)};
    fs_must(&r, "LOOKUP", name);
    struct fuse_entry_out o;
    memcpy(&o, slots[0].reply, sizeof(o));
    return o.nodeid;
}

static u64 fs_size(u64 node)
{
    struct fuse_getattr_in in = {0, 0, 0};
    memcpy(slots[0].arg, &in, sizeof(in));
    struct fs_req r = {.opcode = FUSE_GETATTR, .nodeid = node, .arg_len = sizeof(in)};
    fs_must(&r, "GETATTR", 0);
    struct fuse_attr_out o;
    memcpy(&o, slots[0].reply, sizeof(o));
    return o.attr.size;
}

static u64 fs_open(u64 node, u32 flags)
{
    struct fuse_open_in in = {flags, 0};
    memcpy(slots[0].arg, &in, sizeof(in));
    struct fs_req r = {.opcode = FUSE_OPEN, .nodeid = node, .arg_len = sizeof(in)};
    fs_must(&r, "OPEN", 0);
    struct fuse_open_out o;
    memcpy(&o, slots[0].reply, sizeof(o));
    return o.fh;
}

/* CREATE `name` in the root (truncated if it exists), open for writing: *fh, returns node. */
static u64 fs_create(const char *name, u64 *fh)
{
    struct fuse_create_in in = {L_O_WRONLY | L_O_CREAT | L_O_TRUNC, L_S_IFREG | 0644, 0, 0};
    memcpy(slots[0].arg, &in, sizeof(in));
    struct fs_req r = {.opcode = FUSE_CREATE, .nodeid = FUSE_ROOT_ID, .arg_len = sizeof(in) + put_name(sizeof(in), name)};
    fs_must(&r, "CREATE", name);
    struct fuse_entry_out entry;
    struct fuse_open_out open;
    memcpy(&entry, slots[0].reply, sizeof(entry));
    memcpy(&open, slots[0].reply + sizeof(entry), sizeof(open));
    *fh = open.fh;
    return entry.nodeid;
}

/* READ (`buf` set: up to `len` bytes into it) or WRITE (from `src`); bytes moved. */
static u32 fs_io(u64 node, u64 fh, u64 off, void *buf, const void *src, u32 len)
{
    struct fuse_io_in in = {fh, off, len, 0, 0, buf ? L_O_RDONLY : L_O_WRONLY, 0};
    memcpy(slots[0].arg, &in, sizeof(in));
    struct fs_req r = {buf ? FUSE_READ : FUSE_WRITE, node, sizeof(in), src, buf, len, 0};
    fs_must(&r, buf ? "READ" : "WRITE", 0);
    if (buf)
        return slots[0].out.len - (u32)sizeof(struct fuse_out_header);
    struct fuse_write_out o;
    memcpy(&o, slots[0].reply, sizeof(o));
    return o.size;
}

static void fs_flush(u64 node, u64 fh)
{
    struct fuse_flush_in in = {fh, 0, 0, 0};
    memcpy(slots[0].arg, &in, sizeof(in));
    struct fs_req r = {.opcode = FUSE_FLUSH, .nodeid = node, .arg_len = sizeof(in)};
    fs_must(&r, "FLUSH", 0);
}

/* RELEASE of handle `fh`, opened with `flags`. */
static void fs_release(u64 node, u64 fh, u32 flags)
{
    struct fuse_release_in in = {fh, flags, 0, 0};
    memcpy(slots[0].arg, &in, sizeof(in));
    struct fs_req r = {.opcode = FUSE_RELEASE, .nodeid = node, .arg_len = sizeof(in)};
    fs_must(&r, "RELEASE", 0);
}

/* FORGETs (one lookup each) on the hiprio queue, no writable part: the device only returns
 * the chains. Slots 1 and up, as the request queue uses slot 0. */
static void fs_forget(const u64 *nodes, u32 n)
{
    struct vring_used_elem e;
    for (u32 i = 0; i < n; i++) {
        struct fuse_forget_in f = {1};
        memcpy(slots[1 + i].arg, &f, sizeof(f));
        struct fs_req r = {.opcode = FUSE_FORGET, .nodeid = nodes[i], .arg_len = sizeof(f), .no_reply = 1};
        vring_post(&hiprio_vq, fs_build(&hiprio_vq, 1 + i, &r));
    }
    vring_kick(&hiprio_vq);
    for (u32 i = 0; i < n; i++)
        if (!vring_wait_until(&hiprio_vq, 0, &e, VIRTIO_WAIT_CYCLES))
            fs_fail("timeout: FORGET not returned on the hiprio queue", 0, 0);
    puts_("EXITLESS VIRTIO fs forgot nodes=");
    put_u64(n);
    puts_("\n");
}

/* ---- set-up ---- */

static const char *fs_init(void)
{
    struct fuse_init_in in = {FUSE_MAJOR, FUSE_MINOR, 0, 0};
    memcpy(slots[0].arg, &in, sizeof(in));
    struct fs_req r = {.opcode = FUSE_INIT, .arg_len = sizeof(in)};
    fs_must(&r, "INIT", 0);
    struct fuse_init_out o;
    memcpy(&o, slots[0].reply, sizeof(o));
    if (o.major != FUSE_MAJOR)
        return "fuse-major-version-differs";
    io_chunk = o.max_write < CHUNK ? o.max_write : CHUNK;
    if (io_chunk < BLOCK)
        return "fuse-max-write-below-4k";
    puts_("EXITLESS VIRTIO fs device tag=");
    puts_(tag);
    puts_(" request_queues=");
    put_u64(request_queues);
    puts_(" queue_size=");
    put_u64(req_vq.size);
    puts_(" proto=7.");
    put_u64(o.minor);
    puts_(" max_write=");
    put_u64(o.max_write);
    puts_("\n");
    return 0;
}

/* Finds the device, sets up both queues, reads the config, FUSE_INIT; waits by polling. */
static const char *fs_start(const char *cmdline)
{
    fs_cmdline = cmdline;
    int slot = pci_find(PCI_VENDOR_VIRTIO, PCI_DEVICE_VIRTIO_FS);
    if (slot < 0)
        return "no-virtio-fs";
    const char *why = virtio_open(&fs, (u8)slot);
    if (!why)
        why = virtio_negotiate(&fs, arg_is(cmdline, "evidx=", "off") ? 0 : VIRTIO_RING_F_EVENT_IDX);
    if (why)
        return why;
    use_irq = !arg_is(cmdline, "irq=", "poll");
    if (use_irq)
        virtio_msix(&fs, 0, VEC_VIRTIO);
    if ((why = virtio_queue(&fs, &hiprio_vq, 0, VIRTIO_NO_VECTOR)) ||
        (why = virtio_queue(&fs, &req_vq, 1, use_irq ? 0 : VIRTIO_NO_VECTOR)))
        return why;
    if (hiprio_vq.size < 3 * DESC_PER_SLOT || req_vq.size < DESC_PER_SLOT * 5)
        return "queues-too-small";
    for (u32 i = 0; i < TAG_LEN; i++)
        tag[i] = (char)mmio_read8(fs.device_cfg + i);
    request_queues = mmio_read32(fs.device_cfg + TAG_LEN);
    virtio_driver_ok(&fs);
    irq_now = 0;
    return fs_init();
}

/* Set-up of fs_check and fs_hostile. */
const char *virtio_fs_setup(const char *cmdline)
{
    const char *why = fs_start(cmdline);
    if (why)
        return why;
    irq_now = use_irq;
    user_rflags = use_irq ? 0x202 : 0x2;
    return 0;
}

/* ---- fs_check ---- */

static void check_tag(void)
{
    const char *want = name_arg("fs_tag=", "kataShared");
    u32 i = 0;
    while (i < TAG_LEN && want[i] && want[i] != ' ' && tag[i] == want[i])
        i++;
    int same = (!want[i] || want[i] == ' ') && (i == TAG_LEN || !tag[i]);
    puts_("EXITLESS VIRTIO fs tag=");
    puts_(tag);
    puts_(same ? " matches\n" : " differs\n");
    if (!same)
        fs_fail("the tag is not fs_tag:", want, 0);
}

/* Bytes of `buf` (file offset `off`) that differ from the pattern; the first at *first. */
static u64 count_bad(const u8 *buf, u64 off, u32 n, u64 *first)
{
    u64 bad = 0;
    for (u32 i = 0; i < n; i++)
        if (buf[i] != fs_pattern(off + i) && !bad++)
            *first = off + i;
    return bad;
}

/* "EXITLESS VIRTIO fs <what> file=<name> bytes=<bytes> <key>=<value>" */
static void print_io(const char *what, const char *name, u64 bytes, const char *key, u64 value)
{
    puts_("EXITLESS VIRTIO fs ");
    puts_(what);
    puts_(" file=");
    put_word(name);
    puts_(" bytes=");
    put_u64(bytes);
    puts_(key);
    put_u64(value);
    puts_("\n");
}

/* Reads `name` whole through CHUNK-sized READs; its size must be `len` and every byte the
 * pattern. Returns its node. */
static u64 read_and_verify(const char *name, u64 len)
{
    u64 node = fs_lookup(name), size = fs_size(node), fh = fs_open(node, L_O_RDONLY);
    u64 bad = 0, first = 0, off = 0;
    while (off < size) {
        u32 want = size - off < CHUNK ? (u32)(size - off) : CHUNK;
        u32 got = fs_io(node, fh, off, chunk, 0, want);
        if (!got || got > want)
            fs_fail("READ returned a wrong length for", name, 0);
        bad += count_bad(chunk, off, got, &first);
        off += got;
    }
    fs_flush(node, fh);
    fs_release(node, fh, L_O_RDONLY);
    print_io("read", name, off, " bad=", bad);
    if (size != len)
        fs_fail("the file's size is not fs_len:", name, 0);
    if (bad) {
        puts_("EXITLESS VIRTIO fs first_bad_offset=");
        put_u64(first);
        puts_("\n");
        fs_fail("the file does not hold the pattern:", name, 0);
    }
    return node;
}

/* Creates (or truncates) `name`, writes `len` bytes of the pattern in io_chunk WRITEs,
 * flushes, checks the size, releases. Returns its node. */
static u64 write_pattern(const char *name, u64 len)
{
    u64 fh, node = fs_create(name, &fh);
    for (u64 off = 0; off < len;) {
        u32 n = len - off < io_chunk ? (u32)(len - off) : io_chunk;
        for (u32 i = 0; i < n; i++)
            chunk[i] = fs_pattern(off + i);
        if (fs_io(node, fh, off, 0, chunk, n) != n)
            fs_fail("WRITE took fewer bytes than asked for", name, 0);
        off += n;
    }
    fs_flush(node, fh);
    u64 size = fs_size(node);
    fs_release(node, fh, L_O_WRONLY);
    print_io("wrote", name, len, " size=", size);
    if (size != len)
        fs_fail("the written file's size is not fs_len:", name, 0);
    return node;
}

u64 loop_fs_check(u64 n)
{
    (void)n;
    u64 len = parse_u64(find_arg(fs_cmdline, "fs_len="));
    if (!len)
        len = 65536;
    check_tag();
    u64 nodes[2];
    nodes[0] = read_and_verify(name_arg("fs_read=", "in.bin"), len);
    nodes[1] = write_pattern(name_arg("fs_write=", "out.bin"), len);
    fs_forget(nodes, 2);
    puts_("EXITLESS VIRTIO fs result=pass\n");
    return 0;
}

/* ---- virtio_fs: 4 KiB reads at a queue depth ---- */

static u64 next_random(void)
{
    rng_seed = rng_seed * 6364136223846793005UL + 1442695040888963407UL;
    return rng_seed >> 17;
}

/* Opens fs_read for the loop; the queue depth from qd= (at most 32 and a quarter of the
 * request queue). */
const char *virtio_fs_bench_setup(const char *cmdline)
{
    const char *why = fs_start(cmdline);
    if (why)
        return why;
    bench_node = fs_lookup(name_arg("fs_read=", "in.bin"));
    bench_blocks = fs_size(bench_node) / BLOCK;
    if (!bench_blocks)
        return "file-smaller-than-4k";
    bench_fh = fs_open(bench_node, L_O_RDONLY);
    u64 qd = parse_u64(find_arg(cmdline, "qd="));
    queue_depth = qd ? (u32)qd : 1;
    if (queue_depth > MAX_QD)
        queue_depth = MAX_QD;
    if (queue_depth * DESC_PER_SLOT > req_vq.size)
        queue_depth = req_vq.size / DESC_PER_SLOT;
    u64 seed = parse_u64(find_arg(cmdline, "seed="));
    rng_seed = seed ? seed : 1;
    req_vq.notifies = 0; /* the loop's own, like io_errors */
    irq_now = use_irq;
    user_rflags = use_irq ? 0x202 : 0x2;
    return 0;
}

static void bench_post(u32 slot)
{
    struct fuse_io_in in = {bench_fh, next_random() % bench_blocks * BLOCK, BLOCK, 0, 0, L_O_RDONLY, 0};
    memcpy(slots[slot].arg, &in, sizeof(in));
    struct fs_req r = {FUSE_READ, bench_node, sizeof(in), 0, bench_data[slot], BLOCK, 0};
    vring_post(&req_vq, fs_build(&req_vq, slot, &r));
}

/* The slot a used element completes (checked); counts an error or short read. */
static u32 bench_done(const struct vring_used_elem *e)
{
    u32 slot = e->id / DESC_PER_SLOT;
    if (e->id % DESC_PER_SLOT || slot >= queue_depth)
        fs_fail("a reply for a chain the driver never posted", 0, 0);
    if (fs_answer(slot, e->len) || e->len != sizeof(struct fuse_out_header) + BLOCK)
        io_errors++;
    return slot;
}

/* n READs, at most queue_depth in flight. */
u64 loop_virtio_fs(u64 n)
{
    u32 free_slots[MAX_QD], nfree = 0;
    struct vring_used_elem e;
    for (u32 s = 0; s < queue_depth; s++)
        free_slots[nfree++] = s;
    for (u64 posted = 0, done = 0; done < n;) {
        for (; posted < n && nfree; posted++)
            bench_post(free_slots[--nfree]);
        vring_kick(&req_vq);
        if (!vring_wait_until(&req_vq, irq_now, &e, VIRTIO_WAIT_CYCLES))
            fs_fail("timeout: no READ reply within seconds", 0, 0);
        free_slots[nfree++] = bench_done(&e);
        for (done++; vring_take(&req_vq, &e); done++)
            free_slots[nfree++] = bench_done(&e);
    }
    return 0;
}

void report_virtio_fs(void)
{
    puts_(" qd=");
    put_u64(queue_depth);
    puts_(" notifies=");
    put_u64(req_vq.notifies);
    puts_(" io_errors=");
    put_u64(io_errors);
}

/* ---- fs_hostile ---- */

enum { H_LEN, H_NO_WRITABLE, H_HUGE, H_OUTSIDE, H_VALID, H_COUNT };
static const char *const hostile_names[H_COUNT] = {"len", "no_writable", "huge", "outside", "valid"};

/* A GETATTR of the root in slot `k`, broken as chain `k` says, posted. */
static void hostile_post(u32 k)
{
    struct fuse_getattr_in in = {0, 0, 0};
    memcpy(slots[k].arg, &in, sizeof(in));
    struct fs_req r = {.opcode = FUSE_GETATTR, .nodeid = FUSE_ROOT_ID, .arg_len = sizeof(in), .no_reply = k == H_NO_WRITABLE};
    u16 head = fs_build(&req_vq, k, &r);
    struct vring_desc *d = &req_vq.desc[head];
    if (k == H_LEN)
        slots[k].in.len = 0x7ffffff0;  /* the header says 2 GiB; 56 bytes follow */
    else if (k == H_HUGE)
        d[1].len = 0xfffffff0;         /* a 4 GiB reply buffer */
    else if (k == H_OUTSIDE)
        d[0].addr = 0x4000000000UL;    /* 256 GiB: no guest memory there */
    vring_post(&req_vq, head);
}

static void hostile_print(u32 k, const struct vring_used_elem *e)
{
    u32 slot = e->id / DESC_PER_SLOT;
    puts_("EXITLESS FS hostile chain=");
    puts_(hostile_names[k]);
    puts_(" answer_for=");
    puts_(e->id % DESC_PER_SLOT || slot >= H_COUNT ? "unknown" : hostile_names[slot]);
    puts_(" used_len=");
    put_u64(e->len);
    if (slot < H_COUNT)
        put_err(fs_answer(slot, e->len));
    puts_("\n");
}

/* Posts chain `k` and takes answers until its own comes or none comes within ~2 s. */
static void hostile_try(u32 k)
{
    struct vring_used_elem e;
    hostile_post(k);
    vring_kick(&req_vq);
    for (u32 tries = 0; tries < 2 * H_COUNT; tries++) {
        if (!vring_wait_until(&req_vq, irq_now, &e, HOSTILE_WAIT_CYCLES)) {
            puts_("EXITLESS FS hostile chain=");
            puts_(hostile_names[k]);
            puts_(" timeout\n");
            return;
        }
        hostile_print(k, &e);
        if (e.id == DESC_PER_SLOT * k)
            return;
    }
}

/* Every malformed chain in turn (or only fs_bad=<name>), then a valid GETATTR. */
u64 loop_fs_hostile(u64 n)
{
    (void)n;
    for (u32 k = 0; k < H_VALID; k++)
        if (!find_arg(fs_cmdline, "fs_bad=") || arg_is(fs_cmdline, "fs_bad=", hostile_names[k]))
            hostile_try(k);
    hostile_try(H_VALID);
    puts_("EXITLESS FS hostile done\n");
    /* fs_hold=1: the host reads its figures now, while nothing but the guest moves; it lets
     * the guest end with a byte on the console (or the guest ends after ~20 s). */
    if (arg_is(fs_cmdline, "fs_hold=", "1"))
        puts_(console_wait_byte(10 * HOSTILE_WAIT_CYCLES) ? "EXITLESS FS released\n"
                                                          : "EXITLESS FS hold timeout\n");
    return 0;
}

/* ---- case=snapshot fs=1: a file kept open across a snapshot ---- */

static u64 snap_node, snap_fh;

/* Byte `i` of round `t`'s 16-byte record. */
static u8 snap_byte(u64 t, u64 i) { return (u8)((t * 31 + i * 7 + 1) & 0xff); }

/* At CPL0: the device, FUSE_INIT, and fs_read= (snap.bin) opened for reading and writing
 * (polled here: the guest runs with IF=0). The handle lives until snapshot_fs_end. */
const char *snapshot_fs_setup(const char *cmdline)
{
    const char *why = fs_start(cmdline);
    if (why)
        return why;
    snap_node = fs_lookup(name_arg("fs_read=", "snap.bin"));
    snap_fh = fs_open(snap_node, L_O_RDWR);
    irq_now = use_irq;
    user_rflags = use_irq ? 0x202 : 0x2;
    return 0;
}

/* Round `t`: its record written at t*16 through the open handle, then every record so far
 * read back through it and checked. */
void snapshot_fs_round(u64 t)
{
    u8 rec[16];
    u32 len = (u32)((t + 1) * 16);
    if (len > CHUNK)
        fs_fail("too many rounds for the file's records", 0, 0);
    for (u64 i = 0; i < 16; i++)
        rec[i] = snap_byte(t, i);
    if (fs_io(snap_node, snap_fh, t * 16, 0, rec, 16) != 16)
        fs_fail("WRITE took fewer bytes than a record", 0, 0);
    if (fs_io(snap_node, snap_fh, 0, chunk, 0, len) != len)
        fs_fail("READ of the records came short", 0, 0);
    for (u64 i = 0; i < len; i++)
        if (chunk[i] != snap_byte(i / 16, i % 16))
            fs_fail("a record read back through the open file differs", 0, 0);
    puts_("EXITLESS SNAPFS n=");
    put_u64(t);
    puts_(" bytes=");
    put_u64(len);
    puts_("\n");
}

/* After `ticks` rounds: the records read once more through the open handle, which is then
 * released, and written to a new file, fs_write= (snap-new.bin). */
void snapshot_fs_end(u64 ticks)
{
    u32 len = (u32)(ticks * 16);
    if (fs_io(snap_node, snap_fh, 0, chunk, 0, len) != len)
        fs_fail("READ of the records came short", 0, 0);
    fs_flush(snap_node, snap_fh);
    fs_release(snap_node, snap_fh, L_O_RDWR);
    const char *name = name_arg("fs_write=", "snap-new.bin");
    u64 fh, node = fs_create(name, &fh);
    if (fs_io(node, fh, 0, 0, chunk, len) != len)
        fs_fail("WRITE took fewer bytes than asked for", name, 0);
    fs_flush(node, fh);
    fs_release(node, fh, L_O_WRONLY);
    u64 nodes[2] = {snap_node, node};
    fs_forget(nodes, 2);
    print_io("wrote", name, len, " size=", len);
}
