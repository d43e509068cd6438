//! The sending side: one lane per peer, each with its own thread.
//!
//! A lane takes its messages in the order they were given. A message
//! attached to a submission waits at the head of its lane until every task
//! of that submission has ended; it is sent only if all completed. Each
//! lane numbers its messages in a stream of its own (a random stream id,
//! sequence numbers from 1), so two lanes to one engine (a peer opened
//! under two names) never collide. Sending reuses the lane's authenticated
//! control connection while messages keep coming (it is closed after
//! 100 ms with none, so an idle lane holds none of the peer's connection
//! slots); when an exchange breaks, the lane reconnects and sends the same
//! (stream, seq) again, and the receiver drops what it already filed, so
//! each message lands once. A refusal from the peer (any `Error` answer
//! but a full inbox) ends the message. A peer whose port refuses
//! connections ([`REFUSALS`] times in a row) is gone, and the message
//! fails instead of waiting out its bound.
//!
//! Each message has a deadline set when it is queued: `default_timeout_ms`
//! after that for a plain one; for an attached one, `default_timeout_ms`
//! after the latest deadline of its submission's requests (by then its
//! data has landed or failed). Every exchange runs under it as one
//! deadline, so a peer dripping bytes cannot stretch it, and messages
//! queued behind a silent peer expire by their own deadlines rather than
//! one after another.
//!
//! Never the worker's business: the lane threads block on sockets and
//! sleep while a submission runs; the workers only finish tasks.

use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tent_rings::ErrorKind;

use super::delivery::Delivery;
use super::inbox::Inbox;
use super::{Notification, Received};
use crate::control::client::{self, NotifyError};
use crate::control::wire::NotifyFrame;
use crate::error::{Error, Result};

/// Connection attempts refused in a row after which the peer counts as
/// gone (its engine no longer listens).
pub(crate) const REFUSALS: u32 = 3;
/// A control connection is replaced after this long: the server ends each
/// connection's exchange after `EXCHANGE_DEADLINE` (5 s).
const CONN_MAX_AGE: Duration = Duration::from_secs(4);
/// An idle lane closes its connection after this long without a message,
/// so it does not hold one of the peer's control slots.
const CONN_IDLE: Duration = Duration::from_millis(100);
/// A lane with no message for this long ends its thread and leaves the
/// map (the next message to that peer starts a new lane, a new stream):
/// an engine that notified many peers over its life keeps no thread for
/// each.
const LANE_IDLE: Duration = Duration::from_secs(10);
/// Longest pause between polls of a submission's tasks.
const MAX_POLL_PAUSE: Duration = Duration::from_millis(1);
/// First and longest pause between retries of a busy or unreachable peer.
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(10);
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Where a lane delivers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Dest {
    /// A peer's control server (`ip:port`).
    Peer(String),
    /// This engine's own inbox (a submission to `SegmentId::LOCAL`).
    Local,
}

/// What a message attached to a submission waits for: `None` while any
/// of its tasks runs; then `Ok` if all completed, else the first failed
/// task and its kind. (Made by the engine over its batch; the outbox knows
/// no batches.)
pub(crate) type After = Box<dyn Fn() -> Option<std::result::Result<(), (usize, ErrorKind)>> + Send>;

struct Job {
    seq: u64,
    note: Notification,
    after: Option<After>,
    /// When it stops being worth sending.
    deadline: Instant,
    delivery: Arc<Delivery>,
}

#[derive(Default)]
struct LaneState {
    jobs: VecDeque<Job>,
    /// The last sequence number given: at enqueue, so the order of the
    /// calls is the order on the wire.
    last_seq: u64,
}

struct LaneShared {
    state: Mutex<LaneState>,
    work: Condvar,
    /// This lane's stream id (random, non-zero), with `seq` the receiver's
    /// dedup key.
    stream: u64,
    /// A handle on the lane's open connection, so `stop` can cut an
    /// exchange short.
    open: Mutex<Option<TcpStream>>,
}

struct Lane {
    shared: Arc<LaneShared>,
    thread: Option<JoinHandle<()>>,
}

/// What every lane needs.
struct Ctx {
    /// This engine's segment name, as receivers see the sender.
    from: String,
    secret: Option<Vec<u8>>,
    /// How long a message may take to be delivered once it may go.
    bound: Duration,
    inbox: Arc<Inbox>,
    stop: AtomicBool,
    /// Every lane; a lane idle for `lane_idle` takes itself out.
    lanes: Mutex<HashMap<Dest, Lane>>,
    lane_idle: Duration,
}

