//! The multi-rail layer every network transport uses.
//!
//! A rail is a (local device, remote device) pair: two RDMA NICs, or two
//! network interfaces for TCP. What is the same for every transport lives
//! here: a peer's rails ([`RailSet`]) with their health ([`RailMonitor`]),
//! which rail a slice takes ([`DeviceSelector`], seed 003's slice
//! spraying), each worker's load and bandwidth estimate of each rail
//! ([`WorkerRails`]), one classification of rail faults
//! ([`is_rail_fault`]) and one move budget ([`MAX_RAIL_MOVES`]), and what
//! observability reports of a rail ([`RailStat`]). A transport keeps only
//! how a slice is posted and reaped.

mod device;
mod links;
mod monitor;
mod selector;
mod set;
mod stats;

pub use device::{DeviceInfo, Sysfs, valid_name};
pub(crate) use links::LinkListener;
pub use links::RailLinks;
pub use monitor::{
    LiveRailPolicy, MAX_COOLDOWN_NS, PROBE_EVERY_NS, RailMonitor, RailPolicy, ReviewClock,
    SLOW_FOR_NS, SLOW_RATIO, review_bandwidth,
};
pub use monitor::{RailStat, RailState};
pub use selector::{
    DeviceSelector, LiveSelector, MAX_MEM_NODES, MAX_RAILS, NoRail, PROBE_EVERY, RailLoad,
    RailSpec, SelectPolicy, SelectorConfig, Spray, Tiers, allocate, score,
};
pub use set::Placement;
pub(crate) use set::{Ask, MAX_RAIL_MOVES, RailDesc, RailSet, WorkerRails, is_rail_fault};
pub use stats::TrafficStats;
