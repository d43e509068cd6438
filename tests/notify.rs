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

fn soon() -> Instant {
    Instant::now() + WAIT
}

/// A 4 KiB WRITE from the start of `src` to `addr` in `seg`.
fn write_4k(src: &tent::Buffer, seg: SegmentId, addr: u64) -> tent::Sqe {
    op::Write::new(
        LocalAddr::new(src.id(), 0),
        RemoteAddr::new(seg, addr),
        4096,
    )
    .build()
}

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
    assert_eq!(e.try_notification(), None);
    e.send_notification(SegmentId::LOCAL, &note("first", b""))
        .unwrap();
    assert_eq!(e.try_notification().unwrap().name, "first");
    assert_eq!(e.try_notification(), None);
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

/// A segment of `b` opened through a control server that serves `b`'s
/// descriptor and is then gone: the data path (shm to `b`) works, the
/// control port refuses. Returns the segment and the dead port's name.
fn segment_whose_control_port_is_gone(a: &Engine, b: &Engine) -> (SegmentId, String) {
    let desc = tent::control::fetch_descriptor(&b.segment_name(), None, WAIT).unwrap();
    let relay = tent::control::ControlServer::start("127.0.0.1", 0, None, move |_| {
        std::sync::Arc::new(move || desc.clone())
            as std::sync::Arc<tent::control::server::DescriptorFn>
    })
    .unwrap();
    let name = relay.local_addr().to_string();
    let seg = a.open_segment(&name).unwrap();
    drop(relay);
    (seg, name)
}

/// The data lands but the receiver's engine cannot be reached: the
/// submission fails rather than its notification vanishing, and promptly
/// (the port refuses: the engine is gone).
#[test]
fn a_dead_peer_fails_the_submission_instead_of_losing_its_notification() {
    let (a, b) = (engine(), engine());
    let (seg, _) = segment_whose_control_port_is_gone(&a, &b);
    let src = a.allocate_memory(4096).unwrap();
    let dst = b.allocate_memory(4096).unwrap();
    let batch = a.allocate_batch(1).unwrap();
    let req = write_4k(&src, seg, dst.addr());
    let start = Instant::now();
    a.submit_with_notification(batch, &[req], &note("lost?", b"no"))
        .unwrap();
    let s = a.wait_batch(batch, WAIT).unwrap();
    assert_eq!(
        a.status(batch, 0).unwrap().state,
        TaskState::Completed,
        "the data landed"
    );
    assert_eq!(
        (s.state, s.error),
        (TaskState::Failed, Some(ErrorKind::Unreachable)),
        "{s:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    let e = a.send_notification(seg, &note("alone", b"")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unreachable, "{e}");
    assert!(
        !e.to_string().starts_with("Unreachable: Unreachable"),
        "{e}"
    );
    a.free_batch(batch).unwrap();
}

/// A receiver engine that was dropped takes nothing more, even on a
/// connection the sender still holds open: the send fails.
#[test]
fn a_dropped_receiver_no_longer_acknowledges() {
    let (a, b) = (engine(), engine());
    let seg = a.open_segment(&b.segment_name()).unwrap();
    a.send_notification(seg, &note("first", b"")).unwrap();
    drop(b);
    let e = a.send_notification(seg, &note("second", b"")).unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Shutdown | ErrorKind::Unreachable),
        "{e}"
    );
}

/// A peer that refuses notifications (a control server without the
/// service) is an answer, not a broken connection: the send fails at once
/// instead of reconnecting until the bound.
#[test]
fn a_refusal_ends_the_message_without_reconnecting() {
    let b = engine();
    let desc = tent::control::fetch_descriptor(&b.segment_name(), None, WAIT).unwrap();
    let old = tent::control::ControlServer::start("127.0.0.1", 0, None, move |_| {
        std::sync::Arc::new(move || desc.clone())
            as std::sync::Arc<tent::control::server::DescriptorFn>
    })
    .unwrap();
    let a = engine();
    let seg = a.open_segment(&old.local_addr().to_string()).unwrap();
    let start = Instant::now();
    let e = a.send_notification(seg, &note("n", b"")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unreachable, "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "took {:?}: {e}",
        start.elapsed()
    );
}

