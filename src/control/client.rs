//! The client side of the control plane: fetch a peer's descriptor.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use tent_rings::ErrorKind;

use super::auth::{self, Door};
use super::wire::{
    self, Message, NotifyFrame, QpBootstrap, QpRequest, RegionEntry, SegmentDescriptor, WireError,
};
use crate::deadline::ByDeadline;
use crate::error::{Error, Result};

/// Does `name` look like a p2p segment name (`ip:port`)?
pub fn is_p2p_name(name: &str) -> bool {
    name.parse::<SocketAddr>().is_ok()
}

fn wire_err(peer: &str, e: WireError) -> Error {
    let kind = match &e {
        WireError::Io(io)
            if io.kind() == std::io::ErrorKind::WouldBlock
                || io.kind() == std::io::ErrorKind::TimedOut =>
        {
            ErrorKind::Timeout
        }
        WireError::Io(_) | WireError::Truncated { .. } => ErrorKind::Unreachable,
        _ => ErrorKind::InvalidArgument,
    };
    Error::new(kind, format!("control exchange with {peer}")).with_source(e)
}

/// A fresh random non-zero id: a notification lane's stream id (an
/// engine's own identity is its incarnation, `crate::incarnation`, which
/// RDMA peers file its QPs under).
pub fn new_engine_id() -> u64 {
    auth::random_nonzero_u64().get()
}

/// Connect to `peer` (`ip:port`), authenticate (both ways) when `secret` is
/// set, and fetch its segment descriptor, all within `timeout`: one
/// deadline for the whole exchange, so a server dripping a byte per read
/// cannot stretch it (the registry lock is held around this call).
pub fn fetch_descriptor(
    peer: &str,
    secret: Option<&[u8]>,
    timeout: Duration,
) -> Result<SegmentDescriptor> {
    fetch(peer, secret, timeout, true)
}

/// [`fetch_descriptor`] without the region pages past the first (its
/// `regions_from` still says where they start): what a liveness probe
/// needs, in one round trip however many regions the peer has.
pub fn fetch_descriptor_head(
    peer: &str,
    secret: Option<&[u8]>,
    timeout: Duration,
) -> Result<SegmentDescriptor> {
    fetch(peer, secret, timeout, false)
}

fn fetch(
    peer: &str,
    secret: Option<&[u8]>,
    timeout: Duration,
    all_pages: bool,
) -> Result<SegmentDescriptor> {
    let deadline = crate::deadline::after(timeout);
    let s = session(peer, secret, deadline, |_| {})?;
    let mut s = ByDeadline::new(&s, deadline);
    wire::write_message(&mut s, &Message::GetDescriptor).map_err(|e| wire_err(peer, e))?;
    let mut d = match read(&mut s, peer)? {
        Message::Descriptor(d) => d,
        other => return Err(unexpected(peer, "Descriptor", other)),
    };
    // The rest of a long region list, page by page on this connection,
    // under the same deadline. Pages may come from different versions of
    // the owner's table: a region missed is one registered after the open
    // (so is any later one), one listed but gone is refused by the owner.
    if !all_pages {
        return Ok(d);
    }
    let mut from = d.regions_from.take();
    let mut bytes: usize = d.regions.iter().map(RegionEntry::wire_len_bound).sum();
    while let Some(at) = from {
        wire::write_message(&mut s, &Message::GetRegions { from: at })
            .map_err(|e| wire_err(peer, e))?;
        let page = match read(&mut s, peer)? {
            Message::Regions(p) => p,
            other => return Err(unexpected(peer, "Regions", other)),
        };
        // Each page starts where it was asked, and one with more to come
        // lists some and moves on: a peer cannot keep us paging in place.
        if page.regions.iter().any(|r| r.addr < at) || page.from.is_some_and(|f| f <= at) {
            return Err(violation(peer, format!("a region page from {at:#x} goes back")));
        }
        if page.from.is_some() && page.regions.is_empty() {
            return Err(violation(peer, format!("an empty region page from {at:#x} says more follow")));
        }
        bytes = page
            .regions
            .iter()
            .map(RegionEntry::wire_len_bound)
            .fold(bytes, usize::saturating_add);
        if d.regions.len().saturating_add(page.regions.len()) > MAX_SEGMENT_REGIONS
            || bytes > MAX_SEGMENT_REGION_BYTES
        {
            return Err(violation(
                peer,
                format!(
                    "more than {MAX_SEGMENT_REGIONS} regions or {MAX_SEGMENT_REGION_BYTES} bytes of them listed"
                ),
            ));
        }
        d.regions.extend(page.regions);
        from = page.from;
    }
    Ok(d)
}

