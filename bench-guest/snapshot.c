/*
 * case=snapshot: a guest to snapshot and restore. It writes a pattern into touch_mib MiB
 * (default 8) from 32 MiB up (one word per 4 KiB page: every page touched), then runs `ticks`
 * rounds (default 20) of `iters` port writes each (COM1's scratch register: each one an exit to
 * the VMM), printing after each round
 *
 *   EXITLESS TICK n=<round> count=<a counter in guest memory, one more per round>
 *
 * and at the end checks every page of the pattern and the counter:
 *
 *   EXITLESS RESULT case=snapshot pages=<n> bad=<pages whose word changed> count=<c> ok=<0|1>
 *
 * A VM paused mid-run, snapshotted and restored elsewhere goes on from its next round: its
 * rounds and counter continue without a gap and its pattern is intact (ok=1). Two VMs restored
 * from one snapshot each count on their own. `hold` halts after EXITLESS DONE instead of
 * ending the VM. Runs at CPL3 (instructions at CPL0 are emulated one by one on PVM hosts).
 *
 * `virtio=N` also drives the virtio-blk and virtio-rng devices every round: N random 4 KiB
 * reads and writes on the disk (qd=, irq=poll as virtio_blk takes them; interrupts by default)
 * and one 64-byte read of the entropy device, printing
 *
 *   EXITLESS SNAPVIRTIO n=<round> rng_nonzero=<bytes of 64 not zero>
 *
 * and the disk's qd, notifies and io_errors on the result line. Restored mid-run, the devices
 * must go on from their rings (a lost completion or interrupt ends the guest with an error).
 *
 * `net=1` also drives the virtio-net and virtio-vsock devices every round: a frame out and
 * the host's echo of it back (sent again after about a second without one: a frame in flight
 * at a snapshot is lost), and a vsock connection to host port `port=` (1234) with a line out
 * and its echo back (made again when the device reset it: connections end at a restore, which
 * the device tells with a transport reset), printing
 *
 *   EXITLESS SNAPNET n=<round> net_tries=<k> vsock_tries=<k> resets=<transport resets> cid=<c>
 *
 * `fs=1` opens fs_read= (snap.bin) of the virtio-fs device's shared directory for reading and
 * writing once, at set-up, and every round writes its 16-byte record at n*16 through that
 * FUSE file handle and reads all records so far back through it, printing
 *
 *   EXITLESS SNAPFS n=<round> bytes=<records read back>
 *
 * then, after the rounds, releases it and writes what it read to a new file, fs_write=
 * (snap-new.bin). Restored mid-run in front of a fresh virtiofsd that loaded the old one's
 * state, the handle goes on (a lost handle ends the guest with an error).
 *
 * `hotplug=1` (snapshot_hotplug.c) first takes memory, a disk and a vCPU as the host adds
 * them (and with `balloon=1` inflates the balloon to its target), and checks them every
 * round; the result line adds hotplug_ok=<0|1>.
 *
 * `blkcheck=K` (with virtio=N) also writes K blocks of the disk (n*K up) with their pattern
 * in round n and reads each back into a page of its own above the pattern, and at the end
 * checks them all: the result line adds blkcheck_bad=<blocks not read back as written> (a
 * live migration must carry the pages the device wrote, which KVM's dirty log does not see).
 * The disk needs ticks*K blocks of 4 KiB.
 *
 * `dirty=1` also writes every page of the pattern again each round, mixed with the round's
 * number (what the end checks then): a live migration must carry pages written while it
 * copies (its dirty passes). `dirty=2` also checks each page before rewriting it, adding to
 * `bad` every page that does not hold the last round's value.
 *
 * `bridge=1` first does to the PCI host bridge (00:00.0) what Linux's PCI probe does to every
 * function: each BAR and the ROM BAR written all ones, read back and written back as they
 * were; then it sets the bridge's interrupt line. The result line ends with bridge=1 if the
 * interrupt line still reads so at the end (a restore put the bridge's state back).
 */
#include "guest.h"
#include "virtio.h"

#define SNAP_BASE 0x2000000UL /* 32 MiB: above the guest's image, stacks and tables */
#define SNAP_SEED 0x5eed00005eedUL
#define PAGE_SIZE 4096UL

struct snapshot_run {
    u64 pages, ticks, iters, count, bad, virtio, net, bridge, fs, hotplug, dirty, blkcheck;
    u64 blkcheck_bad;
    const char *cmdline;
};

#define BRIDGE_LINE 11