/// Every lane of this engine.
pub(crate) struct Outbox {
    ctx: Arc<Ctx>,
}

impl Outbox {
    pub(crate) fn new(
        from: String,
        secret: Option<Vec<u8>>,
        bound: Duration,
        inbox: Arc<Inbox>,
    ) -> Outbox {
        Outbox::with_lane_idle(from, secret, bound, inbox, LANE_IDLE)
    }

    fn with_lane_idle(
        from: String,
        secret: Option<Vec<u8>>,
        bound: Duration,
        inbox: Arc<Inbox>,
        lane_idle: Duration,
    ) -> Outbox {
        Outbox {
            ctx: Arc::new(Ctx {
                from,
                secret,
                bound,
                inbox,
                stop: AtomicBool::new(false),
                lanes: Mutex::new(HashMap::new()),
                lane_idle,
            }),
        }
    }

    /// How long a message may take once it may go (`default_timeout_ms`).
    pub(crate) fn bound(&self) -> Duration {
        self.ctx.bound
    }

    /// Queue `note` for `dest`, after `after`'s tasks if given, to be
    /// delivered by `deadline`; its fate goes to `delivery`.
    ///
    /// # Errors
    /// `Shutdown` once the engine is stopping; `OutOfMemory` if the lane's
    /// thread cannot be started. `delivery` is untouched then.
    pub(crate) fn enqueue(
        &self,
        dest: Dest,
        note: Notification,
        after: Option<After>,
        deadline: Instant,
        delivery: Arc<Delivery>,
    ) -> Result<()> {
        let mut lanes = self.ctx.lanes.lock();
        if self.ctx.stop.load(Ordering::Acquire) {
            return Err(Error::new(ErrorKind::Shutdown, "the engine is stopping"));
        }
        let lane = match lanes.entry(dest.clone()) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let shared = Arc::new(LaneShared {
                    state: Mutex::new(LaneState::default()),
                    work: Condvar::new(),
                    stream: crate::control::new_engine_id(),
                    open: Mutex::new(None),
                });
                let (s2, ctx) = (shared.clone(), self.ctx.clone());
                let thread = std::thread::Builder::new()
                    .name("tent-notify".into())
                    .spawn(move || run_lane(&ctx, &dest, &s2))
                    .map_err(|e| {
                        Error::new(ErrorKind::OutOfMemory, "spawn a notification lane")
                            .with_source(e)
                    })?;
                v.insert(Lane {
                    shared,
                    thread: Some(thread),
                })
            }
        };
        let mut st = lane.shared.state.lock();
        st.last_seq += 1;
        let seq = st.last_seq;
        st.jobs.push_back(Job {
            seq,
            note,
            after,
            deadline,
            delivery,
        });
        drop(st);
        lane.shared.work.notify_one();
        Ok(())
    }

    /// Stop every lane: an exchange in progress is cut (its socket shut
    /// down), and what has not been delivered fails `Shutdown`.
    pub(crate) fn stop(&self) {
        // Out of the map under its lock (with `stop` set, so no lane is
        // added after), joined after it is released: a lane taking itself
        // out waits for that lock.
        let lanes = {
            let mut lanes = self.ctx.lanes.lock();
            self.ctx.stop.store(true, Ordering::Release);
            std::mem::take(&mut *lanes)
        };
        for lane in lanes.values() {
            // Under the lane's lock, so a lane about to wait sees `stop`.
            let _g = lane.shared.state.lock();
            lane.shared.work.notify_all();
            if let Some(s) = &*lane.shared.open.lock() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
        for (_, mut lane) in lanes {
            if let Some(t) = lane.thread.take() {
                let _ = t.join();
            }
        }
    }

    /// Lanes running (each a thread).
    #[cfg(test)]
    fn lanes(&self) -> usize {
        self.ctx.lanes.lock().len()
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        self.stop();
    }
}

fn stopped() -> Error {
    Error::new(
        ErrorKind::Shutdown,
        "the engine stopped before the notification was delivered",
    )
}

/// The lane's connection, and when it was opened.
struct Conn {
    stream: TcpStream,
    opened: Instant,
}

