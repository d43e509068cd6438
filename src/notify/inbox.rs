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
/// Sender streams remembered at once (dedup), from every source together.
const STREAMS_MAX: usize = 4096;
/// Sender streams remembered at once from one source (an IPv4 address, an
/// IPv6 /64): a host that opens streams faster than they expire is refused
/// (`SqFull`, its senders try again later) rather than forget its own
/// streams early.
const SOURCE_STREAMS_MAX: usize = 1024;
/// The longest resend window taken from a frame by default (a claim past
/// the inbox's bound is cut to it): `max_timeout_ms` plus
/// `default_timeout_ms` at their defaults, the furthest deadline a sender
/// with this engine's configuration gives a notification.
pub(crate) const DEFAULT_RESEND_MAX: Duration = Duration::from_secs(3600 + 30);
/// Kept past a frame's resend window: covers a resend that left the
/// sender just before its deadline and arrives late (a new connection's
/// handshake, then the server's read of the frame).
const RESEND_SLACK: Duration = Duration::from_secs(30);

/// A sender stream: where it connects from and the id it drew. Keyed by
/// the address too, so a peer elsewhere cannot silence a stream by
/// forging its id.
type StreamKey = (IpAddr, u64);

/// Who counts as one source for the bounds: an IPv4 address (an IPv4-mapped
/// IPv6 one too), an IPv6 /64 (one host may hold a whole prefix).
fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
    }
}

/// What the inbox remembers of a stream.
#[derive(Debug, Clone, Copy)]
struct Stream {
    /// The highest sequence number taken from it.
    last: u64,
    /// Until when a message of it may still arrive again: its frames'
    /// resend windows plus [`RESEND_SLACK`]. Past it the stream may be
    /// forgotten: its sender gave up on everything it sent.
    until: Instant,
}

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<Received>,
    seen: HashMap<StreamKey, Stream>,
    /// Streams in `seen` per source ([`source_of`]).
    per_source: HashMap<IpAddr, usize>,
    /// No stream in `seen` expires before this: a purge before it finds
    /// nothing (`None`: not known, look).
    next_expiry: Option<Instant>,
    /// The engine is going away: nothing more is filed.
    closed: bool,
}

impl State {
    /// Count one stream less for `ip`'s source.
    fn uncount(per_source: &mut HashMap<IpAddr, usize>, ip: IpAddr) {
        let src = source_of(ip);
        if let Some(n) = per_source.get_mut(&src) {
            *n -= 1;
            if *n == 0 {
                per_source.remove(&src);
            }
        }
    }

    /// Forget the streams whose resend windows ended by `now`.
    fn purge(&mut self, now: Instant) {
        if self.next_expiry.is_some_and(|t| now < t) {
            return;
        }
        let per_source = &mut self.per_source;
        let mut next: Option<Instant> = None;
        self.seen.retain(|(ip, _), s| {
            if s.until > now {
                next = Some(next.map_or(s.until, |t| t.min(s.until)));
                return true;
            }
            State::uncount(per_source, *ip);
            false
        });
        self.next_expiry = next;
    }

    /// Room to remember one more stream from `ip`, after forgetting the
    /// expired ones if need be. When every stream is still in its window:
    /// a source at [`SOURCE_STREAMS_MAX`] is refused; a full table forgets
    /// the first-expiring stream of the source holding the most, if that
    /// is more than its fair share (all streams over the sources, the
    /// newcomer's included). So a source within its share never loses a
    /// stream to another's, and no set of sources locks the others out.
    fn room_for(&mut self, ip: IpAddr, now: Instant) -> Result<()> {
        let src = source_of(ip);
        let mine = |st: &State| st.per_source.get(&src).copied().unwrap_or(0);
        if self.seen.len() >= STREAMS_MAX || mine(self) >= SOURCE_STREAMS_MAX {
            self.purge(now);
        }
        if mine(self) >= SOURCE_STREAMS_MAX {
            return Err(self.crowded(ip, src));
        }
        if self.seen.len() < STREAMS_MAX {
            return Ok(());
        }
        let sources = self.per_source.len() + usize::from(!self.per_source.contains_key(&src));
        let fair = STREAMS_MAX / sources.max(1);
        let Some((big, held)) = self
            .per_source
            .iter()
            .max_by_key(|(_, n)| **n)
            .map(|(s, n)| (*s, *n))
        else {
            return Err(self.crowded(ip, src));
        };
        if held <= fair {
            return Err(self.crowded(ip, src));
        }
        let victim = self
            .seen
            .iter()
            .filter(|((at, _), _)| source_of(*at) == big)
            .min_by_key(|(_, s)| s.until)
            .map(|(k, _)| *k);
        if let Some(k) = victim {
            self.seen.remove(&k);
            State::uncount(&mut self.per_source, k.0);
            crate::lograte::warn_limited!(
                (big, "notify-streams-over-share"),
                source = %big,
                held,
                fair,
                "notification streams over their share: the first to expire forgotten early"
            );
        }
        Ok(())
    }

