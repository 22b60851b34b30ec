//! HTTP/1.1 as the API speaks it: one request at a time from a connection's buffer (the
//! request line and headers through `httparse`, a body of exactly `Content-Length` bytes),
//! and replies with a status, `Content-Length` and, for JSON, `Content-Type`. Limits keep a
//! hostile client from making the VMM hold much: [`MAX_HEAD`] bytes of request line and
//! headers, [`MAX_BODY`] bytes of body.

use std::fmt::Write as _;

use thiserror::Error;

/// Most bytes of request line and headers (431 beyond).
pub const MAX_HEAD: usize = 8 * 1024;
/// Most bytes of body (413 beyond). Kata's largest, a `vm.create`, is about 2 KiB.
pub const MAX_BODY: usize = 1024 * 1024;
const MAX_HEADERS: usize = 32;

/// A request the client cannot send again as it is: the connection answers it and closes.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{message}")]
pub struct HttpError {
    pub status: u16,
    pub message: String,
}

impl HttpError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        HttpError {
            status,
            message: message.into(),
        }
    }
}

/// The methods the API uses; others are answered 405.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Put,
    Other,
}

/// One whole request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: Method,
    pub path: String,
    pub body: Vec<u8>,
    /// Whether the client keeps the connection for another request.
    pub keep_alive: bool,
}

/// What the start of a buffer holds.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A request and how many bytes of the buffer it took.
    Complete(Request, usize),
    /// Not all of it yet.
    Partial,
}

fn content_length(value: &[u8]) -> Result<usize, HttpError> {
    std::str::from_utf8(value)
        .ok()
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| HttpError::new(400, "Invalid Content-Length"))
}

/// Parses the request at the start of `buf`.
pub fn parse(buf: &[u8]) -> Result<Parsed, HttpError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            return Err(HttpError::new(431, "Request line and headers too large"))
        }
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(HttpError::new(431, "Too many headers"))
        }
        Err(e) => return Err(HttpError::new(400, format!("Malformed request: {e}"))),
    };
    if head > MAX_HEAD {
        return Err(HttpError::new(431, "Request line and headers too large"));
    }
    let http10 = req.version == Some(0);
    let mut length = None;
    let mut keep_alive = !http10;
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            if length.is_some() {
                return Err(HttpError::new(400, "More than one Content-Length"));
            }
            length = Some(content_length(h.value)?);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(HttpError::new(411, "Send the body with a Content-Length"));
        } else if h.name.eq_ignore_ascii_case("connection") {
            let v = String::from_utf8_lossy(h.value).to_ascii_lowercase();
            keep_alive = if http10 {
                v.contains("keep-alive")
            } else {
                !v.contains("close")
            };
        }
    }
    let length = length.unwrap_or(0);
    if length > MAX_BODY {
        return Err(HttpError::new(
            413,
            format!("Body larger than {MAX_BODY} bytes"),
        ));
    }
    if buf.len() < head + length {
        return Ok(Parsed::Partial);
    }
    let method = match req.method {
        Some("GET") => Method::Get,
        Some("PUT") => Method::Put,
        _ => Method::Other,
    };
    let path = req.path.unwrap_or("").to_string();
    let request = Request {
        method,
        path,
        body: buf[head..head + length].to_vec(),
        keep_alive,
    };
    Ok(Parsed::Complete(request, head + length))
}

/// What a reply carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    None,
    Json(String),
    Text(String),
}

