//! The sending side: one lane per peer, each with its own thread.
//!
//! A lane takes its messages in the order they were given. A message
//! attached to a submission waits at the head of its lane until every task
//! of that submission has ended; it is sent only if all completed. Sending
//! reuses the lane's authenticated control connection, and on any failure
//! reconnects and sends the same (sender, seq) again: the receiver drops
//! what it already filed, so each message lands once. A peer whose port
//! refuses connections ([`REFUSALS`] times in a row) is gone, and the
//! message fails instead of waiting out the whole bound.
//!
//! Never the worker's business: the lane threads block on sockets and
//! sleep while a submission runs; the workers only finish tasks.

use std::collections::{HashMap, VecDeque};
use std::net::TcpStream;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tent_rings::ErrorKind;

use super::inbox::Inbox;
use super::{Notification, Received};
use crate::control::client;
use crate::control::wire::NotifyFrame;
use crate::engine::batch::{Batch, TaskState};
use crate::error::{Error, Result};

/// Connection attempts refused in a row after which the peer counts as
/// gone (its engine no longer listens).
pub const REFUSALS: u32 = 3;
/// A control connection is replaced after this long: the server ends each
/// connection's exchange after `EXCHANGE_DEADLINE` (5 s).
const CONN_MAX_AGE: Duration = Duration::from_secs(4);
/// Longest pause between polls of a submission's tasks, and between
/// retries of a busy or unreachable peer.
const MAX_PAUSE: Duration = Duration::from_millis(1);
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Where a lane delivers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Dest {
    /// A peer's control server (`ip:port`).
    Peer(String),
    /// This engine's own inbox (a submission to `SegmentId::LOCAL`).
    Local,
}

/// The tasks a message waits for.
pub(crate) struct After {
    pub batch: Arc<Batch>,
    pub tasks: Range<usize>,
}

impl After {
    /// `None` while any task runs; then `Ok` if all completed, else the
    /// first failure's kind and task.
    fn outcome(&self) -> Option<std::result::Result<(), (usize, ErrorKind)>> {
        let mut failed = None;
        for i in self.tasks.clone() {
            let s = self.batch.task_status(i);
            match s.state {
                TaskState::Initial | TaskState::Pending => return None,
                TaskState::Completed => {}
                other => {
                    let kind = s.error.unwrap_or(match other {
                        TaskState::Canceled => ErrorKind::Canceled,
                        TaskState::Timeout => ErrorKind::Timeout,
                        _ => ErrorKind::InvalidArgument,
                    });
                    failed.get_or_insert((i, kind));
                }
            }
        }
        Some(failed.map_or(Ok(()), Err))
    }
}

/// The fate of one message: pending, delivered, or failed with a reason.
#[derive(Debug, Default)]
pub(crate) struct Delivery {
    result: Mutex<Option<std::result::Result<(), (ErrorKind, String)>>>,
    settled: Condvar,
}

impl Delivery {
    fn settle(&self, r: Result<()>) {
        let r = r.map_err(|e| (e.kind(), e.to_string()));
        *self.result.lock().expect("delivery poisoned") = Some(r);
        self.settled.notify_all();
    }

    /// `None` while pending; then `Ok`, or the failure's kind.
    pub(crate) fn state(&self) -> Option<std::result::Result<(), ErrorKind>> {
        self.result
            .lock()
            .expect("delivery poisoned")
            .as_ref()
            .map(|r| r.as_ref().map(|_| ()).map_err(|(k, _)| *k))
    }

    /// Block until it is settled.
    pub(crate) fn wait(&self) -> Result<()> {
        let mut r = self.result.lock().expect("delivery poisoned");
        loop {
            match &*r {
                Some(Ok(())) => return Ok(()),
                Some(Err((kind, text))) => return Err(Error::new(*kind, text.clone())),
                None => r = self.settled.wait(r).expect("delivery poisoned"),
            }
        }
    }
}

