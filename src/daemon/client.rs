//! The client's side: attach to a daemon over its socket, get memory and
//! rings from it, and post into those rings in place. After set-up the
//! socket is idle: a push is a store into shared memory, a submit one
//! Release store (and a futex wake only while the worker sleeps).

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tent_rings::region::{Region, RegionType};
use tent_rings::spsc::{self, Consumer, Producer};
use tent_rings::{Cqe, RegionId, SegmentId, Sqe};

use super::wire::{self, LAYOUT_VERSION, Part, Reply, Request};
use crate::doorbell::SharedWord;
use crate::engine::attached::{BELLS_LEN, CQ_BELL, SQ_BELL};
use crate::error::{Error, ErrorKind, Result};
use crate::memfd::{Mapping, recv_frame, size_and_seals};

/// How long a set-up exchange with the daemon may take.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// A process attached to a daemon (`tentd`).
#[derive(Debug)]
pub struct Client {
    stream: Mutex<UnixStream>,
    id: u32,
}

/// Memory the daemon allocated for this client: one memfd both map, so
/// what this process writes there is what the daemon's transports read
/// (zero copy). Named in SQEs by [`ClientMemory::id`].
#[derive(Debug)]
pub struct ClientMemory {
    id: RegionId,
    len: u64,
    offset: usize,
    map: Mapping,
}

/// A ring in shared memory: the daemon's workers take its SQEs and post
/// its CQEs with no system call on either side.
pub struct AttachedRing {
    /// Its id at the daemon (`Client::close_ring`).
    id: u32,
    sq: Producer<Sqe>,
    cq: Consumer<Cqe>,
    sq_bell: SharedWord,
    cq_bell: SharedWord,
}

impl std::fmt::Debug for AttachedRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachedRing")
            .field("depth", &self.sq.capacity())
            .finish_non_exhaustive()
    }
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::new(ErrorKind::Unreachable, format!("tentd: {what}")).with_source(e)
}

impl Client {
    /// Attach to the daemon listening at `socket`. The daemon checks the
    /// layout version both sides speak and refuses a mismatch naming both
    /// (`InvalidArgument`), and serves only processes of its own user
    /// (`AccessDenied`).
    pub fn attach(socket: impl AsRef<Path>) -> Result<Client> {
        let socket = socket.as_ref();
        let stream = UnixStream::connect(socket).map_err(|e| {
            Error::new(
                ErrorKind::Unreachable,
                format!("no tentd at {}", socket.display()),
            )
            .with_source(e)
        })?;
        // The daemon is this user's or root's: a socket someone else put
        // at the path gets nothing of ours.
        match crate::memfd::peer_uid(&stream) {
            Ok((uid, _)) if uid == crate::memfd::euid() || uid == 0 => {}
            Ok((uid, pid)) => {
                return Err(Error::new(
                    ErrorKind::AccessDenied,
                    format!(
                        "{} is served by uid {uid} (pid {pid}), not by this user or root",
                        socket.display()
                    ),
                ));
            }
            Err(e) => return Err(io("SO_PEERCRED")(e)),
        }
        let c = Client {
            stream: Mutex::new(stream),
            id: 0,
        };
        match c.ask(&Request::Hello {
            version: LAYOUT_VERSION,
        })? {
            (Reply::Welcome { version, client }, _) if version == LAYOUT_VERSION => {
                Ok(Client { id: client, ..c })
            }
            (Reply::Welcome { version, .. }, _) => Err(Error::invalid(format!(
                "layout version mismatch: client {LAYOUT_VERSION}, tentd {version}"
            ))),
            (other, _) => Err(unexpected(&other)),
        }
    }

    /// Its id at the daemon.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// One exchange: the request, then the reply and the descriptor it
    /// carried.
    fn ask(&self, req: &Request) -> Result<(Reply, Option<OwnedFd>)> {
        let s = self.stream.lock();
        (&*s)
            .write_all(&req.encode())
            .map_err(io("send a request"))?;
        read_reply(&s)
    }

