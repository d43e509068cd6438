//! A region its owner registers after a peer opened its segment is reached
//! by that peer: the first request naming it fails `AddressNotRegistered`
//! (the segment does not list it), the engine asks the owner for its
//! regions again, and the next request lands; nothing in flight fails.

mod common;

use std::time::{Duration, Instant};

use common::{pattern, reap, test_config};
use tent::{Engine, ErrorKind, LocalAddr, RemoteAddr, op};

#[test]
fn a_region_registered_after_the_open_is_reached_after_one_refusal() {
    let mut c = test_config();
    c.transports.shm.enable = false;
    let target = Engine::new(c.clone()).unwrap();
    let first = target.allocate_memory(4096).unwrap();
    let init = Engine::new(c).unwrap();
    let seg = init.open_segment(&target.segment_name()).unwrap();
    assert_eq!(init.segment_regions(seg).unwrap().len(), 1);

    let later = target.allocate_memory(64 << 10).unwrap();
    let src = init.allocate_memory(64 << 10).unwrap();
    let data = pattern(9, 64 << 10);
    src.write(0, &data).unwrap();
    let mut ring = init.ring().unwrap();
    let mut refusals = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        ring.submission()
            .push(
                op::Write::new(
                    LocalAddr::new(src.id(), 0),
                    RemoteAddr::new(seg, later.addr()),
                    64 << 10,
                )
                .user_data(1),
            )
            .unwrap();
        match reap(&mut ring, 1)[0].result() {
            Ok(n) => {
                assert_eq!(n, 64 << 10);
                break;
            }
            Err(ErrorKind::AddressNotRegistered) => refusals += 1,
            Err(other) => panic!("{other:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "the new region was never reached"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        refusals >= 1,
        "the segment listed a region registered after the open"
    );
    let mut landed = vec![0u8; 64 << 10];
    later.read(0, &mut landed).unwrap();
    assert_eq!(landed, data);
    assert_eq!(init.segment_regions(seg).unwrap().len(), 2);
    // The first region, listed from the start, still works on the same id.
    ring.submission()
        .push(
            op::Read::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(seg, first.addr()),
                4096,
            )
            .user_data(2),
        )
        .unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(4096));
}
