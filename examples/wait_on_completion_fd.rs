//! Wait for a ring's completions from an async runtime, without spinning
//! and without a thread parked per ring: the ring's completion eventfd in
//! tokio's `AsyncFd` (README.md, "Waiting without spinning").
//!
//!     cargo run --example wait_on_completion_fd

use std::time::Duration;

use tent::{Engine, LocalAddr, RemoteAddr, SegmentId, op};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Engine::new(tent::Config::default())?;
    let src = engine.allocate_memory(1 << 20)?;
    let dst = engine.allocate_memory(1 << 20)?;
    let mut ring = engine.ring()?;
    // A descriptor of its own for the reactor (a dup of the ring's eventfd).
    let efd = ring.completion_fd()?.try_clone_to_owned()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    rt.block_on(async {
        // SAFETY: the AsyncFd owns `efd`, which stays open while it lives.
        let fd = unsafe { AsyncFd::register_with_interest(efd, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        ring.submission()
            .push(
                op::Write::new(
                    LocalAddr::new(src.id(), 0),
                    RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
                    1 << 20,
                )
                .user_data(7),
            )
            .expect("ring has room");
        ring.submit()?;
        let cqe = loop {
            if let Some(cqe) = ring.completion().next() {
                break cqe;
            }
            // About to sleep: the worker writes the fd for the next CQE.
            if ring.prepare_wait() {
                let mut ready =
                    tokio::time::timeout(Duration::from_secs(5), fd.readable()).await??;
                ready.clear_ready();
            }
            ring.finish_wait();
        };
        println!("user_data {} -> {:?}", cqe.user_data(), cqe.result());
        Ok::<_, Box<dyn std::error::Error>>(())
    })
}
