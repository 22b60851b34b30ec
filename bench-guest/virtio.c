/* The virtio-pci modern transport and split virtqueues, driver side. */
#include "virtio.h"

#define PCI_STATUS 0x06
#define PCI_STATUS_CAP_LIST 0x10
#define PCI_CAP_PTR 0x34
#define PCI_CAP_VENDOR 0x09
#define PCI_CAP_MSIX 0x11

#define VIRTIO_PCI_CAP_COMMON 1
#define VIRTIO_PCI_CAP_NOTIFY 2
#define VIRTIO_PCI_CAP_ISR 3
#define VIRTIO_PCI_CAP_DEVICE 4

/* Ring memory for up to eight queues: blk, rng, net's two and vsock's three at once. */
#define MAX_QUEUES 8
static struct vring_desc desc_mem[MAX_QUEUES][VQ_MAX] __attribute__((aligned(4096)));
static u16 avail_mem[MAX_QUEUES][VQ_MAX + 3] __attribute__((aligned(4096)));
static u32 used_mem[MAX_QUEUES][2 * VQ_MAX + 2] __attribute__((aligned(4096)));
static int queues_used;

const char *virtio_open(struct virtio_dev *d, u8 slot)
{
    u64 bars[6];
    memset(d, 0, sizeof(*d));
    d->slot = slot;
    pci_assign_bars(slot, bars);
    if (!(pci_read16(slot, PCI_STATUS) & PCI_STATUS_CAP_LIST))
        return "no-capabilities";
    for (u8 p = pci_read8(slot, PCI_CAP_PTR) & 0xfc, n = 0; p && n < 48; n++) {
        u8 id = pci_read8(slot, p), next = pci_read8(slot, (u8)(p + 1)) & 0xfc;
        if (id == PCI_CAP_MSIX) {
            u32 table = pci_read32(slot, (u8)(p + 4));
            d->msix_table = bars[table & 7] + (table & ~7u);
            d->msix_entries = (u16)((pci_read16(slot, (u8)(p + 2)) & 0x7ff) + 1);
        } else if (id == PCI_CAP_VENDOR) {
            u8 type = pci_read8(slot, (u8)(p + 3)), bar = pci_read8(slot, (u8)(p + 4));
            u64 at = bar < 6 ? bars[bar] + pci_read32(slot, (u8)(p + 8)) : 0;
            if (type == VIRTIO_PCI_CAP_COMMON && !d->common)
                d->common = at;
            else if (type == VIRTIO_PCI_CAP_NOTIFY && !d->notify) {
                d->notify = at;
                d->notify_mult = pci_read32(slot, (u8)(p + 16));
            } else if (type == VIRTIO_PCI_CAP_ISR && !d->isr)
                d->isr = at;
            else if (type == VIRTIO_PCI_CAP_DEVICE && !d->device_cfg)
                d->device_cfg = at;
        }
        p = next;
    }
    if (!d->common || !d->notify || !d->device_cfg)
        return "virtio-capabilities-missing";
    return 0;
}

static u64 device_features(struct virtio_dev *d)
{
    mmio_write32(d->common + CC_DFSELECT, 0);
    u64 lo = mmio_read32(d->common + CC_DF);
    mmio_write32(d->common + CC_DFSELECT, 1);
    return lo | (u64)mmio_read32(d->common + CC_DF) << 32;
}

const char *virtio_negotiate(struct virtio_dev *d, u64 wanted)
{
    u64 c = d->common;
    mmio_write8(c + CC_STATUS, 0);
    for (u64 t = rdtsc(); mmio_read8(c + CC_STATUS) != 0;)
        if (rdtsc() - t > 10000000000UL)
            return "reset-never-completed";
    mmio_write8(c + CC_STATUS, S_ACKNOWLEDGE);
    mmio_write8(c + CC_STATUS, S_ACKNOWLEDGE | S_DRIVER);
    u64 offered = device_features(d);
    if (!(offered & VIRTIO_F_VERSION_1))
        return "not-a-virtio-1-device";
    d->features = offered & (wanted | VIRTIO_F_VERSION_1);
    mmio_write32(c + CC_GFSELECT, 0);
    mmio_write32(c + CC_GF, (u32)d->features);
    mmio_write32(c + CC_GFSELECT, 1);
    mmio_write32(c + CC_GF, (u32)(d->features >> 32));
    mmio_write8(c + CC_STATUS, S_ACKNOWLEDGE | S_DRIVER | S_FEATURES_OK);
    if (!(mmio_read8(c + CC_STATUS) & S_FEATURES_OK))
        return "features-refused";
    mmio_write16(c + CC_MSIX_CONFIG, VIRTIO_NO_VECTOR);
    return 0;
}