/// A whole reply: status line, headers, body. The status line is Cloud Hypervisor's to the
/// byte: the code, a space and no reason phrase (valid HTTP/1.1; `ch-remote` reads everything
/// after `HTTP/1.1 ` up to the line's end as the number, so a reason phrase breaks it).
pub fn response(status: u16, body: &Body, close: bool) -> Vec<u8> {
    let mut head = format!("HTTP/1.1 {status} \r\nServer: exitless\r\n");
    let (kind, text) = match body {
        Body::None => (None, ""),
        Body::Json(t) => (Some("application/json"), t.as_str()),
        Body::Text(t) => (Some("text/plain; charset=utf-8"), t.as_str()),
    };
    if let Some(kind) = kind {
        let _ = write!(head, "Content-Type: {kind}\r\n");
    }
    let _ = write!(head, "Content-Length: {}\r\n", text.len());
    if close {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(text.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(buf: &[u8]) -> (Request, usize) {
        match parse(buf).unwrap() {
            Parsed::Complete(r, n) => (r, n),
            Parsed::Partial => panic!("partial"),
        }
    }

    #[test]
    fn requests_are_taken_one_at_a_time_with_their_bodies() {
        let two = b"PUT /api/v1/vm.resize HTTP/1.1\r\nHost: localhost\r\nContent-Length: 19\r\n\r\n{\"desired_vcpus\":2}GET /api/v1/vmm.ping HTTP/1.1\r\n\r\n";
        let (r, n) = complete(two);
        assert_eq!(
            (r.method, r.path.as_str()),
            (Method::Put, "/api/v1/vm.resize")
        );
        assert_eq!(r.body, b"{\"desired_vcpus\":2}");
        assert!(r.keep_alive);
        let (r, m) = complete(&two[n..]);
        assert_eq!((r.method, r.body.len()), (Method::Get, 0));
        assert_eq!(n + m, two.len());
    }

    #[test]
    fn partial_requests_wait_for_the_rest() {
        let full = b"PUT /api/v1/vm.create HTTP/1.1\r\nContent-Length: 4\r\n\r\n{}{}";
        for cut in [0, 10, 40, full.len() - 1] {
            assert_eq!(
                parse(&full[..cut]).unwrap(),
                Parsed::Partial,
                "cut at {cut}"
            );
        }
        assert!(matches!(parse(full).unwrap(), Parsed::Complete(_, _)));
    }

    #[test]
    fn bad_requests_get_the_status_that_says_why() {
        let status = |b: &[u8]| parse(b).unwrap_err().status;
        assert_eq!(status(b"\x00\x01garbage\r\n\r\n"), 400);
        assert_eq!(status(b"PUT / HTTP/1.1\r\nContent-Length: x\r\n\r\n"), 400);
        assert_eq!(status(b"PUT / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"), 400);
        let dup = b"PUT / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
        assert_eq!(status(dup), 400);
        let chunked = b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(status(chunked), 411);
        let big = format!("PUT / HTTP/1.1\r\nContent-Length: {}\r\n\r\n", MAX_BODY + 1);
        assert_eq!(status(big.as_bytes()), 413);
        let long = format!("GET /{} HTTP/1.1\r\n", "a".repeat(MAX_HEAD + 1));
        assert_eq!(status(long.as_bytes()), 431);
        let many: String = (0..40).map(|i| format!("X-{i}: y\r\n")).collect();
        assert_eq!(
            status(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes()),
            431
        );
    }

    #[test]
    fn connection_close_and_http_1_0_end_the_connection() {
        let (r, _) = complete(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n");
        assert!(!r.keep_alive);
        let (r, _) = complete(b"GET / HTTP/1.0\r\n\r\n");
        assert!(!r.keep_alive);
        let (r, _) = complete(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
        assert!(r.keep_alive);
    }

    #[test]
    fn replies_carry_their_length_and_type() {
        let r = String::from_utf8(response(204, &Body::None, false)).unwrap();
        assert_eq!(
            r,
            "HTTP/1.1 204 \r\nServer: exitless\r\nContent-Length: 0\r\n\r\n"
        );
        let r = String::from_utf8(response(200, &Body::Json("{}".into()), true)).unwrap();
        assert!(r.starts_with("HTTP/1.1 200 \r\n"), "{r}");
        let r400 = response(400, &Body::Text("Bad".into()), false);
        assert!(r400.starts_with(b"HTTP/1.1 400 \r\n"));
        assert!(r.contains("Content-Type: application/json\r\n"), "{r}");
        assert!(
            r.contains("Content-Length: 2\r\nConnection: close\r\n\r\n{}"),
            "{r}"
        );
    }
}
