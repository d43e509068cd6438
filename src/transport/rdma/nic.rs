//! The RDMA NICs an engine uses: each opened once, with its protection
//! domain, the port it talks through and that port's GID; and memory
//! registered on all of them at once (one rkey per NIC for the descriptor).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tent_rings::ErrorKind;

use crate::control::wire::NicEntry;
use crate::error::{Error, Result};
use crate::transport::rails::Sysfs;
use crate::transport::rdma::qp_table::QpTable;
use crate::transport::rdma::verbs::{Context, MemoryRegion, ProtectionDomain, device_names};

/// The port every NIC is used through (multi-port NICs are one rail per
/// device here).
const PORT: u8 = 1;

/// One opened NIC.
pub struct Nic {
    /// Its device context.
    pub ctx: Arc<Context>,
    /// The protection domain all its QPs and MRs share.
    pub pd: Arc<ProtectionDomain>,
    /// Port number.
    pub port: u8,
    /// GID table index in use.
    pub gid_index: i32,
    /// That GID.
    pub gid: [u8; 16],
    /// Port LID (0 on RoCE).
    pub lid: u16,
    /// Active MTU (an `ibv_mtu` value).
    pub mtu: u32,
    /// Largest message one work request may carry.
    pub max_msg: u32,
    /// The network device under the GID in use (RoCE), whose link state
    /// is the rail's: `(name, ifindex)`.
    pub netdev: Option<(String, u32)>,
    /// The NUMA node the device hangs off (sysfs; `None` when unknown).
    pub numa_node: Option<u32>,
    /// The port's theoretical rate in Gbit/s (active speed × width; `None`
    /// when the port reports a code we do not know): where the rail's
    /// bandwidth estimate starts.
    pub speed_gbps: Option<f64>,
    /// Link state, kept by the RDMA transport's link watch (the netdev,
    /// RoCE) and its port events (`NicEvents`, any NIC); a rail whose local
    /// NIC is down takes no new slices.
    pub up: AtomicBool,
}

impl Nic {
    /// Its link went `up` or down, as `source` saw it (the link watch, a
    /// port event): logged on a change only, so the two sources of the
    /// same change log once. Returns whether it changed.
    pub(crate) fn set_link(&self, up: bool, source: &str) -> bool {
        let was = self.up.swap(up, Ordering::AcqRel);
        let name = self.ctx.name();
        if was && !up {
            tracing::warn!(
                nic = name,
                source,
                "rail down: link lost; in-flight slices move to sibling rails"
            );
        } else if !was && up {
            tracing::info!(nic = name, source, "rail up: link restored");
        }
        was != up
    }

    /// Is the NIC's link up?
    #[inline]
    pub fn is_up(&self) -> bool {
        // Relaxed: a hint; a slice posted just as the link drops is moved
        // to another rail when its endpoint is evacuated.
        self.up.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for Nic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nic")
            .field("name", &self.ctx.name())
            .field("gid_index", &self.gid_index)
            .field("numa_node", &self.numa_node)
            .field("speed_gbps", &self.speed_gbps)
            .finish()
    }
}

/// The NICs in use, in a fixed order (descriptor rkeys follow it).
#[derive(Debug, Default)]
pub struct NicSet {
    nics: Vec<Nic>,
    /// Each live QP's controller, for QP-fatal async events.
    qps: QpTable,
}

impl NicSet {
    /// Open `wanted` (every device found when empty) with `gid_index` (the
    /// first non-zero GID when `None`). A name not found is an error that
    /// lists the devices found; a device whose port is down is skipped when
    /// none were named, and an error when it was.
    pub fn open(wanted: &[String], gid_index: Option<i32>) -> Result<NicSet> {
        let found = device_names()?;
        let names: Vec<String> = if wanted.is_empty() {
            found.clone()
        } else {
            for w in wanted {
                if !found.contains(w) {
                    return Err(Error::invalid(format!(
                        "no RDMA device named {w:?} (found: {})",
                        found.join(", ")
                    )));
                }
            }
            wanted.to_vec()
        };
        let mut nics = Vec::with_capacity(names.len());
        for name in &names {
            match Self::open_one(name, gid_index) {
                Ok(n) => nics.push(n),
                Err(e) if wanted.is_empty() => {
                    tracing::warn!(device = %name, error = %e, "RDMA device skipped")
                }
                Err(e) => return Err(e),
            }
        }
        if nics.is_empty() {
            return Err(Error::new(
                ErrorKind::LocalNicFailed,
                format!("no usable RDMA device (found: {})", found.join(", ")),
            ));
        }
        Ok(NicSet {
            nics,
            qps: QpTable::default(),
        })
    }

