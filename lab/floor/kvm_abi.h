/*
 * The part of the KVM and Linux system call ABI (x86-64) the floor VMM uses, written out so
 * that it builds freestanding, with no libc and no kernel headers. Values and layouts are
 * those of <linux/kvm.h> and <asm/unistd_64.h>; floor.c checks the sizes at compile time.
 */
#ifndef EXITLESS_FLOOR_KVM_ABI_H
#define EXITLESS_FLOOR_KVM_ABI_H

typedef unsigned long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef long s64;

/* System calls. */
#define SYS_read 0
#define SYS_write 1
#define SYS_close 3
#define SYS_mmap 9
#define SYS_ioctl 16
#define SYS_pread64 17
#define SYS_clock_gettime 228
#define SYS_exit_group 231
#define SYS_openat 257

#define AT_FDCWD (-100)
#define O_RDONLY 0
#define O_RDWR 2
#define O_CLOEXEC 02000000
#define PROT_READ 1
#define PROT_WRITE 2
#define MAP_SHARED 0x01
#define MAP_PRIVATE 0x02
#define MAP_ANONYMOUS 0x20
#define MAP_NORESERVE 0x4000
#define CLOCK_MONOTONIC 1
#define CLOCK_PROCESS_CPUTIME_ID 2
#define EINTR 4
#define EAGAIN 11

/* ioctls on /dev/kvm, the VM and the vCPU. */
#define KVM_CREATE_VM 0xae01
#define KVM_GET_VCPU_MMAP_SIZE 0xae04
#define KVM_GET_SUPPORTED_CPUID 0xc008ae05
#define KVM_CREATE_VCPU 0xae41
#define KVM_SET_USER_MEMORY_REGION 0x4020ae46
#define KVM_CREATE_IRQCHIP 0xae60
#define KVM_RUN 0xae80
#define KVM_SET_REGS 0x4090ae82
#define KVM_SET_SREGS 0x4138ae84
#define KVM_SET_CPUID2 0x4008ae90

#define KVM_EXIT_IO 2
#define KVM_EXIT_HLT 5
#define KVM_EXIT_MMIO 6
#define KVM_EXIT_SHUTDOWN 8
#define KVM_EXIT_FAIL_ENTRY 9
#define KVM_EXIT_INTR 10
#define KVM_EXIT_INTERNAL_ERROR 17
#define KVM_EXIT_SYSTEM_EVENT 24
#define KVM_EXIT_IO_OUT 1

struct kvm_userspace_memory_region {
    u32 slot, flags;
    u64 guest_phys_addr, memory_size, userspace_addr;
};

struct kvm_cpuid_entry2 {
    u32 function, index, flags, eax, ebx, ecx, edx, padding[3];
};

struct kvm_cpuid2 {
    u32 nent, padding;
    struct kvm_cpuid_entry2 entries[];
};

struct kvm_regs {
    u64 rax, rbx, rcx, rdx, rsi, rdi, rsp, rbp;
    u64 r8, r9, r10, r11, r12, r13, r14, r15;
    u64 rip, rflags;
};

struct kvm_segment {
    u64 base;
    u32 limit;
    u16 selector;
    u8 type, present, dpl, db, s, l, g, avl, unusable, padding;
};

struct kvm_dtable {
    u64 base;
    u16 limit, padding[3];
};

struct kvm_sregs {
    struct kvm_segment cs, ds, es, fs, gs, ss, tr, ldt;
    struct kvm_dtable gdt, idt;
    u64 cr0, cr2, cr3, cr4, cr8, efer, apic_base;
    u64 interrupt_bitmap[4];
};

/* The head of the vCPU's shared kvm_run page and the exits the floor reads. */
struct kvm_run {
    u8 request_interrupt_window, immediate_exit, padding1[6];
    u32 exit_reason;
    u8 ready_for_interrupt_injection, if_flag;
    u16 flags;
    u64 cr8, apic_base;
    union {
        struct {
            u64 hardware_entry_failure_reason;
            u32 cpu;
        } fail_entry;
        struct {
            u8 direction, size;
            u16 port;
            u32 count;
            u64 data_offset;
        } io;
        struct {
            u64 phys_addr;
            u8 data[8];
            u32 len;
            u8 is_write;
        } mmio;
        struct {
            u32 suberror;
        } internal;
        struct {
            u32 type, ndata;
        } system_event;
        char padding[256];
    };
};

/* The PVH boot ABI (xen/include/public/arch-x86/hvm/start_info.h). */
#define XEN_HVM_START_MAGIC 0x336ec578
#define XEN_ELFNOTE_PHYS32_ENTRY 18

struct hvm_start_info {
    u32 magic, version, flags, nr_modules;
    u64 modlist_paddr, cmdline_paddr, rsdp_paddr, memmap_paddr;
    u32 memmap_entries, reserved;
};

struct hvm_memmap_entry {
    u64 addr, size;
    u32 type, reserved;
};

/* ELF64 (the parts a PVH loader reads). */
struct elf64_ehdr {
    u8 ident[16];
    u16 type, machine;
    u32 version;
    u64 entry, phoff, shoff;
    u32 flags;
    u16 ehsize, phentsize, phnum, shentsize, shnum, shstrndx;
};

struct elf64_phdr {
    u32 type, flags;
    u64 offset, vaddr, paddr, filesz, memsz, align;
};

#define PT_LOAD 1
#define PT_NOTE 4

#endif
