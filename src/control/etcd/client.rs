//! The blocking calls: one POST per operation on a shared agent (its
//! connection is reused), and a watch on a connection of its own.

use std::io::{self, BufReader};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use parking_lot::Mutex;
use serde_json::json;

use super::wire::{self, LineReader, MAX_RESPONSE_BYTES, WatchState};
use super::{EtcdError, LeaseId, Range, WatchEvent, prefix_end};
use crate::Secret;

/// How often a watch read wakes up with nothing to read: the granularity
/// of [`Watch::next`]'s timeout. A read that times out leaves the stream
/// usable (ureq 3.5), so the tick costs one wake-up, not a reconnect.
const WATCH_TICK: Duration = Duration::from_millis(100);

/// An etcd user and password, for a cluster with auth enabled.
#[derive(Debug, Clone)]
pub struct Credentials {
    /// The etcd user.
    pub user: String,
    /// Its password (`Secret` keeps it out of `Debug` and logs).
    pub password: Secret,
}

/// What an `https://` endpoint is checked against and shows: the CA that
/// signed the members' certificates (else the public web roots), and this
/// engine's certificate when etcd wants clients to show one
/// (`--client-cert-auth`).
#[derive(Clone)]
pub struct Tls(ureq::tls::TlsConfig);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("client_cert", &self.0.client_cert().is_some())
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// From PEM files: `ca` (one or more certificates; `None`: the web
    /// roots), and a client certificate chain with its key (both or
    /// neither).
    ///
    /// # Errors
    /// [`EtcdError::Invalid`] naming the file that cannot be read or holds
    /// no certificate (or key).
    pub fn from_files(
        ca: Option<&std::path::Path>,
        client: Option<(&std::path::Path, &std::path::Path)>,
    ) -> Result<Tls, EtcdError> {
        use ureq::tls::{ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig};
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(|e| EtcdError::Invalid(format!("{}: {e}", p.display())))
        };
        let certs = |p: &std::path::Path| -> Result<Vec<_>, EtcdError> {
            let pem = read(p)?;
            let certs: Vec<_> = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect();
            if certs.is_empty() {
                return Err(EtcdError::Invalid(format!(
                    "{}: no PEM certificate in it",
                    p.display()
                )));
            }
            Ok(certs)
        };
        let mut b = TlsConfig::builder();
        if let Some(ca) = ca {
            b = b.root_certs(RootCerts::new_with_certs(&certs(ca)?));
        }
        if let Some((cert, key)) = client {
            let chain = certs(cert)?;
            let key = PrivateKey::from_pem(&read(key)?).map_err(|e| {
                EtcdError::Invalid(format!("{}: no PEM private key in it ({e})", key.display()))
            })?;
            b = b.client_cert(Some(ClientCert::new_with_certs(&chain, key)));
        }
        Ok(Tls(b.build()))
    }
}

/// A connection to one member of an etcd cluster.
pub struct EtcdClient {
    agent: ureq::Agent,
    tls: Option<Tls>,
    /// `http://host:port`, no trailing slash.
    base: String,
    timeout: Duration,
    credentials: Option<Credentials>,
    /// The token of the last authentication, sent raw as `Authorization`
    /// (etcd refuses `Bearer`); replaced when etcd says it expired.
    token: Mutex<Option<String>>,
}

impl std::fmt::Debug for EtcdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No token: it grants the user's rights until it expires.
        f.debug_struct("EtcdClient")
            .field("endpoint", &self.base)
            .field("timeout", &self.timeout)
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

/// `endpoint` as a base URL ([`crate::config::etcd_endpoint_url`]).
pub(super) fn base_url(endpoint: &str) -> Result<String, EtcdError> {
    crate::config::etcd_endpoint_url(endpoint).map_err(EtcdError::Invalid)
}

fn agent(timeout: Duration, tls: Option<&Tls>) -> ureq::Agent {
    ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .tls_config(tls.map(|t| t.0.clone()).unwrap_or_default())
            .timeout_global(Some(timeout))
            // etcd's error bodies carry the reason: read them ourselves.
            .http_status_as_error(false)
            // etcd is a cluster-local service: an HTTP_PROXY meant for the
            // outside must not reroute it.
            .proxy(None)
            .max_redirects(0)
            .build(),
    )
}

/// A ureq failure on `base` as an [`EtcdError`].
fn transport_error(base: &str, e: ureq::Error) -> EtcdError {
    match e {
        ureq::Error::Timeout(_) => EtcdError::Timeout(base.to_owned()),
        ureq::Error::BodyExceedsLimit(n) => EtcdError::Malformed(format!(
            "a response of more than {n} bytes (limit {MAX_RESPONSE_BYTES})"
        )),
        ureq::Error::Io(io) if is_timeout(&io) => EtcdError::Timeout(base.to_owned()),
        e => EtcdError::Unreachable(format!("{base}: {e}")),
    }
}

