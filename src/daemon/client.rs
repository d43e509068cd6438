//! The client's side: attach to a daemon over its socket, get memory and
//! rings from it, and post into those rings in place. After set-up the
//! socket is idle: a push is a store into shared memory, a submit one
//! Release store (and a futex wake only while the worker sleeps).
//!
//! [`Attached`] is what an [`Engine`](crate::Engine) is when it attached
//! to a daemon: the handle forwards to it what an embedded engine would
//! do itself.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tent_rings::region::{Region, RegionType};
use tent_rings::spsc;
use tent_rings::{Cqe, RegionId, SegmentId, Sqe};

use super::batches::ClientBatches;
use super::link::{DRAIN_TIMEOUT, IO_TIMEOUT, Link, WriteEventfds, io, unexpected, watch};
use super::mail::Post;
use super::relay::Hub;
use super::wire::{self, LAYOUT_VERSION, Part, Reply, Request};
use crate::config::Config;
use crate::doorbell::{CqBell, SharedWord};
use crate::engine::attached::{BELLS_LEN, CQ_BELL, MAIL_ARRIVED, MAIL_LEN, MAIL_SETTLED, SQ_BELL};
use crate::engine::{Buffer, Ring};
use crate::error::{Error, ErrorKind, Result};
use crate::memfd::{Mapping, size_and_seals};

/// The configuration keys that apply to an attached engine: every other
/// one is the daemon's to set.
const CLIENT_KEYS: &[&str] = &[
    "daemon_socket",
    "daemon_embed_fallback",
    "daemon_client_name",
    "ring_depth",
    "max_batch_size",
    "max_batches",
    "log_level",
];

/// This process attached to a daemon (`tentd`): an [`Engine`](crate::Engine)
/// whose engine runs in the daemon.
pub(crate) struct Attached {
    link: Arc<Link>,
    id: u32,
    config: Arc<Config>,
    /// The regions this client holds, mapped here until unregistered or
    /// the engine is dropped (as an embedded engine holds its regions,
    /// whether or not a `Buffer` of one is kept); `local_addr` looks here.
    memory: Mutex<Vec<Arc<ClientMemory>>>,
    /// The daemon's segment name: what a peer opens to reach this
    /// client's memory (the daemon exports it with its own).
    segment: String,
    /// Where notifications to this client go: its segment name is the
    /// daemon's with this mailbox (`crate::notify::mailbox_name`).
    mailbox: u64,
    /// Its notifications.
    post: Arc<Post>,
    /// The batch API, over a ring of its own.
    batches: Arc<ClientBatches>,
    /// Watches the socket: the daemon gone, it says so to every ring.
    watch: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("attached", &self.id)
            .field("gone", &self.link.gone())
            .finish_non_exhaustive()
    }
}

/// What an attached ring needs of its daemon: the SQ bell to ring while the
/// worker sleeps, and whether the daemon is still there.
pub(crate) struct DaemonRing {
    link: Arc<Link>,
    id: u32,
    worker: usize,
    sq_bell: SharedWord,
}

impl DaemonRing {
    /// Wake the daemon's worker (it asked, with NEED_WAKEUP): its relay
    /// sees the bell move.
    #[inline]
    pub(crate) fn wake(&self) {
        self.sq_bell.ring();
    }

    /// The daemon went.
    #[inline]
    pub(crate) fn gone(&self) -> bool {
        self.link.gone()
    }

    /// The daemon's worker serving the ring.
    pub(crate) fn worker(&self) -> usize {
        self.worker
    }

    /// Write `bell`'s eventfd whenever the daemon's worker bumps its CQ
    /// bell (the worker never writes a descriptor of this process: a
    /// thread here, one for every ring of the engine, does).
    pub(crate) fn watch_completions(&self, bell: &Arc<CqBell>) -> Result<()> {
        let word = bell
            .shared
            .clone()
            .ok_or_else(|| Error::invalid("an attached ring's bell is shared memory"))?;
        let hub = {
            let mut w = self.link.cq_watch.lock();
            match &*w {
                Some(h) => h.clone(),
                None => {
                    let h = Hub::start(WriteEventfds::default(), "tent-completion-fds".into())?;
                    *w = Some(h.clone());
                    h
                }
            }
        };
        hub.act()
            .rings
            .lock()
            .insert(u64::from(self.id), Arc::downgrade(bell));
        hub.add(u64::from(self.id), word);
        Ok(())
    }
}

