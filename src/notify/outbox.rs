//! The sending side: one lane per destination, stepped by a small pool of
//! threads.
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
//! fails instead of waiting out its bound. A lane with nothing to send
//! for 10 s leaves (the next message starts a new one, a new stream), so
//! an engine keeps no state for every peer it ever notified.
//!
//! Each message has a deadline set when it is queued: `default_timeout_ms`
//! after that for a plain one; for an attached one, `default_timeout_ms`
//! after the latest deadline of its submission's requests (by then its
//! data has landed or failed). Every exchange runs under it as one
//! deadline, so a peer dripping bytes cannot stretch it, and messages
//! queued behind a silent peer expire by their own deadlines rather than
//! one after another.
//!
//! The lanes run on [`SENDERS`] threads, however many destinations there
//! are (started with the first message, joined by `stop`). A lane is a
//! state the pool steps: ready (in the run queue, served in turn: a lane
//! goes to the back after each message), asleep until an instant (its
//! head's submission is still running and is looked at again then, or it
//! pauses before a retry), or idle. A pool thread takes one ready lane at
//! a time, off the queue, so no two threads ever step one lane, and runs
//! one step of its head: one look at its submission, or one exchange
//! (connect if need be, send, read the answer). A lane that waits or
//! pauses holds no thread. An exchange blocks on the peer's socket under
//! its message's deadline, so a silent peer holds one pool thread at most,
//! until that deadline. Idle pool threads sleep on a condition variable,
//! one of them (the clock keeper) only until the earliest timer: a lane
//! to look at again, an idle connection to close, an idle lane to drop.
//!
//! Never the worker's business: the pool threads block on sockets; the
//! workers only finish tasks.

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
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

/// Threads that send, for every destination together.
pub(crate) const SENDERS: usize = 4;
/// Connection attempts refused in a row after which the peer counts as
/// gone (its engine no longer listens).
pub(crate) const REFUSALS: u32 = 3;
/// A control connection is replaced after this long: the server ends each
/// connection's exchange after `EXCHANGE_DEADLINE` (5 s).
const CONN_MAX_AGE: Duration = Duration::from_secs(4);
/// An idle lane closes its connection after this long without a message,
/// so it does not hold one of the peer's control slots.
const CONN_IDLE: Duration = Duration::from_millis(100);
/// A lane with no message for this long leaves the map (the next message
/// to that peer starts a new lane, a new stream): an engine that notified
/// many peers over its life keeps nothing for each.
const LANE_IDLE: Duration = Duration::from_secs(10);
/// First and longest pause between looks at a submission's tasks.
const FIRST_POLL_PAUSE: Duration = Duration::from_micros(5);
const MAX_POLL_PAUSE: Duration = Duration::from_millis(1);
/// First and longest pause between retries of a busy or unreachable peer.
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(10);
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(200);
/// The pool threads' name (each with its index after a dash).
const THREAD_NAME: &str = "tent-notify";

/// Where a lane delivers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Dest {
    /// A peer's control server (`ip:port`): the engine there (`to` 0) or
    /// the client of that daemon with mailbox `to`; sent as this engine
    /// (`from` 0) or as its client with mailbox `from` (a daemon sending
    /// for a client). A lane is a sender's to one peer (`to` is the
    /// message's): one client's messages never wait behind another's, and
    /// a silent peer holds one pool thread per sender at most.
    Peer { addr: String, from: u64, to: u64 },
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
    /// The receiving client's mailbox at the lane's peer (0: the engine).
    to: u64,
    note: Notification,
    /// Its submission, until every task of it has ended.
    after: Option<After>,
    /// When it stops being worth sending.
    deadline: Instant,
    delivery: Arc<Delivery>,
    /// The pause before the next look at `after`.
    poll_pause: Duration,
    /// The pause before the next retry.
    retry_pause: Duration,
    /// Connections refused in a row.
    refused: u32,
    /// Why the last try failed, for the error if the deadline comes.
    last: Option<Error>,
}

/// Where a lane stands with the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// In the run queue.
    Ready,
    /// A pool thread is stepping it: that thread holds its head job and
    /// its connection.
    Busy,
    /// Its head is looked at again at `until`: its submission still runs,
    /// or it pauses before a retry.
    Asleep { until: Instant },
    /// Nothing queued since `since`: its connection closes after
    /// `CONN_IDLE`, the lane leaves after `lane_idle`.
    Idle { since: Instant },
}

/// The lane's connection, and when it was opened.
struct Conn {
    stream: TcpStream,
    opened: Instant,
}

