//! Quality of service: priority lanes with anti-starvation promotion, and
//! the `can_send` gate where the cross-process time-slot clock plugs in.

mod gate;
mod lanes;

pub use gate::{OpenGate, SendGate};
pub use lanes::{LaneEntry, PriorityLanes};
