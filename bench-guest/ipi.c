/*
 * The IPI and TLB shootdown cases: vCPU 0 (the initiator) sends IPIs through the x2APIC ICR of
 * the in-kernel LAPIC, or shoots down a mapping as a guest kernel does (change a PTE, invlpg
 * locally, IPI every other vCPU, wait for each one's acknowledgement); the other vCPUs spin at
 * CPL3, as user threads of one process would, reading the mapping (so their TLBs hold it), and
 * acknowledge in their CPL0 handlers.
 *
 *   EXITLESS IPI <probe fields>                       what this guest found (x2APIC, KVM PV)
 *   EXITLESS RESULT case=<name> ... cpus=<n> targets=<per op> acks=<a0,a1,..> skips=<s0,..>
 *                   stale=<n> preempted_skips=<n>
 *
 * acks: per vCPU, the interrupts its handler acknowledged during the loop; skips: per vCPU,
 * shootdowns the initiator did not IPI it for because KVM said it was preempted (PV TLB flush:
 * KVM flushes its TLB before it runs again). Every target must have acks + skips = iters.
 * Keep the handlers short: guest CPL0 code is instruction-emulated on PVM (~1 us/instr).
 */
#include "guest.h"

#define IPI_MAX_CPUS (MAX_APS + 1)
#define MSR_APIC_BASE 0x1b
#define MSR_X2APIC_ID 0x802
#define MSR_X2APIC_SVR 0x80f
#define MSR_X2APIC_ICR 0x830
#define MSR_GS_BASE 0xc0000101
#define MSR_KVM_STEAL_TIME 0x4b564d03
#define KVM_HC_SEND_IPI 10
#define KVM_FEATURE_STEAL_TIME (1u << 5)
#define KVM_FEATURE_PV_TLB_FLUSH (1u << 9)
#define KVM_FEATURE_PV_SEND_IPI (1u << 11)
#define KVM_VCPU_PREEMPTED 1
#define KVM_VCPU_FLUSH_TLB 2
#define ICR_ALL_BUT_SELF (3u << 18)
/* The flushed mapping: one 4 KiB page at 4 GiB, above the static identity map. */
#define FLUSH_VA 0x100000000UL
#define IPI_WAIT_CYCLES 30000000000UL

enum ipi_kind { UNICAST, BROADCAST, SHOOTDOWN, SHOOTDOWN_PV_IPI, SHOOTDOWN_PV_FLUSH };

static const struct {
    const char *name;
    enum ipi_kind kind;
} ipi_cases[] = {
    {"ipi_unicast", UNICAST},
    {"ipi_broadcast", BROADCAST},
    {"tlb_shootdown", SHOOTDOWN},
    {"tlb_shootdown_pv_ipi", SHOOTDOWN_PV_IPI},
    {"tlb_shootdown_pv_flush", SHOOTDOWN_PV_FLUSH},
};

/* Per vCPU, by x2APIC ID; %gs points at the vCPU's own (the handlers use %gs:0 and %gs:8). */
struct percpu {
    volatile u64 acks;  /* written by its handler only */
    volatile u64 stale; /* handler reads through FLUSH_VA that saw the previous frame */
    volatile u64 skips; /* written by the initiator only */
    u64 pad[5];
} __attribute__((aligned(64)));

struct kvm_steal_time {
    u64 steal;
    u32 version, flags;
    u8 preempted, pad8[3];
    u32 pad[11];
} __attribute__((aligned(64)));

static struct percpu percpu[IPI_MAX_CPUS];
static struct kvm_steal_time steal[IPI_MAX_CPUS];
static u64 flush_pd[512] __attribute__((aligned(4096)));
static u64 flush_pt[512] __attribute__((aligned(4096)));
static u32 frames[2][1024] __attribute__((aligned(4096)));
volatile u32 flush_expect;
volatile u64 gp_count;
static volatile u32 ipi_ready, ipi_marked, ipi_phase;
static enum ipi_kind kind;
static const char *case_name;
static int use_steal_time, use_vmmcall;
static u64 preempted_skips;

extern void ipi_ack_stub(void), tlb_flush_stub(void), gp_skip_stub(void), exc_stub_13(void);
extern u64 ud_count;

