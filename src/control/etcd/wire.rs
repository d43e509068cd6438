//! The JSON shapes of etcd's v3 gateway (grpc-gateway's rendering of the
//! protobuf messages), decoded as hostile input: whoever answers on the
//! endpoint, or wrote into the store, chooses every byte.
//!
//! proto3 JSON rules the gateway follows: int64 fields are decimal
//! strings (`"revision":"3"`); bytes fields are standard base64; fields
//! with their zero value are omitted (no `kvs` on an empty range, no
//! `type` on a PUT event, no `TTL` on a dead lease), so every field here
//! defaults to zero. Unknown fields are ignored (a newer etcd adds some).
//! Sizes are bounded before parsing ([`MAX_RESPONSE_BYTES`], one watch
//! line at most as much) and counts after ([`MAX_KVS`]).

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, BufRead};
use std::time::Instant;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, de::DeserializeOwned};

use super::{EtcdError, LeaseId};

/// The largest response body or watch line read (4 MiB): etcd's own
/// request limit is 1.5 MiB of base64 JSON, so a well-formed answer about
/// a tent prefix stays far below it.
pub const MAX_RESPONSE_BYTES: usize = 4 << 20;

/// The most keys one range may return; more is refused, not truncated.
pub const MAX_KVS: usize = 65_536;

/// The longest auth token taken from a server (etcd's simple tokens are
/// about 20 bytes, JWTs a few hundred).
pub const MAX_TOKEN_BYTES: usize = 4096;

/// An int64 as proto3 JSON writes it: a decimal string, or (accepted on
/// input) a JSON integer.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct I64(i64);

impl<'de> Deserialize<'de> for I64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<I64, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = I64;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an int64 as a decimal string or an integer")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<I64, E> {
                s.parse::<i64>()
                    .map(I64)
                    .map_err(|_| E::custom("int64 string out of range"))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<I64, E> {
                Ok(I64(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<I64, E> {
                i64::try_from(v)
                    .map(I64)
                    .map_err(|_| E::custom("int64 out of range"))
            }
        }
        d.deserialize_any(V)
    }
}

/// A bytes field: standard base64 (padded), decoded while parsing.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Bytes(Vec<u8>);

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Bytes;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("base64 bytes")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Bytes, E> {
                B64.decode(s)
                    .map(Bytes)
                    .map_err(|_| E::custom("bytes field is not base64"))
            }
        }
        d.deserialize_str(V)
    }
}

/// The event type enum: `"PUT"` (omitted: the zero value) or `"DELETE"`,
/// or their numbers.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum EventType {
    #[default]
    Put,
    Delete,
}

