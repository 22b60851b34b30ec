//! The conversions between Cloud Hypervisor's schema and exitless's configuration.

use super::*;

fn parse(body: &str) -> VmConfig {
    serde_json::from_str(body).unwrap()
}

#[test]
fn a_kata_body_becomes_exitless_config() {
    let text = include_str!("../fixtures/kata_clh_sandbox.json");
    let seq: Value = serde_json::from_str(text).unwrap();
    let create = &seq["requests"][1]["body"];
    let c: VmConfig = serde_json::from_value(create.clone()).unwrap();
    let vm = c.to_vm_config().unwrap();
    assert_eq!((vm.cpus, vm.max_vcpus), (1, Some(2)));
    assert_eq!(vm.memory.bytes(), 256 << 20);
    assert_eq!(vm.disks.len(), 1);
    assert!(vm.disks[0].readonly);
    assert!(vm.rng);
    assert_eq!(vm.serial_output, SerialOutputMode::Discard);
    assert_eq!(vm.vsock.as_ref().map(|v| v.cid), Some(3));
}

#[test]
fn features_exitless_lacks_are_refused_by_name() {
    for (body, field) in [
        (
            r#"{"payload":{"kernel":"/k"},"fs":[{"tag":"x","socket":"/s"}]}"#,
            "fs needs memory.shared=true",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"memory":{"shared":true},"fs":[{"tag":"x","socket":"/s","pci_segment":1}]}"#,
            "pci_segment 1 is not below platform.num_pci_segments 1",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"memory":{"shared":true},"fs":[{"tag":"","socket":"/s"}]}"#,
            "fs: tag=",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"devices":[{"path":"/sys/x"}]}"#,
            "devices is not supported by exitless: VFIO",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"vdpa":[{"path":"/dev/vhost-vdpa-0"}]}"#,
            "no /dev/vhost-vdpa",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"user_devices":[{"socket":"/s"}]}"#,
            "vfio-user devices are not implemented",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"disks":[{"vhost_user":true,"vhost_socket":"/s"}]}"#,
            "A vhost-user disk needs shared guest memory",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"memory":{"shared":true},"disks":[{"vhost_user":true,"vhost_socket":"/s","readonly":true}]}"#,
            "the vhost-user back end's to set",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"disks":[{"path":"/d","vhost_socket":"/s"}]}"#,
            "vhost_socket needs disks[].vhost_user=true",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"generic_vhost_user":[{"socket":"/s","device_type":2,"queue_sizes":[128]}]}"#,
            "generic_vhost_user needs memory.shared=true",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"memory":{"shared":true},"generic_vhost_user":[{"socket":"/s","device_type":0,"queue_sizes":[128]}]}"#,
            "not a virtio device type",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"pmem":[{"file":"/p","size":4096}]}"#,
            "pmem: size 4096 is not a non-zero multiple of 2 MiB",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"pmem":[{"file":"/p","iommu":true}]}"#,
            "pmem[].iommu",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"sgx_epc":[{"size":1}]}"#,
            "sgx_epc",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"platform":{"tdx":true}}"#,
            "platform.tdx",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"memory":{"size":268435456,"hugepages":true,"hugepage_size":4096}}"#,
            "memory.hugepage_size",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"memory":{"size":268435456,"hugepage_size":2097152}}"#,
            "hugepage_size needs hugepages=on",
        ),
        (r#"{"payload":{"firmware":"/fw"}}"#, "payload.firmware"),
        (
            r#"{"payload":{"kernel":"/k"},"disks":[{"path":"/d","image_type":"Qcow2"}]}"#,
            "image_type",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"disks":[{"path":"/d","vhost_user":true}]}"#,
            "vhost_user",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"serial":{"mode":"Pty"}}"#,
            "serial.mode",
        ),
        (r#"{"payload":{}}"#, "payload.kernel"),
    ] {
        let e = parse(body).to_vm_config().unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains(field), "{body}: {}", e.message);
    }
}