/* Handlers: EOI first (x2APIC EOI MSR), then acknowledge in the vCPU's own counter. */
__asm__(".text\n"
        ".globl ipi_ack_stub, tlb_flush_stub, gp_skip_stub\n"
        "ipi_ack_stub:\n"
        "  push %rax; push %rcx; push %rdx\n"
        "  xor %eax, %eax; xor %edx, %edx; mov $0x80b, %ecx; wrmsr\n"
        "  incq %gs:0\n"
        "  pop %rdx; pop %rcx; pop %rax\n"
        "  iretq\n"
        "tlb_flush_stub:\n"
        "  push %rax; push %rcx; push %rdx\n"
        "  movabs $0x100000000, %rax\n"
        "  invlpg (%rax)\n"
        "  mov (%rax), %ecx\n"
        "  cmp flush_expect(%rip), %ecx\n"
        "  je 1f\n"
        "  incq %gs:8\n"
        "1: xor %eax, %eax; xor %edx, %edx; mov $0x80b, %ecx; wrmsr\n"
        "  incq %gs:0\n"
        "  pop %rdx; pop %rcx; pop %rax\n"
        "  iretq\n"
        /* #GP while probing an MSR: drop the error code, skip the 2-byte wrmsr, count it. */
        "gp_skip_stub:\n"
        "  add $8, %rsp\n"
        "  addq $2, (%rsp)\n"
        "  incq gp_count(%rip)\n"
        "  iretq\n");

static inline u64 rdmsr(u32 msr)
{
    u32 lo, hi;
    __asm__ volatile("rdmsr" : "=a"(lo), "=d"(hi) : "c"(msr));
    return ((u64)hi << 32) | lo;
}

static inline void wrmsr(u32 msr, u64 v)
{
    __asm__ volatile("wrmsr" ::"c"(msr), "a"((u32)v), "d"((u32)(v >> 32)) : "memory");
}

static void cpuid(u32 leaf, u32 *a, u32 *b, u32 *c, u32 *d)
{
    __asm__ volatile("cpuid" : "=a"(*a), "=b"(*b), "=c"(*c), "=d"(*d) : "a"(leaf), "c"(0));
}

static void x2apic_send(u32 dest, u32 icr)
{
    wrmsr(MSR_X2APIC_ICR, ((u64)dest << 32) | icr);
}

/* KVM_HC_SEND_IPI: a bitmap of APIC IDs from `min`; returns how many got it. */
static u64 pv_send_ipi(u64 bitmap, u32 min, u32 vector)
{
    u64 ret = KVM_HC_SEND_IPI;
    if (use_vmmcall)
        __asm__ volatile("vmmcall" : "+a"(ret) : "b"(bitmap), "c"(0UL), "d"((u64)min), "S"((u64)vector) : "memory");
    else
        __asm__ volatile("vmcall" : "+a"(ret) : "b"(bitmap), "c"(0UL), "d"((u64)min), "S"((u64)vector) : "memory");
    return ret;
}

static void ipi_fail(const char *what)
{
    puts_("EXITLESS ERROR ipi: ");
    puts_(what);
    puts_("\n");
    guest_exit(3);
}

/* Spins until *counter reaches want; fails the run after IPI_WAIT_CYCLES. */
static void wait_for(volatile u64 *counter, u64 want, const char *what)
{
    for (u64 start = rdtsc(); *counter < want;) {
        if (rdtsc() - start > IPI_WAIT_CYCLES)
            ipi_fail(what);
        __asm__ volatile("pause");
    }
}

static void wait_u32(volatile u32 *v, u32 want, const char *what)
{
    for (u64 start = rdtsc(); *v < want;) {
        if (rdtsc() - start > IPI_WAIT_CYCLES)
            ipi_fail(what);
        __asm__ volatile("pause");
    }
}

/* Switches this vCPU's LAPIC to x2APIC mode, points %gs at its per-vCPU data, registers its
 * steal-time area when the case uses it; returns its x2APIC ID. */
static u32 ipi_cpu_setup(void)
{
    load_idt();
    wrmsr(MSR_APIC_BASE, rdmsr(MSR_APIC_BASE) | (1u << 11) | (1u << 10));
    wrmsr(MSR_X2APIC_SVR, 0x1ff); /* software enable */
    u32 id = (u32)rdmsr(MSR_X2APIC_ID);
    if (id >= IPI_MAX_CPUS)
        ipi_fail("x2APIC ID beyond the per-vCPU table");
    wrmsr(MSR_GS_BASE, (u64)&percpu[id]);
    if (use_steal_time)
        wrmsr(MSR_KVM_STEAL_TIME, (u64)&steal[id] | 1);
    return id;
}

/* A CPL3 stack, a TSS (its own CPL0 stack for interrupts, an I/O bitmap open to the ports
 * below 0x800) and a GDT per AP: the shared ones serve vCPU 0 only. */
TSS64_WITH_IO_BITMAP(ap_tss, 256);

