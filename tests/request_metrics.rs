//! The request counters `/metrics` exposes (TENT's names):
//! `tent_{read,write}_{requests,bytes,failures}_total{transport}`, the
//! intake-to-completion histogram `tent_request_duration_seconds` by
//! transport and priority, and the failover counters present at 0 from the
//! start.

mod common;

use std::sync::Arc;

use common::{reap, test_config};
use tent::transport::fault::{FaultPolicy, FaultProxyTransport};
use tent::transport::{SubmitOutcome, Transport};
use tent::{Engine, LocalAddr, Priority, RemoteAddr, SegmentId, TransportKind, op};

/// The sample `line` (name and labels) in `text`, as a number.
fn sample(text: &str, line: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(line)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {line} in:\n{text}"))
        .parse()
        .unwrap()
}

/// One LOW (queued) WRITE of `len` bytes between two fresh buffers of `e`,
/// on the local segment: its result.
fn low_write(e: &Engine, len: u64) -> Result<u64, tent::ErrorKind> {
    let (src, dst) = (
        e.allocate_memory(len).unwrap(),
        e.allocate_memory(len).unwrap(),
    );
    let mut ring = e.ring_with_depth(4).unwrap();
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
                len,
            )
            .priority(Priority::Low),
        )
        .unwrap();
    reap(&mut ring, 1)[0].result()
}

#[test]
fn reads_writes_bytes_failures_and_durations_are_counted_by_transport_and_priority() {
    let e = Engine::new(test_config()).unwrap();
    let text = e.metrics_text();
    // Present at 0 before anything happened.
    assert_eq!(
        sample(
            &text,
            "tent_transport_failover_total{from=\"rdma\",to=\"tcp\"}"
        ),
        0.0
    );
    assert_eq!(
        sample(&text, "tent_write_requests_total{transport=\"local\"}"),
        0.0
    );
    assert!(
        !text.contains("tent_request_duration_seconds_count"),
        "no request yet"
    );

    let src = e.allocate_memory(1 << 20).unwrap();
    let dst = e.allocate_memory(1 << 20).unwrap();
    let mut ring = e.ring_with_depth(64).unwrap();
    {
        let mut sq = ring.submission();
        for i in 0..16u64 {
            sq.push(
                op::Write::new(
                    LocalAddr::new(src.id(), i * 4096),
                    RemoteAddr::new(SegmentId::LOCAL, dst.addr() + i * 4096),
                    4096,
                )
                .priority(Priority::High)
                .user_data(i),
            )
            .unwrap();
        }
        for i in 0..4u64 {
            sq.push(
                op::Read::new(
                    LocalAddr::new(src.id(), i << 16),
                    RemoteAddr::new(SegmentId::LOCAL, dst.addr() + (i << 16)),
                    1 << 16,
                )
                .priority(Priority::Low)
                .user_data(100 + i),
            )
            .unwrap();
        }
    }
    for c in reap(&mut ring, 20) {
        assert!(c.result().is_ok(), "{c:?}");
    }
    let text = e.metrics_text();
    assert_eq!(
        sample(&text, "tent_write_requests_total{transport=\"local\"}"),
        16.0
    );
    assert_eq!(
        sample(&text, "tent_write_bytes_total{transport=\"local\"}"),
        65536.0
    );
    assert_eq!(
        sample(&text, "tent_read_requests_total{transport=\"local\"}"),
        4.0
    );
    assert_eq!(
        sample(&text, "tent_read_bytes_total{transport=\"local\"}"),
        262144.0
    );
    assert_eq!(
        sample(&text, "tent_write_failures_total{transport=\"local\"}"),
        0.0
    );
    let high = "transport=\"local\",priority=\"high\"";
    let low = "transport=\"local\",priority=\"low\"";
    assert_eq!(
        sample(
            &text,
            &format!("tent_request_duration_seconds_count{{{high}}}")
        ),
        16.0
    );
    assert_eq!(
        sample(
            &text,
            &format!("tent_request_duration_seconds_count{{{low}}}")
        ),
        4.0
    );
    assert_eq!(
        sample(
            &text,
            &format!("tent_request_duration_seconds_bucket{{le=\"+Inf\",{low}}}")
        ),
        4.0
    );
    assert_eq!(e.completed(), (20, 16 * 4096 + 4 * 65536));

    // A request that fails on its transport (no failover: the engine
    // allows none) is counted as a failure of its opcode, not its bytes.
    let mut c = test_config();
    c.max_failover_attempts = 0;
    let e = Engine::new(c).unwrap();
    let local = e.swap_transport(TransportKind::Local, None).unwrap();
    let proxy = FaultProxyTransport::new(
        local,
        FaultPolicy {
            status_corrupt_rate: 1.0,
            ..FaultPolicy::default()
        },
    )
    .as_kind(TransportKind::Local);
    e.swap_transport(
        TransportKind::Local,
        Some(Arc::new(proxy) as Arc<dyn Transport>),
    );
    let src = e.allocate_memory(1 << 16).unwrap();
    let dst = e.allocate_memory(1 << 16).unwrap();
    let mut ring = e.ring_with_depth(4).unwrap();
    ring.submission()
        .push(op::Write::new(
            LocalAddr::new(src.id(), 0),
            RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
            1 << 16,
        ))
        .unwrap();
    assert!(reap(&mut ring, 1)[0].result().is_err());
    let text = e.metrics_text();
    assert_eq!(
        sample(&text, "tent_write_failures_total{transport=\"local\"}"),
        1.0
    );
    assert_eq!(
        sample(&text, "tent_write_requests_total{transport=\"local\"}"),
        1.0
    );
    assert_eq!(
        sample(&text, "tent_write_bytes_total{transport=\"local\"}"),
        0.0
    );
}

