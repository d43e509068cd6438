//! The QoS slot file against a same-uid process that tampers with it: a
//! truncated or overwritten `/dev/shm` file harms no engine using it, and
//! what such a process writes there (a forged live pid in every word) can
//! neither refuse a joiner's interval nor hold its seats.

mod common;

use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use common::reap;
use common::slots::{Unlink, engine_on_slots, slot_name};
use tent::clock::monotonic_ns;
use tent::qos::SendGate;
use tent::{Engine, LocalAddr, Priority, RemoteAddr, SegmentId, op};

/// Every slot comes round within `within` on `e`'s clock.
fn rotates(e: &Engine, within: Duration) {
    let clock = e.slot_clock().unwrap();
    let mut seen = [false; 3];
    let t0 = Instant::now();
    while seen != [true; 3] {
        assert!(t0.elapsed() < within, "the clock stopped: {seen:?}");
        seen[usize::from(clock.slot().min(2))] = true;
        std::thread::sleep(Duration::from_micros(300));
    }
}

/// A local WRITE of 4 KiB through `e`: the engine still serves.
fn writes(e: &Engine) {
    let src = e.allocate_memory(4096).unwrap();
    let dst = e.allocate_memory(4096).unwrap();
    let mut ring = e.ring_with_depth(4).unwrap();
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
                4096,
            )
            .priority(Priority::Low),
        )
        .unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(4096));
}

#[test]
fn a_truncated_or_overwritten_slot_file_harms_no_engine_using_it() {
    let name = slot_name("truncate");
    let _unlink = Unlink(name.clone());
    let path = format!("/dev/shm{name}");
    let a = engine_on_slots(&name, 2).unwrap();
    let b = engine_on_slots(&name, 2).unwrap();
    rotates(&a, Duration::from_secs(2));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .unwrap();
    // What a same-uid process can do to the file: cut it to nothing, grow
    // it back to a page of junk, cut it again mid-page.
    for (len, fill) in [(0u64, 0u8), (4096, 0xff), (100, 0x00)] {
        file.set_len(0).unwrap();
        std::fs::write(&path, vec![fill; len as usize]).unwrap();
        file.set_len(len).unwrap();
        // Both engines keep rotating and serving for a while (before: the
        // first access after the cut killed the process with SIGBUS).
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(700) {
            rotates(&a, Duration::from_secs(2));
            rotates(&b, Duration::from_secs(2));
        }
        writes(&a);
        writes(&b);
    }
    // And one memory still: a newcomer joins the same clock.
    let c = engine_on_slots(&name, 2).unwrap();
    let (ca, cc) = (a.slot_clock().unwrap(), c.slot_clock().unwrap());
    ca.demand(Priority::High, true);
    assert_eq!(
        cc.busy_seats(Priority::Low, monotonic_ns()),
        1,
        "the newcomer sees the HIGH demand raised through another engine's clock"
    );
    ca.demand(Priority::High, false);
}

#[test]
fn a_forged_live_pid_in_the_slot_file_neither_refuses_an_interval_nor_holds_a_seat() {
    let name = slot_name("forged");
    let _unlink = Unlink(name.clone());
    let path = format!("/dev/shm{name}");
    // An engine used the file at 2 ms, and is gone.
    drop(engine_on_slots(&name, 2).unwrap());
    // A same-uid process writes pid 1 (alive: init) into every word past
    // the first 128 bytes (where the payload and the seats of a file that
    // was mapped began): an owner, a pid, and every seat's holder.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.resize(128 + 64 * 65, 0);
    for w in bytes[128..].chunks_exact_mut(8) {
        w.copy_from_slice(&(1u64 << 32 | 1).to_le_bytes());
    }
    std::fs::write(&path, &bytes).unwrap();
    // Nobody is there: a joiner at another interval gets a fresh clock
    // (with seats judged by pid, the forged pid 1 held every seat: "all
    // 64 seats are held by live processes").
    let e = engine_on_slots(&name, 10).unwrap();
    let clock = e.slot_clock().unwrap();
    assert_eq!(clock.interval(), Duration::from_millis(10));
    let t0 = Instant::now();
    while !clock.is_owner() {
        assert!(t0.elapsed() < Duration::from_secs(2), "nobody rotates");
        std::thread::sleep(Duration::from_millis(1));
    }
    rotates(&e, Duration::from_secs(2));
    // Seats are not words anyone can write: many joiners are seated.
    let more: Vec<Engine> = (0..8)
        .map(|_| engine_on_slots(&name, 10).unwrap())
        .collect();
    writes(&more[7]);
}
