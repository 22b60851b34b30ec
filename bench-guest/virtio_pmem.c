/* The bench guest's virtio-pmem driver and its case, pmem_check (iters = KiB written; 0 is
 * 64): finds the device, reads where its region is (configuration: le64 start, le64 size),
 * identity-maps it, writes a pattern through the mapping with plain stores, sends FLUSH and
 * waits for the answer, reads the pattern back. Prints
 *   EXITLESS PMEM region start=0x<hex> size=<bytes>
 *   EXITLESS PMEM flushed bytes=<n> ret=<answer>
 *   EXITLESS PMEM verified bytes=<n>   (or EXITLESS ERROR)
 * With `hostile`, before the flush: a request with no answer part, one whose answer comes
 * first, and one of an unknown type (answered 1), each waited for ("EXITLESS PMEM hostile
 * unknown_ret=<r>"). Runs at CPL3, polling. */
#include "virtio.h"

#define PCI_DEVICE_VIRTIO_PMEM 0x105b /* 0x1040 + device id 27 */
#define PMEM_FLUSH 0

static struct virtio_dev pm;
static struct vring pm_vq;
static const char *pm_cmdline = "";
static volatile u32 pm_req[4] __attribute__((aligned(16)));
static volatile u32 pm_ret[4] __attribute__((aligned(16)));

static void pm_fail(const char *what)
{
    puts_("EXITLESS ERROR pmem: ");
    puts_(what);
    puts_("\n");
    guest_exit(3);
}

static u8 pm_pattern(u64 i) { return (u8)((i * 7 + 3) ^ (i >> 12)); }

const char *virtio_pmem_setup(const char *cmdline)
{
    pm_cmdline = cmdline;
    int slot = pci_find(PCI_VENDOR_VIRTIO, PCI_DEVICE_VIRTIO_PMEM);
    if (slot < 0)
        return "no-virtio-pmem";
    const char *why = virtio_open(&pm, (u8)slot);
    if (!why)
        why = virtio_negotiate(&pm, 0);
    if (!why)
        why = virtio_queue(&pm, &pm_vq, 0, VIRTIO_NO_VECTOR);
    if (why)
        return why;
    virtio_driver_ok(&pm);
    return 0;
}

/* Posts a chain of `n` descriptors (0..n-1 of the table, already filled), waits for it to
 * come back; returns the used length. */
static u32 pm_send(u16 n)
{
    for (u16 i = 0; i + 1 < n; i++) {
        pm_vq.desc[i].flags |= VRING_DESC_F_NEXT;
        pm_vq.desc[i].next = (u16)(i + 1);
    }
    vring_post(&pm_vq, 0);
    vring_kick(&pm_vq);
    struct vring_used_elem e;
    vring_wait(&pm_vq, 0, &e, "pmem: no answer within seconds");
    return e.len;
}

static void pm_request(u16 slot, u32 type, u64 answer, int answer_first)
{
    pm_req[slot] = type;
    pm_ret[slot] = 0xff;
    struct vring_desc req = {(u64)&pm_req[slot], 4, 0, 0};
    struct vring_desc ret = {answer, 4, VRING_DESC_F_WRITE, 0};
    pm_vq.desc[0] = answer_first ? ret : req;
    pm_vq.desc[1] = answer_first ? req : ret;
}

static void pm_hostile(void)
{
    /* No answer part: the device counts it, completes it empty. */
    pm_vq.desc[0] = (struct vring_desc){(u64)&pm_req[0], 4, 0, 0};
    pm_req[0] = PMEM_FLUSH;
    pm_send(1);
    pm_request(1, PMEM_FLUSH, (u64)&pm_ret[1], 1);
    pm_send(2);
    pm_request(2, 7, (u64)&pm_ret[2], 0);
    pm_send(2);
    puts_("EXITLESS PMEM hostile unknown_ret=");
    put_u64(pm_ret[2]);
    puts_("\n");
}

u64 loop_pmem_check(u64 kib)
{
    u64 start = (u64)mmio_read32(pm.device_cfg) | (u64)mmio_read32(pm.device_cfg + 4) << 32;
    u64 size = (u64)mmio_read32(pm.device_cfg + 8) | (u64)mmio_read32(pm.device_cfg + 12) << 32;
    puts_("EXITLESS PMEM region start=");
    put_hex(start);
    puts_(" size=");
    put_u64(size);
    puts_("\n");
    u64 bytes = (kib ? kib : 64) * 1024;
    if (bytes > size)
        bytes = size;
    if (!start || pci_map_high(start, bytes))
        pm_fail("the region cannot be mapped");
    volatile u8 *region = (volatile u8 *)start;
    for (u64 i = 0; i < bytes; i++)
        region[i] = pm_pattern(i);
    if (find_arg(pm_cmdline, "hostile"))
        pm_hostile();
    pm_request(0, PMEM_FLUSH, (u64)&pm_ret[0], 0);
    u32 used = pm_send(2);
    puts_("EXITLESS PMEM flushed bytes=");
    put_u64(bytes);
    puts_(" ret=");
    put_u64(pm_ret[0]);
    puts_(" used=");
    put_u64(used);
    puts_("\n");
    u64 bad = 0;
    for (u64 i = 0; i < bytes; i++)
        bad += region[i] != pm_pattern(i);
    if (bad)
        pm_fail("the region read back differs");
    puts_("EXITLESS PMEM verified bytes=");
    put_u64(bytes);
    puts_("\n");
    return 0;
}