/// The most regions a segment descriptor may list in all its pages: past
/// it the owner is refused (a peer's list costs this process memory).
pub const MAX_SEGMENT_REGIONS: usize = 1 << 20;

/// The most bytes those regions may take on the wire in all: 2^20 plain
/// regions take about 84 MiB, and a hostile owner's regions carrying the
/// most chunk rkeys (8 KiB each) would reach 8 GiB without this bound.
pub const MAX_SEGMENT_REGION_BYTES: usize = 128 << 20;

/// A peer broke the control protocol: logged once per peer, and refused.
fn violation(peer: &str, what: String) -> Error {
    crate::lograte::warn_limited!(
        (peer.to_owned(), "descriptor-pages"),
        peer,
        what = %what,
        "protocol violation by the peer: descriptor refused"
    );
    Error::new(
        ErrorKind::InvalidArgument,
        format!("protocol violation by {peer}: {what}"),
    )
}

/// Ask `peer` to connect an RC QP for `req` (from our `initiator_nic`,
/// whose end is `req.qp`, to its `target_nic`; filed there under
/// `req.initiator`, replacing the QP that key held); its end comes back,
/// already connected. All within `timeout` (one deadline for the whole
/// exchange: a peer's connects wait on one RDMA connector thread in turn).
pub fn connect_qp(
    peer: &str,
    secret: Option<&[u8]>,
    timeout: Duration,
    req: QpRequest,
) -> Result<QpBootstrap> {
    let deadline = crate::deadline::after(timeout);
    let s = session(peer, secret, deadline, |_| {})?;
    let mut s = ByDeadline::new(&s, deadline);
    wire::write_message(&mut s, &Message::QpConnect(req)).map_err(|e| wire_err(peer, e))?;
    match read(&mut s, peer)? {
        Message::QpAccept { qp } => Ok(qp),
        other => Err(unexpected(peer, "QpAccept", other)),
    }
}

/// An authenticated control connection to `peer` for notifications, made
/// within `timeout`; the sender keeps it open between them (`notify` on
/// it, one at a time).
pub fn notify_session(peer: &str, secret: Option<&[u8]>, timeout: Duration) -> Result<TcpStream> {
    session(peer, secret, crate::deadline::after(timeout), |_| {})
}

/// One try at [`notify_session`], with `connected` seeing the connection
/// before its handshake, so a sender stopping can cut a handshake in
/// progress. A busy server is `SqFull` here: the caller pauses on its own
/// schedule rather than in this call.
pub(crate) fn notify_session_with(
    peer: &str,
    secret: Option<&[u8]>,
    timeout: Duration,
    mut connected: impl FnMut(&TcpStream),
) -> Result<TcpStream> {
    session_once(
        peer,
        secret,
        crate::deadline::after(timeout),
        &mut connected,
    )
}

/// Why a notification was not acknowledged.
#[derive(Debug)]
pub enum NotifyError {
    /// The peer answered with a refusal (its kind: `SqFull` for a full
    /// inbox, `Shutdown` for an engine going away, ...): the connection
    /// is fine, the message was not taken.
    Refused(Error),
    /// The exchange broke (I/O, a frame that does not decode, the
    /// deadline): whether the peer filed it is unknown.
    Broken(Error),
}

/// Send one notification on `s` and wait for the peer to acknowledge it,
/// all before `deadline` (one deadline for the whole exchange, so a peer
/// dripping a byte at a time cannot stretch it): `Ok` once it is in the
/// peer's inbox.
pub fn notify(
    s: &TcpStream,
    peer: &str,
    frame: &NotifyFrame,
    deadline: std::time::Instant,
) -> std::result::Result<(), NotifyError> {
    let mut io = crate::deadline::ByDeadline::new(s, deadline);
    let broken = |e| NotifyError::Broken(wire_err(peer, e));
    wire::write_message(&mut io, &Message::Notify(frame.clone())).map_err(broken)?;
    match wire::read_message(&mut io).map_err(broken)? {
        Message::NotifyAck { seq } if seq == frame.seq => Ok(()),
        Message::NotifyAck { seq } => Err(NotifyError::Broken(Error::invalid(format!(
            "{peer} acknowledged notification {seq} where {} was sent",
            frame.seq
        )))),
        // `unexpected` turns the peer's refusal into its kind and words.
        refusal @ Message::Error { .. } => {
            Err(NotifyError::Refused(unexpected(peer, "NotifyAck", refusal)))
        }
        other => Err(NotifyError::Broken(unexpected(peer, "NotifyAck", other))),
    }
}

