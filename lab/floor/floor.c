/*
 * The floor VMM: the least a KVM VMM must do to run the bench guest (a PVH ELF) and answer
 * its console and exit port, so that `exitless compare` can show what the kernel and KVM
 * cost on this host, beside what each VMM adds. Freestanding: its own _start and raw system
 * calls, no C runtime (no libc start-up, no allocator, no threads).
 *
 *   floor [--timing] [--small-cpuid] KERNEL CMDLINE MEMORY_MIB
 *
 * It opens /dev/kvm, creates the VM, maps MEMORY_MIB of guest RAM in one memory slot (two
 * above 3 GiB: the MMIO gap stays free), creates the in-kernel irqchip and one vCPU, gives it
 * KVM's supported CPUID (or, with --small-cpuid, a four-leaf table made by hand), loads the
 * ELF's PT_LOAD segments and finds the entry in its PVH note, writes the hvm_start_info with
 * the memory map and the command line, sets the registers of the PVH 32-bit entry and runs:
 * COM1 writes go to stdout a line at a time (as exitless writes to a pipe), its line status
 * register says "ready", a write to port 0xf4 ends the process with the written status (its
 * low byte), every other port or MMIO read finds no device (all ones) and writes are dropped.
 * What it skips, and why the bench guest does not need it: docs/performance.md, "The floor".
 *
 * --timing prints, once the guest's first line is out, each step's time since _start on
 * stderr, in the form of `exitless run --timing`.
 */
#include "kvm_abi.h"

_Static_assert(sizeof(struct kvm_sregs) == 312, "struct kvm_sregs");
_Static_assert(sizeof(struct kvm_regs) == 144, "struct kvm_regs");
_Static_assert(sizeof(struct kvm_cpuid_entry2) == 40, "struct kvm_cpuid_entry2");
_Static_assert(sizeof(struct kvm_userspace_memory_region) == 32, "memory region");
_Static_assert(__builtin_offsetof(struct kvm_run, io) == 32, "kvm_run exit union");
_Static_assert(__builtin_offsetof(struct kvm_run, mmio.is_write) == 52, "kvm_run mmio");
_Static_assert(sizeof(struct hvm_start_info) == 56, "hvm_start_info");
_Static_assert(sizeof(struct elf64_phdr) == 56, "Elf64_Phdr");

/* Guest physical layout: the same addresses exitless uses. */
#define START_INFO_GPA 0x6000UL
#define MEMMAP_GPA 0x6040UL
#define CMDLINE_GPA 0x20000UL
#define CMDLINE_MAX 4096UL
#define EBDA_START 0x9fc00UL
#define HIGH_RAM_START 0x100000UL
#define MMIO_GAP_START 0xc0000000UL
#define MMIO_GAP_END 0x100000000UL
#define APIC_BASE_BSP_ENABLED 0xfee00900UL

#define COM1 0x3f8
#define COM1_IIR (COM1 + 2)
#define COM1_LSR (COM1 + 5)
#define LSR_THR_EMPTY_IDLE 0x60
#define IIR_NONE_PENDING 0x01
#define EXIT_PORT 0xf4

#define MAX_CPUID_ENTRIES 256
#define MAX_PHDRS 32
#define MAX_NOTES 4096

/* ---- system calls ---- */

static s64 syscall6(s64 n, s64 a, s64 b, s64 c, s64 d, s64 e, s64 f)
{
    register s64 r10 __asm__("r10") = d;
    register s64 r8 __asm__("r8") = e;
    register s64 r9 __asm__("r9") = f;
    s64 ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}

static s64 syscall3(s64 n, s64 a, s64 b, s64 c) { return syscall6(n, a, b, c, 0, 0, 0); }

static s64 ioctl(int fd, u64 request, u64 arg) { return syscall3(SYS_ioctl, fd, (s64)request, (s64)arg); }

static __attribute__((noreturn)) void exit_now(int status)
{
    for (;;)
        syscall3(SYS_exit_group, status, 0, 0);
}