impl Drop for DaemonRing {
    /// The ring is dropped: the daemon retires it (its worker drains what
    /// it took) and it no longer counts against this client's quota.
    fn drop(&mut self) {
        if let Some(h) = &*self.link.cq_watch.lock() {
            h.act().rings.lock().remove(&u64::from(self.id));
            h.remove(u64::from(self.id));
        }
        if let Err(e) = self.link.ask(&Request::CloseRing { ring: self.id })
            && !self.link.gone()
        {
            tracing::warn!(error = %e, ring = self.id, "tentd: closing a ring");
        }
    }
}

/// Memory the daemon allocated for this client: one memfd both map, so
/// what this process writes there is what the daemon's transports read
/// (zero copy).
#[derive(Debug)]
pub(crate) struct ClientMemory {
    id: RegionId,
    len: u64,
    offset: usize,
    /// Where the daemon maps it: what peers name.
    addr: u64,
    map: Mapping,
}

impl ClientMemory {
    pub(crate) fn id(&self) -> RegionId {
        self.id
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Its first byte where the daemon maps it: the address peers name it
    /// by (`addr + len` does not wrap: checked at allocation).
    pub(crate) fn addr(&self) -> u64 {
        self.addr
    }

    /// Its first byte, here.
    pub(crate) fn ptr(&self) -> *mut u8 {
        // `offset` is inside the mapping: `allocate_memory` mapped
        // `offset + len` bytes.
        self.map.ptr().wrapping_add(self.offset)
    }

    /// `[offset, offset + n)` inside it: its first byte here.
    fn range(&self, offset: u64, n: usize) -> Result<*mut u8> {
        let fits = offset
            .checked_add(n as u64)
            .is_some_and(|end| end <= self.len);
        if !fits {
            return Err(Error::new(
                ErrorKind::OutOfBounds,
                format!(
                    "{n} bytes at {offset} outside region {} of {} bytes",
                    self.id.0, self.len
                ),
            ));
        }
        Ok(self.ptr().wrapping_add(offset as usize))
    }

    /// Copy `data` in at `offset` (byte-wise relaxed atomic stores: the
    /// daemon's transports and peers may touch the same memory).
    pub(crate) fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let p = self.range(offset, data.len())?;
        for (i, b) in data.iter().enumerate() {
            // SAFETY: in bounds (checked by `range`); the mapping lives as long as `self`; AtomicU8 has the layout of u8.
            unsafe { (*(p.add(i) as *const AtomicU8)).store(*b, Ordering::Relaxed) };
        }
        Ok(())
    }

    /// Copy `out.len()` bytes out from `offset`.
    pub(crate) fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let p = self.range(offset, out.len())?;
        for (i, b) in out.iter_mut().enumerate() {
            // SAFETY: as in `write`.
            *b = unsafe { (*(p.add(i) as *const AtomicU8)).load(Ordering::Relaxed) };
        }
        Ok(())
    }
}

/// What an attached engine refuses: a call its daemon does not serve to
/// clients (yet), named.
fn not_served(call: &str) -> Error {
    Error::invalid(format!(
        "{call} is not served to an engine attached to tentd (daemon_socket); embed an engine for it"
    ))
}