static struct ap_tss ap_tss[IPI_MAX_CPUS] __attribute__((aligned(64)));
static u64 ap_gdt[IPI_MAX_CPUS][8] __attribute__((aligned(64)));
static u8 ap_trap_stack[IPI_MAX_CPUS][2048] __attribute__((aligned(16)));
static u8 ap_user_stack[IPI_MAX_CPUS][2048] __attribute__((aligned(16)));
extern u64 gdt[];

static void ap_load_tss(u32 id)
{
    struct ap_tss *t = &ap_tss[id];
    u64 base = (u64)t, limit = sizeof(*t) - 1;
    t->rsp[0] = (u64)(ap_trap_stack[id + 1]);
    t->iomap_base = (u16)__builtin_offsetof(struct ap_tss, iomap);
    t->iomap[256] = 0xff;
    for (int i = 0; i < 8; i++)
        ap_gdt[id][i] = gdt[i];
    ap_gdt[id][SEL_TSS / 8] = (limit & 0xffff) | ((base & 0xffffff) << 16) | (0x89UL << 40) |
                              (((limit >> 16) & 0xf) << 48) | (((base >> 24) & 0xff) << 56);
    ap_gdt[id][SEL_TSS / 8 + 1] = base >> 32;
    struct { u16 limit; u64 base; } __attribute__((packed)) gdtr = {sizeof(ap_gdt[id]) - 1, (u64)ap_gdt[id]};
    __asm__ volatile("lgdt %0; ltr %w1" ::"m"(gdtr), "r"(SEL_TSS));
}

/* At CPL3 (native on PVM, as a guest's user threads run): read the mapping until vCPU 0 says
 * the loop is over, marking its begin and end so that the host reads this vCPU's KVM counters
 * over the same span; interrupts come in through the TSS. */
static void __attribute__((noreturn)) ap_user_loop(void)
{
    while (ipi_phase == 0)
        __asm__ volatile("pause");
    outl(MARKER_PORT, MARKER_BEGIN);
    __atomic_fetch_add(&ipi_marked, 1, __ATOMIC_RELEASE);
    while (ipi_phase == 1)
        (void)*(volatile u32 *)FLUSH_VA;
    outl(MARKER_PORT, MARKER_END);
    __atomic_fetch_add(&ipi_marked, 1, __ATOMIC_RELEASE);
    for (;;)
        __asm__ volatile("pause");
}

/* The vCPUs other than 0: set up, then run ap_user_loop at CPL3 with interrupts on. */
static void ipi_ap_main(void)
{
    u32 id = ipi_cpu_setup();
    ap_load_tss(id);
    __atomic_fetch_add(&ipi_ready, 1, __ATOMIC_RELEASE);
    __asm__ volatile("pushq %0; pushq %1; pushq $0x202; pushq %2; pushq %3; iretq"
                     ::"i"(SEL_UDATA), "r"((u64)ap_user_stack[id + 1]), "i"(SEL_UCODE),
                     "r"((u64)ap_user_loop)
                     : "memory");
}

static int kvm_pv_features(u32 *features)
{
    u32 a, b, c, d;
    cpuid(0x40000000, &a, &b, &c, &d);
    if (b != 0x4b4d564b || c != 0x564b4d56 || d != 0x4d)
        return 0;
    cpuid(0x40000001, features, &b, &c, &d);
    return 1;
}

/* Whether the CPU is AMD's (vmmcall) rather than Intel's (vmcall). */
static int amd_vendor(void)
{
    u32 a, b, c, d;
    cpuid(0, &a, &b, &c, &d);
    return b == 0x68747541 /* Auth */ || b == 0x6f677948 /* Hygo */;
}

/* Registers the steal-time area with #GP caught: 0 when KVM refused it. */
static int steal_time_accepted(void)
{
    set_gate(13, gp_skip_stub, 0x8e);
    u64 before = gp_count;
    wrmsr(MSR_KVM_STEAL_TIME, (u64)&steal[0] | 1);
    set_gate(13, exc_stub_13, 0x8e);
    return gp_count == before;
}

int ipi_case(const char *want)
{
    for (u64 i = 0; i < sizeof(ipi_cases) / sizeof(ipi_cases[0]); i++)
        if (arg_is(want, "", ipi_cases[i].name)) {
            kind = ipi_cases[i].kind;
            case_name = ipi_cases[i].name;
            return 1;
        }
    return 0;
}

static void map_flush_page(u32 frame)
{
    flush_pt[0] = (u64)frames[frame] | 0x7; /* P | RW | US */
}

