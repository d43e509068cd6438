//! The fuzz targets' bodies: what each checks of the bytes a peer, a
//! client or a file hands the engine, one function per target, calling the
//! function the engine calls on those bytes. `fuzz/fuzz_targets/*.rs` run
//! them under libFuzzer (`tools/fuzz.sh`); `tests/fuzz_inputs.rs` runs them
//! over every seed and every input a campaign kept (`fuzz/regressions/`),
//! so `cargo test` holds them. Compiled with the `testing` feature only.
//!
//! Each function panics when an invariant breaks; that is the finding.

use std::io::Cursor;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::Config;
use crate::control::etcd::wire::{
    self as etcd_wire, LineReader, MAX_KVS, MAX_TOKEN_BYTES, WatchEvent, WatchState,
};
use crate::control::etcd::{EtcdError, LeaseId};
use crate::control::wire::{Message, QpInitiator, decode, encode, read_message};
use crate::transport::shm::desc::{
    self, DATA_OFFSET, DESC_BYTES, DESC_CAPACITY, DESC_WRITE_SEALS, MAX_REGION_LEN, REQUIRED_SEALS,
    admit_descriptor, admit_region, check_segment_name, parse,
};
use crate::transport::tcp::frame::{
    Fence, Fenced, FrameError, HELLO_HEADER_LEN, HELLO_LEN, Hello, Ident, Inbound, MAX_OP_LEN,
    PROOF_LEN, Proof, REQUEST_LEN, RESPONSE_LEN, Reply, Request, Response, SESSION_LEN,
};
use crate::transport::tcp::handshake::{Opening, Serve, Serving, Step};

/// A target's body: panics when the input breaks an invariant.
pub type Body = fn(&[u8]);

/// Every target by name (its folder under `fuzz/seeds/`), and its body.
pub const TARGETS: &[(&str, Body)] = &[
    ("control_decode", control_decode),
    ("data_frames", data_frames),
    ("shm_descriptor", shm_descriptor),
    ("config_text", config_text),
    ("tcp_handshake", tcp_handshake),
    ("http_request", http_request),
    ("etcd_gateway", etcd_gateway),
    ("daemon_setup", daemon_setup),
];

/// Control-plane codec under arbitrary bytes: `decode` and `read_message`
/// must never panic, must agree with each other, whatever decodes must
/// survive an encode/decode round trip unchanged (encoding is canonical),
/// and a decoded `QpConnect` names an initiator within the responder's key
/// bounds (`QpInitiator::new` takes it).
pub fn control_decode(data: &[u8]) {
    let decoded = decode(data);
    let mut cursor = Cursor::new(data);
    let read = read_message(&mut cursor);

    match (&decoded, &read) {
        (Ok((msg, used)), Ok(streamed)) => {
            assert!(*used <= data.len(), "used {used} of {} bytes", data.len());
            assert_eq!(msg, streamed, "decode and read_message differ");
            // read_message consumes exactly one frame, as decode reports.
            assert_eq!(
                cursor.position(),
                *used as u64,
                "stream consumed a different length"
            );
        }
        (Err(_), Err(_)) => {}
        _ => panic!("decode and read_message disagree: {decoded:?} vs {read:?}"),
    }

    if let Ok((Message::QpConnect(r), _)) = &decoded {
        let i = r.initiator;
        assert!(
            QpInitiator::new(i.engine(), i.worker(), i.rail()).is_ok(),
            "decoded an initiator out of bounds: {i:?}"
        );
    }

    if let Ok((msg, _)) = decoded {
        let bytes = encode(&msg);
        let (again, used) = match decode(&bytes) {
            Ok(v) => v,
            Err(e) => panic!("the encoding of a decoded {msg:?} does not decode: {e}"),
        };
        assert_eq!(
            used,
            bytes.len(),
            "re-decode took {used} of {} bytes",
            bytes.len()
        );
        assert_eq!(again, msg, "round trip changed the message");
        assert_eq!(encode(&again), bytes, "encoding is not canonical");
    }
}

fn prefix<const N: usize>(data: &[u8]) -> [u8; N] {
    let mut b = [0u8; N];
    let n = data.len().min(N);
    b[..n].copy_from_slice(&data[..n]);
    b
}

