//! A C program attaches to a daemon (`tent_engine_attach`), allocates
//! memory there, WRITEs it through a ring to an engine in this process,
//! notifies it after a batch, and sees what an attached engine refuses
//! refused typed; the bytes and the notification are checked here.

mod support;

use std::process::Command;

use support::{Link, compile};
use tent::daemon::Daemon;
use tent::{Config, Engine};

fn config() -> Config {
    let mut c = Config::default();
    c.workers.count = 1;
    c.workers.pin = false;
    c.transports.rdma.enable = false;
    c.metrics.http_enable = false;
    c
}

#[test]
fn a_c_program_attached_to_a_daemon_moves_verified_data() {
    let exe = compile("attach", Link::Shared);
    let sock = std::env::temp_dir().join(format!("tentd-c-attach-{}.sock", std::process::id()));
    let daemon = Daemon::start(Engine::new(config()).unwrap(), &sock).unwrap();
    let target = Engine::new(config()).unwrap();
    let len = 256 * 1024;
    let dst = target.allocate_memory(len).unwrap();
    let out = Command::new(&exe)
        .arg(daemon.socket_path())
        .arg(target.segment_name())
        .arg(dst.addr().to_string())
        .output()
        .expect("run the C program");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("ok"),
        "{:?}: {text}",
        out.status
    );
    let mut got = vec![0u8; len as usize];
    dst.read(0, &mut got).unwrap();
    let want: Vec<u8> = (0..len as u32)
        .map(|i| ((i * 7 + 3) & 0xff) as u8)
        .collect();
    assert!(got == want, "the C program's WRITE landed");
    let note = target
        .wait_notification(std::time::Duration::from_secs(10))
        .unwrap();
    assert_eq!(
        (note.name.as_str(), note.msg.as_slice()),
        ("from-c", &b"done"[..])
    );
    assert!(
        note.from.starts_with(&daemon.engine().segment_name()) && note.from.contains('#'),
        "from the C engine's mailbox name: {}",
        note.from
    );
}