/// Two names for one engine (it listens on every address) are two lanes:
/// their streams must not collide in the receiver's dedup.
#[test]
fn one_peer_under_two_names_gets_every_message() {
    let mut c = test_config();
    c.rpc_server_hostname = "0.0.0.0".into();
    let b = Engine::new(c).unwrap();
    let port = b.segment_name().rsplit_once(':').unwrap().1.to_owned();
    let a = engine();
    let one = a.open_segment(&format!("127.0.0.1:{port}")).unwrap();
    let two = a.open_segment(&format!("127.0.0.2:{port}")).unwrap();
    for i in 0..3u8 {
        a.send_notification(one, &note("one", &[i])).unwrap();
        a.send_notification(two, &note("two", &[i])).unwrap();
    }
    let got = b.recv_notifications();
    assert_eq!(got.len(), 6, "{got:?}");
}

/// A peer that accepts connections and never answers: messages queued
/// behind the first expire by their own deadlines, not one bound after
/// another.
#[test]
fn messages_queued_behind_a_silent_peer_expire_together() {
    let b = engine();
    let mut c = test_config();
    c.default_timeout_ms = Duration::from_millis(1000);
    let a = Engine::new(c).unwrap();
    let (seg, name) = segment_whose_control_port_is_gone(&a, &b);
    // The port again, now a listener that never answers.
    let silent = std::net::TcpListener::bind(&name).unwrap();
    let src = a.allocate_memory(4096).unwrap();
    let dst = b.allocate_memory(4096).unwrap();
    let start = Instant::now();
    let batches: Vec<_> = (0..5)
        .map(|_| {
            let batch = a.allocate_batch(1).unwrap();
            // Its data is due within 200 ms, its message 1 s after that.
            let req = op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(seg, dst.addr()),
                4096,
            )
            .deadline_ns(tent::clock::deadline_after(Duration::from_millis(200)))
            .build();
            a.submit_with_notification(batch, &[req], &note("n", b""))
                .unwrap();
            batch
        })
        .collect();
    for batch in batches {
        let s = a.wait_batch(batch, WAIT).unwrap();
        assert_eq!(
            (s.state, s.error),
            (TaskState::Failed, Some(ErrorKind::Timeout)),
            "{s:?}"
        );
    }
    assert!(
        start.elapsed() < Duration::from_millis(2500),
        "5 messages took {:?}",
        start.elapsed()
    );
    drop(silent);
}

#[test]
fn a_notification_waits_for_a_failed_request_and_is_not_sent() {
    let (a, b) = (engine(), engine());
    let seg = a.open_segment(&b.segment_name()).unwrap();
    let src = a.allocate_memory(4096).unwrap();
    let dst = b.allocate_memory(4096).unwrap();
    let batch = a.allocate_batch(2).unwrap();
    let good = write_4k(&src, seg, dst.addr());
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
    let s = client::notify_session(&peer, None, WAIT).unwrap();
    let frame = |seq: u64, name: &str| NotifyFrame {
        sender: 77,
        from: "forged".into(),
        seq,
        name: name.into(),
        msg: vec![1, 2, 3],
        resend_ms: 0,
        to: 0,
    };
    client::notify(&s, &peer, &frame(1, "one"), soon()).unwrap();
    client::notify(&s, &peer, &frame(1, "one"), soon()).unwrap();
    // A new connection, as a sender reconnecting after a broken one.
    let s2 = client::notify_session(&peer, None, WAIT).unwrap();
    client::notify(&s2, &peer, &frame(1, "one"), soon()).unwrap();
    client::notify(&s2, &peer, &frame(2, "two"), soon()).unwrap();
    let names: Vec<_> = b.recv_notifications().into_iter().map(|r| r.name).collect();
    assert_eq!(names, ["one", "two"]);
}

