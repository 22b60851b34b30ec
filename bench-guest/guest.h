/* What the bench guest's C files share: types, port and MMIO access, the console, the
 * command line, the CPL3 trampoline. */
#ifndef EXITLESS_GUEST_H
#define EXITLESS_GUEST_H

#include "layout.h"

typedef unsigned long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

/* A 64-bit TSS named `name` whose I/O permission bitmap covers the ports below
 * 8 * `bitmap_bytes` (plus the all-ones byte the CPU may read past the bitmap's end). */
#define TSS64_WITH_IO_BITMAP(name, bitmap_bytes)                                                 \
    struct name {                                                                                \
        u32 reserved0;                                                                           \
        u64 rsp[3];                                                                              \
        u64 reserved1;                                                                           \
        u64 ist[7];                                                                              \
        u64 reserved2;                                                                           \
        u16 reserved3, iomap_base;                                                               \
        u8 iomap[(bitmap_bytes) + 1];                                                            \
    } __attribute__((packed))

static inline void outb(u16 port, u8 v) { __asm__ volatile("outb %0, %1" ::"a"(v), "Nd"(port)); }
static inline void outw(u16 port, u16 v) { __asm__ volatile("outw %0, %1" ::"a"(v), "Nd"(port)); }
static inline void outl(u16 port, u32 v) { __asm__ volatile("outl %0, %1" ::"a"(v), "Nd"(port)); }

static inline u8 inb(u16 port)
{
    u8 v;
    __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}

static inline u16 inw(u16 port)
{
    u16 v;
    __asm__ volatile("inw %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}

static inline u32 inl(u16 port)
{
    u32 v;
    __asm__ volatile("inl %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}

static inline u8 mmio_read8(u64 addr) { return *(volatile u8 *)addr; }
static inline u16 mmio_read16(u64 addr) { return *(volatile u16 *)addr; }
static inline u32 mmio_read32(u64 addr) { return *(volatile u32 *)addr; }
static inline void mmio_write8(u64 addr, u8 v) { *(volatile u8 *)addr = v; }
static inline void mmio_write16(u64 addr, u16 v) { *(volatile u16 *)addr = v; }
static inline void mmio_write32(u64 addr, u32 v) { *(volatile u32 *)addr = v; }
static inline void mmio_write64(u64 addr, u64 v)
{
    mmio_write32(addr, (u32)v);
    mmio_write32(addr + 4, (u32)(v >> 32));
}

/* Orders this CPU's stores before its later loads (the notify and interrupt checks). */
static inline void full_barrier(void) { __asm__ volatile("mfence" ::: "memory"); }
static inline void compiler_barrier(void) { __asm__ volatile("" ::: "memory"); }

static inline u64 rdtsc(void)
{
    u32 lo, hi;
    __asm__ volatile("lfence; rdtsc" : "=a"(lo), "=d"(hi)::"memory");
    return ((u64)hi << 32) | lo;
}

void *memset(void *d, int c, u64 n);
void *memcpy(void *d, const void *s, u64 n);

void puts_(const char *s);
int console_wait_byte(u64 cycles);
void put_u64(u64 v);
void put_hex(u64 v);
void guest_exit(u32 status);

/* The command line: whether the word at `a` (up to a space) is `b`; where `key` starts a
 * word (the text after it); a decimal number (0 when none). */
int word_eq(const char *a, const char *b);
const char *find_arg(const char *cmdline, const char *key);
int arg_is(const char *cmdline, const char *key, const char *value);
u64 parse_u64(const char *s);

/* Runs fn(arg) at CPL3 (RFLAGS from user_rflags) and returns its result. */
u64 run_user(u64 (*fn)(u64), u64 arg, void *user_stack_top);
extern u64 user_rflags;
/* The IDT, shared by every CPU: a gate (0x8e: interrupt gate, DPL0), loading it on an AP. */
void set_gate(int vec, void (*fn)(void), u8 attr);
void load_idt(void);

/* case=dirty_write (dirty.c): one byte per page, timed, between harvests of the host's log. */
const char *dirty_write_setup(const char *cmdline);
u64 loop_dirty_write(u64 iters);
void report_dirty_write(void);

/* The IPI and shootdown cases (ipi.c): whether `want` names one (and selects it), the set-up
 * before the APs start (returns why the case cannot run, or 0), the run. */
int ipi_case(const char *want);
const char *ipi_prepare(u64 cpus);
void ipi_main(u64 iters, u64 cpus, const char *why);

/* case=snapshot (snapshot.c): a guest to snapshot mid-run and check once restored. */
void snapshot_main(const char *cmdline);

/* The PVH start info (xen/arch-x86/hvm/start_info.h) and its memory map entries. */
struct hvm_start_info {
    u32 magic, version, flags, nr_modules;
    u64 modlist_paddr, cmdline_paddr, rsdp_paddr, memmap_paddr;
    u32 memmap_entries, reserved;
};

struct hvm_memmap_entry {
    u64 addr, size;
    u32 type, reserved;
};

/* End of the RAM range that holds the guest's image (the PVH memory map); 0 if unknown. */
extern u64 ram_end;
void find_ram_end(const struct hvm_start_info *si);

/* CPU set-up (cpu.c): TSS and IDT of the boot CPU, the 8259s masked, the LAPIC. */
void setup_cpu(void);
void mask_legacy_pic(void);
int lapic_present(void);
void lapic_enable(void);

/* The APs (smp.c): start all `cpus` - 1 of them (each first writes `smp_coalesced_writes`
 * values to BENCH_MMIO), or one by APIC ID (returns whether it came up); what each AP runs
 * once up. */
extern volatile u64 smp_coalesced_writes;
void start_aps(u64 cpus);
int start_ap(u32 apic);
extern void (*volatile ap_service)(void);

/* memory_hotplug_check (memory_hotplug.c): memory added while the guest runs, found through
 * exitless's ACPI memory hotplug controller, mapped, written and read back. */
u64 loop_memory_hotplug_check(u64 n);
/* Waits for inserted memory, acknowledges and maps it: its base, length and slot. */
u64 memory_hotplug_take(u64 *len, u64 *slot);

/* case=migrate (migrate.c): the guest's own stopwatch across a live migration. */
const char *migrate_setup(const char *cmdline);
u64 loop_migrate(u64 n);
void report_migrate(void);

/* Interrupts the guest handled (self-IPIs and virtio MSI-X vectors). */
extern u64 ipi_count;

#endif