/// Is this read error a timeout (the stream still usable)?
fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    ) || e
        .get_ref()
        .and_then(|i| i.downcast_ref::<ureq::Error>())
        .is_some_and(|u| matches!(u, ureq::Error::Timeout(_)))
}

fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

impl EtcdClient {
    /// Connects to the first of `endpoints` (`host:port` or
    /// `http://host:port`) whose `/health` says healthy, each tried with
    /// `timeout`; when none does, the error names every endpoint and why.
    pub fn connect(endpoints: &[String], timeout: Duration) -> Result<EtcdClient, EtcdError> {
        EtcdClient::connect_with(endpoints, timeout, None)
    }

    /// [`EtcdClient::connect_with`], with `tls` for `https://` endpoints.
    pub fn connect_secure(
        endpoints: &[String],
        timeout: Duration,
        credentials: Option<Credentials>,
        tls: Option<Tls>,
    ) -> Result<EtcdClient, EtcdError> {
        EtcdClient::connect_all(endpoints, timeout, credentials, tls)
    }

    /// [`EtcdClient::connect`], then authenticates with `credentials` when
    /// given (wrong ones are [`EtcdError::AuthFailed`], not tried on the
    /// other endpoints). Calls re-authenticate once when etcd says the
    /// token expired.
    pub fn connect_with(
        endpoints: &[String],
        timeout: Duration,
        credentials: Option<Credentials>,
    ) -> Result<EtcdClient, EtcdError> {
        EtcdClient::connect_all(endpoints, timeout, credentials, None)
    }

