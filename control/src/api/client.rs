//! A small blocking client for the API (`exitless remote`, the tests): one keep-alive
//! connection, a request with its body and file descriptors sent in one `sendmsg` (as Kata
//! sends `vm.add-net`), the reply read by its `Content-Length`.

use std::io::{self, Read};
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// A reply: status and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub body: String,
}

/// A connection to an API socket.
pub struct ApiClient {
    stream: UnixStream,
    buf: Vec<u8>,
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

impl ApiClient {
    /// Connects to `path`; each reply must come within `timeout`.
    pub fn connect(path: &Path, timeout: Duration) -> io::Result<ApiClient> {
        let stream = UnixStream::connect(path)?;
        stream.set_read_timeout(Some(timeout))?;
        Ok(ApiClient {
            stream,
            buf: Vec::new(),
        })
    }

    /// `method /api/v1/endpoint` with an optional JSON body.
    pub fn request(
        &mut self,
        method: &str,
        endpoint: &str,
        body: Option<&str>,
    ) -> io::Result<Reply> {
        self.request_with_fds(method, endpoint, body, &[])
    }

    /// The same, with `fds` attached to the request's bytes (SCM_RIGHTS).
    pub fn request_with_fds(
        &mut self,
        method: &str,
        endpoint: &str,
        body: Option<&str>,
        fds: &[RawFd],
    ) -> io::Result<Reply> {
        self.send(method, &format!("/api/v1/{endpoint}"), body, fds)
    }

    /// `method path` with an optional JSON body, `path` as given (Firecracker's API has no
    /// `/api/v1/` prefix: `/snapshot/load`).
    pub fn request_path(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> io::Result<Reply> {
        self.send(method, path, body, &[])
    }

    fn send(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
        fds: &[RawFd],
    ) -> io::Result<Reply> {
        let body = body.unwrap_or("");
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n");
        if !body.is_empty() {
            req.push_str("Content-Type: application/json\r\n");
        }
        req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
        let bytes = req.as_bytes();
        let sent = loop {
            match self
                .stream
                .send_with_fds(&[bytes], fds)
                .map_err(io::Error::from)
            {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => break r?,
            }
        };
        if sent < bytes.len() {
            use std::io::Write;
            self.stream.write_all(&bytes[sent..])?;
        }
        self.read_reply()
    }

    fn read_reply(&mut self) -> io::Result<Reply> {
        loop {
            if let Some((reply, used)) = parse_reply(&self.buf)? {
                self.buf.drain(..used);
                return Ok(reply);
            }
            let mut chunk = [0u8; 4096];
            // A signal (a child of the caller ending, say) may interrupt the read: go on.
            let n = match self.stream.read(&mut chunk) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => r?,
            };
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                ));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// A whole reply at the start of `buf`, and its length.
fn parse_reply(buf: &[u8]) -> io::Result<Option<(Reply, usize)>> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut res = httparse::Response::new(&mut headers);
    let head = match res.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(bad("malformed reply")),
    };
    let length = res
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| {
            std::str::from_utf8(h.value)
                .ok()?
                .trim()
                .parse::<usize>()
                .ok()
        })
        .unwrap_or(0);
    if buf.len() < head + length {
        return Ok(None);
    }
    let reply = Reply {
        status: res.code.unwrap_or(0),
        body: String::from_utf8_lossy(&buf[head..head + length]).into_owned(),
    };
    Ok(Some((reply, head + length)))
}
