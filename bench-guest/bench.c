/*
 * The exitless bench guest: runs each exit kind in a tight loop, times it with
 * rdtsc, subtracts the empty loop, and prints one result line per case on COM1:
 *
 *   EXITLESS RESULT case=<name> cpl=<0|3> iters=<n> cycles=<loop> empty=<empty loop> ipis=<n> uds=<n>
 *
 * The command line (PVH cmdline) selects "case=<name>" and "iters=<n>"; with no
 * case, every case this machine can run is run in turn (for QEMU and other VMMs).
 */
#include "guest.h"
#include "virtio.h"

extern u64 ud_count, ud_rip;
static u8 user_stack[16384] __attribute__((aligned(16)));


/* ---- measured loops: n iterations each, one exiting instruction per iteration ---- */

#define LOOP(name, setup, insn, ...)                                                     \
    static u64 loop_##name(u64 n)                                                        \
    {                                                                                    \
        setup;                                                                           \
        __asm__ volatile("1: " insn "\n dec %%rcx\n jnz 1b" : "+c"(n) : __VA_ARGS__);     \
        return 0;                                                                        \
    }

LOOP(empty, (void)0, "", "r"(0))
LOOP(pio_out, (void)0, "outl %%eax, %%dx", "a"(BENCH_MAGIC), "d"(BENCH_PORT))
LOOP(pio_in, (void)0, "inl %%dx, %%eax", "d"(BENCH_PORT) : "rax")
LOOP(mmio_write, (void)0, "movl %%eax, (%%rdx)", "a"(BENCH_MAGIC), "d"((u64)BENCH_MMIO))
LOOP(mmio_read, (void)0, "movl (%%rdx), %%esi", "d"((u64)BENCH_MMIO) : "rsi")

static u64 loop_cpuid(u64 n)
{
    for (; n; n--) {
        u32 a = 0, b, c = 0, d;
        __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
    }
    return 0;
}

static u64 loop_msr_read(u64 n)
{
    for (; n; n--) {
        u32 lo, hi;
        __asm__ volatile("rdmsr" : "=a"(lo), "=d"(hi) : "c"(BENCH_MSR));
    }
    return 0;
}

static u64 loop_msr_write(u64 n)
{
    for (; n; n--)
        __asm__ volatile("wrmsr" ::"a"(0), "d"(0), "c"(BENCH_MSR));
    return 0;
}

static u64 loop_hypercall(u64 n)
{
    for (; n; n--) {
        u64 nr = 1; /* KVM_HC_VAPIC_POLL_IRQ: a no-op hypercall */
        __asm__ volatile("vmcall" : "+a"(nr)::"rbx", "rcx", "rdx", "rsi", "memory");
    }
    return 0;
}

static u64 loop_cr8(u64 n)
{
    u64 v = 0;
    for (; n; n--) {
        v ^= 1;
        __asm__ volatile("mov %0, %%cr8" ::"r"(v));
    }
    __asm__ volatile("mov %0, %%cr8" ::"r"(0UL));
    return 0;
}

static u64 loop_hlt(u64 n)
{
    for (; n; n--)
        __asm__ volatile("hlt");
    return 0;
}

static void send_self_ipi(void)
{
    mmio_write32(APIC_BASE + 0x300, (1u << 18) | VEC_IPI); /* shorthand: self, fixed */
}

static u64 loop_self_ipi(u64 n)
{
    __asm__ volatile("sti");
    for (u64 want = ipi_count + 1; n; n--, want++) {
        send_self_ipi();
        while (*(volatile u64 *)&ipi_count != want) /* wait for the handler */
            __asm__ volatile("pause");
    }
    __asm__ volatile("cli");
    return 0;
}

static u64 loop_hlt_ipi(u64 n)
{
    for (; n; n--) {
        send_self_ipi(); /* pending while IF=0, so hlt wakes at once */
        __asm__ volatile("sti; hlt; cli");
    }
    return 0;
}

/* The empty loops mirror each case's loop shape without the exiting instruction. */
static u64 loop_empty_c(u64 n)
{
    for (; n; n--)
        __asm__ volatile("" ::: "memory");
    return 0;
}

/* NAMED: only when the command line names the case (it writes to the guest's disk). */
enum needs { ANY, NEEDS_LAPIC, NEEDS_NO_LAPIC, NAMED };

struct bench_case {
    const char *name;
    int cpl;
    enum needs needs;
    u64 (*loop)(u64);
    u64 (*empty)(u64);
    /* Run at CPL3 before the case with the command line: 0, or why the case cannot run. */
    const char *(*setup)(const char *cmdline);
    /* Appends the case's own fields to its result line. */
    void (*report)(void);
};