impl Attached {
    /// Attach to the daemon listening at `socket`, for an engine
    /// configured by `config` (only the keys that apply to a client may be
    /// set). The daemon checks the layout version both sides speak and
    /// refuses a mismatch naming both (`InvalidArgument`), and serves only
    /// processes of its own user (`AccessDenied`).
    pub(crate) fn attach(socket: &Path, config: Config) -> Result<Attached> {
        let set: Vec<&str> = Config::default()
            .changed_keys(&config)
            .into_iter()
            .filter(|k| !CLIENT_KEYS.contains(k))
            .collect();
        if let Some(first) = set.first() {
            return Err(Error::invalid(format!(
                "{first} is the daemon's to set, not an attached engine's (set: {}; a client may set {})",
                set.join(", "),
                CLIENT_KEYS.join(", ")
            )));
        }
        // Connected through the file that was looked at (`O_PATH`, no
        // symlink followed): what `placed_by` judges is what answers.
        let unreachable = |e: std::io::Error| {
            // A socket this user may not open is a daemon that refuses
            // it, not an absent one (`daemon_embed_fallback` must not
            // embed in its place).
            let (kind, what) = match e.kind() {
                std::io::ErrorKind::PermissionDenied => (
                    ErrorKind::AccessDenied,
                    "this user may not attach to the tentd at",
                ),
                _ => (ErrorKind::Unreachable, "no tentd at"),
            };
            Error::new(kind, format!("{what} {}", socket.display())).with_source(e)
        };
        let (file, stat) = crate::memfd::open_socket_file(socket).map_err(unreachable)?;
        let stream = crate::memfd::connect_file(file.as_fd(), Instant::now() + IO_TIMEOUT)
            .map_err(unreachable)?;
        // The daemon is this user's, root's, or the user who owns the
        // socket in a directory only it (or root) may change: a socket
        // someone else put at the path gets nothing of ours.
        match crate::memfd::peer_uid(&stream) {
            Ok((uid, _)) if uid == crate::memfd::euid() || uid == 0 => {}
            Ok((uid, _)) if stat.st_uid == uid && placed_by(socket, uid) => {}
            Ok((uid, pid)) => {
                return Err(Error::new(
                    ErrorKind::AccessDenied,
                    format!(
                        "{} is served by uid {uid} (pid {pid}): not this user or root, nor the owner of the socket in a directory only it may change",
                        socket.display()
                    ),
                ));
            }
            Err(e) => return Err(io("SO_PEERCRED")(e)),
        }
        let stop = crate::doorbell::eventfd("the daemon watch's stop")?;
        // The watch polls its own descriptor of the socket.
        let watched_stream = stream.try_clone().map_err(io("duplicate the socket"))?;
        let link = Arc::new(Link {
            stream: Mutex::new(stream),
            gone: AtomicBool::new(false),
            bells: Mutex::new(Vec::new()),
            mail: std::sync::OnceLock::new(),
            cq_watch: Mutex::new(None),
            stop,
            detaching: AtomicBool::new(false),
        });
        let (id, mailbox, segment, page) = match link.ask(&Request::Hello {
            version: LAYOUT_VERSION,
            name: config.daemon_client_name.clone(),
        })? {
            (
                Reply::Welcome {
                    version,
                    client,
                    mailbox,
                    segment,
                },
                page,
            ) if version == LAYOUT_VERSION => (client, mailbox, segment, page),
            (Reply::Welcome { version, .. }, _) => {
                return Err(Error::invalid(format!(
                    "layout version mismatch: client {LAYOUT_VERSION}, tentd {version}"
                )));
            }
            (other, _) => return Err(link.desync(&other)),
        };
        let page = attach_sealed(page, RegionType::Data, None, MAIL_LEN, "mail page")?;
        let word = |at| SharedWord::new(page.clone(), at).expect("inside the mail page");
        let words = [word(MAIL_ARRIVED), word(MAIL_SETTLED)];
        let _ = link.mail.set(words.clone());
        let [arrived, settled] = words;
        let post = Arc::new(Post::new(link.clone(), arrived, settled));
        let watched = link.clone();
        let watch = std::thread::Builder::new()
            .name("tent-attached".into())
            .spawn(move || watch(&watched, &watched_stream))
            .map_err(|e| {
                Error::new(ErrorKind::OutOfMemory, "the daemon watch thread").with_source(e)
            })?;
        Ok(Attached {
            link,
            id,
            batches: Arc::new(ClientBatches::new(
                config.max_batches,
                config.max_batch_size,
                config.default_timeout_ms,
            )),
            config: Arc::new(config),
            memory: Mutex::new(Vec::new()),
            segment,
            mailbox,
            post,
            watch: Some(watch),
        })
    }

    /// `len` bytes of memory registered at the daemon for this client.
    pub(crate) fn allocate_memory(&self, len: u64) -> Result<Buffer> {
        let (reply, fd) = self.link.ask(&Request::Allocate { len })?;
        let Reply::Allocated {
            region,
            len: got,
            data_offset,
            addr,
        } = reply
        else {
            return Err(self.link.desync(&reply));
        };
        if addr.checked_add(len).is_none() {
            let _ = self.link.ask(&Request::FreeMemory { region });
            return Err(Error::new(
                ErrorKind::Unreachable,
                "tentd placed a region where it wraps",
            ));
        }
        let map = map_region(fd, len, got, data_offset).inspect_err(|_| {
            // Registered at the daemon and counted against this client:
            // given back (the link ends if even that fails).
            let _ = self.link.ask(&Request::FreeMemory { region });
        })?;
        let mem = ClientMemory {
            id: RegionId(region),
            len,
            offset: data_offset as usize,
            addr,
            map,
        };
        let mem = Arc::new(mem);
        self.memory.lock().push(mem.clone());
        Ok(Buffer::client(mem))
    }

