//! A futex doorbell: how a thread wakes one that parked (a submitter its
//! worker, a worker or receiver a TCP sender thread).
//!
//! The worker reads the counter, announces NEED_WAKEUP on its rings,
//! re-checks them, then sleeps on the counter value it read; a submitter that
//! sees NEED_WAKEUP bumps the counter and wakes. A bump between the read and
//! the sleep makes the futex call return at once, so no wakeup is lost.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crossbeam_utils::CachePadded;
use rustix::thread::futex;
use std::time::Duration;

/// A counter a worker sleeps on.
#[derive(Debug, Default)]
pub(crate) struct Doorbell {
    word: AtomicU32,
}

impl Doorbell {
    /// The value to pass to [`Doorbell::wait`]; read it before re-checking
    /// for work.
    #[inline]
    pub(crate) fn value(&self) -> u32 {
        // Acquire: work published before a ring() that we observe is visible.
        self.word.load(Ordering::Acquire)
    }

    /// Wake the sleeper (one syscall; only called when it asked). Every
    /// waiter on the word: besides the thread, a futex wait its io_uring
    /// holds armed on it (`Transport::park`) may be queued there, and a
    /// wake taken by that one alone would leave the thread asleep.
    pub(crate) fn ring(&self) {
        self.wake(i32::MAX as u32);
    }

    /// Wake every sleeper (a state change all of them must see: an SQ
    /// degraded, room for whoever waits first).
    pub(crate) fn ring_all(&self) {
        self.wake(i32::MAX as u32);
    }

    /// Bump the counter, then wake up to `n` sleepers.
    fn wake(&self, n: u32) {
        // Release: pairs with the Acquire in value().
        self.word.fetch_add(1, Ordering::Release);
        // FUTEX_WAKE only fails for a bad address, which a reference is not.
        let _ = futex::wake(&self.word, futex::Flags::PRIVATE, n);
    }

    /// Sleep until the counter differs from `seen` or `timeout` passes.
    pub(crate) fn wait(&self, seen: u32, timeout: Duration) {
        wait_on(&self.word, seen, timeout);
    }

    /// The counter, for a transport that sleeps on it in its own way
    /// (`Transport::park`: a futex wait in the worker's io_uring).
    pub(crate) fn word(&self) -> &AtomicU32 {
        &self.word
    }
}

/// Sleep until `word` differs from `seen` or `timeout` passes (a
/// [`Doorbell`]'s wait, on its counter).
pub(crate) fn wait_on(word: &AtomicU32, seen: u32, timeout: Duration) {
    let ts = futex::Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    // EAGAIN (the counter moved), ETIMEDOUT and EINTR all mean "look
    // again"; spurious returns are harmless (the caller re-checks).
    let _ = futex::wait(word, futex::Flags::PRIVATE, seen, Some(&ts));
}

/// A futex word in memory another process maps too (an attached client's
/// ring bells): bumped and woken without `FUTEX_PRIVATE_FLAG`, so a waiter
/// in either process wakes. The other process may write anything into it;
/// a wrong value only makes a wait return at once or a bump look like
/// another.
#[derive(Clone)]
pub(crate) struct SharedWord {
    region: std::sync::Arc<tent_rings::region::Region>,
    offset: usize,
}

impl std::fmt::Debug for SharedWord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedWord")
            .field("offset", &self.offset)
            .finish_non_exhaustive()
    }
}

impl SharedWord {
    /// The word at `offset` of `region`'s payload; `None` when it does not
    /// fit or is not 4-byte aligned.
    pub(crate) fn new(
        region: std::sync::Arc<tent_rings::region::Region>,
        offset: usize,
    ) -> Option<SharedWord> {
        let fits = offset
            .checked_add(4)
            .is_some_and(|end| end <= region.payload_len());
        (fits && offset % 4 == 0).then_some(SharedWord { region, offset })
    }

    /// The word.
    pub(crate) fn word(&self) -> &AtomicU32 {
        // SAFETY: `new` checked the word lies in the payload, 4-byte aligned (the payload is 128-byte aligned); the region keeps the mapping alive while `self` lives; every access is atomic.
        unsafe { &*(self.region.payload_ptr().add(self.offset) as *const AtomicU32) }
    }

    /// Bump it and wake one waiter, in any process (a ring's bell has one
    /// waiter; waking all would let the other side make each wake walk as
    /// many threads as it parks there).
    pub(crate) fn ring(&self) {
        // Release: what was published before the bump is seen by a waiter
        // that reads the new value.
        self.word().fetch_add(1, Ordering::Release);
        let _ = futex::wake(self.word(), futex::Flags::empty(), 1);
    }

    /// Sleep until it differs from `seen` or `timeout` passes.
    pub(crate) fn wait(&self, seen: u32, timeout: Duration) {
        let ts = futex::Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        let _ = futex::wait(self.word(), futex::Flags::empty(), seen, Some(&ts));
    }
}

