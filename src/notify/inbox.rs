//! The receiving side: notifications waiting for the application.

use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use tent_rings::ErrorKind;

use super::Received;
use crate::control::wire::NotifyFrame;
use crate::error::{Error, Result};

/// Notifications held at once. A sender that finds the inbox full is told
/// `SqFull` and tries again later (nothing is dropped): a peer cannot grow
/// this process past `INBOX_MAX` × 4 KiB.
pub const INBOX_MAX: usize = 4096;
/// Sender streams whose last sequence number is remembered (dedup). Past
/// it the stream heard from longest ago is forgotten; its next message is
/// taken as new, which can only matter for a resend in flight at that
/// moment from a stream silent for longer than 4095 others.
const STREAMS_MAX: usize = 4096;

/// A sender stream: where it connects from and the id it drew. Keyed by
/// the address too, so a peer elsewhere cannot silence a stream by
/// forging its id.
type StreamKey = (IpAddr, u64);

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<Received>,
    /// Stream → (the highest sequence number taken from it, when it was
    /// last heard from in `ticks`).
    seen: HashMap<StreamKey, (u64, u64)>,
    ticks: u64,
    /// The engine is going away: nothing more is filed.
    closed: bool,
}

/// What the engine has received and the application not yet taken.
#[derive(Debug, Default)]
pub(crate) struct Inbox {
    state: Mutex<State>,
    arrived: Condvar,
}

impl Inbox {
    /// File a notification that came over the control plane from `from`.
    /// `Ok` (the sender is answered with an acknowledgement) also for a
    /// resend of one already filed, which is dropped: each arrives once,
    /// in its stream's order.
    ///
    /// # Errors
    /// `SqFull` when [`INBOX_MAX`] are waiting; `Shutdown` once the engine
    /// is going away. Nothing is filed either way.
    pub(crate) fn file(&self, from: IpAddr, f: NotifyFrame) -> Result<()> {
        let mut st = self.state.lock();
        if st.closed {
            return Err(closed());
        }
        st.ticks += 1;
        let (key, now) = ((from, f.sender), st.ticks);
        if let Some((last, heard)) = st.seen.get_mut(&key) {
            *heard = now;
            if f.seq <= *last {
                return Ok(());
            }
        }
        if st.queue.len() >= INBOX_MAX {
            return Err(full());
        }
        if st.seen.len() >= STREAMS_MAX && !st.seen.contains_key(&key) {
            let oldest = st
                .seen
                .iter()
                .min_by_key(|(_, (_, heard))| *heard)
                .map(|(k, _)| *k);
            if let Some(k) = oldest {
                st.seen.remove(&k);
            }
        }
        st.seen.insert(key, (f.seq, now));
        st.queue.push_back(Received {
            from: f.from,
            name: f.name,
            msg: f.msg,
        });
        drop(st);
        self.arrived.notify_one();
        Ok(())
    }

    /// File one this engine sent itself (no sequence: nothing is resent).
    pub(crate) fn file_local(&self, r: Received) -> Result<()> {
        let mut st = self.state.lock();
        if st.closed {
            return Err(closed());
        }
        if st.queue.len() >= INBOX_MAX {
            return Err(full());
        }
        st.queue.push_back(r);
        drop(st);
        self.arrived.notify_one();
        Ok(())
    }

    /// The engine is going away: from now on every sender is told
    /// `Shutdown` (its message fails rather than land where nobody reads).
    pub(crate) fn close(&self) {
        self.state.lock().closed = true;
    }

    /// Everything waiting, oldest first.
    pub(crate) fn take_all(&self) -> Vec<Received> {
        let mut st = self.state.lock();
        st.queue.drain(..).collect()
    }

    /// The oldest waiting, if any.
    pub(crate) fn try_take(&self) -> Option<Received> {
        self.state.lock().queue.pop_front()
    }

