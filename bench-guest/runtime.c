/* The bench guest's runtime, which every case file uses and which uses none of them:
 * memory helpers, the COM1 console, the end of the VM, exception reports, the command line
 * and the PVH memory map. */
#include "guest.h"

u64 ram_end;

/* The end of the RAM range that holds the guest's image (1 MiB), from the PVH memory map. */
void find_ram_end(const struct hvm_start_info *si)
{
    if (!si || si->version < 1)
        return;
    const struct hvm_memmap_entry *m = (const struct hvm_memmap_entry *)si->memmap_paddr;
    for (u32 i = 0; m && i < si->memmap_entries; i++)
        if (m[i].type == 1 && m[i].addr <= 0x100000 && m[i].addr + m[i].size > 0x100000)
            ram_end = m[i].addr + m[i].size;
}

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

/* Waits up to `cycles` TSC cycles for a byte on COM1 (polled about every millisecond, each
 * poll one port read); returns whether one came, and takes it. */
int console_wait_byte(u64 cycles)
{
    u64 deadline = rdtsc() + cycles;
    while (rdtsc() < deadline) {
        if (inb(COM1_PORT + 5) & 1) {
            (void)inb(COM1_PORT);
            return 1;
        }
        for (u64 t = rdtsc(); rdtsc() - t < 2400000;)
            __asm__ volatile("pause");
    }
    return 0;
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

/* ---- command line ---- */

int word_eq(const char *a, const char *b)
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
