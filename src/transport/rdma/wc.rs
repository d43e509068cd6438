//! Work-completion status → error kind.
//!
//! `IBV_WC_WR_FLUSH_ERR` is not a failure of its own: it is what every work
//! request still queued on a QP gets once the QP went to the error state
//! because of another one. Flushed requests are re-posted on a fresh QP,
//! never reported ([`Outcome::Flushed`]).

use tent_rings::ErrorKind;

use crate::transport::rdma::sys::ffi::ibv_wc_status as S;

/// What a work completion means for its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Bytes moved.
    Done,
    /// Failed for this reason (the root cause).
    Failed(ErrorKind),
    /// Swept away by another request's failure: post it again.
    Flushed,
}

/// Map a completion status.
pub fn outcome(status: S) -> Outcome {
    match status {
        S::IBV_WC_SUCCESS => Outcome::Done,
        S::IBV_WC_WR_FLUSH_ERR => Outcome::Flushed,
        S::IBV_WC_REM_ACCESS_ERR | S::IBV_WC_LOC_PROT_ERR | S::IBV_WC_MW_BIND_ERR => {
            Outcome::Failed(ErrorKind::AccessDenied)
        }
        S::IBV_WC_REM_INV_REQ_ERR | S::IBV_WC_LOC_LEN_ERR | S::IBV_WC_REM_INV_RD_REQ_ERR => {
            Outcome::Failed(ErrorKind::OutOfBounds)
        }
        S::IBV_WC_RETRY_EXC_ERR | S::IBV_WC_RNR_RETRY_EXC_ERR | S::IBV_WC_RESP_TIMEOUT_ERR => {
            Outcome::Failed(ErrorKind::Unreachable)
        }
        S::IBV_WC_REM_OP_ERR | S::IBV_WC_REM_ABORT_ERR => {
            Outcome::Failed(ErrorKind::RemoteNicFailed)
        }
        S::IBV_WC_FATAL_ERR | S::IBV_WC_LOC_QP_OP_ERR | S::IBV_WC_LOC_EEC_OP_ERR => {
            Outcome::Failed(ErrorKind::LocalNicFailed)
        }
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
            outcome(S::IBV_WC_REM_ACCESS_ERR),
            Outcome::Failed(ErrorKind::AccessDenied)
        );
        assert_eq!(
            outcome(S::IBV_WC_RETRY_EXC_ERR),
            Outcome::Failed(ErrorKind::Unreachable)
        );
        assert_eq!(outcome(S::IBV_WC_WR_FLUSH_ERR), Outcome::Flushed);
        // A status this build does not know is a local failure, not a panic.
        assert_eq!(outcome(S(9999)), Outcome::Failed(ErrorKind::LocalNicFailed));
    }
}
