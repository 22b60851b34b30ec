/* Hostile virtio drivers of the bench guest (issue 24), at CPL3 like the other drivers:
 *
 *   hostile_vsock  the vsock receive ring is made inconsistent (ring=idx: its available index
 *                  claims more entries than the queue holds; ring=zero: its descriptor table
 *                  and available ring at guest address 0, with such an index) before the host
 *                  sends; the device must put itself in NEEDS_RESET, and the disk and the
 *                  rng must still work.
 *   hostile_toggle `iters` DRIVER_OK toggles on each of blk, rng, net and vsock: clearing
 *                  DRIVER_OK without a reset (must be refused), a reset, the same rings set up
 *                  again. Every 100 toggles a disk write completes and the guest then changes
 *                  its buffer: a restarted device must not serve a completed request again.
 *                  The guest waits for a byte on COM1 before the toggles, so the host can take
 *                  its figures (fds, memory) with every device running. */
#include "virtio.h"

#define S_DRIVER_OK 4

#define HQ_SIZE 16        /* entries of every queue driven here */
#define RX_BUFS 4         /* receive buffers posted on net's and vsock's receive queues */
#define RX_BUF 4096
#define BLOCK 4096
#define WRITE_EVERY 100   /* toggles between two disk writes */
#define NR_PAGES 7        /* one ring page per queue: blk 1, rng 1, net 2, vsock 3 */

struct hdev {
    const char *name;
    u16 pci_device;
    u16 queues;
    u16 first_page;
    int present;
    struct virtio_dev d;
    struct vring vq[3];
};

struct blk_header {
    u32 type, reserved;
    u64 sector;
};

/* A queue's descriptor table at +0, available ring at +1024, used ring at +2048. */
static u8 ring_pages[NR_PAGES][4096] __attribute__((aligned(4096)));
static u8 rx_bufs[2][RX_BUFS][RX_BUF] __attribute__((aligned(4096)));
static u8 rng_buf[64];
static struct blk_header blk_hdr;
static u8 blk_data[BLOCK] __attribute__((aligned(4096)));
static volatile u8 blk_status;

static struct hdev devs[] = {
    {"blk", PCI_DEVICE_VIRTIO_BLK, 1, 0, 0, {0}, {{0}}},
    {"rng", PCI_DEVICE_VIRTIO_RNG, 1, 1, 0, {0}, {{0}}},
    {"net", PCI_DEVICE_VIRTIO_NET, 2, 2, 0, {0}, {{0}}},
    {"vsock", PCI_DEVICE_VIRTIO_VSOCK, 3, 4, 0, {0}, {{0}}},
};
#define BLK (&devs[0])
#define RNG (&devs[1])
#define NET (&devs[2])
#define VSOCK (&devs[3])
#define NR_DEVS (sizeof(devs) / sizeof(devs[0]))

static u64 blk_seed = 1;
static int vsock_ring_zero;

/* What the disk's block `block` holds at byte `i` (as exitless/tests/hostile.rs computes). */
static u8 pattern(u64 seed, u64 block, u64 i)
{
    return (u8)((seed * 131 + block * 31 + i * 7 + (i >> 9)) & 0xff);
}

/* Prints "EXITLESS ERROR hostile: <who> <what>" and ends the guest with status 3. */
static void fail(const char *who, const char *what)
{
    puts_("EXITLESS ERROR hostile: ");
    puts_(who);
    puts_(" ");
    puts_(what);
    puts_("\n");
    guest_exit(3);
}

static void pause_cycles(u64 cycles)
{
    for (u64 t = rdtsc(); rdtsc() - t < cycles;)
        __asm__ volatile("pause");
}

/* Programs queue `q` of `h` on its ring page, keeping the driver's ring state: a restart goes
 * on where the rings are. With `at_zero`, the descriptor table and the available ring are at
 * guest address 0 (the used ring stays: at 0 too, its index would be the available one's). */
