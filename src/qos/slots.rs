//! The global time-slot clock (seed 001): processes that name the same
//! `shared_quota_shm_path` share one slot, rotated every
//! `slot_rotation_interval_ms` (slot 0: HIGH only; 1: HIGH and MEDIUM;
//! 2: all), so bulk work in one process leaves windows to latency-bound
//! work in another.
//!
//! The slot memory is shared by every participant (how it is found,
//! handed over and kept alive: [`super::slot_file`]; no process can
//! truncate it, and liveness is a lock, never a pid). It holds one
//! **lease word** and the interval:
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
//! participant watches every quarter interval; a word unchanged for 1.75
//! intervals means the owner is gone (killed, stopped), and the first
//! watcher to swap it becomes the owner: a takeover lands at most two
//! intervals after the owner's last beat (1.75 leaves an owner on a
//! loaded host most of an interval of scheduling delay before it is
//! taken over: at 1.25, 1 ms slots changed hands every few ms on two busy
//! cores). A compare-and-swap on the whole word is the lease: an owner that
//! was merely late finds the word changed, and watches from then on, so two
//! never rotate at once. The seed's robust mutex would need the dead
//! owner's unlock to be noticed by a thread blocked in `lock`, and a
//! process stopped with the mutex held (SIGSTOP, a debugger) blocks every
//! rotator forever; a lease needs no lock at all and `can_send` is one
//! relaxed load of the same word. An owner that stops cleanly (engine
//! dropped) hands the lease back with slot 2 (all open), so the next
//! watcher takes it at its next look.
//!
//! **Work-conserving slots.** Slots 0 and 1 are reserved for the classes
//! they admit only while some participant has work of such a class, or
//! had within the last cycle (three intervals): each participant has a
//! **seat** in the file (its pid and id; a demand word counting its workers
//! with HIGH work in the low half and MEDIUM in the high half, raised and
//! lowered as a worker's first such task arrives and its last finishes;
//! and when each class's work last ended). A priority a slot closes may
//! still send while no seat has work above it, now or within the cycle.
//! - A LOW stream alone on the host runs at full speed: strict slots, the
//!   seed's, cost it two thirds of its throughput with no HIGH work
//!   anywhere to protect (`tent-bench --mode qos`: 14 GB/s alone, 4.3 in
//!   a slot file, over shm).
//! - While HIGH traffic flows (requests less than a cycle apart), the slots
//!   are the seed's: LOW is quiet in slots 0 and 1, so a HIGH request finds
//!   queues below the gate (socket buffers, a NIC's) drained. Releasing
//!   LOW the moment no HIGH request is live would not: over TCP, bytes LOW
//!   had already queued kept HIGH's p99 at 20x its idle figure, against 5x
//!   with the slots held.
//! - Slot 2 belongs to everybody: LOW is never starved by a steady HIGH
//!   load (the seed's guarantee).
//!
//! The owner clears the demand of a seat whose process died (its seat
//! lock is free); a seat of a dead process is claimed again by the next
//! joiner, which clears what it left.
//!
//! ```text
//!  memory: lease | interval | magic | format | seats used | takeovers
//!  seat[0..64]: demand (MEDIUM << 32 | HIGH)
//!               | HIGH's work last ended (ns) | MEDIUM's
//! ```
//!
//! **One interval per group, and a reload moves the group.** The memory
//! holds the interval every participant rotates, watches and holds slots
//! by; a joiner naming another is refused while live participants hold
//! the file. `Engine::reload` of `slot_rotation_interval_ms` writes the
//! new interval there ([`SlotClock::set_interval`]): every participant
//! reads it at its next decision (the owner's next tick, a watcher's next
//! look and its silence limit, the gate's hold and recheck), so the group
//! changes together and never runs two intervals at once. A slot boundary
//! that means one thing in one process and another in the next would
//! leave no common window, and a watcher judging an owner's silence by a
//! shorter interval would take a live owner's lease. The other
//! participants log the change; their own configurations still name the
//! old value, so a process that starts later must name the new one (or
//! wait until every participant has left the file).
//!
//! Trust: a slot value outside 0..=2 opens every priority, an interval
//! outside the configuration's range (1 ms to 60 s) is read as its nearest
//! bound, and the seats looked at are clamped to the table. A process of the same user can
//! still write the memory and stall the rotation (it could equally stop or
//! signal this process); it cannot make a participant fault.

use std::num::NonZeroU64;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tent_rings::Priority;

use super::SendGate;
use super::slot_file::{MEM_LEN, SlotFile};
use crate::error::{Error, Result};
use crate::memfd::Mapping;

