//! Guest memory as the devices see it. The VM's memory map grows while the VM runs (memory
//! hot-added through `vm.resize`), so a device cannot keep the map it got at activation: it
//! gets the VM's [`SharedGuestMemory`] (vm-memory's `GuestMemoryAtomic`, an RCU-style
//! `ArcSwap` of the map, replaced whole when a region is added) and serves each event through
//! a [`MemoryView`] it refreshes first: one atomic load, no lock, and a reference count only
//! when the map changed since the last event.
//!
//! Regions are only ever added, never removed or moved, so an address a device checked (a
//! receive buffer it holds, an in-flight disk request's iovecs) stays valid in every later map.

use std::ops::Deref;
use std::sync::Arc;

use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};

/// The VM's guest memory map, shared by the VMM (which adds regions) and every device.
pub type SharedGuestMemory = GuestMemoryAtomic<GuestMemoryMmap>;

/// A device worker's view of guest memory: the map as of its last [`MemoryView::refresh`].
/// Dereferences to the map, so the queue code takes `&view` where it took the map.
#[derive(Debug)]
pub struct MemoryView {
    shared: SharedGuestMemory,
    current: Arc<GuestMemoryMmap>,
}

impl MemoryView {
    pub fn new(shared: SharedGuestMemory) -> Self {
        let current = shared.memory().into_inner();
        MemoryView { shared, current }
    }

    /// Takes the newest map (regions added since the last call become reachable). Called by
    /// a worker at the start of every event it serves.
    pub fn refresh(&mut self) {
        let newest = self.shared.memory();
        if !std::ptr::eq(&*newest, Arc::as_ptr(&self.current)) {
            self.current = newest.into_inner();
        }
    }

    /// The map as of the last refresh, as a reference of its own (to hold while `self` is
    /// borrowed elsewhere).
    pub fn current(&self) -> Arc<GuestMemoryMmap> {
        self.current.clone()
    }

    /// The map itself (for calls generic over `GuestMemory`, where `&view` does not coerce).
    pub fn get(&self) -> &GuestMemoryMmap {
        &self.current
    }
}

impl Deref for MemoryView {
    type Target = GuestMemoryMmap;

    fn deref(&self) -> &GuestMemoryMmap {
        &self.current
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress, GuestRegionMmap};

    #[test]
    fn a_region_added_later_is_seen_after_a_refresh() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let shared = SharedGuestMemory::new(mem);
        let mut view = MemoryView::new(shared.clone());
        let high = GuestAddress(1 << 32);
        assert!(view.write_obj(7u32, high).is_err());
        let region = crate::memory::create_region(high, 1 << 20, &Default::default()).unwrap();
        let grown = shared
            .memory()
            .insert_region(Arc::new(region as GuestRegionMmap))
            .unwrap();
        shared.lock().unwrap().replace(grown);
        assert!(view.write_obj(7u32, high).is_err(), "not before a refresh");
        view.refresh();
        view.write_obj(7u32, high).unwrap();
        assert_eq!(shared.memory().read_obj::<u32>(high).unwrap(), 7);
        // The old regions are the same mappings in the new map.
        view.write_obj(9u32, GuestAddress(0x1000)).unwrap();
        assert_eq!(
            shared
                .memory()
                .read_obj::<u32>(GuestAddress(0x1000))
                .unwrap(),
            9
        );
    }
}
