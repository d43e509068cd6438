//! `log_level` for the libraries built on tent (the C library, the Python
//! module), whose callers have no Rust code to install a `tracing`
//! subscriber with: one writing to stderr, installed once per process by
//! its first engine, unless the process has a subscriber already.
//!
//! A Rust application installs its own subscriber and does not use this;
//! the engine itself never installs one.

use std::io::IsTerminal;
use std::sync::OnceLock;

use tracing_subscriber::EnvFilter;

use crate::config::LogLevel;

/// The variable whose `tracing` filter directives win over `log_level`
/// (as for `tent-bench`), e.g. `TENT_LOG=tent=trace`.
pub const FILTER_VAR: &str = "TENT_LOG";

/// Who decides what this process logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    /// This module's subscriber, at the `log_level` of the process's first
    /// engine.
    Level(LogLevel),
    /// This module's subscriber, filtered by [`FILTER_VAR`].
    Filter,
    /// A subscriber the process installed before its first engine: its
    /// own choice stands.
    Theirs,
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();

/// Log at `level` to stderr from now on, if this is the process's first
/// engine and the process has no subscriber of its own ([`FILTER_VAR`]
/// overrides `level`). Later engines cannot change what the process logs:
/// one asking for another level is told so in a warning. Returns who
/// decides.
pub fn install(level: LogLevel) -> Installed {
    let installed = *INSTALLED.get_or_init(|| {
        let (filter, installed) = match std::env::var(FILTER_VAR)
            .ok()
            .and_then(|d| EnvFilter::try_new(d).ok())
        {
            Some(f) => (f, Installed::Filter),
            None => (EnvFilter::new(level.as_str()), Installed::Level(level)),
        };
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .finish();
        match tracing::subscriber::set_global_default(subscriber) {
            Ok(()) => installed,
            Err(_) => Installed::Theirs,
        }
    });
    if let Installed::Level(first) = installed
        && first != level
    {
        tracing::warn!(
            log_level = level.as_str(),
            logging_at = first.as_str(),
            "log_level applies per process, set by its first engine: this engine logs at that level"
        );
    }
    installed
}
