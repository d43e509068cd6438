//! HMAC-SHA256 challenge-response, one scheme for the three doors (control
//! server, TCP data port, shm handout socket). Each side proves it holds
//! the shared secret by MACing, under a label naming the door and its role,
//! both nonces and the channel binding: what names the server's end of
//! this connection as the side computing the proof sees it. The secret
//! never crosses the wire, a recorded exchange does not replay (fresh
//! nonces), a proof made for one door or role verifies at no other, and a
//! proof relayed by a peer listening elsewhere verifies on neither side
//! (the binding names the relay's address on one side, the server's on the
//! other).
//!
//! Bindings: on TCP doors the server's socket address, as dialed by the
//! client (its connected socket's `peer_addr`) and as accepted by the
//! server (its socket's `local_addr`), see [`addr_binding`]; on the shm
//! socket the socket file's device and inode.

use std::net::SocketAddr;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::wire::{MAC_LEN, NONCE_LEN};

/// Which door a proof opens: each has its own labels, so a proof made for
/// one does not open another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    /// The control server (descriptors, QP bootstrap).
    Control,
    /// The TCP data port.
    Data,
    /// The shm handout socket.
    Shm,
}

impl Door {
    /// (client label, server label).
    fn labels(self) -> (&'static [u8], &'static [u8]) {
        match self {
            Door::Control => (b"tent-control-client-v2", b"tent-control-server-v2"),
            Door::Data => (b"tent-data-client-v2", b"tent-data-server-v2"),
            Door::Shm => (b"tent-shm-handout-client-v2", b"tent-shm-handout-server-v2"),
        }
    }
}

/// The channel binding of a TCP door: the server's address, IPv4 as
/// IPv4-mapped IPv6 (a dual-stack listener sees `::ffff:a.b.c.d` where the
/// client dialed `a.b.c.d`), then the port; scope and flow ids are left
/// out (they are local to each host).
pub fn addr_binding(server: SocketAddr) -> [u8; 18] {
    let ip = match server.ip() {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        std::net::IpAddr::V6(v6) => v6,
    };
    let mut b = [0u8; 18];
    b[..16].copy_from_slice(&ip.octets());
    b[16..].copy_from_slice(&server.port().to_be_bytes());
    b
}

fn mac(
    door: Door,
    server_role: bool,
    secret: &[u8],
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
    binding: &[u8],
) -> Hmac<Sha256> {
    let (client, server) = door.labels();
    let mut m = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    m.update(if server_role { server } else { client });
    m.update(server_nonce);
    m.update(client_nonce);
    m.update(&(binding.len() as u64).to_le_bytes());
    m.update(binding);
    m
}

/// What the client sends: MAC(secret, door's client label, server nonce,
/// client nonce, binding).
pub fn client_proof(
    door: Door,
    secret: &[u8],
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
    binding: &[u8],
) -> [u8; MAC_LEN] {
    mac(door, false, secret, server_nonce, client_nonce, binding)
        .finalize()
        .into_bytes()
        .into()
}

/// What the server answers: the same under the door's server label.
pub(crate) fn server_proof(
    door: Door,
    secret: &[u8],
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
    binding: &[u8],
) -> [u8; MAC_LEN] {
    mac(door, true, secret, server_nonce, client_nonce, binding)
        .finalize()
        .into_bytes()
        .into()
}

/// Constant-time check of a client's proof.
pub(crate) fn verify_client(
    door: Door,
    secret: &[u8],
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
    binding: &[u8],
    proof: &[u8; MAC_LEN],
) -> bool {
    mac(door, false, secret, server_nonce, client_nonce, binding)
        .verify_slice(proof)
        .is_ok()
}

/// Constant-time check of a server's proof.
pub(crate) fn verify_server(
    door: Door,
    secret: &[u8],
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
    binding: &[u8],
    proof: &[u8; MAC_LEN],
) -> bool {
    mac(door, true, secret, server_nonce, client_nonce, binding)
        .verify_slice(proof)
        .is_ok()
}