/* The compiler may call these for struct copies and zeroing. */
void *memset(void *d, int c, u64 n)
{
    u8 *p = d;
    while (n--)
        *p++ = (u8)c;
    return d;
}

void *memcpy(void *d, const void *s, u64 n)
{
    u8 *p = d;
    const u8 *q = s;
    while (n--)
        *p++ = *q++;
    return d;
}

/* ---- text out ---- */

static u64 str_len(const char *s)
{
    u64 n = 0;
    while (s[n])
        n++;
    return n;
}

static void write_all(int fd, const char *s, u64 n)
{
    while (n) {
        s64 w = syscall3(SYS_write, fd, (s64)s, (s64)n);
        if (w == -EINTR)
            continue;
        if (w <= 0)
            return; /* a closed console drops the output; the guest runs on */
        s += w;
        n -= (u64)w;
    }
}

static void say(const char *s) { write_all(2, s, str_len(s)); }

/* Writes v in decimal into buf (at least 21 bytes), returns where the digits start. */
static char *decimal(u64 v, char *buf)
{
    char *p = buf + 20;
    *p = 0;
    do {
        *--p = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return p;
}

static __attribute__((noreturn)) void fail(const char *what, s64 rc)
{
    char buf[21];
    say("floor: ");
    say(what);
    if (rc < 0) {
        say(" failed: errno ");
        say(decimal((u64)-rc, buf));
    }
    say("\n");
    exit_now(1);
}

/* KVM stopped for a reason the floor does not handle (an entry failure, an internal error). */
static __attribute__((noreturn)) void fail_exit(u32 reason)
{
    char buf[21];
    say("floor: KVM could not run the guest: exit reason ");
    say(decimal(reason, buf));
    say("\n");
    exit_now(4);
}

/* ---- start-up timing (--timing) ---- */

struct mark {
    const char *what;
    u64 ns;
};

static int timing;
static u64 origin_ns, cpu_at_start_ns;
static struct mark marks[16];
static unsigned marks_taken;

static u64 clock_ns(int clock)
{
    s64 ts[2] = {0, 0};
    syscall3(SYS_clock_gettime, clock, (s64)ts, 0);
    return (u64)ts[0] * 1000000000UL + (u64)ts[1];
}

static void mark(const char *what)
{
    if (timing && marks_taken < sizeof(marks) / sizeof(marks[0]))
        marks[marks_taken++] = (struct mark){what, clock_ns(CLOCK_MONOTONIC)};
}

/* "  1234.56" (ms with two decimals, right-aligned in `width`), `sign` for steps. */
static void put_ms(u64 ns, int width, int sign)
{
    char buf[21], out[32];
    u64 hundredths = ns / 10000;
    char *whole = decimal(hundredths / 100, buf);
    int n = 0;
    if (sign)
        out[n++] = '+';
    for (char *p = whole; *p; p++)
        out[n++] = *p;
    out[n++] = '.';
    out[n++] = (char)('0' + hundredths % 100 / 10);
    out[n++] = (char)('0' + hundredths % 10);
    for (int pad = width - n; pad > 0; pad--)
        say(" ");
    write_all(2, out, (u64)n);
}

static void print_timeline(void)
{
    say("start-up (ms since _start; step):\n");
    say("                     CPU time when _start began: ");
    put_ms(cpu_at_start_ns, 0, 0);
    say(" ms (the launcher's fork, exec)\n");
    u64 last = origin_ns;
    for (unsigned i = 0; i < marks_taken; i++) {
        say("  ");
        put_ms(marks[i].ns - origin_ns, 8, 0);
        say("  ");
        put_ms(marks[i].ns - last, 8, 1);
        say("  ");
        say(marks[i].what);
        say("\n");
        last = marks[i].ns;
    }
}

/* ---- the console: COM1's transmit register, a line at a time ---- */

static char line[4096];
static u64 line_len;
static int first_line_out;

static void console_flush(void)
{
    write_all(1, line, line_len);
    line_len = 0;
    if (!first_line_out) {
        first_line_out = 1;
        mark("guest's first serial line written");
        if (timing)
            print_timeline();
    }
}

static void console_put(char c)
{
    line[line_len++] = c;
    if (c == '\n' || line_len == sizeof(line))
        console_flush();
}

/* ---- the VM ---- */

struct vm {
    int kvm, vm, vcpu;
    u8 *ram;
    u64 low_size;  /* RAM below the MMIO gap, from guest address 0 */
    u64 high_size; /* RAM from 4 GiB on */
    struct kvm_run *run;
    u64 entry;
};

static int open_file(const char *path, int flags)
{
    s64 fd = syscall6(SYS_openat, AT_FDCWD, (s64)path, flags | O_CLOEXEC, 0, 0, 0);
    if (fd < 0) {
        say("floor: cannot open ");
        say(path);
        fail("", fd);
    }
    return (int)fd;
}

static void *map(u64 size, int prot, int flags, int fd, const char *what)
{
    s64 at = syscall6(SYS_mmap, 0, (s64)size, prot, flags, fd, 0);
    if (at < 0 && at > -4096)
        fail(what, at);
    return (void *)at;
}

/* Anonymous RAM (zero until the guest writes it), one slot below the MMIO gap, one above. */
static void add_memory(struct vm *v, u64 bytes)
{
    v->low_size = bytes < MMIO_GAP_START ? bytes : MMIO_GAP_START;
    v->high_size = bytes - v->low_size;
    v->ram = map(bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                 "mmap of guest RAM");
    struct kvm_userspace_memory_region low = {0, 0, 0, v->low_size, (u64)v->ram};
    s64 rc = ioctl(v->vm, KVM_SET_USER_MEMORY_REGION, (u64)&low);
    if (rc < 0)
        fail("KVM_SET_USER_MEMORY_REGION", rc);
    if (v->high_size) {
        struct kvm_userspace_memory_region high = {1, 0, MMIO_GAP_END, v->high_size,
                                                   (u64)v->ram + v->low_size};
        rc = ioctl(v->vm, KVM_SET_USER_MEMORY_REGION, (u64)&high);
        if (rc < 0)
            fail("KVM_SET_USER_MEMORY_REGION (above 4 GiB)", rc);
    }
}

/* Where guest range [gpa, gpa + len) is in RAM below the gap, or 0. */
static u8 *low_ram(struct vm *v, u64 gpa, u64 len)
{
    if (gpa > v->low_size || len > v->low_size - gpa)
        return 0;
    return v->ram + gpa;
}

static struct {
    u32 nent, padding;
    struct kvm_cpuid_entry2 entries[MAX_CPUID_ENTRIES];
} cpuid;

/* Leaves 0, 1, 0x80000000 and 0x80000001: a vendor, family 6 with the basic features, and
 * long mode (KVM refuses EFER.LME to a guest whose CPUID has no LM). */
static const struct kvm_cpuid_entry2 small_cpuid[] = {
    {0x0, 0, 0, 0x1, 0x756e6547, 0x6c65746e, 0x49656e69, {0}}, /* "GenuineIntel" */
    /* FPU PSE TSC MSR PAE CX8 APIC SEP PGE CMOV PAT FXSR SSE SSE2; the hypervisor bit */
    {0x1, 0, 0, 0x600, 0, 0x80000000, 0x0700eb79, {0}},
    {0x80000000, 0, 0, 0x80000001, 0, 0, 0, {0}},
    {0x80000001, 0, 0, 0, 0, 0, (1u << 29) | (1u << 20) | (1u << 11), {0}}, /* LM NX SYSCALL */
};

static void set_cpuid(struct vm *v, int small)
{
    if (small) {
        cpuid.nent = sizeof(small_cpuid) / sizeof(small_cpuid[0]);
        memcpy(cpuid.entries, small_cpuid, sizeof(small_cpuid));
        mark("hand-made CPUID table (4 leaves)");
    } else {
        cpuid.nent = MAX_CPUID_ENTRIES;
        s64 rc = ioctl(v->kvm, KVM_GET_SUPPORTED_CPUID, (u64)&cpuid);
        if (rc < 0)
            fail("KVM_GET_SUPPORTED_CPUID", rc);
        mark("KVM_GET_SUPPORTED_CPUID");
    }
    s64 rc = ioctl(v->vcpu, KVM_SET_CPUID2, (u64)&cpuid);
    if (rc < 0)
        fail("KVM_SET_CPUID2", rc);
    mark("KVM_SET_CPUID2");
}

/* Reads all of [offset, offset + len) of fd into dst. */
static void pread_all(int fd, u8 *dst, u64 len, u64 offset, const char *what)
{
    while (len) {
        s64 got = syscall6(SYS_pread64, fd, (s64)dst, (s64)len, (s64)offset, 0, 0);
        if (got == -EINTR)
            continue;
        if (got <= 0)
            fail(what, got < 0 ? got : 0);
        dst += got;
        len -= (u64)got;
        offset += (u64)got;
    }
}

/* The PVH entry from a PT_NOTE segment: a "Xen" note of type XEN_ELFNOTE_PHYS32_ENTRY. */
static int pvh_entry(int fd, const struct elf64_phdr *ph, u64 *entry)
{
    static u8 notes[MAX_NOTES];
    u64 size = ph->filesz < MAX_NOTES ? ph->filesz : MAX_NOTES;
    pread_all(fd, notes, size, ph->offset, "reading the kernel's notes");
    for (u64 at = 0; at + 12 <= size;) {
        u32 namesz = *(u32 *)(notes + at), descsz = *(u32 *)(notes + at + 4);
        u32 type = *(u32 *)(notes + at + 8);
        u64 name = at + 12, desc = name + ((namesz + 3) & ~3u);
        u64 next = desc + ((descsz + 3) & ~3u);
        if (next > size || next <= at)
            return 0;
        if (type == XEN_ELFNOTE_PHYS32_ENTRY && namesz == 4 && descsz >= 4 &&
            notes[name] == 'X' && notes[name + 1] == 'e' && notes[name + 2] == 'n') {
            *entry = *(u32 *)(notes + desc);
            return 1;
        }
        at = next;
    }
    return 0;
}

/* The ELF's PT_LOAD segments at their physical addresses (the rest of each segment is RAM
 * still zero: fresh anonymous memory), and its PVH entry. */
static void load_kernel(struct vm *v, const char *path)
{
    int fd = open_file(path, O_RDONLY);
    struct elf64_ehdr eh;
    struct elf64_phdr ph[MAX_PHDRS];
    pread_all(fd, (u8 *)&eh, sizeof(eh), 0, "reading the kernel's ELF header");
    if (eh.ident[0] != 0x7f || eh.ident[1] != 'E' || eh.ident[2] != 'L' || eh.ident[3] != 'F' ||
        eh.ident[4] != 2 || eh.phentsize != sizeof(ph[0]) || eh.phnum > MAX_PHDRS)
        fail("the kernel is not a 64-bit ELF with at most 32 program headers", 0);
    pread_all(fd, (u8 *)ph, eh.phnum * sizeof(ph[0]), eh.phoff, "reading program headers");
    int found = 0;
    for (unsigned i = 0; i < eh.phnum; i++) {
        if (ph[i].type == PT_NOTE && !found)
            found = pvh_entry(fd, &ph[i], &v->entry);
        if (ph[i].type != PT_LOAD)
            continue;
        u8 *dst = low_ram(v, ph[i].paddr, ph[i].memsz);
        if (!dst || ph[i].filesz > ph[i].memsz)
            fail("a kernel segment does not fit in guest RAM below 3 GiB", 0);
        pread_all(fd, dst, ph[i].filesz, ph[i].offset, "reading a kernel segment");
    }
    syscall3(SYS_close, fd, 0, 0);
    if (!found)
        fail("the kernel has no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY)", 0);
}

/* hvm_start_info, its memory map (RAM below the EBDA, from 1 MiB to the gap, above 4 GiB)
 * and the command line. */
static void write_start_info(struct vm *v, const char *cmdline)
{
    u64 len = str_len(cmdline) + 1;
    if (len > CMDLINE_MAX)
        fail("the command line is longer than 4095 bytes", 0);
    memcpy(low_ram(v, CMDLINE_GPA, len), cmdline, len);
    struct hvm_memmap_entry *map = (struct hvm_memmap_entry *)low_ram(v, MEMMAP_GPA, 3 * 24);
    map[0] = (struct hvm_memmap_entry){0, EBDA_START, 1, 0};
    map[1] = (struct hvm_memmap_entry){HIGH_RAM_START, v->low_size - HIGH_RAM_START, 1, 0};
    map[2] = (struct hvm_memmap_entry){MMIO_GAP_END, v->high_size, 1, 0};
    struct hvm_start_info *si = (struct hvm_start_info *)low_ram(v, START_INFO_GPA, sizeof(*si));
    *si = (struct hvm_start_info){
        .magic = XEN_HVM_START_MAGIC,
        .version = 1,
        .cmdline_paddr = CMDLINE_GPA,
        .memmap_paddr = MEMMAP_GPA,
        .memmap_entries = v->high_size ? 3 : 2,
    };
}

/* The PVH entry state, set whole (no KVM_GET_SREGS first): flat 32-bit protected mode, paging
 * off, EBX = hvm_start_info; the LAPIC enabled at its default base, as at reset. */
static void set_entry_registers(struct vm *v)
{
    struct kvm_segment code = {0, 0xffffffff, 0x8, 0xb, 1, 0, 1, 1, 0, 1, 0, 0, 0};
    struct kvm_segment data = code;
    data.selector = 0x10;
    data.type = 0x3;
    struct kvm_sregs s;
    memset(&s, 0, sizeof(s));
    s.cs = code;
    s.ds = s.es = s.fs = s.gs = s.ss = data;
    s.tr = (struct kvm_segment){.limit = 0x67, .type = 0xb, .present = 1};
    s.ldt = (struct kvm_segment){.limit = 0xffff, .type = 0x2, .present = 1};
    s.gdt.limit = s.idt.limit = 0xffff;
    s.cr0 = 0x11; /* PE | ET */
    s.apic_base = APIC_BASE_BSP_ENABLED;
    s64 rc = ioctl(v->vcpu, KVM_SET_SREGS, (u64)&s);
    if (rc < 0)
        fail("KVM_SET_SREGS", rc);
    struct kvm_regs r;
    memset(&r, 0, sizeof(r));
    r.rip = v->entry;
    r.rbx = START_INFO_GPA;
    r.rflags = 0x2;
    rc = ioctl(v->vcpu, KVM_SET_REGS, (u64)&r);
    if (rc < 0)
        fail("KVM_SET_REGS", rc);
}

/* ---- exits ---- */

static u8 com1_read(u16 port)
{
    switch (port) {
    case COM1_LSR:
        return LSR_THR_EMPTY_IDLE;
    case COM1_IIR:
        return IIR_NONE_PENDING;
    default:
        return 0;
    }
}

static void on_io(struct kvm_run *run)
{
    u8 *data = (u8 *)run + run->io.data_offset;
    u64 bytes = (u64)run->io.size * run->io.count;
    u16 port = run->io.port;
    int com1 = port >= COM1 && port < COM1 + 8;
    if (run->io.direction == KVM_EXIT_IO_OUT) {
        if (port == COM1)
            for (u64 i = 0; i < bytes; i++)
                console_put((char)data[i]);
        if (port == EXIT_PORT) {
            u32 status = data[0];
            console_flush();
            exit_now((int)status);
        }
        return;
    }
    for (u64 i = 0; i < bytes; i++)
        data[i] = com1 ? com1_read(port) : 0xff;
}

static __attribute__((noreturn)) void run_vcpu(struct vm *v)
{
    struct kvm_run *run = v->run;
    mark("first KVM_RUN");
    for (;;) {
        s64 rc = ioctl(v->vcpu, KVM_RUN, 0);
        if (rc == -EINTR || rc == -EAGAIN)
            continue;
        if (rc < 0)
            fail("KVM_RUN", rc);
        switch (run->exit_reason) {
        case KVM_EXIT_IO:
            on_io(run);
            break;
        case KVM_EXIT_MMIO:
            if (!run->mmio.is_write)
                memset(run->mmio.data, 0xff, sizeof(run->mmio.data));
            break;
        case KVM_EXIT_INTR:
            break;
        case KVM_EXIT_SYSTEM_EVENT: /* 1 shutdown, 2 reset */
            console_flush();
            exit_now(run->system_event.type <= 2 ? 0 : 5);
        case KVM_EXIT_SHUTDOWN:
            console_flush();
            fail("the guest triple-faulted (KVM_EXIT_SHUTDOWN)", 0);
        case KVM_EXIT_HLT:
            console_flush();
            fail("the guest halted with no interrupt to wake it", 0);
        default:
            console_flush();
            fail_exit(run->exit_reason);
        }
    }
}

/* ---- start ---- */

static int same(const char *a, const char *b)
{
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}

static u64 parse_mib(const char *s)
{
    u64 v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (1UL << 20))
            return 0;
        v = v * 10 + (u64)(*s - '0');
    }
    return v;
}

