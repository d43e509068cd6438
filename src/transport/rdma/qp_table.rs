//! `QpTable`: the live QPs' send-queue controllers by (NIC, QP number),
//! for the async-event thread ([`super::events`]).

use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::flow::SqController;

/// The live QPs' controllers by (NIC, QP number), so the async-event
/// thread can take a QP's endpoint out of service when the device reports
/// the QP fatal (`IBV_EVENT_QP_FATAL`, `QP_REQ_ERR`, `QP_ACCESS_ERR`): it
/// marks the controller terminal, and the worker converges at its next
/// reserve. Written by the connector threads as each QP connects, read by
/// the event thread; a worker never touches it. Entries are weak: a
/// controller that is gone or terminal is pruned at the next insert, and
/// one controller has one entry (its latest QP).
#[derive(Debug, Default)]
pub(crate) struct QpTable {
    entries: Mutex<Vec<QpEntry>>,
}

#[derive(Debug)]
struct QpEntry {
    nic: usize,
    qp_num: u32,
    sq: Weak<SqController>,
}

impl QpTable {
    /// QP `qp_num` on NIC `nic` now posts under `sq`.
    pub(crate) fn watch(&self, nic: usize, qp_num: u32, sq: &Arc<SqController>) {
        let mut e = self.entries.lock();
        e.retain(|x| {
            // Replaced: the same QP filed again, or this controller's
            // earlier QP.
            let replaced = (x.nic == nic && x.qp_num == qp_num)
                || std::ptr::eq(x.sq.as_ptr(), Arc::as_ptr(sq));
            !replaced && x.sq.upgrade().is_some_and(|s| !s.is_terminal())
        });
        e.push(QpEntry {
            nic,
            qp_num,
            sq: Arc::downgrade(sq),
        });
    }

    /// The device says QP `qp_num` on NIC `nic` is in error: mark its
    /// controller terminal. Whether a live one was found.
    pub(crate) fn mark_terminal(&self, nic: usize, qp_num: u32) -> bool {
        let e = self.entries.lock();
        let Some(sq) = e
            .iter()
            .find(|x| x.nic == nic && x.qp_num == qp_num)
            .and_then(|x| x.sq.upgrade())
        else {
            return false;
        };
        sq.mark_terminal();
        true
    }

    /// Entries held (live or not pruned yet).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries
            .lock()
            .len()
    }

}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_qp_table_finds_a_qps_controller_and_prunes_dead_ones() {
        // Only identity and the terminal bit matter here.
        let sq = || Arc::new(SqController::new(8, 0, Duration::ZERO));
        let t = QpTable::default();
        let (a, b) = (sq(), sq());
        t.watch(0, 100, &a);
        t.watch(1, 100, &b);
        assert!(!t.mark_terminal(0, 101), "unknown QP");
        assert!(t.mark_terminal(1, 100));
        assert!(b.is_terminal() && !a.is_terminal(), "only that NIC's QP");
        // The same controller's next QP replaces its entry; terminal and
        // dropped controllers are pruned.
        t.watch(0, 200, &a);
        assert_eq!(t.len(), 1);
        assert!(!t.mark_terminal(0, 100), "its old QP is gone");
        let c = sq();
        t.watch(0, 300, &c);
        drop(c);
        t.watch(0, 400, &sq());
        assert!(!t.mark_terminal(0, 300));
        assert!(t.mark_terminal(0, 200));
        assert!(a.is_terminal());
    }
}
