/* memory_hotplug_check: the guest plays Linux's acpi_memhotplug (it has no AML interpreter):
 * it waits for the GED's memory bit, finds the slot being inserted through the memory
 * hotplug controller (as the DSDT's MSCN does), reads the slot's base and length (as MCRS
 * does), acknowledges the insert, maps the new range (the boot page tables cover the low
 * 4 GiB only), writes a pattern to every 8 bytes of it and reads it all back. Runs at CPL3:
 * on PVM every CPL0 instruction is emulated. Every wait is bounded. */
#include "guest.h"

#define GED_MEMORY 4
#define MSEL 0x00
#define MSTA 0x04
#define MCNT 0x08
#define MHBL 0x10
#define MHBH 0x14
#define MHLL 0x18
#define MHLH 0x1c
#define MSTA_ENABLED 1
#define MSTA_INSERTING 2
/* As hotplug.c: long enough for a test to send its request after the ready line. */
#define MEMORY_WAIT (6 * 20000000000UL)
#define GIB (1UL << 30)
#define PAGE_2M (1UL << 21)
/* Page directories for memory above 4 GiB: any 8 GiB of the first 512 GiB. */
#define HIGH_PDS 8

extern u64 pdpt[512];
static u64 high_pd[HIGH_PDS][512] __attribute__((aligned(4096)));
static int high_pds_used;

static void memory_fail(const char *what)
{
    puts_("EXITLESS ERROR memory hotplug: ");
    puts_(what);
    puts_("\n");
    guest_exit(3);
}

/* Identity-maps [base, base + len) with 2 MiB pages, user-accessible. A PDPT entry goes from
 * not present to present, which no TLB holds: no flush needed (and none can be made at CPL3). */
static void map_high(u64 base, u64 len)
{
    for (u64 gib = base / GIB; gib <= (base + len - 1) / GIB; gib++) {
        if (gib >= 512)
            memory_fail("the new memory is above 512 GiB");
        if (pdpt[gib] & 1)
            continue;
        if (high_pds_used == HIGH_PDS)
            memory_fail("no page directory left to map the new memory");
        u64 *pd = high_pd[high_pds_used++];
        for (u64 i = 0; i < 512; i++)
            pd[i] = (gib * GIB + i * PAGE_2M) | 0x87; /* P | RW | US | PS */
        compiler_barrier();
        pdpt[gib] = (u64)pd | 0x7;
    }
}

static u64 pattern(u64 addr) { return (addr * 0x9e3779b97f4a7c15UL) ^ 0x5a5a0f0f3c3cc3c3UL; }

/* Writes the pattern to every 8 bytes of the range, then checks it; returns the bytes whose
 * 4 KiB page read back whole. */
static u64 write_and_verify(u64 base, u64 len)
{
    for (u64 a = base; a < base + len; a += 8)
        *(volatile u64 *)a = pattern(a);
    u64 good = 0;
    for (u64 page = base; page < base + len; page += 4096) {
        int ok = 1;
        for (u64 a = page; a < page + 4096; a += 8)
            ok &= *(volatile u64 *)a == pattern(a);
        good += ok ? 4096 : 0;
    }
    return good;
}

/* The slot being inserted (acknowledged), or -1. */
static int take_inserted_slot(void)
{
    u32 count = mmio_read32(MEMORY_HOTPLUG_ADDR + MCNT);
    if (count == 0 || count > 256)
        memory_fail("no memory hotplug controller");
    for (u32 slot = 0; slot < count; slot++) {
        mmio_write32(MEMORY_HOTPLUG_ADDR + MSEL, slot);
        u8 status = mmio_read8(MEMORY_HOTPLUG_ADDR + MSTA);
        if ((status & (MSTA_ENABLED | MSTA_INSERTING)) == (MSTA_ENABLED | MSTA_INSERTING)) {
            mmio_write8(MEMORY_HOTPLUG_ADDR + MSTA, MSTA_INSERTING);
            return (int)slot;
        }
    }
    return -1;
}

u64 loop_memory_hotplug_check(u64 n)
{
    (void)n;
    puts_("EXITLESS MEMORY ready\n");
    u64 len, slot, base = memory_hotplug_take(&len, &slot);
    u64 verified = write_and_verify(base, len);
    puts_("EXITLESS MEMORY hotplug slot=");
    put_u64(slot);
    puts_(" base=");
    put_hex(base);
    puts_(" bytes=");
    put_u64(len);
    puts_(" verified=");
    put_u64(verified);
    puts_("\n");
    return 0;
}

/* Waits for memory to be inserted (the GED's memory bit), acknowledges it and maps it;
 * returns its base, its length in *len and its slot in *slot. */
u64 memory_hotplug_take(u64 *len_out, u64 *slot_out)
{
    for (u64 start = rdtsc(); !(mmio_read8(GED_ADDR) & GED_MEMORY);) {
        if (rdtsc() - start > MEMORY_WAIT)
            memory_fail("no memory hotplug notification");
        __asm__ volatile("pause");
    }
    int slot = take_inserted_slot();
    if (slot < 0)
        memory_fail("notified, but no memory slot is being inserted");
    u64 base = mmio_read32(MEMORY_HOTPLUG_ADDR + MHBL) |
               (u64)mmio_read32(MEMORY_HOTPLUG_ADDR + MHBH) << 32;
    u64 len = mmio_read32(MEMORY_HOTPLUG_ADDR + MHLL) |
              (u64)mmio_read32(MEMORY_HOTPLUG_ADDR + MHLH) << 32;
    if (!len || base % PAGE_2M || len % PAGE_2M)
        memory_fail("the slot's range is not whole 2 MiB pages");
    if (mmio_read8(MEMORY_HOTPLUG_ADDR + MSTA) & MSTA_INSERTING)
        memory_fail("the insert was not acknowledged");
    map_high(base, len);
    *len_out = len;
    *slot_out = (u64)slot;
    return base;
}