static const struct bench_case cases[] = {
    {"pio_out", 3, ANY, loop_pio_out, loop_empty, 0, 0},
    {"pio_in", 3, ANY, loop_pio_in, loop_empty, 0, 0},
    {"mmio_write", 3, ANY, loop_mmio_write, loop_empty, 0, 0},
    {"mmio_read", 3, ANY, loop_mmio_read, loop_empty, 0, 0},
    {"pio_out_cpl0", 0, ANY, loop_pio_out, loop_empty, 0, 0},
    {"cpuid", 0, ANY, loop_cpuid, loop_empty_c, 0, 0},
    {"hypercall", 0, ANY, loop_hypercall, loop_empty_c, 0, 0},
    {"msr_read", 0, ANY, loop_msr_read, loop_empty_c, 0, 0},
    {"msr_write", 0, ANY, loop_msr_write, loop_empty_c, 0, 0},
    {"cr8", 0, ANY, loop_cr8, loop_empty_c, 0, 0},
    {"hlt", 0, NEEDS_NO_LAPIC, loop_hlt, loop_empty_c, 0, 0},
    {"hlt_ipi", 0, NEEDS_LAPIC, loop_hlt_ipi, loop_empty_c, 0, 0},
    {"self_ipi", 0, NEEDS_LAPIC, loop_self_ipi, loop_empty_c, 0, 0},
    {"virtio_blk", 3, NAMED, loop_virtio_blk, loop_empty_c, virtio_blk_setup, report_virtio_blk},
    {"virtio_check", 3, NAMED, loop_virtio_check, loop_empty_c, virtio_blk_setup, 0},
    {"virtio_blk_hostile", 3, NAMED, loop_virtio_blk_hostile, loop_empty_c, virtio_blk_setup, 0},
    {"virtio_net", 3, NAMED, loop_virtio_net, loop_empty_c, virtio_net_setup, report_virtio_net},
    {"net_check", 3, NAMED, loop_net_check, loop_empty_c, virtio_net_setup, 0},
    {"virtio_vsock", 3, NAMED, loop_virtio_vsock, loop_empty_c, virtio_vsock_setup, report_virtio_vsock},
    {"vsock_check", 3, NAMED, loop_vsock_check, loop_empty_c, virtio_vsock_setup, 0},
    {"hotplug_disk", 3, NAMED, loop_hotplug_disk, loop_empty_c, hotplug_disk_setup, 0},
    {"hotplug_cpu", 0, NAMED, loop_hotplug_cpu, loop_empty_c, 0, 0},
    {"memory_hotplug_check", 3, NAMED, loop_memory_hotplug_check, loop_empty_c, 0, 0},
    {"hostile_vsock", 3, NAMED, loop_hostile_vsock, loop_empty_c, hostile_vsock_setup, 0},
    {"hostile_toggle", 3, NAMED, loop_hostile_toggle, loop_empty_c, hostile_toggle_setup, 0},
    {"hostile_eject", 3, NAMED, loop_hostile_eject, loop_empty_c, hostile_eject_setup, 0},
    {"virtio_fs", 3, NAMED, loop_virtio_fs, loop_empty_c, virtio_fs_bench_setup, report_virtio_fs},
    {"fs_check", 3, NAMED, loop_fs_check, loop_empty_c, virtio_fs_setup, 0},
    {"fs_hostile", 3, NAMED, loop_fs_hostile, loop_empty_c, virtio_fs_setup, 0},
    {"balloon_check", 3, NAMED, loop_balloon_check, loop_empty_c, virtio_balloon_setup, 0},
    {"pmem_check", 3, NAMED, loop_pmem_check, loop_empty_c, virtio_pmem_setup, 0},
    {"power_button", 3, NAMED, loop_power_button, loop_empty_c, operations_setup, 0},
    {"nmi_check", 3, NAMED, loop_nmi_check, loop_empty_c, operations_setup, 0},
    {"resize_check", 3, NAMED, loop_resize_check, loop_empty_c, operations_setup, 0},
    {"dirty_write", 3, NAMED, loop_dirty_write, loop_empty_c, dirty_write_setup, report_dirty_write},
    {"migrate", 3, NAMED, loop_migrate, loop_empty_c, migrate_setup, report_migrate},
};
#define NR_CASES (sizeof(cases) / sizeof(cases[0]))

/* ---- running a case ---- */

struct timed_run {
    u64 (*loop)(u64);
    u64 iters;
    int marked;
};

static u64 timed(u64 arg)
{
    struct timed_run *r = (struct timed_run *)arg;
    if (r->marked)
        outl(MARKER_PORT, MARKER_BEGIN);
    u64 t0 = rdtsc();
    r->loop(r->iters);
    u64 t1 = rdtsc();
    if (r->marked)
        outl(MARKER_PORT, MARKER_END);
    return t1 - t0;
}

static u64 run_at(int cpl, struct timed_run *r)
{
    if (cpl == 3)
        return run_user(timed, (u64)r, user_stack + sizeof(user_stack));
    return timed((u64)r);
}

struct user_setup {
    const char *(*setup)(const char *cmdline);
    const char *cmdline;
};

static u64 setup_at_cpl3(u64 arg)
{
    struct user_setup *u = (struct user_setup *)arg;
    return (u64)u->setup(u->cmdline);
}

static void skip_case(const struct bench_case *c, const char *why);

