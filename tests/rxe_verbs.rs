//! Real kernel verbs, run inside the Soft-RoCE guest (`tools/rxe-vm.sh`,
//! which sets `TENT_RXE_GUEST=1`; rails are rxe0 .. rxe{N-1} on dummy
//! netdevs). Outside the guest these tests return at once: the guest
//! harness is what runs them, and it passes only on their own result lines.

use std::sync::Arc;

use tent::verbs::{CompletionQueue, Context, MemoryRegion, ProtectionDomain, QueuePair, RdmaOp};
use tent::{ErrorKind, Opcode};

fn in_guest() -> bool {
    std::env::var("TENT_RXE_GUEST").as_deref() == Ok("1")
}

fn rails() -> Vec<String> {
    let n: usize = std::env::var("TENT_RXE_RAILS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    (0..n).map(|i| format!("rxe{i}")).collect()
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Two QPs on one device connected to each other (a loopback "peer").
struct Pair {
    pd: Arc<ProtectionDomain>,
    cq: Arc<CompletionQueue>,
    a: QueuePair,
    _b: QueuePair,
}

fn pair(dev: &str) -> Pair {
    let ctx = Context::open(dev).unwrap();
    let port = ctx.port(1).unwrap();
    assert_eq!(port.state, 4, "{dev} port 1 not ACTIVE");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 256).unwrap();
    let a = QueuePair::new(&pd, &cq, 1, None, 128).unwrap();
    let b = QueuePair::new(&pd, &cq, 1, None, 128).unwrap();
    a.connect(&b.endpoint().unwrap()).unwrap();
    b.connect(&a.endpoint().unwrap()).unwrap();
    Pair { pd, cq, a, _b: b }
}

fn wait(cq: &CompletionQueue, wr_id: u64) -> tent::sys::ffi::ibv_wc_status {
    let mut wc = [tent::sys::ffi::ibv_wc::default(); 8];
    let start = std::time::Instant::now();
    loop {
        let n = cq.poll(&mut wc).unwrap();
        if let Some(w) = wc[..n].iter().find(|w| w.wr_id == wr_id) {
            return w.status;
        }
        assert!(
            start.elapsed().as_secs() < 30,
            "no completion for wr {wr_id}"
        );
    }
}

#[test]
fn rxe_write_and_read_with_data_verified_on_every_rail() {
    if !in_guest() {
        return;
    }
    let max = 8 << 20;
    for dev in rails() {
        let p = pair(&dev);
        let mut src = pattern(3, max);
        let mut dst = vec![0u8; max];
        let mut back = vec![0u8; max];
        // SAFETY: the buffers outlive the regions (dropped at the end of this iteration, after the MRs).
        let (s, d, k) = unsafe {
            (
                MemoryRegion::new(&p.pd, src.as_mut_ptr(), max).unwrap(),
                MemoryRegion::new(&p.pd, dst.as_mut_ptr(), max).unwrap(),
                MemoryRegion::new(&p.pd, back.as_mut_ptr(), max).unwrap(),
            )
        };
        let mut id = 0;
        for len in [8usize, 4096, 65_536, 1 << 20, 8 << 20] {
            id += 1;
            let w = RdmaOp {
                wr_id: id,
                opcode: Opcode::Write,
                local: src.as_mut_ptr(),
                len: len as u32,
                lkey: s.lkey(),
                remote: dst.as_mut_ptr() as u64,
                rkey: d.rkey(),
            };
            // SAFETY: src is registered with s and lives until the completion is reaped below.
            unsafe { p.a.post(&w) }.unwrap();
            assert_eq!(
                wait(&p.cq, id),
                tent::sys::ffi::ibv_wc_status::IBV_WC_SUCCESS
            );
            assert!(dst[..len] == src[..len], "{dev}: WRITE {len} data");
            id += 1;
            let r = RdmaOp {
                wr_id: id,
                opcode: Opcode::Read,
                local: back.as_mut_ptr(),
                len: len as u32,
                lkey: k.lkey(),
                remote: dst.as_mut_ptr() as u64,
                rkey: d.rkey(),
            };
            // SAFETY: back is registered with k and lives until the completion is reaped.
            unsafe { p.a.post(&r) }.unwrap();
            assert_eq!(
                wait(&p.cq, id),
                tent::sys::ffi::ibv_wc_status::IBV_WC_SUCCESS
            );
            assert!(back[..len] == src[..len], "{dev}: READ {len} data");
        }
        drop((s, d, k));
        println!("RXE-OK {dev}: WRITE and READ 8 B .. 8 MiB verified");
    }
}

#[test]
fn rxe_forged_rkey_fails_on_the_wire_with_a_remote_access_error() {
    if !in_guest() {
        return;
    }
    let p = pair(&rails()[0]);
    let mut src = pattern(1, 4096);
    let mut dst = vec![0u8; 4096];
    // SAFETY: the buffers outlive the regions.
    let (s, d) = unsafe {
        (
            MemoryRegion::new(&p.pd, src.as_mut_ptr(), 4096).unwrap(),
            MemoryRegion::new(&p.pd, dst.as_mut_ptr(), 4096).unwrap(),
        )
    };
    let w = RdmaOp {
        wr_id: 7,
        opcode: Opcode::Write,
        local: src.as_mut_ptr(),
        len: 4096,
        lkey: s.lkey(),
        remote: dst.as_mut_ptr() as u64,
        rkey: d.rkey() ^ 0x5a5a00,
    };
    // SAFETY: src is registered and lives until the completion.
    unsafe { p.a.post(&w) }.unwrap();
    let status = wait(&p.cq, 7);
    assert_eq!(status, tent::sys::ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR);
    assert!(dst.iter().all(|&b| b == 0), "forged rkey wrote data");
}

#[test]
fn rxe_unknown_device_lists_those_found_and_gid_index_is_checked() {
    if !in_guest() {
        return;
    }
    let e = Context::open("mlx5_nope").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("rxe0"), "{e}");
    let ctx = Context::open("rxe0").unwrap();
    let e = ctx.choose_gid(1, Some(100_000)).unwrap_err();
    assert!(
        e.to_string().contains("GID index 100000 out of range"),
        "{e}"
    );
    assert!(ctx.max_qp_wr() > 0);
}
