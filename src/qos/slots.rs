//! The global time-slot clock (seed 001): processes that name the same
//! `shared_quota_shm_path` share one slot, rotated every
//! `slot_rotation_interval_ms` (slot 0: HIGH only; 1: HIGH and MEDIUM;
//! 2: all), so bulk work in one process leaves windows to latency-bound
//! work in another.
//!
//! The file is a [`Region`] of type `SlotClock` in `/dev/shm`, created by
//! whichever process comes first and never unlinked (whoever joins later
//! must find it). Its payload is one **lease word** and the interval:
//!
//! ```text
//!  63            32 31                 2 1  0
//! ┌────────────────┬────────────────────┬────┐
//! │ owner (random) │ beat (30 bits)     │slot│   owner 0: nobody rotates
//! └────────────────┴────────────────────┴────┘
//! ```
//!
//! Exactly one participant rotates: the owner, which every interval
//! compare-and-swaps the word to (itself, beat + 1, next slot). Every other
//! participant watches; a word unchanged for 1.25 intervals means the owner
//! is gone (killed, stopped), and the first watcher to swap it becomes the
//! owner: a takeover lands at most 1.75 intervals after the owner's last
//! beat. A compare-and-swap on the whole word is the lease: an owner that
//! was merely late finds the word changed, and watches from then on, so two
//! never rotate at once. The seed's robust mutex would need the dead
//! owner's unlock to be noticed by a thread blocked in `lock`, and a
//! process stopped with the mutex held (SIGSTOP, a debugger) blocks every
//! rotator forever; a lease needs no lock at all and `can_send` is one
//! relaxed load of the same word. An owner that stops cleanly (engine
//! dropped) hands the lease back with slot 2 (all open), so the next
//! watcher takes it at its next look.
//!
//! Trust: the file is refused unless it is a regular file owned by this
//! user that nobody else may write, of this format (magic, version, type,
//! layout); a slot value outside 0..=2 opens every priority. A process of
//! the same user can still stall the rotation or truncate the file (the
//! mapping would fault); it could equally signal this process, so the
//! file is trusted as far as the user is.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tent_rings::Priority;
use tent_rings::region::{Region, RegionError, RegionType};

use super::SendGate;
use crate::error::{Error, Result};

/// The slot file's format (its region's first layout word).
pub const SLOT_FORMAT: u64 = 1;
/// Payload bytes: the lease word, the interval, the owner's pid.
const PAYLOAD_LEN: usize = 64;

/// The slot file's payload.
#[repr(C)]
struct SlotPayload {
    lease: AtomicU64,
    /// The rotation interval in ns every participant must share.
    interval_ns: AtomicU64,
    /// The current owner's pid (for messages only: never trusted).
    owner_pid: AtomicU32,
    _pad: AtomicU32,
    /// Takeovers so far (for messages and tests).
    takeovers: AtomicU64,
}
const _: () = assert!(size_of::<SlotPayload>() <= PAYLOAD_LEN);

const BEAT_BITS: u32 = 30;
const BEAT_MASK: u64 = (1 << BEAT_BITS) - 1;

/// The lease word, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease(u64);

impl Lease {
    fn new(owner: u32, beat: u64, slot: u8) -> Lease {
        Lease(u64::from(owner) << 32 | (beat & BEAT_MASK) << 2 | u64::from(slot & 3))
    }