    /// Memory of this process's heap: refused, the daemon cannot reach it.
    pub(crate) fn register_memory(&self, _ptr: *mut u8, _len: u64) -> Result<Buffer> {
        Err(heap_refused())
    }

    pub(crate) fn register_memory_batch(&self, _ranges: &[(*mut u8, u64)]) -> Result<Vec<Buffer>> {
        Err(heap_refused())
    }

    /// The region of this client's holding `[addr, addr + len)`, as an
    /// embedded engine answers: `InvalidArgument` for no bytes or a range
    /// that wraps, `AddressNotRegistered` where `addr` is in no region,
    /// `OutOfBounds` where the range runs past the region it starts in.
    pub(crate) fn local_addr(&self, addr: u64, len: u64) -> Result<tent_rings::LocalAddr> {
        if len == 0 {
            return Err(Error::invalid("local_addr: zero length"));
        }
        let end = addr
            .checked_add(len)
            .ok_or_else(|| Error::invalid("local_addr: the range wraps"))?;
        let memory = self.memory.lock();
        let Some((start, n, id)) = memory
            .iter()
            .map(|m| (m.ptr() as u64, m.len, m.id))
            .find(|&(start, n, _)| addr >= start && addr - start < n)
        else {
            return Err(Error::new(
                ErrorKind::AddressNotRegistered,
                format!("{addr:#x} is in no region of this client"),
            ));
        };
        if end - start > n {
            return Err(Error::new(
                ErrorKind::OutOfBounds,
                format!(
                    "{len} bytes at {addr:#x} run past region {} ({n} bytes)",
                    id.0
                ),
            ));
        }
        Ok(tent_rings::LocalAddr::new(id, addr - start))
    }

    /// Give region `id` back: the daemon unregisters it once the ops on it
    /// have ended, and it no longer counts against this client's quota.
    pub(crate) fn unregister_memory(&self, id: RegionId) -> Result<()> {
        match self.link.ask(&Request::FreeMemory { region: id.0 })? {
            (Reply::Done, _) => {
                self.memory.lock().retain(|m| m.id != id);
                Ok(())
            }
            (other, _) => Err(self.link.desync(&other)),
        }
    }

    pub(crate) fn unregister_memory_batch(&self, ids: &[RegionId]) -> Result<()> {
        ids.iter().try_for_each(|&id| self.unregister_memory(id))
    }

    /// Open segment `name` (a peer's `ip:port` or shm name) at the daemon
    /// for this client: its rings may then name it.
    pub(crate) fn open_segment(&self, name: &str) -> Result<SegmentId> {
        match self.link.ask(&Request::OpenSegment { name: name.into() })? {
            (Reply::Opened { segment }, _) => Ok(SegmentId(segment)),
            (other, _) => Err(self.link.desync(&other)),
        }
    }

    pub(crate) fn ring(&self) -> Result<Ring> {
        self.ring_with_depth(self.config.ring_depth)
    }

    /// A ring of `depth` entries (a power of two) in shared memory.
    pub(crate) fn ring_with_depth(&self, depth: u32) -> Result<Ring> {
        // The three parts are read whole first: a reply left unread would
        // put the two sides out of step.
        let mut frames = Vec::with_capacity(3);
        {
            let s = self.link.stream.lock();
            self.link.send(&s, &Request::CreateRing { depth })?;
            for want in [Part::Sq, Part::Cq, Part::Bells] {
                let (reply, fd) = match self.link.reply(&s, DRAIN_TIMEOUT) {
                    Ok(got) => got,
                    // A refusal comes first or not at all: after a part,
                    // the two sides are out of step.
                    Err(e) if !frames.is_empty() => return Err(self.link.broken(&s, e)),
                    Err(e) => return Err(e),
                };
                match reply {
                    Reply::RingPart {
                        part,
                        depth: d,
                        ring,
                        worker,
                    } if part == want
                        && d == depth
                        && frames
                            .first()
                            .is_none_or(|&(r, w, _)| (r, w) == (ring, worker)) =>
                    {
                        frames.push((ring, worker, fd));
                    }
                    other => return Err(self.link.broken(&s, unexpected(&other))),
                }
            }
        }
        let (id, worker) = (frames[0].0, frames[0].1);
        let fds = frames.into_iter().map(|(_, _, fd)| fd);
        self.map_ring(depth, id, worker, fds).inspect_err(|_| {
            // Held at the daemon and counted against this client: closed.
            let _ = self.link.ask(&Request::CloseRing { ring: id });
        })
    }

