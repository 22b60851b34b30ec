/* The application processors: INIT-SIPI-SIPI to all of them at boot or to one hot-added
 * CPU; each reports its APIC ID on the console, then serves `ap_service` or halts. */
#include "guest.h"

extern char ap_trampoline[], ap_trampoline_end[];

/* ---- SMP: INIT-SIPI-SIPI to every other CPU; each reports its APIC ID ---- */

static volatile u32 aps_up;
static volatile u32 console_lock;
/* coalesced=N (with smp=): each CPU writes N values to BENCH_MMIO, (cpu << 24) | sequence,
 * all at once, so that several vCPUs fill and drain one coalesced ring together. */
volatile u64 smp_coalesced_writes;
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

void start_aps(u64 cpus)
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
