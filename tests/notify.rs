//! Notifications: alone and attached to a submission (delivered only after
//! its data landed), over shm and over TCP; exactly once and in order per
//! peer; a dead peer fails the submission; bad input refused.

mod common;

use std::time::{Duration, Instant};

use common::{engine, pattern, test_config};
use tent::control::client;
use tent::control::wire::NotifyFrame;
use tent::{
    Engine, ErrorKind, LocalAddr, Notification, RemoteAddr, SegmentId, TaskState, TransportKind, op,
};

const WAIT: Duration = Duration::from_secs(10);

fn note(name: &str, msg: &[u8]) -> Notification {
    Notification::new(name, msg.to_vec()).unwrap()
}

/// The receiver reads the data when the notification arrives: each round
/// writes a fresh pattern, so a notification ahead of its data sees the
/// previous round's bytes.
fn data_lands_before_its_notification(sender: &Engine, receiver: &Engine, expect: TransportKind) {
    let len = 1 << 20;
    let dst = receiver.allocate_memory(len).unwrap();
    let src = sender.allocate_memory(len).unwrap();
    let seg = sender.open_segment(&receiver.segment_name()).unwrap();
    for round in 0..20u8 {
        let data = pattern(round, len as usize);
        src.write(0, &data).unwrap();
        let batch = sender.allocate_batch(4).unwrap();
        let reqs: Vec<_> = (0..4u64)
            .map(|i| {
                let q = len / 4;
                op::Write::new(
                    LocalAddr::new(src.id(), i * q),
                    RemoteAddr::new(seg, dst.addr() + i * q),
                    q,
                )
                .build()
            })
            .collect();
        let msg = [round; 3];
        sender
            .submit_with_notification(batch, &reqs, &note("kv-ready", &msg))
            .unwrap();
        let got = receiver.wait_notification(WAIT).unwrap();
        assert_eq!(
            (got.name.as_str(), got.msg.as_slice()),
            ("kv-ready", &msg[..])
        );
        assert_eq!(got.from, sender.segment_name());
        let mut landed = vec![0u8; len as usize];
        dst.read(0, &mut landed).unwrap();
        assert!(
            landed == data,
            "round {round}: notification before its data"
        );
        let s = sender.wait_batch(batch, WAIT).unwrap();
        assert_eq!(s.state, TaskState::Completed);
        assert_eq!(s.transport, expect);
        sender.free_batch(batch).unwrap();
    }
    assert!(receiver.recv_notifications().is_empty(), "exactly once");
}

#[test]
fn an_attached_notification_follows_its_data_over_shm() {
    let (a, b) = (engine(), engine());
    data_lands_before_its_notification(&a, &b, TransportKind::Shm);
}

#[test]
fn an_attached_notification_follows_its_data_over_tcp() {
    let mut c = test_config();
    c.transports.shm.enable = false;
    let a = Engine::new(c).unwrap();
    let b = engine();
    data_lands_before_its_notification(&a, &b, TransportKind::Tcp);
}

#[test]
fn notifications_to_one_peer_arrive_once_each_in_call_order() {
    let (a, b) = (engine(), engine());
    let seg = a.open_segment(&b.segment_name()).unwrap();
    let src = a.allocate_memory(1 << 16).unwrap();
    let dst = b.allocate_memory(1 << 16).unwrap();
    let mut batches = Vec::new();
    // Plain sends from another thread interleave with attached ones here;
    // the order that counts is each thread's own, and all arrive once.
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..50u32 {
                a.send_notification(seg, &note("plain", &i.to_le_bytes()))
                    .unwrap();
            }
        });
        for i in 0..50u32 {
            let batch = a.allocate_batch(1).unwrap();
            let req = op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(seg, dst.addr()),
                1 << 16,
            )
            .build();
            a.submit_with_notification(batch, &[req], &note("attached", &i.to_le_bytes()))
                .unwrap();
            batches.push(batch);
        }
    });
    let mut got = Vec::new();
    let start = Instant::now();
    while got.len() < 100 {
        assert!(start.elapsed() < WAIT, "only {} of 100 arrived", got.len());
        got.extend(b.recv_notifications());
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(b.recv_notifications().is_empty(), "a duplicate arrived");
    for name in ["plain", "attached"] {
        let seq: Vec<u32> = got
            .iter()
            .filter(|r| r.name == name)
            .map(|r| u32::from_le_bytes(r.msg.as_slice().try_into().unwrap()))
            .collect();
        assert_eq!(seq, (0..50).collect::<Vec<_>>(), "{name}: out of order");
    }
    for batch in batches {
        assert_eq!(
            a.wait_batch(batch, WAIT).unwrap().state,
            TaskState::Completed
        );
    }
}

