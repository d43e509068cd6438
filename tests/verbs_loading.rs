//! rdma-core is loaded at run time, never linked: binaries start where it
//! is missing, and a machine without RDMA devices gets one clear message.

use std::process::Command;

/// `readelf -d` of this test binary (which contains the whole library)
/// names no libibverbs.
#[test]
fn no_link_time_dependency_on_libibverbs() {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("readelf").arg("-d").arg(&exe).output();
    let Ok(out) = out else {
        // binutils is part of every Rust toolchain setup here; be explicit.
        panic!("readelf not found (apt-get install binutils)");
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("NEEDED"),
        "readelf printed no dynamic section: {text}"
    );
    assert!(
        !text.contains("libibverbs"),
        "linked against libibverbs:\n{text}"
    );
}

/// Without devices (these machines have no RDMA kernel support) the answer
/// is the documented message; with devices, their names.
#[test]
fn devices_or_rdma_unavailable() {
    match tent::transport::rdma::sys::devices() {
        Ok(devs) => assert!(devs.iter().all(|d| !d.is_empty())),
        Err(why) => {
            let s = why.to_string();
            assert!(
                s.starts_with("RDMA unavailable: ") && s.ends_with("; using TCP/SHM"),
                "{s}"
            );
        }
    }
}

/// Without rdma-core at all (simulated: the loader pointed at a library
/// that does not exist), the engine still starts and moves data, and the
/// reason names the library.
#[test]
fn without_rdma_core_the_engine_runs_on() {
    if std::env::var_os("TENT_VERBS_CHILD").is_some() {
        let why = tent::transport::rdma::sys::devices()
            .unwrap_err()
            .to_string();
        assert!(
            why.contains("cannot load /nonexistent/libibverbs.so.1"),
            "{why}"
        );
        assert!(why.ends_with("; using TCP/SHM"), "{why}");
        let mut c = tent::Config::default();
        c.workers.count = 1;
        c.workers.pin = false;
        let e = tent::Engine::new(c).unwrap();
        let m = e.allocate_memory(4096).unwrap();
        let mut ring = e.ring().unwrap();
        ring.submission()
            .push(tent::op::Write::new(
                tent::LocalAddr::new(m.id(), 0),
                tent::RemoteAddr::new(tent::SegmentId::LOCAL, m.addr() + 2048),
                64,
            ))
            .unwrap();
        let c = ring.wait_one(std::time::Duration::from_secs(10)).unwrap();
        assert_eq!(c.result(), Ok(64));
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "without_rdma_core_the_engine_runs_on",
            "--nocapture",
        ])
        .env("TENT_VERBS_CHILD", "1")
        .env("TENT_LIBIBVERBS", "/nonexistent/libibverbs.so.1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