    /// Ring `id` of `depth` entries from its three memfds, checked.
    fn map_ring(
        &self,
        depth: u32,
        id: u32,
        worker: u32,
        fds: impl Iterator<Item = Option<OwnedFd>>,
    ) -> Result<Ring> {
        let mut parts: Vec<Arc<Region>> = Vec::with_capacity(3);
        for (want, fd) in [Part::Sq, Part::Cq, Part::Bells].into_iter().zip(fds) {
            let (ty, layout, least, what) = match want {
                Part::Sq => (
                    RegionType::Ring,
                    Some(spsc::ring_layout::<Sqe>(depth)),
                    0,
                    "ring",
                ),
                Part::Cq => (
                    RegionType::Ring,
                    Some(spsc::ring_layout::<Cqe>(depth)),
                    0,
                    "ring",
                ),
                Part::Bells => (RegionType::Data, None, BELLS_LEN, "bells"),
            };
            parts.push(attach_sealed(fd, ty, layout, least, what)?);
        }
        let bad =
            |e: spsc::RingError| Error::new(ErrorKind::Unreachable, "tentd's ring").with_source(e);
        let bells = parts.pop().expect("three parts");
        let cq = spsc::consumer_in_region::<Cqe>(parts.pop().expect("three parts")).map_err(bad)?;
        let sq = spsc::producer_in_region::<Sqe>(parts.pop().expect("three parts")).map_err(bad)?;
        let word = |at| SharedWord::new(bells.clone(), at).expect("inside the bells' page");
        let bell = Arc::new(CqBell {
            armed: AtomicBool::new(true),
            shared: Some(word(CQ_BELL)),
            ..CqBell::default()
        });
        {
            let mut bells = self.link.bells.lock();
            bells.retain(|b| b.strong_count() > 0);
            bells.push(Arc::downgrade(&bell));
        }
        let daemon = DaemonRing {
            link: self.link.clone(),
            id,
            worker: worker as usize,
            sq_bell: word(SQ_BELL),
        };
        Ok(Ring::attached(sq, cq, daemon, bell))
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    pub(crate) fn live_config(&self) -> Arc<Config> {
        self.config.clone()
    }
}

/// The calls a daemon does not serve to clients yet: each refused,
/// named; and the reports, which are the daemon's (its HTTP endpoint):
/// an attached engine reports only what it holds itself.
impl Attached {
    /// A block list, as requests of the batch API: one per run of blocks
    /// contiguous on both sides in one region (the daemon sees ring ops, so
    /// a scattered list is as many requests as runs; an embedded engine
    /// makes it one per registration). Returns how many tasks it appended.
    pub(crate) fn submit_blocks(
        &self,
        batch: crate::BatchId,
        blocks: &crate::BlockList<'_>,
    ) -> Result<usize> {
        let n = blocks.local_addrs.len();
        if blocks.block_len == 0 || n == 0 || blocks.remote_addrs.len() != n {
            return Err(Error::invalid(format!(
                "submit_blocks: {n} local and {} remote addresses of {} bytes each: both lists the same length, not empty, and blocks not empty",
                blocks.remote_addrs.len(),
                blocks.block_len
            )));
        }
        let len = blocks.block_len;
        // (local, remote, len) of each run.
        let mut runs: Vec<(tent_rings::LocalAddr, u64, u64)> = Vec::new();
        for (i, (&local, &remote)) in blocks
            .local_addrs
            .iter()
            .zip(blocks.remote_addrs)
            .enumerate()
        {
            if remote.checked_add(len).is_none() {
                return Err(Error::invalid(format!(
                    "submit_blocks: block {i}'s remote end wraps"
                )));
            }
            let at = self
                .local_addr(local, len)
                .map_err(|e| Error::new(e.kind(), format!("submit_blocks: block {i}: {e}")))?;
            if let Some((l, r, n)) = runs.last_mut()
                && l.region == at.region
                && l.offset.checked_add(*n) == Some(at.offset)
                && r.checked_add(*n) == Some(remote)
            {
                *n += len;
                continue;
            }
            runs.push((at, remote, len));
        }
        let seg = blocks.segment;
        let sqes: Vec<Sqe> = runs
            .iter()
            .map(|&(local, remote, len)| {
                let remote = tent_rings::RemoteAddr::new(seg, remote);
                match blocks.opcode {
                    tent_rings::Opcode::Read => tent_rings::op::Read::new(local, remote, len)
                        .priority(blocks.priority)
                        .build(),
                    tent_rings::Opcode::Write => tent_rings::op::Write::new(local, remote, len)
                        .priority(blocks.priority)
                        .build(),
                }
            })
            .collect();
        self.submit(batch, &sqes)?;
        Ok(sqes.len())
    }