    /// `len` bytes of memory registered at the daemon for this client.
    pub fn allocate_memory(&self, len: u64) -> Result<ClientMemory> {
        let (reply, fd) = self.ask(&Request::Allocate { len })?;
        let Reply::Allocated {
            region,
            len: got,
            data_offset,
        } = reply
        else {
            return Err(unexpected(&reply));
        };
        let fd = fd.ok_or_else(|| Error::new(ErrorKind::Unreachable, "tentd sent no memfd"))?;
        let end = data_offset
            .checked_add(got)
            .filter(|_| got == len)
            .ok_or_else(|| Error::new(ErrorKind::Unreachable, "tentd sent a bad region"))?;
        // Sealed against shrinking: the daemon cannot cut it under us.
        let (size, seals) = size_and_seals(fd.as_fd()).map_err(io("check the memfd"))?;
        let sealed = seals & libc::F_SEAL_SHRINK != 0;
        if !sealed || size < end {
            return Err(Error::new(
                ErrorKind::Unreachable,
                "tentd's memfd is not sealed or too short",
            ));
        }
        let map = Mapping::map(
            fd.as_fd(),
            usize::try_from(end).map_err(|_| Error::invalid("region too large to map"))?,
            true,
        )
        .map_err(io("map the memfd"))?;
        Ok(ClientMemory {
            id: RegionId(region),
            len,
            offset: data_offset as usize,
            map,
        })
    }

    /// Open segment `name` (a peer's `ip:port` or shm name) at the daemon
    /// for this client: its rings may then name it.
    pub fn open_segment(&self, name: &str) -> Result<SegmentId> {
        match self.ask(&Request::OpenSegment { name: name.into() })? {
            (Reply::Opened { segment }, _) => Ok(SegmentId(segment)),
            (other, _) => Err(unexpected(&other)),
        }
    }

    /// Give `mem` back: the daemon unregisters it once the ops on it have
    /// ended (as `Engine::unregister_memory` does), and it no longer
    /// counts against this client's quota.
    pub fn free_memory(&self, mem: ClientMemory) -> Result<()> {
        match self.ask(&Request::FreeMemory { region: mem.id.0 })? {
            (Reply::Done, _) => Ok(()),
            (other, _) => Err(unexpected(&other)),
        }
    }

    /// Retire `ring`: the daemon's worker drains what it took from it and
    /// drops it, and it no longer counts against this client's quota.
    pub fn close_ring(&self, ring: AttachedRing) -> Result<()> {
        let id = ring.id;
        drop(ring);
        match self.ask(&Request::CloseRing { ring: id })? {
            (Reply::Done, _) => Ok(()),
            (other, _) => Err(unexpected(&other)),
        }
    }

    /// A ring of `depth` entries (a power of two) in shared memory.
    pub fn ring(&self, depth: u32) -> Result<AttachedRing> {
        let s = self.stream.lock();
        (&*s)
            .write_all(&Request::CreateRing { depth }.encode())
            .map_err(io("send a request"))?;
        let mut parts: Vec<Arc<Region>> = Vec::with_capacity(3);
        let mut id = None;
        for want in [Part::Sq, Part::Cq, Part::Bells] {
            let (reply, fd) = read_reply(&s)?;
            match reply {
                Reply::RingPart {
                    part,
                    depth: d,
                    ring,
                } if part == want && d == depth && *id.get_or_insert(ring) == ring => {}
                other => return Err(unexpected(&other)),
            }
            let fd = fd.ok_or_else(|| Error::new(ErrorKind::Unreachable, "tentd sent no memfd"))?;
            let (_, seals) = size_and_seals(fd.as_fd()).map_err(io("check the memfd"))?;
            if seals & libc::F_SEAL_SHRINK == 0 {
                return Err(Error::new(
                    ErrorKind::Unreachable,
                    "tentd's memfd is not sealed",
                ));
            }
            let (ty, layout) = match want {
                Part::Sq => (RegionType::Ring, Some(spsc::ring_layout::<Sqe>(depth))),
                Part::Cq => (RegionType::Ring, Some(spsc::ring_layout::<Cqe>(depth))),
                Part::Bells => (RegionType::Data, None),
            };
            let region = Region::attach_file(&File::from(fd), ty, layout)
                .map_err(|e| Error::new(ErrorKind::Unreachable, format!("tentd's ring: {e}")))?;
            parts.push(Arc::new(region));
        }
        let bad =
            |e: spsc::RingError| Error::new(ErrorKind::Unreachable, "tentd's ring").with_source(e);
        let bells = parts.pop().expect("three parts");
        if bells.payload_len() < BELLS_LEN {
            return Err(Error::new(
                ErrorKind::Unreachable,
                "tentd's bells are short",
            ));
        }
        let cq = spsc::consumer_in_region::<Cqe>(parts.pop().expect("three parts")).map_err(bad)?;
        let sq = spsc::producer_in_region::<Sqe>(parts.pop().expect("three parts")).map_err(bad)?;
        let word = |at| SharedWord::new(bells.clone(), at).expect("inside the bells' page");
        Ok(AttachedRing {
            id: id.expect("three parts"),
            sq,
            cq,
            sq_bell: word(SQ_BELL),
            cq_bell: word(CQ_BELL),
        })
    }
}

