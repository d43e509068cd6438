//! Rings for daemon clients: a submission ring, a completion ring and a
//! page of bells, each in a sealed memfd the client maps, served by a
//! worker like an in-process ring but checked against the client's scope.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tent_rings::region::{HEADER_LEN, Region, RegionType};
use tent_rings::spsc;
use tent_rings::{Cqe, Sqe};

use super::Embedded;
use super::client_scope::ClientScope;
use super::worker::WorkerRing;
pub(crate) use super::worker::WorkerShared;
use crate::doorbell::{CqBell, SharedWord};
use crate::error::{Error, ErrorKind, Result};

/// Offsets of the bells in their page's payload: the client bumps the SQ
/// bell after publishing SQEs while the worker sleeps (NEED_WAKEUP on the
/// SQ), the worker the CQ bell after publishing CQEs while the client
/// sleeps (NEED_WAKEUP on the CQ). A cache line each.
pub(crate) const SQ_BELL: usize = 0;
pub(crate) const CQ_BELL: usize = 128;
/// The bells' payload.
pub(crate) const BELLS_LEN: usize = 256;

/// Offsets in a client's mail page: the word the daemon bumps when a
/// notification for the client arrives, and when one the client sent
/// settles. A cache line each.
pub(crate) const MAIL_ARRIVED: usize = 0;
pub(crate) const MAIL_SETTLED: usize = 64;
/// The mail page's payload.
pub(crate) const MAIL_LEN: usize = 128;

/// A client's mail page (see [`MAIL_ARRIVED`]), in a sealed memfd.
pub(crate) fn mail_page() -> Result<(OwnedFd, Arc<Region>)> {
    region_file("tent-client-mail", RegionType::Data, [0; 4], MAIL_LEN)
}

/// A client ring's memory as the daemon keeps it.
pub(crate) struct ClientRing {
    /// The three memfds, in `wire::Part` order, for the client.
    pub(crate) files: [OwnedFd; 3],
    /// Set by the daemon when the client is gone: the worker then retires
    /// the ring once nothing is owed to it (the ring's own closed flag is
    /// the client's to write, so it decides nothing).
    pub(crate) retire: Arc<AtomicBool>,
    /// The SQ bell, which the daemon's relay waits on.
    pub(crate) sq_bell: SharedWord,
    /// The worker serving it (the relay rings its doorbell).
    pub(crate) worker: Arc<WorkerShared>,
}

/// A sealed memfd holding a region of `payload` bytes, mapped here.
fn region_file(
    name: &str,
    ty: RegionType,
    layout: [u64; 4],
    payload: usize,
) -> Result<(OwnedFd, Arc<Region>)> {
    let oom =
        |e: std::io::Error| Error::new(ErrorKind::OutOfMemory, name.to_owned()).with_source(e);
    let size = (HEADER_LEN as u64)
        .checked_add(payload as u64)
        .ok_or_else(|| Error::invalid("ring too large"))?;
    let fd = crate::memfd::sealed_memfd(name, size).map_err(oom)?;
    let file = File::from(fd.try_clone().map_err(oom)?);
    let region = Region::create_in_file(&file, ty, layout, payload)
        .map_err(|e| Error::new(ErrorKind::OutOfMemory, format!("{name}: {e}")))?;
    Ok((fd, Arc::new(region)))
}

impl Embedded {
    /// A ring of `depth` entries for the daemon client `scope`, adopted
    /// by a worker.
    pub(crate) fn client_ring(&self, depth: u32, scope: Arc<ClientScope>) -> Result<ClientRing> {
        if !depth.is_power_of_two() || !(2..=1 << 16).contains(&depth) {
            return Err(Error::invalid(format!(
                "ring depth {depth}: a power of two in 2..=65536"
            )));
        }
        let ring_err = |e: spsc::RingError| Error::invalid("client ring").with_source(e);
        let (sq_fd, sq) = region_file(
            "tent-client-sq",
            RegionType::Ring,
            spsc::ring_layout::<Sqe>(depth),
            spsc::ring_bytes::<Sqe>(depth),
        )?;
        spsc::init_ring::<Sqe>(&sq).map_err(ring_err)?;
        let sq_end = spsc::consumer_in_region::<Sqe>(sq.clone()).map_err(ring_err)?;
        let (cq_fd, cq) = region_file(
            "tent-client-cq",
            RegionType::Ring,
            spsc::ring_layout::<Cqe>(depth),
            spsc::ring_bytes::<Cqe>(depth),
        )?;
        spsc::init_ring::<Cqe>(&cq).map_err(ring_err)?;
        let cq_end = spsc::producer_in_region::<Cqe>(cq).map_err(ring_err)?;
        let (bells_fd, bells) =
            region_file("tent-client-bells", RegionType::Data, [0; 4], BELLS_LEN)?;
        let word = |at| SharedWord::new(bells.clone(), at).expect("inside the bells' page");
        let bell = Arc::new(CqBell {
            // The client says when it sleeps (NEED_WAKEUP on its CQ).
            armed: AtomicBool::new(true),
            shared: Some(word(CQ_BELL)),
            ..CqBell::default()
        });
        let worker = self.pick_worker().clone();
        let retire = Arc::new(AtomicBool::new(false));
        worker.adopt(
            WorkerRing::new(sq_end, Some(cq_end), Some(bell)).for_client(scope, retire.clone()),
        );
        drop(sq);
        Ok(ClientRing {
            files: [sq_fd, cq_fd, bells_fd],
            retire,
            sq_bell: word(SQ_BELL),
            worker,
        })
    }
}
