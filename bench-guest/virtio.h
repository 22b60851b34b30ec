/* The bench guest's PCI and virtio-pci (modern, virtio 1.x) driver: enough to find a
 * device on bus 0, give it BARs, negotiate features, set up split queues with MSI-X, and
 * drive them. Everything runs at CPL3 (I/O bitmap open, low 4 GiB user-mapped). */
#ifndef EXITLESS_VIRTIO_H
#define EXITLESS_VIRTIO_H

#include "guest.h"

/* virtio-pci common configuration registers (offsets) and device status bits. */
#define CC_DFSELECT 0x00
#define CC_DF 0x04
#define CC_GFSELECT 0x08
#define CC_GF 0x0c
#define CC_MSIX_CONFIG 0x10
#define CC_NUM_QUEUES 0x12
#define CC_STATUS 0x14
#define CC_Q_SELECT 0x16
#define CC_Q_SIZE 0x18
#define CC_Q_MSIX 0x1a
#define CC_Q_ENABLE 0x1c
#define CC_Q_NOFF 0x1e
#define CC_Q_DESC 0x20
#define CC_Q_DRIVER 0x28
#define CC_Q_DEVICE 0x30
#define S_ACKNOWLEDGE 1
#define S_DRIVER 2
#define S_DRIVER_OK 4
#define S_FEATURES_OK 8
#define S_NEEDS_RESET 0x40

#define PCI_VENDOR_VIRTIO   0x1af4
#define PCI_DEVICE_VIRTIO_BLK 0x1042  /* 0x1040 + device id 2 */
#define PCI_DEVICE_VIRTIO_RNG 0x1044  /* 0x1040 + device id 4 */
#define PCI_DEVICE_VIRTIO_NET 0x1041  /* 0x1040 + device id 1 */
#define PCI_DEVICE_VIRTIO_VSOCK 0x1053 /* 0x1040 + device id 19 */
#define PCI_DEVICE_VIRTIO_FS 0x105a    /* 0x1040 + device id 26 */
#define PCI_DEVICE_VIRTIO_BALLOON 0x1045 /* 0x1040 + device id 5 */
/* Several seconds at any TSC rate: how long the drivers wait for a device. */
#define VIRTIO_WAIT_CYCLES 20000000000UL

/* ---- PCI bus 0 through 0xcf8/0xcfc ---- */
u32 pci_read32(u8 slot, u8 reg);
u16 pci_read16(u8 slot, u8 reg);
u8 pci_read8(u8 slot, u8 reg);
void pci_write32(u8 slot, u8 reg, u32 v);
void pci_write16(u8 slot, u8 reg, u16 v);
/* The first slot on bus 0 whose function 0 is vendor:device, or -1. */
int pci_find(u16 vendor, u16 device);
/* Sizes and places every memory BAR of `slot` in PCI_BAR_WINDOW (a 64-bit BAR the VMM
 * placed above 4 GiB stays there, identity-mapped), then turns on memory decoding and bus
 * mastering; bars[i] is BAR i's address (0 when unused). */
void pci_assign_bars(u8 slot, u64 bars[6]);

/* ---- virtio-pci transport ---- */
#define VIRTIO_F_VERSION_1        (1UL << 32)
#define VIRTIO_RING_F_EVENT_IDX   (1UL << 29)
#define VIRTIO_NO_VECTOR          0xffff

#define VRING_DESC_F_NEXT  1
#define VRING_DESC_F_WRITE 2
#define VRING_USED_F_NO_NOTIFY 1

/* The largest queue the guest sets up (smaller if the device says so). */
#define VQ_MAX 128

struct vring_desc {
    u64 addr;
    u32 len;
    u16 flags, next;
};

struct vring_used_elem {
    u32 id, len;
};

struct virtio_dev {
    u8 slot;
    u64 common, isr, device_cfg, notify;
    u32 notify_mult;
    u64 msix_table;
    u16 msix_entries;
    u64 features;
};

