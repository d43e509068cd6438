//! Work-completion status → error kind, and whether it ends the endpoint.
//!
//! - `IBV_WC_WR_FLUSH_ERR` is not a failure of its own: it is what every
//!   work request still queued on a QP gets once the QP went to the error
//!   state because of another one ([`Outcome::Flushed`], a cascade only).
//! - Seed 004's fatal list ([`Outcome::Fatal`]): `RETRY_EXC`,
//!   `RNR_RETRY_EXC`, `LOC_QP_OP`, `REM_ACCESS`, `REM_INV_REQ`, `FATAL`.
//!   These say the path or the peer's keys are bad, not the one request:
//!   the endpoint is taken out of service (terminal-degraded), what it
//!   held moves on, and a fresh one is built only after a backoff.
//! - Any other failure ([`Outcome::Failed`]) is the request's own (a bad
//!   length, a local protection fault): it fails alone, and the requests
//!   flushed behind it are posted again on a fresh QP at once.

use tent_rings::ErrorKind;

use crate::transport::rdma::sys::ffi::ibv_wc_status as S;

/// What a work completion means for its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Bytes moved.
    Done,
    /// Failed for this reason (the root cause), the request's own: the
    /// endpoint goes on with a fresh QP.
    Failed(ErrorKind),
    /// Failed for this reason, one of seed 004's fatal statuses: the
    /// endpoint is terminal-degraded.
    Fatal(ErrorKind),
    /// Swept away by another request's failure: post it again.
    Flushed,
}

/// Map a completion status.
pub(crate) fn outcome(status: S) -> Outcome {
    match status {
        S::IBV_WC_SUCCESS => Outcome::Done,
        S::IBV_WC_WR_FLUSH_ERR => Outcome::Flushed,
        // Seed 004's fatal list.
        S::IBV_WC_RETRY_EXC_ERR | S::IBV_WC_RNR_RETRY_EXC_ERR => {
            Outcome::Fatal(ErrorKind::Unreachable)
        }
        S::IBV_WC_REM_ACCESS_ERR => Outcome::Fatal(ErrorKind::AccessDenied),
        S::IBV_WC_REM_INV_REQ_ERR => Outcome::Fatal(ErrorKind::OutOfBounds),
        S::IBV_WC_LOC_QP_OP_ERR | S::IBV_WC_FATAL_ERR => Outcome::Fatal(ErrorKind::LocalNicFailed),
        // The request's own.
        S::IBV_WC_LOC_PROT_ERR | S::IBV_WC_MW_BIND_ERR => Outcome::Failed(ErrorKind::AccessDenied),
        S::IBV_WC_LOC_LEN_ERR | S::IBV_WC_REM_INV_RD_REQ_ERR => {
            Outcome::Failed(ErrorKind::OutOfBounds)
        }
        S::IBV_WC_RESP_TIMEOUT_ERR => Outcome::Failed(ErrorKind::Unreachable),
        S::IBV_WC_REM_OP_ERR | S::IBV_WC_REM_ABORT_ERR => {
            Outcome::Failed(ErrorKind::RemoteNicFailed)
        }
        S::IBV_WC_LOC_EEC_OP_ERR => Outcome::Failed(ErrorKind::LocalNicFailed),
        _ => Outcome::Failed(ErrorKind::LocalNicFailed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_mappings() {
        assert_eq!(outcome(S::IBV_WC_SUCCESS), Outcome::Done);
        assert_eq!(
            outcome(S::IBV_WC_LOC_PROT_ERR),
            Outcome::Failed(ErrorKind::AccessDenied)
        );
        assert_eq!(
            outcome(S::IBV_WC_REM_OP_ERR),
            Outcome::Failed(ErrorKind::RemoteNicFailed)
        );
        assert_eq!(outcome(S::IBV_WC_WR_FLUSH_ERR), Outcome::Flushed);
        // Seed 004's fatal list, each terminal.
        for (st, kind) in [
            (S::IBV_WC_RETRY_EXC_ERR, ErrorKind::Unreachable),
            (S::IBV_WC_RNR_RETRY_EXC_ERR, ErrorKind::Unreachable),
            (S::IBV_WC_LOC_QP_OP_ERR, ErrorKind::LocalNicFailed),
            (S::IBV_WC_REM_ACCESS_ERR, ErrorKind::AccessDenied),
            (S::IBV_WC_REM_INV_REQ_ERR, ErrorKind::OutOfBounds),
            (S::IBV_WC_FATAL_ERR, ErrorKind::LocalNicFailed),
        ] {
            assert_eq!(outcome(st), Outcome::Fatal(kind), "{st:?}");
        }
        // A status this build does not know is a local failure, not a panic.
        assert_eq!(outcome(S(9999)), Outcome::Failed(ErrorKind::LocalNicFailed));
    }
}