#[test]
fn vhost_user_disks_generic_devices_and_pmem_convert_and_come_back_in_vm_info() {
    let body = r#"{"payload":{"kernel":"/k"},"memory":{"size":268435456,"shared":true},
        "disks":[{"vhost_user":true,"vhost_socket":"/run/b.sock","num_queues":1,"queue_size":128}],
        "generic_vhost_user":[{"socket":"/run/g.sock","device_type":2,"queue_sizes":[128]}],
        "pmem":[{"file":"/p.img","size":2097152,"discard_writes":true}]}"#;
    let vm = parse(body).to_vm_config().unwrap();
    let d = &vm.disks[0];
    assert!(d.vhost_user && d.path.as_os_str().is_empty());
    assert_eq!(
        d.vhost_socket.as_deref(),
        Some(std::path::Path::new("/run/b.sock"))
    );
    assert_eq!(vm.generic_vhost_user[0].queue_sizes, [128]);
    assert_eq!(
        (vm.pmem[0].size, vm.pmem[0].discard_writes),
        (Some(2 << 20), true)
    );
    let back = VmConfig::from_vm_config(&vm);
    let disk = &back.disks.as_ref().unwrap()[0];
    assert_eq!((disk.path.as_deref(), disk.vhost_user()), (None, true));
    assert_eq!(
        back.generic_vhost_user.unwrap()[0].id.as_deref(),
        Some("_generic_vhost_user0")
    );
    assert_eq!(back.pmem.unwrap()[0].id.as_deref(), Some("_pmem0"));
}

#[test]
fn fields_without_effect_are_accepted() {
    let body = r#"{"payload":{"kernel":"/k"},"platform":{"num_pci_segments":2},
        "memory":{"size":268435456,"hotplug_size":1073741824,"thp":true,"mergeable":false},
        "pvpanic":false,"watchdog":false,"iommu":false,"balloon":null,
        "console":{"mode":"Off"},"rng":{"src":"/dev/urandom"}}"#;
    parse(body).to_vm_config().unwrap();
}

#[test]
fn hotplug_size_is_taken_and_virtio_mem_refused() {
    let body = r#"{"payload":{"kernel":"/k"},"memory":{"size":268435456,
        "hotplug_size":1073741824,"hotplug_method":"Acpi"}}"#;
    let vm = parse(body).to_vm_config().unwrap();
    assert_eq!(vm.hotplug_memory.map(MemorySize::bytes), Some(1 << 30));
    assert_eq!(vm.hotplug_ram().map(|r| r.slots()), Some(8));
    let back = serde_json::to_value(VmConfig::from_vm_config(&vm)).unwrap();
    assert_eq!(back["memory"]["hotplug_size"], 1073741824u64);
    let none = parse(r#"{"payload":{"kernel":"/k"},"memory":{"hotplug_size":0}}"#);
    assert!(none.to_vm_config().unwrap().hotplug_memory.is_none());
    for (body, why) in [
        (
            r#"{"payload":{"kernel":"/k"},"memory":{"hotplug_size":1073741824,"hotplug_method":"VirtioMem"}}"#,
            "memory.hotplug_method VirtioMem is not supported",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"memory":{"hotplug_method":"Dimm"}}"#,
            "hotplug_method Dimm is unknown",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"memory":{"hotplug_size":1000}}"#,
            "hotplug_size 1000 is not a whole number of MiB",
        ),
    ] {
        let e = parse(body).to_vm_config().unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains(why), "{body}: {}", e.message);
    }
    let virtio_mem_without_hotplug =
        r#"{"payload":{"kernel":"/k"},"memory":{"hotplug_method":"VirtioMem"}}"#;
    parse(virtio_mem_without_hotplug).to_vm_config().unwrap();
}

#[test]
fn shared_and_huge_page_memory_are_taken_and_shown_back() {
    let body = r#"{"payload":{"kernel":"/k"},"memory":{"size":268435456,"shared":true,
        "hugepages":true,"hugepage_size":2097152}}"#;
    let vm = parse(body).to_vm_config().unwrap();
    assert!(vm.shared_memory && vm.hugepages);
    let backing = vm.memory_backing();
    assert_eq!(backing.hugepage_size, Some(vmm::memory::HUGEPAGE_2M));
    let back = serde_json::to_value(VmConfig::from_vm_config(&vm)).unwrap();
    assert_eq!(back["memory"]["shared"], true);
    assert_eq!(back["memory"]["hugepages"], true);
    assert_eq!(back["memory"]["hugepage_size"], 2097152);
}

