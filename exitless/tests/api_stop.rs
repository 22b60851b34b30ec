//! A stop never depends on a path: SIGTERM and SIGINT end `exitless --api-socket` within a
//! second in every state of its VM, even when the socket file was removed (an orchestrator's
//! clean-up) or replaced by someone else's, whose file then stays.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::api_vmm::{kvm_or_skip, ok, Vmm};
use common::export_guest;

/// The states a VMM can be stopped in, and how to bring it there.
#[derive(Debug, Clone, Copy)]
enum State {
    Empty,
    Created,
    Running,
    Paused,
    /// A disk asked back that the guest does not eject (the bench case ignores ACPI).
    MidHotplug,
}

fn scratch(tag: &str, ext: &str) -> PathBuf {
    std::env::temp_dir().join(format!("exitless-stop-{tag}-{}.{ext}", std::process::id()))
}

fn create_body(kernel: &Path) -> String {
    serde_json::json!({
        "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
        "memory": {"size": 64u64 << 20},
        "payload": {"kernel": kernel, "cmdline": "case=pio_out iters=100000000"},
        "serial": {"mode": "Off"},
    })
    .to_string()
}

fn bring(vmm: &Vmm, state: State, kernel: &Path, disk: &Path) {
    let mut c = vmm.client();
    let mut put = |endpoint: &str, body: Option<&str>| {
        ok(c.request("PUT", endpoint, body).unwrap(), endpoint);
    };
    if matches!(state, State::Empty) {
        return;
    }
    put("vm.create", Some(&create_body(kernel)));
    if matches!(state, State::Created) {
        return;
    }
    put("vm.boot", None);
    match state {
        State::Paused => put("vm.pause", None),
        State::MidHotplug => {
            let disk = serde_json::json!({"path": disk, "id": "held"}).to_string();
            put("vm.add-disk", Some(&disk));
            put("vm.remove-device", Some(r#"{"id":"held"}"#));
        }
        _ => {}
    }
}

fn signal(vmm: &Vmm, signal: i32) {
    // SAFETY: kill sends a signal to the child this test started; no memory is involved.
    unsafe { libc::kill(vmm.pid() as i32, signal) };
}

#[test]
fn a_stop_signal_ends_the_vmm_within_a_second_whatever_became_of_its_socket() {
    if !kvm_or_skip("api_stop") {
        return;
    }
    let kernel = export_guest("api-stop");
    let disk = scratch("disk", "img");
    std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
    let states = [
        State::Empty,
        State::Created,
        State::Running,
        State::Paused,
        State::MidHotplug,
    ];
    for (i, state) in states.into_iter().enumerate() {
        for (sig, replaced) in [(libc::SIGTERM, false), (libc::SIGINT, true)] {
            let mut vmm = Vmm::start(&format!("stop{i}-{sig}"));
            bring(&vmm, state, &kernel, &disk);
            // The file goes; with `replaced`, another program's file takes its place.
            std::fs::remove_file(&vmm.socket).unwrap();
            if replaced {
                std::fs::write(&vmm.socket, b"someone else's").unwrap();
            }
            let start = Instant::now();
            signal(&vmm, sig);
            let status = vmm
                .wait_exit(Duration::from_secs(1))
                .unwrap_or_else(|| panic!("{state:?}: still running 1 s after signal {sig}"));
            assert_eq!(status.code(), Some(130), "{state:?}, signal {sig}");
            eprintln!("{state:?}, signal {sig}: ended in {:?}", start.elapsed());
            if replaced {
                let kept = std::fs::read(&vmm.socket).unwrap_or_default();
                assert_eq!(kept, b"someone else's", "a file not ours is left alone");
                std::fs::remove_file(&vmm.socket).unwrap();
            }
        }
    }
    let _ = std::fs::remove_file(&kernel);
    let _ = std::fs::remove_file(&disk);
}
