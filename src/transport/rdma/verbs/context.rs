//! An open device: ports, GIDs, limits.

use std::ffi::CStr;
use std::sync::Arc;

use tent_rings::ErrorKind;

use super::verb_error;
use crate::error::{Error, Result};
use crate::transport::rdma::sys::{self, ffi, ops};

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

    /// Port 1-based `port`'s state, MTU and GID table size.
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
        })
    }

    /// GID `index` of `port`.
    pub fn gid(&self, port: u8, index: i32) -> Result<[u8; 16]> {
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

    /// The GID index to use on `port`: `wanted` if given (inside the table
    /// and not empty), else the first non-zero entry.
    pub fn choose_gid(&self, port: u8, wanted: Option<i32>) -> Result<(i32, [u8; 16])> {
        let info = self.port(port)?;
        if let Some(i) = wanted {
            if i < 0 || i >= info.gid_table_len {
                return Err(Error::invalid(format!(
                    "GID index {i} out of range for {} port {port} (table has {})",
                    self.name, info.gid_table_len
                )));
            }
            let g = self.gid(port, i)?;
            if g.iter().all(|&b| b == 0) {
                return Err(Error::invalid(format!(
                    "GID index {i} of {} port {port} is empty (no address behind it)",
                    self.name
                )));
            }
            return Ok((i, g));
        }
        for i in 0..info.gid_table_len.min(16) {
            if let Ok(g) = self.gid(port, i)
                && g.iter().any(|&b| b != 0)
            {
                return Ok((i, g));
            }
        }
        Err(Error::new(
            ErrorKind::LocalNicFailed,
            format!("{} port {port} has no usable GID", self.name),
        ))
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