#[test]
fn a_template_vm_s_memory_zone_is_taken_and_shown_back() {
    let body = r#"{"payload":{"kernel":"/k"},"memory":{"size":0,"shared":true,
        "zones":[{"id":"mem0","size":268435456,"file":"/run/t/memory","shared":true}]}}"#;
    let vm = parse(body).to_vm_config().unwrap();
    assert_eq!(vm.memory.bytes(), 256 << 20);
    assert_eq!(vm.memory_zones.len(), 1);
    assert_eq!(
        vm.memory_zones[0].file.as_deref(),
        Some(std::path::Path::new("/run/t/memory"))
    );
    let back = serde_json::to_value(VmConfig::from_vm_config(&vm)).unwrap();
    assert_eq!(back["memory"]["size"], 0);
    assert_eq!(back["memory"]["zones"][0]["shared"], true);
    assert_eq!(back["memory"]["zones"][0]["file"], "/run/t/memory");
    for (body, why) in [
        (
            r#"{"payload":{"kernel":"/k"},"memory":{"size":0}}"#,
            "needs memory.zones",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"memory":{"size":268435456,"zones":[{"id":"a","size":268435456}]}}"#,
            "memory.size must be 0",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"memory":{"size":0,"zones":[{"id":"a","size":268435456,"host_numa_node":1}]}}"#,
            "memory.zones[].host_numa_node",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"memory":{"size":0,"zones":[{"id":"a","size":134217728},{"id":"a","size":134217728}]}}"#,
            "distinct",
        ),
    ] {
        let e = parse(body).to_vm_config().unwrap_err();
        assert!(e.message.contains(why), "{body}: {}", e.message);
    }
}

/// Zones with a `hotplug_size` (`vm.resize-zone`): together the VM's hotplug area; with
/// zones, `memory.hotplug_size` and `hotplugged_size` are refused, uneven sizes too.
#[test]
fn zone_hotplug_sizes_make_up_the_hotplug_area() {
    let body = r#"{"payload":{"kernel":"/k"},"memory":{"size":0,"zones":[
        {"id":"a","size":268435456,"hotplug_size":536870912},
        {"id":"b","size":134217728,"hotplug_size":268435456},
        {"id":"c","size":134217728}]}}"#;
    let vm = parse(body).to_vm_config().unwrap();
    assert_eq!(vm.memory.bytes(), 512 << 20);
    assert_eq!(vm.hotplug_memory.map(MemorySize::bytes), Some(768 << 20));
    assert!(
        vm.validate(8).is_ok(),
        "zones with hotplug are a valid config"
    );
    for (body, why) in [
        (
            r#"{"payload":{"kernel":"/k"},"memory":{"size":0,"hotplug_size":268435456,"zones":[{"id":"a","size":268435456}]}}"#,
            "give each zone its hotplug_size",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"memory":{"size":0,"zones":[{"id":"a","size":268435456,"hotplugged_size":134217728}]}}"#,
            "hotplugged_size",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"memory":{"size":0,"zones":[{"id":"a","size":268435456,"hotplug_size":1000}]}}"#,
            "hotplug_size 1000 of zone a is not a whole number of MiB",
        ),
    ] {
        let e = parse(body).to_vm_config().unwrap_err();
        assert!(e.message.contains(why), "{body}: {}", e.message);
    }
}

#[test]
fn kata_s_virtio_fs_body_is_taken() {
    let body = r#"{"payload":{"kernel":"/k"},"platform":{"num_pci_segments":2},
        "memory":{"size":268435456,"shared":true,"hugepages":false,"hotplug_size":2147483648},
        "fs":[{"tag":"kataShared","socket":"/run/vc/vfs.sock","num_queues":1,
               "queue_size":1024,"pci_segment":1}]}"#;
    let vm = parse(body).to_vm_config().unwrap();
    assert!(vm.shared_memory);
    assert_eq!(vm.fs.len(), 1);
    let f = &vm.fs[0];
    assert_eq!(
        (f.tag.as_str(), f.num_queues, f.queue_size),
        ("kataShared", 1, 1024)
    );
    assert_eq!(f.socket, PathBuf::from("/run/vc/vfs.sock"));
    let back = serde_json::to_value(VmConfig::from_vm_config(&vm)).unwrap();
    assert_eq!(back["fs"][0]["tag"], "kataShared");
    assert_eq!(back["fs"][0]["id"], "_fs0");
}