    fn crowded(&self, ip: IpAddr, src: IpAddr) -> Error {
        Error::new(
            ErrorKind::SqFull,
            format!(
                "the receiver remembers {} notification streams ({} from {ip}'s source {src}) \
                 whose senders may still resend; try again",
                self.seen.len(),
                self.per_source.get(&src).copied().unwrap_or(0)
            ),
        )
    }
}

/// How long after `now` a resend of `f` may still arrive, its claim cut
/// to `max`.
fn resend_until(f: &NotifyFrame, now: Instant, max: Duration) -> Instant {
    let window = Duration::from_millis(f.resend_ms).min(max) + RESEND_SLACK;
    now + window
}

/// What the engine has received and the application not yet taken.
#[derive(Debug)]
pub(crate) struct Inbox {
    state: Mutex<State>,
    arrived: Condvar,
    /// The longest resend window a frame may claim.
    resend_max: Duration,
    /// Notifications held at once.
    max: usize,
}

impl Default for Inbox {
    fn default() -> Inbox {
        Inbox::new(DEFAULT_RESEND_MAX)
    }
}

impl Inbox {
    /// An empty inbox that keeps a stream at most `resend_max` (plus the
    /// slack) past its last frame: the furthest deadline this engine's
    /// configuration gives a notification.
    pub(crate) fn new(resend_max: Duration) -> Inbox {
        Inbox::holding(resend_max, INBOX_MAX)
    }

    /// [`Inbox::new`], holding at most `max` notifications (a daemon
    /// client's, which the daemon keeps for every client).
    pub(crate) fn holding(resend_max: Duration, max: usize) -> Inbox {
        Inbox {
            state: Mutex::default(),
            arrived: Condvar::new(),
            resend_max,
            max,
        }
    }