struct vring {
    u16 size, index;
    struct vring_desc *desc;
    volatile u16 *avail;                 /* flags, idx, ring[size], used_event */
    volatile u16 *used;                  /* flags, idx, then elements; avail_event after */
    u16 avail_idx, kicked_idx, last_used;
    int event_idx;
    u64 notify_addr;
    u64 notifies;
};

/* Finds the virtio capabilities (and MSI-X) of `slot`, whose BARs are placed; 0 or why not. */
const char *virtio_open(struct virtio_dev *d, u8 slot);
/* Resets the device and negotiates `wanted` (VERSION_1 is required); 0 or why not. */
const char *virtio_negotiate(struct virtio_dev *d, u64 wanted);
/* Sets up queue `index` in `mem` (VQ_MAX entries' worth), interrupts to MSI-X entry `vector`
 * (VIRTIO_NO_VECTOR: none); 0 or why not. */
const char *virtio_queue(struct virtio_dev *d, struct vring *vq, u16 index, u16 vector);
/* Points MSI-X table entry `entry` at this CPU's LAPIC with vector `vec`, enables MSI-X. */
void virtio_msix(struct virtio_dev *d, u16 entry, u8 vec);
void virtio_driver_ok(struct virtio_dev *d);

/* Makes the chain starting at `head` available (not yet notified). */
void vring_post(struct vring *vq, u16 head);
/* Notifies the device of what was posted, unless it said it does not need to know. */
void vring_kick(struct vring *vq);
/* The next used element, if any: returns 1 and fills *e. */
int vring_take(struct vring *vq, struct vring_used_elem *e);
/* Asks for an interrupt at the next completion; returns 1 if one is already there. */
int vring_arm(struct vring *vq);
/* Waits for the next used element (by interrupt or polling); fails with `what` after
 * VIRTIO_WAIT_CYCLES. */
void vring_wait(struct vring *vq, int use_irq, struct vring_used_elem *e, const char *what);
/* The same, but gives up after `cycles`: 1 with *e filled, or 0. */
int vring_wait_until(struct vring *vq, int use_irq, struct vring_used_elem *e, u64 cycles);
/* Prints "EXITLESS ERROR <what>" and ends the guest with status 3. */
void virtio_fail(const char *what);

/* ---- the cases (virtio_cases.c) ---- */
/* Finds and sets up the virtio-blk device as the command line says (qd=, irq=poll,
 * evidx=off, seed=); 0 or why the case cannot run. */
const char *virtio_blk_setup(const char *cmdline);
/* The same for the virtio-blk function in `slot` (a hot-added disk beside others). */
const char *virtio_blk_setup_at(const char *cmdline, u8 slot);
u64 loop_virtio_blk(u64 n);
void virtio_blk_check_round(u64 round, u64 k, u8 *into);
u64 virtio_blk_check_end(u64 blocks, const u8 *from);
u64 loop_virtio_check(u64 blocks);
u64 loop_virtio_blk_hostile(u64 rounds);
/* The virtio_blk result line's own fields. */
void report_virtio_blk(void);
/* Writes `blocks` blocks with a pattern, flushes, reads them back and compares (reported). */
void virtio_blk_pattern_check(u64 blocks);
/* Reads the blocks virtio_blk_pattern_check wrote back: the bytes that differ. */
u64 virtio_blk_pattern_verify(u64 blocks);
/* Resets the virtio-blk device (the driver lets it go). */
void virtio_blk_release(void);

/* Hotplug (hotplug.c): a disk added, used, removed; a CPU added and started. */
const char *hotplug_disk_setup(const char *cmdline);
u64 loop_hotplug_disk(u64 blocks);
u64 loop_hotplug_cpu(u64 n);
/* The steps of the two cases above (hotplug.c): a disk's slot once it came up, a CPU's id
 * once inserted and acknowledged (not started). */
int hotplug_wait_disk(void);
u32 hotplug_wait_cpu(void);
/* case=snapshot hotplug=1 (snapshot_hotplug.c): before the rounds, memory, a disk and a CPU
 * taken as the host adds them (and the balloon inflated to its target); each round checks
 * them. */
