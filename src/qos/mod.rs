//! Quality of service (seed 001): priority lanes with anti-starvation
//! promotion, the `can_send` gate, and the cross-process time-slot clock
//! that plugs into it.
//!
//! | module | what |
//! |---|---|
//! | `lanes` | [`PriorityLanes`]: a worker's three lanes, promotion |
//! | `gate` | [`SendGate`]: may priority `p` post now? [`OpenGate`] |
//! | `stats` | [`PriorityStats`]: per worker, per priority: queue depth, accepted, promotions, slot-gate holds, queue-wait histogram; [`QosSnapshot`] |
//! | `slots` | [`SlotClock`] (a [`SendGate`]) over the shared slot memory, [`SlotRotator`]: the lease-holding rotator thread |
//! | `slot_file` | `SlotFile`: the slot file's locks (creator, members, seats), the sealed memory and its hand-over between participants |
//! | `fair` | [`FairShares`]: a daemon's clients' shares of work within a priority, by weight |

pub(crate) mod fair;
mod gate;
mod lanes;
mod slot_file;
pub(crate) mod slots;
pub(crate) mod stats;

pub(crate) use fair::{ClientShare, FairShares};
pub use gate::{OpenGate, SendGate};
pub(crate) use lanes::{LaneEntry, PriorityLanes};
pub use slots::{Lease, SlotClock, SlotRotator};
pub(crate) use stats::{LevelSnapshot, PriorityStats, QosSnapshot, SlotSnapshot};
