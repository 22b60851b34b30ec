/* The virtio cases of the bench guest: virtio_blk (4 KiB random reads and writes at a queue
 * depth, measured), virtio_check (a pattern written, flushed, read back and compared;
 * random bytes from virtio-rng) and virtio_blk_hostile (a driver breaking seg_max on every
 * queue slot). All run at CPL3. Options: flush=off (FLUSH not accepted: the device must write
 * through), evidx=off, irq=poll, qd=N, seed=N, hold. */
#include "virtio.h"

#define VIRTIO_BLK_F_RO (1UL << 5)
#define VIRTIO_BLK_F_FLUSH (1UL << 9)
#define VIRTIO_RING_F_INDIRECT_DESC (1UL << 28)
#define VRING_DESC_F_INDIRECT 4
#define VIRTIO_BLK_T_IN 0
#define VIRTIO_BLK_T_OUT 1
#define VIRTIO_BLK_T_FLUSH 4
#define VIRTIO_BLK_T_GET_ID 8
#define BLOCK 4096
#define SECTORS_PER_BLOCK (BLOCK / 512)
#define MAX_QD 32
#define WAIT_CYCLES 20000000000UL /* several seconds at any TSC rate */

struct blk_header {
    u32 type, reserved;
    u64 sector;
};

static struct blk_header headers[MAX_QD];
static u8 buffers[MAX_QD][BLOCK] __attribute__((aligned(4096)));
static volatile u8 statuses[MAX_QD];

static struct virtio_dev blk;
static struct vring blk_vq;
static u64 blk_blocks, rng_seed = 1;
static int use_irq;
static u32 queue_depth = 1;
static u64 io_errors;
static const char *blk_cmdline = "";

static u64 next_random(void)
{
    rng_seed = rng_seed * 6364136223846793005UL + 1442695040888963407UL;
    return rng_seed >> 17;
}

/* Request slot s uses descriptors 3s (header), 3s+1 (data at buf), 3s+2 (status). */
static void blk_post_at(u32 s, u32 type, u64 sector, u32 len, u8 *buf)
{
    struct vring_desc *d = &blk_vq.desc[3 * s];
    headers[s] = (struct blk_header){type, 0, sector};
    statuses[s] = 0xff;
    d[0] = (struct vring_desc){(u64)&headers[s], sizeof(headers[s]), VRING_DESC_F_NEXT, (u16)(3 * s + 1)};
    u16 dir = type == VIRTIO_BLK_T_OUT ? 0 : VRING_DESC_F_WRITE;
    d[1] = (struct vring_desc){(u64)buf, len, (u16)(dir | VRING_DESC_F_NEXT), (u16)(3 * s + 2)};
    d[2] = (struct vring_desc){(u64)&statuses[s], 1, VRING_DESC_F_WRITE, 0};
    if (!len) /* a flush: header and status only */
        d[0].next = (u16)(3 * s + 2);
    vring_post(&blk_vq, (u16)(3 * s));
}

static void blk_post(u32 s, u32 type, u64 sector, u32 len)
{
    blk_post_at(s, type, sector, len, buffers[s]);
}

static void fail(const char *what)
{
    puts_("EXITLESS ERROR ");
    puts_(what);
    puts_("\n");
    guest_exit(3);
}

/* Takes the next completion, if any, into *slot (checked: a chain the driver posted). */
static int blk_reap(u32 *slot)
{
    struct vring_used_elem e;
    if (!vring_take(&blk_vq, &e))
        return 0;
    u32 s = e.id / 3;
    if (s >= MAX_QD || e.id % 3)
        fail("virtio_blk: the device returned a chain the driver never posted");
    if (statuses[s] != 0)
        io_errors++;
    *slot = s;
    return 1;
}

/* Waits for the next completion (interrupt-driven or polled, as set up). */
static u32 blk_wait(void)
{
    u32 s;
    u64 start = rdtsc();
    while (!blk_reap(&s)) {
        if (use_irq) {
            u64 seen = ipi_count;
            if (!vring_arm(&blk_vq))
                while (*(volatile u64 *)&ipi_count == seen && rdtsc() - start < WAIT_CYCLES)
                    __asm__ volatile("pause");
        } else {
            __asm__ volatile("pause");
        }
        if (rdtsc() - start > WAIT_CYCLES)
            fail("virtio_blk: no completion within seconds");
    }
    return s;
}

/* n requests, at most queue_depth in flight, a 50/50 mix of 4 KiB reads and writes at
 * random 4 KiB-aligned places. */
