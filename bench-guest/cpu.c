/* Each CPU's set-up: the TSS with an all-open I/O bitmap (PVM forces IOPL 0), the IDT every
 * CPU shares, the legacy PICs masked, the LAPIC enabled. */
#include "guest.h"

TSS64_WITH_IO_BITMAP(tss64, 8192);

struct idt_gate {
    u16 off_lo, sel;
    u8 ist, attr;
    u16 off_mid;
    u32 off_hi, zero;
};

extern u64 gdt[];
extern struct { u16 limit; u64 base; } __attribute__((packed)) gdt_ptr;
extern void ipi_stub(void), ud_stub(void), virtio_irq_stub(void);
#define X(v) extern void exc_stub_##v(void);
X(0) X(1) X(2) X(3) X(4) X(5) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(16) X(17) X(18) X(19)
#undef X

static struct tss64 tss __attribute__((aligned(64)));
static struct idt_gate idt[256] __attribute__((aligned(16)));
/* Where CPL3 code enters CPL0 (interrupts, #UD): its own stack, below nothing it could clobber. */
static u8 trap_stack[4096] __attribute__((aligned(16)));

/* ---- CPU set-up: TSS with an all-open I/O bitmap (PVM forces IOPL 0), IDT ---- */

void set_gate(int vec, void (*fn)(void), u8 attr)
{
    u64 a = (u64)fn;
    idt[vec] = (struct idt_gate){(u16)a, SEL_KCODE, 0, attr, (u16)(a >> 16), (u32)(a >> 32), 0};
}

void setup_cpu(void)
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
void mask_legacy_pic(void)
{
    outb(0x21, 0xff);
    outb(0xa1, 0xff);
}

int lapic_present(void)
{
    return mmio_read32(APIC_BASE + 0x30) != 0xffffffff;
}

void lapic_enable(void)
{
    mmio_write32(APIC_BASE + 0xf0, 0x1ff); /* spurious vector register: software enable */
}