    /// The oldest waiting, after waiting up to `timeout` for one.
    ///
    /// # Errors
    /// `Timeout` when none arrived in time.
    pub(crate) fn wait(&self, timeout: Duration) -> Result<Received> {
        let end = Instant::now().checked_add(timeout);
        let mut st = self.state.lock();
        loop {
            if let Some(r) = st.queue.pop_front() {
                return Ok(r);
            }
            let left = match end {
                Some(end) => end.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!("no notification within {timeout:?}"),
                ));
            }
            self.arrived.wait_for(&mut st, left);
        }
    }
}

fn closed() -> Error {
    Error::new(
        ErrorKind::Shutdown,
        "the receiving engine is shutting down; notification not taken",
    )
}

fn full() -> Error {
    Error::new(
        ErrorKind::SqFull,
        format!("the receiver holds {INBOX_MAX} notifications not yet taken; try again"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::net::Ipv4Addr;

    const HERE: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    fn frame(sender: u64, seq: u64, name: &str) -> NotifyFrame {
        NotifyFrame {
            sender,
            from: format!("peer-{sender}"),
            seq,
            name: name.into(),
            msg: vec![seq as u8],
        }
    }

    #[test]
    fn a_resend_is_dropped_and_order_is_kept_per_sender() {
        let inbox = Inbox::default();
        inbox.file(HERE, frame(1, 1, "a")).unwrap();
        inbox.file(HERE, frame(2, 1, "x")).unwrap();
        inbox.file(HERE, frame(1, 1, "a")).unwrap(); // resend after a lost ack
        inbox.file(HERE, frame(1, 2, "b")).unwrap();
        inbox.file(HERE, frame(1, 4, "d")).unwrap(); // 3 was given up by its sender
        inbox.file(HERE, frame(1, 3, "c")).unwrap(); // older than the last: a resend
        let names: Vec<_> = inbox.take_all().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["a", "x", "b", "d"]);
        assert!(inbox.take_all().is_empty());
    }

    #[test]
    fn a_full_inbox_refuses_without_losing_or_marking_seen() {
        let inbox = Inbox::default();
        for seq in 1..=INBOX_MAX as u64 {
            inbox.file(HERE, frame(1, seq, "n")).unwrap();
        }
        let next = INBOX_MAX as u64 + 1;
        assert_eq!(
            inbox.file(HERE, frame(1, next, "n")).unwrap_err().kind(),
            ErrorKind::SqFull
        );
        assert_eq!(inbox.wait(Duration::ZERO).unwrap().msg, vec![1]);
        // Refused before, so not a duplicate now.
        inbox.file(HERE, frame(1, next, "last")).unwrap();
        assert_eq!(inbox.take_all().last().unwrap().name, "last");
    }

    #[test]
    fn wait_times_out_then_wakes_on_arrival() {
        let inbox = std::sync::Arc::new(Inbox::default());
        assert_eq!(
            inbox.wait(Duration::from_millis(5)).unwrap_err().kind(),
            ErrorKind::Timeout
        );
        let i2 = inbox.clone();
        let t = std::thread::spawn(move || i2.wait(Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        inbox.file(HERE, frame(9, 1, "late")).unwrap();
        assert_eq!(t.join().unwrap().unwrap().name, "late");
    }

    #[test]
    fn a_stream_id_from_another_address_is_another_stream() {
        let inbox = Inbox::default();
        let elsewhere = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9));
        // A forger elsewhere claims the stream with a huge seq ...
        inbox.file(elsewhere, frame(1, u64::MAX, "forged")).unwrap();
        // ... and the real stream's messages still arrive.
        inbox.file(HERE, frame(1, 1, "real")).unwrap();
        let names: Vec<_> = inbox.take_all().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["forged", "real"]);
    }

    #[test]
    fn a_closed_inbox_takes_nothing() {
        let inbox = Inbox::default();
        inbox.close();
        assert_eq!(
            inbox.file(HERE, frame(1, 1, "x")).unwrap_err().kind(),
            ErrorKind::Shutdown
        );
        assert!(inbox.take_all().is_empty());
    }
}
