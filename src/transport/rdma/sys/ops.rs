//! The hot-path verbs that rdma-core defines as static inlines: each
//! dispatches through the provider's `ctx->ops` table. Ported here so the
//! binaries need no C shim (which would bring back a link-time dependency)
//! and so a test can run the real dispatch against an `ops` table of Rust
//! functions.

use super::ffi::{ibv_context, ibv_cq, ibv_port_attr, ibv_qp, ibv_send_wr, ibv_wc, verbs_context};

/// `ibv_post_send`: post a linked list of work requests on `qp`.
///
/// # Safety
/// `qp` must be a live QP whose context has a provider ops table; `wr` a
/// valid list; `bad` writable.
#[inline]
pub(crate) unsafe fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad: *mut *mut ibv_send_wr) -> i32 {
    // SAFETY: the caller guarantees `qp` and its context are live.
    let f = unsafe { (*(*qp).context).ops.post_send };
    match f {
        // SAFETY: the provider's own entry point, with the caller's valid arguments.
        Some(f) => unsafe { f(qp, wr, bad) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_poll_cq`: reap up to `n` completions into `wc`; returns how many,
/// or a negative value on error.
///
/// # Safety
/// `cq` must be a live CQ whose context has a provider ops table; `wc`
/// valid for `n` writes.
#[inline]
pub(crate) unsafe fn poll_cq(cq: *mut ibv_cq, n: i32, wc: *mut ibv_wc) -> i32 {
    // SAFETY: the caller guarantees `cq` and its context are live.
    let f = unsafe { (*(*cq).context).ops.poll_cq };
    match f {
        // SAFETY: the provider's own entry point, with the caller's valid arguments.
        Some(f) => unsafe { f(cq, n, wc) },
        None => -libc::EOPNOTSUPP,
    }
}

/// `ibv_query_port` (a macro onto the static inline `___ibv_query_port`):
/// asks the provider's extended context, which fills the full
/// `ibv_port_attr`; providers without it answer through the exported
/// compat symbol (smaller struct), which `lib` supplies.
///
/// # Safety
/// `ctx` must be a live device context.
pub(crate) unsafe fn query_port(
    lib: &super::ffi::IbvLib,
    ctx: *mut ibv_context,
    port: u8,
    attr: &mut ibv_port_attr,
) -> i32 {
    // SAFETY: the caller guarantees `ctx` is live; `extended` only reads its header words.
    if let Some(vctx) = unsafe { extended(ctx) } {
        // SAFETY: `vctx` is the provider's extended context around `ctx`.
        if let Some(f) = unsafe { (*vctx).query_port } {
            // SAFETY: the provider's entry point, with a writable attr of the size we pass.
            return unsafe { f(ctx, port, attr, std::mem::size_of::<ibv_port_attr>()) };
        }
    }
    *attr = ibv_port_attr::default();
    // SAFETY: the compat entry point writes a prefix of `ibv_port_attr` (its older, smaller layout), as the C inline does.
    unsafe { lib.ibv_query_port(ctx, port, (attr as *mut ibv_port_attr).cast()) }
}

/// `verbs_get_ctx_op(ctx, query_port)`: the extended context around `ctx`
/// when the provider has one large enough to hold `query_port`.
///
/// # Safety
/// `ctx` must be a live device context.
unsafe fn extended(ctx: *mut ibv_context) -> Option<*mut verbs_context> {
    // __VERBS_ABI_IS_EXTENDED is ((void *)UINTPTR_MAX).
    // SAFETY: the caller guarantees `ctx` is live.
    if unsafe { (*ctx).abi_compat } as usize != usize::MAX {
        return None;
    }
    let off = std::mem::offset_of!(verbs_context, context);
    let vctx = (ctx as *mut u8).wrapping_sub(off) as *mut verbs_context;
    let need =
        std::mem::size_of::<verbs_context>() - std::mem::offset_of!(verbs_context, query_port);
    // SAFETY: an extended context is allocated as a verbs_context with `ctx` as its last field; `sz` sits just before it.
    let sz = unsafe { (*vctx).sz };
    (sz >= need).then_some(vctx)
}

#[cfg(test)]
mod tests {
    //! The real dispatch against an ops table of Rust functions: no kernel,
    //! no device; any completion status can be injected.
    use super::*;
    use crate::transport::rdma::sys::ffi::{
        ibv_context, ibv_wc_opcode, ibv_wc_status, ibv_wr_opcode,
    };
    use std::cell::RefCell;

    thread_local! {
        static WIRE: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    }

    unsafe extern "C" fn fake_post_send(
        _qp: *mut ibv_qp,
        mut wr: *mut ibv_send_wr,
        _bad: *mut *mut ibv_send_wr,
    ) -> i32 {
        while !wr.is_null() {
            // SAFETY: the test built a valid linked list.
            let (id, next) = unsafe { ((*wr).wr_id, (*wr).next) };
            WIRE.with(|w| w.borrow_mut().push(id));
            wr = next;
        }
        0
    }

    unsafe extern "C" fn fake_poll_cq(_cq: *mut ibv_cq, n: i32, wc: *mut ibv_wc) -> i32 {
        WIRE.with(|w| {
            let mut w = w.borrow_mut();
            let k = (n as usize).min(w.len());
            for (i, id) in w.drain(..k).enumerate() {
                // Every third fails remotely: an injected status.
                let status = if id % 3 == 0 {
                    ibv_wc_status::IBV_WC_REM_ACCESS_ERR
                } else {
                    ibv_wc_status::IBV_WC_SUCCESS
                };
                // SAFETY: the caller's `wc` holds `n` >= k entries.
                unsafe {
                    *wc.add(i) = ibv_wc {
                        wr_id: id,
                        status,
                        opcode: ibv_wc_opcode::IBV_WC_RDMA_WRITE,
                        ..Default::default()
                    }
                };
            }
            k as i32
        })
    }

    #[test]
    fn dispatch_reaches_the_provider_ops() {
        let mut ctx = ibv_context::default();
        ctx.ops.post_send = Some(fake_post_send);
        ctx.ops.poll_cq = Some(fake_poll_cq);
        // One raw pointer shared by QP and CQ, as a provider would hand out.
        let ctxp: *mut ibv_context = &mut ctx;
        let mut qp = ibv_qp {
            context: ctxp,
            ..Default::default()
        };
        let mut cq = ibv_cq {
            context: ctxp,
            ..Default::default()
        };
        let mut wrs: Vec<ibv_send_wr> = (0..4)
            .map(|i| ibv_send_wr {
                wr_id: 100 + i,
                opcode: ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                ..Default::default()
            })
            .collect();
        for i in 0..3 {
            let next: *mut ibv_send_wr = &mut wrs[i + 1];
            wrs[i].next = next;
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: qp's context has the fake ops; wrs is a valid list.
        assert_eq!(unsafe { post_send(&mut qp, &mut wrs[0], &mut bad) }, 0);
        let mut wc = [ibv_wc::default(); 8];
        // SAFETY: cq's context has the fake ops; wc holds 8 entries.
        let n = unsafe { poll_cq(&mut cq, 8, wc.as_mut_ptr()) };
        assert_eq!(n, 4);
        let got: Vec<_> = wc[..4].iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(got[0], (100, ibv_wc_status::IBV_WC_SUCCESS));
        assert_eq!(got[2], (102, ibv_wc_status::IBV_WC_REM_ACCESS_ERR));
        // A provider without the op: an error, not a crash.
        // SAFETY: `ctxp` points at `ctx`, alive for the whole test.
        unsafe { (*ctxp).ops.poll_cq = None };
        // SAFETY: as above.
        assert!(unsafe { poll_cq(&mut cq, 8, wc.as_mut_ptr()) } < 0);
    }

    /// What a provider saw of one posted WR: id, opcode, flags, SGEs,
    /// whether its SGE list is null, remote address and rkey.
    type Seen = (u64, ibv_wr_opcode, u32, i32, bool, u64, u32);

    thread_local! {
        static SEEN: RefCell<Vec<Seen>> = const { RefCell::new(Vec::new()) };
    }

    unsafe extern "C" fn recording_post_send(
        _qp: *mut ibv_qp,
        wr: *mut ibv_send_wr,
        _bad: *mut *mut ibv_send_wr,
    ) -> i32 {
        // SAFETY: the caller posts one valid WR.
        let w = unsafe { &*wr };
        // SAFETY: an RDMA WRITE's WR carries the `rdma` variant.
        let (remote, rkey) = unsafe { (w.wr.rdma.remote_addr, w.wr.rdma.rkey) };
        let seen = (w.wr_id, w.opcode, w.send_flags, w.num_sge, w.sg_list.is_null(), remote, rkey);
        SEEN.with(|s| s.borrow_mut().push(seen));
        if w.next.is_null() { 0 } else { libc::EINVAL }
    }

    #[test]
    fn a_zero_length_write_reaches_the_provider_with_no_sge_address_or_key() {
        use crate::transport::rdma::sys::ffi::ibv_send_flags;
        let mut ctx = ibv_context::default();
        ctx.ops.post_send = Some(recording_post_send);
        let ctxp: *mut ibv_context = &mut ctx;
        let mut qp = ibv_qp {
            context: ctxp,
            ..Default::default()
        };
        // SAFETY: qp's context has the recording ops.
        let rc = unsafe { crate::transport::rdma::verbs::post_zero_write(&mut qp, 77) };
        assert_eq!(rc, 0);
        let seen = SEEN.with(|s| s.borrow_mut().drain(..).collect::<Vec<_>>());
        assert_eq!(
            seen,
            [(
                77,
                ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                ibv_send_flags::IBV_SEND_SIGNALED.0,
                0,
                true,
                0,
                0
            )],
            "one signalled WRITE of no bytes, naming no memory"
        );
        // The provider's refusal comes back as its code.
        // SAFETY: `ctxp` points at `ctx`, alive for the whole test.
        unsafe { (*ctxp).ops.post_send = None };
        // SAFETY: as above.
        let rc = unsafe { crate::transport::rdma::verbs::post_zero_write(&mut qp, 78) };
        assert_eq!(rc, libc::EOPNOTSUPP);
    }
}
