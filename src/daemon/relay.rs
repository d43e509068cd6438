//! Bell watches: a thread that waits on many futex words in shared memory
//! at once and acts when one moves. Two uses, one piece of code:
//!
//! - Relays, in the daemon: what wakes a worker when a client bumps a
//!   ring's SQ bell while that worker sleeps. One thread per worker, not
//!   per ring, so the daemon's threads grow with its workers, not with
//!   its clients' rings.
//! - In a client, the completion fds of attached rings: the daemon's
//!   worker bumps a ring's CQ bell (never a descriptor this process
//!   controls), and the watch writes the ring's eventfd.
//!
//! A watch waits on every bell at once (`futex_waitv`, up to 127 bells and
//! its own control word in one call; past that, or on a kernel without
//! it, it looks at the bells every millisecond).
//!
//! A bell is a futex word in memory the client writes: any value may be
//! there. A change from the last value seen is a bump, so none is missed
//! whatever the client writes; a client bumping in a loop costs the hub at
//! most one pass per [`MIN_GAP`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustix::thread::futex;

use crate::doorbell::SharedWord;
use crate::engine::attached::WorkerShared;
use crate::error::{Error, ErrorKind, Result};

/// The shortest gap between two passes that acted on a bell change.
const MIN_GAP: Duration = Duration::from_micros(20);
/// The longest a hub sleeps before it looks again (a backstop: its stop
/// and every change to its bells ring its control word).
const LOOK: Duration = Duration::from_secs(1);
/// How often a hub looks at bells it cannot wait on.
const POLL: Duration = Duration::from_millis(1);
/// Bells one `futex_waitv` waits on, besides the hub's control word (the
/// kernel takes 128 words).
const WAITV_BELLS: usize = 127;

/// What a watch does when its bells move.
pub(super) trait Act: Send + Sync + 'static {
    /// Bells were added: a bump made before they were watched is owed.
    fn fresh(&self, keys: &[u64]);
    /// These bells moved since the last look.
    fn bumped(&self, keys: &[u64]);
}

/// Every worker's hub, made when its first client ring comes.
#[derive(Default)]
pub(super) struct Relays {
    hubs: Mutex<HashMap<usize, Arc<Hub<WakeWorker>>>>,
}

/// A relay's act: wake its worker (a sleeping one, for a bump: an awake
/// worker polls the ring).
pub(super) struct WakeWorker(Arc<WorkerShared>);

impl Act for WakeWorker {
    fn fresh(&self, _keys: &[u64]) {
        self.0.doorbell().ring();
    }

    fn bumped(&self, _keys: &[u64]) {
        if self.0.parked() {
            self.0.doorbell().ring();
        }
    }
}

