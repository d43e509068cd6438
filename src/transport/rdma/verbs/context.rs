//! An open device: ports, GIDs, limits.

use std::ffi::CStr;
use std::sync::Arc;

use tent_rings::ErrorKind;

use super::verb_error;
use crate::error::{Error, Result};
use crate::transport::rails::Sysfs;
use crate::transport::rdma::gid::{self, GidChoice, GidEntry, GidType, LinkLayer};
use crate::transport::rdma::sys::{self, ffi, ops};
use crate::transport::rdma::verbs::Addressing;

/// Most GID entries read in one `ibv_query_gid_table` (every port's).
const MAX_GID_ENTRIES: usize = 4096;

/// An open RDMA device (`ibv_open_device`), closed on drop.
pub struct Context {
    pub(crate) raw: *mut ffi::ibv_context,
    name: String,
    attr: ffi::ibv_device_attr,
}

// SAFETY: verbs contexts are thread-safe (rdma-core locks internally); the pointer is owned.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.name)
            .finish()
    }
}

/// What a port offers.
#[derive(Debug, Clone, Copy)]
pub struct PortInfo {
    /// `IBV_PORT_ACTIVE` and friends.
    pub state: u32,
    /// Active MTU (an `ibv_mtu` value).
    pub active_mtu: u32,
    /// LID (0 on RoCE).
    pub lid: u16,
    /// GID table length.
    pub gid_table_len: i32,
    /// Largest message one work request may carry.
    pub max_msg_sz: u32,
    /// Per-lane signalling rate code (`IB_SPEED_*`: 1 SDR ... 128 NDR).
    /// Newer rdma-core adds `active_speed_ex` (XDR's 256 does not fit a
    /// byte); the rdma-core 44 headers these bindings come from lack it.
    pub active_speed: u8,
    /// Lane count code (`IB_WIDTH_*`: 1 = 1X, 2 = 4X, 4 = 8X, 8 = 12X,
    /// 16 = 2X).
    pub active_width: u8,
    /// What the link runs over.
    pub link_layer: LinkLayer,
}

impl PortInfo {
    /// Its state as `ibv_port_state_str` names it (`ACTIVE`, `DOWN`, ...;
    /// `UNKNOWN` for a code past those).
    pub(crate) fn state_name(&self) -> &'static str {
        match self.state {
            0 => "NOP",
            1 => "DOWN",
            2 => "INIT",
            3 => "ARMED",
            4 => "ACTIVE",
            5 => "ACTIVE_DEFER",
            _ => "UNKNOWN",
        }
    }

    /// The port's theoretical rate in Gbit/s ([`PortInfo::link_gbps`] of
    /// its active speed and width); `None` for a code the table does not
    /// know.
    pub(crate) fn speed_gbps(&self) -> Option<f64> {
        PortInfo::link_gbps(u32::from(self.active_speed), self.active_width)
    }

    /// The theoretical rate of a link in Gbit/s: the per-lane signalling
    /// rate of `speed` (an `IB_SPEED_*` code, as in `active_speed` or
    /// `active_speed_ex`) times the lanes of `width` (an `IB_WIDTH_*`
    /// code). `None` when either code is unknown (0 included: no link).
    /// RoCE NICs and Soft-RoCE translate their Ethernet speed into these
    /// codes.
    ///
    /// ```
    /// use tent::transport::rdma::verbs::PortInfo;
    ///
    /// assert_eq!(PortInfo::link_gbps(32, 2), Some(103.125)); // EDR 4X
    /// assert_eq!(PortInfo::link_gbps(128, 2), Some(425.0)); // NDR 4X
    /// assert_eq!(PortInfo::link_gbps(3, 2), None);
    /// ```
    pub fn link_gbps(speed: u32, width: u8) -> Option<f64> {
        let lane_gbps = match speed {
            1 => 2.5,       // SDR
            2 => 5.0,       // DDR
            4 => 10.0,      // QDR
            8 => 10.3125,   // FDR10
            16 => 14.0625,  // FDR
            32 => 25.78125, // EDR
            64 => 53.125,   // HDR
            128 => 106.25,  // NDR
            256 => 212.5,   // XDR
            _ => return None,
        };
        let lanes = match width {
            1 => 1.0,
            2 => 4.0,
            4 => 8.0,
            8 => 12.0,
            16 => 2.0,
            _ => return None,
        };
        Some(lane_gbps * lanes)
    }
}