/// An open, authenticated control connection to `peer`, made before
/// `deadline` (connect and handshake, every try together); a server that
/// says it is busy (every slot held by authenticated peers) is tried
/// again, pausing longer each time, while the deadline allows.
fn session(
    peer: &str,
    secret: Option<&[u8]>,
    deadline: Instant,
    mut connected: impl FnMut(&TcpStream),
) -> Result<TcpStream> {
    let mut pause = Duration::from_millis(10);
    loop {
        match session_once(peer, secret, deadline, &mut connected) {
            Err(e) if e.kind() == ErrorKind::SqFull && Instant::now() + pause < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            r => return r,
        }
    }
}

fn session_once(
    peer: &str,
    secret: Option<&[u8]>,
    deadline: Instant,
    connected: &mut impl FnMut(&TcpStream),
) -> Result<TcpStream> {
    let timeout = deadline.saturating_duration_since(Instant::now());
    if timeout.is_zero() {
        return Err(Error::new(
            ErrorKind::Timeout,
            format!("control exchange with {peer}: out of time"),
        ));
    }
    let addr = peer
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| Error::invalid(format!("bad segment address {peer:?} (want ip:port)")))?;
    let stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| {
        let kind = if e.kind() == std::io::ErrorKind::TimedOut {
            ErrorKind::Timeout
        } else {
            ErrorKind::Unreachable
        };
        Error::new(kind, format!("no engine answering at {peer}")).with_source(e)
    })?;
    let io = |e: std::io::Error| wire_err(peer, WireError::Io(e));
    // Blocking reads and writes on the stream handed back (notifications
    // bound each exchange with their own deadline) still end.
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let _ = stream.set_nodelay(true);
    connected(&stream);
    // One deadline for the handshake: a server dripping a byte per read
    // does not reset it.
    let mut s = ByDeadline::new(&stream, deadline);

    let client_nonce = auth::nonce();
    wire::write_message(
        &mut s,
        &Message::Hello {
            nonce: client_nonce,
        },
    )
    .map_err(|e| wire_err(peer, e))?;
    let (server_nonce, auth_required) = match read(&mut s, peer)? {
        Message::Challenge {
            nonce,
            auth_required,
        } => (nonce, auth_required),
        other => return Err(unexpected(peer, "Challenge", other)),
    };
    match (auth_required, secret) {
        (true, None) => {
            return Err(Error::new(
                ErrorKind::AccessDenied,
                format!("{peer} requires authentication: set rpc_shared_secret"),
            ));
        }
        (false, Some(_)) => {
            // We hold a secret: a peer that cannot prove it holds it too is
            // not the engine we were configured to trust.
            return Err(Error::new(
                ErrorKind::AccessDenied,
                format!("{peer} does not authenticate, but rpc_shared_secret is set here"),
            ));
        }
        (true, Some(secret)) => {
            // The channel binding: the address we dialed, so a proof we
            // make reaches no server but the one there, and a proof from a
            // relay (made for its own address) fails here.
            let binding = auth::addr_binding(stream.peer_addr().map_err(io)?);
            let proof = auth::client_proof(
                Door::Control,
                secret,
                &server_nonce,
                &client_nonce,
                &binding,
            );
            wire::write_message(&mut s, &Message::Auth { mac: proof })
                .map_err(|e| wire_err(peer, e))?;
            // Nothing more is sent before the server's proof checks out.
            match read(&mut s, peer)? {
                Message::AuthOk { mac }
                    if auth::verify_server(
                        Door::Control,
                        secret,
                        &server_nonce,
                        &client_nonce,
                        &binding,
                        &mac,
                    ) => {}
                Message::AuthOk { .. } => {
                    return Err(Error::new(
                        ErrorKind::AccessDenied,
                        format!(
                            "{peer} failed to prove the shared secret for this address \
                             (engines with a secret must reach each other without address \
                             translation, port forwarding or a relay in between)"
                        ),
                    ));
                }
                other => return Err(unexpected(peer, "AuthOk", other)),
            }
        }
        (false, None) => {}
    }
    Ok(stream)
}

fn read(s: &mut ByDeadline<&TcpStream>, peer: &str) -> Result<Message> {
    wire::read_message(s).map_err(|e| {
        if let WireError::TooLarge { what, len, max } = &e {
            // An owner too old to page its regions, say: once per peer,
            // with the figures.
            crate::lograte::warn_limited!(
                (peer.to_owned(), "control-too-large"),
                peer,
                what = *what,
                len = *len,
                max = *max,
                "control message refused: larger than the limit"
            );
        }
        wire_err(peer, e)
    })
}

fn unexpected(peer: &str, expected: &str, got: Message) -> Error {
    match got {
        Message::Error { code, text } => Error::new(
            ErrorKind::from_code(code).unwrap_or(ErrorKind::InvalidArgument),
            format!("{peer} refused: {text}"),
        ),
        other => Error::invalid(format!(
            "{peer} sent {} where {expected} was expected",
            other.name()
        )),
    }
}
