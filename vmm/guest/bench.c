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

struct hvm_start_info {
    u32 magic, version, flags, nr_modules;
    u64 modlist_paddr, cmdline_paddr, rsdp_paddr, memmap_paddr;
    u32 memmap_entries, reserved;
};

struct hvm_memmap_entry {
    u64 addr, size;
    u32 type, reserved;
};

u64 ram_end;

/* The end of the RAM range that holds the guest's image (1 MiB), from the PVH memory map. */
static void find_ram_end(const struct hvm_start_info *si)
{
    if (!si || si->version < 1)
        return;
    const struct hvm_memmap_entry *m = (const struct hvm_memmap_entry *)si->memmap_paddr;
    for (u32 i = 0; m && i < si->memmap_entries; i++)
        if (m[i].type == 1 && m[i].addr <= 0x100000 && m[i].addr + m[i].size > 0x100000)
            ram_end = m[i].addr + m[i].size;
}

TSS64_WITH_IO_BITMAP(tss64, 8192);

struct idt_gate {
    u16 off_lo, sel;
    u8 ist, attr;
    u16 off_mid;
    u32 off_hi, zero;
};

extern u64 gdt[];
extern struct { u16 limit; u64 base; } __attribute__((packed)) gdt_ptr;
extern u64 ud_count, ud_rip;
extern char ap_trampoline[], ap_trampoline_end[];
extern void ipi_stub(void), ud_stub(void), virtio_irq_stub(void);
#define X(v) extern void exc_stub_##v(void);
X(0) X(1) X(2) X(3) X(4) X(5) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(16) X(17) X(18) X(19)
#undef X

static struct tss64 tss __attribute__((aligned(64)));
static struct idt_gate idt[256] __attribute__((aligned(16)));
static u8 user_stack[16384] __attribute__((aligned(16)));
/* Where CPL3 code enters CPL0 (interrupts, #UD): its own stack, below nothing it could clobber. */
static u8 trap_stack[4096] __attribute__((aligned(16)));

void *memset(void *d, int c, u64 n)
{
    u8 *p = d;
    while (n--)
        *p++ = (u8)c;
    return d;
}

void *memcpy(void *d, const void *src, u64 n)
{
    u8 *p = d;
    const u8 *q = src;
    while (n--)
        *p++ = *q++;
    return d;
}

/* ---- console ---- */

static void putc_(char c) { outb(COM1_PORT, (u8)c); }

void puts_(const char *s)
{
    while (*s)
        putc_(*s++);
}

