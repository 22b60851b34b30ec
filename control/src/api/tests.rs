use super::http::{Method, Request};
use super::*;

fn req(method: Method, path: &str, body: &str) -> Request {
    Request {
        method,
        path: path.into(),
        body: body.as_bytes().to_vec(),
        keep_alive: true,
    }
}

fn routed(method: Method, path: &str, body: &str) -> Result<Route, HttpError> {
    route(&req(method, path, body), Vec::new())
}

#[test]
fn every_endpoint_becomes_its_request() {
    use ApiRequest as R;
    let put = |p: &str, b: &str| match routed(Method::Put, &format!("/api/v1/{p}"), b) {
        Ok(Route::Vmm(r)) => r,
        other => panic!("{p}: {other:?}"),
    };
    let get = |p: &str| match routed(Method::Get, &format!("/api/v1/{p}"), "") {
        Ok(Route::Vmm(r)) => r,
        other => panic!("{p}: {other:?}"),
    };
    assert!(matches!(
        routed(Method::Get, "/api/v1/vmm.ping", ""),
        Ok(Route::Ping)
    ));
    assert!(matches!(put("vmm.shutdown", ""), R::VmmShutdown));
    assert!(matches!(
        put("vm.create", r#"{"payload":{"kernel":"/k"}}"#),
        R::VmCreate(_)
    ));
    assert!(matches!(put("vm.boot", ""), R::VmBoot));
    assert!(matches!(
        put("vm.snapshot", r#"{"destination_url":"file:///s"}"#),
        R::VmSnapshot(s) if s.destination_url == "file:///s"
    ));
    assert!(matches!(
        put("vm.restore", r#"{"source_url":"file:///s","prefault":true}"#),
        R::VmRestore(r, _) if r.source_url == "file:///s" && r.prefault && !r.resume
    ));
    assert!(matches!(put("vm.shutdown", ""), R::VmShutdown));
    assert!(matches!(put("vm.reboot", ""), R::VmReboot));
    assert!(matches!(put("vm.delete", ""), R::VmDelete));
    assert!(matches!(put("vm.pause", ""), R::VmPause));
    assert!(matches!(put("vm.resume", ""), R::VmResume));
    assert!(matches!(get("vm.info"), R::VmInfo));
    assert!(matches!(get("vm.counters"), R::VmCounters));
    assert!(matches!(get("vm.profile"), R::VmProfile));
    let disk = put(
        "vm.add-disk",
        r#"{"path":"/d.img","readonly":true,"id":"x"}"#,
    );
    assert!(matches!(disk, R::VmAddDisk(d) if d.readonly && d.id.as_deref() == Some("x")));
    assert!(matches!(
        put("vm.add-net", r#"{"mac":"02:00:00:00:00:01"}"#),
        R::VmAddNet(_, _)
    ));
    assert!(matches!(
        put("vm.add-vsock", r#"{"cid":3,"socket":"/v"}"#),
        R::VmAddVsock(_)
    ));
    let rm = put("vm.remove-device", r#"{"id":"_disk0"}"#);
    assert!(matches!(rm, R::VmRemoveDevice(r) if r.id.as_deref() == Some("_disk0")));
    let resize = put("vm.resize", r#"{"desired_vcpus":2}"#);
    assert!(matches!(resize, R::VmResize(r) if r.desired_vcpus == Some(2)));
    let balloon = put("vm.resize", r#"{"desired_balloon":268435456}"#);
    assert!(matches!(balloon, R::VmResize(r) if r.desired_balloon == Some(256 << 20)));
    let create = put(
        "vm.create",
        r#"{"payload":{"kernel":"/k"},"balloon":{"size":0,"free_page_reporting":true}}"#,
    );
    assert!(
        matches!(create, R::VmCreate(c) if c.balloon.as_ref().is_some_and(|b| b.free_page_reporting))
    );
}

#[test]
fn wrong_methods_paths_and_bodies_say_why() {
    let status = |m, p: &str, b: &str| routed(m, p, b).unwrap_err().status;
    assert_eq!(status(Method::Put, "/api/v1/vm.info", ""), 405);
    assert_eq!(status(Method::Get, "/api/v1/vm.boot", ""), 405);
    assert_eq!(status(Method::Other, "/api/v1/vm.boot", ""), 405);
    assert_eq!(status(Method::Get, "/api/v1/vm.nothing", ""), 404);
    assert_eq!(status(Method::Get, "/other", ""), 404);
    assert_eq!(status(Method::Put, "/api/v1/vm.create", "{not json"), 400);
    assert_eq!(status(Method::Put, "/api/v1/vm.create", ""), 400);
    let e = routed(
        Method::Put,
        "/api/v1/vm.create",
        r#"{"cpus":{"boot_vcpus":"x"}}"#,
    );
    let message = e.unwrap_err().message;
    assert!(
        message.contains("invalid type") && message.contains("column"),
        "{message}"
    );
    // Host devices are refused with why.
    for (endpoint, why) in [
        ("vm.add-device", "no /dev/vfio"),
        (
            "vm.add-user-device",
            "vfio-user devices are not implemented",
        ),
        ("vm.add-vdpa", "no /dev/vhost-vdpa"),
    ] {
        let e = routed(Method::Put, &format!("/api/v1/{endpoint}"), "{}").unwrap_err();
        assert_eq!(e.status, 400);
        let said = format!("{endpoint} is not supported by exitless: ");
        assert!(
            e.message.starts_with(&said) && e.message.contains(why),
            "{}",
            e.message
        );
    }
    // vm.add-pmem is offered: a body without its file is a 400 naming the field.
    let e = routed(Method::Put, "/api/v1/vm.add-pmem", "{}").unwrap_err();
    assert_eq!(e.status, 400);
    assert!(e.message.contains("missing field `file`"), "{}", e.message);
    // vm.add-fs is offered: a body without its fields is a 400 naming the field.
    let e = routed(Method::Put, "/api/v1/vm.add-fs", "{}").unwrap_err();
    assert_eq!(e.status, 400);
    assert!(e.message.contains("missing field `tag`"), "{}", e.message);
}

/// Cloud Hypervisor's operations on a booted VM: the bodies `ch-remote` sends.
#[test]
fn the_operations_route_with_cloud_hypervisors_bodies() {
    use ApiRequest as R;
    let put = |p: &str, b: &str| routed(Method::Put, &format!("/api/v1/{p}"), b);
    assert!(matches!(
        put("vm.power-button", ""),
        Ok(Route::Vmm(R::VmPowerButton))
    ));
    assert!(matches!(put("vm.nmi", ""), Ok(Route::Vmm(R::VmNmi))));
    let disk = put(
        "vm.resize-disk",
        r#"{"id":"_disk0","desired_size":33554432}"#,
    );
    assert!(
        matches!(disk, Ok(Route::Vmm(R::VmResizeDisk(r))) if r.id == "_disk0" && r.desired_size == 32 << 20)
    );
    let zone = put(
        "vm.resize-zone",
        r#"{"id":"mem0","desired_ram":1073741824}"#,
    );
    assert!(
        matches!(zone, Ok(Route::Vmm(R::VmResizeZone(r))) if r.id == "mem0" && r.desired_ram == 1 << 30)
    );
    let core = put("vm.coredump", r#"{"destination_url":"file:///tmp/core"}"#);
    assert!(
        matches!(core, Ok(Route::Vmm(R::VmCoredump(c))) if c.destination_url == "file:///tmp/core")
    );
    // A missing field or a negative size is a 400 saying which.
    let e = put("vm.resize-disk", r#"{"id":"_disk0"}"#).unwrap_err();
    assert_eq!(e.status, 400);
    assert!(e.message.contains("desired_size"), "{}", e.message);
    let e = put("vm.resize-zone", r#"{"id":"z","desired_ram":-1}"#).unwrap_err();
    assert_eq!(e.status, 400);
    assert_eq!(put("vm.coredump", "").unwrap_err().status, 400);
    assert_eq!(
        routed(Method::Get, "/api/v1/vm.nmi", "")
            .unwrap_err()
            .status,
        405
    );
}

#[test]
fn only_add_net_keeps_the_fds_sent_with_it() {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let net = req(Method::Put, "/api/v1/vm.add-net", "{}");
    match route(&net, vec![a.into()]) {
        Ok(Route::Vmm(ApiRequest::VmAddNet(_, fds))) => assert_eq!(fds.len(), 1),
        other => panic!("{other:?}"),
    }
    let boot = req(Method::Put, "/api/v1/vm.boot", "");
    assert!(matches!(
        route(&boot, vec![b.into()]),
        Ok(Route::Vmm(ApiRequest::VmBoot))
    ));
}

/// Every request of the sequence Kata sends for a sandbox (fixtures/kata_clh_sandbox.json)
/// routes.
#[test]
fn the_kata_wire_sequence_routes() {
    let text = include_str!("fixtures/kata_clh_sandbox.json");
    let seq: serde_json::Value = serde_json::from_str(text).unwrap();
    for r in seq["requests"].as_array().unwrap() {
        let method = if r["method"] == "GET" {
            Method::Get
        } else {
            Method::Put
        };
        let body = if r["body"].is_null() {
            String::new()
        } else {
            r["body"].to_string()
        };
        let path = r["path"].as_str().unwrap();
        assert!(routed(method, path, &body).is_ok(), "{path}");
    }
}

#[test]
fn migration_endpoints_take_cloud_hypervisor_s_bodies_with_defaults() {
    let put = |p: &str, b: &str| match routed(Method::Put, &format!("/api/v1/{p}"), b) {
        Ok(Route::Vmm(r)) => r,
        other => panic!("{p}: {other:?}"),
    };
    let send = put("vm.send-migration", r#"{"destination_url":"unix:/m"}"#);
    let ApiRequest::VmSendMigration(s) = send else {
        panic!("{send:?}");
    };
    assert_eq!(s.destination_url, "unix:/m");
    assert!(!s.local);
    assert_eq!((s.downtime_ms, s.timeout_s), (300, 3600));
    assert_eq!(s.timeout_strategy, "Cancel");
    // What ch-remote sends: every field, some exitless does not read (kept for refusal).
    let ch = r#"{"destination_url":"tcp:1.2.3.4:5","local":true,"preserve_source":false,
        "downtime_ms":50,"timeout_s":10,"timeout_strategy":"Ignore","connections":1,
        "tls_dir":null,"memory_mode":"Precopy"}"#;
    let ApiRequest::VmSendMigration(s) = put("vm.send-migration", ch) else {
        panic!("{ch}");
    };
    assert!(s.local && s.downtime_ms == 50 && s.timeout_strategy == "Ignore");
    assert_eq!(s.extra["connections"], 1);
    let recv = put(
        "vm.receive-migration",
        r#"{"receiver_url":"tcp:0.0.0.0:6000"}"#,
    );
    assert!(
        matches!(recv, ApiRequest::VmReceiveMigration(r, _) if r.receiver_url == "tcp:0.0.0.0:6000")
    );
    let e = routed(Method::Put, "/api/v1/vm.send-migration", "{}").unwrap_err();
    assert!(e.message.contains("destination_url"), "{}", e.message);
}
