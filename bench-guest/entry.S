/*
 * Bench guest entry: PVH 32-bit entry, long mode, interrupt stubs and the
 * CPL3 round trip.  Keep CPL0 code short: on PVM every CPL0 instruction is emulated.
 */
#include "layout.h"

    .section .note.pvh, "a"
    .balign 4
    .long 4                 /* name size: "Xen\0" */
    .long 4                 /* descriptor size */
    .long 18                /* XEN_ELFNOTE_PHYS32_ENTRY */
    .asciz "Xen"
    .balign 4
    .long pvh_start
    .balign 4

    .section .text.entry, "ax"
    .code32
    .globl pvh_start
/* From 32-bit flat protected mode to long mode, continuing at \target (clobbers eax, ecx, edx). */
    .macro ENTER_LONG_MODE target
    mov %cr4, %eax
    or $0x20, %eax                  /* PAE */
    mov %eax, %cr4
    mov $pml4, %eax
    mov %eax, %cr3
    mov $0xc0000080, %ecx           /* EFER */
    rdmsr
    or $0x100, %eax                 /* LME */
    wrmsr
    mov %cr0, %eax
    or $0x80000001, %eax            /* PG | PE */
    mov %eax, %cr0
    ljmp $SEL_KCODE, $\target
    .endm

pvh_start:
    cli
    mov %ebx, %esi                  /* hvm_start_info, kept for bench_main */
    lgdt gdt_ptr
    ENTER_LONG_MODE long_entry

/*
 * AP start-up: bench_main copies [ap_trampoline, ap_trampoline_end) to AP_TRAMPOLINE and sends
 * INIT-SIPI-SIPI; each AP starts there in real mode (CS = 0x0800, IP = 0).
 */
    .code16
    .globl ap_trampoline, ap_trampoline_end
ap_trampoline:
    cli
    xor %ax, %ax
    mov %ax, %ds
    lgdtl AP_TRAMPOLINE + (ap_gdt_ptr - ap_trampoline)
    mov %cr0, %eax
    or $1, %eax                     /* PE */
    mov %eax, %cr0
    ljmpl $SEL_KCODE32, $ap_entry32
    .balign 8
ap_gdt_ptr:
    .word gdt_end - gdt - 1
    .long gdt
ap_trampoline_end:

    .code32
ap_entry32:
    mov $SEL_KDATA, %eax
    mov %eax, %ds
    mov %eax, %es
    mov %eax, %ss
    ENTER_LONG_MODE ap_long_entry

    .code64
ap_long_entry:
    mov $SEL_KDATA, %eax
    mov %eax, %ds
    mov %eax, %es
    mov %eax, %ss
    mov $1, %eax
    lock xadd %eax, ap_next(%rip)   /* ticket: this AP's index */
    cmp $MAX_APS, %eax
    jae 2f                          /* no stack for it: stay halted */
    mov %eax, %edi
    inc %eax
    imul $AP_STACK_SIZE, %eax
    lea ap_stacks(%rip), %rsp
    add %rax, %rsp
    call ap_main
2:  cli
    hlt
    jmp 2b

    .code64
long_entry:
    mov $SEL_KDATA, %eax
    mov %eax, %ds
    mov %eax, %es
    mov %eax, %ss
    mov $kernel_stack_top, %rsp
    mov %esi, %edi
    call bench_main
    /* bench_main does not return; stop here if it does. */
1:  hlt
    jmp 1b

/* run_user(fn, arg, user_stack_top): runs fn(arg) at CPL3, returns its result. */
    .globl run_user
run_user:
    push %rbx
    push %rbp
    push %r12
    push %r13
    push %r14
    push %r15
    mov %rsp, saved_kernel_rsp(%rip)
    pushq $SEL_UDATA
    push %rdx                       /* user RSP */
    pushq user_rflags(%rip)         /* RFLAGS: IF=0 unless a case wants interrupts */
    pushq $SEL_UCODE
    lea user_trampoline(%rip), %rax
    push %rax
    mov %rdi, %rax
    mov %rsi, %rdi
    iretq

user_trampoline:                    /* CPL3: rax = fn, rdi = arg */
    call *%rax
    /* Back to CPL0 through #UD: PVM turns `int n` at CPL3 into #UD, while ud2 raises #UD
     * on every platform, so the #UD handler is the one gate that works everywhere. */
    .globl user_return_ud2
