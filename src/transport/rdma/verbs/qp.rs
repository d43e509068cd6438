//! Reliable-connected queue pairs: creation and the INIT → RTR → RTS walk
//! with the peer's GID, QPN, PSN and MTU (exchanged over the control plane).

use std::sync::Arc;

use tent_rings::{ErrorKind, Opcode};

use super::{CompletionQueue, ProtectionDomain, verb_error};
use crate::error::{Error, Result};
use crate::transport::rdma::gid::{GidChoice, LinkLayer};
use crate::transport::rdma::sys::{self, ffi, ops};

/// How a NIC's QPs are addressed: the port, the GID chosen on it, what its
/// link runs over, and the traffic class and service level of their
/// packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addressing {
    /// The port (1-based).
    pub port: u8,
    /// The GID the QPs are addressed by.
    pub gid: GidChoice,
    /// What the port's link runs over.
    pub link: LinkLayer,
    /// The traffic class byte (DSCP << 2 | ECN).
    pub traffic_class: u8,
    /// The service level, 0 to 15.
    pub service_level: u8,
}

/// Traffic class of RoCE packets when neither the configuration nor the
/// port names one: DSCP 26 with ECN capable, the lossless class of a
/// typical RoCE fabric (what Mooncake, UCX and NCCL default to).
pub(crate) const ROCE_TRAFFIC_CLASS: u8 = 106;

/// The traffic class a link gets when nothing names one.
pub(crate) fn default_traffic_class(link: LinkLayer) -> u8 {
    match link {
        LinkLayer::Ethernet => ROCE_TRAFFIC_CLASS,
        LinkLayer::InfiniBand => 0,
    }
}

/// The address vector of an RC QP's RTR (`ibv_ah_attr`), as data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressVector {
    /// A GRH on every packet: always on RoCE, on InfiniBand only toward
    /// another subnet (a different GID prefix).
    pub is_global: bool,
    /// Destination LID.
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source GID index (GRH).
    pub sgid_index: u8,
    /// Traffic class (GRH).
    pub traffic_class: u8,
    /// Hop limit (GRH).
    pub hop_limit: u8,
}

/// Hop limit of a GRH: enough for any routed fabric.
const HOP_LIMIT: u8 = 64;

/// The address vector toward `remote` from a QP addressed by `local`.
pub(crate) fn address_vector(local: &Addressing, remote: &QpEndpoint) -> AddressVector {
    let is_global = match local.link {
        LinkLayer::Ethernet => true,
        LinkLayer::InfiniBand => remote.gid[..8] != local.gid.gid[..8],
    };
    AddressVector {
        is_global,
        dlid: remote.lid,
        sl: local.service_level & 0xf,
        sgid_index: local.gid.index,
        traffic_class: if is_global { local.traffic_class } else { 0 },
        hop_limit: if is_global { HOP_LIMIT } else { 0 },
    }
}

/// What a peer needs to connect its QP to ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpEndpoint {
    /// Port GID (RoCE address).
    pub gid: [u8; 16],
    /// Port LID (0 on RoCE).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// First packet sequence number.
    pub psn: u32,
    /// Path MTU (an `ibv_mtu` value).
    pub mtu: u32,
}

/// One one-sided operation for [`QueuePair::post`].
#[derive(Debug, Clone, Copy)]
pub struct RdmaOp {
    /// Echoed in the work completion.
    pub wr_id: u64,
    /// READ or WRITE.
    pub opcode: Opcode,
    /// Local memory.
    pub local: *mut u8,
    /// Bytes.
    pub len: u32,
    /// Local key of the registration holding `local`.
    pub lkey: u32,
    /// Remote address.
    pub remote: u64,
    /// Remote key.
    pub rkey: u32,
}

/// The local ACK timeout exponent of an RC QP: a request unanswered for
/// 4.096 µs × 2^14 ≈ 67 ms is sent again (a NIC may wait up to four times
/// that, as the IB spec allows).
pub const ACK_TIMEOUT: u8 = 14;

