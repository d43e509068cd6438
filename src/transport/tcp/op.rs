//! One slice as a connection carries it ([`Op`]), and what a connection
//! is made from: its rail's [`Endpoint`] and its [`Options`].

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use tent_rings::{ErrorKind, Opcode};

use super::frame::SESSION_LEN;
use crate::transport::rails::{MAX_MEM_NODES, MAX_RAILS};

/// A connection idle this long is replaced before its next slice: shorter
/// than a target waits before it may evict an idle connection (30 s).
pub(crate) const RECONNECT_IDLE: Duration = Duration::from_secs(15);

/// `Op::opcode`'s flag of a HIGH slice.
pub(crate) const URGENT: u8 = 0x80;

/// The submit ring of HIGH slices (sent first).
pub(crate) const EXPRESS: usize = 0;
/// The submit ring of MEDIUM and LOW slices.
pub(crate) const BULK: usize = 1;

/// How a connection connects.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// `TCP_USER_TIMEOUT` (0: the kernel's).
    pub user_timeout_ms: u32,
    /// Connect plus handshake.
    pub connect_timeout: Duration,
    /// How long after it was posted a slice may still wait for a busy
    /// target to take the connection.
    pub patience: Duration,
    /// The shared secret, proven to the target when set.
    pub secret: Option<Arc<[u8]>>,
    /// The session its hello names: one per attached peer (every worker's
    /// and rail's connections to that target share it, so a fence reaches
    /// them all), never shown to another target, so a peer that saw one of
    /// our sessions cannot use it to fence our connections elsewhere.
    pub session: [u8; SESSION_LEN],
}

/// A fresh session for the connections to one peer.
pub(crate) fn new_session() -> [u8; SESSION_LEN] {
    let mut s = [0u8; SESSION_LEN];
    s.copy_from_slice(&crate::control::auth::nonce()[..SESSION_LEN]);
    s
}

/// One slice as it travels through a connection's rings.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Op {
    /// The engine's slice token.
    pub token: u64,
    /// Local memory address (checked by the engine before submission).
    pub local: u64,
    /// Target address.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// The target region's key.
    pub key: u64,
    /// When the worker posted it (monotonic ns): the rail's bandwidth
    /// estimate is fed from it.
    pub posted_ns: u64,
    /// Position on its connection (checked against the response).
    pub seq: u32,
    /// 0 = done, [`BYSTANDER`], else the `ErrorKind` code.
    pub status: u16,
    /// 1 = WRITE, 2 = READ; [`URGENT`] set for a HIGH slice.
    pub opcode: u8,
    /// Times it was re-posted on a sibling rail.
    pub attempts: u8,
    /// Rail index within its peer (below `MAX_RAILS`).
    pub rail: u8,
    /// The NUMA node of its local memory, [`NO_NODE`] when unknown (or
    /// past `MAX_MEM_NODES`): a move to a sibling rail ranks rails from it.
    mem_node: u8,
    /// Slices ahead of it on its rail when posted (bandwidth estimate).
    pub ahead: u16,
}

const _: () = assert!(std::mem::size_of::<Op>() <= 64);
const _: () = assert!(MAX_RAILS <= u8::MAX as usize && MAX_MEM_NODES < NO_NODE as usize);

/// [`Op`]'s memory node when it is unknown.
const NO_NODE: u8 = u8::MAX;

/// [`Op::status`] of a slice caught on a connection that was reset to stop
/// another task's slice: it did not fail (re-post it, as if the connection
/// had not been there). Not an `ErrorKind` code.
pub(crate) const BYSTANDER: u16 = u16::MAX;
const _: () = assert!(ErrorKind::from_code(BYSTANDER).is_none());

// The local address is held as an integer and dereferenced only under
// the transport's contract.

impl Op {
    /// A fresh op for a slice.
    pub(crate) fn new(token: u64, opcode: Opcode, local: *mut u8, addr: u64, len: u64, key: u64) -> Op {
        Op {
            token,
            local: local as u64,
            addr,
            len,
            key,
            opcode: match opcode {
                Opcode::Write => 1,
                Opcode::Read => 2,
            },
            mem_node: NO_NODE,
            ..Op::default()
        }
    }

    /// Its local memory is on NUMA node `node` (`None`: unknown).
    pub(crate) fn set_mem_node(&mut self, node: Option<u32>) {
        self.mem_node = node
            .filter(|&n| (n as usize) < MAX_MEM_NODES)
            .map_or(NO_NODE, |n| n as u8);
    }

    /// The NUMA node of its local memory (`None`: unknown).
    #[inline]
    pub(crate) fn mem_node(&self) -> Option<u32> {
        (self.mem_node != NO_NODE).then_some(u32::from(self.mem_node))
    }

    pub(super) fn opcode(&self) -> Opcode {
        if self.opcode & !URGENT == 2 {
            Opcode::Read
        } else {
            Opcode::Write
        }
    }

    /// Is it a HIGH slice (express ring, urgent rail pick, also when
    /// re-posted)?
    pub(crate) fn is_urgent(&self) -> bool {
        self.opcode & URGENT != 0
    }

    /// Mark it HIGH.
    pub(crate) fn set_urgent(&mut self) {
        self.opcode |= URGENT;
    }

    /// The slice's outcome.
    pub(crate) fn result(&self) -> std::result::Result<u64, ErrorKind> {
        match self.status {
            0 => Ok(self.len),
            c => Err(ErrorKind::from_code(c).unwrap_or(ErrorKind::Unreachable)),
        }
    }
}

/// A fresh connection id (never 0; unique in this process until 2^32
/// connections have opened, so unique in every session).
pub(super) fn next_conn_id() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    loop {
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        if id != 0 {
            return id;
        }
    }
}

/// A rail as a connection sees it: where to connect from and to, and
/// whether its local link is up.
#[derive(Debug)]
pub(crate) struct Endpoint {
    /// Local address to bind (pins the connection to the rail's interface).
    pub local_ip: IpAddr,
    /// The target's data server on the rail's remote interface.
    pub remote: SocketAddr,
    /// Link state, written by the link watch.
    pub up: AtomicBool,
}