static void usage(void)
{
    fail("usage: floor [--timing] [--small-cpuid] KERNEL CMDLINE MEMORY_MIB (16 to 1048576)", 0);
}

__attribute__((used)) int floor_main(u64 *sp)
{
    int argc = (int)sp[0];
    char **argv = (char **)(sp + 1);
    int small = 0, at = 1;
    for (; at < argc && argv[at][0] == '-'; at++) {
        if (same(argv[at], "--timing"))
            timing = 1;
        else if (same(argv[at], "--small-cpuid"))
            small = 1;
        else
            usage();
    }
    if (argc - at != 3)
        usage();
    u64 mib = parse_mib(argv[at + 2]);
    if (mib < 16 || mib > (1UL << 20))
        usage();
    if (timing) {
        origin_ns = clock_ns(CLOCK_MONOTONIC);
        cpu_at_start_ns = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
    }
    struct vm v = {0};
    v.kvm = open_file("/dev/kvm", O_RDWR);
    mark("/dev/kvm opened");
    s64 fd = ioctl(v.kvm, KVM_CREATE_VM, 0);
    if (fd < 0)
        fail("KVM_CREATE_VM", fd);
    v.vm = (int)fd;
    mark("KVM_CREATE_VM");
    add_memory(&v, mib << 20);
    mark("guest RAM mapped, KVM_SET_USER_MEMORY_REGION");
    s64 rc = ioctl(v.vm, KVM_CREATE_IRQCHIP, 0);
    if (rc < 0)
        fail("KVM_CREATE_IRQCHIP", rc);
    mark("KVM_CREATE_IRQCHIP");
    fd = ioctl(v.vm, KVM_CREATE_VCPU, 0);
    if (fd < 0)
        fail("KVM_CREATE_VCPU", fd);
    v.vcpu = (int)fd;
    s64 run_size = ioctl(v.kvm, KVM_GET_VCPU_MMAP_SIZE, 0);
    if (run_size < 0)
        fail("KVM_GET_VCPU_MMAP_SIZE", run_size);
    v.run = map((u64)run_size, PROT_READ | PROT_WRITE, MAP_SHARED, v.vcpu, "mmap of kvm_run");
    mark("KVM_CREATE_VCPU, kvm_run mapped");
    set_cpuid(&v, small);
    load_kernel(&v, argv[at]);
    write_start_info(&v, argv[at + 1]);
    mark("kernel loaded, start info and command line written");
    set_entry_registers(&v);
    mark("KVM_SET_SREGS, KVM_SET_REGS (PVH entry)");
    run_vcpu(&v);
}

/* The process starts here with the stack holding argc, argv, envp: no C runtime before. */
__asm__(".globl _start\n"
        "_start:\n"
        "    xor %ebp, %ebp\n"
        "    mov %rsp, %rdi\n"
        "    and $-16, %rsp\n"
        "    call floor_main\n"
        "    mov %eax, %edi\n"
        "    mov $231, %eax\n" /* exit_group */
        "    syscall\n"
        "    hlt\n");