#[test]
fn a_notification_to_the_local_segment_lands_in_this_engines_inbox() {
    let e = engine();
    e.send_notification(SegmentId::LOCAL, &note("self", b"hi"))
        .unwrap();
    let src = e.allocate_memory(4096).unwrap();
    let dst = e.allocate_memory(4096).unwrap();
    src.write(0, &pattern(3, 4096)).unwrap();
    let batch = e.allocate_batch(1).unwrap();
    let req = op::Write::new(
        LocalAddr::new(src.id(), 0),
        RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
        4096,
    )
    .build();
    e.submit_with_notification(batch, &[req], &note("after", b""))
        .unwrap();
    assert_eq!(e.wait_notification(WAIT).unwrap().name, "self");
    let after = e.wait_notification(WAIT).unwrap();
    assert_eq!(
        (after.name.as_str(), after.from),
        ("after", e.segment_name())
    );
    let mut out = vec![0u8; 4096];
    dst.read(0, &mut out).unwrap();
    assert_eq!(out, pattern(3, 4096));
    assert_eq!(
        e.wait_notification(Duration::from_millis(10))
            .unwrap_err()
            .kind(),
        ErrorKind::Timeout
    );
}

/// The receiver's engine is gone; the shm mapping the sender holds still
/// takes the data, but the notification cannot be delivered: the
/// submission fails rather than the message vanishing, and promptly.
#[test]
fn a_dead_peer_fails_the_submission_instead_of_losing_its_notification() {
    let a = engine();
    let b = engine();
    let seg = a.open_segment(&b.segment_name()).unwrap();
    let src = a.allocate_memory(4096).unwrap();
    let dst = b.allocate_memory(4096).unwrap();
    let dst_addr = dst.addr();
    drop(dst);
    drop(b);
    let batch = a.allocate_batch(1).unwrap();
    let req = op::Write::new(
        LocalAddr::new(src.id(), 0),
        RemoteAddr::new(seg, dst_addr),
        4096,
    )
    .build();
    let start = Instant::now();
    a.submit_with_notification(batch, &[req], &note("lost?", b"no"))
        .unwrap();
    let s = a.wait_batch(batch, WAIT).unwrap();
    assert_eq!(s.state, TaskState::Failed, "{s:?}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    let e = a.send_notification(seg, &note("alone", b"")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unreachable, "{e}");
    a.free_batch(batch).unwrap();
}

#[test]
fn a_notification_waits_for_a_failed_request_and_is_not_sent() {
    let (a, b) = (engine(), engine());
    let seg = a.open_segment(&b.segment_name()).unwrap();
    let src = a.allocate_memory(4096).unwrap();
    let dst = b.allocate_memory(4096).unwrap();
    let batch = a.allocate_batch(2).unwrap();
    let good = op::Write::new(
        LocalAddr::new(src.id(), 0),
        RemoteAddr::new(seg, dst.addr()),
        4096,
    )
    .build();
    // Past the end of the remote region: fails, so its data never lands.
    let bad = op::Write::new(
        LocalAddr::new(src.id(), 0),
        RemoteAddr::new(seg, dst.addr() + 1),
        4096,
    )
    .build();
    a.submit_with_notification(batch, &[good, bad], &note("partial", b""))
        .unwrap();
    let s = a.wait_batch(batch, WAIT).unwrap();
    assert!(
        matches!(s.state, TaskState::Invalid | TaskState::Failed),
        "{s:?}"
    );
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        b.recv_notifications().is_empty(),
        "sent although data failed"
    );
}

