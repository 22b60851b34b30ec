use super::*;

fn mem(s: &str) -> Result<u64, String> {
    s.parse::<MemorySize>()
        .map(|m| m.bytes())
        .map_err(|e| e.to_string())
}

#[test]
fn memory_sizes_parse() {
    assert_eq!(mem("512M"), Ok(512 << 20));
    assert_eq!(mem("1G"), Ok(1 << 30));
    assert_eq!(mem("1GiB"), Ok(1 << 30));
    assert_eq!(mem("1g"), Ok(1 << 30));
    assert_eq!(mem("2048"), Ok(2048 << 20));
    assert_eq!(mem("4096K"), Ok(4 << 20));
    assert_eq!(mem(" 64 MiB "), Ok(64 << 20));
    assert_eq!(mem("1T"), Ok(1 << 40));
}

#[test]
fn bad_memory_sizes_are_rejected() {
    assert_eq!(
        mem("abc").unwrap_err(),
        "Invalid memory size 'abc': expected a number of MiB, or a number with a K, M, G or T suffix (e.g. 512M, 2G)"
    );
    for bad in ["", "M", "12X", "1.5G", "-1G", "1GB", "1Gi", "5Mé", "1 2M"] {
        assert!(mem(bad).unwrap_err().contains("expected a number"), "{bad}");
    }
    assert_eq!(
        mem("0").unwrap_err(),
        "Invalid memory size '0': must be greater than zero"
    );
    assert!(mem("99999999999999999999999")
        .unwrap_err()
        .ends_with("too large"));
    assert!(mem("17179869184G").unwrap_err().ends_with("too large"));
    assert!(mem("1K").unwrap_err().ends_with("multiple of 4K"));
}

#[test]
fn memory_sizes_print_in_largest_exact_unit() {
    let show = |s: &str| s.parse::<MemorySize>().unwrap().to_string();
    assert_eq!(show("1024M"), "1G");
    assert_eq!(show("1536M"), "1536M");
    assert_eq!(show("4100K"), "4100K");
    assert_eq!(MemorySize::default().to_string(), "512M");
    assert_eq!(MemorySize::default().mib(), 512);
}

#[test]
fn irqchip_modes_parse_and_print() {
    for m in [IrqchipMode::Kernel, IrqchipMode::Split, IrqchipMode::None] {
        assert_eq!(m.to_string().parse::<IrqchipMode>().unwrap(), m);
    }
    assert_eq!("SPLIT".parse::<IrqchipMode>().unwrap(), IrqchipMode::Split);
    assert_eq!(
        "userspace".parse::<IrqchipMode>().unwrap_err().to_string(),
        "Invalid irqchip mode 'userspace': expected kernel, split or none"
    );
}

#[test]
fn cpu_affinity_parses() {
    let a: CpuAffinity = "0, 2,3".parse().unwrap();
    assert_eq!(a.cpus(), &[0, 2, 3]);
    assert_eq!(a.host_cpu(1), Some(2));
    assert_eq!(a.host_cpu(3), None);
    assert_eq!(a.to_string(), "0,2,3");
    for bad in ["", "a", "1,,2", "-1", "1;2"] {
        assert!(bad.parse::<CpuAffinity>().is_err(), "{bad}");
    }
    assert!(CpuAffinity::new(vec![]).is_err());
}

fn full() -> VmConfig {
    VmConfig {
        kernel: "guest/vmlinux".into(),
        initrd: Some("guest/initramfs.cpio.gz".into()),
        cmdline: "console=ttyS0".into(),
        cpus: 2,
        max_vcpus: Some(4),
        memory: "1G".parse().unwrap(),
        shared_memory: true,
        hugepages: false,
        hugepage_size: None,
        memory_zones: Vec::new(),
        hotplug_memory: Some("2G".parse().unwrap()),
        serial_log: Some("serial.log".into()),
        serial_output: SerialOutputMode::Stdout,
        irqchip: IrqchipMode::Split,
        cpu_affinity: Some("2,3".parse().unwrap()),
        disks: vec!["path=a.img,readonly=on".parse().unwrap()],
        rng: true,
        nets: vec!["tap=tap0,mac=52:54:00:00:00:07".parse().unwrap()],
        vsock: Some("cid=3,socket=/run/v.sock".parse().unwrap()),
        fs: vec!["tag=share,socket=/run/fs.sock".parse().unwrap()],
        balloon: Some("size=8M,free_page_reporting=on".parse().unwrap()),
        generic_vhost_user: vec!["socket=/run/g.sock,device_type=2,queue_sizes=[128]"
            .parse()
            .unwrap()],
        pmem: vec!["file=/run/p.img,size=2M".parse().unwrap()],
    }
}

#[test]
fn json_round_trip() {
    let c = full();
    let text = c.to_json();
    assert!(text.contains("\"memory\": \"1G\""), "{text}");
    assert!(text.contains("\"irqchip\": \"split\""), "{text}");
    assert_eq!(VmConfig::from_json_str(&text, Path::new("x")).unwrap(), c);
    let d = VmConfig::new("k");
    let back = VmConfig::from_json_str(&d.to_json(), Path::new("x")).unwrap();
    assert_eq!(back, d);
}

