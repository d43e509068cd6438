//! `Engine::reload`: the configuration keys an engine applies while it runs
//! ([`crate::config::RELOADABLE`]), each read where it is decided, so a
//! reload takes effect on the next such decision:
//! - in [`LiveSettings`], atomics the workers read: the failover budget
//!   when a task fails, the promotion timeout every turn that promotes;
//! - in each network transport's rails: the rail policy at each of a
//!   rail's failures (`LiveRailPolicy`), the selector at each pick, plan
//!   and estimate (`LiveSelector`: a worker sees a new one with one relaxed
//!   load, `arc_swap::Cache`), priority filtering and its hold with it;
//! - in the slot file: the rotation interval, for every participant (the
//!   group keeps one interval; `qos::slots` says why);
//! - through `crate::logging`: the process's log level, where tent (or
//!   the application) registered a way to change it; refused elsewhere.
//!
//! Every other key needs a restart: a reload that changes one is refused,
//! naming it, and applies nothing. All checks come first; the log level,
//! the one change that can fail, is applied before the others, so a
//! refused reload changes nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use arc_swap::ArcSwap;
use tent_rings::ErrorKind;

use super::Embedded;
use super::segments::NETWORK;
use crate::clock::nanos;
use crate::config::{Config, RELOADABLE, reloadable};
use crate::error::{Error, Result};
use crate::transport::rails::{DeviceSelector, RailPolicy, SelectorConfig};

/// The reloadable settings as the engine applies them now.
#[derive(Debug)]
pub(crate) struct LiveSettings {
    /// 1 at start, one more per reload applied.
    generation: AtomicU64,
    max_failover: AtomicU32,
    promotion_ns: AtomicU64,
    /// The configuration with the reloads applied.
    current: ArcSwap<Config>,
    /// One reload at a time (never held by a worker).
    reloading: parking_lot::Mutex<()>,
}

impl LiveSettings {
    pub(crate) fn new(config: &Config) -> LiveSettings {
        let live = LiveSettings {
            generation: AtomicU64::new(1),
            max_failover: AtomicU32::new(0),
            promotion_ns: AtomicU64::new(0),
            current: ArcSwap::from_pointee(config.clone()),
            reloading: parking_lot::Mutex::new(()),
        };
        live.store(config);
        live
    }

    fn store(&self, c: &Config) {
        self.max_failover.store(
            c.max_failover_attempts.min(u32::from(u8::MAX)),
            Ordering::Relaxed,
        );
        self.promotion_ns.store(
            nanos(c.transports.rdma.priority_promotion_timeout_us),
            Ordering::Relaxed,
        );
    }

    /// `max_failover_attempts` now.
    #[inline]
    pub(crate) fn max_failover(&self) -> u8 {
        self.max_failover.load(Ordering::Relaxed) as u8
    }

    /// `priority_promotion_timeout_us` now, in ns.
    #[inline]
    pub(crate) fn promotion_ns(&self) -> u64 {
        self.promotion_ns.load(Ordering::Relaxed)
    }

    /// Reloads applied, plus one.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The configuration with every reload applied.
    pub(crate) fn current(&self) -> Arc<Config> {
        self.current.load_full()
    }
}

impl Embedded {
    pub(crate) fn reload(&self, config: Config) -> Result<u64> {
        config.validate().map_err(|e| {
            Error::invalid("reload: the configuration does not validate").with_source(e)
        })?;
        let _one_at_a_time = self.shared.live.reloading.lock();
        let live = &self.shared.live;
        let now = live.current();
        let changed = now.changed_keys(&config);
        let restart: Vec<&str> = changed.iter().copied().filter(|k| !reloadable(k)).collect();
        if !restart.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "reload: {} cannot change while the engine runs (restart it with the new \
                     value); reload applies only {}; nothing was applied",
                    restart.join(", "),
                    RELOADABLE.join(", ")
                ),
            ));
        }
        if changed.contains(&"log_level") {
            crate::logging::set_level(config.log_level).map_err(|e| {
                Error::new(
                    ErrorKind::InvalidArgument,
                    format!("reload: log_level cannot change here: {e}; nothing was applied"),
                )
            })?;
        } else {
            // The level is the process's: another engine's reload may have
            // moved it since this one's config said otherwise. A reload
            // names the level it wants, so it is applied where it can be;
            // where nothing can apply it, nothing asked for a change.
            let _ = crate::logging::set_level(config.log_level);
        }
        if changed.is_empty() {
            return Ok(live.generation());
        }
        live.store(&config);
        let policy = RailPolicy::from_config(&config);
        // A new selector only when one of its keys changed: the worker
        // that last held the old one frees it.
        let knobs = SelectorConfig::from_config(&config);
        let selector = (knobs != SelectorConfig::from_config(&now))
            .then(|| std::sync::Arc::new(DeviceSelector::new(knobs)));
        for &k in NETWORK {
            if let Some(t) = self.shared.transports.slot(k).load_full() {
                if let Some(p) = t.transport.live_rail_policy() {
                    p.set(policy);
                }
                if let (Some(s), Some(new)) = (t.transport.live_selector(), &selector) {
                    s.store(new.clone());
                }
            }
        }
        if changed.contains(&"transports/rdma/slot_rotation_interval_ms")
            && let Some(slots) = &self.slots
        {
            slots
                .clock()
                .set_interval(config.transports.rdma.slot_rotation_interval_ms);
        }
        let mut next = (*now).clone();
        for key in &changed {
            next.copy_key(&config, key);
        }
        live.current.store(Arc::new(next));
        let generation = live.generation.fetch_add(1, Ordering::AcqRel) + 1;
        tracing::info!(generation, keys = ?changed, "configuration reloaded");
        Ok(generation)
    }

    pub(crate) fn live_config(&self) -> Arc<Config> {
        self.shared.live.current()
    }

    pub(crate) fn config_generation(&self) -> u64 {
        self.shared.live.generation()
    }
}