struct Job {
    seq: u64,
    note: Notification,
    after: Option<After>,
    delivery: Arc<Delivery>,
}

#[derive(Default)]
struct LaneState {
    jobs: VecDeque<Job>,
    /// The next sequence number (from 1): given at enqueue, so the order
    /// of the calls is the order on the wire.
    next_seq: u64,
}

#[derive(Default)]
struct LaneShared {
    state: Mutex<LaneState>,
    work: Condvar,
}

struct Lane {
    shared: Arc<LaneShared>,
    thread: Option<JoinHandle<()>>,
}

/// What every lane needs.
struct Ctx {
    engine_id: u64,
    /// This engine's segment name, as receivers see the sender.
    from: String,
    secret: Option<Vec<u8>>,
    /// How long a message may take to be delivered once it may go.
    bound: Duration,
    inbox: Arc<Inbox>,
    stop: AtomicBool,
}

/// Every lane of this engine.
pub(crate) struct Outbox {
    ctx: Arc<Ctx>,
    lanes: Mutex<HashMap<Dest, Lane>>,
}

impl Outbox {
    pub(crate) fn new(
        from: String,
        secret: Option<Vec<u8>>,
        bound: Duration,
        inbox: Arc<Inbox>,
    ) -> Outbox {
        Outbox {
            ctx: Arc::new(Ctx {
                engine_id: crate::control::new_engine_id(),
                from,
                secret,
                bound,
                inbox,
                stop: AtomicBool::new(false),
            }),
            lanes: Mutex::new(HashMap::new()),
        }
    }

    /// Queue `note` for `dest`, after `after`'s tasks if given.
    ///
    /// # Errors
    /// `Shutdown` once the engine is stopping; `OutOfMemory` if the lane's
    /// thread cannot be started.
    pub(crate) fn enqueue(
        &self,
        dest: Dest,
        note: Notification,
        after: Option<After>,
    ) -> Result<Arc<Delivery>> {
        let mut lanes = self.lanes.lock().expect("outbox poisoned");
        if self.ctx.stop.load(Ordering::Acquire) {
            return Err(Error::new(ErrorKind::Shutdown, "the engine is stopping"));
        }
        let lane = match lanes.entry(dest.clone()) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let shared = Arc::new(LaneShared::default());
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
        let delivery = Arc::new(Delivery::default());
        let mut st = lane.shared.state.lock().expect("lane poisoned");
        st.next_seq += 1;
        let seq = st.next_seq;
        st.jobs.push_back(Job {
            seq,
            note,
            after,
            delivery: delivery.clone(),
        });
        drop(st);
        lane.shared.work.notify_one();
        Ok(delivery)
    }

