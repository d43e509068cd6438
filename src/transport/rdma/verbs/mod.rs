//! RAII wrappers over the verbs objects an RDMA transport needs: the device
//! list, a device context, protection domain, memory regions, completion
//! queues and RC queue pairs. Every constructor names the device and the
//! verb in its error; every object releases its verbs resource on drop, in
//! dependency order (each holds an `Arc` of what it was made from).

mod context;
mod cq;
mod device;
mod mr;
mod pd;
mod qp;

pub use context::{AsyncEvent, Context, PortInfo};
pub use cq::CompletionQueue;
pub(crate) use device::device_names;
pub use mr::MemoryRegion;
pub use pd::ProtectionDomain;
pub(crate) use qp::default_traffic_class;
#[cfg(test)]
pub(crate) use qp::post_zero_write;
pub use qp::{
    ACK_TIMEOUT, AddressVector, Addressing, FINITE_RETRY_CNT, QpEndpoint, QueuePair,
    RD_ATOMIC_WANTED, RETRY_CNT, RdmaOp, modify_to_error, rd_atomic_depths,
};

use tent_rings::ErrorKind;

use crate::error::{Error, Result};
use crate::transport::rdma::sys::{self, ffi};

/// The loaded verbs library, or why RDMA cannot be used (as an error).
pub(crate) fn lib() -> Result<&'static ffi::IbvLib> {
    sys::verbs().map_err(|u| Error::new(ErrorKind::LocalNicFailed, u.to_string()))
}

/// The error of verb `verb` on `device`, from `errno` (or `rc` when the verb
/// returns it directly, as `ibv_modify_qp` does).
pub(crate) fn verb_error(device: &str, verb: &str, rc: i32) -> Error {
    let e = if rc > 0 {
        std::io::Error::from_raw_os_error(rc)
    } else {
        std::io::Error::last_os_error()
    };
    let kind = match e.raw_os_error() {
        Some(libc::ENOMEM) => ErrorKind::OutOfMemory,
        Some(libc::EINVAL | libc::EOPNOTSUPP) => ErrorKind::InvalidArgument,
        Some(libc::EACCES | libc::EPERM) => ErrorKind::AccessDenied,
        _ => ErrorKind::LocalNicFailed,
    };
    Error::new(kind, format!("{verb} on {device}")).with_source(e)
}
