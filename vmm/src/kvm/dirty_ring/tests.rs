//! The ring walker over a fake ring in memory (no KVM).

use super::*;

fn ring(n: usize) -> Vec<kvm_dirty_gfn> {
    vec![kvm_dirty_gfn::default(); n]
}

/// What KVM does when the vCPU dirties `page` of `slot`: the entry at `i`, then DIRTY.
fn push(ring: &mut [kvm_dirty_gfn], i: usize, slot: u32, page: u64) {
    let n = ring.len();
    let e = &mut ring[i % n];
    e.slot = slot;
    e.offset = page;
    e.flags = F_DIRTY;
}

#[test]
fn the_walker_takes_dirty_entries_in_order_and_sets_them_reset() {
    let mut entries = ring(8);
    push(&mut entries, 0, 0, 5);
    push(&mut entries, 1, 1, 7);
    push(&mut entries, 2, 0, 5);
    // SAFETY: `entries` outlives the view and does not move.
    let view = unsafe { RingView::over(&mut entries) };
    let mut seen = Vec::new();
    assert_eq!(view.harvest(|s, p| seen.push((s, p))), 3);
    assert_eq!(seen, [(0, 5), (1, 7), (0, 5)]);
    // Nothing new: a second walk takes nothing and stays at index 3.
    assert_eq!(view.harvest(|_, _| panic!("no entry")), 0);
    assert_eq!(view.fetch.load(Ordering::Relaxed), 3);
    drop(view);
    let flags: Vec<u32> = entries.iter().map(|e| e.flags).collect();
    assert_eq!(flags, [F_RESET, F_RESET, F_RESET, 0, 0, 0, 0, 0]);
}

#[test]
fn the_walker_stops_at_the_first_entry_kvm_has_not_filled_and_wraps() {
    let mut entries = ring(4);
    // SAFETY: `entries` outlives the view and does not move.
    let view = unsafe { RingView::over(&mut entries) };
    view.fetch.store(3, Ordering::Relaxed);
    // Index 3, then 4 = entry 0 again (after KVM reset it); entry 1 not filled.
    // SAFETY: the view only reads entries between its walks, as KVM writes them.
    let raw = unsafe { std::slice::from_raw_parts_mut(view.base.as_ptr(), 4) };
    push(raw, 3, 2, 9);
    push(raw, 4, 2, 10);
    let mut seen = Vec::new();
    assert_eq!(view.harvest(|s, p| seen.push((s, p))), 2);
    assert_eq!(seen, [(2, 9), (2, 10)]);
    assert_eq!(view.fetch.load(Ordering::Relaxed), 5);
}

#[test]
fn a_full_ring_is_walked_once_around_and_no_further() {
    let mut entries = ring(4);
    for i in 0..4 {
        push(&mut entries, i, 0, i as u64);
    }
    // SAFETY: `entries` outlives the view and does not move.
    let view = unsafe { RingView::over(&mut entries) };
    let mut pages = Vec::new();
    assert_eq!(view.harvest(|_, p| pages.push(p)), 4);
    assert_eq!(pages, [0, 1, 2, 3]);
}

#[test]
fn two_harvesters_share_a_ring_each_entry_once() {
    let mut entries = ring(1024);
    for i in 0..1024 {
        push(&mut entries, i, 0, i as u64);
    }
    // SAFETY: `entries` outlives the view and does not move.
    let view = unsafe { RingView::over(&mut entries) };
    let marks = Marks::new(1);
    assert!(marks.prepare(0, 1024));
    let counts = std::thread::scope(|s| {
        let a = s.spawn(|| view.harvest(|slot, p| marks.mark(slot, p)));
        let b = s.spawn(|| view.harvest(|slot, p| marks.mark(slot, p)));
        a.join().unwrap() + b.join().unwrap()
    });
    assert_eq!(counts, 1024);
    assert_eq!(marks.take(0), vec![u64::MAX; 16]);
    assert_eq!(marks.take(0), vec![0; 16], "taking clears");
}

#[test]
fn marks_outside_the_prepared_slots_are_counted_not_kept() {
    let marks = Marks::new(2);
    assert!(marks.prepare(0, 100));
    assert!(!marks.prepare(2, 100), "no room for slot 2");
    marks.mark(0, 99);
    marks.mark(0, 128);
    marks.mark(1, 0);
    marks.mark(7, 0);
    assert_eq!(marks.stray.load(Ordering::Relaxed), 3);
    assert_eq!(marks.take(0), [0, 1 << 35]);
    assert!(marks.take(1).is_empty());
}
