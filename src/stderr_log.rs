//! `log_level` for the libraries built on tent (the C library, the Python
//! module), whose callers have no Rust code to install a `tracing`
//! subscriber with: one writing to stderr, installed once per process by
//! its first engine, unless the process has a subscriber already.
//!
//! A Rust application installs its own subscriber and does not use this;
//! the engine itself never installs one.
//!
//! The subscriber's filter sits behind a `tracing_subscriber::reload`
//! layer, registered with [`crate::logging::control_level`]: a reload of
//! any engine with another `log_level` sets the process's level. Under a
//! [`FILTER_VAR`] filter the level is refused (the filter decides); where
//! the process had a subscriber of its own, nothing is registered and the
//! reload is refused too.

use std::io::IsTerminal;
use std::sync::OnceLock;

use parking_lot::Mutex;

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

/// The level this module's subscriber logs at now: the first engine's,
/// or the last reload's.
static LEVEL: Mutex<Option<LogLevel>> = Mutex::new(None);

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
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .with_filter_reloading();
        let handle = builder.reload_handle();
        match tracing::subscriber::set_global_default(builder.finish()) {
            Ok(()) => {
                *LEVEL.lock() = Some(level);
                crate::logging::control_level(move |l: LogLevel| {
                    if installed == Installed::Filter {
                        return Err(format!(
                            "the {FILTER_VAR} filter decides what this process logs"
                        ));
                    }
                    handle
                        .reload(EnvFilter::new(l.as_str()))
                        .map_err(|e| e.to_string())?;
                    *LEVEL.lock() = Some(l);
                    Ok(())
                });
                installed
            }
            Err(_) => Installed::Theirs,
        }
    });
    let now = *LEVEL.lock();
    if let (Installed::Level(_), Some(now)) = (installed, now)
        && now != level
    {
        tracing::warn!(
            log_level = level.as_str(),
            logging_at = now.as_str(),
            "log_level applies per process, set by its first engine (or a reload): this engine logs at that level"
        );
    }
    installed
}