    /// Stop every lane: what has not been delivered fails `Shutdown`.
    pub(crate) fn stop(&self) {
        let mut lanes = self.lanes.lock().expect("outbox poisoned");
        self.ctx.stop.store(true, Ordering::Release);
        for lane in lanes.values() {
            // Under the lane's lock, so a lane about to wait sees `stop`.
            let _g = lane.shared.state.lock().expect("lane poisoned");
            lane.shared.work.notify_all();
        }
        for lane in lanes.values_mut() {
            if let Some(t) = lane.thread.take() {
                let _ = t.join();
            }
        }
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

fn run_lane(ctx: &Ctx, dest: &Dest, lane: &LaneShared) {
    let mut conn: Option<(TcpStream, Instant)> = None;
    loop {
        // The head job's parts; it stays queued (and in order) until done.
        let (seq, note, after, delivery) = {
            let mut st = lane.state.lock().expect("lane poisoned");
            loop {
                if ctx.stop.load(Ordering::Acquire) {
                    for job in st.jobs.drain(..) {
                        job.delivery.settle(Err(stopped()));
                    }
                    return;
                }
                if let Some(job) = st.jobs.front_mut() {
                    break (
                        job.seq,
                        job.note.clone(),
                        job.after.take(),
                        job.delivery.clone(),
                    );
                }
                st = lane.work.wait(st).expect("lane poisoned");
            }
        };
        let result = after
            .as_ref()
            .map_or(Ok(()), |a| wait_for(ctx, a))
            .and_then(|()| match dest {
                Dest::Local => ctx.inbox.file_local(Received {
                    from: ctx.from.clone(),
                    name: note.name,
                    msg: note.msg,
                }),
                Dest::Peer(peer) => {
                    let frame = NotifyFrame {
                        sender: ctx.engine_id,
                        from: ctx.from.clone(),
                        seq,
                        name: note.name,
                        msg: note.msg,
                    };
                    send(ctx, peer, &mut conn, &frame)
                }
            });
        if let Err(e) = &result {
            crate::lograte::warn_limited!("notify-failed", dest = ?dest, error = %e, "notification not delivered");
        }
        lane.state.lock().expect("lane poisoned").jobs.pop_front();
        delivery.settle(result);
    }
}

/// Wait until every task of `after` ended; `Ok` only if all completed.
fn wait_for(ctx: &Ctx, after: &After) -> Result<()> {
    let mut pause = Duration::from_micros(5);
    loop {
        if ctx.stop.load(Ordering::Acquire) {
            return Err(stopped());
        }
        match after.outcome() {
            None => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(MAX_PAUSE);
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

/// Deliver `frame` to `peer`, reusing and replacing `conn` as needed,
/// within the bound.
fn send(
    ctx: &Ctx,
    peer: &str,
    conn: &mut Option<(TcpStream, Instant)>,
    frame: &NotifyFrame,
) -> Result<()> {
    let start = Instant::now();
    let mut refused = 0u32;
    let mut pause = Duration::from_millis(10);
    let mut last: Option<Error> = None;
    loop {
        if ctx.stop.load(Ordering::Acquire) {
            return Err(stopped());
        }
        let left = ctx.bound.saturating_sub(start.elapsed());
        if left.is_zero() {
            let why = last.map_or_else(String::new, |e| format!(": {e}"));
            return Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "{peer} did not take notification {} within {:?}{why}",
                    frame.seq, ctx.bound
                ),
            ));
        }
        if conn
            .as_ref()
            .is_none_or(|(_, at)| at.elapsed() > CONN_MAX_AGE)
        {
            match client::notify_session(
                peer,
                ctx.secret.as_deref(),
                left.min(Duration::from_secs(2)),
            ) {
                Ok(s) => *conn = Some((s, Instant::now())),
                Err(e) if permanent(e.kind()) => return Err(e),
                Err(e) => {
                    if e.kind() == ErrorKind::Unreachable {
                        refused += 1;
                        if refused >= REFUSALS {
                            return Err(Error::new(
                                ErrorKind::Unreachable,
                                format!(
                                    "{peer} refused {REFUSALS} connections in a row: its engine is gone; notification {} not delivered",
                                    frame.seq
                                ),
                            )
                            .with_source(e));
                        }
                    }
                    last = Some(e);
                    std::thread::sleep(pause.min(left));
                    pause = (pause * 2).min(MAX_RETRY_PAUSE);
                    continue;
                }
            }
        }
        let Some((s, _)) = conn.as_mut() else {
            continue;
        };
        refused = 0;
        match client::notify(s, peer, frame) {
            Ok(()) => return Ok(()),
            Err(e) if permanent(e.kind()) => return Err(e),
            Err(e) if e.kind() == ErrorKind::SqFull => {
                // The peer's inbox is full: the same connection, later.
                last = Some(e);
                std::thread::sleep(pause.min(left));
                pause = (pause * 2).min(MAX_RETRY_PAUSE);
            }
            Err(e) => {
                // The connection broke (or the server ended its exchange):
                // send the same frame on a new one.
                last = Some(e);
                *conn = None;
            }
        }
    }
}

/// Failures no retry can change.
fn permanent(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::AccessDenied | ErrorKind::InvalidArgument)
}