/// A fresh random nonce from the kernel's CSPRNG (`getrandom`, or
/// `/dev/urandom` where a sandbox refuses the system call).
///
/// Panics when the system has no entropy source at all: every secret
/// door depends on these being unpredictable.
pub(crate) fn nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).unwrap_or_else(|e| panic!("no entropy source: {e}"));
    n
}

/// 64 random bits from the same source as [`nonce`] (names, salts, ids).
pub(crate) fn random_u64() -> u64 {
    let mut n = [0u8; 8];
    getrandom::fill(&mut n).unwrap_or_else(|e| panic!("no entropy source: {e}"));
    u64::from_le_bytes(n)
}

/// A random non-zero 64-bit value.
pub(crate) fn random_nonzero_u64() -> std::num::NonZeroU64 {
    loop {
        if let Some(v) = std::num::NonZeroU64::new(random_u64()) {
            return v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: &[u8] = b"0123456789abcdef";
    const DOORS: [Door; 3] = [Door::Control, Door::Data, Door::Shm];

    #[test]
    fn proofs_bind_secret_nonces_and_binding() {
        let (s, c) = (nonce(), nonce());
        assert_ne!(s, c);
        for d in DOORS {
            let p = client_proof(d, K, &s, &c, b"here");
            assert!(verify_client(d, K, &s, &c, b"here", &p));
            assert!(!verify_client(d, b"0123456789abcdeX", &s, &c, b"here", &p));
            assert!(!verify_client(d, K, &c, &s, b"here", &p), "nonces swapped");
            assert!(!verify_client(d, K, &nonce(), &c, b"here", &p));
            assert!(!verify_client(d, K, &s, &c, b"there", &p), "binding");
            assert!(!verify_client(d, K, &s, &c, b"", &p), "binding");
            let q = server_proof(d, K, &s, &c, b"here");
            assert!(verify_server(d, K, &s, &c, b"here", &q));
            assert!(!verify_server(d, K, &s, &c, b"there", &q), "binding");
        }
    }

    #[test]
    fn proofs_of_different_doors_and_roles_are_not_interchangeable() {
        let (s, c) = (nonce(), nonce());
        let b = b"binding";
        let mut all = Vec::new();
        for d in DOORS {
            all.push((d, false, client_proof(d, K, &s, &c, b)));
            all.push((d, true, server_proof(d, K, &s, &c, b)));
        }
        for (d, server, p) in &all {
            for e in DOORS {
                let as_client = verify_client(e, K, &s, &c, b, p);
                let as_server = verify_server(e, K, &s, &c, b, p);
                assert_eq!(
                    as_client,
                    e == *d && !server,
                    "{d:?} server={server} as {e:?} client"
                );
                assert_eq!(
                    as_server,
                    e == *d && *server,
                    "{d:?} server={server} as {e:?} server"
                );
            }
        }
        let distinct: std::collections::HashSet<_> = all.iter().map(|(_, _, p)| *p).collect();
        assert_eq!(distinct.len(), all.len());
    }

    #[test]
    fn addr_binding_names_ip_and_port() {
        let a: SocketAddr = "10.0.0.1:7000".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:10.0.0.1]:7000".parse().unwrap();
        assert_eq!(addr_binding(a), addr_binding(mapped), "dual-stack listener");
        assert_ne!(
            addr_binding(a),
            addr_binding("10.0.0.1:7001".parse().unwrap())
        );
        assert_ne!(
            addr_binding(a),
            addr_binding("10.0.0.2:7000".parse().unwrap())
        );
        let v6: SocketAddr = "[fe80::1%2]:7000".parse().unwrap();
        let v6b: SocketAddr = "[fe80::1%5]:7000".parse().unwrap();
        assert_eq!(
            addr_binding(v6),
            addr_binding(v6b),
            "scope ids are host-local"
        );
    }
}
