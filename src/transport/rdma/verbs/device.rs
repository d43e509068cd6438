//! The device list.

use crate::error::{Error, Result};
use crate::transport::rdma::sys;
use tent_rings::ErrorKind;

/// Names of the RDMA devices on this machine (an error says why none).
pub(crate) fn device_names() -> Result<Vec<String>> {
    sys::devices().map_err(|u| Error::new(ErrorKind::LocalNicFailed, u.to_string()))
}