#[test]
fn json_defaults_and_alternate_forms() {
    let text = r#"{"kernel": "k", "memory": 256, "cpu_affinity": "1,0", "cpus": 2}"#;
    let c = VmConfig::from_json_str(text, Path::new("x")).unwrap();
    assert_eq!(c.memory.bytes(), 256 << 20);
    assert_eq!(c.cpu_affinity.unwrap().cpus(), &[1, 0]);
    assert_eq!(c.cmdline, DEFAULT_CMDLINE);
    assert_eq!(c.irqchip, IrqchipMode::Kernel);
    assert_eq!(c.initrd, None);
}

#[test]
fn json_errors_are_clear() {
    let p = Path::new("vm.json");
    let e = VmConfig::from_json_str("{\"kernel\": \"k\",\n \"cpu\": 2}", p).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with("Invalid config file vm.json at line 2, column"),
        "{msg}"
    );
    assert!(msg.contains("unknown field `cpu`"), "{msg}");
    let e = VmConfig::from_json_str(r#"{"memory": "lots"}"#, p).unwrap_err();
    assert!(e.to_string().contains("Invalid memory size 'lots'"), "{e}");
    let e = VmConfig::from_json_str("{\"kernel\": ", p).unwrap_err();
    assert!(matches!(e, ConfigError::Json { line: 1, .. }), "{e}");
    let e = VmConfig::from_json_file(Path::new("/nonexistent/vm.json")).unwrap_err();
    assert!(e
        .to_string()
        .starts_with("Cannot read config file /nonexistent/vm.json: "));
}

#[test]
fn json_file_loads() {
    let path = std::env::temp_dir().join(format!("exitless-cfg-{}.json", std::process::id()));
    std::fs::write(&path, full().to_json()).unwrap();
    let c = VmConfig::from_json_file(&path);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(c.unwrap(), full());
}

#[test]
fn cli_overrides_file() {
    let cli = VmConfigOverrides {
        cpus: Some(4),
        memory: Some("2G".parse().unwrap()),
        irqchip: Some(IrqchipMode::None),
        ..Default::default()
    };
    let c = VmConfig::merge_cli(Some(full()), cli).unwrap();
    assert_eq!(c.cpus, 4);
    assert_eq!(c.memory.bytes(), 2 << 30);
    assert_eq!(c.irqchip, IrqchipMode::None);
    assert_eq!(c.kernel, full().kernel);
    assert_eq!(c.initrd, full().initrd);
    assert_eq!(c.cpu_affinity, full().cpu_affinity);

    let only_cli = VmConfigOverrides {
        kernel: Some("vmlinux".into()),
        ..Default::default()
    };
    assert_eq!(
        VmConfig::merge_cli(None, only_cli).unwrap(),
        VmConfig::new("vmlinux")
    );
    let e = VmConfig::merge_cli(None, VmConfigOverrides::default()).unwrap_err();
    assert!(matches!(e, ConfigError::NoKernel));
}

#[test]
fn validation_errors() {
    let check = |f: &dyn Fn(&mut VmConfig)| {
        let mut c = full();
        f(&mut c);
        c.validate(8).err().map(|e| e.to_string())
    };
    assert_eq!(check(&|_| {}), None);
    assert_eq!(check(&|c| c.cpus = 0).unwrap(), "--cpus must be at least 1");
    assert_eq!(
        check(&|c| c.cpus = 9).unwrap(),
        "--cpus 9 is more than the 8 vCPUs possible here (254 at most, the xAPIC ID limit, or fewer if KVM allows fewer)"
    );
    assert_eq!(
        check(&|c| c.memory = MemorySize::from_mib(8)).unwrap(),
        "--memory 8M is below the minimum of 16M"
    );
    assert!(check(&|c| c.memory = MemorySize::from_mib(16)).is_none());
    assert!(check(&|c| c.memory = MemorySize::from_mib(2 << 20))
        .unwrap()
        .contains("exceeds the maximum"));
    assert_eq!(
        check(&|c| c.cpus = 3).unwrap(),
        "--cpu-affinity lists 2 host CPUs for 3 vCPUs: one CPU per vCPU (--cpus 2 for this \
         list, or list 3 CPUs)"
    );
    assert!(check(&|c| c.kernel = PathBuf::new())
        .unwrap()
        .starts_with("No kernel given"));
    assert!(check(&|c| c.cmdline = "x".repeat(3000))
        .unwrap()
        .contains("3000 bytes"));
    assert!(check(&|c| c.cmdline.push('\0')).unwrap().contains("NUL"));
    assert_eq!(
        check(&|c| c.balloon.as_mut().unwrap().size = 2 << 30).unwrap(),
        "Invalid --balloon 'size=2G': size 2G is more than the guest's 1G of memory"
    );
}