    /// The participant rotating (0: nobody).
    pub fn owner(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// Rotations so far (wraps at 2^30).
    pub fn beat(self) -> u64 {
        self.0 >> 2 & BEAT_MASK
    }

    /// The slot (a value outside 0..=2, written by nobody honest, opens
    /// every priority: see [`allows`]).
    pub fn slot(self) -> u8 {
        (self.0 & 3) as u8
    }

    /// The word after `owner`'s next rotation.
    fn rotated_by(self, owner: u32) -> Lease {
        let next = match self.slot() {
            0 => 1,
            1 => 2,
            _ => 0,
        };
        Lease::new(owner, self.beat() + 1, next)
    }

    /// The word an owner leaves behind when it stops: nobody rotates,
    /// everything may send.
    fn released(self) -> Lease {
        Lease::new(0, self.beat() + 1, 2)
    }
}

/// May work of priority `p` be posted in `slot`? Slot 0: HIGH; 1: HIGH
/// and MEDIUM; 2 (and the invalid 3): all.
#[inline]
pub fn allows(slot: u8, p: Priority) -> bool {
    p.index() <= usize::from(slot)
}

/// One participant's view of a slot file: the gate its workers ask.
#[derive(Debug)]
pub struct SlotClock {
    region: Region,
    path: PathBuf,
    interval: Duration,
    /// This participant's lease id (random, non-zero).
    me: u32,
}

impl SlotClock {
    /// Join (or create) the slot file `name` (`/name` → `/dev/shm/name`)
    /// rotating every `interval`.
    ///
    /// # Errors
    /// `InvalidArgument` naming the path when the file cannot be used: not
    /// this format or version (another program's, an older tent's: remove
    /// it or pick another `shared_quota_shm_path`), not this user's, or
    /// rotated by a live process at another interval.
    pub fn open(name: &str, interval: Duration) -> Result<SlotClock> {
        let interval_ns = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
        // A name, never a path: the file lies directly in /dev/shm.
        if !crate::config::is_shm_name(name) {
            return Err(Error::invalid(format!(
                "shared_quota_shm_path {name:?}: not a shared-memory name like /tent_slots"
            )));
        }
        let file = &name[1..];
        let (region, created) = Region::open_or_create_shm(
            file,
            RegionType::SlotClock,
            [SLOT_FORMAT, PAYLOAD_LEN as u64, 0, 0],
            PAYLOAD_LEN,
        )
        .map_err(|e| refused(name, e))?;
        let path = region
            .path()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from(name));
        let me = loop {
            let id = u32::from_le_bytes(
                crate::control::auth::nonce()[..4]
                    .try_into()
                    .expect("four bytes"),
            );
            if id != 0 {
                break id;
            }
        };
        let clock = SlotClock {
            region,
            path,
            interval,
            me,
        };
        let p = clock.payload();
        if created {
            // Release: a joiner reading the lease sees the interval.
            p.interval_ns.store(interval_ns, Ordering::Relaxed);
            p.lease.store(Lease::new(0, 0, 2).0, Ordering::Release);
        } else {
            let theirs = p.interval_ns.load(Ordering::Acquire);
            if theirs != interval_ns {
                let lease = clock.lease();
                let pid = p.owner_pid.load(Ordering::Relaxed);
                if lease.owner() != 0 && pid_alive(pid) {
                    return Err(Error::invalid(format!(
                        "slot file {}: rotated every {} us by pid {pid}, this engine's \
                         slot_rotation_interval_ms is {} us; every process sharing a slot \
                         file must use the same interval",
                        clock.path.display(),
                        theirs / 1_000,
                        interval_ns / 1_000
                    )));
                }
                // Nobody rotates it (a stale file from an earlier run): ours.
                tracing::info!(path = %clock.path.display(), old_us = theirs / 1_000,
                    new_us = interval_ns / 1_000, "slot file: stale interval replaced");
                p.interval_ns.store(interval_ns, Ordering::Release);
            }
        }
        Ok(clock)
    }

    fn payload(&self) -> &SlotPayload {
        // SAFETY: the region's payload is PAYLOAD_LEN bytes (checked at open), 128-byte aligned, all atomics, mapped as long as `self` lives.
        unsafe { &*self.region.payload_ptr().cast::<SlotPayload>() }
    }

    /// The lease word now.
    pub fn lease(&self) -> Lease {
        Lease(self.payload().lease.load(Ordering::Acquire))
    }

    /// The slot now.
    pub fn slot(&self) -> u8 {
        self.lease().slot()
    }

    /// Does this participant rotate the clock now?
    pub fn is_owner(&self) -> bool {
        self.lease().owner() == self.me
    }

    /// Takeovers recorded in the file (every participant's).
    pub fn takeovers(&self) -> u64 {
        self.payload().takeovers.load(Ordering::Relaxed)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The rotation interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Swap the lease from `from` to `to`; the word found otherwise.
    fn swap(&self, from: Lease, to: Lease) -> std::result::Result<(), Lease> {
        // AcqRel: the new owner's pid store and the interval read are
        // ordered with the word other participants read.
        self.payload()
            .lease
            .compare_exchange(from.0, to.0, Ordering::AcqRel, Ordering::Acquire)
            .map(drop)
            .map_err(Lease)
    }

    /// Hand the lease back if this participant holds it.
    fn release(&self) {
        let now = self.lease();
        if now.owner() == self.me {
            let _ = self.swap(now, now.released());
        }
    }
}

impl SendGate for SlotClock {
    #[inline]
    fn can_send(&self, p: Priority) -> bool {
        // One relaxed load: a slot seen a moment late only shifts one
        // slice across a slot boundary.
        allows((self.payload().lease.load(Ordering::Relaxed) & 3) as u8, p)
    }