/// The slot memory's format. 3: memory handed over a socket, seats held
/// by locks.
pub(crate) const SLOT_FORMAT: u64 = 3;
/// The memory's first word after the lease and interval.
const SLOT_MAGIC: u64 = u64::from_le_bytes(*b"TENTSLOT");
/// Participants one slot file holds at once.
pub(crate) const SEATS: usize = 64;
/// Payload bytes: the header line, then a line per seat.
const PAYLOAD_LEN: usize = 64 * (1 + SEATS);
/// The intervals a participant reads from the memory: the range of
/// `slot_rotation_interval_ms`, whatever another process wrote.
const MIN_INTERVAL_NS: u64 = 1_000_000;
const MAX_INTERVAL_NS: u64 = 60_000_000_000;
/// A seat's demand word: one HIGH worker, one MEDIUM worker.
const HIGH_UNIT: u64 = 1;
const MEDIUM_UNIT: u64 = 1 << 32;
/// The HIGH half of a demand word.
const HIGH_MASK: u64 = MEDIUM_UNIT - 1;

/// One participant's line: what work it has (who holds it: a lock on
/// the slot file).
#[repr(C, align(64))]
struct Seat {
    /// Workers with HIGH work (low half) and MEDIUM work (high half).
    demand: AtomicU64,
    /// CLOCK_MONOTONIC ns (one clock for every process on the host) at
    /// which HIGH's and MEDIUM's work last ended here.
    ended_ns: [AtomicU64; 2],
}

/// The slot memory.
#[repr(C, align(64))]
struct SlotPayload {
    lease: AtomicU64,
    /// The rotation interval in ns every participant must share.
    interval_ns: AtomicU64,
    /// [`SLOT_MAGIC`] and [`SLOT_FORMAT`], written by its maker.
    magic: AtomicU64,
    format: AtomicU64,
    /// Seats ever claimed (a high-water mark: the gate looks at this many;
    /// clamped to [`SEATS`] when read).
    seats_used: AtomicU32,
    /// Takeovers so far (for messages and tests).
    takeovers: AtomicU64,
    seats: [Seat; SEATS],
}
const _: () = assert!(size_of::<SlotPayload>() <= PAYLOAD_LEN && PAYLOAD_LEN <= MEM_LEN);

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
pub(crate) fn allows(slot: u8, p: Priority) -> bool {
    p.index() <= usize::from(slot)
}

/// One participant's view of a slot file: the gate its workers ask.
/// Dropping it gives its seat back.
#[derive(Debug)]
pub struct SlotClock {
    /// This participant's lease id (random, non-zero).
    me: u32,
    /// Its place in the slot file: seat, memory, socket, locks.
    file: SlotFile,
}

impl SlotClock {
    /// Join (or create) the slot file `name` (`/name` → `/dev/shm/name`)
    /// rotating every `interval`. A clock must be kept by a
    /// [`SlotRotator`]: its thread is what hands the memory to later
    /// joiners (a clock without one would make them time out).
    ///
    /// # Errors
    /// `InvalidArgument` naming the path when the file cannot be used: not
    /// this user's, or writable by others; memory of another format (a
    /// participant of another tent release); every seat held; or rotated
    /// by live processes at another interval. `Timeout` when participants
    /// hold the file but none handed its memory over (all stopped).
    pub(crate) fn open(name: &str, interval: Duration) -> Result<SlotClock> {
        let interval_ns = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
        // A name, never a path: the file lies directly in /dev/shm.
        if !crate::config::is_shm_name(name) {
            return Err(Error::invalid(format!(
                "shared_quota_shm_path {name:?}: not a shared-memory name like /tent_slots"
            )));
        }
        let init = |m: &Mapping| {
            let p = payload_of(m);
            p.magic.store(SLOT_MAGIC, Ordering::Relaxed);
            p.format.store(SLOT_FORMAT, Ordering::Relaxed);
            p.interval_ns.store(interval_ns, Ordering::Relaxed);
            // Release: whoever reads the lease sees the rest.
            p.lease.store(Lease::new(0, 0, 2).0, Ordering::Release);
        };
        let check = |m: &Mapping| {
            let p = payload_of(m);
            if p.magic.load(Ordering::Acquire) != SLOT_MAGIC
                || p.format.load(Ordering::Acquire) != SLOT_FORMAT
            {
                return Err(Error::invalid(format!(
                    "shared_quota_shm_path {name:?}: its participants' memory is not a tent slot \
                     clock of format {SLOT_FORMAT}"
                )));
            }
            Ok(())
        };
        let file = SlotFile::join(&name[1..], SEATS, SLOT_FORMAT, &init, &check)?;
        let clock = SlotClock {
            me: crate::control::auth::random_nonzero_u64().get() as u32 | 1,
            file,
        };
        let p = clock.payload();
        let theirs = p.interval_ns.load(Ordering::Acquire);
        if theirs != interval_ns {
            // The memory lives only while a participant holds it: this is
            // a live process's interval.
            let pid = clock.file.handed_by();
            let by = if pid > 0 {
                format!("pid {pid}")
            } else {
                "a process in another pid namespace".to_owned()
            };
            return Err(Error::invalid(format!(
                "slot file {}: rotated every {} us by live participants (handed over by {by}), \
                 this engine's slot_rotation_interval_ms is {} us; every process sharing a slot \
                 file must use the same interval",
                clock.path().display(),
                theirs / 1_000,
                interval_ns / 1_000
            )));
        }
        // What a dead holder of this seat left is cleared before this
        // participant raises anything.
        let seat = &p.seats[clock.file.seat()];
        seat.demand.store(0, Ordering::Release);
        for e in &seat.ended_ns {
            e.store(0, Ordering::Relaxed);
        }
        p.seats_used
            .fetch_max(clock.file.seat() as u32 + 1, Ordering::AcqRel);
        tracing::info!(path = %clock.path().display(), seat = clock.seat(),
            created = clock.file.created(), interval_us = interval_ns / 1_000,
            "slot file: joined");
        Ok(clock)
    }