/* Before the APs start: the flushed mapping and the PV probes. Returns why the case cannot
 * run here, or 0 (and the APs will serve IPIs). */
const char *ipi_prepare(u64 cpus)
{
    u32 a, b, c, d, pv = 0;
    cpuid(1, &a, &b, &c, &d);
    int x2apic = (c >> 21) & 1, kvm = kvm_pv_features(&pv);
    puts_("EXITLESS IPI x2apic=");
    put_u64((u64)x2apic);
    puts_(" kvm_leaves=");
    put_u64((u64)kvm);
    puts_(" kvm_pv_features=");
    put_hex(pv);
    puts_("\n");
    if (!x2apic)
        return "no-x2apic-in-cpuid";
    if (kind == BROADCAST && cpus < 2)
        return "broadcast-needs-a-second-vcpu";
    if (kind == SHOOTDOWN_PV_IPI && !(pv & KVM_FEATURE_PV_SEND_IPI))
        return "kvm-offers-no-PV_SEND_IPI";
    if (kind == SHOOTDOWN_PV_FLUSH) {
        if (!(pv & KVM_FEATURE_STEAL_TIME) || !(pv & KVM_FEATURE_PV_TLB_FLUSH))
            return "kvm-offers-no-STEAL_TIME+PV_TLB_FLUSH";
        if (!steal_time_accepted())
            return "MSR_KVM_STEAL_TIME-write-raised-#GP";
        use_steal_time = 1;
    }
    use_vmmcall = amd_vendor();
    frames[0][0] = 0;
    frames[1][0] = 1;
    u64 cr3;
    __asm__ volatile("mov %%cr3, %0" : "=r"(cr3));
    u64 *pml4 = (u64 *)(cr3 & ~0xfffUL);
    u64 *pdpt = (u64 *)(pml4[0] & ~0xfffUL);
    flush_pd[0] = (u64)flush_pt | 0x7;
    map_flush_page(0);
    pdpt[FLUSH_VA >> 30] = (u64)flush_pd | 0x7;
    __asm__ volatile("mov %0, %%cr3" ::"r"(cr3) : "memory");
    flush_expect = 0;
    set_gate(VEC_IPI_ACK, ipi_ack_stub, 0x8e);
    set_gate(VEC_TLB_FLUSH, tlb_flush_stub, 0x8e);
    ap_service = ipi_ap_main;
    return 0;
}

/* PV send-IPI works here only if a hypercall reaches KVM: one to vCPU 0 itself, with the
 * CPU's own instruction, then the other vendor's (KVM may patch or emulate either). */
static const char *probe_pv_send_ipi(void)
{
    for (int tries = 0; tries < 2; tries++, use_vmmcall = !use_vmmcall) {
        u64 uds = ud_count, acks = percpu[0].acks;
        u64 got = pv_send_ipi(1, 0, VEC_IPI_ACK);
        if (ud_count != uds)
            continue;
        if (got != 1)
            return "KVM_HC_SEND_IPI-returned-an-error";
        wait_for(&percpu[0].acks, acks + 1, "PV send-IPI to itself never arrived");
        return 0;
    }
    return "vmcall-and-vmmcall-at-CPL0-raise-#UD-here";
}

/* ---- one operation of each kind; `cpus` vCPUs, vCPU 0 initiating ---- */

static void op_unicast(u64 cpus)
{
    u32 t = cpus > 1 ? 1 : 0; /* alone, vCPU 0 interrupts itself */
    u64 want = percpu[t].acks + 1;
    x2apic_send(t, VEC_IPI_ACK);
    wait_for(&percpu[t].acks, want, "unicast IPI not acknowledged");
}

static void op_broadcast(u64 cpus)
{
    u64 want = percpu[1].acks + 1;
    x2apic_send(0, ICR_ALL_BUT_SELF | VEC_IPI_ACK);
    for (u64 t = 1; t < cpus; t++)
        wait_for(&percpu[t].acks, want, "broadcast IPI not acknowledged");
}

/* Whether target t needs no IPI: KVM marked it preempted, and will flush its TLB before it
 * runs again once asked (Linux's kvm_flush_tlb_multi). */