static const char *program_queue(struct hdev *h, u16 q, int at_zero)
{
    u64 c = h->d.common;
    struct vring *vq = &h->vq[q];
    u8 *page = ring_pages[h->first_page + q];
    mmio_write16(c + CC_Q_SELECT, q);
    if (mmio_read16(c + CC_Q_SIZE) < HQ_SIZE)
        return "queue-too-small";
    vq->size = HQ_SIZE;
    vq->index = q;
    vq->desc = (struct vring_desc *)page;
    vq->avail = (volatile u16 *)(page + 1024);
    vq->used = (volatile u16 *)(page + 2048);
    u64 desc = at_zero ? 0 : (u64)vq->desc, avail = at_zero ? 0 : (u64)vq->avail;
    u64 used = (u64)vq->used;
    mmio_write16(c + CC_Q_SIZE, HQ_SIZE);
    mmio_write64(c + CC_Q_DESC, desc);
    mmio_write64(c + CC_Q_DRIVER, avail);
    mmio_write64(c + CC_Q_DEVICE, used);
    mmio_write16(c + CC_Q_MSIX, VIRTIO_NO_VECTOR);
    vq->notify_addr = h->d.notify + (u64)mmio_read16(c + CC_Q_NOFF) * h->d.notify_mult;
    mmio_write16(c + CC_Q_ENABLE, 1);
    return 0;
}

/* Reset, negotiation (VERSION_1 only, polled), every queue, DRIVER_OK; 0 or why not. */
static const char *start(struct hdev *h)
{
    const char *why = virtio_negotiate(&h->d, 0);
    for (u16 q = 0; !why && q < h->queues; q++)
        why = program_queue(h, q, 0);
    if (!why)
        virtio_driver_ok(&h->d);
    return why;
}

/* Receive buffers on queue 0 of net (slot 0) or vsock (slot 1). */
static void post_rx(struct hdev *h, int slot)
{
    struct vring *vq = &h->vq[0];
    for (u16 i = 0; i < RX_BUFS; i++) {
        vq->desc[i] = (struct vring_desc){(u64)rx_bufs[slot][i], RX_BUF, VRING_DESC_F_WRITE, 0};
        vring_post(vq, i);
    }
    vring_kick(vq);
}

/* Finds each device, starts it once and gives it its buffers. */
static void open_all(void)
{
    for (u64 i = 0; i < NR_DEVS; i++) {
        struct hdev *h = &devs[i];
        int slot = pci_find(PCI_VENDOR_VIRTIO, h->pci_device);
        if (slot < 0)
            continue;
        memset(ring_pages[h->first_page], 0, 4096UL * h->queues);
        const char *why = virtio_open(&h->d, (u8)slot);
        if (!why)
            why = start(h);
        if (why)
            fail(h->name, why);
        h->present = 1;
    }
    if (NET->present)
        post_rx(NET, 0);
    if (VSOCK->present)
        post_rx(VSOCK, 1);
}

/* Clears DRIVER_OK without a reset (refused: it must still read set), then resets the device
 * and sets it up again on the same rings. */
static void toggle(struct hdev *h)
{
    u64 status = h->d.common + CC_STATUS;
    mmio_write8(status, (u8)(mmio_read8(status) & ~S_DRIVER_OK));
    if (!(mmio_read8(status) & S_DRIVER_OK))
        fail(h->name, "DRIVER_OK was cleared without a reset");
    const char *why = start(h);
    if (why)
        fail(h->name, why);
}

/* Writes block `block` with the pattern, waits for its completion, then changes the buffer
 * (the descriptors and the header stay): nothing of it may reach the disk any more. */
static void blk_write(u64 block)
{
    struct vring *vq = &BLK->vq[0];
    for (u64 i = 0; i < BLOCK; i++)
        blk_data[i] = pattern(blk_seed, block, i);
    blk_hdr = (struct blk_header){1, 0, block * (BLOCK / 512)}; /* VIRTIO_BLK_T_OUT */
    blk_status = 0xff;
    vq->desc[0] = (struct vring_desc){(u64)&blk_hdr, sizeof(blk_hdr), VRING_DESC_F_NEXT, 1};
    vq->desc[1] = (struct vring_desc){(u64)blk_data, BLOCK, VRING_DESC_F_NEXT, 2};
    vq->desc[2] = (struct vring_desc){(u64)&blk_status, 1, VRING_DESC_F_WRITE, 0};
    vring_post(vq, 0);
    vring_kick(vq);
    struct vring_used_elem e;
    vring_wait(vq, 0, &e, "hostile: no disk write completion within seconds");
    if (e.id != 0 || blk_status != 0)
        fail("blk", "a write failed");
    memset(blk_data, 0xee, BLOCK);
}

/* 64 random bytes from the rng (after its restarts); fails if none come. */
static void rng_read(void)
{
    struct vring *vq = &RNG->vq[0];
    vq->desc[0] = (struct vring_desc){(u64)rng_buf, sizeof(rng_buf), VRING_DESC_F_WRITE, 0};
    vring_post(vq, 0);
    vring_kick(vq);
    struct vring_used_elem e;
    vring_wait(vq, 0, &e, "hostile: no random bytes within seconds");
    if (e.id != 0 || e.len != sizeof(rng_buf))
        fail("rng", "answered a chain it was not given");
}

