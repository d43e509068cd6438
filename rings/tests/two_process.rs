//! Rings and regions shared between two real processes over `/dev/shm`.
//!
//! Each parent test re-runs this test binary as a child
//! (`--exact two_process_child_...`), passing the region name in an
//! environment variable. The child tests return at once when that variable is
//! absent, so they are harmless in a normal run.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tent_rings::entry::{
    LocalAddr, Opcode, Priority, RegionId, RemoteAddr, SegmentId, Sqe, TransportKind,
};
use tent_rings::op;
use tent_rings::region::{HEADER_LEN, Region, RegionError, RegionType, shm_path};
use tent_rings::spsc::{self, ring_bytes, ring_layout};

/// Name of the shared region the child should attach to.
const ENV_SHM: &str = "TENT_RINGS_TWO_PROCESS_SHM";
/// For the attach-error child: region type tag to ask for.
const ENV_TYPE: &str = "TENT_RINGS_TWO_PROCESS_TYPE";
/// For the attach-error child: expected layout, `a,b,c,d` or `none`.
const ENV_LAYOUT: &str = "TENT_RINGS_TWO_PROCESS_LAYOUT";

const DEADLINE: Duration = Duration::from_secs(120);

const U64_COUNT: u64 = 1_000_000;
const U64_CAPACITY: u32 = 4096;
const SQE_COUNT: u64 = 200_000;
const SQE_CAPACITY: u32 = 256;

fn unique_name(tag: &str) -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("tent-rings-2p-{tag}-{}-{n}", std::process::id())
}

/// A child process that is killed if the parent test panics first.
struct ChildGuard(Child);

impl ChildGuard {
    fn spawn(test: &str, envs: &[(&str, &str)]) -> ChildGuard {
        let exe = std::env::current_exe().expect("current_exe");
        let child = Command::new(exe)
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .envs(envs.iter().copied())
            // libtest's chatter is noise here; panics on stderr still show.
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn child test process");
        ChildGuard(child)
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.0.try_wait().expect("try_wait")
    }

