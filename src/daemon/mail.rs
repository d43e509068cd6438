//! An attached engine's notifications. The daemon sends and receives them
//! for its clients on its control plane; a client reaches its own over the
//! socket: `Notify` queues one (a ticket back at once), `NotifyOutcome`
//! asks a ticket's fate, `TakeNotification` takes the oldest that came.
//! Nothing is polled: the daemon bumps a word in the client's mail page
//! when one arrives and when one sent settles, and the client sleeps on
//! that word (a futex both map) between asks; a poll that finds the
//! arrivals word where the last empty take left it asks nothing.
//!
//! A notification attached to a submission is the courier's: a thread of
//! the client, started with the first, that sends each once its
//! submission's tasks completed (the batch API runs in this process, so
//! only this process sees that) and settles the batch with its fate.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tent_rings::{ErrorKind, SegmentId};

use super::batches::ClientBatches;
use super::link::{Link, gone_error};
use super::wire::{Reply, Request};
use crate::doorbell::SharedWord;
use crate::error::{Error, Result};
use crate::notify::{Notification, Received};

/// The longest sleep on a mail word before looking again (a backstop: the
/// daemon bumps the word, and its going wakes every sleeper).
const LOOK: Duration = Duration::from_secs(1);
/// The longest nap of the courier while a submission's data is in flight.
const NAP_MAX: Duration = Duration::from_millis(1);

/// One client's mail: its words, and the courier once started.
pub(crate) struct Post {
    link: Arc<Link>,
    /// Bumped by the daemon when a notification for this client arrives.
    arrived: SharedWord,
    /// Bumped by the daemon when one this client sent settles.
    settled: SharedWord,
    /// The arrivals word when a take last found none (`u64::MAX`: none
    /// found empty yet): until the word moves, there is nothing to ask.
    empty_at: AtomicU64,
    courier: Mutex<Option<Courier>>,
}

struct Courier {
    thread: JoinHandle<()>,
    control: Arc<Control>,
}

/// How the engine tells the courier there is work, or that it stops.
#[derive(Default)]
struct Control {
    kicked: Mutex<bool>,
    cv: Condvar,
    stop: AtomicBool,
}

impl Control {
    fn kick(&self) {
        *self.kicked.lock() = true;
        self.cv.notify_one();
    }
}

impl Post {
    pub(crate) fn new(link: Arc<Link>, arrived: SharedWord, settled: SharedWord) -> Post {
        Post {
            link,
            arrived,
            settled,
            empty_at: AtomicU64::new(u64::MAX),
            courier: Mutex::new(None),
        }
    }

    /// Can `segment`'s owner take `n` from this engine, as far as this
    /// side can tell?
    pub(crate) fn check(segment: SegmentId, n: &Notification) -> Result<()> {
        n.check()?;
        if segment == SegmentId::LOCAL {
            return Err(Error::invalid(
                "SegmentId::LOCAL of an attached engine is its daemon's memory, which takes no \
                 notifications: open the receiver by its segment name",
            ));
        }
        Ok(())
    }

    /// Queue `n` for `segment`'s owner: its ticket.
    fn queue(&self, segment: SegmentId, n: &Notification) -> Result<u64> {
        Self::check(segment, n)?;
        let req = Request::Notify {
            segment: segment.0,
            name: n.name.clone(),
            msg: n.msg.clone(),
        };
        match self.link.ask(&req)? {
            (Reply::Ticket { ticket }, _) => Ok(ticket),
            (other, _) => Err(self.link.desync(&other)),
        }
    }

    /// The fate of `ticket`: `None` while on its way.
    fn outcome(&self, ticket: u64) -> Result<Option<Result<()>>> {
        match self.link.ask(&Request::NotifyOutcome { ticket }) {
            Ok((Reply::Done, _)) => Ok(Some(Ok(()))),
            Ok((Reply::Pending, _)) => Ok(None),
            Ok((other, _)) => Err(self.link.desync(&other)),
            // The link's own failure, or the daemon's word on the message.
            Err(e) if self.link.gone() => Err(e),
            Err(e) => Ok(Some(Err(e))),
        }
    }

    /// As `Engine::send_notification`: returns once delivered.
    pub(crate) fn send(&self, segment: SegmentId, n: &Notification) -> Result<()> {
        let ticket = self.queue(segment, n)?;
        loop {
            let seen = self.settled.word().load(Ordering::Acquire);
            if let Some(r) = self.outcome(ticket)? {
                return r;
            }
            self.settled.wait(seen, LOOK);
        }
    }

