//! Configuration that cannot fit: values each in range
//! but together needing more memory than the machine has are refused with
//! a typed `InvalidArgument` that says how many bytes, how many are
//! available and which keys drive it, instead of an abort or the OOM killer.
//!
//! The huge configuration is tried in a child process (this binary re-run
//! with `TENT_TEST_FIT_CHILD`) under a 6 GiB address-space limit, so an
//! engine that does try to allocate it dies alone instead of pushing the
//! whole machine into the OOM killer.

use std::process::Command;

use tent::{Config, Engine, ErrorKind};

const LIMIT_AS: u64 = 6 << 30;

fn huge() -> Config {
    let mut c = Config::default();
    c.workers.count = 256;
    c.workers.pin = false;
    c.max_tasks_per_worker = 1 << 20;
    c.ring_depth = 1 << 20;
    c.max_inflight_slices = 1 << 20;
    c.max_batches = 1 << 20;
    c.max_batch_size = 1 << 20;
    c
}

#[test]
fn cannot_fit_child() {
    if std::env::var_os("TENT_TEST_FIT_CHILD").is_none() {
        return;
    }
    match Engine::new(huge()) {
        Ok(_) => println!("RESULT built"),
        Err(e) => println!("RESULT kind={} msg={e}", e.kind()),
    }
}

#[test]
fn config_needing_more_memory_than_the_machine_has_is_refused_typed() {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "cannot_fit_child", "--nocapture"])
        .env("TENT_TEST_FIT_CHILD", "1");
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            let lim = libc::rlimit {
                rlim_cur: LIMIT_AS,
                rlim_max: LIMIT_AS,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let all = format!(
        "status {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the engine died: {all}");
    let result = stdout
        .lines()
        .find_map(|l| l.find("RESULT ").map(|i| &l[i + 7..]))
        .unwrap_or_else(|| panic!("no result: {all}"));
    assert!(
        result.starts_with("kind=InvalidArgument "),
        "want a typed InvalidArgument: {all}"
    );
    // The figure: bytes needed and available, and the keys behind it.
    assert!(result.contains("bytes"), "{result}");
    let figures: Vec<u64> = result
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .filter(|&n| n >= 1 << 30)
        .collect();
    assert!(
        !figures.is_empty(),
        "no byte figure of a GiB or more: {result}"
    );
    for key in ["workers/count", "max_tasks_per_worker", "ring_depth"] {
        assert!(result.contains(key), "{key} not named: {result}");
    }
}

#[test]
fn default_config_still_builds() {
    let mut c = Config::default();
    c.workers.pin = false;
    Engine::new(c).expect("the default configuration fits");
    // The largest per-worker values on one worker fit a machine with a few
    // GiB free (about 400 MiB).
    let mut big = huge();
    big.workers.count = 1;
    let e = Engine::new(big);
    if let Err(e) = &e {
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        eprintln!("skipped: one worker at the maxima does not fit here: {e}");
    }
}
