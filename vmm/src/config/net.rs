//! `--net tap=NAME[,mac=MAC]`: a virtio-net device on a host tap, and
//! `--vsock cid=N,socket=PATH`: a virtio-vsock device joined to Unix sockets.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::ConfigError;

/// A MAC address, written `52:54:00:12:34:56`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MacAddr(pub [u8; 6]);

impl FromStr for MacAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let mut mac = [0u8; 6];
        let ok = parts.len() == 6
            && parts
                .iter()
                .zip(&mut mac)
                .all(|(p, b)| p.len() == 2 && u8::from_str_radix(p, 16).map(|v| *b = v).is_ok());
        if !ok {
            return Err(format!("mac={s}: use six hex pairs like 52:54:00:12:34:56"));
        }
        if mac[0] & 1 != 0 {
            return Err(format!("mac={s} is a multicast address"));
        }
        Ok(MacAddr(mac))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl Serialize for MacAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One network card.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetConfig {
    /// The host tap interface (opened if it exists, else created when this process may);
    /// empty when the tap came as an fd.
    #[serde(default)]
    pub tap: String,
    /// The guest's MAC [default: 52:54:00 and three bytes from the tap's name].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<MacAddr>,
    /// A tap another program opened and sent (the API's `vm.add-net` with SCM_RIGHTS);
    /// kept for the VM's life so that a reboot opens the same tap again.
    #[serde(skip)]
    pub tap_fd: Option<TapFd>,
    /// The device's id in the API (`_net0`, or the client's); none from the command line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// An open tap file descriptor shared by the configs that name it.
#[derive(Debug, Clone)]
pub struct TapFd(pub std::sync::Arc<std::os::fd::OwnedFd>);

impl PartialEq for TapFd {
    fn eq(&self, other: &Self) -> bool {
        use std::os::fd::AsRawFd;
        self.0.as_raw_fd() == other.0.as_raw_fd()
    }
}

impl Eq for TapFd {}

/// The socket device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VsockConfig {
    /// The guest's context id (3 or more; 0-2 are reserved).
    pub cid: u32,
    /// The Unix socket host programs connect to (`CONNECT <port>\n`); a guest connection to
    /// host port P goes to `PATH_P`.
    pub socket: PathBuf,
    /// The device's id in the API (`_vsock0`, or the client's); none from the command line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// Longest network interface name, without its NUL.
pub const MAX_TAP_NAME_LEN: usize = 15;
/// What [`valid_tap_name`] asks, said in errors.
const TAP_NAME_RULE: &str = "1 to 15 characters, no '/' or whitespace";

/// Whether `name` can name a network interface (checked here, before any device opens it).
pub fn valid_tap_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TAP_NAME_LEN
        && !name
            .bytes()
            .any(|b| b == b'/' || b == 0 || b.is_ascii_whitespace())
}

/// An error saying the rule, unless `name` is a valid tap name.
pub fn check_tap_name(name: &str) -> Result<(), ConfigError> {
    if valid_tap_name(name) {
        return Ok(());
    }
    Err(ConfigError::Net {
        input: format!("tap={name}"),
        reason: TAP_NAME_RULE.into(),
    })
}

/// Splits `a=1,b=2` into pairs; `what` names the option in errors.
fn pairs<'a>(
    input: &'a str,
    bad: &dyn Fn(String) -> ConfigError,
) -> Result<Vec<(&'a str, &'a str)>, ConfigError> {
    input
        .split(',')
        .map(|part| match part.split_once('=') {
            Some(("tap", "")) => Err(bad(
                "the tap name is empty: tap=NAME names the host's tap (e.g. tap=tap0)".into(),
            )),
            Some((key, "")) => Err(bad(format!("'{key}=' has no value"))),
            Some(pair) => Ok(pair),
            None => Err(bad(format!("'{part}' is not key=value"))),
        })
        .collect()
}

impl FromStr for NetConfig {
    type Err = ConfigError;
    fn from_str(input: &str) -> Result<Self, ConfigError> {
        let bad = |reason| ConfigError::Net {
            input: input.to_string(),
            reason,
        };
        let (mut tap, mut mac) = (None, None);
        for (key, value) in pairs(input, &bad)? {
            match key {
                "tap" => tap = Some(value.to_string()),
                "mac" => mac = Some(value.parse().map_err(bad)?),
                _ => return Err(bad(format!("unknown key '{key}' (tap=, mac=)"))),
            }
        }
        let tap = tap.ok_or_else(|| bad("tap=NAME is required".into()))?;
        if !valid_tap_name(&tap) {
            return Err(bad(format!("tap={tap}: {TAP_NAME_RULE}")));
        }
        Ok(NetConfig {
            tap,
            mac,
            tap_fd: None,
            id: None,
        })
    }
}