struct Lane {
    dest: Dest,
    /// This lane's stream id (random, non-zero), with `seq` the receiver's
    /// dedup key.
    stream: u64,
    /// The last sequence number given: at enqueue, so the order of the
    /// calls is the order on the wire.
    last_seq: u64,
    jobs: VecDeque<Job>,
    phase: Phase,
    /// When the pool looks at this lane next (asleep or idle). An entry of
    /// `Sched::timers` for another instant is stale.
    timer: Option<Instant>,
    /// The connection, while no pool thread is using it.
    conn: Option<Conn>,
    /// A handle on the lane's open connection, so `stop` can cut an
    /// exchange short.
    open: Arc<Mutex<Option<TcpStream>>>,
}

impl Lane {
    fn close_conn(&mut self) {
        self.conn = None;
        *self.open.lock() = None;
    }
}

/// The lanes and what the pool threads share, under one lock (held only
/// for bookkeeping, never across an exchange).
#[derive(Default)]
struct Sched {
    /// Every lane, by its id.
    lanes: HashMap<u64, Lane>,
    by_dest: HashMap<Dest, u64>,
    next_id: u64,
    /// Lanes ready to step, in turn.
    ready: VecDeque<u64>,
    /// (when, lane): when a sleeping or idle lane is looked at again.
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    /// Until when the pool thread keeping the clock sleeps, while one does.
    keeper: Option<Instant>,
    threads: Vec<JoinHandle<()>>,
}

/// What every lane needs.
struct Ctx {
    /// This engine's segment name, as receivers see the sender.
    from: String,
    secret: Option<Vec<u8>>,
    /// How long a message may take to be delivered once it may go.
    bound: Duration,
    inbox: Arc<Inbox>,
    /// Set under `sched`'s lock; read without it by exchanges in progress.
    stop: AtomicBool,
    sched: Mutex<Sched>,
    /// Idle pool threads wait here for a ready lane.
    work: Condvar,
    /// The pool thread keeping the clock waits here, until the earliest
    /// timer or an earlier one is set.
    clock: Condvar,
    lane_idle: Duration,
    /// The pool threads' name.
    name: String,
}