    fn payload(&self) -> &SlotPayload {
        payload_of(self.file.memory())
    }

    /// Its seat.
    fn seat(&self) -> usize {
        self.file.seat()
    }

    /// Seats to look at: the high-water mark, never past the table.
    fn seats(&self) -> &[Seat] {
        let p = self.payload();
        let used = (p.seats_used.load(Ordering::Acquire) as usize).min(SEATS);
        &p.seats[..used]
    }

    /// Seats (this participant's included) whose work closes slots to `p`
    /// at `now`: work above `p` live, or ended within the last cycle.
    pub fn busy_seats(&self, p: Priority, now: u64) -> usize {
        let hold = self.hold_ns();
        self.seats()
            .iter()
            .filter(|s| holds(s, p, now, hold))
            .count()
    }

    /// How long a class's ended work keeps its slots: one cycle (three
    /// intervals) of the group's interval now.
    #[inline]
    fn hold_ns(&self) -> u64 {
        self.interval_ns().saturating_mul(3)
    }

    /// The group's interval in ns now (see the module notes), within
    /// the configuration's range.
    #[inline]
    fn interval_ns(&self) -> u64 {
        // Relaxed: a value, not a publication; a participant that reads
        // the old one a moment longer decides one more time by it.
        self.payload()
            .interval_ns
            .load(Ordering::Relaxed)
            .clamp(MIN_INTERVAL_NS, MAX_INTERVAL_NS)
    }

    /// Make `interval` the group's rotation interval (`Engine::reload`):
    /// every participant, this one included, decides by it from its next
    /// decision on (see the module notes). Returns the interval it
    /// replaces.
    pub(crate) fn set_interval(&self, interval: Duration) -> Duration {
        let ns = u64::try_from(interval.as_nanos())
            .unwrap_or(u64::MAX)
            .clamp(MIN_INTERVAL_NS, MAX_INTERVAL_NS);
        let before = self.interval();
        self.payload().interval_ns.store(ns, Ordering::Relaxed);
        tracing::info!(path = %self.path().display(), from_us = before.as_micros() as u64,
            to_us = ns / 1_000, "slot file: rotation interval changed for every participant");
        before
    }
}

/// Does `seat` keep the slots that close to `p` closed at `now`, ended
/// work holding them for `hold_ns`?
#[inline]
fn holds(seat: &Seat, p: Priority, now: u64, hold_ns: u64) -> bool {
    let above = match p {
        Priority::High => return false,
        Priority::Medium => 1,
        Priority::Low => 2,
    };
    seat.demand.load(Ordering::Relaxed) & demand_mask(p) != 0
        || seat.ended_ns[..above]
            .iter()
            .any(|e| now < e.load(Ordering::Relaxed).saturating_add(hold_ns))
}

impl SlotClock {
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
    pub(crate) fn path(&self) -> &Path {
        self.file.path()
    }

    /// Hand the memory to joiners waiting on this participant (its
    /// keeper's duty, a few times a slot); never waits.
    fn serve_joiners(&self) -> usize {
        self.file.serve()
    }

