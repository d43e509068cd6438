//! What the tools' end-to-end tests share.

use std::process::Output;

/// A finished run's status and both streams, for an assertion message.
pub fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
