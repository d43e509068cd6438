//! Where a notification that came over the control plane is filed: the
//! engine's own inbox, or, in a daemon (`tentd`), the inbox of the client
//! it names (`NotifyFrame::to`, from the `owner#mailbox` name the sender
//! opened). A client takes its notifications over the daemon's socket;
//! each filing bumps a futex word in a page the client maps, so it sleeps
//! until one comes instead of asking.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::RwLock;
use tent_rings::ErrorKind;

use super::inbox::Inbox;
use crate::control::wire::NotifyFrame;
use crate::doorbell::SharedWord;
use crate::error::{Error, Result};

/// Notifications one client of a daemon holds at once (the daemon holds
/// every client's: at most this × 4 KiB each).
pub(crate) const CLIENT_INBOX_MAX: usize = 256;

/// A daemon client's inbox, and the word its filings bump.
pub(crate) struct ClientMail {
    pub(crate) inbox: Inbox,
    /// In memory the client maps: it waits there.
    pub(crate) arrived: SharedWord,
}

/// The engine's inbox and, in a daemon, its clients'.
pub(crate) struct Mailboxes {
    own: Arc<Inbox>,
    /// Whether the engine takes notifications of its own (a daemon, which
    /// no application reads, does not: it says to address a client).
    own_served: std::sync::atomic::AtomicBool,
    clients: RwLock<HashMap<u64, Arc<ClientMail>>>,
}

impl Mailboxes {
    /// Over the engine's own inbox, with no client.
    pub(crate) fn new(own: Arc<Inbox>) -> Mailboxes {
        Mailboxes {
            own,
            own_served: std::sync::atomic::AtomicBool::new(true),
            clients: RwLock::default(),
        }
    }

    /// The engine reads none of its own: a notification to it is refused.
    pub(crate) fn refuse_own(&self) {
        self.own_served
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// Take `mail` for the client with `mailbox`.
    pub(crate) fn add(&self, mailbox: u64, mail: Arc<ClientMail>) {
        self.clients.write().insert(mailbox, mail);
    }

    /// The client with `mailbox` is gone: what is sent to it from now on
    /// is refused, and what waits for it is dropped with its inbox.
    pub(crate) fn remove(&self, mailbox: u64) {
        if let Some(m) = self.clients.write().remove(&mailbox) {
            m.inbox.close();
        }
    }

    /// File `f`, from `ip` at `now`, where its `to` says.
    ///
    /// # Errors
    /// The inbox's ([`Inbox::file`]); `SegmentNotFound` for a mailbox no
    /// client here has (it detached, or the daemon restarted), and for the
    /// engine itself when it reads none.
    pub(crate) fn file(&self, ip: IpAddr, f: NotifyFrame, now: Instant) -> Result<()> {
        if f.to == 0 {
            if !self.own_served.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(Error::new(
                    ErrorKind::SegmentNotFound,
                    "this engine is a daemon (tentd): notify one of its clients, by the \
                     name its Engine::segment_name gives (owner#mailbox)",
                ));
            }
            return self.own.file(ip, f, now);
        }
        let to = f.to;
        let Some(mail) = self.clients.read().get(&to).cloned() else {
            return Err(Error::new(
                ErrorKind::SegmentNotFound,
                format!(
                    "no client with mailbox {to:016x} is attached here (it detached, or the daemon restarted)"
                ),
            ));
        };
        mail.inbox.file(ip, f, now)?;
        mail.arrived.ring();
        Ok(())
    }
}