/* bridge=1: the host bridge's BARs (0x10-0x24) and ROM BAR (0x30) sized as Linux sizes them,
 * then its interrupt line set. */
static void snapshot_size_bridge(void)
{
    for (u8 reg = 0x10; reg <= 0x30; reg += 4) {
        if (reg > 0x24 && reg < 0x30)
            continue;
        u32 old = pci_read32(0, reg);
        pci_write32(0, reg, 0xffffffffu);
        (void)pci_read32(0, reg);
        pci_write32(0, reg, old);
    }
    u32 line = pci_read32(0, 0x3c);
    pci_write32(0, 0x3c, (line & ~0xffu) | BRIDGE_LINE);
}

static struct virtio_dev snap_rng;
static struct vring snap_rng_vq;
static u8 snap_rng_buf[64] __attribute__((aligned(64)));

/* At CPL0 before the rounds: the disk as virtio_blk sets it up, the entropy device polled. */
static const char *snapshot_virtio_setup(const char *cmdline)
{
    const char *why = virtio_blk_setup(cmdline);
    if (why)
        return why;
    int slot = pci_find(PCI_VENDOR_VIRTIO, PCI_DEVICE_VIRTIO_RNG);
    if (slot < 0)
        return "no-virtio-rng";
    if ((why = virtio_open(&snap_rng, (u8)slot)) || (why = virtio_negotiate(&snap_rng, 0)))
        return why;
    if ((why = virtio_queue(&snap_rng, &snap_rng_vq, 0, VIRTIO_NO_VECTOR)))
        return why;
    virtio_driver_ok(&snap_rng);
    return 0;
}

/* One 64-byte read of the entropy device: how many bytes are not zero. */
static u64 snapshot_rng_read(void)
{
    memset(snap_rng_buf, 0, sizeof(snap_rng_buf));
    snap_rng_vq.desc[0] = (struct vring_desc){(u64)snap_rng_buf, 64, VRING_DESC_F_WRITE, 0};
    vring_post(&snap_rng_vq, 0);
    vring_kick(&snap_rng_vq);
    struct vring_used_elem e;
    vring_wait(&snap_rng_vq, 0, &e, "virtio_rng: no bytes within seconds");
    u64 nonzero = 0;
    for (u64 i = 0; i < sizeof(snap_rng_buf); i++)
        nonzero += snap_rng_buf[i] != 0;
    return nonzero;
}

/* Round `t` over the network card and vsock (net=1). */
static void snapshot_net_round(u64 t)
{
    static const u8 line[] = "exitless snapshot vsock line";
    u64 net_tries = net_round_trip(t), vsock_tries = 0;
    if (!net_tries)
        virtio_fail("virtio_net: no echo of the round's frame from the host");
    int done = 0;
    while (!done && vsock_tries < 4) {
        vsock_tries++;
        done = vsock_round(1234, line, sizeof(line) - 1);
    }
    if (!done)
        virtio_fail("virtio_vsock: every connection of the round was reset");
    puts_("EXITLESS SNAPNET n=");
    put_u64(t);
    puts_(" net_tries=");
    put_u64(net_tries);
    puts_(" vsock_tries=");
    put_u64(vsock_tries);
    puts_(" resets=");
    put_u64(vsock_transport_resets());
    puts_(" cid=");
    put_u64(vsock_guest_cid());
    puts_("\n");
}

static volatile u64 tick_count;

static u64 pattern(u64 page) { return (SNAP_BASE + page * PAGE_SIZE) ^ SNAP_SEED; }

/* Where blkcheck=1 reads each round's block back: just above the pattern. */
static u8 *blkcheck_area(const struct snapshot_run *r) { return (u8 *)(SNAP_BASE + r->pages * PAGE_SIZE); }