user_return_ud2:
    ud2

    .globl user_return_stub
user_return_stub:                   /* CPL0 again: drop the frame, resume run_user's caller */
    mov saved_kernel_rsp(%rip), %rsp
    pop %r15
    pop %r14
    pop %r13
    pop %r12
    pop %rbp
    pop %rbx
    ret

/* Self-IPI handler: count and EOI the in-kernel LAPIC. */
    .globl ipi_stub
ipi_stub:
    push %rax
    incq ipi_count(%rip)
    mov $(APIC_BASE + 0xb0), %eax   /* EOI register; zero-extended */
    movl $0, (%rax)
    pop %rax
    iretq

/* A virtio queue's MSI-X vector: count it and EOI; the driver looks at the used ring. */
    .globl virtio_irq_stub
virtio_irq_stub:
    push %rax
    incq ipi_count(%rip)
    mov $(APIC_BASE + 0xb0), %eax
    movl $0, (%rax)
    pop %rax
    iretq

/* #UD: from CPL3 at user_return_ud2, the CPL3 round trip ends; otherwise skip a 3-byte
 * vmcall/vmmcall and count it (hypercall case without the quirk). */
    .globl ud_stub
ud_stub:
    testb $3, 8(%rsp)               /* CS of the interrupted code */
    jz 1f
    push %rax
    lea user_return_ud2(%rip), %rax
    cmp %rax, 8(%rsp)
    pop %rax
    je user_return_stub
1:  push %rax
    mov 8(%rsp), %rax
    mov %rax, ud_rip(%rip)
    pop %rax
    addq $3, (%rsp)
    incq ud_count(%rip)
    iretq

/* Any other exception: report the vector and stop. */
    .macro EXC vec
    .globl exc_stub_\vec
exc_stub_\vec:
    mov $\vec, %edi
    mov %rsp, %rsi
    and $-16, %rsp
    call guest_exception
    .endm
    .irp v, 0,1,2,3,4,5,7,8,9,10,11,12,13,14,16,17,18,19
    EXC \v
    .endr

    .data
    .balign 8
saved_kernel_rsp: .quad 0
    .globl ipi_count, ud_count, user_rflags
user_rflags: .quad 0x2
ipi_count: .quad 0
ud_count:  .quad 0
ap_next:   .long 0
    .globl ud_rip
ud_rip:    .quad 0

    .balign 16
    .globl gdt
gdt:
    .quad 0
    .quad 0x00af9a000000ffff        /* SEL_KCODE: 64-bit code, DPL0 */
    .quad 0x00cf92000000ffff        /* SEL_KDATA */
    .quad 0x00cff2000000ffff        /* SEL_UDATA: DPL3 */
    .quad 0x00affa000000ffff        /* SEL_UCODE: 64-bit code, DPL3 */
    .quad 0, 0                      /* SEL_TSS: filled in by bench_main */
    .quad 0x00cf9a000000ffff        /* SEL_KCODE32: 32-bit code, DPL0 */
gdt_end:
    .globl gdt_ptr
gdt_ptr:
    .word gdt_end - gdt - 1
    .quad gdt

/* Identity map of the low 4 GiB with 2 MiB pages, user-accessible (U=1), static. Memory
 * hot-added above 4 GiB gets PDPT entries of its own (memory_hotplug.c); pci.c adds entries
 * for BARs a VMM placed above 4 GiB (the two never share a GiB in one case). */
    .balign 4096
    .globl pml4
pml4:
    .quad pdpt + 0x7
    .fill 511, 8, 0
    .globl pdpt
pdpt:
    .quad pd + 0x7
    .quad pd + 0x1000 + 0x7
    .quad pd + 0x2000 + 0x7
    .quad pd + 0x3000 + 0x7
    .fill 508, 8, 0
pd:
    .set i, 0
    .rept 2048
    .quad (i << 21) | 0x87          /* P | RW | US | PS */
    .set i, i + 1
    .endr

    .bss
    .balign 4096
    .space 16384
    .globl kernel_stack_top
kernel_stack_top:
    .balign 4096
ap_stacks:
    .space AP_STACK_SIZE * MAX_APS