/// Data-plane frame headers under arbitrary bytes: every `decode` that
/// succeeds must round-trip through `encode`, and no decoded length may
/// exceed `MAX_OP_LEN`. Each decoder reads the input's first bytes (padded
/// with zeros when short), so one input exercises all of them: request,
/// fence and what the target reads after the handshake (`Inbound`: one or
/// the other, by magic), response, the fenced notice and what the
/// initiator reads after the handshake (`Reply`, by magic), the v3 hello (header alone and whole,
/// with the initiator's ident) and the proof frame of the authenticated
/// handshake.
pub fn data_frames(data: &[u8]) {
    if let Ok(req) = Request::decode(&prefix::<REQUEST_LEN>(data)) {
        assert!(
            req.len <= MAX_OP_LEN,
            "request len {} above MAX_OP_LEN",
            req.len
        );
        assert_eq!(
            Request::decode(&req.encode()),
            Ok(req),
            "request round trip"
        );
    }
    let head = prefix::<REQUEST_LEN>(data);
    if let Ok(fence) = Fence::decode(&head) {
        assert_eq!(
            Fence::decode(&fence.encode()),
            Ok(fence),
            "fence round trip"
        );
        assert_eq!(fence.encode(), head, "a fence has one encoding");
    }
    match Inbound::decode(&head) {
        Ok(Inbound::Request(req)) => {
            assert_eq!(Request::decode(&head), Ok(req), "inbound request = request");
        }
        Ok(Inbound::Fence(fence)) => {
            assert_eq!(Fence::decode(&head), Ok(fence), "inbound fence = fence");
        }
        Err(_) => assert!(
            Request::decode(&head).is_err() && Fence::decode(&head).is_err(),
            "inbound refuses only what both refuse"
        ),
    }
    if let Ok(resp) = Response::decode(&prefix::<RESPONSE_LEN>(data)) {
        assert!(
            resp.len <= MAX_OP_LEN,
            "response len {} above MAX_OP_LEN",
            resp.len
        );
        assert_eq!(
            Response::decode(&resp.encode()),
            Ok(resp),
            "response round trip"
        );
    }
    let head = prefix::<RESPONSE_LEN>(data);
    if let Ok(notice) = Fenced::decode(&head) {
        assert_eq!(notice.encode(), head, "a fenced notice has one encoding");
    }
    match Reply::decode(&head) {
        Ok(Reply::Response(resp)) => {
            assert_eq!(
                Response::decode(&head),
                Ok(resp),
                "reply response = response"
            );
        }
        Ok(Reply::Fenced(notice)) => {
            assert_eq!(Fenced::decode(&head), Ok(notice), "reply fenced = fenced");
        }
        Err(_) => assert!(
            Response::decode(&head).is_err() && Fenced::decode(&head).is_err(),
            "a reply is refused only when both refuse"
        ),
    }
    if let Ok(hello) = Hello::decode(&prefix::<HELLO_LEN>(data)) {
        assert_eq!(
            Hello::decode(&hello.encode()),
            Ok(hello),
            "hello round trip"
        );
        let head = prefix::<HELLO_HEADER_LEN>(data);
        assert_eq!(
            Hello::decode_header(&head),
            Ok((hello.status, hello.flags)),
            "the header alone says what the whole hello says"
        );
    } else {
        // The header is checked alone first; the rest may still be refused
        // for its reserved tail, and for nothing else.
        assert!(
            Hello::decode_header(&prefix::<HELLO_HEADER_LEN>(data)).is_err()
                || Hello::decode(&prefix::<HELLO_LEN>(data)) == Err(FrameError::Reserved),
            "a hello refused whole is refused by its header or its reserved bytes"
        );
    }
    if let Ok(proof) = Proof::decode(&prefix::<PROOF_LEN>(data)) {
        assert_eq!(
            Proof::decode(&proof.encode()),
            Ok(proof),
            "proof round trip"
        );
    }
}

