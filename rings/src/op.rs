//! io_uring-style builders for submission entries.
//!
//! Each operation takes its required fields in `new` and the optional ones
//! through chained setters, then [`build`](Write::build)s an [`Sqe`]. All of it
//! is `const`, so fixed requests can be built at compile time.
//!
//! ```
//! use tent_rings::entry::{LocalAddr, Priority, RegionId, RemoteAddr, SegmentId};
//! use tent_rings::op;
//!
//! let sqe = op::Write::new(LocalAddr::new(RegionId(1), 0), RemoteAddr::new(SegmentId(2), 4096), 8)
//!     .priority(Priority::Low)
//!     .user_data(7)
//!     .build();
//! assert_eq!(sqe.priority(), Some(Priority::Low));
//! assert_eq!(sqe.remote().offset, 4096);
//! ```

use crate::entry::{LocalAddr, Opcode, Priority, RemoteAddr, SQE_NO_FAILOVER, Sqe, TransportKind};

/// Every builder shares every field, so one definition keeps them
/// identical; only how `new` picks the opcode differs.
macro_rules! builder {
    ($(#[$outer:meta])* $name:ident) => {
        $(#[$outer])*
        #[derive(Clone, Copy, Debug)]
        pub struct $name {
            opcode: Opcode,
            local: LocalAddr,
            remote: RemoteAddr,
            len: u64,
            priority: Priority,
            user_data: u64,
            deadline_ns: u64,
            transport_hint: TransportKind,
            no_failover: bool,
        }

        impl $name {
            /// `opcode` between both ends, every optional field at its
            /// default.
            const fn with(opcode: Opcode, local: LocalAddr, remote: RemoteAddr, len: u64) -> Self {
                $name {
                    opcode,
                    local,
                    remote,
                    len,
                    priority: Priority::High,
                    user_data: 0,
                    deadline_ns: 0,
                    transport_hint: TransportKind::Any,
                    no_failover: false,
                }
            }

            /// Scheduling class (default [`Priority::High`]).
            pub const fn priority(mut self, p: Priority) -> Self {
                self.priority = p;
                self
            }

            /// Token echoed in the completion (default 0).
            pub const fn user_data(mut self, v: u64) -> Self {
                self.user_data = v;
                self
            }

            /// Absolute `CLOCK_MONOTONIC` deadline in nanoseconds (default 0:
            /// the engine's default timeout).
            pub const fn deadline_ns(mut self, abs_monotonic_ns: u64) -> Self {
                self.deadline_ns = abs_monotonic_ns;
                self
            }

            /// Preferred transport (default [`TransportKind::Any`]).
            pub const fn transport_hint(mut self, t: TransportKind) -> Self {
                self.transport_hint = t;
                self
            }

            /// Fail rather than retry on another transport (default `false`).
            pub const fn no_failover(mut self, yes: bool) -> Self {
                self.no_failover = yes;
                self
            }

            /// The submission entry.
            pub const fn build(self) -> Sqe {
                Sqe {
                    user_data: self.user_data,
                    local_offset: self.local.offset,
                    remote_offset: self.remote.offset,
                    len: self.len,
                    deadline_ns: self.deadline_ns,
                    local_region: self.local.region.0,
                    remote_segment: self.remote.segment.0,
                    opcode: self.opcode as u8,
                    priority: self.priority as u8,
                    flags: if self.no_failover { SQE_NO_FAILOVER } else { 0 },
                    transport_hint: self.transport_hint as u8,
                    _reserved: [0; 4],
                }
            }
        }

        impl From<$name> for Sqe {
            fn from(op: $name) -> Sqe {
                op.build()
            }
        }
    };
}

builder! {
    /// Copy `len` bytes from the remote address into the local address.
    Read
}

impl Read {
    /// The required fields: both ends and the byte count.
    pub const fn new(local: LocalAddr, remote: RemoteAddr, len: u64) -> Self {
        Self::with(Opcode::Read, local, remote, len)
    }
}

builder! {
    /// Copy `len` bytes from the local address to the remote address.
    Write
}

impl Write {
    /// The required fields: both ends and the byte count.
    pub const fn new(local: LocalAddr, remote: RemoteAddr, len: u64) -> Self {
        Self::with(Opcode::Write, local, remote, len)
    }
}

builder! {
    /// A READ or a WRITE whose opcode is data, not code: what callers
    /// that take the opcode from their own callers build (TENT's
    /// requests, block lists), with the same setters as [`Read`] and
    /// [`Write`].
    ///
    /// ```
    /// use tent_rings::entry::{LocalAddr, Opcode, RegionId, RemoteAddr, SegmentId};
    /// use tent_rings::op;
    ///
    /// let (l, r) = (LocalAddr::new(RegionId(1), 0), RemoteAddr::new(SegmentId(2), 0));
    /// let sqe = op::Transfer::new(Opcode::Read, l, r, 8).user_data(3).build();
    /// assert_eq!(sqe.opcode(), Some(Opcode::Read));
    /// ```
    Transfer
}

impl Transfer {
    /// The opcode and the required fields: both ends and the byte count.
    pub const fn new(opcode: Opcode, local: LocalAddr, remote: RemoteAddr, len: u64) -> Self {
        Self::with(opcode, local, remote, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{RegionId, SegmentId};

    fn ends() -> (LocalAddr, RemoteAddr) {
        (
            LocalAddr::new(RegionId(11), 0x1000),
            RemoteAddr::new(SegmentId(22), 0x2000),
        )
    }

    #[test]
    fn write_round_trips_all_setters() {
        let (l, r) = ends();
        let sqe: Sqe = Write::new(l, r, 512)
            .priority(Priority::Medium)
            .user_data(0xdead_beef)
            .deadline_ns(123_456_789)
            .transport_hint(TransportKind::Rdma)
            .no_failover(true)
            .into();
        assert_eq!(sqe.opcode(), Some(Opcode::Write));
        assert_eq!(sqe.local(), l);
        assert_eq!(sqe.remote(), r);
        assert_eq!(sqe.len(), 512);
        assert_eq!(sqe.priority(), Some(Priority::Medium));
        assert_eq!(sqe.user_data(), 0xdead_beef);
        assert_eq!(sqe.deadline_ns(), 123_456_789);
        assert_eq!(sqe.transport_hint(), Some(TransportKind::Rdma));
        assert!(sqe.no_failover());
        assert_eq!(sqe.flags(), SQE_NO_FAILOVER);
    }

    #[test]
    fn read_round_trips_all_setters() {
        let (l, r) = ends();
        let sqe = Read::new(l, r, 0)
            .priority(Priority::Low)
            .user_data(u64::MAX)
            .deadline_ns(u64::MAX)
            .transport_hint(TransportKind::Shm)
            .no_failover(false)
            .build();
        assert_eq!(sqe.opcode(), Some(Opcode::Read));
        assert_eq!(sqe.local(), l);
        assert_eq!(sqe.remote(), r);
        assert!(sqe.is_empty());
        assert_eq!(sqe.priority(), Some(Priority::Low));
        assert_eq!(sqe.user_data(), u64::MAX);
        assert_eq!(sqe.deadline_ns(), u64::MAX);
        assert_eq!(sqe.transport_hint(), Some(TransportKind::Shm));
        assert!(!sqe.no_failover());
        assert_eq!(sqe.flags(), 0);
    }

    #[test]
    fn defaults() {
        let (l, r) = ends();
        let sqe = Read::new(l, r, 1).build();
        assert_eq!(sqe.priority(), Some(Priority::High));
        assert_eq!(sqe.transport_hint(), Some(TransportKind::Any));
        assert_eq!(sqe.deadline_ns(), 0);
        assert_eq!(sqe.user_data(), 0);
    }

    #[test]
    fn transfer_builds_what_read_and_write_build() {
        let (l, r) = ends();
        for (opcode, same) in [
            (
                Opcode::Read,
                Read::new(l, r, 9)
                    .priority(Priority::Low)
                    .user_data(4)
                    .build(),
            ),
            (
                Opcode::Write,
                Write::new(l, r, 9)
                    .priority(Priority::Low)
                    .user_data(4)
                    .build(),
            ),
        ] {
            let sqe = Transfer::new(opcode, l, r, 9)
                .priority(Priority::Low)
                .user_data(4)
                .build();
            assert_eq!(sqe.opcode(), Some(opcode));
            assert_eq!(format!("{sqe:?}"), format!("{same:?}"));
        }
    }

    #[test]
    fn builds_in_const_context() {
        const SQE: Sqe = Write::new(
            LocalAddr::new(RegionId(1), 0),
            RemoteAddr::new(SegmentId::LOCAL, 0),
            64,
        )
        .build();
        assert_eq!(SQE.len(), 64);
    }
}
