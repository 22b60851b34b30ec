/* case=snapshot hotplug=1 (snapshot.c): what a VM gets while it runs (Kata grows its memory,
 * hot-adds a disk and a vCPU for each container), taken before the rounds and checked in each
 * of them, so that a snapshot taken during the rounds must keep it all:
 *
 *   1. "EXITLESS SNAPHP ready": the host grows memory (vm.resize desired_ram); the guest
 *      maps the new range and writes a word in every 2 MiB of it
 *      ("EXITLESS SNAPHP memory base=<hex> bytes=<n>");
 *   2. the host hot-adds a disk (vm.add-disk); the guest sets it up (polled) and writes
 *      4 blocks of its pattern ("EXITLESS SNAPHP disk slot=<n>");
 *   3. the host adds a vCPU (vm.resize desired_vcpus); the guest starts it, and the CPU
 *      halts until an IPI wakes it, counting its wake-ups ("EXITLESS SNAPHP cpu id=<n>");
 *   4. with balloon=1, the balloon inflated to the host's target (the VM's balloon size)
 *      ("EXITLESS BALLOON inflated pages=<n> target=<n>").
 *
 * Each round then checks every word (and writes one), reads the disk's blocks back, wakes
 * the CPU and waits for it, and prints
 *
 *   EXITLESS SNAPHP n=<round> mem_bad=<words> disk_bad=<bytes> wakes=<n> balloon=<actual>
 *
 * and the result line adds hotplug_ok=<0|1>. Runs at CPL3, but for the CPU's halt loop.
 * Every wait is bounded. */
#include "virtio.h"

#define HP_STRIDE (2UL << 20)
#define HP_BLOCKS 4
#define HP_BALLOON_BASE (64UL << 20)
#define HP_WAIT (6 * VIRTIO_WAIT_CYCLES)

static u64 hp_base, hp_len, hp_cpu, hp_mem_bad, hp_disk_bad, hp_rounds, hp_balloon;
static volatile u64 hp_wakes;

static u64 hp_word(u64 addr) { return addr ^ 0xc0ffee00c0ffeeUL; }

static void hp_fail(const char *what)
{
    puts_("EXITLESS ERROR snapshot hotplug: ");
    puts_(what);
    puts_("\n");
    guest_exit(3);
}

/* On the added CPU, at CPL0: halted with interrupts on; each IPI wakes it once. */
static void hp_cpu_service(void)
{
    load_idt();
    lapic_enable();
    for (;;) {
        __asm__ volatile("sti; hlt; cli" ::: "memory");
        hp_wakes = hp_wakes + 1;
    }
}

static void hp_line(const char *what, u64 value)
{
    puts_("EXITLESS SNAPHP ");
    puts_(what);
    put_u64(value);
    puts_("\n");
}

void snapshot_hotplug_prepare(const char *cmdline)
{
    puts_("EXITLESS SNAPHP ready\n");
    u64 slot;
    hp_base = memory_hotplug_take(&hp_len, &slot);
    for (u64 a = hp_base; a < hp_base + hp_len; a += HP_STRIDE)
        *(volatile u64 *)a = hp_word(a);
    puts_("EXITLESS SNAPHP memory base=");
    put_hex(hp_base);
    puts_(" bytes=");
    put_u64(hp_len);
    puts_("\n");
    int disk = hotplug_wait_disk();
    const char *why = virtio_blk_setup_at("irq=poll", (u8)disk);
    if (why)
        hp_fail(why);
    virtio_blk_pattern_check(HP_BLOCKS);
    hp_line("disk slot=", (u64)disk);
    hp_cpu = hotplug_wait_cpu();
    ap_service = hp_cpu_service;
    if (!start_ap((u32)hp_cpu))
        hp_fail("the added CPU did not start");
    hp_line("cpu id=", hp_cpu);
    if (find_arg(cmdline, "balloon=")) {
        if ((why = virtio_balloon_setup("")))
            hp_fail(why);
        hp_balloon = virtio_balloon_inflate_target(HP_BALLOON_BASE);
    }
}

void snapshot_hotplug_round(u64 t)
{
    u64 bad = 0;
    for (u64 a = hp_base; a < hp_base + hp_len; a += HP_STRIDE)
        bad += *(volatile u64 *)a != hp_word(a);
    *(volatile u64 *)(hp_base + 8) = t + 1;
    bad += *(volatile u64 *)(hp_base + 8) != t + 1;
    hp_mem_bad += bad;
    u64 disk_bad = virtio_blk_pattern_verify(HP_BLOCKS);
    hp_disk_bad += disk_bad;
    u64 before = hp_wakes;
    mmio_write32(APIC_BASE + 0x310, (u32)hp_cpu << 24);
    mmio_write32(APIC_BASE + 0x300, VEC_IPI); /* fixed, physical destination */
    for (u64 start = rdtsc(); hp_wakes == before;)
        if (rdtsc() - start > HP_WAIT)
            hp_fail("the added CPU did not wake for its IPI");
    hp_rounds++;
    puts_("EXITLESS SNAPHP n=");
    put_u64(t);
    puts_(" mem_bad=");
    put_u64(bad);
    puts_(" disk_bad=");
    put_u64(disk_bad);
    puts_(" wakes=");
    put_u64(hp_wakes);
    puts_(" balloon=");
    put_u64(hp_balloon ? virtio_balloon_actual() : 0);
    puts_("\n");
}

int snapshot_hotplug_ok(void)
{
    int balloon_ok = !hp_balloon || virtio_balloon_actual() == hp_balloon;
    return hp_rounds && !hp_mem_bad && !hp_disk_bad && balloon_ok;
}
