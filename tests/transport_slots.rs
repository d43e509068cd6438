//! Transports sit in slots: installation may fail (the engine runs without
//! that transport), and a test can swap a slot after construction.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{reap, test_config};
use tent::transport::fault::{FaultPolicy, FaultProxyTransport};
use tent::transport::{
    Capabilities, InstallContext, Slice, SliceCompletion, SubmitOutcome, Transport, WorkerCtx,
};
use tent::{Engine, Error, ErrorKind, LocalAddr, RemoteAddr, SegmentId, TransportKind, op};

/// Wraps a transport, counts slices, optionally fails every one of them.
struct Counting {
    inner: Arc<dyn Transport>,
    slices: AtomicU64,
    fail_with: Option<ErrorKind>,
}

impl Transport for Counting {
    fn kind(&self) -> TransportKind {
        self.inner.kind()
    }
    fn install(&self, ctx: &InstallContext) -> tent::Result<()> {
        self.inner.install(ctx)
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn reaches(&self, s: &tent::segment::Segment) -> bool {
        self.inner.reaches(s)
    }
    fn submit(&self, ctx: &WorkerCtx, slices: &[Slice<'_>], out: &mut [SubmitOutcome]) {
        self.slices
            .fetch_add(slices.len() as u64, Ordering::Relaxed);
        match self.fail_with {
            Some(e) => out
                .iter_mut()
                .for_each(|o| *o = SubmitOutcome::Completed(Err(e))),
            None => self.inner.submit(ctx, slices, out),
        }
    }
    fn poll(&self, ctx: &WorkerCtx, out: &mut [SliceCompletion]) -> usize {
        self.inner.poll(ctx, out)
    }
    fn abort(&self, ctx: &WorkerCtx, token: u64, kind: ErrorKind) {
        self.inner.abort(ctx, token, kind)
    }
}

/// A transport whose bring-up fails.
struct Broken;

impl Transport for Broken {
    fn kind(&self) -> TransportKind {
        TransportKind::Shm
    }
    fn install(&self, _: &InstallContext) -> tent::Result<()> {
        Err(Error::new(
            ErrorKind::LocalNicFailed,
            "injected install failure",
        ))
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    fn reaches(&self, _: &tent::segment::Segment) -> bool {
        true
    }
    fn submit(&self, _: &WorkerCtx, _: &[Slice<'_>], _: &mut [SubmitOutcome]) {
        unreachable!("never installed")
    }
    fn poll(&self, _: &WorkerCtx, _: &mut [SliceCompletion]) -> usize {
        0
    }
    fn abort(&self, _: &WorkerCtx, _: u64, _: ErrorKind) {
        unreachable!("never installed")
    }
}

/// A synchronous memcpy in the local slot that trusts its caller: the tests
/// name memory inside buffers of the engine that posts.
fn memcpy() -> common::stub::Synchronous {
    common::stub::Synchronous::new(TransportKind::Local, |s| {
        let (src, dst) = match s.opcode {
            tent::Opcode::Write => (s.local as *const u8, s.remote as *mut u8),
            tent::Opcode::Read => (s.remote as *const u8, s.local),
        };
        // SAFETY: the engine checked `local`; every test names remote memory inside a buffer of the posting engine.
        unsafe { std::ptr::copy(src, dst, s.len as usize) };
        SubmitOutcome::Completed(Ok(s.len))
    })
}

/// An 8-byte local WRITE through `e`, and its result.
fn write_8(e: &Engine) -> Result<u64, ErrorKind> {
    let m = e.allocate_memory(64).unwrap();
    let mut ring = e.ring().unwrap();
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(m.id(), 0),
                RemoteAddr::new(SegmentId::LOCAL, m.addr() + 8),
                8,
            )
            .user_data(1),
        )
        .unwrap();
    reap(&mut ring, 1)[0].result()
}

/// A transport keeps state per worker, and every engine has a worker 0: a
/// transport installed in one engine is refused by a second, so the two
/// workers 0 never share a cell.
#[test]
fn a_transport_serves_one_engine_only() {
    let proxy = Arc::new(FaultProxyTransport::new(
        Arc::new(memcpy()),
        FaultPolicy::default(),
    ));
    let first = Engine::builder()
        .config(test_config())
        .transport(proxy.clone())
        .build()
        .unwrap();
    assert!(first.transports().contains(&TransportKind::Local));
    let second = Engine::builder()
        .config(test_config())
        .transport(proxy.clone())
        .build()
        .unwrap();
    assert!(
        !second.transports().contains(&TransportKind::Local),
        "installed in a second engine: {:?}",
        second.transports()
    );
    assert_eq!(write_8(&first), Ok(8));
    assert_eq!(proxy.counts().forwarded, 1);
}

/// The same for the TCP transport (per-worker active peers, per-worker
/// connections of each peer).
#[test]
fn the_tcp_transport_serves_one_engine_only() {
    let first = Engine::new(test_config()).unwrap();
    let tcp = first
        .swap_transport(TransportKind::Tcp, None)
        .expect("tcp installed");
    first.swap_transport(TransportKind::Tcp, Some(tcp.clone()));
    let second = Engine::builder()
        .config(test_config())
        .transport(tcp)
        .build()
        .unwrap();
    assert!(first.transports().contains(&TransportKind::Tcp));
    assert!(
        !second.transports().contains(&TransportKind::Tcp),
        "installed in a second engine: {:?}",
        second.transports()
    );
}

/// Swapped in rather than installed, a transport belongs to the first
/// engine whose worker uses it: another engine's worker is refused with a
/// typed error, never let into the first one's state.
#[test]
fn a_transport_swapped_into_two_engines_serves_the_first_user_only() {
    let proxy = Arc::new(FaultProxyTransport::new(
        Arc::new(memcpy()),
        FaultPolicy::default(),
    ));
    let first = Engine::new(test_config()).unwrap();
    let second = Engine::new(test_config()).unwrap();
    first.swap_transport(TransportKind::Local, Some(proxy.clone()));
    second.swap_transport(TransportKind::Local, Some(proxy.clone()));
    assert_eq!(write_8(&first), Ok(8));
    assert_eq!(write_8(&second), Err(ErrorKind::InvalidArgument));
    assert_eq!(write_8(&first), Ok(8));
    assert_eq!(proxy.counts().forwarded, 2);
    assert_eq!(first.credits_in_flight(), 0);
    assert_eq!(second.credits_in_flight(), 0);
}

#[test]
fn failed_install_leaves_the_slot_empty() {
    let e = Engine::builder()
        .config(test_config())
        .transport(Arc::new(Broken))
        .build()
        .unwrap();
    assert_eq!(
        e.transports(),
        vec![TransportKind::Local, TransportKind::Tcp]
    );
    let m = e.allocate_memory(64).unwrap();
    let mut ring = e.ring().unwrap();
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(m.id(), 0),
                RemoteAddr::new(SegmentId::LOCAL, m.addr() + 8),
                8,
            )
            .user_data(1),
        )
        .unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(8));
}

