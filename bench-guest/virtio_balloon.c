/* The bench guest's virtio-balloon driver and its case, balloon_check (iters = MiB; the bench
 * reads iters=0 as 1000):
 *
 *   1. touches `iters` MiB of free RAM at BALLOON_BASE (a pattern in every 8 bytes);
 *   2. reports the range free on the reporting queue, as Linux does: chains of up to 16
 *      device-writable descriptors of 4 MiB (2^10 pages), each waited for;
 *   3. reads the range back: the host discarded it, so every page must read zero;
 *   4. writes the pattern again and reads it back (the pages come back, usable);
 *   5. inflates `inflate=` pages (16 by default) on the inflate queue, sets `actual`, checks
 *      they read zero, deflates them.
 *
 * `sync`: after 1, after 2 and after 3 the guest waits for a byte on COM1 (a test samples
 * the VMM's memory there). `follow`: then it follows the host's target (num_pages) for seconds,
 * inflating and deflating, until the target has gone up and back to 0. Every wait is
 * bounded. Runs at CPL3, polling (no interrupts). */
#include "virtio.h"

#define F_STATS_VQ (1UL << 1)
#define F_DEFLATE_ON_OOM (1UL << 2)
#define F_REPORTING (1UL << 5)
#define PAGE 4096UL
#define MIB (1UL << 20)
/* Free RAM the case uses: above the guest's image and rings, below the end of RAM. */
#define BALLOON_BASE (64 * MIB)
#define REPORT_CHUNK (4 * MIB)
#define REPORT_DESCS 16
#define MAX_INFLATE 4096 /* pages (16 MiB) */
#define PFNS_PER_REQUEST 256

static struct virtio_dev bal;
static struct vring inflate_vq, deflate_vq, report_vq;
static u32 pfns[PFNS_PER_REQUEST];
static const char *bal_cmdline = "";
static u64 inflate_pages;

static void bal_fail(const char *what)
{
    puts_("EXITLESS ERROR balloon: ");
    puts_(what);
    puts_("\n");
    guest_exit(3);
}

static u32 num_pages(void) { return mmio_read32(bal.device_cfg); }
static void set_actual(u32 pages) { mmio_write32(bal.device_cfg + 4, pages); }

/* Waits (seconds at most) for a byte on COM1: the host's go-ahead. */
static int wait_for_host(void)
{
    return console_wait_byte(VIRTIO_WAIT_CYCLES);
}

const char *virtio_balloon_setup(const char *cmdline)
{
    bal_cmdline = cmdline;
    int slot = pci_find(PCI_VENDOR_VIRTIO, PCI_DEVICE_VIRTIO_BALLOON);
    if (slot < 0)
        return "no-virtio-balloon";
    const char *why = virtio_open(&bal, (u8)slot);
    /* STATS_VQ only where offered (QEMU): it keeps the queue numbering the device uses. */
    if (!why)
        why = virtio_negotiate(&bal, F_REPORTING | F_STATS_VQ | F_DEFLATE_ON_OOM);
    if (why)
        return why;
    if (!(bal.features & F_REPORTING))
        return "free-page-reporting-not-offered";
    /* Queues that exist are numbered in order: inflateq, deflateq, statsq, then reporting. */
    u16 reporting = (bal.features & F_STATS_VQ) ? 3 : 2;
    if ((why = virtio_queue(&bal, &inflate_vq, 0, VIRTIO_NO_VECTOR)) ||
        (why = virtio_queue(&bal, &deflate_vq, 1, VIRTIO_NO_VECTOR)) ||
        (why = virtio_queue(&bal, &report_vq, reporting, VIRTIO_NO_VECTOR)))
        return why;
    virtio_driver_ok(&bal);
    u64 n = parse_u64(find_arg(cmdline, "inflate="));
    inflate_pages = n ? n : 16;
    if (inflate_pages > MAX_INFLATE)
        inflate_pages = MAX_INFLATE;
    return 0;
}

static u64 pattern(u64 addr) { return addr * 0x9e3779b97f4a7c15UL + 1; }

/* Writes the pattern to every 8 bytes of [base, base + len). */
static void touch(u64 base, u64 len)
{
    for (u64 a = base; a < base + len; a += 8)
        *(volatile u64 *)a = pattern(a);
}

/* Pages of [base, base + len) that are all zero, and (in *intact) those holding the pattern. */
static u64 zero_pages(u64 base, u64 len, u64 *intact)
{
    u64 zero = 0, good = 0;
    for (u64 p = base; p < base + len; p += PAGE) {
        u64 nonzero = 0, right = 0;
        for (u64 a = p; a < p + PAGE; a += 8) {
            u64 v = *(volatile u64 *)a;
            nonzero += v != 0;
            right += v == pattern(a);
        }
        zero += nonzero == 0;
        good += right == PAGE / 8;
    }
    if (intact)
        *intact = good;
    return zero;
}

/* Reports [base, base + len) free: chains of up to REPORT_DESCS descriptors of REPORT_CHUNK,
 * each waited for. Returns the chains sent. */
