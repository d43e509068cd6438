//! The receiving side: notifications waiting for the application.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use tent_rings::ErrorKind;

use super::Received;
use crate::control::wire::NotifyFrame;
use crate::error::{Error, Result};

/// Notifications held at once. A sender that finds the inbox full is told
/// `SqFull` and tries again later (nothing is dropped): a peer cannot grow
/// this process past `INBOX_MAX` × 4 KiB.
pub const INBOX_MAX: usize = 4096;
/// Senders whose last sequence number is remembered (dedup). Past it the
/// entry of some other sender is forgotten; that sender's next message is
/// taken as new, which can only matter for a resend in flight at that
/// moment.
const SENDERS_MAX: usize = 4096;

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<Received>,
    /// Sender id → the highest sequence number taken from it.
    seen: HashMap<u64, u64>,
}

/// What the engine has received and the application not yet taken.
#[derive(Debug, Default)]
pub(crate) struct Inbox {
    state: Mutex<State>,
    arrived: Condvar,
}

impl Inbox {
    /// File a notification from the control plane. `Ok` (the sender is
    /// answered with an acknowledgement) also for a resend of one already
    /// filed, which is dropped: each arrives once, in the sender's order.
    ///
    /// # Errors
    /// `SqFull` when [`INBOX_MAX`] are waiting; nothing is filed.
    pub(crate) fn file(&self, f: NotifyFrame) -> Result<()> {
        let mut st = self.state.lock().expect("inbox poisoned");
        if st.seen.get(&f.sender).is_some_and(|&last| f.seq <= last) {
            return Ok(());
        }
        if st.queue.len() >= INBOX_MAX {
            return Err(full());
        }
        if st.seen.len() >= SENDERS_MAX && !st.seen.contains_key(&f.sender) {
            let forget = st.seen.keys().next().copied();
            if let Some(k) = forget {
                st.seen.remove(&k);
            }
        }
        st.seen.insert(f.sender, f.seq);
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
        let mut st = self.state.lock().expect("inbox poisoned");
        if st.queue.len() >= INBOX_MAX {
            return Err(full());
        }
        st.queue.push_back(r);
        drop(st);
        self.arrived.notify_one();
        Ok(())
    }

    /// Everything waiting, oldest first.
    pub(crate) fn take_all(&self) -> Vec<Received> {
        let mut st = self.state.lock().expect("inbox poisoned");
        st.queue.drain(..).collect()
    }

    /// The oldest waiting, after waiting up to `timeout` for one.
    ///
    /// # Errors
    /// `Timeout` when none arrived in time.
    pub(crate) fn wait(&self, timeout: Duration) -> Result<Received> {
        let end = Instant::now().checked_add(timeout);
        let mut st = self.state.lock().expect("inbox poisoned");
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
            st = self
                .arrived
                .wait_timeout(st, left)
                .expect("inbox poisoned")
                .0;
        }
    }
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
        inbox.file(frame(1, 1, "a")).unwrap();
        inbox.file(frame(2, 1, "x")).unwrap();
        inbox.file(frame(1, 1, "a")).unwrap(); // resend after a lost ack
        inbox.file(frame(1, 2, "b")).unwrap();
        inbox.file(frame(1, 4, "d")).unwrap(); // 3 was given up by its sender
        inbox.file(frame(1, 3, "c")).unwrap(); // older than the last: a resend
        let names: Vec<_> = inbox.take_all().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["a", "x", "b", "d"]);
        assert!(inbox.take_all().is_empty());
    }

    #[test]
    fn a_full_inbox_refuses_without_losing_or_marking_seen() {
        let inbox = Inbox::default();
        for seq in 1..=INBOX_MAX as u64 {
            inbox.file(frame(1, seq, "n")).unwrap();
        }
        let next = INBOX_MAX as u64 + 1;
        assert_eq!(
            inbox.file(frame(1, next, "n")).unwrap_err().kind(),
            ErrorKind::SqFull
        );
        assert_eq!(inbox.wait(Duration::ZERO).unwrap().msg, vec![1]);
        // Refused before, so not a duplicate now.
        inbox.file(frame(1, next, "last")).unwrap();
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
        inbox.file(frame(9, 1, "late")).unwrap();
        assert_eq!(t.join().unwrap().unwrap().name, "late");
    }
}