    fn connect_all(
        endpoints: &[String],
        timeout: Duration,
        credentials: Option<Credentials>,
        tls: Option<Tls>,
    ) -> Result<EtcdClient, EtcdError> {
        if endpoints.is_empty() {
            return Err(EtcdError::Invalid("no etcd endpoint given".into()));
        }
        let mut failures = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let client = EtcdClient {
                agent: agent(timeout, tls.as_ref()),
                tls: tls.clone(),
                base: base_url(endpoint)?,
                timeout,
                credentials: credentials.clone(),
                token: Mutex::new(None),
            };
            match client.health() {
                Ok(true) => match client.authenticate() {
                    Ok(()) => return Ok(client),
                    Err(e @ EtcdError::AuthFailed(_)) => return Err(e),
                    Err(e) => failures.push(format!("{endpoint}: {e}")),
                },
                Ok(false) => failures.push(format!("{endpoint}: not healthy")),
                Err(e) => failures.push(format!("{endpoint}: {e}")),
            }
        }
        Err(EtcdError::Unreachable(format!(
            "no endpoint answered healthy ({})",
            failures.join("; ")
        )))
    }

    /// The member this client talks to (`http://host:port`).
    pub fn endpoint(&self) -> &str {
        &self.base
    }

    /// Is the member healthy (`GET /health`)?
    pub fn health(&self) -> Result<bool, EtcdError> {
        let resp = self
            .agent
            .get(format!("{}/health", self.base))
            .call()
            .map_err(|e| transport_error(&self.base, e))?;
        let (status, body) = self.read_body(resp)?;
        if status != 200 {
            // An unhealthy member answers 503 with `"health":"false"`.
            return Ok(false);
        }
        wire::decode_health(&body)
    }

    fn read_body(
        &self,
        resp: ureq::http::Response<ureq::Body>,
    ) -> Result<(u16, Vec<u8>), EtcdError> {
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .with_config()
            .limit(MAX_RESPONSE_BYTES as u64)
            .read_to_vec()
            .map_err(|e| transport_error(&self.base, e))?;
        Ok((status, body))
    }

    /// Gets a token for the credentials, if any.
    fn authenticate(&self) -> Result<(), EtcdError> {
        let Some(c) = &self.credentials else {
            return Ok(());
        };
        let body = json!({ "name": c.user, "password": c.password.expose() });
        let token = match self.post_once("/v3/auth/authenticate", &body.to_string(), false) {
            Ok(body) => wire::decode_auth(&body)?,
            // etcd 3.4 answers wrong credentials with gRPC 3
            // InvalidArgument (HTTP 400), credentials for a cluster
            // without auth with 9 FailedPrecondition (412): both the
            // configuration's fault. Unavailable, overload are not.
            Err(EtcdError::Server {
                code: 3 | 7 | 9 | 16,
                message,
                ..
            }) => {
                return Err(EtcdError::AuthFailed(format!("user {:?}: {message}", c.user)));
            }
            Err(e) => return Err(e),
        };
        *self.token.lock() = Some(token);
        Ok(())
    }

    /// POSTs `body` to `path`; the answer's body when it is a 200. A token
    /// etcd calls invalid (gRPC 16: expired) is renewed once.
    pub(super) fn post(&self, path: &str, body: serde_json::Value) -> Result<Vec<u8>, EtcdError> {
        let body = body.to_string();
        match self.post_once(path, &body, true) {
            Err(EtcdError::Server { code: 16, .. }) if self.credentials.is_some() => {
                self.authenticate()?;
                self.post_once(path, &body, true)
            }
            r => r,
        }
    }

    fn post_once(&self, path: &str, body: &str, with_token: bool) -> Result<Vec<u8>, EtcdError> {
        let mut req = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("Content-Type", "application/json");
        if let Some(token) = self.token.lock().as_deref().filter(|_| with_token) {
            req = req.header("Authorization", token);
        }
        let resp = req
            .send(body)
            .map_err(|e| transport_error(&self.base, e))?;
        let (status, body) = self.read_body(resp)?;
        if status != 200 {
            return Err(wire::decode_error(status, &body));
        }
        Ok(body)
    }

    /// Grants a lease of `ttl` (etcd's minimum is 2 s; it rounds up);
    /// returns it with the TTL granted, in seconds.
    pub fn grant(&self, ttl: Duration) -> Result<(LeaseId, i64), EtcdError> {
        let secs = ttl.as_secs().max(1);
        let body = self.post("/v3/lease/grant", json!({ "TTL": secs.to_string() }))?;
        wire::decode_grant(&body)
    }

    /// Renews `lease` once; the TTL left in seconds. A lease that expired
    /// or was revoked is [`EtcdError::LeaseGone`].
    pub fn keep_alive(&self, lease: LeaseId) -> Result<i64, EtcdError> {
        let body = self.post("/v3/lease/keepalive", json!({ "ID": lease.0.to_string() }))?;
        wire::decode_keep_alive(lease, &body)
    }

    /// Revokes `lease`, deleting its keys now (peers watching see the
    /// deletes at once instead of at expiry). An unknown lease is
    /// [`EtcdError::LeaseGone`].
    pub fn revoke(&self, lease: LeaseId) -> Result<(), EtcdError> {
        match self.post("/v3/lease/revoke", json!({ "ID": lease.0.to_string() })) {
            Ok(body) => wire::decode_put(&body).map(drop),
            // gRPC NotFound: "requested lease not found".
            Err(EtcdError::Server { code: 5, .. }) => Err(EtcdError::LeaseGone(lease)),
            Err(e) => Err(e),
        }
    }

    /// Puts `value` under `key`, attached to `lease` when given (the key
    /// goes when the lease does); the revision of the put.
    pub fn put(&self, key: &[u8], value: &[u8], lease: Option<LeaseId>) -> Result<i64, EtcdError> {
        let mut req = json!({ "key": b64(key), "value": b64(value) });
        if let Some(l) = lease {
            req["lease"] = json!(l.0.to_string());
        }
        match (self.post("/v3/kv/put", req), lease) {
            (Ok(body), _) => wire::decode_put(&body),
            // gRPC NotFound: "requested lease not found".
            (Err(EtcdError::Server { code: 5, .. }), Some(l)) => Err(EtcdError::LeaseGone(l)),
            (Err(e), _) => Err(e),
        }
    }

    /// The value under `key` and the revision that last modified it.
    pub fn get(&self, key: &[u8]) -> Result<Option<(Vec<u8>, i64)>, EtcdError> {
        let body = self.post("/v3/kv/range", json!({ "key": b64(key) }))?;
        let range = wire::decode_range(&body, |k| k == key)?;
        match <[_; 1]>::try_from(range.kvs) {
            Ok([kv]) => Ok(Some((kv.value, kv.mod_revision))),
            Err(kvs) if kvs.is_empty() => Ok(None),
            Err(_) => Err(EtcdError::Malformed(
                "get: several values for one key".into(),
            )),
        }
    }

    /// Every key under `prefix` with its value, and the revision they were
    /// read at (watch from `revision + 1` to miss nothing after it). More
    /// than [`wire::MAX_KVS`] keys is an error.
    pub fn range_prefix(&self, prefix: &[u8]) -> Result<Range, EtcdError> {
        let body = self.post(
            "/v3/kv/range",
            json!({
                "key": b64(prefix),
                "range_end": b64(&prefix_end(prefix)),
                "limit": wire::MAX_KVS.to_string(),
            }),
        )?;
        wire::decode_range(&body, |k| k.starts_with(prefix))
    }

    /// Deletes `key`; whether it was there.
    pub fn delete(&self, key: &[u8]) -> Result<bool, EtcdError> {
        let body = self.post("/v3/kv/deleterange", json!({ "key": b64(key) }))?;
        Ok(wire::decode_delete(&body)? > 0)
    }

    /// Watches every key under `prefix` from `start_revision` (a range's
    /// revision + 1), with each deletion naming the lease of the value it
    /// deleted. Returns once etcd confirmed the watch (within the client's
    /// timeout), so a change made after this returns is seen.
    pub fn watch_prefix(&self, prefix: &[u8], start_revision: i64) -> Result<Watch, EtcdError> {
        // A token that expires while the watch runs cancels it in band;
        // a fresh one here keeps a re-watch from failing the same way.
        self.authenticate()?;
        // A connection of its own: the stream never ends, and a read wakes
        // every WATCH_TICK so that `next` can honour its timeout.
        let agent = ureq::Agent::new_with_config(
            ureq::Agent::config_builder()
                .tls_config(self.tls.as_ref().map(|t| t.0.clone()).unwrap_or_default())
                .timeout_connect(Some(self.timeout))
                .timeout_send_request(Some(self.timeout))
                .timeout_recv_response(Some(self.timeout))
                .timeout_per_read(Some(WATCH_TICK))
                .http_status_as_error(false)
                .proxy(None)
                .max_redirects(0)
                .build(),
        );
        let req = json!({ "create_request": {
            "key": b64(prefix),
            "range_end": b64(&prefix_end(prefix)),
            "start_revision": start_revision.max(0).to_string(),
            "prev_kv": true,
        }});
        let mut request = agent
            .post(format!("{}/v3/watch", self.base))
            .header("Content-Type", "application/json");
        if let Some(token) = self.token.lock().as_deref() {
            request = request.header("Authorization", token);
        }
        let resp = request
            .send(req.to_string())
            .map_err(|e| transport_error(&self.base, e))?;
        if resp.status() != 200 {
            let (status, body) = self.read_body(resp)?;
            return Err(wire::decode_error(status, &body));
        }
        let mut watch = Watch {
            lines: LineReader::new(
                BufReader::new(resp.into_body().into_reader()),
                MAX_RESPONSE_BYTES,
            ),
            state: WatchState::new(start_revision),
            prefix: prefix.to_vec(),
            base: self.base.clone(),
        };
        let deadline = Instant::now() + self.timeout;
        while !watch.state.created() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(EtcdError::Timeout(self.base.clone()));
            }
            watch.read_line(deadline)?;
        }
        Ok(watch)
    }
}