u64 loop_virtio_blk(u64 n)
{
    u32 free_slots[MAX_QD], nfree = 0, s;
    for (s = 0; s < queue_depth; s++)
        free_slots[nfree++] = s;
    for (u64 posted = 0, done = 0; done < n;) {
        while (posted < n && nfree) {
            u64 r = next_random();
            u32 type = (r & 1) ? VIRTIO_BLK_T_OUT : VIRTIO_BLK_T_IN;
            blk_post(free_slots[--nfree], type, (r >> 1) % blk_blocks * SECTORS_PER_BLOCK, BLOCK);
            posted++;
        }
        vring_kick(&blk_vq);
        free_slots[nfree++] = blk_wait();
        for (done++; blk_reap(&s); done++)
            free_slots[nfree++] = s;
    }
    return 0;
}

void virtio_blk_release(void)
{
    mmio_write8(blk.common + 0x14, 0); /* device_status: reset */
}

const char *virtio_blk_setup(const char *cmdline)
{
    int slot = pci_find(PCI_VENDOR_VIRTIO, PCI_DEVICE_VIRTIO_BLK);
    if (slot < 0)
        return "no-virtio-blk";
    return virtio_blk_setup_at(cmdline, (u8)slot);
}

const char *virtio_blk_setup_at(const char *cmdline, u8 slot)
{
    blk_cmdline = cmdline;
    const char *why = virtio_open(&blk, slot);
    if (why)
        return why;
    u64 wanted = VIRTIO_BLK_F_RO | VIRTIO_RING_F_INDIRECT_DESC;
    if (!arg_is(cmdline, "flush=", "off"))
        wanted |= VIRTIO_BLK_F_FLUSH;
    if (!arg_is(cmdline, "evidx=", "off"))
        wanted |= VIRTIO_RING_F_EVENT_IDX;
    if ((why = virtio_negotiate(&blk, wanted)))
        return why;
    use_irq = !arg_is(cmdline, "irq=", "poll");
    if (use_irq)
        virtio_msix(&blk, 0, VEC_VIRTIO);
    if ((why = virtio_queue(&blk, &blk_vq, 0, use_irq ? 0 : VIRTIO_NO_VECTOR)))
        return why;
    virtio_driver_ok(&blk);
    u64 sectors = (u64)mmio_read32(blk.device_cfg) | (u64)mmio_read32(blk.device_cfg + 4) << 32;
    blk_blocks = sectors / SECTORS_PER_BLOCK;
    if (!blk_blocks)
        return "disk-smaller-than-4k";
    u64 qd = parse_u64(find_arg(cmdline, "qd="));
    queue_depth = qd ? (u32)qd : 1;
    if (queue_depth > MAX_QD)
        queue_depth = MAX_QD;
    if (queue_depth * 3 > blk_vq.size)
        queue_depth = blk_vq.size / 3;
    u64 seed = parse_u64(find_arg(cmdline, "seed="));
    rng_seed = seed ? seed : 1;
    user_rflags = use_irq ? 0x202 : 0x2;
    return 0;
}

void report_virtio_blk(void)
{
    puts_(" qd=");
    put_u64(queue_depth);
    puts_(" notifies=");
    put_u64(blk_vq.notifies);
    puts_(" io_errors=");
    put_u64(io_errors);
}

/* ---- virtio_check ---- */

static u8 pattern(u64 seed, u64 block, u64 i)
{
    return (u8)((seed * 131 + block * 31 + i * 7 + (i >> 9)) & 0xff);
}

/* Round `round` of case=snapshot's blkcheck=K (no request in flight): blocks round*K up to
 * K more, each written with its pattern and read back into its own 4 KiB from `into`, kept
 * for the end's check (a live migration must carry what the device wrote there). */
void virtio_blk_check_round(u64 round, u64 k, u8 *into)
{
    for (u64 j = 0; j < k; j++) {
        u64 block = round * k + j;
        if (block >= blk_blocks)
            fail("virtio_blk: the disk is too small for blkcheck=");
        for (u64 i = 0; i < BLOCK; i++)
            buffers[0][i] = pattern(block + 1, block, i);
        blk_post(0, VIRTIO_BLK_T_OUT, block * SECTORS_PER_BLOCK, BLOCK);
        vring_kick(&blk_vq);
        blk_wait();
        blk_post_at(0, VIRTIO_BLK_T_IN, block * SECTORS_PER_BLOCK, BLOCK, into + j * BLOCK);
        vring_kick(&blk_vq);
        blk_wait();
    }
}

