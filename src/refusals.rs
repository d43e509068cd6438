//! Connections a full server refused, kept open a moment so their answer
//! is read.
//!
//! A server that is out of slots writes a refusal (busy) and must not close
//! at once: closing a socket with unread input makes the kernel send a
//! reset, which can overtake the answer, and the client would count a
//! busy server as a dead one. So the write side is shut (the client reads
//! our answer, then EOF) and the socket is held for [`LINGER`], at most a
//! bounded number of them, dropped oldest first. Used by the control server
//! and the TCP data server alike.

use std::collections::VecDeque;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// How long a refused connection is held after its answer.
pub(crate) const LINGER: Duration = Duration::from_secs(1);

/// The refused connections a server holds.
#[derive(Debug)]
pub(crate) struct Refusals {
    kept: usize,
    held: VecDeque<(Instant, TcpStream)>,
}

impl Refusals {
    /// Hold at most `kept` refused connections.
    pub(crate) fn new(kept: usize) -> Refusals {
        Refusals {
            kept,
            held: VecDeque::new(),
        }
    }

    /// Close those held past [`LINGER`], and the oldest beyond the bound
    /// (called at each accept: nothing else wakes a server's accept loop).
    pub(crate) fn prune(&mut self) {
        while self
            .held
            .front()
            .is_some_and(|(t, _)| t.elapsed() > LINGER || self.held.len() >= self.kept)
        {
            self.held.pop_front();
        }
    }

    /// `stream` has been sent its refusal: shut our write side and hold it.
    pub(crate) fn hold(&mut self, stream: TcpStream) {
        let _ = stream.shutdown(std::net::Shutdown::Write);
        self.held.push_back((Instant::now(), stream));
    }

    /// How many are held now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }

}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_the_answer_is_read_before_eof() {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut r = Refusals::new(2);
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(TcpStream::connect(addr).unwrap());
            let (mut s, _) = l.accept().unwrap();
            s.write_all(b"busy").unwrap();
            r.prune();
            r.hold(s);
        }
        assert_eq!(r.len(), 2, "the oldest beyond the bound was closed");
        r.prune();
        assert_eq!(r.len(), 1, "room is made before the next one is held");
        for c in &mut clients {
            let mut got = String::new();
            c.read_to_string(&mut got).unwrap();
            assert_eq!(got, "busy", "the answer, then EOF (not a reset)");
        }
    }
}
