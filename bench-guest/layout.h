/* Bench guest constants shared by C, assembly and (by value) the VMM's bench module. */
#ifndef EXITLESS_GUEST_LAYOUT_H
#define EXITLESS_GUEST_LAYOUT_H

#define SEL_KCODE 0x08
#define SEL_KDATA 0x10
#define SEL_UDATA (0x18 | 3)
#define SEL_UCODE (0x20 | 3)
#define SEL_TSS   0x28      /* 16 bytes: 0x28 and 0x30 */
#define SEL_KCODE32 0x38    /* 32-bit code, for APs leaving real mode */

#define VEC_IPI          0x40
#define VEC_IPI_ACK      0x41      /* IPI cases: acknowledge (ipi.c) */
#define VEC_TLB_FLUSH    0x42      /* shootdown cases: invlpg, then acknowledge */
#define VEC_VIRTIO       0x50      /* MSI-X vector of the virtio queues the guest drives */
#define VEC_CONFIG       0x51      /* MSI-X vector of a virtio configuration change (operations.c) */

#define APIC_BASE        0xfee00000

#define COM1_PORT        0x3f8
#define EXIT_PORT        0xf4      /* QEMU isa-debug-exit compatible */
#define MARKER_PORT      0x7e8     /* begin (1) / end (2) of a measured loop */
#define BENCH_PORT       0x7e0     /* PIO target: unclaimed, ioeventfd or coalesced */
#define DIRTY_PORT       0x7ec     /* case=dirty_write: the host harvests its dirty log */
#define BENCH_MMIO       0xd0000000 /* MMIO target in the MMIO gap */
#define BENCH_MAGIC      0x600dcafe /* value written, for datamatch */
#define BENCH_MSR        0xc0000102 /* MSR_KERNEL_GS_BASE: harmless */

/* Where the guest puts the BARs of the virtio devices it drives: inside the PCI hole of
 * exitless (0xc0000000, 256 MiB, which exitless fills from its bottom) and of QEMU's pc. */
#define PCI_BAR_WINDOW   0xc8000000UL

/* exitless's ACPI hotplug controllers (vmm/src/devices/acpi/mod.rs; docs/hotplug.md). */
#define GED_ADDR         0xfeb00000UL
#define PCI_HOTPLUG_ADDR 0xfeb01000UL
#define CPU_HOTPLUG_ADDR 0xfeb02000UL
#define MEMORY_HOTPLUG_ADDR 0xfeb03000UL
/* The ACPI sleep control register (FADT SLEEP_CONTROL_REG; vmm/src/devices/acpi/sleep.rs). */
#define SLEEP_PORT       0x600

#define AP_TRAMPOLINE    0x8000   /* SIPI vector 0x08: APs start in real mode here */
#define AP_STACK_SIZE    4096
#define MAX_APS          15

#define MARKER_BEGIN 1
#define MARKER_END   2

#endif
