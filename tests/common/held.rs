//! A transport that holds every slice until the test releases it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tent::ErrorKind;
use tent::TransportKind;
use tent::transport::{
    Capabilities, InstallContext, Slice, SliceCompletion, SubmitOutcome, Transport, WorkerCtx,
};

/// Accepts every slice (Posted) and completes it only when released: an
/// op that stays in flight (a transport whose hardware lets go of the
/// buffer only when the test says so). An abort is recorded, and an
/// aborted slice released completes with the abort's kind.
#[derive(Default)]
pub(crate) struct Held {
    pub posted: Mutex<Vec<u64>>,
    aborted: Mutex<Vec<(u64, ErrorKind)>>,
    released: Mutex<Vec<SliceCompletion>>,
}

impl Held {
    /// Complete every slice posted so far (4096 bytes, or the kind it was
    /// aborted with); how many.
    pub(crate) fn release_all(&self) -> usize {
        let mut p = self.posted.lock().unwrap();
        let aborted = self.aborted.lock().unwrap();
        let n = p.len();
        let mut r = self.released.lock().unwrap();
        for token in p.drain(..) {
            let result = match aborted.iter().find(|(t, _)| *t == token) {
                Some(&(_, kind)) => Err(kind),
                None => Ok(4096),
            };
            r.push(SliceCompletion { token, result });
        }
        n
    }

    /// Distinct tokens aborted so far, with their kinds.
    pub(crate) fn aborts(&self) -> Vec<(u64, ErrorKind)> {
        self.aborted.lock().unwrap().clone()
    }

    /// Wait (up to 10 s) until a slice is posted.
    pub(crate) fn wait_posted(&self) {
        let until = Instant::now() + Duration::from_secs(10);
        while self.posted.lock().unwrap().is_empty() {
            assert!(Instant::now() < until, "nothing posted");
            std::thread::yield_now();
        }
    }
}

impl Transport for Held {
    fn kind(&self) -> TransportKind {
        TransportKind::Local
    }
    fn install(&self, _: &InstallContext) -> tent::Result<()> {
        Ok(())
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            atomic_submit: false,
            synchronous: false,
            remote: false,
            slice_bytes: 0,
            wakes_worker: false,
            parks_worker: false,
        }
    }
    fn reaches(&self, _: &tent::segment::Segment) -> bool {
        true
    }
    fn submit(&self, _: &WorkerCtx, slices: &[Slice<'_>], out: &mut [SubmitOutcome]) {
        let mut p = self.posted.lock().unwrap();
        for (s, o) in slices.iter().zip(out) {
            p.push(s.token);
            *o = SubmitOutcome::Posted;
        }
    }
    fn poll(&self, _: &WorkerCtx, out: &mut [SliceCompletion]) -> usize {
        let mut r = self.released.lock().unwrap();
        let n = r.len().min(out.len());
        for (o, c) in out.iter_mut().zip(r.drain(..n)) {
            *o = c;
        }
        n
    }
    fn abort(&self, _: &WorkerCtx, token: u64, kind: ErrorKind) {
        let posted = self.posted.lock().unwrap();
        let mut a = self.aborted.lock().unwrap();
        if posted.contains(&token) && !a.iter().any(|(t, _)| *t == token) {
            a.push((token, kind));
        }
    }
}
