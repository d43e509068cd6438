//! The fate of one notification: pending, delivered, or failed with a
//! reason. The lane settles it; `send_notification` and the batch it is
//! attached to wait on it or read it.

use parking_lot::{Condvar, Mutex};

use tent_rings::ErrorKind;

use crate::error::{Error, Result};

/// The fate of one message: pending, delivered, or failed with a reason.
#[derive(Debug, Default)]
pub(crate) struct Delivery {
    result: Mutex<Option<std::result::Result<(), (ErrorKind, String)>>>,
    settled: Condvar,
    /// Bumped when it settles: a daemon client's word, which the client
    /// waits on before it asks the daemon how its message fared.
    bell: Option<crate::doorbell::SharedWord>,
}

impl Delivery {
    /// One whose settling also rings `bell`.
    pub(crate) fn ringing(bell: crate::doorbell::SharedWord) -> Delivery {
        Delivery {
            bell: Some(bell),
            ..Delivery::default()
        }
    }

    /// Settled and how, with the failure's words: `None` while pending.
    pub(crate) fn outcome(&self) -> Option<Result<()>> {
        self.result.lock().as_ref().map(|r| match r {
            Ok(()) => Ok(()),
            Err((kind, text)) => Err(Error::new(*kind, text.clone())),
        })
    }

    pub(crate) fn settle(&self, r: &Result<()>) {
        let r = match r {
            Ok(()) => Ok(()),
            Err(e) => {
                // Without the kind's prefix: `wait` puts it back.
                let text = e.to_string();
                let prefix = format!("{}: ", e.kind());
                let text = text
                    .strip_prefix(&prefix)
                    .map(str::to_owned)
                    .unwrap_or(text);
                Err((e.kind(), text))
            }
        };
        *self.result.lock() = Some(r);
        self.settled.notify_all();
        if let Some(b) = &self.bell {
            b.ring();
        }
    }

    /// `None` while pending; then `Ok`, or the failure's kind.
    pub(crate) fn state(&self) -> Option<std::result::Result<(), ErrorKind>> {
        self.result
            .lock()
            .as_ref()
            .map(|r| r.as_ref().map(|_| ()).map_err(|(k, _)| *k))
    }

    /// [`Delivery::wait`], giving up after `timeout`: `None` while still
    /// pending.
    #[cfg(test)]
    pub(crate) fn wait_timeout(&self, timeout: std::time::Duration) -> Option<Result<()>> {
        let end = crate::deadline::after(timeout);
        let mut r = self.result.lock();
        while r.is_none() {
            if self.settled.wait_until(&mut r, end).timed_out() {
                return None;
            }
        }
        drop(r);
        Some(self.wait())
    }

    /// Block until it is settled.
    pub(crate) fn wait(&self) -> Result<()> {
        let mut r = self.result.lock();
        loop {
            match &*r {
                Some(Ok(())) => return Ok(()),
                Some(Err((kind, text))) => return Err(Error::new(*kind, text.clone())),
                None => self.settled.wait(&mut r),
            }
        }
    }
}
