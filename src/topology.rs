//! Topology (being written).