    /// Sent by the daemon as this client (its mailbox name), to the
    /// segment's owner or the client its name ended with.
    pub(crate) fn send_notification(
        &self,
        segment: SegmentId,
        n: &crate::Notification,
    ) -> Result<()> {
        self.post.send(segment, n)
    }

    /// The requests into the batch, and `n` to their segment's owner once
    /// they all completed: the courier thread (started with the first)
    /// sends it, and the batch stays pending until it is delivered.
    pub(crate) fn submit_with_notification(
        &self,
        batch: crate::BatchId,
        requests: &[Sqe],
        n: &crate::Notification,
    ) -> Result<()> {
        let first = crate::notify::submission_target(requests, n)?;
        Post::check(first, n)?;
        // Running before the submission, so a failure to start it queues
        // nothing.
        self.post.courier_for(&self.batches)?;
        self.batches.submit_noted(
            || self.ring_with_depth(self.batches.ring_depth()),
            batch,
            requests,
            Some((first, n.clone())),
        )?;
        self.post.courier_for(&self.batches)
    }

    pub(crate) fn recv_notifications(&self) -> Vec<crate::Received> {
        self.post.take_all()
    }

    pub(crate) fn try_notification(&self) -> Option<crate::Received> {
        self.post.try_take()
    }

    pub(crate) fn wait_notification(&self, timeout: Duration) -> Result<crate::Received> {
        self.post.wait(timeout)
    }

    pub(crate) fn reload(&self, _config: Config) -> Result<u64> {
        Err(not_served(
            "reload (reload the daemon's configuration instead)",
        ))
    }

    /// Its configuration is the one it attached with, never reloaded.
    pub(crate) fn config_generation(&self) -> u64 {
        1
    }

    pub(crate) fn rails(&self, _id: SegmentId) -> Vec<crate::stats::RailStat> {
        Vec::new()
    }

