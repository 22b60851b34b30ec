/* The hotplug cases: the guest acts as an OS's ACPI code would (it has no AML interpreter):
 * it waits for the GED's notification, reads the PCI or CPU hotplug controller, takes the new
 * disk into use (written, flushed, read back), gives it back when asked (reset, then eject),
 * and starts a CPU added while it runs with INIT/SIPI. */
#include "virtio.h"

#define GED_PCI 2
#define GED_CPU 1
#define PCIU 0x0
#define PCID 0x4
#define B0EJ 0x8
#define CSEL 0x0
#define CSTA 0x4
#define CCNT 0x8
#define CSTA_INSERTING 2
/* Long enough for a test to send its request after the ready line, under load. */
#define HOTPLUG_WAIT (6 * VIRTIO_WAIT_CYCLES)

static void hotplug_fail(const char *what)
{
    puts_("EXITLESS ERROR hotplug: ");
    puts_(what);
    puts_("\n");
    guest_exit(3);
}

/* Waits for the GED to report `bit` (reading the register takes every pending bit). */
static void wait_ged(u8 bit, const char *what)
{
    for (u64 start = rdtsc(); !(mmio_read8(GED_ADDR) & bit);) {
        if (rdtsc() - start > HOTPLUG_WAIT)
            hotplug_fail(what);
        __asm__ volatile("pause");
    }
}

static int lowest_bit(u32 bits)
{
    for (int i = 0; i < 32; i++)
        if (bits & (1u << i))
            return i;
    return -1;
}

static void say_slot(const char *what, int slot)
{
    puts_("EXITLESS HOTPLUG ");
    puts_(what);
    puts_(" slot=");
    put_u64((u64)slot);
    puts_("\n");
}

/* Before hotplug_disk: the case runs at CPL3 with interrupts on, for the new disk's MSI-X
 * (the disk is set up inside the case, when it comes, too late to change the case's RFLAGS). */
const char *hotplug_disk_setup(const char *cmdline)
{
    (void)cmdline;
    user_rflags = 0x202;
    return 0;
}

/* Waits for a disk to come up in a slot (the GED's PCI bit, the controller's PCIU); its slot. */
int hotplug_wait_disk(void)
{
    wait_ged(GED_PCI, "no PCI hotplug notification");
    int slot = lowest_bit(mmio_read32(PCI_HOTPLUG_ADDR + PCIU));
    if (slot < 0)
        hotplug_fail("notified, but no slot came up");
    if (pci_read32((u8)slot, 0) != (PCI_VENDOR_VIRTIO | (u32)PCI_DEVICE_VIRTIO_BLK << 16))
        hotplug_fail("the new slot holds no virtio-blk device");
    say_slot("added", slot);
    return slot;
}

/* hotplug_disk: a disk comes, is used, is asked back and ejected; its slot then reads empty. */
u64 loop_hotplug_disk(u64 blocks)
{
    puts_("EXITLESS HOTPLUG ready\n");
    int slot = hotplug_wait_disk();
    const char *why = virtio_blk_setup("");
    if (why)
        hotplug_fail(why);
    virtio_blk_pattern_check(blocks);
    puts_("EXITLESS HOTPLUG waiting for removal\n");
    wait_ged(GED_PCI, "no removal request");
    if (!(mmio_read32(PCI_HOTPLUG_ADDR + PCID) & (1u << slot)))
        hotplug_fail("notified, but the disk's slot is not asked back");
    virtio_blk_release();
    mmio_write32(PCI_HOTPLUG_ADDR + B0EJ, 1u << slot);
    for (u64 start = rdtsc(); pci_read32((u8)slot, 0) != 0xffffffffu;)
        if (rdtsc() - start > HOTPLUG_WAIT)
            hotplug_fail("the ejected slot still holds a device");
    say_slot("removed", slot);
    return 0;
}

/* hotplug_cpu: a CPU comes; the guest finds it through the controller and starts it. */
u64 loop_hotplug_cpu(u64 n)
{
    (void)n;
    puts_("EXITLESS HOTPLUG cpu ready\n");
    u32 added = hotplug_wait_cpu();
    if (!start_ap(added))
        hotplug_fail("the added CPU did not start");
    puts_("EXITLESS HOTPLUG cpu started id=");
    put_u64(added);
    puts_("\n");
    return 0;
}

/* Waits for a CPU to be inserted (the GED's CPU bit), acknowledges it; its id. */
u32 hotplug_wait_cpu(void)
{
    wait_ged(GED_CPU, "no CPU hotplug notification");
    u32 count = mmio_read32(CPU_HOTPLUG_ADDR + CCNT), added = 0xffffffffu;
    for (u32 id = 0; id < count && id < 256; id++) {
        mmio_write32(CPU_HOTPLUG_ADDR + CSEL, id);
        if (mmio_read8(CPU_HOTPLUG_ADDR + CSTA) & CSTA_INSERTING) {
            mmio_write8(CPU_HOTPLUG_ADDR + CSTA, CSTA_INSERTING);
            added = id;
            break;
        }
    }
    if (added == 0xffffffffu)
        hotplug_fail("notified, but no CPU is being inserted");
    puts_("EXITLESS HOTPLUG cpu added id=");
    put_u64(added);
    puts_("\n");
    return added;
}

/* hostile_eject (issue 37): the PCI eject register written `iters` times with `bits=`
 * (decimal; default every slot but the host bridge's). A slot holding a device is ejected
 * once, however often it is named; empty slots are ignored and counted; the VMM's memory must
 * not grow with the writes. With `sync` the guest first waits for a byte on COM1 (the host
 * takes its figures then). Prints "EXITLESS HOSTILE eject begin", then, once the named slots
 * that held a device read empty (or after a wait), "EXITLESS HOSTILE eject done n=<iters>
 * slots_left=<bits of the slots 1-31 still holding a device>". */
static const char *eject_cmdline = "";

const char *hostile_eject_setup(const char *cmdline)
{
    eject_cmdline = cmdline;
    return 0;
}

/* The slots 1-31 that hold a device, a bit each. */
static u32 slots_held(void)
{
    u32 held = 0;
    for (int s = 1; s < 32; s++)
        if (pci_read32((u8)s, 0) != 0xffffffffu)
            held |= 1u << s;
    return held;
}

u64 loop_hostile_eject(u64 n)
{
    u32 bits = (u32)parse_u64(find_arg(eject_cmdline, "bits="));
    if (!bits)
        bits = 0xfffffffeu;
    puts_("EXITLESS HOSTILE eject begin\n");
    if (find_arg(eject_cmdline, "sync") && !console_wait_byte(HOTPLUG_WAIT))
        hotplug_fail("no go-ahead from the host on COM1");
    for (u64 i = 0; i < n; i++)
        mmio_write32(PCI_HOTPLUG_ADDR + B0EJ, bits);
    u32 left = slots_held();
    for (u64 start = rdtsc(); (left & bits) && rdtsc() - start < HOTPLUG_WAIT; left = slots_held())
        for (u64 t = rdtsc(); rdtsc() - t < 2400000;)
            __asm__ volatile("pause");
    puts_("EXITLESS HOSTILE eject done n=");
    put_u64(n);
    puts_(" slots_left=");
    put_u64(left);
    puts_("\n");
    return 0;
}