/// As a hostile peer would: a stream's first message, then 4,200 others
/// from other stream ids, then the first one again (as after a lost
/// acknowledgement). The receiver may refuse streams past its bound (their
/// senders try again), but the resend is never delivered a second time:
/// before, the 4,200 pushed the first stream out of the duplicate table and
/// its resend was taken as new.
#[test]
fn a_resend_behind_thousands_of_other_streams_is_still_a_resend() {
    let b = engine();
    let peer = b.segment_name();
    let s = client::notify_session(&peer, None, WAIT).unwrap();
    let frame = |sender: u64, name: &str| NotifyFrame {
        sender,
        from: "hostile".into(),
        seq: 1,
        name: name.into(),
        msg: Vec::new(),
        resend_ms: 0,
        to: 0,
    };
    client::notify(&s, &peer, &frame(0x5a5a, "z"), soon()).unwrap();
    let mut delivered = b.recv_notifications();
    for i in 0..4200u64 {
        match client::notify(&s, &peer, &frame(1_000 + i, "other"), soon()) {
            Ok(()) => {}
            Err(client::NotifyError::Refused(e)) => assert_eq!(e.kind(), ErrorKind::SqFull),
            Err(client::NotifyError::Broken(e)) => panic!("{e}"),
        }
        if i % 1024 == 0 {
            delivered.extend(b.recv_notifications());
        }
    }
    let s2 = client::notify_session(&peer, None, WAIT).unwrap();
    client::notify(&s2, &peer, &frame(0x5a5a, "z"), soon()).unwrap();
    delivered.extend(b.recv_notifications());
    let z = delivered.iter().filter(|r| r.name == "z").count();
    assert_eq!(z, 1, "the first stream's message delivered {z} times");
}

/// With a secret set, an authenticated connection speaks for the sender of
/// its first notification: another sender id or name on it is refused
/// (`from` is no longer whatever each frame claims).
#[test]
fn with_a_secret_a_connection_carries_one_sender() {
    let secret = "a secret long enough to be taken";
    let mut c = test_config();
    c.rpc_shared_secret = secret.into();
    let b = Engine::new(c).unwrap();
    let peer = b.segment_name();
    let s = client::notify_session(&peer, Some(secret.as_bytes()), WAIT).unwrap();
    let frame = |sender: u64, from: &str, seq: u64| NotifyFrame {
        sender,
        from: from.into(),
        seq,
        name: "n".into(),
        msg: Vec::new(),
        resend_ms: 0,
        to: 0,
    };
    client::notify(&s, &peer, &frame(77, "a", 1), soon()).unwrap();
    for other in [frame(78, "a", 1), frame(77, "b", 2)] {
        match client::notify(&s, &peer, &other, soon()) {
            Err(client::NotifyError::Refused(e)) => {
                assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
                assert!(e.to_string().contains("sender 0x4d (a)"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
    client::notify(&s, &peer, &frame(77, "a", 2), soon()).unwrap();
    // Another connection may speak for another sender.
    let s2 = client::notify_session(&peer, Some(secret.as_bytes()), WAIT).unwrap();
    client::notify(&s2, &peer, &frame(78, "b", 1), soon()).unwrap();
    let got: Vec<_> = b.recv_notifications().into_iter().map(|r| r.from).collect();
    assert_eq!(got, ["a", "a", "b"]);
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
    let s = client::notify_session(&peer, None, WAIT).unwrap();
    for seq in 1..=tent::notify::INBOX_MAX as u64 {
        let f = NotifyFrame {
            sender: 5,
            from: "filler".into(),
            seq,
            name: String::new(),
            msg: Vec::new(),
            resend_ms: 0,
            to: 0,
        };
        client::notify(&s, &peer, &f, soon()).unwrap();
    }
    let batch = a.allocate_batch(1).unwrap();
    let req = write_4k(&src, seg, dst.addr());
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