    pub(crate) fn probe_peer_alive(&self, _segment: SegmentId, _timeout: Duration) -> Result<bool> {
        Err(not_served("probe_peer_alive"))
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn open_segment_edited(
        &self,
        _name: &str,
        _edit: impl FnOnce(&mut crate::control::SegmentDescriptor),
    ) -> Result<SegmentId> {
        Err(not_served("open_segment_edited"))
    }

    /// Close segment `id` for this client (the daemon closes its own once
    /// no other client holds it).
    pub(crate) fn close_segment(&self, id: SegmentId) -> Result<()> {
        match self.link.ask(&Request::CloseSegment { segment: id.0 })? {
            (Reply::Done, _) => Ok(()),
            (other, _) => Err(self.link.desync(&other)),
        }
    }

    /// The regions of segment `id` (one this client opened), asked page
    /// by page. Each page must be as long as the first page's total says
    /// (a daemon's bytes are checked as any process's): a list that
    /// changed between pages is asked for again, twice at most.
    pub(crate) fn segment_regions(&self, id: SegmentId) -> Result<Vec<crate::RemoteRegion>> {
        /// More than any segment lists (an shm descriptor holds 1024).
        const MOST: usize = 1 << 16;
        'again: for _ in 0..3 {
            let mut out = Vec::new();
            let mut total = None;
            loop {
                let skip = out.len() as u32;
                let (t, page) = match self.link.ask(&Request::SegmentRegions {
                    segment: id.0,
                    skip,
                })? {
                    (Reply::Regions { total, regions }, _) => (total as usize, regions),
                    (other, _) => return Err(self.link.desync(&other)),
                };
                if t > MOST {
                    return Err(Error::new(
                        ErrorKind::Unreachable,
                        format!("tentd lists {t} regions for segment {:#x}", id.0),
                    ));
                }
                if *total.get_or_insert(t) != t
                    || page.len() != (t - out.len().min(t)).min(wire::MAX_REGIONS)
                {
                    continue 'again;
                }
                out.extend(page.into_iter().map(|r| crate::RemoteRegion {
                    id: RegionId(r.id),
                    addr: r.addr,
                    len: r.len,
                }));
                if out.len() == t {
                    return Ok(out);
                }
            }
        }
        Err(Error::new(
            ErrorKind::Unreachable,
            format!(
                "tentd's region list of segment {:#x} kept changing while it was read",
                id.0
            ),
        ))
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn segment_peer(
        &self,
        _id: SegmentId,
    ) -> Option<Arc<crate::transport::shm::ShmPeer>> {
        None
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn shm_export(&self) -> Option<&crate::transport::shm::ShmExport> {
        None
    }

    /// No segment of its own: its memory is in the daemon's.
    pub(crate) fn local_segment_name(&self) -> Option<&str> {
        None
    }

    pub(crate) fn tcp_data_addr(&self) -> Option<std::net::SocketAddr> {
        None
    }

    /// The daemon's: peers reach a client's memory through its segment.
    /// The daemon's segment with this client's mailbox: a peer that opens
    /// it reaches the daemon's memory (this client's regions among it),
    /// and its notifications reach this client.
    pub(crate) fn segment_name(&self) -> String {
        crate::notify::mailbox_name(&self.segment, self.mailbox)
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn swap_transport(
        &self,
        _kind: tent_rings::TransportKind,
        _t: Option<Arc<dyn crate::transport::Transport>>,
    ) -> Option<Arc<dyn crate::transport::Transport>> {
        None
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn metrics(&self) -> &crate::metrics::Metrics {
        static NONE: std::sync::OnceLock<crate::metrics::Metrics> = std::sync::OnceLock::new();
        NONE.get_or_init(crate::metrics::Metrics::default)
    }

    pub(crate) fn all_rails(&self) -> Vec<(String, crate::stats::RailStat)> {
        Vec::new()
    }

    pub(crate) fn sq_rows(&self) -> Vec<crate::stats::SqRow> {
        Vec::new()
    }

    /// No family of its own (the figures are the daemon's `/metrics`):
    /// an OpenMetrics text with nothing but its end.
    pub(crate) fn metrics_text(&self) -> String {
        "# EOF\n".to_owned()
    }

    pub(crate) fn qos_stats(&self) -> crate::stats::QosSnapshot {
        crate::stats::QosSnapshot::default()
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn slot_clock(&self) -> Option<&Arc<crate::qos::SlotClock>> {
        None
    }

    /// This host's NUMA nodes; no NIC, worker or transport: those are the
    /// daemon's.
    pub(crate) fn topology_report(&self) -> crate::engine::TopologyReport {
        crate::engine::topology_report::TopologyReport::host_only(
            &crate::topology::Topology::detect(),
        )
    }

    pub(crate) fn planned_rails(
        &self,
        _segment: &str,
        _timeout: Duration,
    ) -> Result<crate::engine::topology_report::RailsTo> {
        Err(not_served("planned_rails"))
    }

    pub(crate) fn http_url(&self) -> Option<&str> {
        None
    }

    pub(crate) fn http_bearer_token(&self) -> Option<String> {
        None
    }

    /// None in this process.
    pub(crate) fn transports(&self) -> Vec<tent_rings::TransportKind> {
        Vec::new()
    }

    pub(crate) fn credits_in_flight(&self) -> u32 {
        0
    }

    pub(crate) fn worker_cores(&self) -> Vec<Option<usize>> {
        Vec::new()
    }

    /// Counted by the daemon's workers, not here.
    pub(crate) fn completed(&self) -> (u64, u64) {
        (0, 0)
    }

    /// Never: an attached engine issues nothing inline.
    pub(crate) fn completed_inline(&self) -> u64 {
        0
    }

    pub(crate) fn traffic_stats(&self) -> crate::stats::TrafficStats {
        crate::stats::TrafficStats::default()
    }

    pub(crate) fn allocate_batch(&self, capacity: usize) -> Result<crate::BatchId> {
        self.batches.allocate(capacity)
    }

    pub(crate) fn submit(&self, batch: crate::BatchId, requests: &[Sqe]) -> Result<()> {
        self.batches.submit(
            || self.ring_with_depth(self.batches.ring_depth()),
            batch,
            requests,
        )
    }

    pub(crate) fn status(&self, batch: crate::BatchId, task: usize) -> Result<crate::TaskStatus> {
        self.batches.status(batch, task)
    }

    pub(crate) fn status_list(&self, batch: crate::BatchId) -> Result<Vec<crate::TaskStatus>> {
        self.batches.status_list(batch)
    }

    pub(crate) fn batch_status(&self, batch: crate::BatchId) -> Result<crate::TaskStatus> {
        self.batches.overall(batch)
    }

    pub(crate) fn cancel(&self, _batch: crate::BatchId) -> Result<()> {
        Err(not_served("cancel"))
    }

    pub(crate) fn cancel_task(&self, _batch: crate::BatchId, _task: usize) -> Result<()> {
        Err(not_served("cancel_task"))
    }

    pub(crate) fn free_batch(&self, batch: crate::BatchId) -> Result<()> {
        self.batches.free(batch)
    }

    pub(crate) fn wait_batch(
        &self,
        batch: crate::BatchId,
        timeout: Duration,
    ) -> Result<crate::TaskStatus> {
        self.batches.wait(batch, timeout)
    }
}

/// Could only user `uid` (or root) have put the socket at `path` there?
/// Every directory on the way (not followed through a symlink) belongs to
/// `uid` or root and is writable by its owner alone: `/run/tent/` of a
/// daemon's user, not `/tmp`, which anyone may write.
fn placed_by(path: &Path, uid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(path) = std::path::absolute(path) else {
        return false;
    };
    path.ancestors().skip(1).all(|dir| {
        std::fs::symlink_metadata(dir)
            .is_ok_and(|m| m.is_dir() && (m.uid() == uid || m.uid() == 0) && m.mode() & 0o022 == 0)
    })
}

/// Map region memfd `fd` the daemon sent for `len` bytes (it said `got`
/// bytes from `data_offset`): sealed against shrinking, so the daemon
/// cannot cut it under this process, and as long as it says.
fn map_region(fd: Option<OwnedFd>, len: u64, got: u64, data_offset: u64) -> Result<Mapping> {
    let fd = fd.ok_or_else(|| Error::new(ErrorKind::Unreachable, "tentd sent no memfd"))?;
    let end = data_offset
        .checked_add(got)
        .filter(|_| got == len)
        .ok_or_else(|| Error::new(ErrorKind::Unreachable, "tentd sent a bad region"))?;
    let (size, seals) = size_and_seals(fd.as_fd()).map_err(io("check the memfd"))?;
    if seals & libc::F_SEAL_SHRINK == 0 || size < end {
        return Err(Error::new(
            ErrorKind::Unreachable,
            "tentd's memfd is not sealed or too short",
        ));
    }
    let len = usize::try_from(end).map_err(|_| Error::invalid("region too large to map"))?;
    Mapping::map(fd.as_fd(), len, true).map_err(io("map the memfd"))
}

fn heap_refused() -> Error {
    Error::invalid(
        "register_memory: an engine attached to tentd cannot register this process's heap (the daemon cannot reach it); allocate through the engine (allocate_memory), which is zero copy",
    )
}

impl Drop for Attached {
    /// Detach, waiting until the daemon has released what this client held
    /// (its rings retired once drained, its regions unregistered once the
    /// ops on them end): when this returns, nothing of the engine touches
    /// its memory. A ring or buffer that outlives the engine stays mapped,
    /// its rings answering `Shutdown`, as an embedded engine's do.
    fn drop(&mut self) {
        self.post.stop();
        let watch = self.link.cq_watch.lock().take();
        if let Some(h) = watch {
            h.stop();
        }
        self.link.detaching.store(true, Ordering::Release);
        if !self.link.gone()
            && let Err(e) = self.link.ask(&Request::Detach)
            && !self.link.gone()
        {
            tracing::warn!(error = %e, "tentd: detaching");
        }
        let _ = rustix::io::write(&self.link.stop, &1u64.to_ne_bytes());
        if let Some(t) = self.watch.take() {
            let _ = t.join();
        }
        self.link.gone.store(true, Ordering::Release);
        let _ = self.link.stream.lock().shutdown(std::net::Shutdown::Both);
        self.link.wake_rings();
    }
}

/// A region the daemon handed over (`what`, for the errors) from its
/// memfd, checked: sent, sealed against shrinking, of its layout, and with
/// at least `least` bytes of payload.
fn attach_sealed(
    fd: Option<OwnedFd>,
    ty: RegionType,
    layout: Option<[u64; 4]>,
    least: usize,
    what: &str,
) -> Result<Arc<Region>> {
    let unreachable = |m: String| Error::new(ErrorKind::Unreachable, m);
    let fd = fd.ok_or_else(|| unreachable(format!("tentd sent no memfd for its {what}")))?;
    let (_, seals) = size_and_seals(fd.as_fd()).map_err(io("check a memfd"))?;
    if seals & libc::F_SEAL_SHRINK == 0 {
        return Err(unreachable(format!("tentd's {what} memfd is not sealed")));
    }
    let region = Region::attach_file(&File::from(fd), ty, layout)
        .map_err(|e| unreachable(format!("tentd's {what}: {e}")))?;
    if region.payload_len() < least {
        return Err(unreachable(format!("tentd's {what} is short")));
    }
    Ok(Arc::new(region))
}