void snapshot_hotplug_prepare(const char *cmdline);
void snapshot_hotplug_round(u64 t);
int snapshot_hotplug_ok(void);
/* hostile_eject: the PCI eject register written in a loop (issue 37). */
const char *hostile_eject_setup(const char *cmdline);
u64 loop_hostile_eject(u64 n);
/* Starts the CPU with APIC ID `apic` (INIT-SIPI-SIPI); 1 once it runs (bench.c). */

/* virtio-net (virtio_net.c): setup as the command line says (frame=, qd=, irq=poll,
 * evidx=off); net_check sends a frame and echoes `n` frames of the host's. */
const char *virtio_net_setup(const char *cmdline);
u64 loop_virtio_net(u64 n);
u64 loop_net_check(u64 n);
void report_virtio_net(void);
/* case=snapshot: a frame for round `n` out and the host's echo back, retried as frames in
 * flight at a snapshot are lost; the tries it took, or 0. */
u64 net_round_trip(u64 n);

/* virtio-vsock (virtio_vsock.c): setup as the command line says (port=, listen=, mode=rr or
 * stream, irq=poll, evidx=off); vsock_check connects out and accepts one connection. */
const char *virtio_vsock_setup(const char *cmdline);
u64 loop_virtio_vsock(u64 n);
u64 loop_vsock_check(u64 n);
void report_virtio_vsock(void);
/* case=snapshot: a connection to host port `port`, `msg` out and its echo back, closed: 1, or
 * 0 when the device reset the connection (as after a restore: try again); fails otherwise. */
int vsock_round(u32 port, const u8 *msg, u32 len);
/* The CID the device gives (read again at each transport reset), and the resets taken. */
u64 vsock_guest_cid(void);
u64 vsock_transport_resets(void);

/* Hostile drivers (virtio_hostile.c): a broken vsock receive ring (ring=idx or ring=zero)
 * while the host sends; DRIVER_OK toggles on every device (iters=, seed=, sync). */
const char *hostile_vsock_setup(const char *cmdline);
u64 loop_hostile_vsock(u64 n);
const char *hostile_toggle_setup(const char *cmdline);
u64 loop_hostile_toggle(u64 n);

/* virtio-fs (virtio_fs.c): FUSE over the request queue (fs_tag=, fs_read=, fs_write=,
 * fs_len=, qd=, irq=poll, evidx=off, seed=, fs_bad=). fs_check reads a host file and checks
 * its pattern, then writes one; virtio_fs times 4 KiB reads at a queue depth; fs_hostile
 * posts malformed chains, then a valid request. */
const char *virtio_fs_setup(const char *cmdline);
const char *virtio_fs_bench_setup(const char *cmdline);
u64 loop_fs_check(u64 n);
u64 loop_virtio_fs(u64 n);
u64 loop_fs_hostile(u64 n);
void report_virtio_fs(void);
/* case=snapshot fs=1 (virtio_fs.c): a file of the shared directory held open across rounds. */
const char *snapshot_fs_setup(const char *cmdline);
void snapshot_fs_round(u64 t);
void snapshot_fs_end(u64 ticks);

/* virtio-balloon (virtio_balloon.c): balloon_check touches `mib` MiB, reports them free and
 * checks they read back as zeros, inflates and deflates pages (inflate=N, sync, follow). */
const char *virtio_balloon_setup(const char *cmdline);
u64 loop_balloon_check(u64 mib);
/* Inflates pages from `base` up to the host's target (num_pages, at most 16 MiB) and sets
 * `actual`; returns the pages inflated. The target and `actual` as the device says them. */
u64 virtio_balloon_inflate_target(u64 base);
u32 virtio_balloon_target(void);
u32 virtio_balloon_actual(void);

const char *operations_setup(const char *cmdline);
u64 loop_power_button(u64 n);
u64 loop_nmi_check(u64 n);
u64 loop_resize_check(u64 n);
const char *virtio_pmem_setup(const char *cmdline);
u64 loop_pmem_check(u64 kib);
/* Identity-maps [at, at + size) above 4 GiB (2 MiB pages, user-accessible); 0 on success. */
int pci_map_high(u64 at, u64 size);

#endif
