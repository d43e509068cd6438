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

/// Both operations share every field, so one definition keeps them identical.
macro_rules! opcode {
    ($(#[$outer:meta])* $name:ident => $opcode:expr) => {
        $(#[$outer])*
        #[derive(Clone, Copy, Debug)]
        pub struct $name {
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
            /// The required fields: both ends and the byte count.
            pub const fn new(local: LocalAddr, remote: RemoteAddr, len: u64) -> Self {
                $name {
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
                    opcode: $opcode as u8,
                    priority: self.priority as u8,
                    flags: if self.no_failover { SQE_NO_FAILOVER } else { 0 },
                    transport_hint: self.transport_hint as u8,
                    _reserved: [0; 12],
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

opcode! {
    /// Copy `len` bytes from the remote address into the local address.
    Read => Opcode::Read
}

opcode! {
    /// Copy `len` bytes from the local address to the remote address.
    Write => Opcode::Write
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
