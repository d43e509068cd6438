//! The decision for one request, without a socket: where its head ends
//! ([`head_end`]), and the response to it ([`answer`]): parse, bounds,
//! method, body, bearer, then the route. The server and the
//! `http_request` fuzz target call the same functions.

use std::fmt::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::{Bearer, MAX_HEAD, MAX_HEADERS, MAX_TARGET, Response, Routes};

/// What became of a request, for the server's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The route answered (whatever its status).
    Routed,
    /// Malformed, or a method other than GET and HEAD (400, 405).
    BadRequest,
    /// Over a bound: the head, the target, the header count, a body (413,
    /// 414, 431).
    TooLarge,
    /// A bearer is required and was missing or wrong (401).
    Unauthorized,
}

/// The response to one request, and how to send it.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// What to answer.
    pub(crate) response: Response,
    /// HEAD: send the head only (its `Content-Length` is still the body's).
    pub(crate) head_only: bool,
    /// One more header line (with its CRLF), or "".
    pub(crate) extra_header: &'static str,
    /// What became of the request.
    pub(crate) verdict: Verdict,
    /// The connection may carry another request after this response
    /// (HTTP/1.1, routed, no `Connection: close`): a scraper's next scrape
    /// costs no new connection.
    pub(crate) keep_alive: bool,
}

impl Outcome {
    /// The server's own answer (no route involved).
    fn refuse(status: u16, verdict: Verdict, extra_header: &'static str) -> Outcome {
        Outcome {
            response: Response::text(status, format!("{}\n", reason(status).to_ascii_lowercase())),
            head_only: false,
            extra_header,
            verdict,
            keep_alive: false,
        }
    }

    /// 431: a head that did not end within [`MAX_HEAD`] bytes.
    pub(crate) fn head_too_large() -> Outcome {
        Outcome::refuse(431, Verdict::TooLarge, "")
    }

    /// The status line and headers, through the blank line.
    pub(crate) fn head(&self) -> Vec<u8> {
        let r = &self.response;
        let mut h = String::with_capacity(160 + self.extra_header.len());
        // Writing into a String cannot fail.
        let _ = write!(
            h,
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: {}\r\nCache-Control: no-store\r\n{}\r\n",
            r.status,
            reason(r.status),
            r.content_type,
            r.body.len(),
            if self.keep_alive { "keep-alive" } else { "close" },
            self.extra_header,
        );
        h.into_bytes()
    }

    /// What goes on the wire after the head: the body, or nothing for HEAD.
    pub(crate) fn body(&self) -> &[u8] {
        if self.head_only {
            &[]
        } else {
            &self.response.body
        }
    }
}

/// The reason phrase of `status` ("Unknown" for a code not listed).
pub(crate) fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// Where the head in `buf` ends (just past its blank line: a line feed,
/// an optional carriage return, a line feed), or `None` while it has not
/// ended. `buf[..from]` was looked at already and holds no end (bytes
/// arrived since, so `from < buf.len()`): each byte is scanned about once
/// however the head trickles in.
pub(crate) fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    // A terminator may straddle `from`: step back over its first two bytes.
    let start = from.saturating_sub(2);
    let mut i = start;
    while i < buf.len() {
        if buf[i] == b'\n' {
            match buf.get(i + 1) {
                Some(b'\n') => return Some(i + 2),
                Some(b'\r') if buf.get(i + 2) == Some(&b'\n') => return Some(i + 3),
                _ => {}
            }
        }
        i += 1;
    }
    None
}

/// The response to the request whose head is `head` (through its blank
/// line; anything after the blank line is taken for a body and refused).
pub(crate) fn answer(head: &[u8], routes: &dyn Routes, bearer: Option<&Bearer>) -> Outcome {
    if head.len() > MAX_HEAD {
        return Outcome::head_too_large();
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let used = match req.parse(head) {
        Ok(httparse::Status::Complete(n)) => n,
        Err(httparse::Error::TooManyHeaders) => return Outcome::head_too_large(),
        // A head that ends early (the caller hands a whole one) or breaks
        // the grammar.
        Ok(httparse::Status::Partial) | Err(_) => {
            return Outcome::refuse(400, Verdict::BadRequest, "");
        }
    };
    let (Some(method), Some(target)) = (req.method, req.path) else {
        return Outcome::refuse(400, Verdict::BadRequest, "");
    };
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Outcome::refuse(405, Verdict::BadRequest, "Allow: GET, HEAD\r\n"),
    };
    // From here on a refusal to HEAD is a head alone too.
    let refuse = |status, verdict, extra| Outcome {
        head_only,
        ..Outcome::refuse(status, verdict, extra)
    };
    if target.len() > MAX_TARGET {
        return refuse(414, Verdict::TooLarge, "");
    }
    // Origin form only ("/path?query"): no absolute form, no "*".
    if !target.starts_with('/') {
        return refuse(400, Verdict::BadRequest, "");
    }
    // No body: bytes past the head, a non-zero Content-Length, any
    // Transfer-Encoding.
    if used < head.len() {
        return refuse(413, Verdict::TooLarge, "");
    }
    let mut authorization = None;
    // HTTP/1.1 keeps the connection unless the client says otherwise.
    let mut keep_alive = req.version == Some(1);
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            if h.value.is_empty() || !h.value.iter().all(u8::is_ascii_digit) {
                return refuse(400, Verdict::BadRequest, "");
            }
            if h.value.iter().any(|&b| b != b'0') {
                return refuse(413, Verdict::TooLarge, "");
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return refuse(413, Verdict::TooLarge, "");
        } else if h.name.eq_ignore_ascii_case("authorization") {
            if authorization.is_some() {
                return refuse(400, Verdict::BadRequest, "");
            }
            authorization = Some(h.value);
        } else if h.name.eq_ignore_ascii_case("connection")
            && h.value
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
        {
            keep_alive = false;
        }
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    let authorized = bearer.is_none_or(|b| {
        b.is_open(path)
            || authorization
                .and_then(bearer_token)
                .is_some_and(|t| b.accepts(t))
    });
    if !authorized {
        return refuse(401, Verdict::Unauthorized, "WWW-Authenticate: Bearer\r\n");
    }
    let response = match catch_unwind(AssertUnwindSafe(|| routes.get(path, query))) {
        Ok(r) => r,
        Err(_) => {
            crate::lograte::warn_limited!(
                ("http route panicked", path),
                path,
                "http: a route panicked; answered 500"
            );
            Response::text(500, "internal server error\n")
        }
    };
    Outcome {
        response,
        head_only,
        extra_header: "",
        verdict: Verdict::Routed,
        keep_alive,
    }
}

/// The token of an `Authorization` value `Bearer <token>` (the scheme in
/// any case, spaces around the token dropped).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer ";
    if value.len() < SCHEME.len() || !value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    Some(value[SCHEME.len()..].trim_ascii())
}