/// How often an RC QP sends an unanswered request again before failing it
/// with `IBV_WC_RETRY_EXC_ERR`. 7 is the most the IB spec allows; rxe
/// reads 7 as "retry without end", so there a request to a vanished peer
/// never completes.
pub const RETRY_CNT: u8 = 7;

/// The most retries that end on every device (rxe included): a request to
/// a vanished peer fails after 1 + 6 unanswered attempts, ≈ 470 ms at
/// [`ACK_TIMEOUT`] (up to ≈ 1.9 s on a NIC waiting four times as long).
pub const FINITE_RETRY_CNT: u8 = 6;

/// Outstanding RDMA READs a QP asks for, as initiator and as target,
/// before the device's caps clamp it.
pub const RD_ATOMIC_WANTED: u32 = 16;

/// `(max_rd_atomic, max_dest_rd_atomic)` for a QP on a device whose
/// `ibv_query_device` caps are `max_qp_init_rd_atom` (outstanding READs as
/// initiator) and `max_qp_rd_atom` (as target).
pub fn rd_atomic_depths(max_qp_init_rd_atom: u32, max_qp_rd_atom: u32) -> (u8, u8) {
    // At least 1: a device reporting 0 is refused by its provider at
    // RTR/RTS with a typed error rather than left unable to READ silently.
    let clamp = |cap: u32| RD_ATOMIC_WANTED.min(cap).clamp(1, u32::from(u8::MAX)) as u8;
    (clamp(max_qp_init_rd_atom), clamp(max_qp_rd_atom))
}

/// An RC queue pair, destroyed on drop.
pub struct QueuePair {
    raw: *mut ffi::ibv_qp,
    pd: Arc<ProtectionDomain>,
    _cq: Arc<CompletionQueue>,
    addr: Addressing,
    psn: u32,
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("raw", &self.raw)
            .finish_non_exhaustive()
    }
}

// SAFETY: a QP may be used from any thread (verbs objects are thread-safe);
// it is moved, never shared: `QueuePair` is not `Sync`, so only its owner
// reaches it, one thread at a time.
unsafe impl Send for QueuePair {}