/// The shm descriptor parser under arbitrary words: whatever a hostile
/// same-host owner writes, an admitted descriptor is bounded, sorted,
/// non-overlapping and non-wrapping, and a region is mapped only from a
/// sealed memfd that holds `DATA_OFFSET + len` bytes. The input's first 12
/// bytes are a handed-out file's size and seals; the rest are the words.
pub fn shm_descriptor(data: &[u8]) {
    let mut head = [0u8; 12];
    let n = data.len().min(12);
    head[..n].copy_from_slice(&data[..n]);
    let size = u64::from_le_bytes(head[..8].try_into().unwrap());
    let seals = i32::from_le_bytes(head[8..].try_into().unwrap());
    let rest = &data[n..];
    if let Ok(map_len) = admit_descriptor(size, seals) {
        assert!(seals & REQUIRED_SEALS == REQUIRED_SEALS && seals & DESC_WRITE_SEALS != 0);
        assert_eq!(map_len, DESC_BYTES);
        assert!(map_len as u64 <= size);
    }
    if let Ok(name) = std::str::from_utf8(rest) {
        if check_segment_name(name).is_ok() {
            assert!(!name.contains('/') && !name.starts_with('.'), "{name:?}");
        }
    }
    let words: Vec<u64> = rest
        .chunks(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect();
    let Ok(entries) = parse(&words) else { return };
    assert!(entries.len() <= DESC_CAPACITY);
    for e in &entries {
        assert!(e.len > 0 && e.len <= MAX_REGION_LEN);
        assert!(e.base.checked_add(e.len).is_some());
        assert!(e.key != 0 && e.handle != 0);
        assert!(
            (e.slot as usize) < DESC_CAPACITY,
            "a live-key slot past the key words"
        );
        if let Ok(map_len) = admit_region(e, size, seals) {
            assert!(seals & REQUIRED_SEALS == REQUIRED_SEALS);
            assert!(
                seals & DESC_WRITE_SEALS == 0,
                "a write-sealed region admitted"
            );
            assert_eq!(map_len as u64, e.len + DATA_OFFSET as u64);
            assert!(map_len as u64 <= size);
        }
    }
    for p in entries.windows(2) {
        assert!(p[0].base + p[0].len <= p[1].base, "overlap admitted");
    }
    assert_eq!(parse(&desc::encode(&entries)), Ok(entries), "round trip");
}

/// Configuration text under arbitrary bytes, through the function that
/// `TENT_CONF`, a config file and the bindings' JSON reach
/// (`Config::from_json_str`): whatever it accepts validates, and its JSON
/// (`Config::to_json`, every key) reads back as an equal configuration.
/// A refusal's message never holds the secret the text gave.
pub fn config_text(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::from_json_str(text, "fuzz") {
        Ok(c) => {
            c.validate().expect("an accepted configuration validates");
            let again = Config::from_json_str(&c.to_json().to_string(), "fuzz")
                .expect("its own JSON reads back");
            assert_eq!(again, c, "round trip");
        }
        Err(e) => {
            // A secret given as a string of 16 bytes or more is never
            // echoed. (An error names what it refuses, so a secret whose
            // text also stands elsewhere, in a key say, may show there.)
            let v: Option<serde_json::Value> = serde_json::from_str(text).ok();
            if let Some(s) = v
                .as_ref()
                .and_then(|v| v.get("rpc_shared_secret"))
                .and_then(|s| s.as_str())
                .filter(|s| s.len() >= 16 && text.matches(*s).count() == 1)
            {
                assert!(!e.to_string().contains(s), "secret echoed: {e}");
            }
        }
    }
}

/// The TCP data handshake's two state machines under arbitrary peers: the
/// target's (`Serving`, what every accepted connection's first bytes
/// reach) and the initiator's (`Opening`, what a target answers), with and
/// without a secret. The input is cut into the exact chunks each machine
/// asks for. Whatever arrives: no panic, a refused machine asks for
/// nothing more, a named initiator has a connection id, a secret's
/// handshake is never done without a proof that verified (a fuzzer cannot
/// forge an HMAC), and a refusal owed an answer carries a non-zero status.
pub fn tcp_handshake(data: &[u8]) {
    let Some((&mode, mut rest)) = data.split_first() else {
        return;
    };
    let secret: Option<Arc<[u8]>> = (mode & 1 != 0).then(|| Arc::from(&b"sixteen byte key"[..]));
    let local: SocketAddr = "127.0.0.1:4000".parse().unwrap();
    if mode & 2 == 0 {
        let mut m = Serving::new(secret.clone(), local);
        let mut proven = false;
        while m.want() > 0 && rest.len() >= m.want() {
            let (b, tail) = rest.split_at(m.want());
            rest = tail;
            match m.on_bytes(b) {
                Ok(Serve::Read) => {}
                Ok(Serve::Hello { ident, .. }) => assert_ne!(ident.conn, 0, "no connection id"),
                Ok(Serve::Proven(_)) => proven = true,
                Err(r) => {
                    assert_eq!(m.want(), 0, "a refused machine asks for more");
                    if let Some(reply) = r.reply {
                        assert_ne!(reply.status(), 0, "a refusal's answer says ok");
                    }
                    return;
                }
            }
        }
        assert!(!proven, "a forged proof accepted");
        if m.want() == 0 {
            assert!(secret.is_none(), "done with a secret and no proof");
        }
    } else {
        let ident = Ident {
            session: [7; SESSION_LEN],
            conn: 1,
        };
        let (mut m, _hello) = Opening::new(secret.clone(), ident);
        while m.want() > 0 && rest.len() >= m.want() {
            let (b, tail) = rest.split_at(m.want());
            rest = tail;
            match m.on_bytes(b) {
                Ok(Step::Read) => {}
                Ok(Step::Prove) => {
                    assert!(secret.is_some(), "asked to prove without a secret");
                    let _ = m.proof(local);
                }
                Ok(Step::Done) => {
                    assert!(secret.is_none(), "a target's forged proof accepted");
                    return;
                }
                Err(_) => {
                    assert_eq!(m.want(), 0, "a refused machine asks for more");
                    return;
                }
            }
        }
    }
}

/// The HTTP endpoint's request decision (`http::request::answer`, what the
/// server runs on each request head) under arbitrary bytes: the first byte
/// says whether a bearer is set (bit 0), the rest is the head. It never
/// panics; the status is one the server or the fixed routes give; the
/// response head is well formed, says whether the connection stays open
/// (only after a routed request) and carries the body's length; HEAD sends no body; and a 200 is given only to a
/// well-formed GET or HEAD of a known path, within the bounds, with the
/// bearer's token when one is set and the path is not open.
pub fn http_request(data: &[u8]) {
    use crate::http::request::{Verdict, answer};
    use crate::http::{Bearer, FixedRoutes, MAX_HEAD, MAX_HEADERS, MAX_TARGET};

    let Some((&mode, head)) = data.split_first() else {
        return;
    };
    let bearer = (mode & 1 != 0).then(|| Bearer::from_secret(FixedRoutes::SECRET));
    let out = answer(head, &FixedRoutes, bearer.as_ref());
    let status = out.response.status;
    assert!(
        [200, 400, 401, 404, 405, 413, 414, 431].contains(&status),
        "status {status}"
    );
    assert_eq!(
        out.verdict == Verdict::Routed,
        matches!(status, 200 | 404),
        "{status} with {:?}",
        out.verdict
    );

    // The response head parses, and says what is sent.
    let wire = out.head();
    let mut hs = [httparse::EMPTY_HEADER; 16];
    let mut resp = httparse::Response::new(&mut hs);
    assert_eq!(
        resp.parse(&wire),
        Ok(httparse::Status::Complete(wire.len())),
        "response head malformed"
    );
    assert_eq!(resp.code, Some(status));
    let value = |name: &str| {
        resp.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    };
    let len = out.response.body.len().to_string();
    assert_eq!(value("content-length"), Some(len.as_bytes()));
    // Kept alive only for a routed request, and the head says which.
    let connection: &[u8] = if out.keep_alive {
        b"keep-alive"
    } else {
        b"close"
    };
    assert_eq!(value("connection"), Some(connection));
    assert!(
        !out.keep_alive || out.verdict == Verdict::Routed,
        "a refusal kept the connection"
    );
    assert!(!out.head_only || out.body().is_empty(), "HEAD sent a body");

    if status != 200 {
        return;
    }
    // A 200: check the request independently of `answer`.
    let mut hs = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut hs);
    assert!(head.len() <= MAX_HEAD, "200 for a head over the bound");
    assert_eq!(
        req.parse(head),
        Ok(httparse::Status::Complete(head.len())),
        "200 for a malformed head or one with a body"
    );
    assert!(
        matches!(req.method, Some("GET" | "HEAD")),
        "200 for {:?}",
        req.method
    );
    assert_eq!(out.head_only, req.method == Some("HEAD"));
    let target = req.path.expect("a complete request has a target");
    assert!(target.len() <= MAX_TARGET, "200 for a long target");
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    assert!(FixedRoutes::KNOWN.contains(&path), "200 for {path:?}");
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            assert!(h.value.iter().all(|&b| b == b'0'), "200 with a body");
        }
        assert!(
            !h.name.eq_ignore_ascii_case("transfer-encoding"),
            "200 with a body"
        );
    }
    // Kept alive exactly for HTTP/1.1 without a `close` token.
    let close_asked = req.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("connection")
            && h.value
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
    });
    assert_eq!(out.keep_alive, req.version == Some(1) && !close_asked);
    if let Some(b) = bearer.filter(|b| !b.is_open(path)) {
        let want = b.token().as_bytes();
        let authorized = req.headers.iter().any(|h| {
            h.name.eq_ignore_ascii_case("authorization")
                && h.value.len() > 7
                && h.value[..7].eq_ignore_ascii_case(b"bearer ")
                && h.value[7..].trim_ascii() == want
        });
        assert!(authorized, "200 for {path:?} without the token");
    }
}

