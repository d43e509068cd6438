//! The multi-rail layer every network transport uses.
//!
//! A rail is a (local device, remote device) pair: two RDMA NICs, or two
//! network interfaces for TCP. What is the same for every transport lives
//! here: a rail's health ([`RailMonitor`]), which rail a slice takes
//! ([`DeviceSelector`]), and what observability reports of a rail
//! ([`RailStat`]). A transport keeps only how a slice is posted and reaped.

mod monitor;
mod selector;

pub use monitor::{
    MAX_COOLDOWN_NS, PROBE_EVERY_NS, RailMonitor, RailPolicy, RailStat, RailState, ReviewClock,
    SLOW_FOR_NS, SLOW_RATIO, review_bandwidth,
};
pub use selector::{
    DeviceSelector, MAX_RAILS, PROBE_EVERY, RailLoad, RailSpec, SelectPolicy, SelectorConfig,
    Spray, allocate, score,
};