/// A prefix watch: one streaming connection, read line by line. Dropping
/// it closes the connection, which is how a watch ends over the gateway.
pub struct Watch {
    lines: LineReader<BufReader<ureq::BodyReader<'static>>>,
    state: WatchState,
    prefix: Vec<u8>,
    base: String,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("endpoint", &self.base)
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl Watch {
    /// The next change, or `None` when none came within `timeout` (a tick
    /// for the caller to check for shutdown; it may run up to 100 ms over:
    /// reads time out every 100 ms and are tried again until the
    /// deadline).
    /// A canceled watch is [`EtcdError::WatchCanceled`], a stream that
    /// ended [`EtcdError::WatchClosed`]: the watch is then done; range
    /// again and watch anew.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<WatchEvent>, EtcdError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.state.pop() {
                return Ok(Some(e));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            // A read tick that timed out (false) is not the deadline: read
            // again until it passes.
            self.read_line(deadline)?;
        }
    }

    /// Reads and decodes one line; false when a read timed out, or the
    /// deadline passed, first.
    fn read_line(&mut self, deadline: Instant) -> Result<bool, EtcdError> {
        match self.lines.next_line(Some(deadline)) {
            Ok(Some(line)) => {
                let prefix = &self.prefix;
                self.state.push_line(&line, |k| k.starts_with(prefix))?;
                Ok(true)
            }
            Ok(None) => Err(EtcdError::WatchClosed(format!(
                "{}: end of stream",
                self.base
            ))),
            Err(e) if is_timeout(&e) => Ok(false),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                Err(EtcdError::Malformed(format!("watch: {e}")))
            }
            Err(e) => Err(EtcdError::WatchClosed(format!("{}: {e}", self.base))),
        }
    }
}
