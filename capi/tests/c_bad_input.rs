//! Bad input at the boundary, from C: `tests/c/bad_input.c`, linked
//! against `libtent_c.a` (so the static library is exercised too), makes
//! every kind of bad call and checks each code and message, then that the
//! engine still works. It exits 0 only when every check passed.

mod support;

use std::process::Command;

use support::{Link, compile};

#[test]
fn c_bad_input_gets_typed_codes_and_messages() {
    let exe = compile("bad_input", Link::Static);
    let out = Command::new(&exe).output().expect("run bad_input");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bad_input failed ({}):\n{stdout}{stderr}",
        out.status
    );
    let last = stdout.lines().last().unwrap_or_default();
    let passed: usize = last
        .strip_suffix(" passed, 0 failed")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("bad_input said {last:?}:\n{stderr}"));
    // Guard against the program silently checking less than it did.
    assert!(passed >= 230, "only {passed} checks ran");
}