impl FromStr for VsockConfig {
    type Err = ConfigError;
    fn from_str(input: &str) -> Result<Self, ConfigError> {
        let bad = |reason| ConfigError::Vsock {
            input: input.to_string(),
            reason,
        };
        let (mut cid, mut socket) = (None, None);
        for (key, value) in pairs(input, &bad)? {
            match key {
                "cid" => {
                    let n: u32 = value
                        .parse()
                        .map_err(|_| bad(format!("cid={value} is not a number")))?;
                    cid = Some(n);
                }
                "socket" => socket = Some(PathBuf::from(value)),
                _ => return Err(bad(format!("unknown key '{key}' (cid=, socket=)"))),
            }
        }
        let cid = cid.ok_or_else(|| bad("cid=N is required".into()))?;
        let socket = socket.ok_or_else(|| bad("socket=PATH is required".into()))?;
        let config = VsockConfig {
            cid,
            socket,
            id: None,
        };
        config.check().map_err(bad)?;
        Ok(config)
    }
}

impl VsockConfig {
    /// The context id is a guest's (not 0-2 or the wildcard).
    pub fn check(&self) -> Result<(), String> {
        if self.cid < 3 || self.cid == u32::MAX {
            return Err(format!(
                "cid={}: 0, 1 and 2 are reserved (2 is the host) and {} is the wildcard; use 3 or more",
                self.cid,
                u32::MAX
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tap_names_are_checked_in_the_config() {
        for bad in ["", "sixteen-chars-xx", "a/b", "a b", "a\0"] {
            assert!(!valid_tap_name(bad), "{bad:?}");
            assert!(check_tap_name(bad).is_err(), "{bad:?}");
        }
        assert!(valid_tap_name("tap0") && valid_tap_name("fifteen-chars-x"));
        assert!(check_tap_name("tap0").is_ok());
    }

    #[test]
    fn nets_parse_and_bad_ones_say_why() {
        let n: NetConfig = "tap=tap0".parse().unwrap();
        assert_eq!((n.tap.as_str(), n.mac), ("tap0", None));
        let n: NetConfig = "tap=t1,mac=52:54:00:AB:cd:01".parse().unwrap();
        assert_eq!(n.mac.unwrap().to_string(), "52:54:00:ab:cd:01");
        for (input, why) in [
            ("tap0", "'tap0' is not key=value"),
            ("tap=", "the tap name is empty: tap=NAME"),
            ("tap=a,mac=", "'mac=' has no value"),
            ("mac=52:54:00:00:00:01", "tap=NAME is required"),
            ("tap=a,mac=52:54:00:00:00", "six hex pairs"),
            ("tap=a,mac=01:00:5e:00:00:01", "multicast"),
            ("tap=a/b", "1 to 15 characters"),
            ("tap=a,speed=10", "unknown key 'speed'"),
        ] {
            let e = input.parse::<NetConfig>().unwrap_err().to_string();
            assert!(e.starts_with(&format!("Invalid --net '{input}'")), "{e}");
            assert!(e.contains(why), "{input}: {e}");
        }
        let json: NetConfig =
            serde_json::from_str(r#"{"tap": "t", "mac": "52:54:00:00:00:02"}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&json).unwrap(),
            r#"{"tap":"t","mac":"52:54:00:00:00:02"}"#
        );
        assert!(serde_json::from_str::<NetConfig>(r#"{"tap": "t", "mac": "x"}"#).is_err());
    }

    #[test]
    fn vsocks_parse_and_bad_ones_say_why() {
        let v: VsockConfig = "cid=3,socket=/tmp/v.sock".parse().unwrap();
        assert_eq!((v.cid, v.socket.to_str()), (3, Some("/tmp/v.sock")));
        for (input, why) in [
            ("cid=2,socket=/x", "reserved"),
            ("cid=4294967295,socket=/x", "wildcard"),
            ("cid=x,socket=/x", "not a number"),
            ("socket=/x", "cid=N is required"),
            ("cid=3", "socket=PATH is required"),
            ("cid=3,socket=/x,port=1", "unknown key 'port'"),
        ] {
            let e = input.parse::<VsockConfig>().unwrap_err().to_string();
            assert!(e.starts_with(&format!("Invalid --vsock '{input}'")), "{e}");
            assert!(e.contains(why), "{input}: {e}");
        }
    }
}
