/*
 * case=migrate: the downtime of a live migration as the guest lives it, the same figure under
 * every VMM. At CPL3 (instructions at CPL0 are emulated one by one on PVM hosts), the guest
 * first writes every page of span_mib MiB (default 64) from 32 MiB up once, prints
 *
 *   EXITLESS MIGRATE loop span_mib=<S> write_mib_s=<R> tsc=<the TSC then>
 *
 * then for secs= seconds (default 5) stamps every turn of its loop with the TSC and keeps the
 * longest gap between two stamps: with no timer and no exit in the loop, a gap is time the
 * vCPU did not run (the host's scheduler, or a migration's pause: its downtime). While it
 * loops it dirties pages of the span in turn (one 8-byte word per 4 KiB page, the next page
 * each time, wrapping) at write_mib_s= MiB of pages per second (0: at rest, nothing written
 * after the first pass), a few pages per turn, catching up after a gap. Each word holds the
 * page's number mixed with how many times it was written; at the end every page is checked
 * (a page a migration lost holds an older word):
 *
 *   EXITLESS RESULT case=migrate cpl=3 ... span_mib=<S> write_mib_s=<R> loops=<turns>
 *     written_mib=<pages written in the loop, MiB> max_gap_cycles=<c> max_gap_us=<us>
 *     max_gap_at_ms=<when, from the loop's start> gaps_over_1ms=<n>
 *     top_gaps=<cycles>@<TSC at its start>,... bad=<pages> ok=<0|1>
 *
 * top_gaps are the 16 longest gaps, longest first: where the guest's TSC is the host's (this
 * PVM host: KVM_SET_MSRS(IA32_TSC) has no effect, for every VMM), the host picks the one that
 * started while it migrated, leaving out the scheduler's gaps before and after. The loop
 * line's tsc= tells the host whether the two TSCs agree.
 *
 * The TSC's frequency comes on the command line (tsc_khz=, which the host knows; the guest
 * has no other clock to learn it from): the rate, secs= and the figures in us need it.
 * Guest memory must reach 32 MiB + span_mib.
 */
#include "guest.h"

#define MIG_BASE 0x2000000UL /* 32 MiB: above the guest's image, stacks and tables */
#define MIG_PAGE 4096UL
#define MIG_SEED 0x6d16a7e5eed0001UL
/* Most pages one turn writes: a turn stays short after a gap, while the loop catches up. */
#define MIG_BURST 16
/* The longest gaps kept, with when each started. */
#define MIG_TOP 16

static struct {
    u64 pages, rate_pages, secs, tsc_khz;
    u64 loops, written, max_gap, max_gap_at, gaps_over_1ms, bad;
    u64 top[MIG_TOP], top_at[MIG_TOP]; /* longest first */
} mig;

/* The word page p holds after its `count`-th write. */
static u64 mig_word(u64 p, u64 count) { return (p * 0x9e3779b97f4a7c15UL) ^ (count << 40) ^ MIG_SEED; }

static void mig_write(u64 p, u64 count) { *(volatile u64 *)(MIG_BASE + p * MIG_PAGE) = mig_word(p, count); }

/* At CPL3, before the loop: the arguments, checked. */
const char *migrate_setup(const char *cmdline)
{
    u64 span = parse_u64(find_arg(cmdline, "span_mib="));
    u64 rate = parse_u64(find_arg(cmdline, "write_mib_s="));
    mig.pages = (span ? span : 64) * (1UL << 20) / MIG_PAGE;
    mig.rate_pages = rate * (1UL << 20) / MIG_PAGE;
    mig.secs = parse_u64(find_arg(cmdline, "secs="));
    if (!mig.secs)
        mig.secs = 5;
    mig.tsc_khz = parse_u64(find_arg(cmdline, "tsc_khz="));
    if (!mig.tsc_khz)
        return "needs-tsc_khz=:the-host's-TSC-frequency";
    if (ram_end && MIG_BASE + mig.pages * MIG_PAGE > ram_end)
        return "span_mib-beyond-guest-memory";
    return 0;
}

/* How many times page p was written once `total` page writes went round the span (the first
 * pass included). */
static u64 mig_count(u64 p, u64 total)
{
    if (total <= p)
        return 0;
    return (total - p - 1) / mig.pages + 1;
}

static void mig_stamp(u64 now, u64 *last, u64 start)
{
    u64 gap = now - *last;
    if (gap > mig.max_gap) {
        mig.max_gap = gap;
        mig.max_gap_at = now - start;
    }
    if (gap > mig.tsc_khz)
        mig.gaps_over_1ms++;
    if (gap > mig.top[MIG_TOP - 1]) {
        int i = MIG_TOP - 1;
        for (; i > 0 && mig.top[i - 1] < gap; i--) {
            mig.top[i] = mig.top[i - 1];
            mig.top_at[i] = mig.top_at[i - 1];
        }
        mig.top[i] = gap;
        mig.top_at[i] = *last;
    }
    *last = now;
}

u64 loop_migrate(u64 n)
{
    (void)n;
    for (u64 p = 0; p < mig.pages; p++)
        mig_write(p, 1);
    u64 total = mig.pages;
    puts_("EXITLESS MIGRATE loop span_mib=");
    put_u64(mig.pages * MIG_PAGE >> 20);
    puts_(" write_mib_s=");
    put_u64(mig.rate_pages * MIG_PAGE >> 20);
    puts_(" tsc=");
    put_u64(rdtsc());
    puts_("\n");
    u64 hz = mig.tsc_khz * 1000, start = rdtsc(), last = start, end = start + mig.secs * hz;
    for (;;) {
        u64 now = rdtsc();
        mig_stamp(now, &last, start);
        mig.loops++;
        if (now >= end)
            break;
        u64 due = (now - start) * mig.rate_pages / hz;
        for (u64 k = 0; k < MIG_BURST && mig.written < due; k++, mig.written++, total++)
            mig_write(total % mig.pages, mig_count(total % mig.pages, total + 1));
    }
    for (u64 p = 0; p < mig.pages; p++)
        if (*(volatile u64 *)(MIG_BASE + p * MIG_PAGE) != mig_word(p, mig_count(p, total)))
            mig.bad++;
    return 0;
}

void report_migrate(void)
{
    puts_(" span_mib=");
    put_u64(mig.pages * MIG_PAGE >> 20);
    puts_(" write_mib_s=");
    put_u64(mig.rate_pages * MIG_PAGE >> 20);
    puts_(" loops=");
    put_u64(mig.loops);
    puts_(" written_mib=");
    put_u64(mig.written * MIG_PAGE >> 20);
    puts_(" max_gap_cycles=");
    put_u64(mig.max_gap);
    puts_(" max_gap_us=");
    put_u64(mig.max_gap * 1000 / mig.tsc_khz);
    puts_(" max_gap_at_ms=");
    put_u64(mig.max_gap_at / mig.tsc_khz);
    puts_(" gaps_over_1ms=");
    put_u64(mig.gaps_over_1ms);
    puts_(" top_gaps=");
    for (int i = 0; i < MIG_TOP; i++) {
        if (i)
            puts_(",");
        put_u64(mig.top[i]);
        puts_("@");
        put_u64(mig.top_at[i]);
    }
    puts_(" bad=");
    put_u64(mig.bad);
    puts_(" ok=");
    put_u64(mig.bad == 0);
}