impl QueuePair {
    /// An RC QP on `pd` completing into `cq`, at most `depth` send WRs
    /// (clamped to the device's `max_qp_wr`), already in INIT on `port`.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        cq: &Arc<CompletionQueue>,
        addr: Addressing,
        depth: u32,
    ) -> Result<QueuePair> {
        let lib = super::lib()?;
        let ctx = pd.context();
        let port = addr.port;
        let depth = depth.clamp(1, ctx.max_qp_wr().max(1));
        let psn = initial_psn(getrandom::fill)?;
        let mut init = ffi::ibv_qp_init_attr {
            send_cq: cq.raw,
            recv_cq: cq.raw,
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            ..Default::default()
        };
        init.cap.max_send_wr = depth;
        init.cap.max_recv_wr = 1;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        // SAFETY: `pd.raw` is live; `init` is a valid attribute block.
        let raw = unsafe { lib.ibv_create_qp(pd.raw, &mut init) };
        if raw.is_null() {
            return Err(verb_error(ctx.name(), "ibv_create_qp", 0));
        }
        let qp = QueuePair {
            raw,
            pd: pd.clone(),
            _cq: cq.clone(),
            addr,
            psn,
        };
        use ffi::ibv_qp_attr_mask as M;
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            port_num: port,
            qp_access_flags: (ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ)
                .0,
            ..Default::default()
        };
        qp.modify(
            &mut a,
            M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS,
            "ibv_modify_qp(INIT)",
        )?;
        Ok(qp)
    }

    /// What the peer needs to connect to this QP.
    pub fn endpoint(&self) -> Result<QpEndpoint> {
        let info = self.pd.context().port(self.addr.port)?;
        Ok(QpEndpoint {
            gid: self.addr.gid.gid,
            lid: info.lid,
            // SAFETY: `raw` is live for self's lifetime.
            qpn: unsafe { (*self.raw).qp_num },
            psn: self.psn,
            mtu: info.active_mtu,
        })
    }

    /// Connect to `remote`: RTR then RTS, retrying an unanswered request
    /// [`RETRY_CNT`] times.
    pub fn connect(&self, remote: &QpEndpoint) -> Result<()> {
        self.connect_with_retries(remote, RETRY_CNT)
    }

    /// Connect to `remote`: RTR then RTS, retrying an unanswered request
    /// `retry_cnt` times (0 to 7; see [`RETRY_CNT`] for what 7 means).
    pub fn connect_with_retries(&self, remote: &QpEndpoint, retry_cnt: u8) -> Result<()> {
        use ffi::ibv_qp_attr_mask as M;
        let ctx = self.pd.context();
        let local_mtu = ctx.port(self.addr.port)?.active_mtu;
        let (rd_atomic, dest_rd_atomic) =
            rd_atomic_depths(ctx.max_qp_init_rd_atom(), ctx.max_qp_rd_atom());
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: ffi::ibv_mtu(remote.mtu.min(local_mtu)),
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: dest_rd_atomic,
            min_rnr_timer: 12,
            ..Default::default()
        };
        let av = address_vector(&self.addr, remote);
        a.ah_attr.is_global = u8::from(av.is_global);
        a.ah_attr.dlid = av.dlid;
        a.ah_attr.sl = av.sl;
        a.ah_attr.port_num = self.addr.port;
        if av.is_global {
            a.ah_attr.grh.dgid = ffi::ibv_gid { raw: remote.gid };
            a.ah_attr.grh.sgid_index = av.sgid_index;
            a.ah_attr.grh.hop_limit = av.hop_limit;
            a.ah_attr.grh.traffic_class = av.traffic_class;
        }
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER,
            "ibv_modify_qp(RTR)",
        )?;
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            timeout: ACK_TIMEOUT,
            retry_cnt: retry_cnt.min(7),
            rnr_retry: 7,
            sq_psn: self.psn,
            max_rd_atomic: rd_atomic,
            ..Default::default()
        };
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_MAX_QP_RD_ATOMIC,
            "ibv_modify_qp(RTS)",
        )
    }

    /// Its state as the device sees it now (`ibv_query_qp`): a QP the
    /// device moved to ERROR reads so, unlike the state cached at modify.
    pub(crate) fn state(&self) -> Result<ffi::ibv_qp_state> {
        Ok(self.query(ffi::ibv_qp_attr_mask::IBV_QP_STATE)?.qp_state)
    }

    /// Its address vector as the device holds it (`ibv_query_qp`): what
    /// RTR gave it, for tests that the traffic class and service level
    /// reached the device.
    pub fn address_vector(&self) -> Result<AddressVector> {
        let a = self.query(ffi::ibv_qp_attr_mask::IBV_QP_AV)?.ah_attr;
        Ok(AddressVector {
            is_global: a.is_global != 0,
            dlid: a.dlid,
            sl: a.sl,
            sgid_index: a.grh.sgid_index,
            traffic_class: a.grh.traffic_class,
            hop_limit: a.grh.hop_limit,
        })
    }

    fn query(&self, mask: ffi::ibv_qp_attr_mask) -> Result<ffi::ibv_qp_attr> {
        let lib = super::lib()?;
        let mut a = ffi::ibv_qp_attr::default();
        let mut init = ffi::ibv_qp_init_attr::default();
        // SAFETY: `raw` is live; `a` and `init` are valid out-parameters.
        let rc = unsafe { lib.ibv_query_qp(self.raw, &mut a, mask.0 as i32, &mut init) };
        if rc != 0 {
            return Err(verb_error(self.pd.context().name(), "ibv_query_qp", rc));
        }
        Ok(a)
    }

    /// The raw QP, for a [`Queue`](crate::transport::rdma::Queue) that
    /// takes over posting (`Queue::new`'s contract: this pair then posts
    /// nothing itself).
    pub fn as_raw(&self) -> *mut ffi::ibv_qp {
        self.raw
    }

    /// Post one signalled one-sided READ or WRITE.
    ///
    /// # Safety
    /// `op.local..op.local+op.len` must be inside memory registered with
    /// `op.lkey` and stay valid until the completion is reaped.
    pub unsafe fn post(&self, op: &RdmaOp) -> Result<()> {
        let RdmaOp {
            wr_id,
            opcode,
            local,
            len,
            lkey,
            remote,
            rkey,
        } = *op;
        let mut sge = ffi::ibv_sge {
            addr: local as u64,
            length: len,
            lkey,
        };
        let mut wr = ffi::ibv_send_wr {
            wr_id,
            sg_list: &mut sge,
            num_sge: 1,
            opcode: match opcode {
                Opcode::Write => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                Opcode::Read => ffi::ibv_wr_opcode::IBV_WR_RDMA_READ,
            },
            send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        wr.wr.rdma.remote_addr = remote;
        wr.wr.rdma.rkey = rkey;
        let mut bad = std::ptr::null_mut();
        // SAFETY: `raw` is live and posted on from one thread at a time (`QueuePair` is not `Sync`); `wr` and `sge` outlive the call (the provider copies them); the caller vouches for the memory.
        let rc = unsafe { ops::post_send(self.raw, &mut wr, &mut bad) };
        self.posted(rc)
    }

    /// Post one signalled zero-length RDMA WRITE (see [`post_zero_write`]):
    /// a probe that the peer QP's NIC acknowledges without touching memory
    /// or completing anything on its side.
    pub fn post_zero_write(&self, wr_id: u64) -> Result<()> {
        // SAFETY: `raw` is live and posted on from one thread at a time (`QueuePair` is not `Sync`).
        let rc = unsafe { post_zero_write(self.raw, wr_id) };
        self.posted(rc)
    }

    /// `ibv_post_send`'s return code as a result.
    fn posted(&self, rc: i32) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        let kind = if rc == libc::ENOMEM {
            ErrorKind::SqFull
        } else {
            ErrorKind::LocalNicFailed
        };
        Err(Error::new(
            kind,
            format!("ibv_post_send on {}", self.pd.context().name()),
        )
        .with_source(std::io::Error::from_raw_os_error(rc)))
    }

    fn modify(
        &self,
        a: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
        verb: &str,
    ) -> Result<()> {
        let lib = super::lib()?;
        // SAFETY: `raw` is live; `a` is a valid attribute block for `mask`.
        let rc = unsafe { lib.ibv_modify_qp(self.raw, a, mask.0 as i32) };
        if rc != 0 {
            return Err(verb_error(self.pd.context().name(), verb, rc));
        }
        Ok(())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        if let Ok(lib) = sys::verbs() {
            // SAFETY: created in `new`, destroyed once.
            unsafe { lib.ibv_destroy_qp(self.raw) };
        }
    }
}

