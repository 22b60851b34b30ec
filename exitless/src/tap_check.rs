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

/// Checks `name` against the interfaces in `sys_class_net` (/sys/class/net).
pub fn plan(name: &str, sys_class_net: &Path) -> anyhow::Result<TapPlan> {
    let dir = sys_class_net.join(name);
    if !dir.exists() {
        return Ok(TapPlan::Create);
    }
    let make = format!(
        "make one with `ip tuntap add NAME mode tap` (root) and give --net tap=NAME, or name \
         an existing tap (`ip tuntap show` lists them)"
    );
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

/// The taps of `names` that opening will create.
pub fn to_create<'a>(names: impl Iterator<Item = &'a str>) -> anyhow::Result<Vec<&'a str>> {
    let sys = Path::new("/sys/class/net");
    let mut created = Vec::new();
    for name in names {
        if plan(name, sys)? == TapPlan::Create {
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
        for (name, flags) in [
            ("lo", None),
            ("tun0", Some("0x1001")),
            ("tap0", Some("0x5002")),
        ] {
            std::fs::create_dir_all(sys.join(name)).unwrap();
            if let Some(f) = flags {
                std::fs::write(sys.join(name).join("tun_flags"), format!("{f}\n")).unwrap();
            }
        }
        let e = plan("lo", &sys).unwrap_err().to_string();
        assert!(
            e.contains("'lo' is a network interface but not a tap device"),
            "{e}"
        );
        assert!(e.contains("ip tuntap add NAME mode tap"), "{e}");
        let e = plan("tun0", &sys).unwrap_err().to_string();
        assert!(e.contains("'tun0' is a tun device, not a tap"), "{e}");
        assert_eq!(plan("tap0", &sys).unwrap(), TapPlan::Existing);
        assert_eq!(plan("tpa0", &sys).unwrap(), TapPlan::Create);
        assert!(created_line("tpa0").starts_with("exitless: created tap tpa0 ("));
        std::fs::remove_dir_all(&sys).unwrap();
    }
}