/// Whether a device of transport type `t` can carry RC READ and WRITE as
/// tent sets them up (verbs QPs exchanged over its own control plane):
/// InfiniBand and RoCE can; EFA (SRD, no remote write), usNIC (UD only)
/// and iWARP (connections only through the RDMA CM) cannot.
fn rc_capable(t: ffi::ibv_transport_type) -> std::result::Result<(), &'static str> {
    use ffi::ibv_transport_type as T;
    match t {
        T::IBV_TRANSPORT_IB => Ok(()),
        T::IBV_TRANSPORT_IWARP => Err("an iWARP device (its connections need the RDMA CM)"),
        T::IBV_TRANSPORT_USNIC | T::IBV_TRANSPORT_USNIC_UDP => {
            Err("a usNIC device (no reliable connections)")
        }
        _ => Err("a device without InfiniBand-style RC queue pairs (EFA, say: no remote write)"),
    }
}

impl Context {
    /// Open the device called `name`; an unknown name lists those found.
    pub fn open(name: &str) -> Result<Arc<Context>> {
        let lib = super::lib()?;
        let mut n = 0;
        // SAFETY: `n` is a valid out-parameter; NULL is handled.
        let list = unsafe { lib.ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(verb_error(name, "ibv_get_device_list", 0));
        }
        let mut found = Vec::new();
        let mut chosen = std::ptr::null_mut();
        for i in 0..n.max(0) as usize {
            // SAFETY: the list holds `n` devices.
            let dev = unsafe { *list.add(i) };
            // SAFETY: a device of the list; its name is owned by the library.
            let dname = unsafe { CStr::from_ptr(lib.ibv_get_device_name(dev)) }
                .to_string_lossy()
                .into_owned();
            if dname == name {
                chosen = dev;
            }
            found.push(dname);
        }
        let raw = if chosen.is_null() {
            std::ptr::null_mut()
        } else {
            // SAFETY: `chosen` is a device of the live list.
            unsafe { lib.ibv_open_device(chosen) }
        };
        let open_err = raw
            .is_null()
            .then(|| verb_error(name, "ibv_open_device", 0));
        // SAFETY: the list came from ibv_get_device_list; an open context does not need it.
        unsafe { lib.ibv_free_device_list(list) };
        if chosen.is_null() {
            return Err(Error::invalid(format!(
                "no RDMA device named {name:?} (found: {})",
                if found.is_empty() {
                    "none".to_owned()
                } else {
                    found.join(", ")
                }
            )));
        }
        if let Some(e) = open_err {
            return Err(e);
        }
        let mut attr = ffi::ibv_device_attr::default();
        // SAFETY: `raw` is a live context; `attr` is writable.
        let rc = unsafe { lib.ibv_query_device(raw, &mut attr) };
        if rc != 0 {
            // SAFETY: opened above, closed once.
            unsafe { lib.ibv_close_device(raw) };
            return Err(verb_error(name, "ibv_query_device", rc));
        }
        Ok(Arc::new(Context {
            raw,
            name: name.to_owned(),
            attr,
        }))
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Most work requests one QP may hold.
    pub fn max_qp_wr(&self) -> u32 {
        self.attr.max_qp_wr.max(0) as u32
    }

    /// Largest memory region the device registers (`max_mr_size`).
    pub fn max_mr_size(&self) -> u64 {
        self.attr.max_mr_size
    }

    /// Can the device carry tent's traffic (RC QPs with remote READ and
    /// WRITE)? `Err` says why not.
    pub(crate) fn rc_capable(&self) -> std::result::Result<(), &'static str> {
        // SAFETY: `self.raw` is live; `device` is set at open and outlives it.
        let transport = unsafe { (*(*self.raw).device).transport_type };
        rc_capable(transport)
    }

    /// Most RDMA READs / atomics one QP may have outstanding as their
    /// target (`max_qp_rd_atom`): the cap on `max_dest_rd_atomic`.
    pub fn max_qp_rd_atom(&self) -> u32 {
        self.attr.max_qp_rd_atom.max(0) as u32
    }

    /// Most RDMA READs / atomics one QP may have outstanding as their
    /// initiator (`max_qp_init_rd_atom`): the cap on `max_rd_atomic`.
    pub fn max_qp_init_rd_atom(&self) -> u32 {
        self.attr.max_qp_init_rd_atom.max(0) as u32
    }

