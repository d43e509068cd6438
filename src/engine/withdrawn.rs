//! What `unregister_memory` and `close_segment` took out of their tables
//! and still hold: a region or segment leaves its table at once (new
//! requests are refused), but stays alive until the drain that waits for
//! the tasks holding it finishes, which a timed-out call leaves for a later
//! call to finish.

use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

/// Withdrawn items, held until their drain finishes.
pub(super) struct Withdrawn<T> {
    items: Mutex<Vec<Arc<T>>>,
}

impl<T> Default for Withdrawn<T> {
    fn default() -> Self {
        Withdrawn {
            items: Mutex::new(Vec::new()),
        }
    }
}

impl<T> Withdrawn<T> {
    fn items(&self) -> MutexGuard<'_, Vec<Arc<T>>> {
        self.items.lock()
    }

    /// Hold `item` until [`release`](Self::release).
    pub(super) fn hold(&self, item: Arc<T>) {
        self.items().push(item);
    }

    /// The held item `is` picks (withdrawn by an earlier call that has not
    /// finished).
    pub(super) fn find(&self, is: impl Fn(&T) -> bool) -> Option<Arc<T>> {
        self.items().iter().find(|t| is(t)).cloned()
    }

    /// Its drain finished: let go of what `is` picks.
    pub(super) fn release(&self, is: impl Fn(&T) -> bool) {
        self.items().retain(|t| !is(t));
    }

    /// Every item held now.
    pub(super) fn snapshot(&self) -> Vec<Arc<T>> {
        self.items().clone()
    }
}
