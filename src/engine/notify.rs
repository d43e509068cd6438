//! Notifications through the engine: send one to a segment's owner, attach
//! one to a submission, take what arrived (see [`crate::notify`]).

use std::sync::Arc;
use std::time::Duration;

use tent_rings::{SegmentId, Sqe};

use super::{BatchId, Embedded};
use crate::deadline::after as deadline_after;
use crate::error::{Error, Result};
use crate::notify::delivery::Delivery;
use crate::notify::inbox::Inbox;
use crate::notify::mailboxes::Mailboxes;
use crate::notify::outbox::{After, Dest, Outbox};
use crate::notify::{Notification, Received};

/// This engine's notifications: those received and not taken yet (filed
/// by the control server), and those on their way out, a lane per peer.
pub(super) struct Mailbox {
    inbox: Arc<Inbox>,
    /// Where the control server files: `inbox`, or a daemon client's.
    mailboxes: Arc<Mailboxes>,
    outbox: Outbox,
}

impl Mailbox {
    /// Over `inbox` (which the control server files into, through
    /// `mailboxes`) and `outbox`.
    pub(super) fn new(inbox: Arc<Inbox>, mailboxes: Arc<Mailboxes>, outbox: Outbox) -> Mailbox {
        Mailbox {
            inbox,
            mailboxes,
            outbox,
        }
    }

    /// Teardown: nothing more is taken or leaves; peers sending now are
    /// told `Shutdown`, and what is queued here fails `Shutdown`.
    pub(super) fn close(&self) {
        self.inbox.close();
        self.outbox.stop();
    }
}

impl Embedded {
    pub(crate) fn send_notification(&self, segment: SegmentId, n: &Notification) -> Result<()> {
        let delivery = Arc::new(Delivery::default());
        self.queue_notification(0, segment, n, delivery.clone())?;
        delivery.wait()
    }

    /// Queue `n` for `segment`'s owner, sent as this engine (`from` 0) or
    /// as its daemon client with mailbox `from`; its fate goes to
    /// `delivery` (untouched when this fails).
    pub(crate) fn queue_notification(
        &self,
        from: u64,
        segment: SegmentId,
        n: &Notification,
        delivery: Arc<Delivery>,
    ) -> Result<()> {
        n.check()?;
        let dest = self.notify_dest(from, segment)?;
        let deadline = deadline_after(self.mail.outbox.bound());
        self.mail
            .outbox
            .enqueue(dest, n.clone(), None, deadline, delivery)
    }

    pub(crate) fn submit_with_notification(
        &self,
        batch: BatchId,
        requests: &[Sqe],
        n: &Notification,
    ) -> Result<()> {
        let first = crate::notify::submission_target(requests, n)?;
        let dest = self.notify_dest(0, first)?;
        // By the latest of the requests' deadlines their data has landed
        // or failed; the message has the usual bound after that.
        let now_ns = crate::clock::monotonic_ns();
        let default_ns =
            now_ns.saturating_add(crate::clock::nanos(self.shared.config.default_timeout_ms));
        let data_ns = requests
            .iter()
            .map(|r| match r.deadline_ns() {
                0 => default_ns,
                d => d,
            })
            .max()
            .unwrap_or(default_ns);
        let deadline = deadline_after(
            Duration::from_nanos(data_ns.saturating_sub(now_ns))
                .saturating_add(self.mail.outbox.bound()),
        );
        let b = self.batches.get(batch)?;
        // Attached before the tasks exist, so nobody sees the batch done
        // between its data and its notification.
        let delivery = Arc::new(Delivery::default());
        b.attach_note(delivery.clone());
        let tasks = match self.submit_to(&b, requests, Vec::new()) {
            Ok(t) => t,
            Err(e) => {
                b.detach_note(&delivery);
                return Err(e);
            }
        };
        let watched = b.clone();
        let after: After = Box::new(move || watched.outcome(tasks.clone()));
        if let Err(e) =
            self.mail
                .outbox
                .enqueue(dest, n.clone(), Some(after), deadline, delivery.clone())
        {
            // The data is queued; the batch reports the notification's
            // failure as its own.
            delivery.settle(&Err(Error::new(e.kind(), e.context().to_owned())));
            return Err(e);
        }
        Ok(())
    }

    /// Daemon client `mailbox` is gone: what it queued and is not on the
    /// wire now is dropped (`Canceled`).
    pub(crate) fn drop_notifications_from(&self, mailbox: u64) {
        self.mail.outbox.drop_sender(mailbox);
    }

    /// Where notifications for this engine's daemon clients are filed.
    pub(crate) fn mailboxes(&self) -> &Arc<Mailboxes> {
        &self.mail.mailboxes
    }

    pub(crate) fn recv_notifications(&self) -> Vec<Received> {
        self.mail.inbox.take_all()
    }

    pub(crate) fn try_notification(&self) -> Option<Received> {
        self.mail.inbox.try_take()
    }

    pub(crate) fn wait_notification(&self, timeout: Duration) -> Result<Received> {
        self.mail.inbox.wait(timeout)
    }

    /// Where notifications to `segment`'s owner go (the client its name
    /// ended with, if it named one), sent as mailbox `from`.
    fn notify_dest(&self, from: u64, segment: SegmentId) -> Result<Dest> {
        if segment == SegmentId::LOCAL && from == 0 {
            return Ok(Dest::Local);
        }
        let seg = self.open_segment_by_id(segment)?;
        match seg.control() {
            Some(addr) => Ok(Dest::Peer {
                addr: addr.to_owned(),
                from,
                to: seg.mailbox().unwrap_or(0),
            }),
            None => Err(Error::invalid(format!(
                "segment {:?} was opened by its shm name; notifications travel on the control \
                 plane: open it by its owner's segment name (Engine::segment_name) instead",
                seg.name()
            ))),
        }
    }
}