/// Every lane of this engine, and the threads that send for them.
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
        Outbox::with_tuning(from, secret, bound, inbox, LANE_IDLE, THREAD_NAME)
    }

    fn with_tuning(
        from: String,
        secret: Option<Vec<u8>>,
        bound: Duration,
        inbox: Arc<Inbox>,
        lane_idle: Duration,
        name: &str,
    ) -> Outbox {
        Outbox {
            ctx: Arc::new(Ctx {
                from,
                secret,
                bound,
                inbox,
                stop: AtomicBool::new(false),
                sched: Mutex::new(Sched::default()),
                work: Condvar::new(),
                clock: Condvar::new(),
                lane_idle,
                name: name.to_owned(),
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
    /// `Shutdown` once the engine is stopping; `OutOfMemory` if no sending
    /// thread can be started. `delivery` is untouched then.
    pub(crate) fn enqueue(
        &self,
        dest: Dest,
        note: Notification,
        after: Option<After>,
        deadline: Instant,
        delivery: Arc<Delivery>,
    ) -> Result<()> {
        let ctx = &*self.ctx;
        let mut s = ctx.sched.lock();
        if ctx.stop.load(Ordering::Acquire) {
            return Err(Error::new(ErrorKind::Shutdown, "the engine is stopping"));
        }
        self.start_senders(&mut s)?;
        // The lane is the sender's to that peer, whatever the receiver.
        let (dest, to) = match dest {
            Dest::Peer { addr, from, to } => (Dest::Peer { addr, from, to: 0 }, to),
            Dest::Local => (Dest::Local, 0),
        };
        let id = match s.by_dest.get(&dest) {
            Some(&id) => id,
            None => {
                s.next_id += 1;
                let id = s.next_id;
                s.by_dest.insert(dest.clone(), id);
                s.lanes.insert(
                    id,
                    Lane {
                        dest,
                        stream: crate::control::new_engine_id(),
                        last_seq: 0,
                        jobs: VecDeque::new(),
                        phase: Phase::Idle {
                            since: Instant::now(),
                        },
                        timer: None,
                        conn: None,
                        open: Arc::new(Mutex::new(None)),
                    },
                );
                id
            }
        };
        let Some(lane) = s.lanes.get_mut(&id) else {
            return Err(Error::new(ErrorKind::Shutdown, "the engine is stopping"));
        };
        lane.last_seq += 1;
        lane.jobs.push_back(Job {
            seq: lane.last_seq,
            to,
            note,
            after,
            deadline,
            delivery,
            poll_pause: FIRST_POLL_PAUSE,
            retry_pause: FIRST_RETRY_PAUSE,
            refused: 0,
            last: None,
        });
        // A lane ready, asleep or busy gets to it in turn.
        if matches!(lane.phase, Phase::Idle { .. }) {
            lane.phase = Phase::Ready;
            s.ready.push_back(id);
            wake_one(ctx, &s);
        }
        Ok(())
    }

    /// The pool, started with the first message. A thread that cannot be
    /// started is tried again with the next message while at least one
    /// runs.
    fn start_senders(&self, s: &mut Sched) -> Result<()> {
        while s.threads.len() < SENDERS {
            let ctx = self.ctx.clone();
            let name = format!("{}-{}", self.ctx.name, s.threads.len());
            match std::thread::Builder::new()
                .name(name)
                .spawn(move || run_sender(&ctx))
            {
                Ok(t) => s.threads.push(t),
                Err(e) if s.threads.is_empty() => {
                    return Err(
                        Error::new(ErrorKind::OutOfMemory, "spawn a notification sender")
                            .with_source(e),
                    );
                }
                Err(e) => {
                    crate::lograte::warn_limited!("notify-spawn", error = %e, running = s.threads.len(), "fewer notification senders than planned");
                    break;
                }
            }
        }
        Ok(())
    }

    /// The sender with mailbox `from` (a daemon's client) is gone: what it
    /// queued fails `Canceled`, but for a message being sent now, which
    /// ends as it would have (so a gone client leaves the daemon holding
    /// one message per peer at most, not its whole queue).
    pub(crate) fn drop_sender(&self, from: u64) {
        let dropped: Vec<Job> = {
            let mut s = self.ctx.sched.lock();
            s.lanes
                .values_mut()
                .filter(|l| matches!(&l.dest, Dest::Peer { from: f, .. } if *f == from))
                .flat_map(|l| l.jobs.drain(..).collect::<Vec<_>>())
                .collect()
        };
        for job in dropped {
            job.delivery.settle(&Err(Error::new(
                ErrorKind::Canceled,
                "its sender, a daemon's client, detached before it was delivered",
            )));
        }
    }

    /// Stop every lane: an exchange in progress is cut (its socket shut
    /// down), and what has not been delivered fails `Shutdown`.
    pub(crate) fn stop(&self) {
        let ctx = &*self.ctx;
        // Out of the map under its lock (with `stop` set, so no lane is
        // added after); a pool thread finishing a step then finds its lane
        // gone and fails the message it holds.
        let (lanes, threads) = {
            let mut s = ctx.sched.lock();
            ctx.stop.store(true, Ordering::Release);
            s.ready.clear();
            s.timers.clear();
            s.by_dest.clear();
            let lanes = std::mem::take(&mut s.lanes);
            for lane in lanes.values() {
                if let Some(open) = &*lane.open.lock() {
                    let _ = open.shutdown(std::net::Shutdown::Both);
                }
            }
            ctx.work.notify_all();
            ctx.clock.notify_all();
            (lanes, std::mem::take(&mut s.threads))
        };
        for lane in lanes.into_values() {
            for job in lane.jobs {
                job.delivery.settle(&Err(stopped()));
            }
        }
        let me = std::thread::current().id();
        for t in threads {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }

    /// Lanes in the map.
    #[cfg(test)]
    fn lanes(&self) -> usize {
        self.ctx.sched.lock().lanes.len()
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

/// Wake one pool thread for a ready lane: an idle one, else the one
/// keeping the clock.
fn wake_one(ctx: &Ctx, s: &Sched) {
    if !ctx.work.notify_one() && s.keeper.is_some() {
        ctx.clock.notify_one();
    }
}

impl Sched {
    /// Look at lane `id` again at `at`. An earlier look already set stays
    /// (it sets the next when it comes).
    fn set_timer(&mut self, clock: &Condvar, id: u64, at: Instant) {
        let Some(lane) = self.lanes.get_mut(&id) else {
            return;
        };
        if lane.timer.is_some_and(|t| t <= at) {
            return;
        }
        lane.timer = Some(at);
        self.timers.push(Reverse((at, id)));
        if self.keeper.is_some_and(|k| at < k) {
            clock.notify_one();
        }
    }

    /// The lane has nothing queued as of `now`: idle, looked at again when
    /// its connection is due to close or the lane to leave.
    fn go_idle(&mut self, ctx: &Ctx, id: u64, now: Instant) {
        let Some(lane) = self.lanes.get_mut(&id) else {
            return;
        };
        lane.phase = Phase::Idle { since: now };
        let at = idle_check(lane, now, ctx.lane_idle);
        self.set_timer(&ctx.clock, id, at);
    }

    /// Act on every timer due by `now`.
    fn fire_due(&mut self, ctx: &Ctx, now: Instant) {
        while let Some(&Reverse((at, id))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(lane) = self.lanes.get_mut(&id) else {
                continue;
            };
            if lane.timer != Some(at) {
                continue;
            }
            lane.timer = None;
            match lane.phase {
                Phase::Asleep { until } if until <= now => {
                    lane.phase = Phase::Ready;
                    self.ready.push_back(id);
                }
                Phase::Asleep { until } => self.set_timer(&ctx.clock, id, until),
                Phase::Idle { since } if now >= since + ctx.lane_idle => {
                    // Nothing queued (a message would have made it ready):
                    // it leaves, its connection with it.
                    let dest = lane.dest.clone();
                    self.lanes.remove(&id);
                    self.by_dest.remove(&dest);
                }
                Phase::Idle { since } => {
                    if lane.conn.is_some() && now >= since + CONN_IDLE {
                        // Hand the peer its connection slot back.
                        lane.close_conn();
                    }
                    let next = idle_check(lane, since, ctx.lane_idle);
                    self.set_timer(&ctx.clock, id, next);
                }
                // It sets its timer when it next sleeps or idles.
                Phase::Ready | Phase::Busy => {}
            }
        }
    }

    /// Take lane `id`'s head job and connection for a step; `None` when it
    /// has none (then it idles).
    fn begin(&mut self, ctx: &Ctx, id: u64) -> Option<Step> {
        let lane = self.lanes.get_mut(&id)?;
        let Some(job) = lane.jobs.pop_front() else {
            self.go_idle(ctx, id, Instant::now());
            return None;
        };
        lane.phase = Phase::Busy;
        Some(Step {
            id,
            dest: lane.dest.clone(),
            stream: lane.stream,
            job: Some(job),
            conn: lane.conn.take(),
            open: lane.open.clone(),
        })
    }

    /// Put back what `step` took, and the lane where it now stands.
    /// Returns its job when the lane is gone (the engine stopped).
    fn finish(&mut self, ctx: &Ctx, step: Step, again: Option<Instant>) -> Option<Job> {
        let Some(lane) = self.lanes.get_mut(&step.id) else {
            return step.job;
        };
        lane.conn = step.conn;
        match (again, step.job) {
            (Some(until), Some(job)) => {
                // Back at the head: it keeps its place in the lane's order.
                lane.jobs.push_front(job);
                lane.phase = Phase::Asleep { until };
                self.set_timer(&ctx.clock, step.id, until);
            }
            _ if lane.jobs.is_empty() => self.go_idle(ctx, step.id, Instant::now()),
            _ => {
                lane.phase = Phase::Ready;
                self.ready.push_back(step.id);
            }
        }
        None
    }
}

/// When an idle lane (idle since `since`) is looked at next: its
/// connection's close, else its leaving.
fn idle_check(lane: &Lane, since: Instant, lane_idle: Duration) -> Instant {
    let leave = since + lane_idle;
    if lane.conn.is_some() {
        (since + CONN_IDLE).min(leave)
    } else {
        leave
    }
}

/// A pool thread: steps ready lanes one at a time, keeps the clock when
/// none is ready and no other thread does, else sleeps.
fn run_sender(ctx: &Ctx) {
    let mut s = ctx.sched.lock();
    loop {
        if ctx.stop.load(Ordering::Acquire) {
            return;
        }
        s.fire_due(ctx, Instant::now());
        if let Some(id) = s.ready.pop_front() {
            let Some(mut step) = s.begin(ctx, id) else {
                continue;
            };
            // While this thread sends, another serves the rest of the
            // queue, or keeps the clock.
            if !s.ready.is_empty() || (s.keeper.is_none() && !s.timers.is_empty()) {
                wake_one(ctx, &s);
            }
            let again = MutexGuard::unlocked(&mut s, || {
                let again = step.run(ctx);
                if again.is_none() {
                    // Settled: its delivery was told; it goes here, off
                    // the lock.
                    step.job = None;
                }
                again
            });
            if let Some(job) = s.finish(ctx, step, again) {
                drop(s);
                job.delivery.settle(&Err(stopped()));
                return;
            }
            continue;
        }
        match s.timers.peek() {
            Some(&Reverse((at, _))) if s.keeper.is_none() => {
                s.keeper = Some(at);
                ctx.clock.wait_until(&mut s, at);
                s.keeper = None;
            }
            _ => ctx.work.wait(&mut s),
        }
    }
}

/// What a pool thread takes out of a lane to step it.
struct Step {
    id: u64,
    dest: Dest,
    stream: u64,
    /// The lane's head; `None` once settled.
    job: Option<Job>,
    conn: Option<Conn>,
    open: Arc<Mutex<Option<TcpStream>>>,
}

/// A step's end: the message's fate, or when to step it again.
enum Outcome {
    Settled(Result<()>),
    Again(Instant),
}

impl Step {
    /// One step of the head job; its delivery is settled here when it is
    /// done. `Some(when)` to step it again.
    fn run(&mut self, ctx: &Ctx) -> Option<Instant> {
        let job = self.job.as_mut()?;
        let outcome = if ctx.stop.load(Ordering::Acquire) {
            Outcome::Settled(Err(stopped()))
        } else {
            match look_at_submission(job) {
                Some(o) => o,
                None => match &self.dest {
                    Dest::Local => file_local(ctx, job),
                    Dest::Peer { addr, from, .. } => {
                        let via = Via {
                            peer: addr,
                            from: *from,
                            to: job.to,
                            stream: self.stream,
                        };
                        send(ctx, &via, &mut self.conn, &self.open, job)
                    }
                },
            }
        };
        match outcome {
            Outcome::Again(at) => Some(at),
            Outcome::Settled(result) => {
                if let Err(e) = &result {
                    crate::lograte::warn_limited!((&self.dest, e.kind()), dest = ?self.dest, error = %e, "notification not delivered");
                }
                job.delivery.settle(&result);
                None
            }
        }
    }
}

/// `None` when the job may go (no submission, or all its tasks
/// completed); else it waits (looked at again after a pause) or fails.
fn look_at_submission(job: &mut Job) -> Option<Outcome> {
    let after = job.after.as_ref()?;
    match after() {
        None => {
            let at = Instant::now() + job.poll_pause;
            job.poll_pause = (job.poll_pause * 2).min(MAX_POLL_PAUSE);
            Some(Outcome::Again(at))
        }
        Some(Ok(())) => {
            job.after = None;
            None
        }
        Some(Err((task, kind))) => Some(Outcome::Settled(Err(Error::new(
            kind,
            format!(
                "not sent: task {task} of its submission ended {kind}, so its data did not all land"
            ),
        )))),
    }
}

/// Try again after a pause (doubling, never past the deadline), `e` the
/// failure to report if the deadline comes; the failure at once if it has
/// come or the engine is stopping.
fn retry_later(ctx: &Ctx, job: &mut Job, e: Error, what: impl FnOnce() -> String) -> Outcome {
    if ctx.stop.load(Ordering::Acquire) {
        return Outcome::Settled(Err(stopped()));
    }
    let now = Instant::now();
    let left = job.deadline.saturating_duration_since(now);
    if left.is_zero() {
        return Outcome::Settled(Err(expired(&what(), Some(e))));
    }
    let at = now + job.retry_pause.min(left);
    job.retry_pause = (job.retry_pause * 2).min(MAX_RETRY_PAUSE);
    job.last = Some(e);
    Outcome::Again(at)
}

fn expired(what: &str, last: Option<Error>) -> Error {
    let why = last.map_or_else(String::new, |e| format!(" (last: {e})"));
    Error::new(
        ErrorKind::Timeout,
        format!("{what} was not delivered within default_timeout_ms{why}"),
    )
}

/// File one this engine sent itself; a full inbox is tried again until
/// the deadline.
fn file_local(ctx: &Ctx, job: &mut Job) -> Outcome {
    let r = Received {
        from: ctx.from.clone(),
        name: job.note.name.clone(),
        msg: job.note.msg.clone(),
    };
    match ctx.inbox.file_local(r) {
        Err(e) if e.kind() == ErrorKind::SqFull => {
            retry_later(ctx, job, e, || "a notification to this engine".to_owned())
        }
        other => Outcome::Settled(other),
    }
}

/// Where one lane's message goes, and as whom.
struct Via<'a> {
    peer: &'a str,
    /// The sending client's mailbox (0: the engine).
    from: u64,
    /// The receiving client's mailbox (0: the engine).
    to: u64,
    /// The lane's stream id.
    stream: u64,
}

/// One try at delivering `job` to `via.peer`: connect if `conn` is missing
/// or old, then one exchange, all before its deadline.
fn send(
    ctx: &Ctx,
    via: &Via<'_>,
    conn: &mut Option<Conn>,
    open: &Mutex<Option<TcpStream>>,
    job: &mut Job,
) -> Outcome {
    let peer = via.peer;
    let seq = job.seq;
    let what = || format!("notification {seq} to {peer}");
    let left = job.deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Outcome::Settled(Err(expired(&what(), job.last.take())));
    }
    if conn
        .as_ref()
        .is_some_and(|c| c.opened.elapsed() > CONN_MAX_AGE)
    {
        *conn = None;
    }
    let c = match conn {
        Some(c) => &*c,
        None => match connect(ctx, peer, open, job, left) {
            Ok(stream) => &*conn.insert(Conn {
                stream,
                opened: Instant::now(),
            }),
            Err(outcome) => return outcome,
        },
    };
    let frame = NotifyFrame {
        sender: via.stream,
        from: match via.from {
            0 => ctx.from.clone(),
            m => super::mailbox_name(&ctx.from, m),
        },
        seq,
        name: job.note.name.clone(),
        msg: job.note.msg.clone(),
        // Until its deadline this frame may go out again: the receiver
        // remembers the stream that long, so a resend stays a resend.
        resend_ms: ceil_ms(job.deadline.saturating_duration_since(Instant::now())),
        to: via.to,
    };
    match client::notify(&c.stream, peer, &frame, job.deadline) {
        Ok(()) => Outcome::Settled(Ok(())),
        // The peer's inbox is full: the same connection, later.
        Err(NotifyError::Refused(e)) if e.kind() == ErrorKind::SqFull => {
            retry_later(ctx, job, e, what)
        }
        // Any other answer is the peer's word: not taken, and asking again
        // would get the same.
        Err(NotifyError::Refused(e)) => Outcome::Settled(Err(e)),
        Err(NotifyError::Broken(e)) => {
            // Whether it was filed is unknown: send the same frame on a new
            // connection (the receiver drops a duplicate).
            *conn = None;
            *open.lock() = None;
            retry_later(ctx, job, e, what)
        }
    }
}

/// A new connection to `peer`, made within `left`; else what becomes of
/// `job` (a retry, or its failure).
fn connect(
    ctx: &Ctx,
    peer: &str,
    open: &Mutex<Option<TcpStream>>,
    job: &mut Job,
    left: Duration,
) -> std::result::Result<TcpStream, Outcome> {
    let seq = job.seq;
    let what = || format!("notification {seq} to {peer}");
    // Each connection is cuttable from its connect on, so `stop` does not
    // wait out a handshake a silent peer holds.
    let cuttable = |s: &TcpStream| {
        *open.lock() = s.try_clone().ok();
        // `stop` may have looked before that store: cut it here.
        if ctx.stop.load(Ordering::Acquire) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    };
    let made = client::notify_session_with(peer, ctx.secret.as_deref(), left, cuttable);
    if made.is_err() {
        // The connection the handshake failed on closes now, not at the
        // lane's next connect.
        *open.lock() = None;
    }
    // Stopped while connecting: `stop` saw no stream to cut, or cut the
    // handshake (which then failed whatever way it read).
    if ctx.stop.load(Ordering::Acquire) {
        return Err(Outcome::Settled(Err(stopped())));
    }
    match made {
        Ok(stream) => {
            job.refused = 0;
            Ok(stream)
        }
        Err(e) if permanent(e.kind()) => Err(Outcome::Settled(Err(e))),
        Err(e) if e.kind() == ErrorKind::Unreachable && job.refused + 1 >= REFUSALS => {
            Err(Outcome::Settled(Err(Error::new(
                ErrorKind::Unreachable,
                format!(
                    "{peer} refused {REFUSALS} connections in a row: its engine is gone; {} not delivered",
                    what()
                ),
            )
            .with_source(e))))
        }
        Err(e) => {
            if e.kind() == ErrorKind::Unreachable {
                job.refused += 1;
            }
            // Refused, busy (every control slot held), or timed out: again
            // after a pause, which holds no thread.
            Err(retry_later(ctx, job, e, what))
        }
    }
}

/// `d` in whole ms, rounded up (a window is never told shorter than it is).
fn ceil_ms(d: Duration) -> u64 {
    let ms = d.as_millis() + u128::from(d.subsec_nanos() % 1_000_000 != 0);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// Failures no retry can change.
fn permanent(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::AccessDenied | ErrorKind::InvalidArgument)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::net::TcpListener;
    use std::sync::atomic::AtomicBool;

    use crate::control::ControlServer;
    use crate::control::server::{DescriptorFn, NotifyFn, Services};
    use crate::control::wire::SegmentDescriptor;

    /// The longest any wait here takes before the test fails.
    const WAIT: Duration = Duration::from_secs(5);

    fn outbox(name: &str, inbox: Arc<Inbox>, lane_idle: Duration) -> Outbox {
        Outbox::with_tuning("me".into(), None, WAIT, inbox, lane_idle, name)
    }

    /// A control server on every local address, filing notifications into
    /// an inbox of its own: `127.0.0.x` for each `x` is another lane to it.
    fn receiver() -> (ControlServer, Arc<Inbox>) {
        let inbox = Arc::new(Inbox::default());
        let files = inbox.clone();
        let notify = Arc::new(move |ip, f| files.file(ip, f, Instant::now())) as Arc<NotifyFn>;
        let server = ControlServer::start_with(
            "0.0.0.0",
            0,
            None,
            |addr| {
                let desc = SegmentDescriptor {
                    name: addr.to_string(),
                    ..Default::default()
                };
                Arc::new(move || desc.clone()) as Arc<DescriptorFn>
            },
            Services {
                notify: Some(notify),
                ..Services::default()
            },
        )
        .unwrap();
        (server, inbox)
    }

    fn peer(server: &ControlServer, x: u8) -> Dest {
        Dest::Peer {
            addr: format!("127.0.0.{x}:{}", server.local_addr().port()),
            from: 0,
            to: 0,
        }
    }

    fn send(
        out: &Outbox,
        dest: Dest,
        msg: &[u8],
        after: Option<After>,
        deadline: Instant,
    ) -> Arc<Delivery> {
        let d = Arc::new(Delivery::default());
        let note = Notification::new("n", msg.to_vec()).unwrap();
        out.enqueue(dest, note, after, deadline, d.clone()).unwrap();
        d
    }

    /// Threads of this process whose name starts with `prefix`.
    fn threads_named(prefix: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|name| name.starts_with(prefix))
            .count()
    }

    /// Until no thread named `prefix` is left (a joined thread leaves
    /// `/proc` a moment after its join returns), at most `WAIT`.
    fn assert_threads_gone(prefix: &str) {
        let start = Instant::now();
        while threads_named(prefix) > 0 {
            assert!(start.elapsed() < WAIT, "{prefix} threads stayed after stop");
            std::thread::yield_now();
        }
    }

    fn ok(d: &Delivery) -> bool {
        matches!(d.wait_timeout(WAIT), Some(Ok(())))
    }

    #[test]
    fn an_idle_lane_leaves_the_map_and_the_next_message_starts_another() {
        let inbox = Arc::new(Inbox::default());
        let out = outbox("tnfy-idle", inbox.clone(), Duration::from_millis(30));
        let deliver = |name: &str| {
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
        deliver("one");
        assert_eq!(out.lanes(), 1);
        let start = Instant::now();
        while out.lanes() > 0 {
            assert!(start.elapsed() < WAIT, "the idle lane stayed");
            std::thread::sleep(Duration::from_millis(5));
        }
        deliver("two");
        assert_eq!(out.lanes(), 1);
        let names: Vec<_> = inbox.take_all().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["one", "two"]);
        out.stop();
        assert_eq!(out.lanes(), 0);
        assert_threads_gone("tnfy-idle");
    }

    #[test]
    fn notifications_to_many_destinations_run_on_the_pools_threads_only() {
        const DESTS: u8 = 40;
        let (server, rx) = receiver();
        let out = outbox("tnfy-many", Arc::new(Inbox::default()), LANE_IDLE);
        let deadline = crate::deadline::after(WAIT);
        let mut sent = Vec::new();
        for round in 0..3u8 {
            for x in 1..=DESTS {
                sent.push(send(&out, peer(&server, x), &[x, round], None, deadline));
            }
        }
        assert_eq!(out.lanes(), usize::from(DESTS));
        assert!(threads_named("tnfy-many") <= SENDERS);
        for d in &sent {
            assert!(ok(d), "{:?}", d.state());
        }
        let pool = threads_named("tnfy-many");
        assert!((1..=SENDERS).contains(&pool), "{pool} sending threads");
        // Every message once, each destination's in the order given.
        let got = rx.take_all();
        assert_eq!(got.len(), sent.len());
        for x in 1..=DESTS {
            let rounds: Vec<u8> = got
                .iter()
                .filter(|r| r.msg[0] == x)
                .map(|r| r.msg[1])
                .collect();
            assert_eq!(rounds, [0, 1, 2], "destination {x}");
        }
        out.stop();
        assert_threads_gone("tnfy-many");
    }

    #[test]
    fn lanes_waiting_on_their_submissions_leave_the_pool_to_other_destinations() {
        let (server, rx) = receiver();
        let out = outbox("tnfy-wait", Arc::new(Inbox::default()), LANE_IDLE);
        let deadline = crate::deadline::after(WAIT);
        let ended = Arc::new(AtomicBool::new(false));
        // Twice as many lanes as threads, each head waiting on its
        // submission, and one whose submission never ends.
        let waiting: Vec<_> = (1..=2 * SENDERS as u8)
            .map(|x| {
                let ended = ended.clone();
                let after: After =
                    Box::new(move || ended.load(Ordering::Acquire).then_some(Ok(())));
                send(&out, peer(&server, x), &[x], Some(after), deadline)
            })
            .collect();
        let never = send(
            &out,
            peer(&server, 100),
            b"never",
            Some(Box::new(|| None)),
            deadline,
        );
        let other = send(&out, peer(&server, 200), b"other", None, deadline);
        assert!(ok(&other), "{:?}", other.state());
        assert!(
            waiting.iter().all(|d| d.state().is_none()),
            "sent before its data"
        );
        assert_eq!(rx.take_all().len(), 1);
        ended.store(true, Ordering::Release);
        for d in &waiting {
            assert!(ok(d), "{:?}", d.state());
        }
        assert_eq!(rx.take_all().len(), waiting.len());
        assert_eq!(never.state(), None);
        out.stop();
        assert_eq!(never.state(), Some(Err(ErrorKind::Shutdown)));
        assert!(rx.take_all().is_empty());
    }

    /// A daemon client's messages share one lane to a peer whatever the
    /// mailbox they go to there (a silent peer holds one thread for it),
    /// and when the client goes, what it queued fails `Canceled` while the
    /// one on the wire ends as it would have.
    #[test]
    fn a_gone_sender_s_queue_is_dropped_and_its_mailboxes_share_a_lane() {
        let out = outbox("tnfy-gone", Arc::new(Inbox::default()), LANE_IDLE);
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap().to_string();
        let late = crate::deadline::after(Duration::from_secs(60));
        let queued: Vec<_> = (1..=4u64)
            .map(|to| {
                let dest = Dest::Peer {
                    addr: addr.clone(),
                    from: 7,
                    to,
                };
                send(&out, dest, &[to as u8], None, late)
            })
            .collect();
        assert_eq!(
            out.lanes(),
            1,
            "one lane for the sender, whatever the mailbox"
        );
        let other = send(
            &out,
            Dest::Peer {
                addr: addr.clone(),
                from: 8,
                to: 1,
            },
            b"x",
            None,
            late,
        );
        assert_eq!(out.lanes(), 2, "another sender, another lane");
        // Let the head go on the wire (it hangs in the handshake).
        std::thread::sleep(Duration::from_millis(100));
        out.drop_sender(7);
        let states: Vec<_> = queued.iter().map(|d| d.state()).collect();
        assert_eq!(states[0], None, "the one on the wire goes on");
        assert!(
            states[1..]
                .iter()
                .all(|s| *s == Some(Err(ErrorKind::Canceled))),
            "{states:?}"
        );
        assert_eq!(other.state(), None, "another sender's are untouched");
        out.stop();
        assert_eq!(queued[0].state(), Some(Err(ErrorKind::Shutdown)));
    }

    #[test]
    fn a_silent_destination_holds_one_pool_thread_at_most() {
        let (server, rx) = receiver();
        let out = outbox("tnfy-silent", Arc::new(Inbox::default()), LANE_IDLE);
        // Listeners that never accept: the kernel completes each connect,
        // and the handshake waits for an answer that never comes.
        let silent: Vec<_> = (1..SENDERS)
            .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        // Far off: the pool must not wait for these deadlines.
        let late = crate::deadline::after(Duration::from_secs(60));
        let stuck: Vec<_> = silent
            .iter()
            .flat_map(|l| {
                let dest = Dest::Peer {
                    addr: l.local_addr().unwrap().to_string(),
                    from: 0,
                    to: 0,
                };
                (0..3u8)
                    .map(|i| send(&out, dest.clone(), &[i], None, late))
                    .collect::<Vec<_>>()
            })
            .collect();
        let start = Instant::now();
        let soon = crate::deadline::after(Duration::from_secs(2));
        let live: Vec<_> = (0..5u8)
            .map(|i| send(&out, peer(&server, 1), &[i], None, soon))
            .collect();
        for d in &live {
            assert!(ok(d), "{:?}", d.state());
        }
        assert!(start.elapsed() < Duration::from_secs(2));
        assert_eq!(rx.take_all().len(), live.len());
        assert!(stuck.iter().all(|d| d.state().is_none()));
        // `stop` cuts the hung exchanges rather than waiting them out.
        let start = Instant::now();
        out.stop();
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "stop took {:?}",
            start.elapsed()
        );
        for d in &stuck {
            assert_eq!(d.state(), Some(Err(ErrorKind::Shutdown)));
        }
    }
}
