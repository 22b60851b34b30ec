/* Cloud Hypervisor's operations on a running VM, seen from the guest (issue 43):
 *
 * - power_button: waits for the GED's power button bit (`vm.power-button`), then powers off
 *   as an OS's ACPI code does: SLP_TYPa of \_S5_ (5) with SLP_EN to the FADT's sleep control
 *   register. The VM ends there; a line after it would mean the power-off did not happen.
 * - nmi_check: counts NMIs (vector 2's gate replaced by a counter) until one comes (`vm.nmi`).
 * - resize_check: drives the first virtio-blk disk with its configuration-change vector on
 *   MSI-X entry 0, waits for that interrupt (`vm.resize-disk`), then reads the new capacity
 *   under a stable configuration generation.
 *
 * Each prints "ready" once waiting, so a test knows when to send its request. */
#include "virtio.h"

#define GED_POWER_BUTTON 8
#define SLP_TYP_S5 5
#define SLP_EN 0x20
#define CC_CONFIG_GENERATION 0x15
#define ISR_CONFIG 2
/* Long enough for a test to send its request after the ready line, under load. */
#define OPERATION_WAIT (6 * VIRTIO_WAIT_CYCLES)

volatile u64 nmi_count, config_irqs;
extern void nmi_count_stub(void), config_irq_stub(void);

/* NMI: count (no EOI: an NMI is not acknowledged at the LAPIC). A configuration change's
 * MSI-X vector: count and EOI. */
__asm__(".text\n"
        ".globl nmi_count_stub\n"
        "nmi_count_stub:\n"
        "    lock incq nmi_count(%rip)\n"
        "    iretq\n"
        ".globl config_irq_stub\n"
        "config_irq_stub:\n"
        "    push %rax\n"
        "    lock incq config_irqs(%rip)\n"
        "    mov $0xfee000b0, %eax\n"
        "    movl $0, (%rax)\n"
        "    pop %rax\n"
        "    iretq\n");

static void operation_fail(const char *what)
{
    puts_("EXITLESS ERROR operation: ");
    puts_(what);
    puts_("\n");
    guest_exit(3);
}

/* Every case here waits with interrupts on; the gates are memory the CPL3 set-up may write
 * (the guest maps itself user-accessible). */
const char *operations_setup(const char *cmdline)
{
    (void)cmdline;
    set_gate(2, nmi_count_stub, 0x8e);
    set_gate(VEC_CONFIG, config_irq_stub, 0x8e);
    user_rflags = 0x202;
    return 0;
}

static void say(const char *what, u64 value)
{
    puts_(what);
    put_u64(value);
    puts_("\n");
}

u64 loop_power_button(u64 n)
{
    (void)n;
    puts_("EXITLESS POWER ready\n");
    for (u64 start = rdtsc(); !(mmio_read8(GED_ADDR) & GED_POWER_BUTTON);) {
        if (rdtsc() - start > OPERATION_WAIT)
            operation_fail("no power button notification");
        __asm__ volatile("pause");
    }
    puts_("EXITLESS POWER button pressed, powering off (S5)\n");
    outb(SLEEP_PORT, (SLP_TYP_S5 << 2) | SLP_EN);
    operation_fail("still running after the S5 write");
    return 0;
}

u64 loop_nmi_check(u64 n)
{
    (void)n;
    puts_("EXITLESS NMI ready\n");
    for (u64 start = rdtsc(); !nmi_count;) {
        if (rdtsc() - start > OPERATION_WAIT)
            operation_fail("no NMI came");
        __asm__ volatile("pause");
    }
    say("EXITLESS NMI count=", nmi_count);
    return 0;
}

static struct virtio_dev disk;
static struct vring disk_vq;

static u64 capacity(void)
{
    u8 gen;
    u64 sectors;
    do {
        gen = mmio_read8(disk.common + CC_CONFIG_GENERATION);
        sectors = (u64)mmio_read32(disk.device_cfg) | (u64)mmio_read32(disk.device_cfg + 4) << 32;
    } while (gen != mmio_read8(disk.common + CC_CONFIG_GENERATION));
    return sectors;
}

u64 loop_resize_check(u64 n)
{
    (void)n;
    int slot = pci_find(PCI_VENDOR_VIRTIO, PCI_DEVICE_VIRTIO_BLK);
    if (slot < 0)
        operation_fail("no virtio-blk disk");
    const char *why = virtio_open(&disk, (u8)slot);
    if (!why)
        why = virtio_negotiate(&disk, 0);
    if (!why)
        why = virtio_queue(&disk, &disk_vq, 0, VIRTIO_NO_VECTOR);
    if (why)
        operation_fail(why);
    virtio_msix(&disk, 0, VEC_CONFIG);
    mmio_write16(disk.common + CC_MSIX_CONFIG, 0);
    if (mmio_read16(disk.common + CC_MSIX_CONFIG) != 0)
        operation_fail("the configuration vector was refused");
    virtio_driver_ok(&disk);
    u8 gen = mmio_read8(disk.common + CC_CONFIG_GENERATION);
    say("EXITLESS RESIZE ready sectors=", capacity());
    for (u64 start = rdtsc(); !config_irqs;) {
        if (rdtsc() - start > OPERATION_WAIT)
            operation_fail("no configuration change interrupt");
        __asm__ volatile("pause");
    }
    u8 isr = mmio_read8(disk.isr);
    u8 now = mmio_read8(disk.common + CC_CONFIG_GENERATION);
    puts_("EXITLESS RESIZE changed sectors=");
    put_u64(capacity());
    puts_(" generation_changed=");
    put_u64(now != gen);
    puts_(" isr_config=");
    put_u64((isr & ISR_CONFIG) != 0);
    say(" irqs=", config_irqs);
    return 0;
}