/// Hands out its bytes `step` at a time, failing with a timeout before
/// every piece (how a watch stream's per-read timeout interleaves).
struct Dribble<'a> {
    data: &'a [u8],
    step: usize,
    stall: bool,
}

impl std::io::Read for Dribble<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stall = !self.stall;
        if self.stall {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        let n = self.step.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// etcd's JSON gateway answers under arbitrary bytes (whoever answers on
/// the endpoint chooses them): every decoder in `control::etcd::wire`
/// takes the input whole and must not panic, and what it accepts keeps its
/// bounds: a range's keys within the prefix asked for, at most `MAX_KVS`,
/// modified at or before the range's revision; a lease granted is non-zero
/// with a positive TTL; a token is a plain header value; an error's
/// message is short and printable. Then the input is a watch stream, read
/// through `LineReader` a few bytes at a time (the first byte sets how
/// many, and the line cap) with a timeout before every piece: the lines are exactly those a
/// split on `\n` gives, whatever the timeouts, a line over the cap is
/// refused, and the events the watch hands out stay under the prefix, in
/// revision order, after the start revision. Every value (the input
/// whole, each value a range returns) is also a segment record
/// (`control::directory::etcd::decode_record`): one it accepts names a
/// reachable `ip:port`, a non-zero incarnation, and the name it is under.
pub fn etcd_gateway(data: &[u8]) {
    const PREFIX: &[u8] = b"/t/";
    let in_prefix = |k: &[u8]| k.starts_with(PREFIX);
    let record = |value: &[u8]| {
        if let Ok(r) = crate::control::directory::etcd::decode_record("seg", value) {
            assert_ne!(r.incarnation, 0, "a record without an incarnation");
            let at: std::net::SocketAddr = r.control.parse().expect("an ip:port control address");
            assert!(!at.ip().is_unspecified() && at.port() != 0, "{at}");
        }
    };
    record(data);

    let _ = etcd_wire::decode_health(data);
    if let Ok(r) = etcd_wire::decode_range(data, in_prefix) {
        assert!(r.kvs.len() <= MAX_KVS, "{} keys", r.kvs.len());
        for kv in &r.kvs {
            assert!(in_prefix(&kv.key), "a key outside the prefix");
            assert!((0..=r.revision).contains(&kv.mod_revision), "revision");
            record(&kv.value);
        }
    }
    if let Ok((LeaseId(id), ttl)) = etcd_wire::decode_grant(data) {
        assert!(id != 0 && ttl > 0, "lease {id} ttl {ttl}");
    }
    match etcd_wire::decode_keep_alive(LeaseId(1), data) {
        Ok(ttl) => assert!(ttl > 0, "ttl {ttl}"),
        Err(EtcdError::LeaseGone(l)) => assert_eq!(l, LeaseId(1)),
        Err(_) => {}
    }
    if let Ok(rev) = etcd_wire::decode_put(data) {
        assert!(rev >= 0);
    }
    let _ = etcd_wire::decode_delete(data);
    if let Ok(token) = etcd_wire::decode_auth(data) {
        assert!(!token.is_empty() && token.len() <= MAX_TOKEN_BYTES);
        assert!(
            token.bytes().all(|b| b.is_ascii_graphic()),
            "token {token:?}"
        );
    }
    if let EtcdError::Server { message, .. } = etcd_wire::decode_error(400, data) {
        assert!(message.len() <= 512, "message of {} bytes", message.len());
        assert!(!message.chars().any(char::is_control), "control in message");
    }

    // The watch stream.
    let Some((&mode, stream)) = data.split_first() else {
        return;
    };
    // Low 4 bits: bytes per read, 1 to 16; high 3: the cap, 64 B to 8 KiB.
    let step = usize::from(mode % 16) + 1;
    let cap = 64 << (mode >> 5);
    let mut reader = LineReader::new(
        std::io::BufReader::with_capacity(
            step + 1,
            Dribble {
                data: stream,
                step,
                stall: false,
            },
        ),
        cap,
    );
    // What a plain split says: complete lines, then how the stream ends.
    let mut parts: Vec<&[u8]> = stream.split(|&b| b == b'\n').collect();
    let tail = parts.pop().unwrap_or_default();
    let start = 5;
    let mut state = WatchState::new(start);
    let mut last = start - 1;
    let mut expected = parts.iter();
    let end = loop {
        match reader.next_line(None) {
            Ok(Some(line)) => {
                let want = expected.next().expect("a line the split has not");
                assert!(want.len() <= cap, "a line over the cap accepted");
                assert_eq!(&line, want, "a line differs from the split");
                if state.push_line(&line, in_prefix).is_ok() {
                    while let Some(e) = state.pop() {
                        assert!(in_prefix(e.key()), "an event outside the prefix");
                        assert!(e.mod_revision() >= last, "an event back in revision");
                        assert!(e.mod_revision() >= start, "an event before the start");
                        if let WatchEvent::Put { lease, .. } = &e {
                            assert_ne!(*lease, Some(LeaseId(0)), "lease 0 is no lease");
                        }
                        last = e.mod_revision();
                    }
                }
            }
            Ok(None) => break None,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => break Some(e.kind()),
        }
    };
    match (expected.next(), end) {
        (None, None) => assert!(tail.is_empty(), "a partial line dropped"),
        (None, Some(std::io::ErrorKind::UnexpectedEof)) => {
            assert!(
                !tail.is_empty() && tail.len() <= cap,
                "EOF error without a partial line"
            );
        }
        (Some(line), Some(std::io::ErrorKind::InvalidData)) => {
            assert!(line.len() > cap, "a line within the cap refused");
        }
        (None, Some(std::io::ErrorKind::InvalidData)) => {
            assert!(tail.len() > cap, "a partial line within the cap refused");
        }
        (line, end) => panic!("stream ended with {end:?}, split still has {line:?}"),
    }
}

/// The daemon's set-up frames under arbitrary bytes, read as a client's
/// request and as a daemon's reply: neither decode panics, a frame header
/// is bounded, and whatever decodes survives an encode/decode round trip
/// unchanged (encoding is canonical), its frame within the bound.
pub fn daemon_setup(data: &[u8]) {
    use crate::daemon::wire::{MAX_BODY, Reply, Request, body_len};
    if let Some(h) = data.first_chunk::<4>()
        && let Ok(n) = body_len(*h)
    {
        assert!(n >= 1 && n <= MAX_BODY as usize);
    }
    let frame_body = |frame: &[u8]| -> Vec<u8> {
        let n = body_len(frame[..4].try_into().expect("a header")).expect("a bounded frame");
        assert_eq!(frame.len(), 4 + n, "frame length");
        frame[4..].to_vec()
    };
    if let Ok(r) = Request::decode(data) {
        let again = frame_body(&r.encode());
        assert_eq!(Request::decode(&again), Ok(r), "request round trip");
    }
    if let Ok(r) = Reply::decode(data) {
        let again = frame_body(&r.encode());
        assert_eq!(Reply::decode(&again), Ok(r), "reply round trip");
    }
}
