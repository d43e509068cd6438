//! `log_level` is the process's, and every reload of any engine applies
//! the level it names: an engine whose own configuration never changed
//! level still sets it back after another engine's reload moved it.

mod common;

use std::sync::Mutex;

use common::test_config;
use tent::Engine;
use tent::config::LogLevel;

static SET: Mutex<Vec<LogLevel>> = Mutex::new(Vec::new());

#[test]
fn every_reload_applies_the_level_it_names_to_the_process() {
    assert!(tent::logging::control_level(|l| {
        SET.lock().unwrap().push(l);
        Ok(())
    }));
    let (a, b) = (
        Engine::new(test_config()).unwrap(),
        Engine::new(test_config()).unwrap(),
    );
    let mut debug = test_config();
    debug.log_level = LogLevel::Debug;
    a.reload(debug).unwrap();
    assert_eq!(SET.lock().unwrap().last(), Some(&LogLevel::Debug));
    // b's configuration still says info, which the process is no longer
    // at: its reload (of another key) names info, and info it is.
    let mut info = test_config();
    info.max_failover_attempts += 1;
    assert_eq!(info.log_level, LogLevel::Info);
    b.reload(info).unwrap();
    assert_eq!(SET.lock().unwrap().last(), Some(&LogLevel::Info));
}