/// Read one reply frame: a refusal is the error it names.
fn read_reply(s: &UnixStream) -> Result<(Reply, Option<OwnedFd>)> {
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut header = [0u8; 4];
    let got = recv_frame(s, &mut header, deadline).map_err(|e| io("read a reply")(e.err))?;
    let n = wire::body_len(header)
        .map_err(|m| Error::new(ErrorKind::Unreachable, format!("tentd: {}", m.0)))?;
    let mut body = vec![0u8; n];
    recv_frame(s, &mut body, deadline).map_err(|e| io("read a reply")(e.err))?;
    let reply = Reply::decode(&body)
        .map_err(|m| Error::new(ErrorKind::Unreachable, format!("tentd: {}", m.0)))?;
    if let Reply::Refused { kind, message } = reply {
        return Err(Error::new(kind, format!("tentd: {message}")));
    }
    Ok((reply, got.fd))
}

fn unexpected(r: &Reply) -> Error {
    Error::new(
        ErrorKind::Unreachable,
        format!("tentd answered out of turn: {r:?}"),
    )
}

impl ClientMemory {
    /// Its region id (the local side of an SQE).
    pub fn id(&self) -> RegionId {
        self.id
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Never empty (a zero-length allocation is refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn range(&self, offset: u64, n: usize) -> Result<*mut u8> {
        offset
            .checked_add(n as u64)
            .filter(|&e| e <= self.len)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::OutOfBounds,
                    format!("[{offset}, +{n}) leaves a region of {} bytes", self.len),
                )
            })?;
        Ok(self.map.ptr().wrapping_add(self.offset + offset as usize))
    }

    /// Copy `data` in at `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let at = self.range(offset, data.len())?;
        // SAFETY: `range` checked the bytes lie in the mapping, which `self` keeps; the daemon's transports may touch them concurrently only for ops this process posted, as with any registered memory.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), at, data.len()) };
        Ok(())
    }

    /// Copy out at `offset`.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let at = self.range(offset, out.len())?;
        // SAFETY: as in `write`.
        unsafe { std::ptr::copy_nonoverlapping(at, out.as_mut_ptr(), out.len()) };
        Ok(())
    }
}

/// Completions being read from an [`AttachedRing`]; see
/// [`AttachedRing::completions`].
pub struct Completions<'a> {
    cq: &'a mut Consumer<Cqe>,
}

impl Iterator for Completions<'_> {
    type Item = Cqe;
    fn next(&mut self) -> Option<Cqe> {
        self.cq.pop()
    }
}

impl Drop for Completions<'_> {
    fn drop(&mut self) {
        self.cq.sync();
    }
}

impl std::fmt::Debug for Completions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completions").finish_non_exhaustive()
    }
}

impl AttachedRing {
    /// Queue an SQE; `SqFull` when the ring has no free slot (reap
    /// completions first).
    pub fn push(&mut self, sqe: Sqe) -> Result<()> {
        self.sq
            .push(sqe)
            .map_err(|_| Error::new(ErrorKind::SqFull, "the ring is full: reap completions"))
    }

    /// Publish what was pushed (one Release store), waking the daemon's
    /// worker only if it sleeps.
    pub fn submit(&mut self) {
        self.sq.sync();
        if self.sq.needs_wakeup() {
            self.sq_bell.ring();
        }
    }

    /// The next completion, if one is ready (its slot goes back at once;
    /// [`completions`](Self::completions) hands slots back once per batch).
    pub fn completion(&mut self) -> Option<Cqe> {
        let c = self.cq.pop();
        if c.is_some() {
            self.cq.sync();
        }
        c
    }

    /// The completions ready now, as an iterator; their slots go back to
    /// the daemon's worker in one store when it is dropped.
    pub fn completions(&mut self) -> Completions<'_> {
        Completions { cq: &mut self.cq }
    }

    /// Wait up to `timeout` for a completion: spin a little, then sleep on
    /// the ring's CQ bell, which the worker rings only while this side
    /// says it sleeps. True when one is ready.
    pub fn wait(&mut self, timeout: Duration) -> bool {
        let start = Instant::now();
        let spin_until = start + Duration::from_micros(50).min(timeout);
        while Instant::now() < spin_until {
            if !self.cq.is_empty() {
                return true;
            }
            std::hint::spin_loop();
        }
        loop {
            let seen = self.cq_bell.word().load(Ordering::Acquire);
            if !self.cq.prepare_park() {
                self.cq.clear_need_wakeup();
                return true;
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                self.cq.clear_need_wakeup();
                return false;
            }
            self.cq_bell.wait(seen, left);
            self.cq.clear_need_wakeup();
            if !self.cq.is_empty() {
                return true;
            }
        }
    }
}