void put_u64(u64 v)
{
    char buf[21];
    int i = 20;
    buf[i] = 0;
    do {
        buf[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    puts_(&buf[i]);
}

void put_hex(u64 v)
{
    puts_("0x");
    for (int s = 60; s >= 0; s -= 4)
        putc_("0123456789abcdef"[(v >> s) & 0xf]);
}

/* Ends the VM: the exit port (exitless bench, QEMU isa-debug-exit), else an i8042 reset
 * (exitless run, QEMU with -no-reboot), else halts. */
void guest_exit(u32 status)
{
    outl(EXIT_PORT, status);
    outb(0x64, 0xfe);
    for (;;)
        __asm__ volatile("cli; hlt");
}

void guest_exception(u64 vector, u64 *frame)
{
    puts_("EXITLESS ERROR exception vector=");
    put_u64(vector);
    puts_(" frame=");
    put_hex(frame[0]);
    puts_(" ");
    put_hex(frame[1]);
    puts_(" ");
    put_hex(frame[2]);
    if (vector == 14) {
        u64 cr2;
        __asm__ volatile("mov %%cr2, %0" : "=r"(cr2));
        puts_(" cr2=");
        put_hex(cr2);
    }
    puts_("\n");
    guest_exit(3);
}

/* ---- CPU set-up: TSS with an all-open I/O bitmap (PVM forces IOPL 0), IDT ---- */

void set_gate(int vec, void (*fn)(void), u8 attr)
{
    u64 a = (u64)fn;
    idt[vec] = (struct idt_gate){(u16)a, SEL_KCODE, 0, attr, (u16)(a >> 16), (u32)(a >> 32), 0};
}

static void setup_cpu(void)
{
    u64 base = (u64)&tss, limit = sizeof(tss) - 1;
    tss.rsp[0] = (u64)(trap_stack + sizeof(trap_stack));
    tss.iomap_base = (u16)__builtin_offsetof(struct tss64, iomap);
    tss.iomap[8192] = 0xff;
    gdt[SEL_TSS / 8] = (limit & 0xffff) | ((base & 0xffffff) << 16) | (0x89UL << 40) |
                       (((limit >> 16) & 0xf) << 48) | (((base >> 24) & 0xff) << 56);
    gdt[SEL_TSS / 8 + 1] = base >> 32;
    __asm__ volatile("lgdt %0; ltr %w1" ::"m"(gdt_ptr), "r"(SEL_TSS));
#define X(v) set_gate(v, exc_stub_##v, 0x8e);
    X(0) X(1) X(2) X(3) X(4) X(5) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(16) X(17) X(18) X(19)
#undef X
    set_gate(6, ud_stub, 0x8e);
    set_gate(VEC_IPI, ipi_stub, 0x8e);
    set_gate(VEC_VIRTIO, virtio_irq_stub, 0x8e);
    load_idt();
}

void load_idt(void)
{
    struct { u16 limit; u64 base; } __attribute__((packed)) idtr = {sizeof(idt) - 1, (u64)idt};
    __asm__ volatile("lidt %0" ::"m"(idtr));
}

/* Masks every line of both 8259 PICs: firmware (SeaBIOS under QEMU) leaves the timer
 * unmasked at vector 8, which would arrive as a "double fault" once a case enables
 * interrupts. Only MSI and LAPIC vectors are used here. */
static void mask_legacy_pic(void)
{
    outb(0x21, 0xff);
    outb(0xa1, 0xff);
}

static int lapic_present(void)
{
    return mmio_read32(APIC_BASE + 0x30) != 0xffffffff;
}

static void lapic_enable(void)
{
    mmio_write32(APIC_BASE + 0xf0, 0x1ff); /* spurious vector register: software enable */
}

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
    {"virtio_fs", 3, NAMED, loop_virtio_fs, loop_empty_c, virtio_fs_bench_setup, report_virtio_fs},
    {"fs_check", 3, NAMED, loop_fs_check, loop_empty_c, virtio_fs_setup, 0},
    {"fs_hostile", 3, NAMED, loop_fs_hostile, loop_empty_c, virtio_fs_setup, 0},
    {"balloon_check", 3, NAMED, loop_balloon_check, loop_empty_c, virtio_balloon_setup, 0},
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

/* ---- SMP: INIT-SIPI-SIPI to every other CPU; each reports its APIC ID ---- */

static volatile u32 aps_up;
static volatile u32 console_lock;
/* coalesced=N (with smp=): each CPU writes N values to BENCH_MMIO, (cpu << 24) | sequence,
 * all at once, so that several vCPUs fill and drain one coalesced ring together. */
static volatile u64 smp_coalesced_writes;
/* What each AP does once up, instead of halting (the IPI cases: serve IPIs). */
void (*volatile ap_service)(void);

static void write_coalesced(u32 cpu)
{
    for (u64 i = 0; i < smp_coalesced_writes; i++)
        mmio_write32(BENCH_MMIO, (cpu << 24) | (u32)i);
}

static u32 apic_id_from_cpuid(void)
{
    u32 a = 1, b, c = 0, d;
    __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
    return b >> 24;
}

void ap_main(u32 index)
{
    u32 apic = apic_id_from_cpuid();
    while (__atomic_exchange_n(&console_lock, 1, __ATOMIC_ACQUIRE))
        ;
    puts_("EXITLESS CPU ap=");
    put_u64(index + 1);
    puts_(" apic=");
    put_u64(apic);
    puts_(" up\n");
    __atomic_store_n(&console_lock, 0, __ATOMIC_RELEASE);
    write_coalesced(index + 1);
    __atomic_fetch_add(&aps_up, 1, __ATOMIC_RELEASE);
    if (ap_service)
        ap_service();
}

static void delay_cycles(u64 cycles)
{
    u64 end = rdtsc() + cycles;
    while (rdtsc() < end)
        ;
}

static void send_to_others(u32 icr)
{
    mmio_write32(APIC_BASE + 0x300, (3u << 18) | icr); /* shorthand: all excluding self */
}

static void copy_trampoline(void);

static void start_aps(u64 cpus)
{
    copy_trampoline();
    send_to_others(0x4500);                           /* INIT, level assert */
    delay_cycles(10000000);
    for (int i = 0; i < 2; i++) {
        send_to_others(0x4600 | (AP_TRAMPOLINE >> 12)); /* STARTUP */
        delay_cycles(1000000);
    }
    write_coalesced(0);
    u64 deadline = rdtsc() + 20000000000UL;
    while (aps_up < cpus - 1 && rdtsc() < deadline)
        __asm__ volatile("pause");
    while (__atomic_exchange_n(&console_lock, 1, __ATOMIC_ACQUIRE))
        ;
    puts_("EXITLESS SMP cpus=");
    put_u64(cpus);
    puts_(" up=");
    put_u64(aps_up + 1);
    puts_(" bsp_apic=");
    put_u64(apic_id_from_cpuid());
    puts_("\n");
    __atomic_store_n(&console_lock, 0, __ATOMIC_RELEASE);
}

static void copy_trampoline(void)
{
    u8 *dst = (u8 *)AP_TRAMPOLINE;
    for (const char *p = ap_trampoline; p < ap_trampoline_end; p++)
        *dst++ = (u8)*p;
}

int start_ap(u32 apic)
{
    copy_trampoline();
    u32 before = aps_up;
    mmio_write32(APIC_BASE + 0x310, apic << 24);
    mmio_write32(APIC_BASE + 0x300, 0x4500);             /* INIT, level assert */
    delay_cycles(10000000);
    for (int i = 0; i < 2; i++) {
        mmio_write32(APIC_BASE + 0x310, apic << 24);
        mmio_write32(APIC_BASE + 0x300, 0x4600 | (AP_TRAMPOLINE >> 12)); /* STARTUP */
        delay_cycles(1000000);
    }
    for (u64 deadline = rdtsc() + 20000000000UL; aps_up == before;)
        if (rdtsc() > deadline)
            return 0;
    return 1;
}

/* ---- command line ---- */

static int word_eq(const char *a, const char *b)
{
    while (*a && *a != ' ' && *a == *b)
        a++, b++;
    return (*a == 0 || *a == ' ') && *b == 0;
}

const char *find_arg(const char *cmdline, const char *key)
{
    for (const char *p = cmdline; p && *p; p++) {
        if (p != cmdline && p[-1] != ' ')
            continue;
        const char *k = key, *q = p;
        while (*k && *q == *k)
            k++, q++;
        if (!*k)
            return q;
    }
    return 0;
}

u64 parse_u64(const char *s)
{
    u64 v = 0;
    while (s && *s >= '0' && *s <= '9')
        v = v * 10 + (u64)(*s++ - '0');
    return v;
}

int arg_is(const char *cmdline, const char *key, const char *value)
{
    const char *v = find_arg(cmdline, key);
    return v && word_eq(v, value);
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
    puts_("EXITLESS DONE\n");
    /* `hold`: stay halted instead of ending, so that a tool can read the VM's counters
     * (KVM's statistics, the VMM's memory) once the guest is done. */
    if (find_arg(cmdline, "hold"))
        for (;;)
            __asm__ volatile("cli; hlt");
    guest_exit(ran ? 0 : 2);
}
