//! `run --net tap=NAME`'s name, checked before the VM is built: a network interface that is
//! not a tap (`lo`, `eth0`, a tun) is refused by name with what to do, and a name no interface
//! has is said to be a tap exitless creates (opening a missing tap creates it, as QEMU and
//! Cloud Hypervisor do; created this way it is down, has no address and goes when exitless
//! ends: a mistyped name would otherwise leave the guest on an unconnected tap unsaid).

use std::path::Path;

/// IFF_TAP in a tun device's `tun_flags`.
const IFF_TAP: u32 = 0x0002;

/// What opening the tap `name` will do.
#[derive(Debug, PartialEq, Eq)]
pub enum TapPlan {
    /// Open the existing tap.
    Existing,
    /// No interface has the name: opening creates the tap.
    Create,
}

/// Checks `name`, whose index in this network namespace is `index` (0: no such interface),
/// against its entry in `sys_class_net` (/sys/class/net). That entry is another namespace's
/// when exitless joined a namespace without mounting its sysfs (`nsenter --net`): an entry
/// whose ifindex differs tells nothing, and the open decides.
pub fn plan(name: &str, index: u32, sys_class_net: &Path) -> anyhow::Result<TapPlan> {
    if index == 0 {
        return Ok(TapPlan::Create);
    }
    let dir = sys_class_net.join(name);
    let same =
        std::fs::read_to_string(dir.join("ifindex")).is_ok_and(|i| i.trim().parse() == Ok(index));
    if !same {
        return Ok(TapPlan::Existing);
    }
    let make = "make one with `ip tuntap add NAME mode tap` (root) and give --net tap=NAME, or \
                name an existing tap (`ip tuntap show` lists them)";
    let Ok(flags) = std::fs::read_to_string(dir.join("tun_flags")) else {
        anyhow::bail!(
            "--net tap={name}: '{name}' is a network interface but not a tap device; {make}"
        );
    };
    let flags = u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).unwrap_or(0);
    if flags & IFF_TAP == 0 {
        anyhow::bail!("--net tap={name}: '{name}' is a tun device, not a tap; {make}");
    }
    Ok(TapPlan::Existing)
}

/// The interface index of `name` in this process's network namespace, 0 if none has it.
fn index_of(name: &str) -> u32 {
    let Ok(name) = std::ffi::CString::new(name) else {
        return 0;
    };
    // SAFETY: if_nametoindex reads the NUL-terminated string it is given and nothing else.
    unsafe { libc::if_nametoindex(name.as_ptr()) }
}

/// The taps of `names` that opening will create.
pub fn to_create<'a>(names: impl Iterator<Item = &'a str>) -> anyhow::Result<Vec<&'a str>> {
    let sys = Path::new("/sys/class/net");
    let mut created = Vec::new();
    for name in names {
        if plan(name, index_of(name), sys)? == TapPlan::Create {
            created.push(name);
        }
    }
    Ok(created)
}

/// The line that says a tap was created.
pub fn created_line(name: &str) -> String {
    format!(
        "exitless: created tap {name} (no interface had that name; it is down, has no address \
         and goes when exitless ends: `ip link set {name} up` to use it, or check the name)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interface_that_is_not_a_tap_is_refused_and_a_missing_one_is_created() {
        let sys = std::env::temp_dir().join(format!("exitless-sys-net-{}", std::process::id()));
        let interfaces = [
            ("lo", 1, None),
            ("tun0", 5, Some("0x1001")),
            ("tap0", 6, Some("0x5002")),
        ];
        for (name, index, flags) in interfaces {
            std::fs::create_dir_all(sys.join(name)).unwrap();
            std::fs::write(sys.join(name).join("ifindex"), format!("{index}\n")).unwrap();
            if let Some(f) = flags {
                std::fs::write(sys.join(name).join("tun_flags"), format!("{f}\n")).unwrap();
            }
        }
        let e = plan("lo", 1, &sys).unwrap_err().to_string();
        assert!(
            e.contains("'lo' is a network interface but not a tap device"),
            "{e}"
        );
        assert!(e.contains("ip tuntap add NAME mode tap"), "{e}");
        let e = plan("tun0", 5, &sys).unwrap_err().to_string();
        assert!(e.contains("'tun0' is a tun device, not a tap"), "{e}");
        assert_eq!(plan("tap0", 6, &sys).unwrap(), TapPlan::Existing);
        assert_eq!(plan("tpa0", 0, &sys).unwrap(), TapPlan::Create);
        // Another namespace's sysfs (its lo has another index, its taps are not listed):
        // the open decides.
        assert_eq!(plan("lo", 9, &sys).unwrap(), TapPlan::Existing);
        assert_eq!(plan("exl0", 3, &sys).unwrap(), TapPlan::Existing);
        assert!(created_line("tpa0").starts_with("exitless: created tap tpa0 ("));
        assert_eq!(index_of("no-such-if-x"), 0);
        assert_ne!(index_of("lo"), 0, "every namespace has lo");
        std::fs::remove_dir_all(&sys).unwrap();
    }
}