/// Move the QP `raw` to the error state (`ibv_modify_qp` to
/// `IBV_QPS_ERR`). The device then completes every send request still on
/// it with `IBV_WC_WR_FLUSH_ERR`, in order and signalled or not; once a
/// request's completion is reaped the device no longer touches its memory.
/// The call does not wait for those completions (one command to the
/// kernel driver): it returns 0, or the verb's errno.
///
/// # Safety
/// `raw` must be a live QP.
pub unsafe fn modify_to_error(raw: *mut ffi::ibv_qp) -> i32 {
    let Ok(lib) = sys::verbs() else {
        return libc::ENOSYS;
    };
    let mut a = ffi::ibv_qp_attr {
        qp_state: ffi::ibv_qp_state::IBV_QPS_ERR,
        ..Default::default()
    };
    let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32;
    // SAFETY: the caller guarantees `raw` is live; `a` is a valid attribute block for `mask`.
    unsafe { lib.ibv_modify_qp(raw, &mut a, mask) }
}

/// Post on `raw` one signalled RDMA WRITE of no bytes: no scatter/gather
/// entry, remote address and rkey 0 (a zero-length RDMA operation carries
/// no valid address or key and the responder checks none: IB spec C9-88,
/// and rxe's `check_rkey`). Returns `ibv_post_send`'s code.
///
/// # Safety
/// `raw` must be a live QP, posted on by no other thread during the call.
pub(crate) unsafe fn post_zero_write(raw: *mut ffi::ibv_qp, wr_id: u64) -> i32 {
    let mut wr = ffi::ibv_send_wr {
        wr_id,
        sg_list: std::ptr::null_mut(),
        num_sge: 0,
        opcode: ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
        ..Default::default()
    };
    wr.wr.rdma.remote_addr = 0;
    wr.wr.rdma.rkey = 0;
    let mut bad = std::ptr::null_mut();
    // SAFETY: the caller guarantees `raw` is live and ours alone; `wr` outlives the call and names no memory.
    unsafe { ops::post_send(raw, &mut wr, &mut bad) }
}