static u64 snapshot_user(u64 arg)
{
    struct snapshot_run *r = (struct snapshot_run *)arg;
    if (r->hotplug)
        snapshot_hotplug_prepare(r->cmdline);
    for (u64 p = 0; p < r->pages; p++)
        *(volatile u64 *)(SNAP_BASE + p * PAGE_SIZE) = pattern(p);
    for (u64 t = 0; t < r->ticks; t++) {
        for (u64 i = r->iters; i; i--)
            outb(COM1_PORT + 7, (u8)i);
        if (r->virtio) {
            loop_virtio_blk(r->virtio);
            if (r->blkcheck)
                virtio_blk_check_round(t, r->blkcheck,
                                       blkcheck_area(r) + t * r->blkcheck * PAGE_SIZE);
            u64 nonzero = snapshot_rng_read();
            puts_("EXITLESS SNAPVIRTIO n=");
            put_u64(t);
            puts_(" rng_nonzero=");
            put_u64(nonzero);
            puts_("\n");
        }
        if (r->net)
            snapshot_net_round(t);
        if (r->fs)
            snapshot_fs_round(t);
        if (r->hotplug)
            snapshot_hotplug_round(t);
        if (r->dirty)
            for (u64 p = 0; p < r->pages; p++) {
                volatile u64 *w = (volatile u64 *)(SNAP_BASE + p * PAGE_SIZE);
                /* dirty=2: each page checked first (the last round's value), so a page whose
                 * write a migration lost is counted even though this round rewrites it. */
                if (r->dirty > 1 && *w != (pattern(p) ^ t))
                    r->bad++;
                *w = pattern(p) ^ (t + 1);
            }
        tick_count = tick_count + 1;
        puts_("EXITLESS TICK n=");
        put_u64(t);
        puts_(" count=");
        put_u64(tick_count);
        puts_("\n");
    }
    if (r->fs)
        snapshot_fs_end(r->ticks);
    if (r->virtio && r->blkcheck)
        r->blkcheck_bad = virtio_blk_check_end(r->ticks * r->blkcheck, blkcheck_area(r));
    u64 mix = r->dirty ? r->ticks : 0;
    for (u64 p = 0; p < r->pages; p++)
        if (*(volatile u64 *)(SNAP_BASE + p * PAGE_SIZE) != (pattern(p) ^ mix))
            r->bad++;
    r->count = tick_count;
    return 0;
}

static u8 snapshot_stack[8192] __attribute__((aligned(16)));

void snapshot_main(const char *cmdline)
{
    u64 mib = parse_u64(find_arg(cmdline, "touch_mib="));
    struct snapshot_run r = {0};
    r.pages = (mib ? mib : 8) * (1UL << 20) / PAGE_SIZE;
    r.ticks = parse_u64(find_arg(cmdline, "ticks="));
    r.iters = parse_u64(find_arg(cmdline, "iters="));
    if (!r.ticks)
        r.ticks = 20;
    if (!r.iters)
        r.iters = 1000;
    r.virtio = parse_u64(find_arg(cmdline, "virtio="));
    if (r.virtio) {
        const char *why = snapshot_virtio_setup(cmdline);
        if (why)
            virtio_fail(why);
    }
    r.dirty = parse_u64(find_arg(cmdline, "dirty="));
    r.blkcheck = parse_u64(find_arg(cmdline, "blkcheck="));
    r.bridge = parse_u64(find_arg(cmdline, "bridge="));
    if (r.bridge)
        snapshot_size_bridge();
    r.hotplug = parse_u64(find_arg(cmdline, "hotplug="));
    r.cmdline = cmdline;
    r.net = parse_u64(find_arg(cmdline, "net="));
    if (r.net) {
        const char *why = virtio_net_setup(cmdline);
        if (why || (why = virtio_vsock_setup(cmdline)))
            virtio_fail(why);
    }
    r.fs = parse_u64(find_arg(cmdline, "fs="));
    if (r.fs) {
        const char *why = snapshot_fs_setup(cmdline);
        if (why)
            virtio_fail(why);
    }
    run_user(snapshot_user, (u64)&r, snapshot_stack + sizeof(snapshot_stack));
    puts_("EXITLESS RESULT case=snapshot pages=");
    put_u64(r.pages);
    puts_(" bad=");
    put_u64(r.bad);
    puts_(" count=");
    put_u64(r.count);
    puts_(" ok=");
    put_u64(r.bad == 0 && r.count == r.ticks);
    if (r.bridge) {
        puts_(" bridge=");
        put_u64(pci_read8(0, 0x3c) == BRIDGE_LINE);
    }
    if (r.virtio)
        report_virtio_blk();
    if (r.virtio && r.blkcheck) {
        puts_(" blkcheck_bad=");
        put_u64(r.blkcheck_bad);
    }
    if (r.hotplug) {
        puts_(" hotplug_ok=");
        put_u64(snapshot_hotplug_ok());
    }
    int hold = find_arg(cmdline, "hold") != 0; /* before DONE: see bench_main */
    puts_("\nEXITLESS DONE\n");
    if (hold)
        for (;;)
            __asm__ volatile("cli; hlt");
    guest_exit(0);
}
