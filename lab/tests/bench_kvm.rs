//! KVM integration tests: bench configurations run with small iteration counts and their exit
//! counts and profiles are checked exactly. Skipped (with a printed reason) without /dev/kvm.

use exitless_lab::bench::cases::{self, CaseConfig};
use exitless_lab::bench::config_run::ConfigRun;
use exitless_lab::bench::runner::run_config;
use vmm::profile::ExitReason;

const ITERS: u64 = 200;

fn kvm_available() -> bool {
    let ok = std::fs::metadata("/dev/kvm").is_ok();
    if !ok {
        vmm::test_skip::skip("bench_kvm", "/dev/kvm is missing on this host");
    }
    ok
}

fn config(case: &str, config: &str) -> (&'static cases::BenchCase, CaseConfig) {
    let c = cases::find(case).expect("case exists");
    let cfg = *c
        .configs
        .iter()
        .find(|x| x.name == config)
        .expect("config exists");
    (c, cfg)
}

fn run(case: &str, cfg: &str) -> ConfigRun {
    let (c, config) = config(case, cfg);
    let run = run_config(c, &config, ITERS, 2_000_000).expect("configuration runs");
    assert!(run.problems.is_empty(), "{case}/{cfg}: {:?}", run.problems);
    assert_eq!(run.iterations, ITERS);
    run
}

#[test]
fn unclaimed_port_exits_once_per_iteration_and_the_profile_counts_each_exit() {
    if !kvm_available() {
        return;
    }
    let r = run("pio_out", "userspace");
    assert_eq!(r.user_exits, ITERS);
    let out = r
        .profile
        .reason(ExitReason::IoOut)
        .expect("IO_OUT recorded");
    // The measured loop's exits plus the end marker's own exit.
    assert_eq!(out.stats.count, ITERS + 1);
    assert_eq!(out.unmapped.as_ref().map(|u| u.count), Some(ITERS));
    let marker = r.io_devices.iter().position(|n| n == "marker").unwrap();
    assert_eq!(out.devices[marker].count, 1);
    assert_eq!(r.profile.exit_count(), ITERS + 1);
}

#[test]
fn mmio_reads_are_profiled_as_mmio_reads() {
    if !kvm_available() {
        return;
    }
    let r = run("mmio_read", "userspace");
    assert_eq!(r.user_exits, ITERS);
    let reads = r
        .profile
        .reason(ExitReason::MmioRead)
        .expect("MMIO_READ recorded");
    assert_eq!(reads.stats.count, ITERS);
}

#[test]
fn ioeventfd_writes_never_reach_userspace_and_signal_every_write() {
    if !kvm_available() {
        return;
    }
    for (case, cfg) in [
        ("pio_out", "ioeventfd"),
        ("pio_out", "ioeventfd-datamatch"),
        ("mmio_write", "ioeventfd"),
        ("mmio_write", "fast-mmio"),
    ] {
        let r = run(case, cfg);
        assert_eq!(r.user_exits, 0, "{case}/{cfg}");
        assert_eq!(r.ioeventfd_signals, Some(ITERS), "{case}/{cfg}");
    }
}

#[test]
fn coalesced_writes_exit_only_when_the_ring_fills() {
    if !kvm_available() {
        return;
    }
    for (cfg, pio) in [("coalesced-mmio", false), ("coalesced-pio", true)] {
        let case = if pio { "pio_out" } else { "mmio_write" };
        let r = run(case, cfg);
        assert!(r.user_exits < ITERS / 10, "{cfg}: {} exits", r.user_exits);
        // Every write reached the bus (the target has no device: the unmapped slot) by the end
        // marker's exit, before that exit itself was handled: through the ring, or as an exit
        // when it found the ring full.
        let (queued, other) = if pio {
            (&r.profile.coalesced_pio, &r.profile.coalesced_mmio)
        } else {
            (&r.profile.coalesced_mmio, &r.profile.coalesced_pio)
        };
        assert!(
            queued.unmapped > ITERS / 2,
            "{cfg}: {} queued",
            queued.unmapped
        );
        assert_eq!(queued.unmapped + r.user_exits, ITERS, "{cfg}");
        assert_eq!(other.total(), 0, "{cfg}");
    }
}

#[test]
fn hlt_without_irqchip_exits_per_iteration_and_with_lapic_stays_in_kernel() {
    if !kvm_available() {
        return;
    }
    let r = run("hlt", "no-irqchip");
    assert_eq!(r.user_exits, ITERS);
    assert_eq!(
        r.profile.reason(ExitReason::Hlt).map(|h| h.stats.count),
        Some(ITERS)
    );
    let r = run("hlt", "in-kernel-lapic");
    assert_eq!((r.user_exits, r.ipis), (0, ITERS));
}

#[test]
fn register_ioctls_per_exit_still_count_one_exit_per_iteration() {
    if !kvm_available() {
        return;
    }
    for cfg in ["no-regs", "sync-regs", "get-regs", "get-set-regs"] {
        let r = run("regs", cfg);
        assert_eq!((r.cpl, r.user_exits), (0, ITERS), "{cfg}");
    }
}