fn run_lane(ctx: &Ctx, dest: &Dest, lane: &LaneShared) {
    let mut conn: Option<Conn> = None;
    loop {
        // The head job's parts; it stays queued (and in order) until done.
        let (seq, note, after, deadline, delivery) = {
            let mut st = lane.state.lock();
            loop {
                if ctx.stop.load(Ordering::Acquire) {
                    for job in st.jobs.drain(..) {
                        job.delivery.settle(&Err(stopped()));
                    }
                    return;
                }
                if let Some(job) = st.jobs.front_mut() {
                    break (
                        job.seq,
                        job.note.clone(),
                        job.after.take(),
                        job.deadline,
                        job.delivery.clone(),
                    );
                }
                // Idle: keep the connection a moment for the next message
                // (a reconnect costs a handshake), then hand the peer its
                // connection slot back.
                if conn.is_some() {
                    let waited = lane.work.wait_for(&mut st, CONN_IDLE);
                    if waited.timed_out() && st.jobs.is_empty() {
                        conn = None;
                        *lane.open.lock() = None;
                    }
                    continue;
                }
                let waited = lane.work.wait_for(&mut st, ctx.lane_idle);
                if waited.timed_out() && st.jobs.is_empty() {
                    // Out of the map, in the map's lock order (map, then
                    // lane), so no message is queued here meanwhile.
                    drop(st);
                    let mut lanes = ctx.lanes.lock();
                    st = lane.state.lock();
                    if st.jobs.is_empty() {
                        if lanes
                            .get(dest)
                            .is_some_and(|l| std::ptr::eq(Arc::as_ptr(&l.shared), lane))
                        {
                            // Dropping our own JoinHandle detaches us.
                            lanes.remove(dest);
                        }
                        return;
                    }
                }
            }
        };
        let result = after
            .as_ref()
            .map_or(Ok(()), |a| wait_for(ctx, a))
            .and_then(|()| match dest {
                Dest::Local => file_local(
                    ctx,
                    Received {
                        from: ctx.from.clone(),
                        name: note.name,
                        msg: note.msg,
                    },
                    deadline,
                ),
                Dest::Peer(peer) => {
                    let frame = NotifyFrame {
                        sender: lane.stream,
                        from: ctx.from.clone(),
                        seq,
                        name: note.name,
                        msg: note.msg,
                    };
                    send(ctx, lane, peer, &mut conn, &frame, deadline)
                }
            });
        if let Err(e) = &result {
            crate::lograte::warn_limited!((dest, e.kind()), dest = ?dest, error = %e, "notification not delivered");
        }
        lane.state.lock().jobs.pop_front();
        delivery.settle(&result);
    }
}

/// Wait until every task of `after` ended; `Ok` only if all completed.
fn wait_for(ctx: &Ctx, after: &After) -> Result<()> {
    let mut pause = Duration::from_micros(5);
    loop {
        if ctx.stop.load(Ordering::Acquire) {
            return Err(stopped());
        }
        match after() {
            None => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(MAX_POLL_PAUSE);
            }
            Some(Ok(())) => return Ok(()),
            Some(Err((task, kind))) => {
                return Err(Error::new(
                    kind,
                    format!(
                        "not sent: task {task} of its submission ended {kind}, so its data did not all land"
                    ),
                ));
            }
        }
    }
}

/// A pause before the next try, never past `deadline`; `false` once the
/// deadline has come or the engine is stopping.
fn pause_before_retry(ctx: &Ctx, pause: &mut Duration, deadline: Instant) -> bool {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() || ctx.stop.load(Ordering::Acquire) {
        return false;
    }
    std::thread::sleep((*pause).min(left));
    *pause = (*pause * 2).min(MAX_RETRY_PAUSE);
    true
}

fn expired(what: &str, last: Option<Error>) -> Error {
    let why = last.map_or_else(String::new, |e| format!(" (last: {e})"));
    Error::new(
        ErrorKind::Timeout,
        format!("{what} was not delivered within default_timeout_ms{why}"),
    )
}

/// File one this engine sent itself, retrying a full inbox until
/// `deadline`.
fn file_local(ctx: &Ctx, r: Received, deadline: Instant) -> Result<()> {
    let mut pause = FIRST_RETRY_PAUSE;
    loop {
        match ctx.inbox.file_local(r.clone()) {
            Err(e) if e.kind() == ErrorKind::SqFull => {
                if !pause_before_retry(ctx, &mut pause, deadline) {
                    return Err(if ctx.stop.load(Ordering::Acquire) {
                        stopped()
                    } else {
                        expired("a notification to this engine", Some(e))
                    });
                }
            }
            other => return other,
        }
    }
}

