//! Waiting without spinning: a ring's completion eventfd turns readable for
//! CQEs the worker posts while the application said it is about to sleep
//! (`prepare_wait`), and is never written otherwise; an attached engine's
//! rings have one too.

mod common;

use std::os::fd::{BorrowedFd, RawFd};
use std::time::{Duration, Instant};

use common::{reap, test_config};
use tent::{Engine, LocalAddr, RemoteAddr, SegmentId, op};

fn write(src: &tent::Buffer, dst: &tent::Buffer, len: u64, user: u64) -> tent::Sqe {
    op::Write::new(
        LocalAddr::new(src.id(), 0),
        RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
        len,
    )
    .user_data(user)
    .build()
}

/// Block in `epoll_wait` on `fd` for up to `timeout`: true when it turned
/// readable.
fn epoll_readable(fd: RawFd, timeout: Duration) -> bool {
    // SAFETY: plain syscalls on descriptors this test owns (`fd`: the ring
    // owning it outlives this call, which the caller joins first).
    unsafe {
        let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
        assert!(ep >= 0);
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 1,
        };
        assert_eq!(libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev), 0);
        let mut out = [libc::epoll_event { events: 0, u64: 0 }; 4];
        let n = libc::epoll_wait(ep, out.as_mut_ptr(), 4, timeout.as_millis() as i32);
        libc::close(ep);
        n > 0
    }
}

/// The eventfd's counter, drained (0: nothing was written).
fn counter(fd: RawFd) -> u64 {
    // SAFETY: as in `epoll_readable`.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let mut buf = [0u8; 8];
    match rustix::io::read(fd, &mut buf) {
        Ok(8) => u64::from_ne_bytes(buf),
        Ok(n) => panic!("short eventfd read: {n}"),
        Err(rustix::io::Errno::AGAIN) => 0,
        Err(e) => panic!("eventfd read: {e}"),
    }
}

#[test]
fn a_thread_blocked_in_epoll_wakes_for_a_completion_another_thread_submitted() {
    let e = Engine::new(test_config()).unwrap();
    let src = e.allocate_memory(1 << 20).unwrap();
    let dst = e.allocate_memory(1 << 20).unwrap();
    let mut ring = e.ring().unwrap();
    // The worker's completion (an op issued inline needs no waiting).
    ring.set_inline(false);
    let fd = {
        use std::os::fd::AsRawFd;
        ring.completion_fd().unwrap().as_raw_fd()
    };
    for round in 0..20u64 {
        assert!(ring.prepare_wait(), "nothing to reap yet");
        std::thread::scope(|s| {
            let waiter = s.spawn(move || {
                let t = Instant::now();
                (epoll_readable(fd, Duration::from_secs(10)), t.elapsed())
            });
            // Let it block first.
            std::thread::sleep(Duration::from_millis(5));
            ring.submission()
                .push(write(&src, &dst, 1 << 20, round))
                .unwrap();
            ring.submit().unwrap();
            let (readable, after) = waiter.join().unwrap();
            assert!(readable, "round {round}: epoll_wait ran out ({after:?})");
        });
        ring.finish_wait();
        let c = reap(&mut ring, 1);
        assert_eq!((c[0].user_data(), c[0].result()), (round, Ok(1 << 20)));
    }
}