/* The blocks (`blocks` of them) read back at `from` that are not their pattern. */
u64 virtio_blk_check_end(u64 blocks, const u8 *from)
{
    u64 bad = 0;
    for (u64 b = 0; b < blocks; b++)
        for (u64 i = 0; i < BLOCK; i++)
            if (((volatile const u8 *)from)[b * BLOCK + i] != pattern(b + 1, b, i)) {
                bad++;
                break;
            }
    return bad;
}

/* One request, waited for; returns its status. */
static u8 blk_one(u32 type, u64 sector, u32 len)
{
    blk_post(0, type, sector, len);
    vring_kick(&blk_vq);
    u32 s = blk_wait();
    return statuses[s];
}

static void check_rng(void)
{
    static struct virtio_dev rng;
    static struct vring vq;
    int slot = pci_find(PCI_VENDOR_VIRTIO, PCI_DEVICE_VIRTIO_RNG);
    if (slot < 0) {
        puts_("EXITLESS VIRTIO rng absent\n");
        return;
    }
    const char *why = virtio_open(&rng, (u8)slot);
    if (!why)
        why = virtio_negotiate(&rng, 0);
    if (!why)
        why = virtio_queue(&rng, &vq, 0, VIRTIO_NO_VECTOR);
    if (why)
        fail(why);
    virtio_driver_ok(&rng);
    u8 *buf = buffers[1];
    memset(buf, 0, 64);
    vq.desc[0] = (struct vring_desc){(u64)buf, 64, VRING_DESC_F_WRITE, 0};
    vring_post(&vq, 0);
    vring_kick(&vq);
    struct vring_used_elem e;
    for (u64 start = rdtsc(); !vring_take(&vq, &e);)
        if (rdtsc() - start > WAIT_CYCLES)
            fail("virtio_rng: no bytes within seconds");
    u32 nonzero = 0;
    for (int i = 0; i < 64; i++)
        nonzero += buf[i] != 0;
    puts_("EXITLESS VIRTIO rng bytes=");
    put_u64(e.len);
    puts_(" nonzero=");
    put_u64(nonzero);
    puts_("\n");
}

u64 virtio_blk_pattern_verify(u64 blocks)
{
    if (blocks > blk_blocks)
        blocks = blk_blocks;
    u64 bad = 0;
    for (u64 b = 0; b < blocks; b++) {
        memset(buffers[0], 0, BLOCK);
        if (blk_one(VIRTIO_BLK_T_IN, b * SECTORS_PER_BLOCK, BLOCK))
            fail("virtio_blk: a read failed");
        for (u64 i = 0; i < BLOCK; i++)
            bad += buffers[0][i] != pattern(rng_seed, b, i);
    }
    return bad;
}

/* `blocks` 4 KiB blocks from sector 0 written with the seed's pattern, flushed (reported),
 * then read back and compared (reported). With `hold`, the guest stops after the flush line
 * (a test kills the VMM there). */
void virtio_blk_pattern_check(u64 blocks)
{
    if (blocks > blk_blocks)
        blocks = blk_blocks;
    queue_depth = 1;
    for (u64 b = 0; b < blocks; b++) {
        for (u64 i = 0; i < BLOCK; i++)
            buffers[0][i] = pattern(rng_seed, b, i);
        if (blk_one(VIRTIO_BLK_T_OUT, b * SECTORS_PER_BLOCK, BLOCK))
            fail("virtio_blk: a write failed");
    }
    if ((blk.features & VIRTIO_BLK_F_FLUSH) && blk_one(VIRTIO_BLK_T_FLUSH, 0, 0))
        fail("virtio_blk: the flush failed");
    puts_("EXITLESS VIRTIO blk flushed blocks=");
    put_u64(blocks);
    puts_(" seed=");
    put_u64(rng_seed);
    puts_("\n");
    if (find_arg(blk_cmdline, "hold"))
        for (;;)
            __asm__ volatile("pause");
    u64 bad = virtio_blk_pattern_verify(blocks);
    puts_(bad ? "EXITLESS ERROR virtio_blk: read back differs bytes=" : "EXITLESS VIRTIO blk verified bytes=");
    put_u64(bad ? bad : blocks * BLOCK);
    puts_("\n");
}

/* The pattern check; a read-only disk must refuse the write instead. Then the disk's id and
 * random bytes from virtio-rng. */