    /// File a notification that came over the control plane from `from`
    /// at `now`. `Ok` (the sender is answered with an acknowledgement) also
    /// for a resend of one already filed, which is dropped: each arrives
    /// once, in its stream's order. A stream is remembered until its
    /// sender can no longer resend (the frame's `resend_ms`, at most the
    /// inbox's bound, plus [`RESEND_SLACK`]), so no number of other
    /// sources' streams meanwhile makes a resend look new while its source
    /// keeps within its share (see `State::room_for`).
    ///
    /// # Errors
    /// `SqFull` when [`INBOX_MAX`] (its `max`) are waiting, or when a new stream finds
    /// [`SOURCE_STREAMS_MAX`] streams of its source still in their resend
    /// windows, or the table full with no source over its fair share (see
    /// `State::room_for`); `Shutdown` once the engine is going away.
    /// Nothing is filed either way.
    pub(crate) fn file(&self, from: IpAddr, f: NotifyFrame, now: Instant) -> Result<()> {
        let mut st = self.state.lock();
        if st.closed {
            return Err(closed());
        }
        let key = (from, f.sender);
        let until = resend_until(&f, now, self.resend_max);
        if let Some(s) = st.seen.get_mut(&key) {
            s.until = s.until.max(until);
            if f.seq <= s.last {
                return Ok(());
            }
        }
        if st.queue.len() >= self.max {
            return Err(full(self.max));
        }
        match st.seen.get_mut(&key) {
            Some(s) => s.last = f.seq,
            None => {
                if let Err(e) = st.room_for(from, now) {
                    crate::lograte::warn_limited!(
                        (from, "notify-streams"),
                        peer = %from,
                        "{e}"
                    );
                    return Err(e);
                }
                st.seen.insert(key, Stream { last: f.seq, until });
                *st.per_source.entry(source_of(from)).or_insert(0) += 1;
                st.next_expiry = Some(st.next_expiry.map_or(until, |t| t.min(until)));
            }
        }
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
        if st.queue.len() >= self.max {
            return Err(full(self.max));
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

fn full(max: usize) -> Error {
    Error::new(
        ErrorKind::SqFull,
        format!("the receiver holds {max} notifications not yet taken; try again"),
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
            resend_ms: 1_000,
            to: 0,
        }
    }

    #[test]
    fn a_resend_is_dropped_and_order_is_kept_per_sender() {
        let inbox = Inbox::default();
        inbox.file(HERE, frame(1, 1, "a"), Instant::now()).unwrap();
        inbox.file(HERE, frame(2, 1, "x"), Instant::now()).unwrap();
        inbox.file(HERE, frame(1, 1, "a"), Instant::now()).unwrap(); // resend after a lost ack
        inbox.file(HERE, frame(1, 2, "b"), Instant::now()).unwrap();
        inbox.file(HERE, frame(1, 4, "d"), Instant::now()).unwrap(); // 3 was given up by its sender
        inbox.file(HERE, frame(1, 3, "c"), Instant::now()).unwrap(); // older than the last: a resend
        let names: Vec<_> = inbox.take_all().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["a", "x", "b", "d"]);
        assert!(inbox.take_all().is_empty());
    }

    #[test]
    fn a_full_inbox_refuses_without_losing_or_marking_seen() {
        let inbox = Inbox::default();
        for seq in 1..=INBOX_MAX as u64 {
            inbox
                .file(HERE, frame(1, seq, "n"), Instant::now())
                .unwrap();
        }
        let next = INBOX_MAX as u64 + 1;
        assert_eq!(
            inbox
                .file(HERE, frame(1, next, "n"), Instant::now())
                .unwrap_err()
                .kind(),
            ErrorKind::SqFull
        );
        assert_eq!(inbox.wait(Duration::ZERO).unwrap().msg, vec![1]);
        // Refused before, so not a duplicate now.
        inbox
            .file(HERE, frame(1, next, "last"), Instant::now())
            .unwrap();
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
        inbox
            .file(HERE, frame(9, 1, "late"), Instant::now())
            .unwrap();
        assert_eq!(t.join().unwrap().unwrap().name, "late");
    }

    #[test]
    fn a_stream_id_from_another_address_is_another_stream() {
        let inbox = Inbox::default();
        let elsewhere = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9));
        // A forger elsewhere claims the stream with a huge seq ...
        inbox
            .file(elsewhere, frame(1, u64::MAX, "forged"), Instant::now())
            .unwrap();
        // ... and the real stream's messages still arrive.
        inbox
            .file(HERE, frame(1, 1, "real"), Instant::now())
            .unwrap();
        let names: Vec<_> = inbox.take_all().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["forged", "real"]);
    }

    /// A resend from a stream quiet while thousands of others came and
    /// went is still a resend: a stream is remembered until its sender can
    /// no longer resend, and new streams past the bounds are refused (and
    /// retried by their senders) instead of crowding it out.
    #[test]
    fn no_number_of_other_streams_lets_a_resend_through() {
        let inbox = Inbox::default();
        let t0 = Instant::now();
        let z = 0x5a5a;
        inbox.file(HERE, frame(z, 1, "z"), t0).unwrap();
        let (mut filed, mut refused) = (0, 0);
        for i in 0..4200u64 {
            match inbox.file(HERE, frame(1_000 + i * 7919, 1, "other"), t0) {
                Ok(()) => filed += 1,
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::SqFull, "{e}");
                    refused += 1;
                }
            }
            if i % 1000 == 0 {
                inbox.take_all();
            }
        }
        assert_eq!(filed, SOURCE_STREAMS_MAX - 1, "the source's bound");
        assert_eq!(refused, 4200 - filed);
        inbox.take_all();
        // The lost acknowledgement's resend, within Z's window.
        inbox
            .file(HERE, frame(z, 1, "z"), t0 + Duration::from_secs(1))
            .unwrap();
        assert!(inbox.take_all().is_empty(), "delivered twice");
        // Another address is not crowded out by this one.
        let elsewhere = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9));
        inbox.file(elsewhere, frame(z, 1, "there"), t0).unwrap();
        assert_eq!(inbox.take_all().len(), 1);
    }

    #[test]
    fn a_stream_is_forgotten_only_once_its_resend_window_passed() {
        let inbox = Inbox::default();
        let t0 = Instant::now();
        // Window 1 s plus the slack.
        let window = Duration::from_secs(1) + RESEND_SLACK;
        for i in 0..SOURCE_STREAMS_MAX as u64 {
            inbox.file(HERE, frame(i + 1, 1, "a"), t0).unwrap();
        }
        inbox.take_all();
        let newcomer = || frame(1 << 40, 1, "new");
        // Full, and nobody's window has passed.
        let just_before = t0 + window - Duration::from_millis(1);
        let e = inbox.file(HERE, newcomer(), just_before).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::SqFull);
        assert!(
            e.to_string().contains("1024 from 127.0.0.1's source"),
            "{e}"
        );
        // Stream 1 resent late in its window: its window starts again.
        inbox.file(HERE, frame(1, 1, "a"), just_before).unwrap();
        assert!(inbox.take_all().is_empty());
        // Past the first windows: the others are forgotten, the newcomer
        // taken, and stream 1 still known.
        inbox.file(HERE, newcomer(), t0 + window).unwrap();
        inbox.file(HERE, frame(1, 1, "a"), t0 + window).unwrap();
        let names: Vec<_> = inbox.take_all().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["new"]);
        // A forgotten stream's next message is new (its sender moved on).
        inbox.file(HERE, frame(2, 2, "b"), t0 + window).unwrap();
        assert_eq!(inbox.take_all().len(), 1);
    }

    #[test]
    fn a_claimed_window_is_capped() {
        let t0 = Instant::now();
        let mut f = frame(1, 1, "a");
        f.resend_ms = u64::MAX;
        let max = DEFAULT_RESEND_MAX;
        assert_eq!(resend_until(&f, t0, max), t0 + max + RESEND_SLACK);
        f.resend_ms = 0;
        assert_eq!(resend_until(&f, t0, max), t0 + RESEND_SLACK);
    }

    #[test]
    fn a_closed_inbox_takes_nothing() {
        let inbox = Inbox::default();
        inbox.close();
        assert_eq!(
            inbox
                .file(HERE, frame(1, 1, "x"), Instant::now())
                .unwrap_err()
                .kind(),
            ErrorKind::Shutdown
        );
        assert!(inbox.take_all().is_empty());
    }

    /// Sources flooding with the longest windows lock nobody else out: a
    /// full table forgets a stream of the source over its fair share, so a
    /// newcomer is taken at once, and a quiet source's stream (within its
    /// share) survives the flood, its resend still a resend.
    #[test]
    fn floods_from_other_sources_forget_their_own_streams_not_others() {
        let inbox = Inbox::default();
        let t0 = Instant::now();
        let quiet = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        inbox.file(quiet, frame(0x5a, 1, "z"), t0).unwrap();
        for src in 0..4u8 {
            let ip = IpAddr::V4(Ipv4Addr::new(10, 9, 9, src));
            for i in 0..SOURCE_STREAMS_MAX as u64 {
                let mut f = frame(i + 1, 1, "junk");
                f.resend_ms = u64::MAX;
                inbox.file(ip, f, t0).unwrap();
            }
            inbox.take_all();
        }
        let later = t0 + Duration::from_secs(10);
        let newcomer = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        inbox.file(newcomer, frame(77, 1, "new"), later).unwrap();
        // The quiet source's stream is still known: its resend is dropped.
        inbox.file(quiet, frame(0x5a, 1, "z"), later).unwrap();
        let names: Vec<_> = inbox.take_all().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["new"]);
        let st = inbox.state.lock();
        assert_eq!(st.seen.len(), STREAMS_MAX);
        assert_eq!(st.per_source.values().sum::<usize>(), STREAMS_MAX);
    }

    #[test]
    fn an_ipv6_host_counts_as_its_64_and_a_mapped_address_as_ipv4() {
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let b: IpAddr = "2001:db8::ffff:1234".parse().unwrap();
        assert_eq!(source_of(a), source_of(b));
        assert_ne!(source_of(a), source_of("2001:db8:0:1::1".parse().unwrap()));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(source_of(mapped), "10.0.0.1".parse::<IpAddr>().unwrap());
    }
}
