//! `exitless remote send-migration` and `receive-migration`: the arguments `ch-remote` takes
//! (`destination_url=unix:/tmp/m.sock,local=on`, `receiver_url=unix:/tmp/m.sock`) made the
//! bodies of `vm.send-migration` and `vm.receive-migration` (docs/migration.md).

use anyhow::{bail, Context};

/// Cloud Hypervisor's keys exitless does not do (precopy over one connection, no TLS).
const UNSUPPORTED: &[&str] = &[
    "preserve_source",
    "connections",
    "tls_dir",
    "memory_mode",
    "vfio_fds",
    "iommufd_fd",
    "zone_updates",
];

/// `key=value,...` as pairs; a part without `=` is the value of `bare` (ch-remote takes a
/// receiver's URL alone). A key exitless does not do, or one `keys` does not hold, is
/// refused naming it.
fn pairs<'a>(
    spec: &'a str,
    bare: Option<&'a str>,
    keys: &[&str],
) -> anyhow::Result<Vec<(&'a str, &'a str)>> {
    let mut out = Vec::new();
    for part in spec.split(',').filter(|p| !p.is_empty()) {
        let (key, value) = match (part.split_once('='), bare) {
            (Some(kv), _) => kv,
            (None, Some(key)) => (key, part),
            (None, None) => bail!("'{part}' is not KEY=VALUE (keys: {})", keys.join(", ")),
        };
        if UNSUPPORTED.contains(&key) {
            bail!("{key} is not supported by exitless (precopy over one connection)");
        }
        if !keys.contains(&key) {
            bail!("unknown key '{key}' (keys: {})", keys.join(", "));
        }
        if out.iter().any(|(k, _)| *k == key) {
            bail!("{key} given twice");
        }
        out.push((key, value));
    }
    Ok(out)
}

/// A migration URL as the API takes it: `unix:PATH` (made absolute: the VMM may run in
/// another directory) or `tcp:HOST:PORT`.
fn url(key: &str, value: &str) -> anyhow::Result<String> {
    if let Some(path) = value.strip_prefix("unix:") {
        let abs = std::path::absolute(path).with_context(|| format!("{key}: {path}"))?;
        return Ok(format!("unix:{}", abs.display()));
    }
    match value.strip_prefix("tcp:").and_then(|a| a.rsplit_once(':')) {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
            Ok(value.to_string())
        }
        _ => bail!("{key} must be unix:PATH or tcp:HOST:PORT, not '{value}'"),
    }
}

fn toggle(key: &str, value: &str) -> anyhow::Result<bool> {
    match value {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => bail!("{key} takes on or off, not '{value}'"),
    }
}

fn positive(key: &str, value: &str) -> anyhow::Result<u64> {
    match value.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => bail!("{key} takes a whole number above 0, not '{value}'"),
    }
}

/// `vm.send-migration`'s body from
/// `destination_url=URL[,local=on|off][,downtime_ms=N][,timeout_s=N][,timeout_strategy=cancel|ignore]`.
pub fn send_body(spec: &str) -> anyhow::Result<String> {
    let keys = [
        "destination_url",
        "local",
        "downtime_ms",
        "timeout_s",
        "timeout_strategy",
    ];
    let mut body = serde_json::Map::new();
    for (key, value) in pairs(spec, None, &keys)? {
        let v: serde_json::Value = match key {
            "destination_url" => url(key, value)?.into(),
            "local" => toggle(key, value)?.into(),
            "timeout_strategy" => match value.to_ascii_lowercase().as_str() {
                "cancel" => "Cancel".into(),
                "ignore" => "Ignore".into(),
                _ => bail!("timeout_strategy takes cancel or ignore, not '{value}'"),
            },
            _ => positive(key, value)?.into(),
        };
        body.insert(key.into(), v);
    }
    if !body.contains_key("destination_url") {
        bail!("send-migration needs destination_url=unix:PATH or destination_url=tcp:HOST:PORT");
    }
    body.entry("local").or_insert(false.into());
    Ok(serde_json::Value::Object(body).to_string())
}

/// `vm.receive-migration`'s body from `receiver_url=URL` (or the URL alone).
pub fn receive_body(spec: &str) -> anyhow::Result<String> {
    let given = pairs(spec, Some("receiver_url"), &["receiver_url"])?;
    let Some((key, value)) = given.first() else {
        bail!("receive-migration needs receiver_url=unix:PATH or receiver_url=tcp:HOST:PORT");
    };
    Ok(serde_json::json!({ "receiver_url": url(key, value)? }).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(s: &str) -> serde_json::Value {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn send_takes_ch_remotes_arguments() {
        let b = json(&send_body("destination_url=unix:/tmp/m.sock,local=on").unwrap());
        assert_eq!(
            b,
            serde_json::json!({"destination_url": "unix:/tmp/m.sock", "local": true})
        );
        let spec = "destination_url=tcp:127.0.0.1:6000,downtime_ms=50,timeout_s=9,\
                    timeout_strategy=ignore";
        let b = json(&send_body(spec).unwrap());
        assert_eq!(
            b,
            serde_json::json!({"destination_url": "tcp:127.0.0.1:6000", "local": false,
                "downtime_ms": 50, "timeout_s": 9, "timeout_strategy": "Ignore"})
        );
        let relative = json(&send_body("destination_url=unix:m.sock").unwrap());
        let url = relative["destination_url"].as_str().unwrap();
        assert!(
            url.starts_with("unix:/") && url.ends_with("/m.sock"),
            "{url}"
        );
    }

    #[test]
    fn send_refuses_what_it_cannot_do_naming_it() {
        for (spec, why) in [
            ("local=on", "needs destination_url"),
            ("destination_url=/tmp/m", "unix:PATH or tcp:HOST:PORT"),
            ("destination_url=tcp:host", "unix:PATH or tcp:HOST:PORT"),
            ("destination_url=unix:/m,local=yes", "local takes on or off"),
            ("destination_url=unix:/m,downtime_ms=0", "downtime_ms takes"),
            (
                "destination_url=unix:/m,timeout_strategy=x",
                "cancel or ignore",
            ),
            (
                "destination_url=unix:/m,connections=2",
                "connections is not supported",
            ),
            ("destination_url=unix:/m,speed=9", "unknown key 'speed'"),
            (
                "destination_url=unix:/m,destination_url=unix:/n",
                "given twice",
            ),
        ] {
            let e = send_body(spec).unwrap_err().to_string();
            assert!(e.contains(why), "{spec}: {e}");
        }
    }

    #[test]
    fn receive_takes_the_url_with_or_without_its_key() {
        let want = serde_json::json!({"receiver_url": "unix:/tmp/m.sock"});
        assert_eq!(
            json(&receive_body("receiver_url=unix:/tmp/m.sock").unwrap()),
            want
        );
        assert_eq!(json(&receive_body("unix:/tmp/m.sock").unwrap()), want);
        for (spec, why) in [
            ("", "needs receiver_url"),
            (
                "receiver_url=unix:/m,tls_dir=/t",
                "tls_dir is not supported",
            ),
            ("receiver_url=http://x", "unix:PATH or tcp:HOST:PORT"),
        ] {
            let e = receive_body(spec).unwrap_err().to_string();
            assert!(e.contains(why), "{spec}: {e}");
        }
    }
}