    /// Port 1-based `port`'s state, MTU, GID table size and link speed.
    pub fn port(&self, port: u8) -> Result<PortInfo> {
        let lib = super::lib()?;
        let mut a = ffi::ibv_port_attr::default();
        // SAFETY: `self.raw` is live for self's lifetime.
        let rc = unsafe { ops::query_port(lib, self.raw, port, &mut a) };
        if rc != 0 {
            return Err(verb_error(&self.name, "ibv_query_port", rc));
        }
        Ok(PortInfo {
            state: a.state.0,
            active_mtu: a.active_mtu.0,
            lid: a.lid,
            gid_table_len: a.gid_tbl_len,
            max_msg_sz: a.max_msg_sz,
            active_speed: a.active_speed,
            active_width: a.active_width,
            link_layer: LinkLayer::from_verbs(a.link_layer),
        })
    }

    /// GID `index` of `port`.
    pub(crate) fn gid(&self, port: u8, index: i32) -> Result<[u8; 16]> {
        let lib = super::lib()?;
        let mut g = ffi::ibv_gid::default();
        // SAFETY: `self.raw` is live; `g` is writable.
        let rc = unsafe { lib.ibv_query_gid(self.raw, port, index, &mut g) };
        if rc != 0 {
            return Err(verb_error(&self.name, "ibv_query_gid", rc));
        }
        // SAFETY: every bit pattern of the union is a valid byte array.
        Ok(unsafe { g.raw })
    }

    /// The port's non-empty GID entries (the first 256: an address
    /// handle holds 8 bits of the index), each with its kind and whether
    /// its network device is up: from one `ibv_query_gid_table` where the
    /// library has it, else entry by entry (`ibv_query_gid` and sysfs for
    /// the kind). Sysfs is read only for entries that hold an address.
    pub(crate) fn gid_table(&self, port: u8, info: &PortInfo, sysfs: &Sysfs) -> Vec<GidEntry> {
        let Ok(lib) = super::lib() else {
            return Vec::new();
        };
        let link = info.link_layer;
        let entry = |index: u8, gid: [u8; 16], ty: Option<GidType>| {
            let (sysfs_ty, up) = gid::sysfs_attrs(sysfs, &self.name, port, index, link);
            GidEntry {
                index,
                gid,
                ty: ty.or(sysfs_ty),
                netdev_up: up,
            }
        };
        if lib._ibv_query_gid_table.is_ok() {
            // Every port's entries come back: room for all of them.
            let ports = usize::from(self.attr.phys_port_cnt.max(1));
            let room = usize::try_from(info.gid_table_len.max(0))
                .unwrap_or(0)
                .saturating_mul(ports)
                .min(MAX_GID_ENTRIES);
            let mut all = vec![ffi::ibv_gid_entry::default(); room];
            // SAFETY: `self.raw` is live; `all` holds `room` writable entries of the size passed.
            let n = unsafe {
                lib._ibv_query_gid_table(
                    self.raw,
                    all.as_mut_ptr(),
                    room,
                    0,
                    std::mem::size_of::<ffi::ibv_gid_entry>(),
                )
            };
            if let Ok(n) = usize::try_from(n) {
                return all[..n.min(room)]
                    .iter()
                    .filter(|e| e.port_num == u32::from(port))
                    .filter_map(|e| {
                        let index = u8::try_from(e.gid_index).ok()?;
                        // SAFETY: every bit pattern of the union is a valid byte array.
                        let gid = unsafe { e.gid.raw };
                        if gid.iter().all(|&b| b == 0) {
                            return None;
                        }
                        let ty = match e.gid_type {
                            0 if link == LinkLayer::Ethernet => Some(GidType::RoceV1),
                            code => u8::try_from(code).ok().and_then(GidType::from_code),
                        };
                        Some(entry(index, gid, ty))
                    })
                    .collect();
            }
        }
        let len = u16::try_from(info.gid_table_len.clamp(0, 256)).unwrap_or(0);
        (0..len)
            .filter_map(|i| {
                let index = u8::try_from(i).ok()?;
                let gid = self.gid(port, i32::from(index)).ok()?;
                (!gid.iter().all(|&b| b == 0)).then(|| entry(index, gid, None))
            })
            .collect()
    }