impl<'de> Deserialize<'de> for EventType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<EventType, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = EventType;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("PUT or DELETE")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<EventType, E> {
                match s {
                    "PUT" => Ok(EventType::Put),
                    "DELETE" => Ok(EventType::Delete),
                    _ => Err(E::custom("unknown event type")),
                }
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<EventType, E> {
                match v {
                    0 => Ok(EventType::Put),
                    1 => Ok(EventType::Delete),
                    _ => Err(E::custom("unknown event type")),
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<EventType, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom("unknown event type"))
                    .and_then(|v| self.visit_u64(v))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Header {
    revision: I64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct KeyValue {
    key: Bytes,
    value: Bytes,
    mod_revision: I64,
    lease: I64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RangeBody {
    header: Header,
    kvs: Bounded<KeyValue>,
    more: bool,
}

/// A JSON array of at most [`MAX_KVS`] elements, refused while it is read
/// past that: `[{},{},...]` in 4 MiB is about 1.4 M empty entries, each a
/// full `KeyValue` (or event) once decoded, ~100 MB built before a count
/// checked after decoding would refuse it.
#[derive(Debug)]
struct Bounded<T>(Vec<T>);

impl<T> Default for Bounded<T> {
    fn default() -> Self {
        Bounded(Vec::new())
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Bounded<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Visit<T> {
            type Value = Bounded<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "an array of at most {MAX_KVS} elements")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut v = Vec::new();
                while let Some(e) = seq.next_element()? {
                    if v.len() == MAX_KVS {
                        return Err(serde::de::Error::custom(format_args!(
                            "more than {MAX_KVS} elements"
                        )));
                    }
                    v.push(e);
                }
                Ok(Bounded(v))
            }
        }
        d.deserialize_seq(Visit(std::marker::PhantomData))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct HeaderBody {
    header: Header,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct DeleteBody {
    header: Header,
    deleted: I64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct GrantBody {
    #[serde(rename = "ID")]
    id: I64,
    #[serde(rename = "TTL")]
    ttl: I64,
    error: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct KeepAliveResult {
    #[serde(rename = "TTL")]
    ttl: I64,
}

/// A streamed message: `{"result": ...}` or, when the stream fails,
/// `{"error": {...}}`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Streamed<T: Default> {
    result: Option<T>,
    error: Option<ErrorBody>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WatchBody {
    header: Header,
    created: bool,
    canceled: bool,
    compact_revision: I64,
    cancel_reason: String,
    events: Bounded<EventBody>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct EventBody {
    #[serde(rename = "type")]
    kind: EventType,
    kv: KeyValue,
    prev_kv: Option<KeyValue>,
}

/// An error body: `{"error": .., "message": .., "code": <gRPC code>}`, or
/// in a stream `{"grpc_code": .., "http_code": .., "message": ..}`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ErrorBody {
    error: String,
    message: String,
    code: I64,
    grpc_code: I64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct HealthBody {
    health: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AuthBody {
    token: String,
}

/// One key's value and the revision that last modified it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// The revision of the key's last modification (> 0).
    pub mod_revision: i64,
}

/// A range's keys and the store revision it was read at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    /// The keys, in key order as etcd sent them.
    pub kvs: Vec<Kv>,
    /// The store's revision when the range was read (a watch from
    /// `revision + 1` misses nothing and repeats nothing).
    pub revision: i64,
}

/// One change a watch reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// A key was created or changed.
    Put {
        /// The key.
        key: Vec<u8>,
        /// Its new value.
        value: Vec<u8>,
        /// The revision of this change.
        mod_revision: i64,
        /// The lease the key is attached to, if any.
        lease: Option<LeaseId>,
    },
    /// A key was deleted, by a delete or by its lease expiring or being
    /// revoked.
    Delete {
        /// The key.
        key: Vec<u8>,
        /// The revision of the deletion.
        mod_revision: i64,
        /// The lease the key was attached to (from the previous value), if
        /// any: a deletion at a lease's expiry names it here.
        prev_lease: Option<LeaseId>,
    },
}

impl WatchEvent {
    /// The key changed.
    pub fn key(&self) -> &[u8] {
        match self {
            WatchEvent::Put { key, .. } | WatchEvent::Delete { key, .. } => key,
        }
    }

    /// The revision of the change.
    pub fn mod_revision(&self) -> i64 {
        match self {
            WatchEvent::Put { mod_revision, .. } | WatchEvent::Delete { mod_revision, .. } => {
                *mod_revision
            }
        }
    }
}

/// What one line of a watch stream says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchLine {
    /// The watch was created (the stream's first line).
    Created,
    /// Changes, in revision order (may be empty: a progress notice).
    Events(Vec<WatchEvent>),
}

fn parse<T: DeserializeOwned>(what: &str, body: &[u8]) -> Result<T, EtcdError> {
    if body.len() > MAX_RESPONSE_BYTES {
        return Err(EtcdError::Malformed(format!(
            "{what}: {} bytes, over the {MAX_RESPONSE_BYTES}-byte limit",
            body.len()
        )));
    }
    serde_json::from_slice(body).map_err(|e| EtcdError::Malformed(format!("{what}: {e}")))
}

fn revision(what: &str, r: I64) -> Result<i64, EtcdError> {
    if r.0 < 0 {
        return Err(EtcdError::Malformed(format!("{what}: negative revision")));
    }
    Ok(r.0)
}

fn lease(id: I64) -> Option<LeaseId> {
    (id.0 != 0).then_some(LeaseId(id.0))
}

/// Decodes `GET /health`: is this member healthy?
pub fn decode_health(body: &[u8]) -> Result<bool, EtcdError> {
    let h: HealthBody = parse("health", body)?;
    Ok(h.health == "true")
}

/// Decodes `/v3/lease/grant`: the lease and its granted TTL in seconds.
pub fn decode_grant(body: &[u8]) -> Result<(LeaseId, i64), EtcdError> {
    let g: GrantBody = parse("lease grant", body)?;
    if !g.error.is_empty() {
        return Err(EtcdError::Server {
            status: 200,
            code: 0,
            message: printable(g.error),
        });
    }
    match lease(g.id) {
        Some(id) if g.ttl.0 > 0 => Ok((id, g.ttl.0)),
        _ => Err(EtcdError::Malformed(format!(
            "lease grant: id {} with TTL {}",
            g.id.0, g.ttl.0
        ))),
    }
}

/// Decodes `/v3/lease/keepalive` (one streamed line per request object;
/// tent sends one): the TTL left in seconds, or [`EtcdError::LeaseGone`]
/// when etcd omits it (a lease expired or revoked is answered 200 without
/// a TTL).
pub fn decode_keep_alive(lease: LeaseId, body: &[u8]) -> Result<i64, EtcdError> {
    let line = body
        .split(|&b| b == b'\n')
        .find(|l| !l.trim_ascii().is_empty())
        .unwrap_or(b"");
    let s: Streamed<KeepAliveResult> = parse("lease keepalive", line)?;
    if let Some(e) = s.error {
        return Err(server_error(200, e));
    }
    let Some(r) = s.result else {
        return Err(EtcdError::Malformed("lease keepalive: no result".into()));
    };
    if r.ttl.0 <= 0 {
        return Err(EtcdError::LeaseGone(lease));
    }
    Ok(r.ttl.0)
}

/// Decodes `/v3/kv/put`: the revision the put created.
pub fn decode_put(body: &[u8]) -> Result<i64, EtcdError> {
    let b: HeaderBody = parse("put", body)?;
    revision("put", b.header.revision)
}

/// Decodes `/v3/kv/deleterange`: how many keys went.
pub fn decode_delete(body: &[u8]) -> Result<u64, EtcdError> {
    let b: DeleteBody = parse("delete", body)?;
    revision("delete", b.header.revision)?;
    u64::try_from(b.deleted.0).map_err(|_| EtcdError::Malformed("delete: negative count".into()))
}

/// Decodes `/v3/kv/range`; every key must satisfy `in_range` (the range
/// asked for: a server answering with other keys is refused).
pub fn decode_range(body: &[u8], in_range: impl Fn(&[u8]) -> bool) -> Result<Range, EtcdError> {
    let b: RangeBody = parse("range", body)?;
    if b.more || b.kvs.0.len() > MAX_KVS {
        return Err(EtcdError::Malformed(format!(
            "range: more than {MAX_KVS} keys"
        )));
    }
    let rev = revision("range", b.header.revision)?;
    let mut kvs = Vec::with_capacity(b.kvs.0.len());
    for kv in b.kvs.0 {
        if !in_range(&kv.key.0) {
            return Err(EtcdError::Malformed(
                "range: a key outside the range asked for".into(),
            ));
        }
        let mod_revision = revision("range", kv.mod_revision)?;
        if mod_revision > rev {
            return Err(EtcdError::Malformed(
                "range: a key modified after the range's revision".into(),
            ));
        }
        kvs.push(Kv {
            key: kv.key.0,
            value: kv.value.0,
            mod_revision,
        });
    }
    Ok(Range { kvs, revision: rev })
}

/// Decodes `/v3/auth/authenticate`: the token, checked to be a plain
/// header value.
pub fn decode_auth(body: &[u8]) -> Result<String, EtcdError> {
    let a: AuthBody = parse("authenticate", body)?;
    let ok = !a.token.is_empty()
        && a.token.len() <= MAX_TOKEN_BYTES
        && a.token.bytes().all(|b| b.is_ascii_graphic());
    if !ok {
        return Err(EtcdError::Malformed("authenticate: unusable token".into()));
    }
    Ok(a.token)
}

fn server_error(status: u16, e: ErrorBody) -> EtcdError {
    let code = if e.code.0 != 0 {
        e.code.0
    } else {
        e.grpc_code.0
    };
    let message = if e.message.is_empty() {
        e.error
    } else {
        e.message
    };
    EtcdError::Server {
        status,
        code,
        message: printable(message),
    }
}

/// A server's words as shown to people: at most 512 bytes, no control
/// characters (no forged log lines).
fn printable(mut s: String) -> String {
    s.retain(|c| !c.is_control());
    if s.len() > 512 {
        let mut i = 512;
        while !s.is_char_boundary(i) {
            i -= 1;
        }
        s.truncate(i);
    }
    s
}

/// Decodes an answer with a status other than 200: etcd's error body, or
/// (from something else on the port) whatever it is.
pub fn decode_error(status: u16, body: &[u8]) -> EtcdError {
    match parse::<ErrorBody>("error", body) {
        Ok(e) => server_error(status, e),
        Err(_) => EtcdError::Server {
            status,
            code: 0,
            message: "not an etcd error body".into(),
        },
    }
}

/// Decodes one line of a `/v3/watch` stream: every key must satisfy
/// `in_range`. A canceled watch (compaction, auth) is
/// [`EtcdError::WatchCanceled`].
pub fn decode_watch_line(
    line: &[u8],
    in_range: impl Fn(&[u8]) -> bool,
) -> Result<WatchLine, EtcdError> {
    let s: Streamed<WatchBody> = parse("watch", line)?;
    if let Some(e) = s.error {
        return Err(server_error(200, e));
    }
    let Some(w) = s.result else {
        return Err(EtcdError::Malformed("watch: no result".into()));
    };
    let header_rev = revision("watch", w.header.revision)?;
    if w.canceled {
        return Err(EtcdError::WatchCanceled {
            compact_revision: revision("watch", w.compact_revision)?,
            reason: printable(w.cancel_reason),
        });
    }
    if w.created {
        if !w.events.0.is_empty() {
            return Err(EtcdError::Malformed("watch: events on creation".into()));
        }
        return Ok(WatchLine::Created);
    }
    let mut events = Vec::with_capacity(w.events.0.len());
    let mut last = 0;
    for e in w.events.0 {
        if !in_range(&e.kv.key.0) {
            return Err(EtcdError::Malformed(
                "watch: a key outside the prefix watched".into(),
            ));
        }
        let mod_revision = revision("watch", e.kv.mod_revision)?;
        if mod_revision == 0
            || mod_revision < last
            || (header_rev != 0 && mod_revision > header_rev)
        {
            return Err(EtcdError::Malformed(
                "watch: event revisions out of order".into(),
            ));
        }
        last = mod_revision;
        events.push(match e.kind {
            EventType::Put => WatchEvent::Put {
                key: e.kv.key.0,
                value: e.kv.value.0,
                mod_revision,
                lease: lease(e.kv.lease),
            },
            EventType::Delete => WatchEvent::Delete {
                key: e.kv.key.0,
                mod_revision,
                prev_lease: e.prev_kv.and_then(|p| lease(p.lease)),
            },
        });
    }
    Ok(WatchLine::Events(events))
}

/// Reads newline-terminated lines from a stream into a buffer that
/// survives errors: a read that times out mid-line keeps the part read,
/// and the next call goes on from there (`BufRead::lines` would drop it).
/// A line longer than the cap is an error (the stream is then unusable).
#[derive(Debug)]
pub struct LineReader<R> {
    inner: R,
    line: Vec<u8>,
    cap: usize,
}

impl<R: BufRead> LineReader<R> {
    /// Lines of `inner`, each at most `cap` bytes.
    pub fn new(inner: R, cap: usize) -> LineReader<R> {
        LineReader {
            inner,
            line: Vec::new(),
            cap,
        }
    }

    /// The next line without its `\n`; `Ok(None)` at the end of the
    /// stream after a complete line. An error from the stream comes back
    /// as is, the partial line kept for the next call; so does a
    /// `TimedOut` once `deadline` has passed between two reads (a server
    /// trickling a long line cannot hold the caller past it).
    pub fn next_line(&mut self, deadline: Option<Instant>) -> io::Result<Option<Vec<u8>>> {
        loop {
            let avail = match self.inner.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if avail.is_empty() {
                if self.line.is_empty() {
                    return Ok(None);
                }
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "stream ended inside a line",
                ));
            }
            let (take, done) = match avail.iter().position(|&b| b == b'\n') {
                Some(i) => (i, true),
                None => (avail.len(), false),
            };
            if self.line.len() + take > self.cap {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("a line longer than {} bytes", self.cap),
                ));
            }
            self.line.extend_from_slice(&avail[..take]);
            self.inner.consume(take + usize::from(done));
            if done {
                return Ok(Some(std::mem::take(&mut self.line)));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(io::ErrorKind::TimedOut.into());
            }
        }
    }
}

/// Events decoded but not yet handed out, and the checks across lines: a
/// watch's events come in revision order, after `start_revision`.
#[derive(Debug)]
pub struct WatchState {
    pending: VecDeque<WatchEvent>,
    last: i64,
    created: bool,
}

impl WatchState {
    /// A watch asked to start at `start_revision`.
    pub fn new(start_revision: i64) -> WatchState {
        WatchState {
            pending: VecDeque::new(),
            last: start_revision.saturating_sub(1),
            created: false,
        }
    }