/* Waits (seconds at most) for a byte on COM1: the host's go-ahead. */
static int wait_for_host(void)
{
    for (u64 t = rdtsc(); rdtsc() - t < VIRTIO_WAIT_CYCLES; pause_cycles(1000000))
        if (inb(COM1_PORT + 5) & 1) {
            (void)inb(COM1_PORT);
            return 1;
        }
    return 0;
}

static const char *toggle_cmdline = "";

const char *hostile_toggle_setup(const char *cmdline)
{
    toggle_cmdline = cmdline;
    u64 seed = parse_u64(find_arg(cmdline, "seed="));
    blk_seed = seed ? seed : 1;
    return 0;
}

u64 loop_hostile_toggle(u64 n)
{
    open_all();
    puts_("EXITLESS HOSTILE devices");
    for (u64 i = 0; i < NR_DEVS; i++) {
        puts_(" ");
        puts_(devs[i].name);
        puts_(devs[i].present ? "=1" : "=0");
    }
    puts_("\nEXITLESS HOSTILE toggles begin\n");
    if (find_arg(toggle_cmdline, "sync") && !wait_for_host())
        fail("toggle", "no go-ahead from the host on COM1");
    u64 writes = 0, reads = 0;
    for (u64 t = 0; t < n; t++) {
        if (t % WRITE_EVERY == 0) {
            if (BLK->present)
                blk_write(writes++);
            if (RNG->present) {
                rng_read();
                reads++;
            }
        }
        for (u64 i = 0; i < NR_DEVS; i++)
            if (devs[i].present)
                toggle(&devs[i]);
    }
    if (RNG->present) {
        rng_read();
        reads++;
    }
    puts_("EXITLESS HOSTILE toggles done n=");
    put_u64(n);
    puts_(" writes=");
    put_u64(writes);
    puts_(" rng_reads=");
    put_u64(reads);
    puts_(" seed=");
    put_u64(blk_seed);
    puts_("\n");
    return 0;
}

/* ---- hostile_vsock ---- */

/* Writes a u16 at guest address `addr` (0 too, which C may not dereference). */
static void poke16(u64 addr, u16 v)
{
    __asm__ volatile("movw %0, (%1)" ::"r"(v), "r"(addr) : "memory");
}

const char *hostile_vsock_setup(const char *cmdline)
{
    vsock_ring_zero = arg_is(cmdline, "ring=", "zero");
    int slot = pci_find(PCI_VENDOR_VIRTIO, PCI_DEVICE_VIRTIO_VSOCK);
    if (slot < 0)
        return "no-virtio-vsock";
    struct hdev *h = VSOCK;
    memset(ring_pages[h->first_page], 0, 4096UL * h->queues);
    const char *why = virtio_open(&h->d, (u8)slot);
    if (!why)
        why = virtio_negotiate(&h->d, 0);
    for (u16 q = 0; !why && q < h->queues; q++)
        why = program_queue(h, q, q == 0 && vsock_ring_zero);
    if (why)
        return why;
    /* The receive ring announces more buffers than it can hold, none of them real. */
    u16 bogus = HQ_SIZE + 50;
    if (vsock_ring_zero)
        poke16(2, bogus);
    else
        h->vq[0].avail[1] = bogus;
    virtio_driver_ok(&h->d);
    mmio_write16(h->vq[0].notify_addr, 0);
    h->present = 1;
    return 0;
}

/* Tells the host to send, waits for the device to give up on the ring (NEEDS_RESET), then
 * checks that the disk and the rng still work (virtio_cases.c's check, 4 blocks). */
u64 loop_hostile_vsock(u64 n)
{
    (void)n;
    u64 status = VSOCK->d.common + CC_STATUS;
    puts_(vsock_ring_zero ? "EXITLESS HOSTILE vsock ring=zero set\n"
                          : "EXITLESS HOSTILE vsock ring=idx set\n");
    u8 s = 0;
    for (u64 t = rdtsc(); !((s = mmio_read8(status)) & S_NEEDS_RESET); pause_cycles(2000000))
        if (rdtsc() - t > VIRTIO_WAIT_CYCLES)
            fail("vsock", "the device never asked for a reset");
    puts_("EXITLESS HOSTILE vsock needs_reset status=");
    put_hex(s);
    puts_("\n");
    const char *why = virtio_blk_setup("irq=poll seed=3");
    if (why)
        fail("blk", why);
    loop_virtio_check(4);
    puts_("EXITLESS HOSTILE others checked\n");
    return 0;
}
