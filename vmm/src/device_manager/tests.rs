//! The device manager against a real KVM VM (no vCPU): what a guest's BAR move does to the
//! device's mapping.

use std::sync::atomic::Ordering;

use kvm_ioctls::Kvm;
use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::*;
use crate::devices::pci::{BarChange, BarMapper};
use crate::devices::virtio::rng::Rng;
use crate::event_loop::EventLoop;

/// A BAR move that KVM refuses half-way (an ioeventfd already at the new notify address)
/// leaves the device wholly where it was: its notify ioeventfds still registered at the old
/// address, none left at the new one; a move to a free place then succeeds.
#[test]
fn a_refused_bar_move_leaves_the_device_where_it_was() {
    let Ok(kvm) = Kvm::new() else {
        return crate::test_skip::skip("a_refused_bar_move", "/dev/kvm is missing");
    };
    let vm = Arc::new(kvm.create_vm().unwrap());
    let mut dm = DeviceManager::new(vm, IrqchipMode::None);
    let el = EventLoop::start().unwrap();
    let mem = SharedGuestMemory::new(
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap(),
    );
    let dev = dm
        .add_virtio(
            "rng",
            Box::new(Rng::new()),
            &mem,
            el.handle(),
            Notify::Ioeventfd,
        )
        .unwrap();
    let _buses = dm.finish().unwrap();
    let slot = dm.virtio_devices()[0].slot;
    let at = routing_lock(&dm.mapper.slots)[&slot].addr;
    let registered = dm.ioeventfd_count();
    // Something else's ioeventfd where queue 0's notify would go.
    let to = at + 4 * VIRTIO_BAR_SIZE;
    let (blocker, notify) = (EventFd::new(0).unwrap(), dev.notify_events(to)[0].0);
    dm.register_ioeventfd(&blocker, &notify).unwrap();
    let change = |new| BarChange {
        bar: 0,
        old: Some(at),
        new: Some(new),
    };
    dm.mapper.bar_moved(slot, change(to));
    let refused = dev.health().refused_bar_moves.load(Ordering::Relaxed);
    assert_eq!(refused, 1, "the move was refused");
    assert_eq!(routing_lock(&dm.mapper.slots)[&slot].addr, at);
    assert_eq!(
        dm.ioeventfd_count(),
        registered + 1,
        "the old ones, the blocker"
    );
    // The old notify ioeventfds are still KVM's: registering one again is refused.
    let (old_event, old_fd) = dev.notify_events(at).swap_remove(0);
    assert!(crate::kvm::ioeventfd(&dm.vm, old_fd, &old_event, true).is_err());
    // A free place: moved, the ioeventfds with it.
    let free = at + 8 * VIRTIO_BAR_SIZE;
    dm.mapper.bar_moved(slot, change(free));
    assert_eq!(routing_lock(&dm.mapper.slots)[&slot].addr, free);
    assert_eq!(dm.ioeventfd_count(), registered + 1);
    let (new_event, new_fd) = dev.notify_events(free).swap_remove(0);
    assert!(crate::kvm::ioeventfd(&dm.vm, new_fd, &new_event, true).is_err());
    assert!(
        crate::kvm::ioeventfd(&dm.vm, old_fd, &old_event, true).is_ok(),
        "the old address is free again"
    );
}

/// A restore's devices go to the slots and BAR addresses the saved VM had them at, whatever
/// the order they are added in, and the saved entries say so; a place another device took is
/// refused naming it; devices added after the set-up go where there is room.
#[test]
fn restored_devices_go_back_to_their_slots_and_bars() {
    let Ok(kvm) = Kvm::new() else {
        return crate::test_skip::skip("restored_devices_places", "/dev/kvm is missing");
    };
    let vm = Arc::new(kvm.create_vm().unwrap());
    let mut dm = DeviceManager::new(vm, IrqchipMode::None);
    let el = EventLoop::start().unwrap();
    let mem = SharedGuestMemory::new(
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap(),
    );
    let bar = |n: u64| memory::PCI_MMIO_START + n * VIRTIO_BAR_SIZE;
    let entry = |slot, at| crate::snapshot::DeviceEntry {
        kind: "virtio-rng".into(),
        state: serde_json::json!({}),
        data: None,
        pci: Some(PciPlace { slot, bar: at }),
    };
    let saved = [("a", entry(4, bar(3))), ("b", entry(2, bar(0)))];
    dm.restore_places(
        &saved
            .iter()
            .map(|(n, e)| (n.to_string(), e.clone()))
            .collect(),
    );
    let add = |dm: &mut DeviceManager, name: &str| {
        let rng = Box::new(Rng::new());
        dm.add_virtio(name, rng, &mem, el.handle(), Notify::MmioExit)
    };
    add(&mut dm, "a").unwrap();
    add(&mut dm, "b").unwrap();
    dm.places.insert(
        "c".into(),
        PciPlace {
            slot: 4,
            bar: bar(5),
        },
    );
    let Err(e) = add(&mut dm, "c") else {
        panic!("a taken place was given");
    };
    assert!(
        e.to_string().contains("c cannot go back to PCI slot 4"),
        "{e}"
    );
    let _buses = dm.finish().unwrap();
    let devices = dm.snapshot_devices().unwrap();
    assert_eq!(
        devices["a"].pci,
        Some(PciPlace {
            slot: 4,
            bar: bar(3)
        })
    );
    assert_eq!(
        devices["b"].pci,
        Some(PciPlace {
            slot: 2,
            bar: bar(0)
        })
    );
    add(&mut dm, "d").unwrap();
    let d = dm.place_of("d").unwrap();
    assert_eq!((d.slot, d.bar), (1, bar(1)), "the lowest free slot and BAR");
}