/// A random 24-bit starting PSN from `fill` (the system's CSPRNG), so a
/// stale packet from an old QP does not look in sequence. A source that
/// fails yields no PSN: the QP is refused rather than started at a
/// predictable one.
fn initial_psn(
    fill: impl FnOnce(&mut [u8]) -> std::result::Result<(), getrandom::Error>,
) -> Result<u32> {
    let mut b = [0u8; 4];
    fill(&mut b).map_err(|e| {
        Error::new(
            ErrorKind::LocalNicFailed,
            format!("no random starting PSN for a QP: {e}"),
        )
    })?;
    Ok(u32::from_le_bytes(b) & 0x00ff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_entropy_source_yields_no_psn() {
        let failed = initial_psn(|_| Err(getrandom::Error::UNSUPPORTED));
        assert_eq!(
            failed.map_err(|e| e.kind()),
            Err(ErrorKind::LocalNicFailed),
            "a QP must not start at a predictable PSN"
        );
        let psn = initial_psn(|b| {
            b.fill(0xff);
            Ok(())
        });
        assert_eq!(psn.map_err(|e| e.kind()), Ok(0x00ff_ffff), "24 bits");
    }

    #[test]
    fn rd_atomic_is_clamped_to_the_device_caps() {
        // A device allowing fewer than we want (4 as initiator, 2 as target).
        assert_eq!(rd_atomic_depths(4, 2), (4, 2));
        // Asymmetric caps clamp each side on its own.
        assert_eq!(rd_atomic_depths(1, 8), (1, 8));
        // Generous caps (rxe: 128): what we want, and never above u8.
        assert_eq!(rd_atomic_depths(128, 128), (16, 16));
        assert_eq!(rd_atomic_depths(u32::MAX, 1000), (16, 16));
        // A device reporting 0 gets the least legal depth (the provider
        // refuses it at RTR/RTS with a typed error if it truly has none).
        assert_eq!(rd_atomic_depths(0, 0), (1, 1));
    }
    fn addressing(link: LinkLayer, prefix: u8) -> Addressing {
        let mut gid = [0u8; 16];
        gid[0] = prefix;
        gid[15] = 1;
        Addressing {
            port: 1,
            gid: GidChoice {
                index: 3,
                gid,
                ty: None,
                why: "test",
                prefix: None,
            },
            link,
            traffic_class: 106,
            service_level: 5,
        }
    }

    fn remote(prefix: u8) -> QpEndpoint {
        let mut gid = [0u8; 16];
        gid[0] = prefix;
        gid[15] = 2;
        QpEndpoint {
            gid,
            lid: 7,
            qpn: 1,
            psn: 1,
            mtu: 3,
        }
    }

    #[test]
    fn roce_rtr_carries_a_grh_with_the_traffic_class_and_chosen_gid() {
        let av = address_vector(&addressing(LinkLayer::Ethernet, 0xfe), &remote(0xfe));
        assert_eq!(
            av,
            AddressVector {
                is_global: true,
                dlid: 7,
                sl: 5,
                sgid_index: 3,
                traffic_class: 106,
                hop_limit: 64,
            }
        );
    }

    #[test]
    fn infiniband_rtr_uses_a_grh_only_toward_another_subnet() {
        let local = addressing(LinkLayer::InfiniBand, 0xfe);
        let same = address_vector(&local, &remote(0xfe));
        assert!(!same.is_global);
        assert_eq!((same.dlid, same.sl, same.traffic_class), (7, 5, 0));
        let other = address_vector(&local, &remote(0xfd));
        assert!(other.is_global);
        assert_eq!(other.traffic_class, 106);
    }
}
