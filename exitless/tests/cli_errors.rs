//! Usage errors name what is wrong and what to do: clap's whole message (the missing
//! argument's name, a similar argument, the usage line) with exit code 2, and `--net` names a
//! tap that is not one, an empty tap name and a tap exitless created.

mod common;

fn run(args: &[&str]) -> (Option<i32>, String) {
    let o = common::exitless().args(args).output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn a_missing_argument_is_named_and_a_similar_one_suggested() {
    let (code, err) = run(&["remote", "ping"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.starts_with("exitless: the following required arguments were not provided:"),
        "{err}"
    );
    assert!(err.contains("--api-socket <PATH>"), "{err}");
    assert!(err.contains("Usage: exitless remote"), "{err}");
    let (code, err) = run(&["run", "--kernl", "k"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("unexpected argument '--kernl'"), "{err}");
    assert!(
        err.contains("a similar argument exists: '--kernel'"),
        "{err}"
    );
    assert_eq!(err.matches("exitless:").count(), 1, "one error: {err}");
}

#[test]
fn no_command_lists_every_command_of_this_build() {
    let (code, err) = run(&[]);
    assert_eq!(code, Some(2), "{err}");
    let lab = common::exitless_path();
    let has_lab = common::exitless()
        .args(["bench", "--help"])
        .output()
        .is_ok_and(|o| o.status.success());
    let want = if has_lab {
        "(bench, run, compare, remote)"
    } else {
        "(run, remote)"
    };
    assert!(err.contains(want), "{}: {err}", lab.display());
}

#[test]
fn a_net_that_is_not_a_tap_or_has_no_name_says_so() {
    // `lo` exists in every network namespace and is never a tap.
    let (code, err) = run(&["run", "--kernel", "/nonexistent", "--net", "tap=lo"]);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("'lo' is a network interface but not a tap device"),
        "{err}"
    );
    assert!(err.contains("ip tuntap add NAME mode tap"), "{err}");
    let (code, err) = run(&["run", "--kernel", "/nonexistent", "--net", "tap="]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("the tap name is empty"), "{err}");
}

/// As root, a tap name no interface has is created (as QEMU does) and said so in one line.
#[test]
fn a_tap_exitless_creates_is_said() {
    const TEST: &str = "cli_created_tap";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !std::path::Path::new("/dev/net/tun").exists() {
        return vmm::test_skip::skip(TEST, "creating a tap needs root and /dev/net/tun");
    }
    if !common::kvm_available(TEST) {
        return;
    }
    let guest = common::export_guest("created-tap");
    let name = format!("exl-new{}", std::process::id() % 100_000);
    let o = common::exitless()
        .args(["run", "--kernel"])
        .arg(&guest)
        .args(["--net", &format!("tap={name}"), "--timeout", "30"])
        .args(["--cmdline", "case=cpuid iters=10"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    std::fs::remove_file(&guest).ok();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let said = format!("exitless: created tap {name} (no interface had that name");
    assert_eq!(err.matches(&said).count(), 1, "{err}");
    assert!(
        !std::path::Path::new("/sys/class/net").join(&name).exists(),
        "the tap went with exitless"
    );
}