/// A ring's completion bell: the application sleeps on it in
/// `Ring::wait_ready`, or on its eventfd (`Ring::completion_fd`); the
/// worker rings both after publishing CQEs, but only once the application
/// has armed it (a relaxed load per flush until then, so rings nobody
/// waits on pay no fence), and only while the ring's NEED_WAKEUP says the
/// application is about to sleep.
#[derive(Debug, Default)]
pub(crate) struct CqBell {
    /// The application sleeps on it.
    pub bell: Doorbell,
    /// Set once by the first blocking wait or `completion_fd`; never
    /// cleared.
    pub armed: AtomicBool,
    /// The eventfd an application waits on with epoll (made by the first
    /// `Ring::completion_fd`).
    pub efd: std::sync::OnceLock<std::os::fd::OwnedFd>,
    /// An attached client's ring: its bell is this word in memory the
    /// client maps (rung instead of `bell`).
    pub shared: Option<SharedWord>,
}

impl CqBell {
    /// The value to pass to [`CqBell::wait`]; read it before the last look
    /// at the ring.
    #[inline]
    pub(crate) fn value(&self) -> u32 {
        match &self.shared {
            Some(word) => word.word().load(Ordering::Acquire),
            None => self.bell.value(),
        }
    }

    /// Sleep until the bell rings past `seen`, or `timeout` passes.
    pub(crate) fn wait(&self, seen: u32, timeout: Duration) {
        match &self.shared {
            Some(word) => word.wait(seen, timeout),
            None => self.bell.wait(seen, timeout),
        }
    }

    /// CQEs were published and the application said it is about to
    /// sleep: wake it, on the futex and on the eventfd if it has one.
    pub(crate) fn ring(&self) {
        match &self.shared {
            Some(word) => word.ring(),
            None => self.bell.ring(),
        }
        if let Some(fd) = self.efd.get() {
            // A full counter (EAGAIN) is readable already; nothing else
            // can fail on an eventfd we made.
            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        }
    }
}

/// A worker's doorbell, and whether it sleeps waiting for completions of
/// slices posted on an asynchronous transport.
#[derive(Debug, Default)]
pub(crate) struct WorkerBell {
    /// The worker sleeps on it (submitters and transports ring it).
    pub bell: Doorbell,
    /// Set (SeqCst) while the worker sleeps with slices in flight.
    pub awaiting: AtomicBool,
    /// Set (SeqCst) from before the worker flags NEED_WAKEUP on its rings
    /// until it is back from the park: a daemon's relay rings the bell
    /// for a client's SQ bell only then (an awake worker polls the ring).
    pub parked: AtomicBool,
}

/// Every worker's [`WorkerBell`], so a transport's completion thread can
/// wake the worker that posted a slice.
#[derive(Debug)]
pub struct Wakers {
    slots: Box<[CachePadded<WorkerBell>]>,
}

impl Wakers {
    /// Bells for `workers` workers.
    pub(crate) fn new(workers: usize) -> Wakers {
        Wakers {
            slots: (0..workers).map(|_| CachePadded::default()).collect(),
        }
    }

    /// Worker `w`'s bell.
    #[inline]
    pub(crate) fn get(&self, w: usize) -> &WorkerBell {
        &self.slots[w]
    }

    /// After publishing a completion for worker `w`: wake it if it sleeps
    /// waiting for one (one fence and one load when it does not). The
    /// contract of a transport that completes on threads of its own
    /// (`Capabilities::wakes_worker`); the in-tree ones are all polled.
    #[inline]
    #[allow(dead_code)]
    pub(crate) fn completion_ready(&self, w: usize) {
        let Some(slot) = self.slots.get(w) else {
            return;
        };
        // SeqCst, paired with the worker's SeqCst store of `awaiting` and
        // fence before it polls a last time: either it sees our completion
        // or we see it asleep.
        std::sync::atomic::fence(Ordering::SeqCst);
        if slot.awaiting.load(Ordering::Relaxed) {
            slot.bell.ring();
        }
    }
}

/// A non-blocking, close-on-exec eventfd (`what` names it in the error):
/// a ring's completion fd, a stop that a thread polls beside its socket.
///
/// # Errors
/// `OutOfMemory` when the kernel refuses one (the descriptor limit).
pub(crate) fn eventfd(what: &str) -> crate::error::Result<std::os::fd::OwnedFd> {
    rustix::event::eventfd(
        0,
        rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
    )
    .map_err(|e| {
        crate::error::Error::new(tent_rings::ErrorKind::OutOfMemory, format!("{what} eventfd"))
            .with_source(std::io::Error::from(e))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn stale_value_returns_at_once_and_ring_wakes() {
        let d = Arc::new(Doorbell::default());
        let seen = d.value();
        d.ring();
        let t = Instant::now();
        d.wait(seen, Duration::from_secs(5));
        assert!(t.elapsed() < Duration::from_secs(4));

        let d2 = d.clone();
        let seen = d.value();
        let h = std::thread::spawn(move || d2.wait(seen, Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        d.ring();
        h.join().unwrap();
    }
}