    fn recheck_after(&self) -> Duration {
        // A closed lane looks again within an eighth of a slot.
        (self.interval / 8).max(Duration::from_micros(50))
    }
}

fn refused(name: &str, e: RegionError) -> Error {
    let hint = match e {
        RegionError::BadMagic { .. }
        | RegionError::Version { .. }
        | RegionError::WrongType { .. }
        | RegionError::Layout { .. }
        | RegionError::TooSmall { .. } => {
            "not a tent slot file of this version (a stale file of another program or \
             release): remove it, or set another transports/rdma/shared_quota_shm_path"
        }
        RegionError::Foreign { .. } => "remove it, or set another shared_quota_shm_path",
        _ => "cannot open the slot file",
    };
    Error::invalid(format!("shared_quota_shm_path {name:?}: {hint}")).with_source(e)
}

/// Is `pid` a live process? (`kill(pid, 0)`: `EPERM` is alive too; pid 0,
/// or a pid in another namespace that happens to be free here, reads as
/// dead, which at worst lets a new interval replace a live one's.)
fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks whether the process exists.
    let found = unsafe { libc::kill(pid, 0) } == 0;
    found || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The thread that keeps a participant's share of the clock: it rotates
/// while it owns the lease and watches otherwise. Dropping it stops and
/// joins the thread and hands the lease back.
#[derive(Debug)]
pub struct SlotRotator {
    clock: Arc<SlotClock>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl SlotRotator {
    /// Start the thread for `clock`.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn start(clock: Arc<SlotClock>) -> Result<SlotRotator> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("tent-slots".into())
            .spawn({
                let (clock, stop) = (clock.clone(), stop.clone());
                move || rotate(&clock, &stop)
            })
            .map_err(|e| Error::invalid("slot clock thread").with_source(e))?;
        Ok(SlotRotator {
            clock,
            stop,
            thread: Some(thread),
        })
    }

    /// The clock it keeps.
    pub fn clock(&self) -> &Arc<SlotClock> {
        &self.clock
    }
}

impl Drop for SlotRotator {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        self.clock.release();
    }
}

/// Sleep until `until` or a stop; `false` once stopped.
fn nap_until(stop: &AtomicBool, until: Instant) -> bool {
    loop {
        if stop.load(Ordering::Acquire) {
            return false;
        }
        let now = Instant::now();
        if now >= until {
            return true;
        }
        std::thread::park_timeout(until - now);
    }
}

enum Role {
    Owner { next: Instant },
    Watcher { seen: Lease, since: Instant },
}