#[test]
fn swapped_slot_takes_effect_and_can_be_swapped_back() {
    let e = Engine::new(test_config()).unwrap();
    let src = e.allocate_memory(1 << 20).unwrap();
    let dst = e.allocate_memory(1 << 20).unwrap();
    let original = e
        .swap_transport(TransportKind::Local, None)
        .expect("local installed");
    let counting = Arc::new(Counting {
        inner: original.clone(),
        slices: AtomicU64::new(0),
        fail_with: None,
    });
    e.swap_transport(TransportKind::Local, Some(counting.clone()));
    let mut ring = e.ring().unwrap();
    let w = |ud| {
        op::Write::new(
            LocalAddr::new(src.id(), 0),
            RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
            1 << 20,
        )
        .user_data(ud)
    };
    ring.submission().push(w(1)).unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(1 << 20));
    let block = e.config().block_size;
    assert_eq!(
        counting.slices.load(Ordering::Relaxed),
        (1 << 20) / block,
        "sliced by block_size"
    );

    let failing = Arc::new(Counting {
        inner: original.clone(),
        slices: AtomicU64::new(0),
        fail_with: Some(ErrorKind::RouteLost),
    });
    e.swap_transport(TransportKind::Local, Some(failing.clone()));
    ring.submission().push(w(2)).unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Err(ErrorKind::RouteLost));
    assert_eq!(
        failing.slices.load(Ordering::Relaxed),
        1,
        "no slice is posted after the first failure"
    );

    e.swap_transport(TransportKind::Local, None);
    ring.submission().push(w(3)).unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Err(ErrorKind::Unreachable));

    e.swap_transport(TransportKind::Local, Some(original));
    ring.submission().push(w(4)).unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(1 << 20));
    assert_eq!(e.credits_in_flight(), 0);
}
