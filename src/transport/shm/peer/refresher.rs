//! A peer's refresher: one thread per [`ShmPeer`](super::ShmPeer) that does
//! everything about the owner that can wait, so a worker never does.
//!
//! - It sleeps in `poll` on the connection to the owner and on a wake
//!   eventfd, nothing else: an idle peer costs no wakeup.
//! - The owner hanging up (it died, even `kill -9`, or withdrew the
//!   segment) is seen the moment it happens: every access fails
//!   `ProcessFailed` from then on.
//! - A worker whose access misses a region the owner published since the
//!   peer last looked asks for a refresh ([`Wake::request`]: a flag and, once
//!   per request, one write to a non-blocking eventfd) and is told "later";
//!   the refresher runs the handout round trip and the `mmap`s, publishes
//!   the new view, then pre-faults what the owner populated.
//! - Dropping the [`Refresher`] stops it: a stop flag, the eventfd, and a
//!   shutdown of the owner connection, so a refresh waiting on a silent
//!   owner returns at once; then the thread is joined (it is between two
//!   pre-fault chunks at worst).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tent_rings::ErrorKind;

use super::PeerState;
use crate::error::{Error, Result};
use crate::transport::shm::handout::{HandoutClient, IO_TIMEOUT};

/// How a worker asks the refresher for a refresh, and how the refresher is
/// told to stop.
pub(super) struct Wake {
    /// An eventfd (non-blocking: a write never waits).
    fd: OwnedFd,
    /// A refresh was asked for and the refresher has not taken it yet:
    /// further requests write nothing.
    requested: AtomicBool,
    stop: AtomicBool,
}

impl Wake {
    pub(super) fn new() -> io::Result<Wake> {
        // SAFETY: plain eventfd(2) call; the result is checked before use.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Wake {
            // SAFETY: `raw` is a fresh descriptor that nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
            requested: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        })
    }

    /// Ask for a refresh (a worker's miss): one eventfd write unless one is
    /// already pending. Never waits.
    pub(super) fn request(&self) {
        // Relaxed: the refresher clears the flag before it reads the
        // descriptor, so a `true` seen here is a request that will read
        // what this miss saw; a stale `true` only delays the request to
        // the next miss (a waiting op tries again every turn).
        if self.requested.load(Ordering::Relaxed) || self.requested.swap(true, Ordering::AcqRel) {
            return;
        }
        self.ring();
    }

    fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our own eventfd; it is non-blocking, and the counter cannot fill (the refresher drains it).
        unsafe { libc::write(self.fd.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// The refresher's side: drain the eventfd and take the pending
    /// request, if any.
    fn take(&self) -> bool {
        let mut n: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from our own non-blocking eventfd.
        unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut n).cast(), 8) };
        // SeqCst (a full barrier): the clear is ordered before the
        // descriptor read that follows, so a miss that still sees the flag
        // set is covered by this refresh.
        self.requested.swap(false, Ordering::SeqCst)
    }

    /// Has the peer been dropped? (Long work checks it between steps.)
    pub(super) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

/// The refresher thread of one peer; stops and joins it when dropped.
pub(super) struct Refresher {
    state: Arc<PeerState>,
    thread: Option<JoinHandle<()>>,
}

impl Refresher {
    /// Start the thread (an API thread calls this, from `attach`).
    pub(super) fn start(state: Arc<PeerState>) -> Result<Refresher> {
        let s = state.clone();
        let thread = std::thread::Builder::new()
            .name("tent-shm-refresh".into())
            .spawn(move || run(&s))
            .map_err(|e| {
                Error::new(ErrorKind::OutOfMemory, "spawn shm refresher").with_source(e)
            })?;
        Ok(Refresher {
            state,
            thread: Some(thread),
        })
    }
}

impl Drop for Refresher {
    fn drop(&mut self) {
        let s = &self.state;
        s.wake.stop.store(true, Ordering::Release);
        s.wake.ring();
        // A refresh waiting on the owner returns now (the peer is going).
        s.owner.hang_up();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(state: &PeerState) {
    let mut watch_owner = true;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: state.wake.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            state.owner.liveness_pollfd(),
        ];
        // Once the owner is gone its hang-up stays readable: stop watching.
        let n: libc::nfds_t = if watch_owner { 2 } else { 1 };
        // SAFETY: poll over `n` (<= 2) valid pollfds in a local array that outlives the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), n, -1) };
        if state.wake.stopped() {
            return;
        }
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                crate::lograte::warn_limited!("shm-refresher-poll", error = %e, "shm refresher: poll failed");
                std::thread::sleep(Duration::from_millis(10));
            }
            continue;
        }
        if watch_owner && HandoutClient::hung_up(fds[1].revents) {
            watch_owner = false;
            state.owner_hung_up();
        }
        if fds[0].revents != 0 && state.wake.take() && !state.owner_gone() {
            // Errors are recorded against the sequence read (and logged)
            // inside: the next miss answers with them.
            let _ = state.refresh(false, Instant::now() + IO_TIMEOUT);
        }
    }
}