/// A queued request done by a synchronous copy in the same turn is timed
/// with its copy (the turn's clock, read before the copy, said 0).
#[test]
fn a_queued_copy_is_timed_with_its_copy() {
    let e = Engine::new(test_config()).unwrap();
    assert!(low_write(&e, 128 << 10).is_ok());
    let sum = sample(
        &e.metrics_text(),
        "tent_request_duration_seconds_sum{transport=\"local\",priority=\"low\"}",
    );
    assert!(sum > 0.0, "a 128 KiB copy took no time: {sum} s");
}

/// A request refused at intake, before any transport, is a failure under
/// `transport="none"`.
#[test]
fn a_request_refused_at_intake_counts_as_a_failure_of_no_transport() {
    let e = Engine::new(test_config()).unwrap();
    let b = e.allocate_memory(64).unwrap();
    let mut ring = e.ring_with_depth(4).unwrap();
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(b.id(), 0),
                RemoteAddr::new(SegmentId::LOCAL, b.addr()),
                8,
            )
            // Passed long ago: refused at intake.
            .deadline_ns(1),
        )
        .unwrap();
    assert_eq!(
        reap(&mut ring, 1)[0].result(),
        Err(tent::ErrorKind::Timeout)
    );
    let text = e.metrics_text();
    assert_eq!(
        sample(&text, "tent_write_failures_total{transport=\"none\"}"),
        1.0
    );
    assert_eq!(
        sample(&text, "tent_write_requests_total{transport=\"none\"}"),
        1.0
    );
    assert!(!text.contains("tent_write_bytes_total{transport=\"none\"}"));
}

/// A request's time splits into queue, dispatch and transport stages that
/// add up to its duration; a synchronous copy's time lands in its own
/// transport stage, and the requests queued behind it wait in theirs.
#[test]
fn a_requests_stages_add_up_to_its_duration_and_a_copy_is_its_transport_stage() {
    let e = Engine::new(test_config()).unwrap();
    const N: u64 = 8;
    const LEN: u64 = 1 << 20;
    let (src, dst) = (
        e.allocate_memory(N * LEN).unwrap(),
        e.allocate_memory(N * LEN).unwrap(),
    );
    let mut ring = e.ring_with_depth(16).unwrap();
    {
        let mut sq = ring.submission();
        for i in 0..N {
            sq.push(
                op::Write::new(
                    LocalAddr::new(src.id(), i * LEN),
                    RemoteAddr::new(SegmentId::LOCAL, dst.addr() + i * LEN),
                    LEN,
                )
                .priority(Priority::Low)
                .user_data(i),
            )
            .unwrap();
        }
    }
    for c in reap(&mut ring, N as usize) {
        assert!(c.result().is_ok(), "{c:?}");
    }
    let text = e.metrics_text();
    let labels = "transport=\"local\",priority=\"low\"";
    let stage = |s: &str, what: &str| {
        sample(
            &text,
            &format!("tent_request_stage_seconds_{what}{{stage=\"{s}\",{labels}}}"),
        )
    };
    let total = sample(
        &text,
        &format!("tent_request_duration_seconds_sum{{{labels}}}"),
    );
    for s in ["queue", "dispatch", "transport"] {
        assert_eq!(stage(s, "count"), N as f64, "{s}:\n{text}");
    }
    let parts = ["queue", "dispatch", "transport"].map(|s| stage(s, "sum"));
    assert!(
        (parts.iter().sum::<f64>() - total).abs() < 1e-6,
        "{parts:?} do not add up to {total}"
    );
    assert!(
        parts[2] > 0.0,
        "8 MiB copied in no transport time: {parts:?}"
    );
    assert!(
        parts[0] > 0.0,
        "requests queued behind 1 MiB copies waited no time: {parts:?}"
    );
}

/// A synchronous transport that copies (says done to) the first two
/// slices of 4 KiB, answers `Later` for 50 ms, then refuses the rest for
/// good.
fn copies_then_refuses() -> common::stub::Synchronous {
    let calls = std::sync::atomic::AtomicU32::new(0);
    let stalled_at = std::sync::OnceLock::new();
    common::stub::Synchronous::new(TransportKind::Local, move |s| {
        if calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 2 {
            SubmitOutcome::Completed(Ok(s.len))
        } else if stalled_at.get_or_init(std::time::Instant::now).elapsed()
            < std::time::Duration::from_millis(50)
        {
            SubmitOutcome::Later
        } else {
            SubmitOutcome::Rejected(tent::ErrorKind::InvalidArgument)
        }
    })
    .slice_bytes(4096)
}

/// A request that copied two slices, waited 50 ms and was then refused
/// ends when it was refused, not at its last copy, and its stages still
/// add up to its duration (before: 0 s of a request that took 50 ms).
#[test]
fn a_request_refused_after_copies_is_timed_to_its_refusal() {
    let e = Engine::new(test_config()).unwrap();
    e.swap_transport(
        TransportKind::Local,
        Some(Arc::new(copies_then_refuses()) as Arc<dyn Transport>),
    );
    assert_eq!(
        low_write(&e, 16 << 10),
        Err(tent::ErrorKind::InvalidArgument)
    );
    let text = e.metrics_text();
    let labels = "transport=\"local\",priority=\"low\"";
    let took = sample(
        &text,
        &format!("tent_request_duration_seconds_sum{{{labels}}}"),
    );
    assert!(took >= 0.045, "a 50 ms wait took {took} s");
    let parts: f64 = ["queue", "dispatch", "transport"]
        .map(|s| {
            sample(
                &text,
                &format!("tent_request_stage_seconds_sum{{stage=\"{s}\",{labels}}}"),
            )
        })
        .iter()
        .sum();
    assert!((parts - took).abs() < 1e-6, "{parts} vs {took}");
}