/// One watch thread and the bells it watches.
pub(super) struct Hub<A: Act> {
    act: A,
    /// Bumped on every change to `bells` or `stop`: the thread waits on it
    /// too.
    control: AtomicU32,
    bells: Mutex<Vec<(u64, SharedWord)>>,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl<A: Act> Hub<A> {
    /// A watch doing `act`, its thread called `name`.
    pub(super) fn start(act: A, name: String) -> Result<Arc<Hub<A>>> {
        let hub = Arc::new(Hub {
            act,
            control: AtomicU32::new(0),
            bells: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        let run = hub.clone();
        let t = std::thread::Builder::new()
            .name(name)
            .spawn(move || run.run())
            .map_err(|e| {
                Error::new(ErrorKind::OutOfMemory, "no thread to watch bells").with_source(e)
            })?;
        *hub.thread.lock() = Some(t);
        Ok(hub)
    }

    /// What it does.
    pub(super) fn act(&self) -> &A {
        &self.act
    }

    /// Watch `bell` under `key`.
    pub(super) fn add(&self, key: u64, bell: SharedWord) {
        self.bells.lock().push((key, bell));
        self.changed();
    }

    /// Stop watching `key`'s bell.
    pub(super) fn remove(&self, key: u64) {
        self.bells.lock().retain(|(k, _)| *k != key);
        self.changed();
    }

    /// Stop the thread and wait for it (not from the thread itself).
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.changed();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl Relays {
    /// Watch `bell` (ring `key`'s) for `worker`.
    pub(super) fn add(&self, key: u64, bell: SharedWord, worker: &Arc<WorkerShared>) -> Result<()> {
        let hub = {
            let mut hubs = self.hubs.lock();
            match hubs.get(&worker.index) {
                Some(h) => h.clone(),
                None => {
                    let hub = Hub::start(
                        WakeWorker(worker.clone()),
                        format!("tentd-relay-{}", worker.index),
                    )?;
                    hubs.insert(worker.index, hub.clone());
                    hub
                }
            }
        };
        hub.add(key, bell);
        Ok(())
    }

    /// Stop watching ring `key`'s bell (on `worker`).
    pub(super) fn remove(&self, key: u64, worker: usize) {
        if let Some(hub) = self.hubs.lock().get(&worker) {
            hub.remove(key);
        }
    }

    /// Stop every hub's thread.
    pub(super) fn stop(&self) {
        let hubs: Vec<Arc<Hub<WakeWorker>>> = self.hubs.lock().drain().map(|(_, h)| h).collect();
        for hub in &hubs {
            hub.stop.store(true, Ordering::Release);
            hub.changed();
        }
        for hub in hubs {
            if let Some(t) = hub.thread.lock().take() {
                let _ = t.join();
            }
        }
    }
}

impl<A: Act> Hub<A> {
    /// Its bells or its stop flag changed: wake the thread to look.
    fn changed(&self) {
        self.control.fetch_add(1, Ordering::Release);
        let _ = futex::wake(&self.control, futex::Flags::PRIVATE, 1);
    }

    fn run(&self) {
        // Each watched bell and the last value seen there.
        let mut seen: Vec<(u64, SharedWord, u32)> = Vec::new();
        let mut acted = Instant::now();
        let mut waitv = true;
        loop {
            let control = self.control.load(Ordering::Acquire);
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let mut fresh: Vec<u64> = Vec::new();
            {
                let bells = self.bells.lock();
                seen.retain(|(k, _, _)| bells.iter().any(|(b, _)| b == k));
                for (key, bell) in bells.iter() {
                    if !seen.iter().any(|(k, _, _)| k == key) {
                        let now = bell.word().load(Ordering::Acquire);
                        seen.push((*key, bell.clone(), now));
                        fresh.push(*key);
                    }
                }
            }
            // A bump made before the bell was watched is covered by one
            // act for it.
            if !fresh.is_empty() {
                self.act.fresh(&fresh);
            }
            if waitv {
                let nap = if seen.len() <= WAITV_BELLS {
                    LOOK
                } else {
                    POLL
                };
                waitv = sleep(&self.control, control, &seen, nap);
            } else {
                // Without futex_waitv: the control word alone is waited
                // on, and the bells looked at every POLL (none: LOOK).
                let nap = if seen.is_empty() { LOOK } else { POLL };
                crate::doorbell::wait_on(&self.control, control, nap);
            }
            let mut bumped: Vec<u64> = Vec::new();
            for (key, bell, last) in seen.iter_mut() {
                let now = bell.word().load(Ordering::Acquire);
                if now != *last {
                    *last = now;
                    bumped.push(*key);
                }
            }
            if !bumped.is_empty() {
                self.act.bumped(&bumped);
                let gap = acted.elapsed();
                if gap < MIN_GAP {
                    std::thread::sleep(MIN_GAP - gap);
                }
                acted = Instant::now();
            }
        }
    }
}

/// Sleep until the control `word` leaves `control`, a bell leaves its
/// last value (the first [`WAITV_BELLS`] of `seen`), or `nap` passes.
/// False when `futex_waitv` cannot be used (no such call in this
/// kernel, or refused): the caller polls from then on.
fn sleep(word: &AtomicU32, control: u32, seen: &[(u64, SharedWord, u32)], nap: Duration) -> bool {
    let mut waits = Vec::with_capacity(seen.len().min(WAITV_BELLS) + 1);
    let mut w = futex::Wait::new();
    w.val = u64::from(control);
    w.uaddr = futex::WaitPtr::new(word.as_ptr().cast());
    w.flags = futex::WaitFlags::SIZE_U32 | futex::WaitFlags::PRIVATE;
    waits.push(w);
    for (_, bell, last) in seen.iter().take(WAITV_BELLS) {
        let mut w = futex::Wait::new();
        w.val = u64::from(*last);
        w.uaddr = futex::WaitPtr::new(bell.word().as_ptr().cast());
        // Shared: the client's process wakes it too.
        w.flags = futex::WaitFlags::SIZE_U32;
        waits.push(w);
    }
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let end = Duration::new(now.tv_sec as u64, now.tv_nsec as u32) + nap;
    let deadline = futex::Timespec {
        tv_sec: end.as_secs() as i64,
        tv_nsec: i64::from(end.subsec_nanos()),
    };
    // The words stay mapped for the call: `seen` holds each bell's
    // region.
    match futex::waitv(
        &waits,
        futex::WaitvFlags::empty(),
        Some(&deadline),
        rustix::time::ClockId::Monotonic,
    ) {
        // Woken, a word moved before the call, the time ran out, a
        // signal: the caller looks either way.
        Ok(_)
        | Err(rustix::io::Errno::AGAIN | rustix::io::Errno::TIMEDOUT | rustix::io::Errno::INTR) => {
            true
        }
        // Anything else would come back at once, every time: a spin.
        Err(e) => {
            tracing::warn!(
                error = %e,
                "tentd: futex_waitv unusable; relays look at client bells every millisecond"
            );
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tent_rings::region::{Region, RegionType};

    /// A bump of a watched bell from another thread ends the sleep long
    /// before its nap (a lost wake-up would run it out); so does a change
    /// of the control word; with neither it sleeps the nap.
    #[test]
    fn a_bell_bump_or_a_control_change_ends_the_sleep() {
        let region = Arc::new(Region::heap(RegionType::Data, [0; 4], 256));
        let bell = SharedWord::new(region, 128).unwrap();
        let control = AtomicU32::new(0);
        let long = Duration::from_secs(20);
        let seen = |b: &SharedWord| vec![(1u64, b.clone(), b.word().load(Ordering::Acquire))];
        let watched = seen(&bell);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                bell.ring();
            });
            let start = Instant::now();
            assert!(sleep(&control, 0, &watched, long));
            assert!(start.elapsed() < long / 2, "woken by the bell");
        });
        let watched = seen(&bell);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                control.fetch_add(1, Ordering::Release);
                let _ = futex::wake(&control, futex::Flags::PRIVATE, 1);
            });
            let start = Instant::now();
            assert!(sleep(&control, 0, &watched, long));
            assert!(start.elapsed() < long / 2, "woken by the control word");
        });
        let start = Instant::now();
        let now = control.load(Ordering::Acquire);
        assert!(sleep(&control, now, &watched, Duration::from_millis(30)));
        assert!(
            start.elapsed() >= Duration::from_millis(25),
            "slept the nap"
        );
    }
}