static void run_case(const struct bench_case *c, u64 iters, const char *cmdline)
{
    if (c->setup) {
        struct user_setup u = {c->setup, cmdline};
        const char *why = (const char *)run_user(setup_at_cpl3, (u64)&u, user_stack + sizeof(user_stack));
        if (why) {
            skip_case(c, why);
            return;
        }
    }
    struct timed_run empty = {c->empty, iters, 0}, loop = {c->loop, iters, 1};
    u64 e = run_at(c->cpl, &empty);
    ipi_count = 0;
    ud_count = 0;
    u64 t = run_at(c->cpl, &loop);
    u64 e2 = run_at(c->cpl, &empty); /* the lower of two: one may have been preempted */
    if (e2 < e)
        e = e2;
    puts_("EXITLESS RESULT case=");
    puts_(c->name);
    puts_(" cpl=");
    put_u64((u64)c->cpl);
    puts_(" iters=");
    put_u64(iters);
    puts_(" cycles=");
    put_u64(t);
    puts_(" empty=");
    put_u64(e);
    puts_(" ipis=");
    put_u64(ipi_count);
    puts_(" uds=");
    put_u64(ud_count);
    if (ud_count) {
        puts_(" ud_rip=");
        put_hex(ud_rip);
    }
    if (c->report)
        c->report();
    puts_("\n");
    user_rflags = 0x2;
}

static void skip_case(const struct bench_case *c, const char *why)
{
    puts_("EXITLESS SKIP case=");
    puts_(c->name);
    puts_(" reason=");
    puts_(why);
    puts_("\n");
}

static int runnable(const struct bench_case *c, int lapic, int named)
{
    if (c->needs == NAMED && !named) {
        skip_case(c, "writes-to-the-disk:name-it-with-case=");
        return 0;
    }
    if (c->needs == NEEDS_LAPIC && !lapic) {
        skip_case(c, "no-lapic");
        return 0;
    }
    if (c->needs == NEEDS_NO_LAPIC && lapic) {
        skip_case(c, "lapic-present");
        return 0;
    }
    return 1;
}

void bench_main(u32 start_info_addr)
{
    const struct hvm_start_info *si = (const struct hvm_start_info *)(u64)start_info_addr;
    const char *cmdline = si && si->cmdline_paddr ? (const char *)si->cmdline_paddr : "";
    find_ram_end(si);
    setup_cpu();
    puts_("EXITLESS START version=1\n");
    const char *want = find_arg(cmdline, "case=");
    /* case=idle: up, then idle for good (compare --density): the first line, DONE, and a
     * halt with interrupts off that nothing wakes, so the VMM's vCPU thread sleeps. */
    if (want && word_eq(want, "idle")) {
        puts_("EXITLESS DONE\n");
        for (;;)
            __asm__ volatile("cli; hlt");
    }
    /* case=prompt: a line left without its newline (a login prompt), then idle as above: a
     * console that takes whole lines must still show it (the VMM's partial-line flush). */
    if (want && word_eq(want, "prompt")) {
        puts_("login: ");
        for (;;)
            __asm__ volatile("cli; hlt");
    }
    u64 iters = parse_u64(find_arg(cmdline, "iters="));
    if (!iters)
        iters = 1000;
    mask_legacy_pic();
    int lapic = lapic_present();
    if (lapic)
        lapic_enable();
    u64 cpus = parse_u64(find_arg(cmdline, "smp="));
    smp_coalesced_writes = parse_u64(find_arg(cmdline, "coalesced="));
    if (cpus > MAX_APS + 1)
        cpus = MAX_APS + 1;
    if (want && word_eq(want, "snapshot"))
        snapshot_main(cmdline);
    int ipi = want && ipi_case(want);
    const char *ipi_why = !ipi ? 0 : lapic ? ipi_prepare(cpus ? cpus : 1) : "no-lapic";
    if (cpus > 1 && lapic)
        start_aps(cpus);
    if (ipi) {
        ipi_main(iters, cpus ? cpus : 1, ipi_why);
        puts_("EXITLESS DONE\n");
        guest_exit(0);
    }
    if (cpus && !want) {
        puts_("EXITLESS DONE\n");
        guest_exit(0);
    }
    int ran = 0;
    for (u64 i = 0; i < NR_CASES; i++) {
        const struct bench_case *c = &cases[i];
        if (want && !word_eq(want, c->name))
            continue;
        if (runnable(c, lapic, want != 0))
            run_case(c, iters, cmdline);
        ran++;
    }
    if (!ran)
        puts_("EXITLESS ERROR unknown case\n");
    /* `hold`: stay halted instead of ending, so that a tool can read the VM's counters
     * (KVM's statistics, the VMM's memory, a core dump) once the guest is done. Looked up
     * before DONE is printed: a VM paused on that line is then already at its halt, not
     * scanning the command line (hundreds of emulated instructions at CPL0). */
    int hold = find_arg(cmdline, "hold") != 0;
    puts_("EXITLESS DONE\n");
    if (hold)
        for (;;)
            __asm__ volatile("cli; hlt");
    guest_exit(ran ? 0 : 2);
}