fn rotate(clock: &SlotClock, stop: &AtomicBool) {
    // Slots of a millisecond want wake-ups within microseconds, not the
    // default 50 us timer slack.
    // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    let interval = clock.interval;
    let look = (interval / 4).max(Duration::from_micros(50));
    let silent = interval + interval / 4;
    let p = clock.payload();
    let mut role = Role::Watcher {
        seen: clock.lease(),
        since: Instant::now(),
    };
    loop {
        match role {
            Role::Owner { next } => {
                if !nap_until(stop, next) {
                    return;
                }
                let cur = clock.lease();
                let now = Instant::now();
                let lost = if cur.owner() != clock.me {
                    Some(cur)
                } else {
                    clock.swap(cur, cur.rotated_by(clock.me)).err()
                };
                if let Some(cur) = lost {
                    tracing::info!(path = %clock.path.display(), owner = cur.owner(),
                        "slot clock: lease taken over by another participant; watching");
                    role = Role::Watcher {
                        seen: cur,
                        since: now,
                    };
                    continue;
                }
                // Fixed boundaries; a tick overslept by more than a slot
                // is not made up with a burst of rotations.
                let mut next = next + interval;
                if next < now {
                    next = now + interval;
                }
                role = Role::Owner { next };
            }
            Role::Watcher { seen, since } => {
                if !nap_until(stop, Instant::now() + look) {
                    return;
                }
                let cur = clock.lease();
                let now = Instant::now();
                let vacant = cur.owner() == 0;
                if vacant || (cur == seen && now - since >= silent) {
                    match clock.swap(cur, cur.rotated_by(clock.me)) {
                        Ok(()) => {
                            p.owner_pid.store(std::process::id(), Ordering::Relaxed);
                            if !vacant {
                                p.takeovers.fetch_add(1, Ordering::Relaxed);
                                tracing::warn!(path = %clock.path.display(), from = cur.owner(),
                                silent_us = (now - since).as_micros() as u64,
                                "slot clock: owner silent; took over rotation");
                            }
                            role = Role::Owner {
                                next: now + interval,
                            };
                        }
                        Err(found) => {
                            role = Role::Watcher {
                                seen: found,
                                since: now,
                            }
                        }
                    }
                } else if cur != seen {
                    role = Role::Watcher {
                        seen: cur,
                        since: now,
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(tag: &str) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        format!(
            "/tent-slots-unit-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )
    }

    struct Cleanup(String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ =
                std::fs::remove_file(tent_rings::region::shm_path(self.0.trim_start_matches('/')));
        }
    }

    #[test]
    fn slots_allow_what_the_seed_says() {
        use Priority::*;
        assert!(allows(0, High) && !allows(0, Medium) && !allows(0, Low));
        assert!(allows(1, High) && allows(1, Medium) && !allows(1, Low));
        assert!(allows(2, High) && allows(2, Medium) && allows(2, Low));
        assert!(allows(3, Low), "a value nobody honest writes opens all");
        let l = Lease::new(7, BEAT_MASK, 2);
        let r = l.rotated_by(9);
        assert_eq!((r.owner(), r.beat(), r.slot()), (9, 0, 0));
        assert_eq!(r.rotated_by(9).slot(), 1);
        assert_eq!(Lease::new(1, 1, 3).rotated_by(1).slot(), 0);
        let gone = r.released();
        assert_eq!((gone.owner(), gone.slot()), (0, 2));
    }

    #[test]
    #[cfg_attr(miri, ignore = "/dev/shm file")]
    fn one_rotator_cycles_the_slots_and_a_joiner_only_watches() {
        let n = name("cycle");
        let _c = Cleanup(n.clone());
        let iv = Duration::from_millis(5);
        let a = SlotRotator::start(Arc::new(SlotClock::open(&n, iv).unwrap())).unwrap();
        let b = SlotRotator::start(Arc::new(SlotClock::open(&n, iv).unwrap())).unwrap();
        let mut seen = [false; 3];
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(300) {
            seen[usize::from(a.clock().slot().min(2))] = true;
            std::thread::sleep(Duration::from_micros(300));
        }
        assert_eq!(seen, [true; 3]);
        assert!(
            a.clock().is_owner() ^ b.clock().is_owner(),
            "exactly one owner"
        );
        assert_eq!(a.clock().takeovers(), 0, "a live owner is never taken over");
        // The owner stops cleanly: the other takes over at its next look.
        let (owner, other) = if a.clock().is_owner() { (a, b) } else { (b, a) };
        drop(owner);
        let t0 = Instant::now();
        while !other.clock().is_owner() {
            assert!(t0.elapsed() < Duration::from_secs(2), "no takeover");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "/dev/shm file")]
    fn a_live_rotator_at_another_interval_is_refused_and_a_stale_one_replaced() {
        let n = name("interval");
        let _c = Cleanup(n.clone());
        let a = SlotRotator::start(Arc::new(
            SlotClock::open(&n, Duration::from_millis(2)).unwrap(),
        ))
        .unwrap();
        let t0 = Instant::now();
        while !a.clock().is_owner() {
            assert!(t0.elapsed() < Duration::from_secs(2));
            std::thread::sleep(Duration::from_millis(1));
        }
        let e = SlotClock::open(&n, Duration::from_millis(10)).unwrap_err();
        assert!(e.to_string().contains(&n[1..]), "{e}");
        assert!(e.to_string().contains("same interval"), "{e}");
        drop(a);
        // Nobody rotates it now: a new interval takes the file.
        let c = SlotClock::open(&n, Duration::from_millis(10)).unwrap();
        assert_eq!(c.interval(), Duration::from_millis(10));
    }
}
