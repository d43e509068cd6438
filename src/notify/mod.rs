//! Notifications: a short message to a peer engine, alone or attached to a
//! submission so that it arrives only after that submission's data landed.
//!
//! One mechanism for every transport: the control plane. A notification
//! must follow the data, and the sender knows the data has landed only
//! when the submission's tasks complete (an shm copy done, a TCP target's
//! acknowledgement, an RDMA WRITE's completion: the responder has placed
//! it). So the sender waits for that, then sends the message on the
//! authenticated control connection it already has to the peer, and the
//! peer's control server files it in its `Inbox`. A second channel per
//! transport (an RDMA SEND, a message slot in the shm file) would order the
//! message behind the data only on that transport, and a failover moves a
//! task to another.
//!
//! - `outbox`: the sender. One lane per peer, stepped by a fixed pool of
//!   threads (never two at once on one lane), so the peer's messages leave
//!   in the order they were given and a dead peer holds up only its own
//!   lane (and one thread, until its message's deadline). Each message
//!   carries its lane's stream id and a sequence number; a resend after a
//!   lost answer is recognised.
//! - `delivery`: one message's fate (pending, delivered, failed), what
//!   a sender and a batch wait on.
//! - `inbox`: the receiver. Bounded; duplicates dropped by (sender, seq);
//!   taken by polling or a blocking wait with a timeout.

pub(crate) mod delivery;
pub(crate) mod inbox;
pub(crate) mod mailboxes;
pub(crate) mod outbox;

pub use crate::control::wire::{MAX_NOTIFY_MSG, MAX_NOTIFY_NAME};
pub use inbox::INBOX_MAX;

use crate::error::{Error, Result};

/// The name of a daemon client's mailbox: the daemon's segment name, `#`,
/// the mailbox in 16 hex digits. It is what an attached engine's
/// `segment_name` says: a peer that opens it reaches the daemon's memory,
/// and its notifications reach that client.
pub(crate) fn mailbox_name(segment: &str, mailbox: u64) -> String {
    format!("{segment}#{mailbox:016x}")
}

/// A segment name split into the owner's name and the mailbox it ends
/// with, if it ends with one ([`mailbox_name`]'s form: 16 hex digits, not
/// all zero).
pub(crate) fn split_mailbox(name: &str) -> (&str, Option<u64>) {
    if let Some((base, hex)) = name.rsplit_once('#')
        && hex.len() == 16
        && hex.bytes().all(|b| b.is_ascii_hexdigit())
        && !base.is_empty()
        && let Ok(m) = u64::from_str_radix(hex, 16)
        && m != 0
    {
        return (base, Some(m));
    }
    (name, None)
}

/// The segment whose owner a notification attached to `requests` goes to:
/// the one they all name (`submit_with_notification`, embedded or
/// attached).
///
/// # Errors
/// `InvalidArgument` for `n` over its limits, no request, or requests
/// naming more than one segment.
pub(crate) fn submission_target(
    requests: &[tent_rings::Sqe],
    n: &Notification,
) -> Result<tent_rings::SegmentId> {
    n.check()?;
    let first = requests
        .first()
        .ok_or_else(|| Error::invalid("a notification needs at least one request"))?
        .remote()
        .segment;
    if requests.iter().any(|r| r.remote().segment != first) {
        return Err(Error::invalid(
            "the requests of a submission with a notification must all name one segment: \
             the notification goes to its owner",
        ));
    }
    Ok(first)
}

/// A notification to send: a name (what happened) and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// What it is about, at most [`MAX_NOTIFY_NAME`] bytes.
    pub name: String,
    /// Its message, at most [`MAX_NOTIFY_MSG`] bytes.
    pub msg: Vec<u8>,
}

impl Notification {
    /// A notification, checked against the limits.
    ///
    /// ```
    /// let n = tent::Notification::new("kv-ready", b"layer 3".to_vec())?;
    /// assert_eq!(n.name, "kv-ready");
    /// assert!(tent::Notification::new("x", vec![0; 4097]).is_err());
    /// # Ok::<(), tent::Error>(())
    /// ```
    ///
    /// # Errors
    /// `InvalidArgument` when the name or the message is over its limit.
    pub fn new(name: impl Into<String>, msg: impl Into<Vec<u8>>) -> Result<Notification> {
        let n = Notification {
            name: name.into(),
            msg: msg.into(),
        };
        n.check()?;
        Ok(n)
    }

    /// The limits (the fields are public, so a send checks again).
    pub(crate) fn check(&self) -> Result<()> {
        if self.name.len() > MAX_NOTIFY_NAME {
            return Err(Error::invalid(format!(
                "notification name of {} bytes exceeds {MAX_NOTIFY_NAME}",
                self.name.len()
            )));
        }
        if self.msg.len() > MAX_NOTIFY_MSG {
            return Err(Error::invalid(format!(
                "notification message of {} bytes exceeds {MAX_NOTIFY_MSG}",
                self.msg.len()
            )));
        }
        Ok(())
    }
}

/// A notification received from a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The sender's segment name (what it calls itself: `ip:port`).
    pub from: String,
    /// What it is about.
    pub name: String,
    /// Its message.
    pub msg: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mailbox_name_splits_back_and_nothing_else_does() {
        let n = mailbox_name("10.0.0.1:7000", 0xfeed);
        assert_eq!(n, "10.0.0.1:7000#000000000000feed");
        assert_eq!(split_mailbox(&n), ("10.0.0.1:7000", Some(0xfeed)));
        for plain in [
            "10.0.0.1:7000",
            "prefill-0",
            "#000000000000feed",
            "a#feed",
            "a#000000000000000g",
            "a#0000000000000000",
            "a#+00000000000feed",
        ] {
            assert_eq!(split_mailbox(plain), (plain, None), "{plain}");
        }
    }
}
