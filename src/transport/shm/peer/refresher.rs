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
//! - [`Refresher::stop`] (from `close_segment`, on an API thread) stops
//!   it: a stop flag, the eventfd, and a shutdown of the owner connection,
//!   so a refresh waiting on a silent owner returns at once; then it waits
//!   for the thread to end (it is between two pre-fault chunks at worst).
//!   Dropping the [`Refresher`] does the same and joins, which after
//!   `stop` only reaps a finished thread: a worker that drops a closed
//!   segment's last reference waits for nothing.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{self, EventfdFlags, PollFd, PollFlags};
use rustix::io::Errno;
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
        Ok(Wake {
            fd: event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?,
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
        // Non-blocking, and the counter cannot fill (the refresher drains it).
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }

    /// The refresher's side: drain the eventfd and take the pending
    /// request, if any.
    fn take(&self) -> bool {
        let mut n = [0u8; 8];
        // Non-blocking: EAGAIN when nothing was written.
        let _ = rustix::io::read(&self.fd, &mut n);
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

/// How long [`Refresher::stop`] waits for the thread to end: a refresh
/// returns once the owner connection is shut down, and pre-faulting stops
/// at the next chunk, so this is only a bound against the unforeseen.
const STOP_WAIT: Duration = Duration::from_secs(5);

impl Refresher {
    /// Tell the thread to stop: the stop flag, the eventfd, and a shutdown
    /// of the owner connection, so a refresh waiting on a silent owner
    /// returns at once. Never waits.
    fn signal(&self) {
        let s = &self.state;
        s.wake.stop.store(true, Ordering::Release);
        s.wake.ring();
        s.owner.hang_up();
    }

    /// Stop the thread and wait (an API thread: `close_segment`) until it
    /// has ended, so that whoever drops the peer last, a worker included,
    /// joins a finished thread and waits for nothing. `false` if it was
    /// still running after [`STOP_WAIT`] (the drop then joins it).
    pub(super) fn stop(&self) -> bool {
        self.signal();
        let Some(t) = self.thread.as_ref() else {
            return true;
        };
        let end = Instant::now() + STOP_WAIT;
        let mut nap = Duration::from_micros(50);
        while !t.is_finished() {
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(5));
        }
        true
    }

    /// Has the thread ended?
    pub(super) fn finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }
}

impl Drop for Refresher {
    fn drop(&mut self) {
        // After `stop` (a closed segment) the thread has ended and the
        // join only reaps it.
        self.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(state: &PeerState) {
    let mut watch_owner = true;
    loop {
        // Before every poll: a stop whose ring the last `take` drained
        // would otherwise leave this poll waiting for nothing.
        if state.wake.stopped() {
            return;
        }
        let mut fds = [
            PollFd::new(&state.wake.fd, PollFlags::IN),
            state.owner.liveness_pollfd(),
        ];
        // Once the owner is gone its hang-up stays readable: stop watching.
        let n = if watch_owner { 2 } else { 1 };
        let rc = event::poll(&mut fds[..n], None);
        if state.wake.stopped() {
            return;
        }
        if let Err(e) = rc {
            if e != Errno::INTR {
                let e = io::Error::from(e);
                crate::lograte::warn_limited!("shm-refresher-poll", error = %e, "shm refresher: poll failed");
                std::thread::sleep(Duration::from_millis(10));
            }
            continue;
        }
        if watch_owner && HandoutClient::hung_up(fds[1].revents()) {
            watch_owner = false;
            state.owner_hung_up();
        }
        if !fds[0].revents().is_empty() && state.wake.take() && !state.owner_gone() {
            // Errors are recorded against the sequence read (and logged)
            // inside: the next miss answers with them.
            let _ = state.refresh(false, Instant::now() + IO_TIMEOUT);
        }
    }
}