    /// How a QP on `port` is addressed when nothing is configured: the GID
    /// chosen by type, the link's default traffic class, service level 0.
    pub fn default_addressing(&self, port: u8) -> Result<Addressing> {
        let link = self.port(port)?.link_layer;
        Ok(Addressing {
            port,
            gid: self.choose_gid(port, None)?,
            link,
            traffic_class: super::default_traffic_class(link),
            service_level: 0,
        })
    }

    /// The GID `port` is addressed by: `wanted` (the configured index) if
    /// it holds an address, else the best of the table by type
    /// ([`gid::choose`]).
    pub fn choose_gid(&self, port: u8, wanted: Option<u8>) -> Result<GidChoice> {
        let info = self.port(port)?;
        if let Some(i) = wanted
            && i32::from(i) >= info.gid_table_len
        {
            return Err(Error::invalid(format!(
                "GID index {i} out of range for {} port {port} (table has {})",
                self.name, info.gid_table_len
            )));
        }
        let sysfs = Sysfs::default();
        let table = self.gid_table(port, &info, &sysfs);
        let mut choice = gid::choose(&table, info.link_layer, wanted).map_err(|why| {
            let kind = if wanted.is_some() {
                ErrorKind::InvalidArgument
            } else {
                ErrorKind::LocalNicFailed
            };
            Error::new(kind, format!("{} port {port}: {why}", self.name))
        })?;
        choice.prefix = match info.link_layer {
            LinkLayer::InfiniBand => Some(64),
            LinkLayer::Ethernet => sysfs
                .ibdev_text(
                    &self.name,
                    &format!("ports/{port}/gid_attrs/ndevs/{}", choice.index),
                )
                .and_then(|ndev| {
                    crate::netlink::interfaces()
                        .ok()?
                        .into_iter()
                        .find(|i| i.name == ndev)
                })
                .and_then(|i| gid::roce_prefix(&choice.gid, &i.addrs)),
        };
        Ok(choice)
    }
}

/// One asynchronous event of a device, as `ibv_get_async_event` gave it
/// (acknowledged already: nothing of it is borrowed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// `ibv_event_type`.
    pub kind: ffi::ibv_event_type,
    /// The port, for a port event (0 otherwise).
    pub port: u8,
    /// The QP number, for a QP event (0 otherwise).
    pub qp_num: u32,
}

impl Context {
    /// The device's asynchronous-event descriptor, made non-blocking (so
    /// [`Context::next_async_event`] never waits: poll it for input first).
    pub(crate) fn async_fd(&self) -> Result<std::os::fd::RawFd> {
        // SAFETY: `self.raw` is live; `async_fd` is a plain field the library set at open.
        let fd = unsafe { (*self.raw).async_fd };
        // SAFETY: the context owns `fd` and keeps it open while `self` lives; the borrow ends with this function.
        let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let nonblocking = rustix::fs::fcntl_getfl(borrowed)
            .and_then(|fl| rustix::fs::fcntl_setfl(borrowed, fl | rustix::fs::OFlags::NONBLOCK));
        if let Err(e) = nonblocking {
            return Err(Error::new(
                ErrorKind::LocalNicFailed,
                format!(
                    "{}: cannot make the async event fd non-blocking: {e}",
                    self.name
                ),
            ));
        }
        Ok(fd)
    }