static u64 report(u64 base, u64 len)
{
    u64 chains = 0;
    for (u64 a = base; a < base + len; chains++) {
        u16 n = 0;
        for (; n < REPORT_DESCS && a < base + len; n++, a += REPORT_CHUNK) {
            u64 size = base + len - a < REPORT_CHUNK ? base + len - a : REPORT_CHUNK;
            report_vq.desc[n] = (struct vring_desc){a, (u32)size, VRING_DESC_F_WRITE | VRING_DESC_F_NEXT, (u16)(n + 1)};
        }
        report_vq.desc[n - 1].flags = VRING_DESC_F_WRITE;
        vring_post(&report_vq, 0);
        vring_kick(&report_vq);
        struct vring_used_elem e;
        vring_wait(&report_vq, 0, &e, "balloon: a report was never used");
        if (e.id != 0)
            bal_fail("the device used a report chain it was not given");
    }
    return chains;
}

/* Sends the `count` pages from `first` (PFN) on `vq` (inflate or deflate), PFNS_PER_REQUEST
 * at a time, each waited for. */
static void send_pfns(struct vring *vq, u64 first, u64 count, const char *what)
{
    for (u64 done = 0; done < count;) {
        u64 n = count - done < PFNS_PER_REQUEST ? count - done : PFNS_PER_REQUEST;
        for (u64 i = 0; i < n; i++)
            pfns[i] = (u32)(first + done + i);
        vq->desc[0] = (struct vring_desc){(u64)pfns, (u32)(4 * n), 0, 0};
        vring_post(vq, 0);
        vring_kick(vq);
        struct vring_used_elem e;
        vring_wait(vq, 0, &e, what);
        done += n;
    }
}

static void line(const char *what, u64 a, const char *b_name, u64 b)
{
    puts_("EXITLESS BALLOON ");
    puts_(what);
    put_u64(a);
    if (b_name) {
        puts_(b_name);
        put_u64(b);
    }
    puts_("\n");
}

/* Inflates `pages` pages at `base` (touched first), sets `actual`, checks they read zero, then
 * deflates them. */
static void inflate_and_deflate(u64 base, u64 pages)
{
    touch(base, pages * PAGE);
    send_pfns(&inflate_vq, base / PAGE, pages, "balloon: an inflate was never used");
    set_actual((u32)pages);
    u64 zero = zero_pages(base, pages * PAGE, 0);
    send_pfns(&deflate_vq, base / PAGE, pages, "balloon: a deflate was never used");
    set_actual(0);
    line("inflated pages=", pages, " zero=", zero);
}

/* Follows the host's target for seconds (inflating and deflating at `base`, at most
 * MAX_INFLATE pages) until it has gone up and back to 0. */
static void follow_target(u64 base)
{
    u64 actual = 0;
    int grew = 0;
    for (u64 t = rdtsc(); rdtsc() - t < 4 * VIRTIO_WAIT_CYCLES;) {
        u64 want = num_pages();
        if (want > MAX_INFLATE)
            want = MAX_INFLATE;
        if (want > actual) {
            send_pfns(&inflate_vq, base / PAGE + actual, want - actual, "balloon: an inflate was never used");
            grew = 1;
        } else if (want < actual) {
            send_pfns(&deflate_vq, base / PAGE + want, actual - want, "balloon: a deflate was never used");
        }
        if (want != actual) {
            actual = want;
            set_actual((u32)actual);
            line("target actual=", actual, 0, 0);
        }
        if (grew && actual == 0)
            return;
        for (u64 p = rdtsc(); rdtsc() - p < 10000000;)
            __asm__ volatile("pause");
    }
    bal_fail("the host's target did not go up and back to 0 within seconds");
}

u32 virtio_balloon_target(void) { return num_pages(); }
u32 virtio_balloon_actual(void) { return mmio_read32(bal.device_cfg + 4); }

u64 virtio_balloon_inflate_target(u64 base)
{
    u64 want = num_pages();
    if (want > MAX_INFLATE)
        want = MAX_INFLATE;
    touch(base, want * PAGE);
    send_pfns(&inflate_vq, base / PAGE, want, "balloon: an inflate was never used");
    set_actual((u32)want);
    line("inflated pages=", want, " target=", num_pages());
    return want;
}

u64 loop_balloon_check(u64 mib)
{
    int sync = find_arg(bal_cmdline, "sync") != 0;
    u64 len = mib * MIB, inflate_base = BALLOON_BASE + len;
    if (!ram_end || inflate_base + MAX_INFLATE * PAGE > ram_end)
        bal_fail("not enough RAM above 64 MiB for iters= MiB (give the VM more memory)");
    line("start num_pages=", num_pages(), " reporting=", 1);
    if (len) {
        touch(BALLOON_BASE, len);
        line("touched mib=", mib, 0, 0);
        if (sync && !wait_for_host())
            bal_fail("no go-ahead from the host on COM1");
        u64 chains = report(BALLOON_BASE, len);
        line("reported mib=", mib, " chains=", chains);
        /* Before reading the range: a read of a discarded page of shared (memfd) memory
         * allocates it again. */
        if (sync && !wait_for_host())
            bal_fail("no go-ahead from the host on COM1");
        u64 zero = zero_pages(BALLOON_BASE, len, 0);
        line("after_report zero_pages=", zero, " of=", len / PAGE);
        if (sync && !wait_for_host())
            bal_fail("no go-ahead from the host on COM1");
        touch(BALLOON_BASE, len);
        u64 intact;
        zero_pages(BALLOON_BASE, len, &intact);
        line("rewritten intact_pages=", intact, " of=", len / PAGE);
    }
    inflate_and_deflate(inflate_base, inflate_pages);
    if (find_arg(bal_cmdline, "follow"))
        follow_target(inflate_base);
    return 0;
}