#[test]
fn the_eventfd_is_not_written_while_the_application_is_not_waiting() {
    let e = Engine::new(test_config()).unwrap();
    let src = e.allocate_memory(4096).unwrap();
    let dst = e.allocate_memory(4096).unwrap();
    let mut ring = e.ring().unwrap();
    ring.set_inline(false);
    let fd = {
        use std::os::fd::AsRawFd;
        ring.completion_fd().unwrap().as_raw_fd()
    };
    // Reaped by looking, never by sleeping: the flag is never set.
    let mut done = 0;
    let start = Instant::now();
    for i in 0..2000u64 {
        ring.submission().push(write(&src, &dst, 64, i)).unwrap();
        ring.submit().unwrap();
        while ring.completion().next().is_none() {
            assert!(start.elapsed() < Duration::from_secs(20));
            std::thread::yield_now();
        }
        done += 1;
    }
    assert_eq!(done, 2000);
    assert_eq!(
        counter(fd),
        0,
        "the worker wrote the eventfd nobody waits on"
    );

    // A completion already there: do not sleep (and the flag is not left
    // set: still nothing written).
    ring.set_inline(true);
    ring.submission().push(write(&src, &dst, 64, 1)).unwrap();
    ring.submit().unwrap();
    assert!(!ring.prepare_wait(), "an inline completion is ready");
    assert_eq!(ring.completion().count(), 1);
    ring.set_inline(false);
    for i in 0..100u64 {
        ring.submission().push(write(&src, &dst, 64, i)).unwrap();
        ring.submit().unwrap();
        while ring.completion().next().is_none() {
            std::thread::yield_now();
        }
    }
    assert_eq!(counter(fd), 0);
}

#[test]
fn no_sleep_is_promised_without_a_fd_or_once_the_engine_stopped() {
    let e = Engine::new(test_config()).unwrap();
    let mut ring = e.ring().unwrap();
    assert!(
        !ring.prepare_wait(),
        "no completion fd: nothing would wake it"
    );
    ring.completion_fd().unwrap();
    assert!(ring.prepare_wait());
    ring.finish_wait();
    drop(e);
    assert!(
        !ring.prepare_wait(),
        "the engine stopped: nothing will write the fd"
    );
}

/// An attached ring's completion fd: the daemon's worker bumps the ring's
/// CQ bell in shared memory and a thread of this process writes the fd,
/// so epoll wakes for each completion; when the daemon goes, a waiter
/// wakes too (and the ring answers `Shutdown`).
#[test]
fn an_attached_ring_s_eventfd_wakes_epoll_and_the_daemon_s_going_wakes_it_too() {
    let sock = std::env::temp_dir().join(format!("tentd-efd-{}.sock", std::process::id()));
    let d = tent::daemon::Daemon::start(Engine::new(test_config()).unwrap(), &sock).unwrap();
    let target = Engine::new(test_config()).unwrap();
    let dst = target.allocate_memory(1 << 16).unwrap();
    let e = Engine::attach(&sock).unwrap();
    let src = e.allocate_memory(1 << 16).unwrap();
    let seg = e.open_segment(&target.segment_name()).unwrap();
    let mut ring = e.ring_with_depth(8).unwrap();
    let fd = {
        use std::os::fd::AsRawFd;
        ring.completion_fd().unwrap().as_raw_fd()
    };
    for round in 0..20u64 {
        assert!(ring.prepare_wait(), "nothing to reap yet");
        std::thread::scope(|s| {
            let waiter = s.spawn(move || epoll_readable(fd, Duration::from_secs(10)));
            std::thread::sleep(Duration::from_millis(5));
            let w = op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(seg, dst.addr()),
                1 << 16,
            )
            .user_data(round)
            .build();
            ring.submission().push(w).unwrap();
            ring.submit().unwrap();
            assert!(waiter.join().unwrap(), "round {round}: epoll_wait ran out");
        });
        ring.finish_wait();
        counter(fd);
        let c = reap(&mut ring, 1);
        assert_eq!((c[0].user_data(), c[0].result()), (round, Ok(1 << 16)));
    }
    assert!(ring.prepare_wait());
    std::thread::scope(|s| {
        let waiter = s.spawn(move || epoll_readable(fd, Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(5));
        drop(d);
        assert!(
            waiter.join().unwrap(),
            "the daemon's going wakes the waiter"
        );
    });
    ring.finish_wait();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !matches!(ring.submit(), Err(ref err) if err.kind() == tent::ErrorKind::Shutdown) {
        assert!(Instant::now() < deadline, "the ring answers Shutdown");
        std::thread::sleep(Duration::from_millis(10));
    }
}
