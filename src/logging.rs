//! Who changes what this process logs when an engine is reloaded with
//! another `log_level`.
//!
//! The engine never installs a `tracing` subscriber, so it cannot change
//! one by itself: whoever installed the process's subscriber with a way to
//! change its level registers that way here, once per process. tent does
//! where it installs the subscriber: `tent-bench`, and the C and Python
//! libraries (`stderr_log`); a Rust application may register its own
//! (say a `tracing_subscriber::reload` handle's). Where nothing is
//! registered, [`crate::Engine::reload`] refuses a changed `log_level`,
//! naming the key, rather than pretend: the application's subscriber
//! decides what it logs. `log_level` is one per process: a reload of any
//! engine sets it for all of them.

use std::sync::OnceLock;

use crate::config::LogLevel;

/// Sets the process's log level; an error says why it cannot (a filter
/// that decides instead, a subscriber gone).
type Setter = Box<dyn Fn(LogLevel) -> Result<(), String> + Send + Sync>;

static SETTER: OnceLock<Setter> = OnceLock::new();

/// Register `set` as what applies a reloaded `log_level` in this process
/// (the one who installed the process's `tracing` subscriber calls this,
/// once). Returns `false`, registering nothing, when a setter is already
/// registered.
pub fn control_level(set: impl Fn(LogLevel) -> Result<(), String> + Send + Sync + 'static) -> bool {
    SETTER.set(Box::new(set)).is_ok()
}

/// Set the process's level to `level` through the registered setter.
pub(crate) fn set_level(level: LogLevel) -> Result<(), String> {
    apply(SETTER.get(), level)
}

/// `level` through `setter`; without one, why nothing can apply it.
fn apply(setter: Option<&Setter>, level: LogLevel) -> Result<(), String> {
    match setter {
        Some(set) => set(level),
        None => Err(
            "tent did not install this process's tracing subscriber, and nothing registered a \
             way to change its level (tent::logging::control_level): the application's \
             subscriber decides what it logs"
                .to_owned(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU8, Ordering};

    #[test]
    fn a_level_goes_through_the_setter_and_without_one_is_refused_with_why() {
        let e = apply(None, LogLevel::Debug).unwrap_err();
        assert!(e.contains("did not install"), "{e}");
        let seen = Arc::new(AtomicU8::new(0));
        let s: Setter = Box::new({
            let seen = seen.clone();
            move |l| {
                seen.store(l as u8 + 1, Ordering::Relaxed);
                if l == LogLevel::Trace {
                    Err("TENT_LOG decides".to_owned())
                } else {
                    Ok(())
                }
            }
        });
        assert_eq!(apply(Some(&s), LogLevel::Debug), Ok(()));
        assert_eq!(seen.load(Ordering::Relaxed), LogLevel::Debug as u8 + 1);
        assert_eq!(
            apply(Some(&s), LogLevel::Trace),
            Err("TENT_LOG decides".to_owned())
        );
    }
}