    /// The next asynchronous event, acknowledged; `None` when none is
    /// waiting (the descriptor is non-blocking once [`Context::async_fd`]
    /// was called).
    pub(crate) fn next_async_event(&self) -> Option<AsyncEvent> {
        let lib = sys::verbs().ok()?;
        let mut ev = ffi::ibv_async_event::default();
        // SAFETY: `self.raw` is live; `ev` is writable.
        if unsafe { lib.ibv_get_async_event(self.raw, &mut ev) } != 0 {
            return None;
        }
        let k = ev.event_type;
        use ffi::ibv_event_type as E;
        let port = match k {
            E::IBV_EVENT_PORT_ACTIVE
            | E::IBV_EVENT_PORT_ERR
            | E::IBV_EVENT_LID_CHANGE
            | E::IBV_EVENT_PKEY_CHANGE
            | E::IBV_EVENT_GID_CHANGE
            | E::IBV_EVENT_SM_CHANGE
            | E::IBV_EVENT_CLIENT_REREGISTER => {
                // SAFETY: a port event's element is `port_num`.
                u8::try_from(unsafe { ev.element.port_num }).unwrap_or(0)
            }
            _ => 0,
        };
        let qp_num = match k {
            E::IBV_EVENT_QP_FATAL
            | E::IBV_EVENT_QP_REQ_ERR
            | E::IBV_EVENT_QP_ACCESS_ERR
            | E::IBV_EVENT_COMM_EST
            | E::IBV_EVENT_SQ_DRAINED
            | E::IBV_EVENT_PATH_MIG
            | E::IBV_EVENT_PATH_MIG_ERR
            | E::IBV_EVENT_QP_LAST_WQE_REACHED => {
                // SAFETY: a QP event's element is the QP, live until the event is acknowledged (below).
                let qp = unsafe { ev.element.qp };
                if qp.is_null() {
                    0
                } else {
                    // SAFETY: non-null and live until the ack.
                    unsafe { (*qp).qp_num }
                }
            }
            _ => 0,
        };
        // SAFETY: `ev` came from ibv_get_async_event and is acknowledged once; nothing of it is used after.
        unsafe { lib.ibv_ack_async_event(&mut ev) };
        Some(AsyncEvent {
            kind: k,
            port,
            qp_num,
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if let Ok(lib) = sys::verbs() {
            // SAFETY: opened in `open`, closed once; everything made from it holds an Arc of it, so it is gone by now.
            unsafe { lib.ibv_close_device(self.raw) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_infiniband_and_roce_devices_carry_rc_read_and_write() {
        use ffi::ibv_transport_type as T;
        assert!(rc_capable(T::IBV_TRANSPORT_IB).is_ok());
        for t in [
            T::IBV_TRANSPORT_IWARP,
            T::IBV_TRANSPORT_USNIC,
            T::IBV_TRANSPORT_USNIC_UDP,
            T::IBV_TRANSPORT_UNSPECIFIED,
            T::IBV_TRANSPORT_UNKNOWN,
        ] {
            assert!(rc_capable(t).is_err(), "{t:?}");
        }
        assert!(
            rc_capable(T::IBV_TRANSPORT_UNSPECIFIED)
                .unwrap_err()
                .contains("EFA")
        );
    }

    fn port(active_speed: u8, active_width: u8) -> PortInfo {
        PortInfo {
            state: 4,
            active_mtu: 3,
            lid: 0,
            gid_table_len: 16,
            max_msg_sz: 1 << 30,
            active_speed,
            active_width,
            link_layer: LinkLayer::Ethernet,
        }
    }

    #[test]
    fn every_speed_code_times_every_width_code() {
        let lanes = [(1u8, 1.0), (2, 4.0), (4, 8.0), (8, 12.0), (16, 2.0)];
        let rates = [
            (1u32, 2.5),
            (2, 5.0),
            (4, 10.0),
            (8, 10.3125),
            (16, 14.0625),
            (32, 25.78125),
            (64, 53.125),
            (128, 106.25),
            (256, 212.5),
        ];
        for (speed, lane) in rates {
            for (width, n) in lanes {
                assert_eq!(
                    PortInfo::link_gbps(speed, width),
                    Some(lane * n),
                    "speed {speed} width {width}"
                );
            }
        }
        assert_eq!(port(1, 1).speed_gbps(), Some(2.5)); // SDR 1X
        assert_eq!(port(2, 2).speed_gbps(), Some(20.0)); // DDR 4X
        assert_eq!(port(64, 2).speed_gbps(), Some(212.5)); // HDR 4X
        assert_eq!(port(128, 2).speed_gbps(), Some(425.0)); // NDR 4X
        assert_eq!(port(128, 8).speed_gbps(), Some(1275.0)); // NDR 12X
    }

    #[test]
    fn unknown_codes_have_no_speed() {
        for speed in [0u32, 3, 5, 6, 7, 9, 12, 33, 255, 257, 512, u32::MAX] {
            assert_eq!(PortInfo::link_gbps(speed, 2), None, "speed {speed}");
        }
        for width in [0u8, 3, 5, 6, 7, 9, 12, 17, 32, 255] {
            assert_eq!(PortInfo::link_gbps(32, width), None, "width {width}");
        }
        assert_eq!(port(0, 0).speed_gbps(), None);
        assert_eq!(port(255, 255).speed_gbps(), None);
    }
}