    /// The oldest notification waiting; never blocks on the daemon's
    /// behalf (one exchange, none while nothing arrived since the last
    /// empty look).
    pub(crate) fn try_take(&self) -> Option<Received> {
        let now = u64::from(self.arrived.word().load(Ordering::Acquire));
        if self.empty_at.load(Ordering::Relaxed) == now || self.link.gone() {
            return None;
        }
        match self.link.ask(&Request::TakeNotification) {
            Ok((Reply::Note { from, name, msg }, _)) => Some(Received { from, name, msg }),
            Ok((Reply::Pending, _)) => {
                self.empty_at.store(now, Ordering::Relaxed);
                None
            }
            Ok((other, _)) => {
                let _ = self.link.desync(&other);
                None
            }
            Err(_) => None,
        }
    }

    /// Every notification waiting, oldest first.
    pub(crate) fn take_all(&self) -> Vec<Received> {
        std::iter::from_fn(|| self.try_take()).collect()
    }

    /// The oldest notification, waiting up to `timeout` for one.
    pub(crate) fn wait(&self, timeout: Duration) -> Result<Received> {
        let end = Instant::now().checked_add(timeout);
        loop {
            let seen = self.arrived.word().load(Ordering::Acquire);
            if let Some(r) = self.try_take() {
                return Ok(r);
            }
            if self.link.gone() {
                return Err(gone_error());
            }
            let left = match end {
                Some(end) => end.saturating_duration_since(Instant::now()),
                None => LOOK,
            };
            if left.is_zero() {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    "no notification within the wait timeout",
                ));
            }
            self.arrived.wait(seen, left.min(LOOK));
        }
    }

    /// Start the courier if it is not running, and tell it a note came.
    pub(crate) fn courier_for(self: &Arc<Self>, batches: &Arc<ClientBatches>) -> Result<()> {
        let mut c = self.courier.lock();
        if let Some(c) = &*c {
            c.control.kick();
            return Ok(());
        }
        let control = Arc::new(Control::default());
        let (post, b, ctl) = (self.clone(), batches.clone(), control.clone());
        let thread = std::thread::Builder::new()
            .name("tent-courier".into())
            .spawn(move || post.run_courier(&b, &ctl))
            .map_err(|e| {
                Error::new(ErrorKind::OutOfMemory, "the notification courier thread").with_source(e)
            })?;
        *c = Some(Courier { thread, control });
        Ok(())
    }

    /// Stop the courier (the engine is dropped): notes not settled stay
    /// as they are, and the engine's batches go with it.
    pub(crate) fn stop(&self) {
        let c = self.courier.lock().take();
        if let Some(c) = c {
            c.control.stop.store(true, Ordering::Release);
            c.control.kick();
            // It may sleep on the settle word.
            self.settled.ring();
            let _ = c.thread.join();
        }
    }

    /// The courier: send each note once its data landed, ask each sent
    /// one's fate, settle its batch; sleep while nothing moves.
    fn run_courier(&self, batches: &ClientBatches, control: &Control) {
        let mut nap = Duration::from_micros(10);
        // The settle word when the tickets were last asked about: they are
        // asked again only once it moved (or a ticket is new).
        let mut asked_at: Option<u32> = None;
        while !control.stop.load(Ordering::Acquire) {
            if self.link.gone() {
                batches.end_notes();
            }
            let seen = self.settled.word().load(Ordering::Acquire);
            let due = batches.notes_due();
            let mut full = false;
            for (key, segment, note) in &due.send {
                match self.queue(*segment, note) {
                    Ok(ticket) => {
                        batches.note_moved(*key, Ok(ticket));
                        asked_at = None;
                    }
                    // The daemon holds this client's most: the note waits
                    // (queued, as an embedded engine's would be) until
                    // one settles.
                    Err(e) if e.kind() == ErrorKind::SqFull && !self.link.gone() => full = true,
                    Err(e) => batches.note_moved(*key, Err(Err(e.kind()))),
                }
            }
            if asked_at != Some(seen) {
                for &(key, ticket) in &due.ask {
                    match self.outcome(ticket) {
                        Ok(None) => {}
                        Ok(Some(r)) => batches.note_moved(key, Err(r.map_err(|e| e.kind()))),
                        Err(e) => batches.note_moved(key, Err(Err(e.kind()))),
                    }
                }
                asked_at = Some(seen);
            }
            if full {
                self.settled.wait(seen, LOOK);
                continue;
            }
            if due.waiting {
                // Data in flight: look again soon (the batch ring is
                // reaped by whoever looks, this thread included).
                std::thread::sleep(nap);
                nap = (nap * 2).min(NAP_MAX);
                continue;
            }
            nap = Duration::from_micros(10);
            if !due.send.is_empty() || !due.ask.is_empty() {
                self.settled.wait(seen, LOOK);
                continue;
            }
            let mut k = control.kicked.lock();
            while !*k && !control.stop.load(Ordering::Acquire) {
                control.cv.wait_for(&mut k, LOOK);
            }
            *k = false;
        }
    }
}