    /// The group's rotation interval now: the one it was opened with,
    /// unless a participant's reload changed it since.
    pub fn interval(&self) -> Duration {
        Duration::from_nanos(self.interval_ns())
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

impl Drop for SlotClock {
    fn drop(&mut self) {
        // Its workers are gone (they hold the clock): no demand is left.
        // The seat's lock goes with the file, after this.
        self.payload().seats[self.seat()]
            .demand
            .store(0, Ordering::Release);
    }
}

/// The memory as the slot payload.
fn payload_of(m: &Mapping) -> &SlotPayload {
    assert!(m.len() >= PAYLOAD_LEN, "slot memory of {} bytes", m.len());
    // SAFETY: every mapping of slot memory is MEM_LEN >= PAYLOAD_LEN bytes (checked before mapping), page aligned, all atomics, mapped as long as `m` lives.
    unsafe { &*m.ptr().cast::<SlotPayload>() }
}

/// Demand bits that close a slot to `p`: work of a class above it.
#[inline]
fn demand_mask(p: Priority) -> u64 {
    match p {
        Priority::High => 0,
        Priority::Medium => HIGH_MASK,
        Priority::Low => u64::MAX,
    }
}

/// The owner's round: a seat whose process died with demand raised would
/// close slots 0 and 1 to lower classes for good (strict slots, no worse
/// than the seed's); its demand is cleared. The seat's lock is held while
/// its demand is cleared, so a joiner cannot claim it in between and lose
/// its first raise. Returns the seats cleared.
fn sweep(clock: &SlotClock) -> usize {
    let mut cleared = 0;
    for (i, seat) in clock.seats().iter().enumerate() {
        if seat.demand.load(Ordering::Relaxed) == 0 {
            continue;
        }
        if let Some(_held) = clock.file.hold_vacant(i) {
            seat.demand.store(0, Ordering::Release);
            for e in &seat.ended_ns {
                e.store(0, Ordering::Relaxed);
            }
            cleared += 1;
        }
    }
    cleared
}

impl SendGate for SlotClock {
    #[inline]
    fn can_send(&self, p: Priority, now: u64) -> bool {
        // One relaxed load while the slot admits `p`: a slot seen a moment
        // late only shifts one slice across a slot boundary.
        let slot = (self.payload().lease.load(Ordering::Relaxed) & 3) as u8;
        if allows(slot, p) {
            return true;
        }
        // Closed to `p`: reserved only while some participant has work
        // above it, or had within the cycle (a line per seat in use, which
        // changes only when a worker's first or last such task comes or
        // goes).
        let hold = self.hold_ns();
        !self.seats().iter().any(|s| holds(s, p, now, hold))
    }

    fn demand(&self, p: Priority, busy: bool) {
        let (unit, k) = match p {
            Priority::High => (HIGH_UNIT, 0),
            Priority::Medium => (MEDIUM_UNIT, 1),
            Priority::Low => return,
        };
        let seat = &self.payload().seats[self.seat()];
        // Release: a LOW worker that sees the demand sees it after the
        // request that raised it was accepted.
        if busy {
            seat.demand.fetch_add(unit, Ordering::Release);
        } else {
            // The end first: a reader that sees the count drop sees the
            // hold that follows it.
            seat.ended_ns[k].fetch_max(crate::clock::monotonic_ns(), Ordering::Relaxed);
            seat.demand.fetch_sub(unit, Ordering::Release);
        }
    }

    fn recheck_after(&self) -> Duration {
        // A closed lane looks again within an eighth of a slot.
        (self.interval() / 8).max(Duration::from_micros(50))
    }
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
    pub(crate) fn start(clock: Arc<SlotClock>) -> Result<SlotRotator> {
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
    pub(crate) fn clock(&self) -> &Arc<SlotClock> {
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

/// How often a keeper looks for joiners at the latest.
const SERVE_EVERY: Duration = Duration::from_millis(5);

/// Sleep until `until`, a stop, or a change of the group's interval from
/// `interval`, handing the memory to joiners at least every
/// [`SERVE_EVERY`] (which is also how soon a change is seen).
fn nap_until(clock: &SlotClock, stop: &AtomicBool, until: Instant, interval: Duration) -> Nap {
    loop {
        if stop.load(Ordering::Acquire) {
            return Nap::Stop;
        }
        clock.serve_joiners();
        if clock.interval() != interval {
            return Nap::Changed;
        }
        let now = Instant::now();
        if now >= until {
            return Nap::Due;
        }
        std::thread::park_timeout((until - now).min(SERVE_EVERY));
    }
}

/// How a [`nap_until`] ended.
#[derive(Debug, PartialEq, Eq)]
enum Nap {
    /// The rotator is stopping.
    Stop,
    /// The time came.
    Due,
    /// The group's interval changed (a reload somewhere): decide anew.
    Changed,
}

enum Role {
    Owner {
        next: Instant,
    },
    /// `limit`: how long `seen` may stay before its owner counts as
    /// silent.
    Watcher {
        seen: Lease,
        since: Instant,
        limit: Duration,
    },
}

/// How long a lease may stay unchanged before a watcher takes it: seven
/// quarters of the interval.
fn silence_limit(interval: Duration) -> Duration {
    interval + interval * 3 / 4
}

fn rotate(clock: &SlotClock, stop: &AtomicBool) {
    // Slots of a millisecond want wake-ups within microseconds, not the
    // default 50 us timer slack.
    // PR_SET_TIMERSLACK only changes this thread's timer slack.
    let _ = rustix::thread::set_current_timer_slack(NonZeroU64::new(1));
    let mut interval = clock.interval();
    let p = clock.payload();
    let mut role = Role::Watcher {
        seen: clock.lease(),
        since: Instant::now(),
        limit: silence_limit(interval),
    };
    loop {
        // The group's interval as of this step: a reload anywhere in the
        // group applies from the next tick or look.
        let now_iv = clock.interval();
        if now_iv != interval {
            crate::lograte::info_limited!(("slot interval", clock.path()),
                path = %clock.path().display(), from_us = interval.as_micros() as u64,
                to_us = now_iv.as_micros() as u64, "slot clock: the group's rotation interval changed");
            role = match role {
                // The owner's next tick comes no later than the new
                // interval after its last one.
                Role::Owner { next } => Role::Owner {
                    next: next
                        .checked_sub(interval)
                        .map_or(next, |last| next.min(last + now_iv)),
                },
                // The owner may still sleep toward a tick set by the old
                // interval until its nap notices the change (within
                // SERVE_EVERY): judge its silence from now, by the longer
                // of the two limits, until its next tick.
                Role::Watcher { seen, .. } => Role::Watcher {
                    seen,
                    since: Instant::now(),
                    limit: silence_limit(interval).max(silence_limit(now_iv)) + SERVE_EVERY,
                },
            };
            interval = now_iv;
        }
        let look = (interval / 4).max(Duration::from_micros(50));
        match role {
            Role::Owner { next } => {
                match nap_until(clock, stop, next, interval) {
                    Nap::Stop => return,
                    Nap::Changed => continue,
                    Nap::Due => {}
                }
                let cur = clock.lease();
                let now = Instant::now();
                let lost = if cur.owner() != clock.me {
                    Some(cur)
                } else {
                    clock.swap(cur, cur.rotated_by(clock.me)).err()
                };
                if let Some(cur) = lost {
                    tracing::info!(path = %clock.path().display(), owner = cur.owner(),
                        "slot clock: lease taken over by another participant; watching");
                    role = Role::Watcher {
                        seen: cur,
                        since: now,
                        limit: silence_limit(interval),
                    };
                    continue;
                }
                let cleared = sweep(clock);
                if cleared > 0 {
                    tracing::warn!(path = %clock.path().display(), seats = cleared,
                        "slot file: cleared the HIGH/MEDIUM demand of seats whose process died");
                }
                // Fixed boundaries; a tick overslept by more than a slot
                // is not made up with a burst of rotations.
                let mut next = next + interval;
                if next < now {
                    next = now + interval;
                }
                role = Role::Owner { next };
            }
            Role::Watcher { seen, since, limit } => {
                match nap_until(clock, stop, Instant::now() + look, interval) {
                    Nap::Stop => return,
                    Nap::Changed => continue,
                    Nap::Due => {}
                }
                let cur = clock.lease();
                let now = Instant::now();
                let vacant = cur.owner() == 0;
                if vacant || (cur == seen && now - since >= limit) {
                    match clock.swap(cur, cur.rotated_by(clock.me)) {
                        Ok(()) => {
                            if !vacant {
                                p.takeovers.fetch_add(1, Ordering::Relaxed);
                                crate::lograte::warn_limited!(
                                    ("slot takeover", clock.path()),
                                    path = %clock.path().display(), from = cur.owner(),
                                    silent_us = (now - since).as_micros() as u64,
                                    "slot clock: owner silent; took over rotation"
                                );
                            }
                            role = Role::Owner {
                                next: now + interval,
                            };
                        }
                        Err(found) => {
                            role = Role::Watcher {
                                seen: found,
                                since: now,
                                limit: silence_limit(interval),
                            }
                        }
                    }
                } else if cur != seen {
                    role = Role::Watcher {
                        seen: cur,
                        since: now,
                        limit: silence_limit(interval),
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

    /// Removes the lock file and any seat socket left.
    struct Cleanup(String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let path = tent_rings::region::shm_path(self.0.trim_start_matches('/'));
            let _ = std::fs::remove_file(&path);
            for i in 0..SEATS {
                let mut p = path.as_os_str().to_owned();
                p.push(format!(".s{i}"));
                let _ = std::fs::remove_file(p);
            }
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
        // 25 ms: an owner is taken over after 1.75 silent intervals, and a
        // thread of a unit test run on two busy cores was once descheduled
        // past 1.75 x 5 ms (CI, this test at 5 ms).
        let iv = Duration::from_millis(25);
        let a = SlotRotator::start(Arc::new(SlotClock::open(&n, iv).unwrap())).unwrap();
        let b = SlotRotator::start(Arc::new(SlotClock::open(&n, iv).unwrap())).unwrap();
        let mut seen = [false; 3];
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(400) {
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

    /// Open `n` while `members` (without keeper threads) hand over the
    /// memory.
    fn open_beside(n: &str, iv: Duration, members: &[&SlotClock]) -> Result<SlotClock> {
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !done.load(Ordering::Acquire) {
                    for m in members {
                        m.serve_joiners();
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
            });
            let r = SlotClock::open(n, iv);
            done.store(true, Ordering::Release);
            r
        })
    }

    #[test]
    #[cfg_attr(miri, ignore = "/dev/shm file")]
    fn demand_closes_slots_to_lower_classes_only_while_raised_and_dead_seats_come_back() {
        use Priority::*;
        let n = name("seats");
        let _c = Cleanup(n.clone());
        let iv = Duration::from_millis(50);
        let a = SlotClock::open(&n, iv).unwrap();
        let b = open_beside(&n, iv, &[&a]).unwrap();
        assert_ne!(a.seat(), b.seat());
        let set_slot = |slot| {
            a.payload()
                .lease
                .store(Lease::new(0, 0, slot).0, Ordering::Relaxed)
        };
        assert_eq!(b.lease(), a.lease(), "one memory");
        let now = crate::clock::monotonic_ns;
        // Slot 0, nobody with work: work-conserving, all may send.
        set_slot(0);
        assert!(b.can_send(Low, now()) && b.can_send(Medium, now()));
        // MEDIUM work somewhere: LOW waits, MEDIUM still goes (nothing
        // above it has work).
        a.demand(Medium, true);
        assert!(b.can_send(High, now()) && b.can_send(Medium, now()) && !b.can_send(Low, now()));
        a.demand(High, true);
        assert!(!b.can_send(Medium, now()) && !b.can_send(Low, now()));
        assert_eq!(
            (b.busy_seats(Low, now()), b.busy_seats(Medium, now())),
            (1, 1)
        );
        // Slot 1 admits MEDIUM whatever the demand; slot 2 admits all.
        set_slot(1);
        assert!(b.can_send(Medium, now()) && !b.can_send(Low, now()));
        set_slot(2);
        assert!(b.can_send(Low, now()));
        set_slot(0);
        // The work ends: its slots stay reserved for one cycle (3 x 50 ms).
        a.demand(High, false);
        a.demand(Medium, false);
        let ended = now();
        assert!(!b.can_send(Low, ended + 100_000_000));
        assert!(!b.can_send(Medium, ended + 100_000_000));
        let later = ended + 151_000_000;
        assert!(b.can_send(Low, later) && b.can_send(Medium, later));
        assert_eq!(b.busy_seats(Low, later), 0);

        // A seat left with demand by a process that is gone (its seat lock
        // free, whatever pid it had): the owner's sweep clears it, and a
        // joiner takes the seat again.
        let seat_of_a = a.seat();
        drop(a);
        let seat = &b.payload().seats[seat_of_a];
        assert_eq!(
            seat.demand.load(Ordering::Relaxed),
            0,
            "dropping lowers the demand"
        );
        seat.demand.store(HIGH_UNIT, Ordering::Relaxed);
        assert!(!b.can_send(Low, later));
        assert_eq!(sweep(&b), 1);
        assert!(b.can_send(Low, later));
        assert_eq!(sweep(&b), 0, "nothing left to clear");
        // A live seat's demand is never cleared.
        b.demand(High, true);
        assert_eq!(sweep(&b), 0);
        b.demand(High, false);
        seat.demand.store(HIGH_UNIT, Ordering::Relaxed);
        seat.ended_ns[0].store(later, Ordering::Relaxed);
        let c = open_beside(&n, iv, &[&b]).unwrap();
        assert_eq!(c.seat(), seat_of_a, "the vacant seat is claimed again");
        assert!(
            b.can_send(Low, later + 151_000_000),
            "and what it left cleared"
        );
    }

    /// A reload in one participant moves the group: another participant's
    /// next decisions (the hold of ended work, the recheck, what a joiner
    /// must name) follow the new interval; the simulated `now` shows the
    /// hold decision on both sides of the new cycle.
    #[test]
    #[cfg_attr(miri, ignore = "/dev/shm file")]
    fn a_reloaded_interval_applies_to_every_participant_at_its_next_decision() {
        use Priority::*;
        let n = name("reload");
        let _c = Cleanup(n.clone());
        let iv = Duration::from_millis(50);
        let a = SlotClock::open(&n, iv).unwrap();
        let b = open_beside(&n, iv, &[&a]).unwrap();
        a.payload()
            .lease
            .store(Lease::new(0, 0, 0).0, Ordering::Relaxed);
        a.demand(High, true);
        a.demand(High, false);
        let ended = crate::clock::monotonic_ns();
        // A cycle of 3 x 50 ms holds slot 0 for HIGH.
        assert!(!b.can_send(Low, ended + 40_000_000));
        assert_eq!(b.recheck_after(), Duration::from_micros(6_250));
        assert_eq!(a.set_interval(Duration::from_millis(10)), iv);
        // The next decision in the other participant: a 30 ms cycle.
        assert_eq!(b.interval(), Duration::from_millis(10));
        assert!(!b.can_send(Low, ended + 29_000_000));
        assert!(b.can_send(Low, ended + 31_000_000));
        assert_eq!(b.busy_seats(Low, ended + 31_000_000), 0);
        assert_eq!(b.recheck_after(), Duration::from_micros(1_250));
        // A joiner must name the group's interval now.
        let e = open_beside(&n, iv, &[&a, &b]).unwrap_err();
        assert!(e.to_string().contains("rotated every 10000 us"), "{e}");
        let c = open_beside(&n, Duration::from_millis(10), &[&a, &b]).unwrap();
        assert_eq!(c.interval(), Duration::from_millis(10));
        // Out of the configuration's range in the memory: its bound.
        a.payload().interval_ns.store(0, Ordering::Relaxed);
        assert_eq!(c.interval(), Duration::from_millis(1));
    }

    /// A reload that shortens the interval while the owner sleeps toward a
    /// tick set by the old one: the owner wakes and rotates at the new
    /// pace, and no watcher takes the live owner's lease for "silence"
    /// judged by the new, shorter limit (before: a takeover within the
    /// first look).
    #[test]
    #[cfg_attr(miri, ignore = "/dev/shm file")]
    fn a_shorter_reloaded_interval_moves_the_owner_and_no_watcher_takes_its_lease() {
        let n = name("shrink");
        let _c = Cleanup(n.clone());
        let iv = Duration::from_secs(2);
        let a = SlotRotator::start(Arc::new(SlotClock::open(&n, iv).unwrap())).unwrap();
        let b = SlotRotator::start(Arc::new(open_beside(&n, iv, &[a.clock()]).unwrap())).unwrap();
        // One of them takes the vacant lease at its first look.
        let start = Instant::now();
        while a.clock().lease().owner() == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "nobody took the lease"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let takeovers = || a.clock().payload().takeovers.load(Ordering::Relaxed);
        assert_eq!(takeovers(), 0);
        let before = a.clock().lease();
        b.clock().set_interval(Duration::from_millis(50));
        std::thread::sleep(Duration::from_millis(500));
        let after = a.clock().lease();
        assert_eq!(after.owner(), before.owner(), "the lease changed hands");
        assert_eq!(takeovers(), 0, "a watcher took a live owner's lease");
        assert!(
            after.beat() >= before.beat() + 3,
            "the owner still sleeps toward the old 2 s tick: beat {} -> {}",
            before.beat(),
            after.beat()
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "/dev/shm file")]
    fn live_participants_at_another_interval_refuse_and_a_file_nobody_holds_is_fresh() {
        let n = name("interval");
        let _c = Cleanup(n.clone());
        let a = SlotRotator::start(Arc::new(
            SlotClock::open(&n, Duration::from_millis(2)).unwrap(),
        ))
        .unwrap();
        let e = SlotClock::open(&n, Duration::from_millis(10)).unwrap_err();
        assert!(e.to_string().contains(&n[1..]), "{e}");
        assert!(e.to_string().contains("same interval"), "{e}");
        assert!(
            e.to_string()
                .contains(&format!("pid {}", std::process::id())),
            "names the live process that handed the memory over: {e}"
        );
        drop(a);
        // Nobody holds it now: its memory is gone, a new interval is fresh.
        let c = SlotClock::open(&n, Duration::from_millis(10)).unwrap();
        assert_eq!(c.interval(), Duration::from_millis(10));
        assert!(c.file.created());
    }

    /// OFD locks belong to the open file description a fork shares: a
    /// child forked without exec must not keep a departed participant's
    /// member and seat locks (joiners would wait for it and time out).
    #[test]
    #[cfg_attr(miri, ignore = "fork")]
    fn a_forked_child_does_not_keep_a_gone_participants_locks() {
        let n = name("fork");
        let _c = Cleanup(n.clone());
        let iv = Duration::from_millis(2);
        let a = SlotClock::open(&n, iv).unwrap();
        // SAFETY: the child calls only the async-signal-safe sleep and _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: async-signal-safe calls in the forked child.
            unsafe {
                libc::sleep(30);
                libc::_exit(0)
            }
        }
        drop(a);
        let b = SlotClock::open(&n, iv);
        // SAFETY: our own child, killed and reaped.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        let b = b.expect("nobody is there any more: a fresh clock");
        assert!(b.file.created());
    }

    #[test]
    #[cfg_attr(miri, ignore = "/dev/shm file")]
    fn a_removed_seat_socket_is_made_again() {
        let n = name("unlinked");
        let _c = Cleanup(n.clone());
        let iv = Duration::from_millis(2);
        let a = SlotRotator::start(Arc::new(SlotClock::open(&n, iv).unwrap())).unwrap();
        let sock = format!("/dev/shm{n}.s{}", a.clock().seat());
        std::fs::remove_file(&sock).unwrap();
        let b = SlotClock::open(&n, iv).unwrap();
        assert!(!b.file.created(), "joined the live clock");
        assert_eq!(b.lease().owner(), a.clock().lease().owner());
    }

    #[test]
    #[cfg_attr(miri, ignore = "/dev/shm file")]
    fn a_squatted_seat_name_moves_the_joiner_to_the_next_seat() {
        let n = name("squat");
        let _c = Cleanup(n.clone());
        let squat = format!("/dev/shm{n}.s0");
        std::fs::create_dir(&squat).unwrap();
        let iv = Duration::from_millis(2);
        let a = SlotClock::open(&n, iv);
        std::fs::remove_dir(&squat).unwrap();
        assert_eq!(a.unwrap().seat(), 1);
    }

    #[test]
    #[cfg_attr(miri, ignore = "/dev/shm file")]
    fn a_live_participant_of_an_older_release_is_named_not_ignored() {
        let n = name("old");
        let _c = Cleanup(n.clone());
        // What the release before this one made: the file mapped as a
        // region of slot format 2, its creator's pid (ours) in the header.
        let (old, created) = tent_rings::region::Region::open_or_create_shm(
            &n[1..],
            tent_rings::region::RegionType::SlotClock,
            [2, PAYLOAD_LEN as u64, 0, 0],
            PAYLOAD_LEN,
        )
        .unwrap();
        assert!(created);
        let e = SlotClock::open(&n, Duration::from_millis(2)).unwrap_err();
        assert!(e.to_string().contains("older tent release"), "{e}");
        assert!(
            e.to_string().contains(&std::process::id().to_string()),
            "{e}"
        );
        drop(old);
    }

    #[test]
    #[cfg_attr(miri, ignore = "/dev/shm file")]
    fn many_participants_starting_together_form_one_group() {
        let n = name("storm");
        let _c = Cleanup(n.clone());
        let iv = Duration::from_millis(2);
        let k = 16;
        let barrier = std::sync::Barrier::new(k);
        let got: Vec<Result<SlotRotator>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..k)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        SlotRotator::start(Arc::new(SlotClock::open(&n, iv)?))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let errs: Vec<String> = got
            .iter()
            .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
            .collect();
        assert!(errs.is_empty(), "{errs:?}");
        let created = got
            .iter()
            .filter(|r| r.as_ref().unwrap().clock().file.created())
            .count();
        assert_eq!(created, 1, "one memory, made once");
    }
}
