/* PCI bus 0 configuration access through ports 0xcf8/0xcfc, and BAR placement. */
#include "virtio.h"

#define PCI_COMMAND 0x04
#define PCI_COMMAND_MEMORY 0x2
#define PCI_COMMAND_MASTER 0x4
#define PCI_BAR0 0x10

static u64 bar_next = PCI_BAR_WINDOW;

static void select_reg(u8 slot, u8 reg)
{
    outl(0xcf8, 0x80000000u | ((u32)slot << 11) | (reg & 0xfc));
}

u32 pci_read32(u8 slot, u8 reg)
{
    select_reg(slot, reg);
    return inl(0xcfc);
}

u16 pci_read16(u8 slot, u8 reg)
{
    select_reg(slot, reg);
    return inw((u16)(0xcfc + (reg & 2)));
}

u8 pci_read8(u8 slot, u8 reg)
{
    select_reg(slot, reg);
    return inb((u16)(0xcfc + (reg & 3)));
}

void pci_write32(u8 slot, u8 reg, u32 v)
{
    select_reg(slot, reg);
    outl(0xcfc, v);
}

void pci_write16(u8 slot, u8 reg, u16 v)
{
    select_reg(slot, reg);
    outw((u16)(0xcfc + (reg & 2)), v);
}

int pci_find(u16 vendor, u16 device)
{
    for (int slot = 0; slot < 32; slot++) {
        u32 id = pci_read32((u8)slot, 0);
        if ((id & 0xffff) == vendor && (id >> 16) == device)
            return slot;
    }
    return -1;
}

/* Size of memory BAR `i` (and whether it is 64-bit), by the all-ones probe. */
static u64 bar_size(u8 slot, int i, int *is64)
{
    u8 reg = (u8)(PCI_BAR0 + 4 * i);
    u32 old = pci_read32(slot, reg);
    *is64 = (old & 0x7) == 0x4;
    if (old & 1)
        return 0; /* I/O BAR: not used by modern virtio */
    pci_write32(slot, reg, 0xffffffff);
    u64 mask = pci_read32(slot, reg) & ~0xfUL;
    pci_write32(slot, reg, old);
    if (*is64) {
        u32 old_hi = pci_read32(slot, (u8)(reg + 4));
        pci_write32(slot, (u8)(reg + 4), 0xffffffff);
        mask |= (u64)pci_read32(slot, (u8)(reg + 4)) << 32;
        pci_write32(slot, (u8)(reg + 4), old_hi);
    } else if (mask) {
        mask |= 0xffffffff00000000UL;
    }
    return mask ? ~mask + 1 : 0;
}

/* Page-table pages for mappings above 4 GiB (entry.S maps the low 4 GiB). */
#define HIGH_TABLES 8
#define PTE_TABLE 0x7          /* P | RW | US */
#define PTE_MMIO_2M 0x9f       /* P | RW | US | PWT | PCD | PS */
#define HUGE_2M (1UL << 21)
extern u64 pml4[512];
static u64 high_tables[HIGH_TABLES][512] __attribute__((aligned(4096)));
static int high_tables_used;

/* The table `entry` points to, made (empty) if it is not present; 0 when none is left. The
 * guest's memory is identity-mapped, so a table's address is its pointer. */
static u64 *table_of(u64 *entry)
{
    if (!(*entry & 1)) {
        if (high_tables_used == HIGH_TABLES)
            return 0;
        *entry = (u64)high_tables[high_tables_used++] | PTE_TABLE;
    }
    return (u64 *)(*entry & 0x000ffffffffff000UL);
}

/* Identity-maps [at, at + size) with uncached 2 MiB pages; 0 on success. Only entries that
 * were not present are written (no TLB holds them), so this runs at CPL3 with no invlpg. */
static int map_high(u64 at, u64 size)
{
    for (u64 va = at & ~(HUGE_2M - 1); va < at + size; va += HUGE_2M) {
        u64 *pdpt = table_of(&pml4[(va >> 39) & 511]);
        u64 *pd = pdpt ? table_of(&pdpt[(va >> 30) & 511]) : 0;
        if (!pd)
            return -1;
        if (!(pd[(va >> 21) & 511] & 1))
            pd[(va >> 21) & 511] = va | PTE_MMIO_2M;
    }
    return 0;
}

int pci_map_high(u64 at, u64 size)
{
    return map_high(at, size);
}

/* Where 64-bit BAR `i` is now (0 for a 32-bit BAR). */
static u64 bar_address(u8 slot, int i, int is64)
{
    u8 reg = (u8)(PCI_BAR0 + 4 * i);
    if (!is64)
        return 0;
    return (pci_read32(slot, reg) & ~0xfUL) | ((u64)pci_read32(slot, (u8)(reg + 4)) << 32);
}

void pci_assign_bars(u8 slot, u64 bars[6])
{
    u16 cmd = pci_read16(slot, PCI_COMMAND);
    pci_write16(slot, PCI_COMMAND, (u16)(cmd & ~(PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER)));
    for (int i = 0; i < 6; i++) {
        int is64 = 0;
        u64 size = bar_size(slot, i, &is64);
        u64 now = size ? bar_address(slot, i, is64) : 0;
        bars[i] = 0;
        if (now >> 32 && map_high(now, size) == 0) {
            /* Placed above 4 GiB by the VMM (Cloud Hypervisor's 64-bit BARs, which it will
             * not move below 4 GiB): kept there. */
            bars[i] = now;
        } else if (size) {
            u64 at = (bar_next + size - 1) & ~(size - 1);
            bar_next = at + size;
            u8 reg = (u8)(PCI_BAR0 + 4 * i);
            pci_write32(slot, reg, (u32)at);
            if (is64)
                pci_write32(slot, (u8)(reg + 4), 0);
            bars[i] = at;
        }
        if (is64 && i < 5)
            bars[++i] = 0;
    }
    pci_write16(slot, PCI_COMMAND, (u16)(cmd | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER));
}