#[test]
fn bad_notification_input_is_refused_with_nothing_queued() {
    let (a, b) = (engine(), engine());
    let seg = a.open_segment(&b.segment_name()).unwrap();
    let src = a.allocate_memory(4096).unwrap();
    let dst = b.allocate_memory(4096).unwrap();
    let kind = |r: tent::Result<()>| r.unwrap_err().kind();
    assert_eq!(
        Notification::new("x".repeat(257), vec![])
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
    let too_long = Notification {
        name: "n".into(),
        msg: vec![0; 4097],
    };
    assert_eq!(
        kind(a.send_notification(seg, &too_long)),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        kind(a.send_notification(SegmentId(99), &note("n", b""))),
        ErrorKind::SegmentNotFound
    );
    let batch = a.allocate_batch(4).unwrap();
    assert_eq!(
        kind(a.submit_with_notification(batch, &[], &note("n", b""))),
        ErrorKind::InvalidArgument
    );
    let to = |s| {
        op::Write::new(
            LocalAddr::new(src.id(), 0),
            RemoteAddr::new(s, dst.addr()),
            8,
        )
        .build()
    };
    assert_eq!(
        kind(a.submit_with_notification(batch, &[to(seg), to(SegmentId::LOCAL)], &note("n", b""))),
        ErrorKind::InvalidArgument
    );
    a.free_batch(batch).unwrap();
    assert_eq!(
        kind(a.submit_with_notification(batch, &[to(seg)], &note("n", b""))),
        ErrorKind::InvalidArgument,
        "a freed batch"
    );
    // Opened by its shm name: there is no control address to send to.
    let shm = a.open_segment(b.local_segment_name().unwrap()).unwrap();
    assert_eq!(
        kind(a.send_notification(shm, &note("n", b""))),
        ErrorKind::InvalidArgument
    );
    std::thread::sleep(Duration::from_millis(20));
    assert!(b.recv_notifications().is_empty());
}

/// As a peer on the wire: a resend of the same (sender, seq), as after a
/// lost acknowledgement, is acknowledged and filed once.
#[test]
fn a_resent_frame_is_acknowledged_and_filed_once() {
    let b = engine();
    let peer = b.segment_name();
    let mut s = client::notify_session(&peer, None, WAIT).unwrap();
    let frame = |seq: u64, name: &str| NotifyFrame {
        sender: 77,
        from: "forged".into(),
        seq,
        name: name.into(),
        msg: vec![1, 2, 3],
    };
    client::notify(&mut s, &peer, &frame(1, "one")).unwrap();
    client::notify(&mut s, &peer, &frame(1, "one")).unwrap();
    // A new connection, as a sender reconnecting after a broken one.
    let mut s2 = client::notify_session(&peer, None, WAIT).unwrap();
    client::notify(&mut s2, &peer, &frame(1, "one")).unwrap();
    client::notify(&mut s2, &peer, &frame(2, "two")).unwrap();
    let names: Vec<_> = b.recv_notifications().into_iter().map(|r| r.name).collect();
    assert_eq!(names, ["one", "two"]);
}

/// A batch with a notification pending is not done: it cannot be freed
/// and reports Pending until the message is delivered.
#[test]
fn a_batch_is_pending_until_its_notification_is_delivered() {
    let (a, b) = (engine(), engine());
    let seg = a.open_segment(&b.segment_name()).unwrap();
    let src = a.allocate_memory(4096).unwrap();
    let dst = b.allocate_memory(4096).unwrap();
    // Fill b's inbox so the notification waits (SqFull, retried).
    let peer = b.segment_name();
    let mut s = client::notify_session(&peer, None, WAIT).unwrap();
    for seq in 1..=tent::notify::INBOX_MAX as u64 {
        let f = NotifyFrame {
            sender: 5,
            from: "filler".into(),
            seq,
            name: String::new(),
            msg: Vec::new(),
        };
        client::notify(&mut s, &peer, &f).unwrap();
    }
    let batch = a.allocate_batch(1).unwrap();
    let req = op::Write::new(
        LocalAddr::new(src.id(), 0),
        RemoteAddr::new(seg, dst.addr()),
        4096,
    )
    .build();
    a.submit_with_notification(batch, &[req], &note("queued", b""))
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(a.batch_status(batch).unwrap().state, TaskState::Pending);
    assert_eq!(a.status(batch, 0).unwrap().state, TaskState::Completed);
    assert_eq!(
        a.free_batch(batch).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    // Make room: the retry delivers it.
    assert_eq!(b.recv_notifications().len(), tent::notify::INBOX_MAX);
    assert_eq!(
        a.wait_batch(batch, WAIT).unwrap().state,
        TaskState::Completed
    );
    assert_eq!(b.wait_notification(WAIT).unwrap().name, "queued");
    a.free_batch(batch).unwrap();
}