    fn open_one(name: &str, gid_index: Option<i32>) -> Result<Nic> {
        let ctx = Context::open(name)?;
        let port = ctx.port(PORT)?;
        // IBV_PORT_ACTIVE
        if port.state != 4 {
            return Err(Error::new(
                ErrorKind::LocalNicFailed,
                format!("{name} port {PORT} is not active (state {})", port.state),
            ));
        }
        let (gid_index, gid) = ctx.choose_gid(PORT, gid_index)?;
        let pd = ProtectionDomain::new(&ctx)?;
        let speed_gbps = port.speed_gbps();
        if speed_gbps.is_none() {
            tracing::debug!(
                device = %name,
                active_speed = port.active_speed,
                active_width = port.active_width,
                "RDMA port speed unknown; the rail starts from the default bandwidth"
            );
        }
        Ok(Nic {
            ctx,
            pd,
            port: PORT,
            gid_index,
            gid,
            lid: port.lid,
            mtu: port.active_mtu,
            max_msg: port.max_msg_sz.max(4096),
            netdev: netdev_of(name, PORT, gid_index),
            numa_node: Sysfs::default().ibdev_numa(name),
            speed_gbps,
            up: AtomicBool::new(true),
        })
    }

    /// The NICs, in descriptor order.
    pub fn nics(&self) -> &[Nic] {
        &self.nics
    }

    /// The live QPs' send-queue controllers, by (NIC index, QP number).
    pub(crate) fn qps(&self) -> &QpTable {
        &self.qps
    }

    /// The NUMA nodes the NICs hang off (where their workers belong).
    pub(crate) fn numa_nodes(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.nics.iter().filter_map(|n| n.numa_node).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The index of the NIC called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nics.iter().position(|n| n.ctx.name() == name)
    }

    /// What the descriptor says about them.
    pub fn entries(&self) -> Vec<NicEntry> {
        self.nics
            .iter()
            .map(|n| NicEntry {
                name: n.ctx.name().to_owned(),
                gid: n.gid,
                lid: n.lid,
                mtu: n.mtu,
            })
            .collect()
    }

    /// Register `[addr, addr+len)` on every NIC.
    ///
    /// # Safety
    /// The memory must stay mapped until the registration is dropped.
    pub unsafe fn register(&self, addr: *mut u8, len: usize) -> Result<Registration> {
        let mut mrs = Vec::with_capacity(self.nics.len());
        for n in &self.nics {
            // SAFETY: forwarded from the caller.
            mrs.push(unsafe { MemoryRegion::new(&n.pd, addr, len)? });
        }
        Ok(Registration { mrs })
    }
}

/// The network device a RoCE GID belongs to, from sysfs
/// (`ports/<p>/gid_attrs/ndevs/<i>`); `None` on InfiniBand.
fn netdev_of(dev: &str, port: u8, gid_index: i32) -> Option<(String, u32)> {
    let base = std::path::Path::new("/sys/class/infiniband").join(dev);
    let path = base.join(format!("ports/{port}/gid_attrs/ndevs/{gid_index}"));
    let name = std::fs::read_to_string(path).ok()?.trim().to_owned();
    let index = std::fs::read_to_string(format!("/sys/class/net/{name}/ifindex"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some((name, index))
}

/// Memory registered on every NIC of a [`NicSet`]; deregistered on drop
/// (an engine's region drops it when `unregister_memory` has drained the
/// region: `MemRegion::release_rdma`, not with the region's last holder).
pub struct Registration {
    mrs: Vec<MemoryRegion>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("rkeys", &self.rkeys())
            .finish()
    }
}

impl Registration {
    /// The rkey on each NIC, in NIC order.
    pub fn rkeys(&self) -> Vec<u32> {
        self.mrs.iter().map(MemoryRegion::rkey).collect()
    }

    /// The lkey on NIC `i`.
    pub fn lkey(&self, i: usize) -> Option<u32> {
        self.mrs.get(i).map(MemoryRegion::lkey)
    }
}