    /// Takes one line: the first must say the watch was created, then
    /// events must not go back in revision nor repeat one already given.
    pub fn push_line(
        &mut self,
        line: &[u8],
        in_range: impl Fn(&[u8]) -> bool,
    ) -> Result<(), EtcdError> {
        if line.trim_ascii().is_empty() {
            return Ok(());
        }
        match decode_watch_line(line, in_range)? {
            WatchLine::Created if !self.created => self.created = true,
            WatchLine::Created => {
                return Err(EtcdError::Malformed("watch: created twice".into()));
            }
            WatchLine::Events(_) if !self.created => {
                return Err(EtcdError::Malformed("watch: events before creation".into()));
            }
            WatchLine::Events(events) => {
                // Several events of one transaction share a revision.
                if let Some(first) = events.first() {
                    if first.mod_revision() <= self.last {
                        return Err(EtcdError::Malformed(
                            "watch: an event at or before one already seen".into(),
                        ));
                    }
                }
                if let Some(last) = events.last() {
                    self.last = last.mod_revision();
                }
                self.pending.extend(events);
            }
        }
        Ok(())
    }

    /// Has the creation line come?
    pub fn created(&self) -> bool {
        self.created
    }

    /// The next event decoded, if any.
    pub fn pop(&mut self) -> Option<WatchEvent> {
        self.pending.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(_: &[u8]) -> bool {
        true
    }

    /// An array past [`MAX_KVS`] is refused while it is read (before, all
    /// of it was decoded first: ~100 MB from a 4 MiB body of `{}`s).
    #[test]
    fn arrays_past_the_bound_are_refused_as_they_are_read() {
        let many = |n: usize| vec!["{}"; n].join(",");
        let ok = format!(r#"{{"header":{{"revision":"3"}},"kvs":[{}]}}"#, many(MAX_KVS));
        assert_eq!(decode_range(ok.as_bytes(), any).unwrap().kvs.len(), MAX_KVS);
        let over = format!(r#"{{"header":{{"revision":"3"}},"kvs":[{}]}}"#, many(MAX_KVS + 1));
        let e = decode_range(over.as_bytes(), any).unwrap_err();
        assert!(matches!(e, EtcdError::Malformed(_)), "{e}");
        assert!(e.to_string().contains("more than"), "{e}");
    }

    #[test]
    fn zero_fields_are_omitted_and_int64s_are_strings() {
        // An empty range: no kvs, no count.
        let r = decode_range(br#"{"header":{"revision":"7"}}"#, any).unwrap();
        assert_eq!((r.kvs.len(), r.revision), (0, 7));
        // No header at all: revision 0.
        assert_eq!(decode_put(b"{}").unwrap(), 0);
        // Integers are accepted as numbers too.
        assert_eq!(decode_put(br#"{"header":{"revision":9}}"#).unwrap(), 9);
        let r = decode_range(
            br#"{"header":{"revision":"3"},"kvs":[{"key":"L3QvYQ==","value":"djE=","mod_revision":"2","lease":"5"}],"count":"1"}"#,
            |k| k.starts_with(b"/t/"),
        )
        .unwrap();
        assert_eq!(
            r.kvs,
            vec![Kv {
                key: b"/t/a".to_vec(),
                value: b"v1".to_vec(),
                mod_revision: 2
            }]
        );
        // A key without a value: the empty value.
        let r = decode_range(
            br#"{"header":{"revision":"3"},"kvs":[{"key":"L3QvYQ==","mod_revision":"2"}]}"#,
            any,
        )
        .unwrap();
        assert!(r.kvs[0].value.is_empty());
    }

    #[test]
    fn malformed_responses_are_refused_typed() {
        let bad: &[&[u8]] = &[
            b"",
            b"not json",
            br#"{"header":{"revision":"x"}}"#,
            br#"{"header":{"revision":"-1"}}"#,
            br#"{"header":{"revision":"99999999999999999999"}}"#,
            br#"{"header":{"revision":1.5}}"#,
            br#"{"header":{"revision":"3"},"kvs":[{"key":"!!!"}]}"#,
            br#"{"header":{"revision":"3"},"kvs":[{"key":"YQ==","mod_revision":"4"}]}"#,
            br#"{"header":{"revision":"3"},"more":true}"#,
            br#"{"header":{"revision":"3"},"kvs":{"key":"YQ=="}}"#,
        ];
        for b in bad {
            let e = decode_range(b, any).unwrap_err();
            assert!(
                matches!(e, EtcdError::Malformed(_)),
                "{:?} gave {e:?}",
                String::from_utf8_lossy(b)
            );
            assert_eq!(
                e.into_error().kind(),
                crate::ErrorKind::InvalidArgument
            );
        }
        // A key outside the range asked for.
        let e = decode_range(
            br#"{"header":{"revision":"3"},"kvs":[{"key":"L3gvYQ==","mod_revision":"2"}]}"#,
            |k| k.starts_with(b"/t/"),
        )
        .unwrap_err();
        assert!(matches!(e, EtcdError::Malformed(_)));
        // Too large before parsing.
        let big = vec![b' '; MAX_RESPONSE_BYTES + 1];
        assert!(matches!(decode_put(&big), Err(EtcdError::Malformed(_))));
        // Deeply nested: serde_json's recursion limit, no stack overflow.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(decode_put(deep.as_bytes()).is_err());
    }

    #[test]
    fn grants_keepalives_and_errors() {
        let (id, ttl) =
            decode_grant(br#"{"header":{},"ID":"5445030246065152263","TTL":"2"}"#).unwrap();
        assert_eq!((id, ttl), (LeaseId(5445030246065152263), 2));
        assert!(decode_grant(br#"{"ID":"5"}"#).is_err());
        assert!(decode_grant(br#"{"TTL":"5"}"#).is_err());
        let l = LeaseId(5);
        assert_eq!(
            decode_keep_alive(l, b"{\"result\":{\"ID\":\"5\",\"TTL\":\"60\"}}\n").unwrap(),
            60
        );
        // A dead lease: 200 without a TTL.
        let e = decode_keep_alive(l, br#"{"result":{"ID":"5","header":{}}}"#).unwrap_err();
        assert!(matches!(e, EtcdError::LeaseGone(LeaseId(5))));
        let e = decode_error(
            404,
            br#"{"error":"etcdserver: requested lease not found","code":5}"#,
        );
        assert!(
            matches!(&e, EtcdError::Server { status: 404, code: 5, message } if message.contains("lease not found"))
        );
        let e = decode_error(502, b"<html>\x07bad gateway</html>");
        assert!(matches!(e, EtcdError::Server { status: 502, .. }));
        assert_eq!(
            decode_auth(br#"{"token":"RqwmFjSXNkAhrqiW.59"}"#).unwrap(),
            "RqwmFjSXNkAhrqiW.59"
        );
        assert!(decode_auth(br#"{"token":"a\r\nX-Evil: 1"}"#).is_err());
        assert!(decode_auth(b"{}").is_err());
        assert!(decode_health(br#"{"health":"true"}"#).unwrap());
        assert!(!decode_health(br#"{"health":"false"}"#).unwrap());
    }

    #[test]
    fn watch_lines_decode_puts_deletes_and_cancellation() {
        let mut w = WatchState::new(5);
        w.push_line(
            br#"{"result":{"header":{"revision":"4"},"created":true}}"#,
            any,
        )
        .unwrap();
        assert!(w.created());
        w.push_line(
            br#"{"result":{"header":{"revision":"5"},"events":[{"kv":{"key":"L3QvYw==","mod_revision":"5","value":"djE=","lease":"7"}}]}}"#,
            any,
        )
        .unwrap();
        w.push_line(
            br#"{"result":{"header":{"revision":"7"},"events":[{"type":"DELETE","kv":{"key":"L3QvYw==","mod_revision":"7"},"prev_kv":{"key":"L3QvYw==","lease":"7"}}]}}"#,
            any,
        )
        .unwrap();
        assert_eq!(
            w.pop(),
            Some(WatchEvent::Put {
                key: b"/t/c".to_vec(),
                value: b"v1".to_vec(),
                mod_revision: 5,
                lease: Some(LeaseId(7))
            })
        );
        assert_eq!(
            w.pop(),
            Some(WatchEvent::Delete {
                key: b"/t/c".to_vec(),
                mod_revision: 7,
                prev_lease: Some(LeaseId(7))
            })
        );
        assert_eq!(w.pop(), None);
        // Going back in revision is refused.
        let e = w
            .push_line(
                br#"{"result":{"header":{"revision":"7"},"events":[{"kv":{"key":"YQ==","mod_revision":"6"}}]}}"#,
                any,
            )
            .unwrap_err();
        assert!(matches!(e, EtcdError::Malformed(_)));
        // Compaction: canceled in band.
        let e = decode_watch_line(
            br#"{"result":{"header":{},"canceled":true,"compact_revision":"31"}}"#,
            any,
        )
        .unwrap_err();
        assert!(matches!(
            e,
            EtcdError::WatchCanceled {
                compact_revision: 31,
                ..
            }
        ));
        assert_eq!(e.into_error().kind(), crate::ErrorKind::Canceled);
        // Events before creation, an unknown type.
        let mut w = WatchState::new(1);
        assert!(
            w.push_line(
                br#"{"result":{"events":[{"kv":{"key":"YQ==","mod_revision":"1"}}]}}"#,
                any
            )
            .is_err()
        );
        assert!(
            decode_watch_line(
                br#"{"result":{"events":[{"type":"MOVE","kv":{"key":"YQ==","mod_revision":"1"}}]}}"#,
                any
            )
            .is_err()
        );
    }

    /// A reader that hands out its bytes a few at a time, failing with a
    /// timeout between pieces.
    struct Dribble<'a> {
        data: &'a [u8],
        step: usize,
        fail_next: bool,
    }

    impl io::Read for Dribble<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if std::mem::replace(&mut self.fail_next, false) {
                return Err(io::ErrorKind::TimedOut.into());
            }
            self.fail_next = true;
            let n = self.step.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn line_reader_keeps_partial_lines_across_timeouts_and_caps_length() {
        let data = b"first line\nsecond\n\nthird";
        let mut r = LineReader::new(
            io::BufReader::with_capacity(
                4,
                Dribble {
                    data,
                    step: 3,
                    fail_next: false,
                },
            ),
            64,
        );
        let mut lines = Vec::new();
        let mut timeouts = 0;
        let end = loop {
            match r.next_line(None) {
                Ok(Some(l)) => lines.push(l),
                Ok(None) => break None,
                Err(e) if e.kind() == io::ErrorKind::TimedOut => timeouts += 1,
                Err(e) => break Some(e.kind()),
            }
        };
        assert!(timeouts > 3);
        assert_eq!(
            lines,
            vec![b"first line".to_vec(), b"second".to_vec(), b"".to_vec()]
        );
        // "third" has no newline: the stream ended inside a line.
        assert_eq!(end, Some(io::ErrorKind::UnexpectedEof));

        // A deadline passed: the partial line is kept, the next call goes on.
        let mut r = LineReader::new(io::BufReader::with_capacity(2, &b"abcdef\n"[..]), 64);
        let past = Some(Instant::now());
        assert_eq!(r.next_line(past).unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert_eq!(r.next_line(None).unwrap(), Some(b"abcdef".to_vec()));

        let mut r = LineReader::new(&b"0123456789\n"[..], 5);
        assert_eq!(
            r.next_line(None).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }
}