/// Deliver `frame` to `peer` before `deadline`, reusing and replacing
/// `conn` as needed.
fn send(
    ctx: &Ctx,
    lane: &LaneShared,
    peer: &str,
    conn: &mut Option<Conn>,
    frame: &NotifyFrame,
    deadline: Instant,
) -> Result<()> {
    let mut refused = 0u32;
    let mut pause = FIRST_RETRY_PAUSE;
    let mut last: Option<Error> = None;
    let what = || format!("notification {} to {peer}", frame.seq);
    loop {
        if ctx.stop.load(Ordering::Acquire) {
            return Err(stopped());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(expired(&what(), last));
        }
        if conn
            .as_ref()
            .is_none_or(|c| c.opened.elapsed() > CONN_MAX_AGE)
        {
            *conn = None;
            // Each connection is cuttable from its connect on, so `stop`
            // does not wait out a handshake a silent peer holds.
            let cuttable = |s: &TcpStream| {
                *lane.open.lock() = s.try_clone().ok();
                // `stop` may have looked before that store: cut it here.
                if ctx.stop.load(Ordering::Acquire) {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                }
            };
            let made = client::notify_session_with(peer, ctx.secret.as_deref(), left, cuttable);
            if made.is_err() {
                // The connection the handshake failed on closes now, not
                // at the lane's next connect.
                *lane.open.lock() = None;
            }
            match made {
                Ok(stream) => {
                    // Stopped while connecting: `stop` saw no stream to cut.
                    if ctx.stop.load(Ordering::Acquire) {
                        return Err(stopped());
                    }
                    *conn = Some(Conn {
                        stream,
                        opened: Instant::now(),
                    });
                    refused = 0;
                }
                Err(e) if permanent(e.kind()) => return Err(e),
                Err(e) => {
                    if e.kind() == ErrorKind::Unreachable {
                        refused += 1;
                        if refused >= REFUSALS {
                            return Err(Error::new(
                                ErrorKind::Unreachable,
                                format!(
                                    "{peer} refused {REFUSALS} connections in a row: its engine is gone; {} not delivered",
                                    what()
                                ),
                            )
                            .with_source(e));
                        }
                    }
                    last = Some(e);
                    pause_before_retry(ctx, &mut pause, deadline);
                    continue;
                }
            }
        }
        let Some(c) = conn.as_ref() else {
            continue;
        };
        match client::notify(&c.stream, peer, frame, deadline) {
            Ok(()) => return Ok(()),
            Err(NotifyError::Refused(e)) if e.kind() == ErrorKind::SqFull => {
                // The peer's inbox is full: the same connection, later.
                last = Some(e);
                pause_before_retry(ctx, &mut pause, deadline);
            }
            // Any other answer is the peer's word: not taken, and asking
            // again would get the same.
            Err(NotifyError::Refused(e)) => return Err(e),
            Err(NotifyError::Broken(e)) => {
                // Whether it was filed is unknown: send the same frame on
                // a new connection (the receiver drops a duplicate).
                last = Some(e);
                *conn = None;
                *lane.open.lock() = None;
                pause_before_retry(ctx, &mut pause, deadline);
            }
        }
    }
}

/// Failures no retry can change.
fn permanent(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::AccessDenied | ErrorKind::InvalidArgument)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_lane_ends_and_the_next_message_starts_another() {
        let inbox = Arc::new(Inbox::default());
        let out = Outbox::with_lane_idle(
            "me".into(),
            None,
            Duration::from_secs(5),
            inbox.clone(),
            Duration::from_millis(30),
        );
        let send = |name: &str| {
            let d = Arc::new(Delivery::default());
            let note = Notification::new(name, Vec::new()).unwrap();
            out.enqueue(
                Dest::Local,
                note,
                None,
                crate::deadline::after(out.bound()),
                d.clone(),
            )
            .unwrap();
            d.wait().unwrap();
        };
        send("one");
        assert_eq!(out.lanes(), 1);
        let start = Instant::now();
        while out.lanes() > 0 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the idle lane stayed"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        send("two");
        assert_eq!(out.lanes(), 1);
        let names: Vec<_> = inbox.take_all().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["one", "two"]);
        out.stop();
        assert_eq!(out.lanes(), 0);
    }
}