    fn wait(mut self) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.exited() {
                return status;
            }
            assert!(start.elapsed() < DEADLINE, "child did not exit in time");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The i-th submission of the SQE test: every field depends on `i`.
fn sqe_for(i: u64) -> Sqe {
    let local = LocalAddr::new(RegionId(i % 7), i * 64);
    let remote = RemoteAddr::new(SegmentId(i % 11), i * 128);
    let priority = Priority::ALL[(i % 3) as usize];
    let transport = TransportKind::from_u8((i % 5) as u8).unwrap();
    if i % 2 == 0 {
        op::Write::new(local, remote, i % 4096)
            .priority(priority)
            .user_data(i)
            .deadline_ns(i * 1_000)
            .transport_hint(transport)
            .no_failover(i % 3 == 0)
            .build()
    } else {
        op::Read::new(local, remote, i % 4096)
            .priority(priority)
            .user_data(i)
            .deadline_ns(i * 1_000)
            .transport_hint(transport)
            .no_failover(i % 3 == 0)
            .build()
    }
}

#[test]
fn two_process_parent_consumes_u64() {
    let name = unique_name("u64");
    let region = Region::create_shm(
        &name,
        RegionType::Ring,
        ring_layout::<u64>(U64_CAPACITY),
        ring_bytes::<u64>(U64_CAPACITY),
    )
    .unwrap();
    let (producer, mut consumer) = spsc::init_in_region::<u64>(Arc::new(region)).unwrap();
    // The child process is the producer.
    drop(producer);
    let mut child = ChildGuard::spawn("two_process_child_u64_producer", &[(ENV_SHM, &name)]);

    let start = Instant::now();
    let mut expect = 0u64;
    let mut buf = [0u64; 256];
    while expect < U64_COUNT {
        let n = consumer.pop_into(&mut buf);
        for &v in &buf[..n] {
            assert_eq!(v, expect);
            expect += 1;
        }
        consumer.sync();
        if n == 0 {
            if let Some(status) = child.exited() {
                // Everything it published must already be visible.
                assert!(
                    !consumer.is_empty(),
                    "child exited ({status}) after {expect} of {U64_COUNT} entries"
                );
            }
            assert!(start.elapsed() < DEADLINE, "stalled at {expect}");
            std::thread::yield_now();
        }
    }
    let status = child.wait();
    assert!(status.success(), "child failed: {status}");
    assert!(consumer.is_producer_closed());
    assert!(consumer.is_empty());
}

/// Child of `two_process_parent_consumes_u64`.
#[test]
fn two_process_child_u64_producer() {
    let Ok(name) = std::env::var(ENV_SHM) else {
        return;
    };
    let region = Region::attach_shm(
        &name,
        RegionType::Ring,
        Some(ring_layout::<u64>(U64_CAPACITY)),
    )
    .unwrap();
    assert_eq!(region.owner_pid(), std::os::unix::process::parent_id());
    let mut producer = spsc::producer_in_region::<u64>(Arc::new(region)).unwrap();

    let start = Instant::now();
    let mut next = 0u64;
    let mut batch = [0u64; 64];
    while next < U64_COUNT {
        let want = (U64_COUNT - next).min(batch.len() as u64) as usize;
        for (i, slot) in batch[..want].iter_mut().enumerate() {
            *slot = next + i as u64;
        }
        let n = producer.push_slice(&batch[..want]);
        next += n as u64;
        producer.sync();
        if n == 0 {
            assert!(start.elapsed() < DEADLINE, "parent stopped consuming");
            std::thread::yield_now();
        }
    }
    // Dropping the producer sets the closed flag the parent checks.
}

#[test]
fn two_process_parent_produces_sqe() {
    let name = unique_name("sqe");
    let region = Region::create_shm(
        &name,
        RegionType::Ring,
        ring_layout::<Sqe>(SQE_CAPACITY),
        ring_bytes::<Sqe>(SQE_CAPACITY),
    )
    .unwrap();
    let (mut producer, consumer) = spsc::init_in_region::<Sqe>(Arc::new(region)).unwrap();
    // The child process is the consumer.
    drop(consumer);
    let mut child = ChildGuard::spawn("two_process_child_sqe_consumer", &[(ENV_SHM, &name)]);

    let start = Instant::now();
    let mut next = 0u64;
    while next < SQE_COUNT {
        let batch: Vec<Sqe> = (next..SQE_COUNT.min(next + 32)).map(sqe_for).collect();
        let n = producer.push_slice(&batch);
        next += n as u64;
        producer.sync();
        if n == 0 {
            if let Some(status) = child.exited() {
                panic!("child exited ({status}) after {next} of {SQE_COUNT} entries");
            }
            assert!(start.elapsed() < DEADLINE, "stalled at {next}");
            std::thread::yield_now();
        }
    }
    // Tells the child it has seen everything.
    drop(producer);
    let status = child.wait();
    assert!(status.success(), "child failed: {status}");
}

/// Child of `two_process_parent_produces_sqe`.
#[test]
fn two_process_child_sqe_consumer() {
    let Ok(name) = std::env::var(ENV_SHM) else {
        return;
    };
    let region = Region::attach_shm(
        &name,
        RegionType::Ring,
        Some(ring_layout::<Sqe>(SQE_CAPACITY)),
    )
    .unwrap();
    let mut consumer = spsc::consumer_in_region::<Sqe>(Arc::new(region)).unwrap();

    let start = Instant::now();
    let mut expect = 0u64;
    let mut buf = [Sqe::zeroed(); 48];
    while expect < SQE_COUNT {
        let n = consumer.pop_into(&mut buf);
        for sqe in &buf[..n] {
            let want = sqe_for(expect);
            assert_eq!(*sqe, want, "entry {expect}");
            let opcode = if expect % 2 == 0 {
                Opcode::Write
            } else {
                Opcode::Read
            };
            assert_eq!(sqe.opcode(), Some(opcode));
            assert_eq!(sqe.user_data(), expect);
            assert_eq!(sqe.local().offset, expect * 64);
            assert_eq!(sqe.remote().segment, SegmentId(expect % 11));
            assert_eq!(sqe.len(), expect % 4096);
            assert_eq!(sqe.priority(), Some(Priority::ALL[(expect % 3) as usize]));
            assert_eq!(sqe.deadline_ns(), expect * 1_000);
            assert_eq!(sqe.no_failover(), expect % 3 == 0);
            expect += 1;
        }
        consumer.sync();
        if n == 0 {
            assert!(start.elapsed() < DEADLINE, "parent stopped producing");
            std::thread::yield_now();
        }
    }
    while !consumer.is_producer_closed() {
        assert!(start.elapsed() < DEADLINE, "parent never closed the ring");
        std::thread::yield_now();
    }
    assert!(consumer.is_empty(), "more entries than were sent");
}

/// Exit codes of `two_process_child_attach`, one per outcome.
mod exit {
    pub(crate) const OK: i32 = 10;
    pub(crate) const IO: i32 = 11;
    pub(crate) const BAD_MAGIC: i32 = 12;
    pub(crate) const VERSION: i32 = 13;
    pub(crate) const WRONG_TYPE: i32 = 14;
    pub(crate) const LAYOUT: i32 = 15;
    pub(crate) const TOO_SMALL: i32 = 16;
    pub(crate) const NOT_READY: i32 = 17;
}

/// Run the attach child against `name` and return its exit code.
fn attach_in_child(name: &str, ty: RegionType, layout: Option<[u64; 4]>) -> i32 {
    let ty = (ty as u32).to_string();
    let layout = match layout {
        Some(words) => words.map(|w| w.to_string()).join(","),
        None => "none".to_string(),
    };
    let child = ChildGuard::spawn(
        "two_process_child_attach",
        &[(ENV_SHM, name), (ENV_TYPE, &ty), (ENV_LAYOUT, &layout)],
    );
    let status = child.wait();
    status
        .code()
        .unwrap_or_else(|| panic!("child killed: {status}"))
}

/// Overwrite header bytes of the region file behind `region`.
fn corrupt(region: &Region, offset: u64, bytes: &[u8]) {
    let file = OpenOptions::new()
        .write(true)
        .open(region.path().unwrap())
        .unwrap();
    file.write_all_at(bytes, offset).unwrap();
}

#[test]
fn two_process_attach_errors() {
    const CAP: u32 = 16;
    let layout = ring_layout::<u64>(CAP);
    let create = |tag: &str| {
        let name = unique_name(tag);
        let region =
            Region::create_shm(&name, RegionType::Ring, layout, ring_bytes::<u64>(CAP)).unwrap();
        (name, region)
    };

    let (name, _region) = create("ok");
    assert_eq!(
        attach_in_child(&name, RegionType::Ring, Some(layout)),
        exit::OK
    );

    let (name, _region) = create("type");
    assert_eq!(
        attach_in_child(&name, RegionType::Segment, None),
        exit::WRONG_TYPE
    );

    let (name, _region) = create("layout");
    let mut other = layout;
    other[0] = u64::from(CAP) * 2;
    assert_eq!(
        attach_in_child(&name, RegionType::Ring, Some(other)),
        exit::LAYOUT
    );

    let (name, region) = create("magic");
    corrupt(&region, 0, b"GARBAGE!");
    assert_eq!(
        attach_in_child(&name, RegionType::Ring, None),
        exit::BAD_MAGIC
    );

    let (name, region) = create("version");
    corrupt(&region, 8, &99u32.to_le_bytes());
    assert_eq!(
        attach_in_child(&name, RegionType::Ring, None),
        exit::VERSION
    );

    let (name, region) = create("notready");
    corrupt(&region, 0, &0u64.to_le_bytes());
    assert_eq!(
        attach_in_child(&name, RegionType::Ring, None),
        exit::NOT_READY
    );

    let (name, region) = create("small");
    OpenOptions::new()
        .write(true)
        .open(region.path().unwrap())
        .unwrap()
        .set_len(HEADER_LEN as u64 + 8)
        .unwrap();
    assert_eq!(
        attach_in_child(&name, RegionType::Ring, None),
        exit::TOO_SMALL
    );

    let name = unique_name("missing");
    assert!(!shm_path(&name).exists());
    assert_eq!(attach_in_child(&name, RegionType::Ring, None), exit::IO);
}

/// Child of `two_process_attach_errors`: attach and report the outcome as the
/// exit code.
#[test]
fn two_process_child_attach() {
    let Ok(name) = std::env::var(ENV_SHM) else {
        return;
    };
    let tag: u32 = std::env::var(ENV_TYPE).unwrap().parse().unwrap();
    let ty = RegionType::from_u32(tag).unwrap();
    let layout = match std::env::var(ENV_LAYOUT).unwrap().as_str() {
        "none" => None,
        words => {
            let words: Vec<u64> = words.split(',').map(|w| w.parse().unwrap()).collect();
            Some(<[u64; 4]>::try_from(words).unwrap())
        }
    };
    let code = match Region::attach_shm(&name, ty, layout) {
        Ok(_) => exit::OK,
        Err(RegionError::Io { .. }) => exit::IO,
        Err(RegionError::BadMagic { .. }) => exit::BAD_MAGIC,
        Err(RegionError::Version { found: 99, .. }) => exit::VERSION,
        Err(RegionError::WrongType {
            found, expected, ..
        }) => {
            assert_eq!((found, expected), (RegionType::Ring as u32, ty));
            exit::WRONG_TYPE
        }
        Err(RegionError::Layout { .. }) => exit::LAYOUT,
        Err(RegionError::TooSmall { .. }) => exit::TOO_SMALL,
        Err(RegionError::NotReady { .. }) => exit::NOT_READY,
        Err(other) => panic!("unexpected error: {other}"),
    };
    std::process::exit(code);
}
