//! loom models of the three wake-up handshakes, each checked over every
//! interleaving and every weak-memory outcome loom's C11 model allows:
//!
//! 1. `NEED_WAKEUP` (`rings/src/spsc.rs`): `Producer::needs_wakeup` and
//!    `Consumer::prepare_park`, a Dekker pair with a SeqCst fence each side.
//! 2. The doorbell (`src/doorbell.rs`): the worker reads the counter before
//!    re-checking its rings and sleeps on that value; a submitter that sees
//!    `NEED_WAKEUP` bumps it (Release, paired with `value()`'s Acquire).
//! 3. The completion bell (`Wakers::completion_ready` and the worker's
//!    `park`): SeqCst store of `awaiting` + fence + last poll on the worker,
//!    publish + fence + `awaiting` load on the completion thread.
//!
//! The real code keeps its atomics in shared memory laid out as a format and
//! sleeps in `futex(2)`, neither of which loom can host, so each model
//! restates the protocol with loom atomics and the exact orderings of the
//! code it mirrors (the comments name the function). A futex wait on `seen`
//! sleeps iff the word still equals `seen`, until a later bump: so no wakeup
//! is lost iff the worker found the work or the word moved past `seen`.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release -p tent-rings --test loom_handshakes`
#![cfg(loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicU32, Ordering, fence};
use loom::thread;

const NEED_WAKEUP: u32 = 1;

/// One ring's shared words: a slot, the producer's tail, the consumer's flags.
#[derive(Default)]
struct Ring {
    slot: AtomicU32,
    tail: AtomicU32,
    flags: AtomicU32,
}

impl Ring {
    /// Producer: write the slot, `sync` (Release tail store), then
    /// `needs_wakeup` (SeqCst fence, Relaxed flag load).
    fn publish_and_check(&self) -> bool {
        self.slot.store(42, Ordering::Relaxed);
        self.tail.store(1, Ordering::Release);
        fence(Ordering::SeqCst);
        self.flags.load(Ordering::Relaxed) & NEED_WAKEUP != 0
    }

    /// Consumer: `prepare_park` (Relaxed fetch_or, SeqCst fence, then the
    /// `refresh_tail` Acquire load); true when the ring is still empty. If
    /// it is not, the slot must hold what the producer wrote.
    fn prepare_park(&self) -> bool {
        self.flags.fetch_or(NEED_WAKEUP, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let empty = self.tail.load(Ordering::Acquire) == 0;
        if !empty {
            assert_eq!(
                self.slot.load(Ordering::Relaxed),
                42,
                "slot read before its write"
            );
        }
        empty
    }
}

/// The doorbell: `value()` is an Acquire load, `ring()` a Release fetch_add.
#[derive(Default)]
struct Bell {
    word: AtomicU32,
}

impl Bell {
    fn value(&self) -> u32 {
        self.word.load(Ordering::Acquire)
    }
    fn ring(&self) {
        self.word.fetch_add(1, Ordering::Release);
    }
}

/// Model 1: A producer that publishes while the consumer parks: either the
/// consumer sees the entry or the producer sees `NEED_WAKEUP`.
#[test]
fn loom_need_wakeup_handshake() {
    loom::model(|| {
        let ring = Arc::new(Ring::default());
        let r = ring.clone();
        let producer = thread::spawn(move || r.publish_and_check());
        let parks = ring.prepare_park();
        let wakes = producer.join().unwrap();
        assert!(
            !parks || wakes,
            "lost wakeup: consumer parked, producer saw no NEED_WAKEUP"
        );
    });
}

/// Model 2: The whole park through the doorbell (`Worker::park` without
/// completions, a submitter's `sync` + `needs_wakeup` + `Doorbell::ring`):
/// the worker never sleeps through published work, and once the bell wakes
/// it, the work is visible.
#[test]
fn loom_doorbell_park() {
    loom::model(|| {
        let ring = Arc::new(Ring::default());
        let bell = Arc::new(Bell::default());
        let (r, b) = (ring.clone(), bell.clone());
        let submitter = thread::spawn(move || {
            if r.publish_and_check() {
                b.ring();
            }
        });
        // Worker::park: the counter first, then the re-check.
        let seen = bell.value();
        let saw_work = !ring.prepare_park();
        // Doorbell::wait(seen): returns at once if the word moved.
        let now = bell.value();
        if now != seen {
            // Woken by a ring: Release/Acquire on the word makes the entry
            // published before it visible to the re-poll.
            assert_eq!(
                ring.tail.load(Ordering::Relaxed),
                1,
                "woken, but the work is not visible"
            );
        }
        submitter.join().unwrap();
        let slept_forever = !saw_work && bell.word.load(Ordering::Relaxed) == seen;
        assert!(
            !slept_forever,
            "lost wakeup: worker sleeps on {seen}, nobody rings"
        );
    });
}

/// Model 3: The completion bell: a transport thread publishes a completion and
/// calls `Wakers::completion_ready` while the worker parks waiting for it.
#[test]
fn loom_completion_bell() {
    loom::model(|| {
        let done = Arc::new(AtomicU32::new(0));
        let awaiting = Arc::new(AtomicBool::new(false));
        let bell = Arc::new(Bell::default());
        let (d, a, b) = (done.clone(), awaiting.clone(), bell.clone());
        let completer = thread::spawn(move || {
            // Publish the completion (a Release push the worker reaps with
            // Acquire), then Wakers::completion_ready.
            d.store(1, Ordering::Release);
            fence(Ordering::SeqCst);
            if a.load(Ordering::Relaxed) {
                b.ring();
            }
        });
        // Worker::park(.., completions = true).
        let seen = bell.value();
        awaiting.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let reaped = done.load(Ordering::Acquire) == 1;
        completer.join().unwrap();
        let slept_forever = !reaped && bell.word.load(Ordering::Relaxed) == seen;
        assert!(
            !slept_forever,
            "lost wakeup: worker sleeps awaiting a completion nobody rings for"
        );
    });
}