u64 loop_virtio_check(u64 blocks)
{
    if (blk.features & VIRTIO_BLK_F_RO) {
        u8 st = blk_one(VIRTIO_BLK_T_OUT, 0, BLOCK);
        puts_("EXITLESS VIRTIO blk readonly write_status=");
        put_u64(st);
        puts_("\n");
        check_rng();
        return 0;
    }
    virtio_blk_pattern_check(blocks);
    blk_post(0, VIRTIO_BLK_T_GET_ID, 0, 20);
    vring_kick(&blk_vq);
    blk_wait();
    buffers[0][20] = 0;
    puts_("EXITLESS VIRTIO blk id=");
    puts_((const char *)buffers[0]);
    puts_("\n");
    check_rng();
    return 0;
}

/* ---- virtio_blk_hostile ---- */

/* One indirect table shared by every request: the header, HOSTILE_SEGS 8-byte buffers (all
 * the same bytes) and the status byte. 65,024 segments break the device's seg_max (254). */
#define HOSTILE_SEGS 65024
static struct vring_desc hostile_table[HOSTILE_SEGS + 2] __attribute__((aligned(16)));

static void hostile_fill(u32 segs)
{
    headers[0] = (struct blk_header){VIRTIO_BLK_T_IN, 0, 0};
    hostile_table[0] = (struct vring_desc){(u64)&headers[0], sizeof(headers[0]), VRING_DESC_F_NEXT, 1};
    for (u32 i = 0; i < segs; i++)
        hostile_table[1 + i] = (struct vring_desc){(u64)buffers[1], 8, VRING_DESC_F_WRITE | VRING_DESC_F_NEXT, (u16)(i + 2)};
    hostile_table[segs + 1] = (struct vring_desc){(u64)&statuses[0], 1, VRING_DESC_F_WRITE, 0};
}

/* Posts descriptor `d` as a request through the table's first `segs` + 2 entries. */
static void hostile_post(u16 d, u32 segs)
{
    blk_vq.desc[d] = (struct vring_desc){(u64)hostile_table, 16 * (segs + 2), VRING_DESC_F_INDIRECT, 0};
    vring_post(&blk_vq, d);
}

/* Waits for `n` completions, however long the device takes to walk the tables (a full
 * queue of them is millions of descriptors: tens of seconds for a debug build on a busy
 * host), so a slow host is not a failure. What ends the wait is an event: a completion, or
 * the device asking for a reset (a vhost-user back end that gave up on the ring); a device
 * that does neither is ended by the VMM's own --timeout. Returns how many came back with
 * data (a served read). */
static u32 hostile_wait(u32 n)
{
    u32 served = 0;
    struct vring_used_elem e;
    for (u32 i = 0; i < n; i++) {
        while (!vring_wait_until(&blk_vq, use_irq, &e, VIRTIO_WAIT_CYCLES))
            if (mmio_read8(blk.common + CC_STATUS) & S_NEEDS_RESET)
                fail("virtio_blk_hostile: the device needs a reset");
        served += e.len > 1;
    }
    return served;
}

/* `rounds` times: every queue slot holds a read through the over-long table, one notify.
 * Then a read of 1,536 buffers beside a normal read, one notify: both must complete. The
 * guest says "ready" and waits about a second first (the host reads its baseline memory). */
u64 loop_virtio_blk_hostile(u64 rounds)
{
    if (!(blk.features & VIRTIO_RING_F_INDIRECT_DESC))
        fail("virtio_blk_hostile: the device refused indirect descriptors");
    hostile_fill(HOSTILE_SEGS);
    puts_("EXITLESS BLK hostile ready slots=");
    put_u64(blk_vq.size);
    puts_("\n");
    for (u64 t = rdtsc(); rdtsc() - t < 3000000000UL;)
        __asm__ volatile("pause");
    u32 served = 0;
    for (u64 r = 0; r < rounds; r++) {
        for (u16 d = 0; d < blk_vq.size; d++)
            hostile_post(d, HOSTILE_SEGS);
        vring_kick(&blk_vq);
        served += hostile_wait(blk_vq.size);
    }
    hostile_fill(1536);
    hostile_post(0, 1536);
    blk_post(1, VIRTIO_BLK_T_IN, 0, BLOCK);
    vring_kick(&blk_vq); /* one notify for both: the refused one must not hold back the other */
    u32 long_served = hostile_wait(2);
    puts_("EXITLESS BLK hostile done requests=");
    put_u64(rounds * blk_vq.size);
    puts_(" served=");
    put_u64(served);
    puts_(" long_then_normal_served=");
    put_u64(long_served);
    puts_(" normal_status=");
    put_u64(statuses[1]);
    puts_("\n");
    if (find_arg(blk_cmdline, "hold"))
        for (;;)
            __asm__ volatile("pause");
    return 0;
}