#[test]
fn cpl0_cases_stay_in_the_kernel() {
    if !kvm_available() {
        return;
    }
    for case in ["cpuid", "msr_read", "msr_write", "hypercall"] {
        let r = run(case, "in-kernel");
        assert_eq!((r.cpl, r.user_exits), (0, 0), "{case}");
    }
    let r = run("cr8", "in-kernel-lapic");
    assert_eq!(r.user_exits, 0);
}

#[test]
fn profiling_off_still_counts_exits() {
    if !kvm_available() {
        return;
    }
    let r = run("profiler", "profiler-off");
    assert_eq!(r.user_exits, ITERS);
    assert_eq!(r.profile.exit_count(), 0);
}

#[test]
fn scaling_runs_every_vm_of_a_point_and_pins_vm_i_to_allowed_cpu_i() {
    if !kvm_available() {
        return;
    }
    use exitless_lab::bench::scaling::run_scaling;
    let case = cases::find("pio_out").unwrap();
    let report = run_scaling(&[case], ITERS, 2, |_| {}).expect("scaling runs");
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.series.len(), case.configs.len());
    let allowed = &report.allowed_cpus;
    for series in &report.series {
        assert_eq!(series.points.len(), 4, "{}", series.config);
        for p in &series.points {
            assert_eq!(p.runs.len(), p.vms);
            assert!(p.iterations_per_second > 0.0 && p.efficiency > 0.0);
            if p.pinned {
                for (i, run) in p.runs.iter().enumerate() {
                    assert_eq!(
                        run.host_cpus,
                        [allowed[i % allowed.len()]],
                        "{}",
                        series.config
                    );
                }
            }
        }
    }
}

#[test]
fn virtio_blk_requests_take_no_userspace_exit_with_ioeventfd_and_msix() {
    if !kvm_available() {
        return;
    }
    for cfg in [
        "qd1",
        "qd32",
        "qd32-polled",
        "qd32-write-through",
        "qd32-direct",
    ] {
        let r = run("virtio_blk", cfg);
        assert_eq!(r.user_exits, 0, "{cfg}");
        let blk = r.virtio.expect("virtio_blk figures");
        assert_eq!(blk.completed, ITERS, "{cfg}");
        assert_eq!(blk.malformed, 0, "{cfg}");
        if cfg == "qd32-polled" {
            assert_eq!(blk.interrupts, 0, "a polling guest set no vector");
        } else {
            assert!(blk.interrupts > 0, "{cfg}: the guest waited for interrupts");
        }
    }
}

#[test]
fn virtio_blk_notifies_through_the_vcpu_thread_exit_once_each() {
    if !kvm_available() {
        return;
    }
    let r = run("virtio_blk", "qd1-notify-exits");
    let blk = r.virtio.expect("virtio_blk figures");
    // At queue depth 1 the guest notifies for every request, and each notify is an exit.
    assert_eq!(blk.guest_notifies, ITERS);
    assert_eq!(r.user_exits, ITERS);
    assert_eq!(blk.completed, ITERS);
}

#[test]
fn virtio_net_frames_take_no_userspace_exit_with_ioeventfd_and_msix() {
    if !kvm_available() {
        return;
    }
    let (c, config) = config("virtio_net", "64B");
    let r = match run_config(c, &config, ITERS, 2_000_000) {
        Err(e @ exitless_lab::bench::config_run::RunError::Unavailable(_)) => {
            return vmm::test_skip::skip("bench_virtio_net", &e.to_string());
        }
        r => r.expect("configuration runs"),
    };
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert_eq!(r.user_exits, 0);
    let net = r.virtio.expect("virtio_net figures");
    assert_eq!(net.count("tx_frames"), ITERS);
    assert_eq!(net.count("tx_bytes"), ITERS * 64);
    // 32 frames queued per kick: far fewer notifies than frames.
    assert!(net.guest_notifies * 4 < ITERS, "{net:?}");
    // Receiving a host's flood: no exit to userspace either, every counted frame delivered.
    let r = run("virtio_net", "64B-rx");
    assert_eq!(r.user_exits, 0);
    let net = r.virtio.expect("virtio_net figures");
    assert!(net.count("rx_frames") >= ITERS, "{net:?}");
}

#[test]
fn virtio_vsock_round_trips_take_no_userspace_exit_and_lose_no_byte() {
    if !kvm_available() {
        return;
    }
    for cfg in ["rr-64B", "stream-4KiB"] {
        let r = run("virtio_vsock", cfg);
        assert_eq!(r.user_exits, 0, "{cfg}");
        let v = r.virtio.expect("virtio_vsock figures");
        let per = if cfg == "rr-64B" { 64 } else { 4096 };
        assert_eq!(v.count("tx_bytes"), ITERS * per, "{cfg}");
        assert_eq!((v.count("connections"), v.count("resets")), (1, 0), "{cfg}");
    }
}