static int flushed_by_kvm(u64 t)
{
    u8 state = __atomic_load_n(&steal[t].preempted, __ATOMIC_ACQUIRE);
    if (!(state & KVM_VCPU_PREEMPTED))
        return 0;
    return __atomic_compare_exchange_n(&steal[t].preempted, &state, state | KVM_VCPU_FLUSH_TLB, 0,
                                       __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

static void op_shootdown(u64 cpus, u64 gen)
{
    u64 want[IPI_MAX_CPUS], bitmap = 0;
    flush_expect = (u32)(gen & 1);
    map_flush_page((u32)(gen & 1));
    __asm__ volatile("invlpg (%0)" ::"r"(FLUSH_VA) : "memory");
    for (u64 t = 1; t < cpus; t++) {
        want[t] = percpu[t].acks + 1;
        if (kind == SHOOTDOWN_PV_FLUSH && flushed_by_kvm(t)) {
            percpu[t].skips++;
            preempted_skips++;
            want[t]--;
        } else if (kind == SHOOTDOWN_PV_IPI) {
            bitmap |= 1UL << t;
        } else {
            x2apic_send((u32)t, VEC_TLB_FLUSH);
        }
    }
    if (bitmap)
        pv_send_ipi(bitmap, 0, VEC_TLB_FLUSH);
    for (u64 t = 1; t < cpus; t++)
        wait_for(&percpu[t].acks, want[t], "shootdown not acknowledged");
}

static u64 run_ops(u64 n, u64 cpus)
{
    u64 t0 = rdtsc();
    for (u64 i = 1; i <= n; i++) {
        if (kind == UNICAST)
            op_unicast(cpus);
        else if (kind == BROADCAST)
            op_broadcast(cpus);
        else
            op_shootdown(cpus, i);
    }
    return rdtsc() - t0;
}

static u64 empty_ops(u64 n)
{
    u64 t0 = rdtsc();
    for (; n; n--)
        __asm__ volatile("" ::: "memory");
    return rdtsc() - t0;
}

static void put_list(const char *key, u64 cpus, int acks)
{
    puts_(key);
    for (u64 t = 0; t < cpus; t++) {
        if (t)
            puts_(",");
        put_u64(acks ? percpu[t].acks : percpu[t].skips);
    }
}

static void report(const char *name, u64 n, u64 cpus, u64 cycles, u64 empty)
{
    u64 stale = 0;
    for (u64 t = 0; t < cpus; t++)
        stale += percpu[t].stale;
    puts_("EXITLESS RESULT case=");
    puts_(name);
    puts_(" cpl=0 iters=");
    put_u64(n);
    puts_(" cycles=");
    put_u64(cycles);
    puts_(" empty=");
    put_u64(empty);
    puts_(" ipis=0 uds=");
    put_u64(ud_count);
    puts_(" cpus=");
    put_u64(cpus);
    puts_(" targets=");
    put_u64(kind == UNICAST ? 1 : cpus - 1);
    put_list(" acks=", cpus, 1);
    put_list(" skips=", cpus, 0);
    puts_(" stale=");
    put_u64(stale);
    puts_(" preempted_skips=");
    put_u64(preempted_skips);
    puts_(" vmmcall=");
    put_u64((u64)use_vmmcall);
    if (use_steal_time) {
        u64 versions = 0;
        for (u64 t = 0; t < cpus; t++)
            versions += steal[t].version;
        puts_(" steal_version=");
        put_u64(versions);
    }
    puts_("\n");
}

/* Runs the named case on `cpus` vCPUs (after ipi_prepare and the APs' start) and ends. */
void ipi_main(u64 iters, u64 cpus, const char *why)
{
    if (!why && cpus > 1 && ipi_ready + 1 < cpus)
        wait_u32(&ipi_ready, (u32)cpus - 1, "not every vCPU came up to serve IPIs");
    if (!why) {
        ipi_cpu_setup();
        __asm__ volatile("sti");
        if (kind == SHOOTDOWN_PV_IPI)
            why = probe_pv_send_ipi();
    }
    if (why) {
        ap_service = 0;
        ipi_phase = 2;
        puts_("EXITLESS SKIP case=");
        puts_(case_name);
        puts_(" reason=");
        puts_(why);
        puts_("\n");
        return;
    }
    u64 empty = empty_ops(iters);
    for (u64 t = 0; t < cpus; t++)
        percpu[t].acks = 0;
    ud_count = 0;
    ipi_phase = 1;
    wait_u32(&ipi_marked, (u32)cpus - 1, "a vCPU did not mark the loop's begin");
    outl(MARKER_PORT, MARKER_BEGIN);
    u64 cycles = run_ops(iters, cpus);
    outl(MARKER_PORT, MARKER_END);
    ipi_phase = 2;
    wait_u32(&ipi_marked, 2 * ((u32)cpus - 1), "a vCPU did not mark the loop's end");
    __asm__ volatile("cli");
    report(case_name, iters, cpus, cycles, empty);
}
