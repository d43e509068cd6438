//! `RailLinks`: one link watch (rtnetlink) per engine for every
//! transport's rails.
//!
//! A rail's local device is a network interface (a TCP rail's, or the
//! netdev under a RoCE NIC's GID). The engine makes one `RailLinks` and
//! hands it to the transports at install; the first that asks starts the
//! watch ([`RailLinks::start`]), and each registers a [`LinkListener`] for
//! what it attaches (a TCP peer; the RDMA NICs). What a link change does is
//! the transport's: TCP resets the rail's connections, RDMA marks the NIC
//! down and evacuates its QPs at the next poll. Listeners are held weakly,
//! so a dropped peer needs no unregistering. The engine stops the watch
//! (joins its thread) when it drops, after its transports.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::netlink::{LinkEvent, LinkWatch};

/// Told of every link change on the machine.
pub(crate) trait LinkListener: Send + Sync {
    /// Interface `ifindex` went up (`true`) or down.
    fn link_changed(&self, ifindex: u32, up: bool);
}

type Listeners = Arc<Mutex<Vec<Weak<dyn LinkListener>>>>;

/// The engine's link watch and who listens to it.
pub struct RailLinks {
    listeners: Listeners,
    watch: Mutex<Option<LinkWatch>>,
    /// Started (or tried to start) once.
    tried: std::sync::Once,
}

impl Default for RailLinks {
    fn default() -> Self {
        RailLinks {
            listeners: Arc::default(),
            watch: Mutex::new(None),
            tried: std::sync::Once::new(),
        }
    }
}

impl std::fmt::Debug for RailLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RailLinks").finish_non_exhaustive()
    }
}

impl RailLinks {
    /// A watch not started yet.
    pub(crate) fn new() -> Arc<RailLinks> {
        Arc::new(RailLinks::default())
    }

    /// Start watching (once; later calls do nothing). Without rtnetlink
    /// rails learn of a dead link from their own errors only: said once.
    pub(crate) fn start(&self) {
        self.tried.call_once(|| {
            let listeners = self.listeners.clone();
            let on_event = move |ev: LinkEvent| notify(&listeners, ev.index, ev.up);
            match LinkWatch::start(on_event) {
                Ok(w) => *self.watch.lock() = Some(w),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch link state (rtnetlink); rails rely on their own errors")
                }
            }
        });
    }

    /// Tell `listener` of every link change from now on, while it lives.
    pub(crate) fn listen(&self, listener: Weak<dyn LinkListener>) {
        let mut all = self.listeners.lock();
        all.retain(|w| w.strong_count() > 0);
        all.push(listener);
    }

    /// Stop the watch and join its thread (the engine, on drop).
    pub(crate) fn stop(&self) {
        drop(self.watch.lock().take());
    }

    /// Hand a change to every listener, as the watch does (tests).
    #[doc(hidden)]
    #[cfg(test)]
    pub(crate) fn deliver(&self, ifindex: u32, up: bool) {
        notify(&self.listeners, ifindex, up);
    }
}

/// Tell every live listener of a change, pruning the dead ones.
fn notify(listeners: &Listeners, ifindex: u32, up: bool) {
    // Upgrade under the lock, call outside it: a listener may take its own
    // locks (TCP: the rail's connections).
    let live: Vec<Arc<dyn LinkListener>> = {
        let mut all = listeners.lock();
        all.retain(|w| w.strong_count() > 0);
        all.iter().filter_map(Weak::upgrade).collect()
    };
    for l in live {
        l.link_changed(ifindex, up);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    struct Count(AtomicU32);

    impl LinkListener for Count {
        fn link_changed(&self, ifindex: u32, up: bool) {
            if up {
                self.0.fetch_add(ifindex, Ordering::Relaxed);
            }
        }
    }

    #[test]
    fn listeners_are_held_weakly() {
        let links = RailLinks::new();
        let a = Arc::new(Count(AtomicU32::new(0)));
        let b = Arc::new(Count(AtomicU32::new(0)));
        links.listen(Arc::downgrade(&a) as Weak<dyn LinkListener>);
        links.listen(Arc::downgrade(&b) as Weak<dyn LinkListener>);
        links.deliver(3, true);
        drop(b);
        links.deliver(4, true);
        assert_eq!(a.0.load(Ordering::Relaxed), 7);
        links.listen(Arc::downgrade(&a) as Weak<dyn LinkListener>);
        assert_eq!(
            links.listeners.lock().len(),
            2,
            "the dead one pruned"
        );
    }
}
