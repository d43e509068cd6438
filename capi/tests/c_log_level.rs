//! `log_level` from C: `tests/c/log_level.c` starts engines from the
//! configurations it is given, in a process of its own (what a process
//! logs is decided once, by its first engine), and the test reads what the
//! library wrote to its stderr.

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use support::{Link, compile};

/// An engine's configuration at `level`.
fn config(level: &str) -> String {
    format!(
        r#"{{"log_level": "{level}", "workers": {{"count": 1, "pin": false, "park_timeout_ms": 20}}}}"#
    )
}

/// Run `log_level` with one engine per configuration (and `TENT_LOG` when
/// given); its stderr.
fn stderr_of(configs: &[String], tent_log: Option<&str>) -> String {
    // Compiled once: tests running at once would write one file together.
    // Static: under `cargo test`, LD_LIBRARY_PATH names target/debug,
    // whose copy of libtent_c.so may be stale, before the rpath's deps/.
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    let exe = EXE.get_or_init(|| compile("log_level", Link::Static));
    let mut cmd = Command::new(exe);
    cmd.args(configs)
        .env_remove("TENT_LOG")
        .env_remove("TENT_CONF")
        .env_remove("TENT_LOG_LEVEL");
    if let Some(f) = tent_log {
        cmd.env("TENT_LOG", f);
    }
    let out = cmd.output().expect("run log_level");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success() && stdout.trim() == "ok",
        "log_level failed ({}):\n{stdout}{stderr}",
        out.status
    );
    stderr
}

/// Lines at `level` (the fmt subscriber writes it upper case, padded).
fn lines_at<'a>(stderr: &'a str, level: &str) -> Vec<&'a str> {
    stderr
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some(level))
        .collect()
}

#[test]
fn c_engine_logs_at_its_log_level_to_stderr() {
    let debug = stderr_of(&[config("debug")], None);
    assert!(
        lines_at(&debug, "DEBUG")
            .iter()
            .any(|l| l.contains("worker started")),
        "log_level debug: no DEBUG line from the engine on stderr:\n{debug}"
    );
    let warn = stderr_of(&[config("warn")], None);
    assert!(
        lines_at(&warn, "DEBUG").is_empty() && lines_at(&warn, "INFO").is_empty(),
        "log_level warn: lines below WARN on stderr:\n{warn}"
    );
}

#[test]
fn c_log_level_is_the_first_engine_s_and_tent_log_overrides_it() {
    // A later engine asking for more is told, not obeyed.
    let two = stderr_of(&[config("warn"), config("debug")], None);
    assert!(lines_at(&two, "DEBUG").is_empty(), "{two}");
    assert!(
        lines_at(&two, "WARN")
            .iter()
            .any(|l| l.contains("log_level applies per process")),
        "the second engine's level was dropped without a word:\n{two}"
    );
    // TENT_LOG's filter wins over the configuration.
    let env = stderr_of(&[config("error")], Some("debug"));
    assert!(!lines_at(&env, "DEBUG").is_empty(), "{env}");
}

#[test]
fn c_reload_sets_the_process_log_level_unless_tent_log_decides() {
    let reload = format!("reload:{}", config("info"));
    let out = stderr_of(&[config("warn"), reload.clone()], None);
    assert!(out.contains("reloaded: generation 2"), "{out}");
    assert!(
        lines_at(&out, "INFO")
            .iter()
            .any(|l| l.contains("configuration reloaded")),
        "the reload's own INFO line is not on stderr: the level did not move:\n{out}"
    );
    // Under TENT_LOG the filter decides: the reload is refused, naming
    // the key and why, and nothing is applied.
    let env = stderr_of(&[config("warn"), reload], Some("warn"));
    assert!(
        env.contains("reload refused: ")
            && env.contains("log_level cannot change here")
            && env.contains("TENT_LOG"),
        "{env}"
    );
    // A key that needs a restart is refused by name.
    let restart = format!(
        "reload:{}",
        r#"{"log_level": "warn", "block_size": 4096, "workers": {"count": 1, "pin": false, "park_timeout_ms": 20}}"#
    );
    let refused = stderr_of(&[config("warn"), restart], None);
    assert!(
        refused.contains("reload refused: ") && refused.contains("block_size cannot change"),
        "{refused}"
    );
}