const char *virtio_queue(struct virtio_dev *d, struct vring *vq, u16 index, u16 vector)
{
    u64 c = d->common;
    if (index >= mmio_read16(c + CC_NUM_QUEUES))
        return "no-such-queue";
    if (queues_used >= MAX_QUEUES)
        return "out-of-ring-memory";
    int m = queues_used++;
    mmio_write16(c + CC_Q_SELECT, index);
    u16 size = mmio_read16(c + CC_Q_SIZE);
    if (!size)
        return "queue-unavailable";
    if (size > VQ_MAX)
        size = VQ_MAX;
    memset(vq, 0, sizeof(*vq));
    vq->size = size;
    vq->index = index;
    vq->desc = desc_mem[m];
    vq->avail = avail_mem[m];
    vq->used = (volatile u16 *)used_mem[m];
    vq->event_idx = (d->features & VIRTIO_RING_F_EVENT_IDX) != 0;
    mmio_write16(c + CC_Q_SIZE, size);
    mmio_write64(c + CC_Q_DESC, (u64)vq->desc);
    mmio_write64(c + CC_Q_DRIVER, (u64)vq->avail);
    mmio_write64(c + CC_Q_DEVICE, (u64)vq->used);
    mmio_write16(c + CC_Q_MSIX, vector);
    if (mmio_read16(c + CC_Q_MSIX) != vector)
        return "msix-vector-refused";
    vq->notify_addr = d->notify + (u64)mmio_read16(c + CC_Q_NOFF) * d->notify_mult;
    mmio_write16(c + CC_Q_ENABLE, 1);
    return 0;
}

void virtio_msix(struct virtio_dev *d, u16 entry, u8 vec)
{
    if (!d->msix_table || entry >= d->msix_entries)
        return;
    u64 e = d->msix_table + 16UL * entry;
    mmio_write32(e, APIC_BASE);  /* destination: APIC ID 0, physical */
    mmio_write32(e + 4, 0);
    mmio_write32(e + 8, vec);    /* fixed, edge */
    mmio_write32(e + 12, 0);     /* unmasked */
    /* Message control: MSI-X enable, function unmasked. */
    for (u8 p = pci_read8(d->slot, 0x34) & 0xfc, n = 0; p && n < 48; n++) {
        if (pci_read8(d->slot, p) == 0x11) {
            u16 ctl = pci_read16(d->slot, (u8)(p + 2));
            pci_write16(d->slot, (u8)(p + 2), (u16)((ctl | 0x8000) & ~0x4000));
            return;
        }
        p = pci_read8(d->slot, (u8)(p + 1)) & 0xfc;
    }
}

void virtio_driver_ok(struct virtio_dev *d)
{
    u8 s = mmio_read8(d->common + CC_STATUS);
    mmio_write8(d->common + CC_STATUS, (u8)(s | S_DRIVER_OK));
}

/* ---- split virtqueue ---- */

#define AVAIL_IDX(vq) ((vq)->avail[1])
#define USED_EVENT(vq) ((vq)->avail[2 + (vq)->size])
#define USED_FLAGS(vq) ((vq)->used[0])
#define USED_IDX(vq) ((vq)->used[1])
#define AVAIL_EVENT(vq) ((vq)->used[2 + 4 * (vq)->size])

void vring_post(struct vring *vq, u16 head)
{
    vq->avail[2 + vq->avail_idx % vq->size] = head;
    vq->avail_idx++;
    compiler_barrier(); /* x86 keeps stores in order: the entry before the index */
    AVAIL_IDX(vq) = vq->avail_idx;
}

void vring_kick(struct vring *vq)
{
    u16 old = vq->kicked_idx, now = vq->avail_idx;
    if (old == now)
        return;
    vq->kicked_idx = now;
    full_barrier(); /* the index is visible before the device's wish is read */
    int need;
    if (vq->event_idx)
        need = (u16)(now - AVAIL_EVENT(vq) - 1) < (u16)(now - old);
    else
        need = !(USED_FLAGS(vq) & VRING_USED_F_NO_NOTIFY);
    if (need) {
        vq->notifies++;
        mmio_write16(vq->notify_addr, vq->index);
    }
}

int vring_take(struct vring *vq, struct vring_used_elem *e)
{
    if (USED_IDX(vq) == vq->last_used)
        return 0;
    compiler_barrier(); /* the index before the element it covers */
    const volatile u32 *elems = (const volatile u32 *)(vq->used + 2);
    u16 i = vq->last_used % vq->size;
    e->id = elems[2 * i];
    e->len = elems[2 * i + 1];
    vq->last_used++;
    return 1;
}

int vring_arm(struct vring *vq)
{
    if (vq->event_idx)
        USED_EVENT(vq) = vq->last_used;
    full_barrier();
    return USED_IDX(vq) != vq->last_used;
}

void virtio_fail(const char *what)
{
    puts_("EXITLESS ERROR ");
    puts_(what);
    puts_("\n");
    guest_exit(3);
}

int vring_wait_until(struct vring *vq, int use_irq, struct vring_used_elem *e, u64 cycles)
{
    u64 start = rdtsc();
    while (!vring_take(vq, e)) {
        if (use_irq) {
            u64 seen = ipi_count;
            if (!vring_arm(vq))
                while (*(volatile u64 *)&ipi_count == seen && rdtsc() - start < cycles)
                    __asm__ volatile("pause");
        } else {
            __asm__ volatile("pause");
        }
        if (rdtsc() - start > cycles)
            return 0;
    }
    return 1;
}

void vring_wait(struct vring *vq, int use_irq, struct vring_used_elem *e, const char *what)
{
    if (!vring_wait_until(vq, use_irq, e, VIRTIO_WAIT_CYCLES))
        virtio_fail(what);
}
