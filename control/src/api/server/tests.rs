//! The server over a real socket, with a stand-in for the VM's owner thread.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::{channel, Receiver};
use std::sync::Mutex;
use std::time::Instant;

use super::*;
use crate::api::client::ApiClient;
use crate::api::{ApiError, ApiRequest, ApiResponse};

/// A server on a fresh socket and a stand-in VMM: it answers each call (after `delay` for
/// vm.boot) and counts what it got.
struct Rig {
    path: PathBuf,
    server: Option<ApiServer>,
    seen: Arc<Mutex<Vec<String>>>,
    fds: Arc<AtomicU64>,
}

fn stand_in(calls: Receiver<ApiCall>, seen: Arc<Mutex<Vec<String>>>, fds: Arc<AtomicU64>) {
    for call in calls {
        let (name, answer) = match call.request {
            ApiRequest::VmBoot => {
                thread::sleep(Duration::from_millis(1500));
                ("boot".to_string(), ApiResponse::NoContent)
            }
            ApiRequest::VmInfo => (
                "info".into(),
                ApiResponse::Json(r#"{"state":"Created"}"#.into()),
            ),
            ApiRequest::VmAddNet(_, got) => {
                fds.fetch_add(got.len() as u64, Ordering::SeqCst);
                ("add-net".into(), ApiResponse::NoContent)
            }
            ApiRequest::VmPause => {
                let e = ApiError {
                    status: 405,
                    message: "The VM is Created".into(),
                };
                ("pause".into(), ApiResponse::Error(e))
            }
            other => (format!("{other:?}"), ApiResponse::NoContent),
        };
        seen.lock().unwrap().push(name);
        let _ = call.reply.send(answer);
    }
}

impl Rig {
    fn new(tag: &str) -> Rig {
        let path =
            std::env::temp_dir().join(format!("exitless-api-{tag}-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let (calls, requests) = channel();
        let server = ApiServer::start(&path, calls).unwrap();
        let (seen, fds) = (Arc::default(), Arc::default());
        let (s, f) = (Arc::clone(&seen), Arc::clone(&fds));
        thread::spawn(move || stand_in(requests, s, f));
        Rig {
            path,
            server: Some(server),
            seen,
            fds,
        }
    }

    fn client(&self) -> ApiClient {
        ApiClient::connect(&self.path, Duration::from_secs(10)).unwrap()
    }

    /// A ping on a new connection answers at once.
    fn ping(&self) -> Duration {
        let start = Instant::now();
        let r = self.client().request("GET", "vmm.ping", None).unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(r.body.contains("\"pid\""), "{}", r.body);
        start.elapsed()
    }

    fn raw(&self) -> UnixStream {
        let s = UnixStream::connect(&self.path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        s
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.server.take();
        assert!(!self.path.exists(), "the socket file is removed");
    }
}

fn read_all(mut s: UnixStream) -> String {
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn requests_reach_the_vmm_and_answers_come_back_on_one_connection() {
    let rig = Rig::new("basic");
    let mut c = rig.client();
    let info = c.request("GET", "vm.info", None).unwrap();
    assert_eq!(
        (info.status, info.body.as_str()),
        (200, r#"{"state":"Created"}"#)
    );
    let pause = c.request("PUT", "vm.pause", None).unwrap();
    assert_eq!(
        (pause.status, pause.body.as_str()),
        (405, "The VM is Created")
    );
    assert_eq!(c.request("PUT", "vm.resume", None).unwrap().status, 204);
    assert_eq!(c.request("GET", "vm.nowhere", None).unwrap().status, 404);
    assert_eq!(
        c.request("PUT", "vm.create", Some("{bad")).unwrap().status,
        400
    );
    // The connection is still good after refused requests.
    assert_eq!(c.request("GET", "vmm.ping", None).unwrap().status, 200);
    assert_eq!(*rig.seen.lock().unwrap(), vec!["info", "pause", "VmResume"]);
}

#[test]
fn ping_answers_while_the_vmm_is_busy_and_a_client_stalls() {
    let rig = Rig::new("busy");
    let path = rig.path.clone();
    let boot = thread::spawn(move || {
        let mut c = ApiClient::connect(&path, Duration::from_secs(10)).unwrap();
        c.request("PUT", "vm.boot", None).unwrap().status
    });
    let mut stalled = rig.raw();
    stalled
        .write_all(b"PUT /api/v1/vm.create HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"cp")
        .unwrap();
    thread::sleep(Duration::from_millis(200)); // the boot is in the stand-in's hands now
    let waited = rig.ping();
    assert!(
        waited < Duration::from_millis(1000),
        "ping took {waited:?} during a boot"
    );
    assert_eq!(boot.join().unwrap(), 204);
    // The stalled request is answered 408 and closed once REQUEST_TIMEOUT passed since its first byte.
    let reply = read_all(stalled);
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(!rig
        .seen
        .lock()
        .unwrap()
        .iter()
        .any(|s| s.contains("Create")));
}

#[test]
fn hostile_requests_get_errors_and_harm_no_one_else() {
    let rig = Rig::new("hostile");
    for (bytes, status) in [
        (b"GARBAGE\x00\x01\r\n\r\n".to_vec(), "400"),
        (
            b"PUT /api/v1/vm.boot HTTP/1.1\r\nContent-Length: nope\r\n\r\n".to_vec(),
            "400",
        ),
        (
            format!(
                "PUT /api/v1/vm.create HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
                http::MAX_BODY + 1
            )
            .into_bytes(),
            "413",
        ),
        (
            format!("GET /{} HTTP/1.1\r\n", "x".repeat(http::MAX_HEAD + 10)).into_bytes(),
            "431",
        ),
        (
            b"PUT /api/v1/vm.boot HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec(),
            "411",
        ),
    ] {
        let mut s = rig.raw();
        s.write_all(&bytes).unwrap();
        let reply = read_all(s);
        assert!(reply.starts_with(&format!("HTTP/1.1 {status}")), "{reply}");
        assert!(reply.contains("Connection: close"), "{reply}");
    }
    // A Content-Length shorter than the body: the rest is the start of a next request that
    // never completes (408 once it stalled).
    let mut s = rig.raw();
    s.write_all(b"PUT /api/v1/vm.resize HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}xx}")
        .unwrap();
    let reply = read_all(s);
    assert!(reply.starts_with("HTTP/1.1 204"), "{reply}");
    // Closing mid-request and before the answer disturbs nothing.
    let mut s = rig.raw();
    s.write_all(b"PUT /api/v1/vm.create HTTP/1.1\r\nContent-Le")
        .unwrap();
    drop(s);
    let mut s = rig.raw();
    s.write_all(b"PUT /api/v1/vm.delete HTTP/1.1\r\n\r\n")
        .unwrap();
    drop(s);
    rig.ping();
    thread::sleep(Duration::from_millis(200));
    let seen = rig.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![
            "VmResize(VmResize { desired_vcpus: None, desired_ram: None, desired_balloon: None })",
            "VmDelete"
        ]
    );
}

#[test]
fn fifty_clients_at_once_all_get_their_answers() {
    let rig = Rig::new("fifty");
    let clients: Vec<_> = (0..50)
        .map(|i| {
            let path = rig.path.clone();
            thread::spawn(move || {
                let mut c = ApiClient::connect(&path, Duration::from_secs(20)).unwrap();
                let endpoint = if i % 2 == 0 { "vm.info" } else { "vmm.ping" };
                (0..5)
                    .map(|_| c.request("GET", endpoint, None).unwrap().status)
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for c in clients {
        assert_eq!(c.join().unwrap(), vec![200; 5]);
    }
    assert_eq!(
        rig.seen.lock().unwrap().len(),
        25 * 5,
        "every vm.info reached the VMM once"
    );
    rig.ping();
}

#[test]
fn file_descriptors_arrive_with_the_request_that_carries_them() {
    let rig = Rig::new("fds");
    let (a, _peer) = UnixStream::pair().unwrap();
    let mut c = rig.client();
    let body = r#"{"mac":"02:00:00:4b:52:01","num_queues":2}"#;
    let r = c
        .request_with_fds("PUT", "vm.add-net", Some(body), &[a.as_raw_fd()])
        .unwrap();
    assert_eq!(r.status, 204);
    assert_eq!(rig.fds.load(Ordering::SeqCst), 1);
    // A descriptor sent with another request is closed, not kept for a later one.
    let (b, _peer2) = UnixStream::pair().unwrap();
    assert_eq!(
        c.request_with_fds("PUT", "vm.boot", None, &[b.as_raw_fd()])
            .unwrap()
            .status,
        204
    );
    assert_eq!(
        c.request("PUT", "vm.add-net", Some(body)).unwrap().status,
        204
    );
    assert_eq!(rig.fds.load(Ordering::SeqCst), 1);
}

#[test]
fn a_request_with_too_many_descriptors_is_answered_400_and_they_are_closed() {
    let rig = Rig::new("manyfds");
    let (sent, kept): (Vec<_>, Vec<_>) = (0..200).map(|_| UnixStream::pair().unwrap()).unzip();
    let raw: Vec<_> = sent.iter().map(|s| s.as_raw_fd()).collect();
    let body = r#"{"mac":"02:00:00:4b:52:01"}"#;
    let r = rig
        .client()
        .request_with_fds("PUT", "vm.add-net", Some(body), &raw)
        .unwrap();
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("at most 16 file descriptors"), "{}", r.body);
    assert_eq!(rig.fds.load(Ordering::SeqCst), 0, "none reached the VMM");
    // Once our ends are closed, each peer reads its end of file only if the server closed
    // the copies it received too.
    drop(sent);
    for mut peer in kept {
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(peer.read(&mut [0u8; 1]).unwrap(), 0, "a copy is still open");
    }
    rig.ping();
}

#[test]
fn a_socket_in_use_is_refused_and_a_stale_one_replaced() {
    let rig = Rig::new("stale");
    let (calls, _r) = channel();
    let e = ApiServer::start(&rig.path, calls)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("in use"), "{e}");
    let stale =
        std::env::temp_dir().join(format!("exitless-api-stale2-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&stale);
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let (calls, _r) = channel();
    let server = ApiServer::start(&stale, calls).unwrap();
    drop(server);
    assert!(!stale.exists());
    let file = std::env::temp_dir().join(format!("exitless-api-file-{}.sock", std::process::id()));
    std::fs::write(&file, "x").unwrap();
    let (calls, _r) = channel();
    let e = ApiServer::start(&file, calls).err().unwrap().to_string();
    assert!(e.contains("not a socket"), "{e}");
    assert!(file.exists(), "a file that is not a socket is left alone");
    let _ = std::fs::remove_file(file);
}

/// A request's bytes may not trickle in for ever: however often a byte comes, the whole
/// request is due REQUEST_TIMEOUT after its first, then it is answered 408 and the connection
/// closed while the client is still sending.
#[test]
fn a_trickling_client_is_cut_at_the_request_deadline() {
    let rig = Rig::new("trickle");
    let trickle = rig.raw();
    let mut w = trickle.try_clone().unwrap();
    let request = [
        &b"PUT /api/v1/vm.create HTTP/1.1\r\nContent-Length: 100\r\n\r\n"[..],
        &[b'x'; 100],
    ]
    .concat();
    let total = request.len();
    // 200 ms a byte: the whole request would take ~31 s, 6 x REQUEST_TIMEOUT.
    let writer = thread::spawn(move || {
        for (sent, b) in request.iter().enumerate() {
            if w.write_all(&[*b]).is_err() {
                return sent;
            }
            thread::sleep(Duration::from_millis(200));
        }
        total
    });
    let reply = read_all(trickle);
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    let sent = writer.join().unwrap();
    assert!(sent < total, "cut while sending ({sent} of {total} bytes)");
    assert!(
        rig.seen.lock().unwrap().is_empty(),
        "nothing reached the VMM"
    );
    rig.ping();
}

/// Out of file descriptors, accept fails at once for as long as it lasts: the loop pauses
/// between tries (and says so once) instead of spinning; a failure of one connection (the
/// client gave up) is retried at once.
#[test]
fn accepting_pauses_while_out_of_file_descriptors() {
    let mut errors = AcceptErrors::default();
    for errno in [libc::EMFILE, libc::ENFILE, libc::EMFILE] {
        let e = io::Error::from_raw_os_error(errno);
        assert_eq!(errors.pause(&e), Some(ACCEPT_PAUSE), "{e}");
    }
    assert_eq!(errors.starved, 3);
    let aborted = io::Error::from_raw_os_error(libc::ECONNABORTED);
    assert_eq!(errors.pause(&aborted), None);
    assert_eq!(errors.starved, 3);
}

/// One thread serves every connection: a client that sends requests and never reads the
/// replies fills its socket and then holds only itself; the others are answered meanwhile, and
/// it is cut once a reply has waited REQUEST_TIMEOUT to be taken.
#[test]
fn a_client_that_never_reads_its_replies_holds_up_no_one() {
    let rig = Rig::new("deaf");
    let deaf = rig.raw();
    let mut w = deaf.try_clone().unwrap();
    let writer = thread::spawn(move || {
        let ping = b"GET /api/v1/vmm.ping HTTP/1.1\r\n\r\n";
        let mut sent = 0usize;
        while w.write_all(ping).is_ok() {
            sent += 1;
        }
        sent
    });
    thread::sleep(Duration::from_millis(500)); // both socket buffers full by now
    for _ in 0..3 {
        let waited = rig.ping();
        assert!(waited < Duration::from_millis(1000), "ping took {waited:?}");
    }
    assert_eq!(
        rig.client().request("GET", "vm.info", None).unwrap().status,
        200
    );
    let sent = writer.join().unwrap();
    assert!(sent > 100, "the writer stopped after {sent} requests");
    drop(deaf);
    rig.ping();
}
