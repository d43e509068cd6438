//! The engine's HTTP endpoint: metrics, health and topology for operators
//! and scrapers (issue #42), served off the data path.
//!
//! - [`request`]: the pure decision, bytes of a request head in, a
//!   [`Response`] out ([`request::answer`]): parse (`httparse`, hyper's
//!   HTTP/1 parser), bounds, method, bearer, route. No socket, so unit
//!   tests and the `http_request` fuzz target drive exactly what the
//!   server runs.
//! - [`server`]: [`HttpServer`], one thread (`tent-http`) polling the
//!   listener, a wake eventfd and its connections, all non-blocking. The
//!   [`Routes`] run on that thread: they read the engine's atomics and
//!   never touch a worker.
//!
//! Bounds, so that a slow, malformed or never-reading client cannot
//! disturb the engine (nor the endpoint for long):
//! - at most [`MAX_CONNECTIONS`] (64) open connections; a newcomer over the
//!   cap closes the oldest connection not being answered (the newcomer
//!   itself when every slot is being answered), counted as evicted;
//! - a request head of at most [`MAX_HEAD`] (8 KiB, read into one buffer
//!   allocated at accept) else 431; a request target of at most
//!   [`MAX_TARGET`] (1 KiB) else 414; at most [`MAX_HEADERS`] headers
//!   else 431;
//! - GET and HEAD only (else 405); a request body is refused (413, or 400
//!   for a `Content-Length` that is no number);
//! - one deadline, [`EXCHANGE_TIMEOUT`] (2 s) from accept or from the
//!   previous answer, for the whole exchange, reading the request and
//!   writing the response: a slowloris or a client that never reads its
//!   response is closed then (counted; a kept-alive connection idle that
//!   long is closed uncounted);
//! - keep-alive for HTTP/1.1 clients that do not ask `Connection: close`
//!   (a scrape loop reuses its connection: no connect and close per
//!   scrape), one request at a time: bytes sent past a request's head
//!   (pipelining, a body) close the connection after its answer, as do a
//!   refusal and the 10 000th request; every response carries
//!   `Content-Length`. At the cap a kept-alive connection makes room
//!   early: idle, right after draining ones; answering a later request,
//!   last (so slow readers that keep asking cannot hold every slot).
//!
//! The server counts ([`HttpCounters`], written by its thread alone):
//! connections accepted, evicted at the cap and timed out, requests
//! refused by cause, responses written out by status class. The engine
//! shows them in `/metrics` (`tent_http_*`).
//!
//! With a shared secret, every path but the open ones
//! ([`Bearer::from_secret`]: liveness) needs `Authorization: Bearer
//! <token>`, compared in constant time; else 401 with `WWW-Authenticate:
//! Bearer`. The token is derived from the secret, so the secret itself
//! never travels over HTTP.

pub(crate) mod request;
pub(crate) mod server;

use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub(crate) use server::{HttpCounters, HttpServer, HttpStats};

/// Most connections open at once; past it a newcomer takes the slot of one
/// not answering its first request (see the module doc).
pub(crate) const MAX_CONNECTIONS: usize = 64;
/// Longest request head (request line and headers), in bytes.
pub(crate) const MAX_HEAD: usize = 8 * 1024;
/// Longest request target (path and query), in bytes.
pub(crate) const MAX_TARGET: usize = 1024;
/// Most request headers.
pub(crate) const MAX_HEADERS: usize = 32;
/// The deadline of one exchange, reading the request and writing its
/// answer: from accept, or from the previous answer on a kept-alive
/// connection.
pub(crate) const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(2);

/// What a route answers: a status, a content type and a body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Response {
    /// The HTTP status code.
    pub(crate) status: u16,
    /// The `Content-Type` header's value.
    pub(crate) content_type: &'static str,
    /// The body (omitted on the wire for HEAD; its length is still sent).
    pub(crate) body: Vec<u8>,
}

impl Response {
    /// A plain-text (UTF-8) response.
    pub(crate) fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into().into_bytes(),
        }
    }

    /// A JSON response (`body` is JSON text).
    pub(crate) fn json(status: u16, body: String) -> Response {
        Response {
            status,
            content_type: "application/json",
            body: body.into_bytes(),
        }
    }
}

/// What the server serves: GET (and HEAD, body omitted) of a path.
pub(crate) trait Routes: Send + Sync + 'static {
    /// The response to GET `path` (without its query) with `query` (what
    /// followed `?`, if anything). 404 for an unknown path is the routes'
    /// answer. Runs on the server thread; a panic answers 500.
    fn get(&self, path: &str, query: Option<&str>) -> Response;
}

/// The bearer token required with a secret, and the paths exempt from it.
pub(crate) struct Bearer {
    /// Hex of HMAC-SHA256(secret, [`Bearer::LABEL`]); never printed.
    token: String,
    /// Paths served without the token.
    open_paths: &'static [&'static str],
}

impl Bearer {
    /// What the token authenticates, under the secret.
    pub(crate) const LABEL: &'static [u8] = b"tent http bearer v1";
    /// The paths open without a token: liveness, for orchestrators that
    /// hold no secret.
    pub(crate) const OPEN_PATHS: &'static [&'static str] = &["/health/live"];

    /// The bearer of the shared `secret`: its token is the hex of
    /// HMAC-SHA256(secret, `b"tent http bearer v1"`), so the secret itself
    /// never travels over HTTP; `/health/live` stays open.
    pub(crate) fn from_secret(secret: &[u8]) -> Bearer {
        let mut m = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
        m.update(Self::LABEL);
        let tag = m.finalize().into_bytes();
        let mut token = String::with_capacity(2 * tag.len());
        for b in tag {
            token.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
            token.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
        }
        Bearer {
            token,
            open_paths: Self::OPEN_PATHS,
        }
    }

    /// The token a client sends (`Authorization: Bearer <token>`).
    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    /// Whether `path` is served without the token.
    pub(crate) fn is_open(&self, path: &str) -> bool {
        self.open_paths.contains(&path)
    }

    /// Whether `given` is the token, in time independent of where they
    /// differ.
    pub(crate) fn accepts(&self, given: &[u8]) -> bool {
        use subtle::ConstantTimeEq;
        bool::from(self.token.as_bytes().ct_eq(given))
    }
}

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bearer")
            .field("token", &"<redacted>")
            .field("open_paths", &self.open_paths)
            .finish()
    }
}

/// Fixed routes for the unit tests and the `http_request` fuzz target:
/// `/health/live` and `/metrics` answer 200, anything else 404.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug)]
pub(crate) struct FixedRoutes;

#[cfg(any(test, feature = "testing"))]
impl FixedRoutes {
    /// The paths that answer 200.
    pub(crate) const KNOWN: &'static [&'static str] = &["/health/live", "/metrics"];
    /// The secret of the fuzz target's bearer (and its seeds' token).
    pub(crate) const SECRET: &'static [u8] = b"the http fuzz target's secret";
}

#[cfg(any(test, feature = "testing"))]
impl Routes for FixedRoutes {
    fn get(&self, path: &str, query: Option<&str>) -> Response {
        match path {
            "/health/live" => Response::text(200, "ok\n"),
            "/metrics" => Response::text(
                200,
                format!("tent_up 1\n# query {}\n", query.unwrap_or("-")),
            ),
            _ => Response::text(404, "not found\n"),
        }
    }
}

#[cfg(test)]
mod tests;