#[test]
fn a_balloon_is_accepted_and_converted() {
    // What Kata sends with reclaim_guest_freed_memory = true.
    let body = r#"{"payload":{"kernel":"/k"},"memory":{"size":268435456},
        "balloon":{"size":0,"free_page_reporting":true}}"#;
    let vm = parse(body).to_vm_config().unwrap();
    let b = vm.balloon.expect("a balloon");
    assert_eq!(
        (b.size, b.free_page_reporting, b.deflate_on_oom),
        (0, true, false)
    );
    let body = r#"{"payload":{"kernel":"/k"},"memory":{"size":268435456},
        "balloon":{"id":"b0","size":67108864,"deflate_on_oom":true,"stats_polling_interval":0}}"#;
    let c = parse(body);
    let b = c.to_vm_config().unwrap().balloon.unwrap();
    assert_eq!(
        (b.size, b.deflate_on_oom, b.free_page_reporting),
        (64 << 20, true, false)
    );
    assert_eq!(b.id.as_deref(), Some("b0"));
    assert_eq!(
        c.balloon.unwrap().extra["stats_polling_interval"],
        0,
        "kept"
    );
    let too_big = r#"{"payload":{"kernel":"/k"},"memory":{"size":268435456},
        "balloon":{"size":536870912}}"#;
    let e = parse(too_big).to_vm_config().unwrap_err();
    assert_eq!(e.status, 400);
    assert!(
        e.message.starts_with("balloon.size 512M is more than"),
        "{}",
        e.message
    );
    assert!(
        serde_json::from_str::<VmConfig>(r#"{"balloon":{}}"#).is_err(),
        "size is required"
    );
    // And back, for `run --api-socket`'s vm.info.
    let mut cli = config::VmConfig::new("/k");
    cli.balloon = Some("free_page_reporting=on".parse().unwrap());
    let shown = VmConfig::from_vm_config(&cli).balloon.unwrap();
    assert!(shown.free_page_reporting);
    assert_eq!(shown.id.as_deref(), Some("_balloon0"));
}

#[test]
fn a_net_body_takes_its_tap_from_the_fds_sent_with_it() {
    let n: NetConfig =
        serde_json::from_str(r#"{"mac":"02:00:00:4b:52:01","num_queues":2}"#).unwrap();
    assert!(n.to_net_config(Vec::new()).is_err());
    let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
    let c = n.to_net_config(vec![a.into()]).unwrap();
    assert!(c.tap_fd.is_some());
    assert_eq!(
        c.mac.map(|m| m.to_string()).as_deref(),
        Some("02:00:00:4b:52:01")
    );
}

#[test]
fn the_console_is_shown_as_it_runs_and_taken_back() {
    for (mode, shown) in [
        (SerialOutputMode::Stdout, r#"{"mode":"Tty"}"#),
        (SerialOutputMode::Discard, r#"{"mode":"Null"}"#),
        (
            SerialOutputMode::File(PathBuf::from("/tmp/console.log")),
            r#"{"mode":"File","file":"/tmp/console.log"}"#,
        ),
    ] {
        let mut cli = config::VmConfig::new("/k");
        cli.serial_output = mode.clone();
        let body = VmConfig::from_vm_config(&cli);
        let json = serde_json::to_value(&body).unwrap();
        let want: serde_json::Value = serde_json::from_str(shown).unwrap();
        assert_eq!(json["serial"], want);
        // A restore reads config.json back: the console goes where it went.
        let back: VmConfig = serde_json::from_value(json).unwrap();
        assert_eq!(back.to_vm_config().unwrap().serial_output, mode);
    }
}
