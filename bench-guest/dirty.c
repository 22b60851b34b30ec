/*
 * case=dirty_write: what a guest's first write to a page costs under the dirty tracking in
 * force (exitless's lab, lab/src/bench/dirty.rs: none, KVM's bitmap, KVM's dirty ring).
 * At CPL3, `rounds` times: a write to DIRTY_PORT (the host harvests the log there, which
 * write-protects the pages again), then one byte written per page over `pages` pages, timed
 * with the TSC. Round 0 also faults the pages in; the rounds after it are the figure.
 *
 *   EXITLESS RESULT case=dirty_write ... pages=<n> rounds=<n> first=<cycles/page, round 0>
 *   min=<cycles/page, best later round> p50=<cycles/page, median later round>
 */
#include "guest.h"

#define DIRTY_BASE 0x2000000UL /* 32 MiB: above the guest's image, stacks and tables */
#define DIRTY_MAX_PAGES 16384  /* 64 MiB */
#define DIRTY_MAX_ROUNDS 64

static u64 dirty_pages = 8192;
static u64 dirty_rounds = 8;
static u64 round_cycles[DIRTY_MAX_ROUNDS];

const char *dirty_write_setup(const char *cmdline)
{
    u64 pages = parse_u64(find_arg(cmdline, "pages="));
    u64 rounds = parse_u64(find_arg(cmdline, "rounds="));
    if (pages)
        dirty_pages = pages;
    if (rounds)
        dirty_rounds = rounds;
    if (dirty_pages > DIRTY_MAX_PAGES)
        return "pages-above-16384";
    if (dirty_rounds < 2 || dirty_rounds > DIRTY_MAX_ROUNDS)
        return "rounds-not-2-to-64";
    return 0;
}

u64 loop_dirty_write(u64 iters)
{
    (void)iters;
    for (u64 r = 0; r < dirty_rounds; r++) {
        outl(DIRTY_PORT, (u32)r);
        u64 t0 = rdtsc();
        for (u64 p = 0; p < dirty_pages; p++)
            *(volatile u8 *)(DIRTY_BASE + p * 4096) = (u8)(r + 1);
        round_cycles[r] = rdtsc() - t0;
    }
    /* The last harvest: the last round's pages are counted too. */
    outl(DIRTY_PORT, (u32)dirty_rounds);
    return 0;
}

void report_dirty_write(void)
{
    u64 sorted[DIRTY_MAX_ROUNDS];
    u64 n = dirty_rounds - 1;
    for (u64 i = 0; i < n; i++) {
        u64 v = round_cycles[i + 1], j = i;
        for (; j > 0 && sorted[j - 1] > v; j--)
            sorted[j] = sorted[j - 1];
        sorted[j] = v;
    }
    puts_(" pages=");
    put_u64(dirty_pages);
    puts_(" rounds=");
    put_u64(dirty_rounds);
    puts_(" first=");
    put_u64(round_cycles[0] / dirty_pages);
    puts_(" min=");
    put_u64(sorted[0] / dirty_pages);
    puts_(" p50=");
    put_u64(sorted[n / 2] / dirty_pages);
}
