//! HMAC-SHA256 challenge-response. Each side proves it holds the shared
//! secret by MACing both nonces under a role label; the secret itself never
//! crosses the wire, and a recorded exchange does not replay (fresh nonces).

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::wire::{MAC_LEN, NONCE_LEN};

const CLIENT_LABEL: &[u8] = b"tent-control-client-v1";
const SERVER_LABEL: &[u8] = b"tent-control-server-v1";
/// The shm handout socket's labels: a proof made for the control plane
/// does not open the shm door, nor the other way round.
const SHM_CLIENT_LABEL: &[u8] = b"tent-shm-handout-client-v1";
const SHM_SERVER_LABEL: &[u8] = b"tent-shm-handout-server-v1";
/// The data plane's labels: a control-plane proof does not verify there
/// (nor the other way round), whatever the nonces.
const DATA_CLIENT_LABEL: &[u8] = b"tent-data-client-v1";
const DATA_SERVER_LABEL: &[u8] = b"tent-data-server-v1";

fn mac(secret: &[u8], label: &[u8], a: &[u8; NONCE_LEN], b: &[u8; NONCE_LEN]) -> Hmac<Sha256> {
    let mut m = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    m.update(label);
    m.update(a);
    m.update(b);
    m
}

/// What the client sends: MAC(secret, client label, server nonce, client nonce).
pub fn client_proof(
    secret: &[u8],
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
) -> [u8; MAC_LEN] {
    mac(secret, CLIENT_LABEL, server_nonce, client_nonce)
        .finalize()
        .into_bytes()
        .into()
}

/// What the server answers: MAC(secret, server label, client nonce, server nonce).
pub fn server_proof(
    secret: &[u8],
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
) -> [u8; MAC_LEN] {
    mac(secret, SERVER_LABEL, client_nonce, server_nonce)
        .finalize()
        .into_bytes()
        .into()
}

/// Constant-time check of a client's proof.
pub fn verify_client(
    secret: &[u8],
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
    proof: &[u8; MAC_LEN],
) -> bool {
    mac(secret, CLIENT_LABEL, server_nonce, client_nonce)
        .verify_slice(proof)
        .is_ok()
}

/// Constant-time check of a server's proof.
pub fn verify_server(
    secret: &[u8],
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
    proof: &[u8; MAC_LEN],
) -> bool {
    mac(secret, SERVER_LABEL, client_nonce, server_nonce)
        .verify_slice(proof)
        .is_ok()
}

/// [`client_proof`] for the shm handout socket (its own label).
pub fn shm_client_proof(
    secret: &[u8],
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
) -> [u8; MAC_LEN] {
    mac(secret, SHM_CLIENT_LABEL, server_nonce, client_nonce)
        .finalize()
        .into_bytes()
        .into()
}

/// [`server_proof`] for the shm handout socket (its own label).
pub fn shm_server_proof(
    secret: &[u8],
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
) -> [u8; MAC_LEN] {
    mac(secret, SHM_SERVER_LABEL, client_nonce, server_nonce)
        .finalize()
        .into_bytes()
        .into()
}

/// Constant-time check of a [`shm_client_proof`].
pub fn verify_shm_client(
    secret: &[u8],
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
    proof: &[u8; MAC_LEN],
) -> bool {
    mac(secret, SHM_CLIENT_LABEL, server_nonce, client_nonce)
        .verify_slice(proof)
        .is_ok()
}

/// Constant-time check of a [`shm_server_proof`].
pub fn verify_shm_server(
    secret: &[u8],
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
    proof: &[u8; MAC_LEN],
) -> bool {
    mac(secret, SHM_SERVER_LABEL, client_nonce, server_nonce)
        .verify_slice(proof)
        .is_ok()
}

/// A data-plane initiator's proof: MAC(secret, data client label, target
/// nonce, initiator nonce), bound to one connection by both nonces.
pub fn data_client_proof(
    secret: &[u8],
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
) -> [u8; MAC_LEN] {
    mac(secret, DATA_CLIENT_LABEL, server_nonce, client_nonce)
        .finalize()
        .into_bytes()
        .into()
}

/// A data-plane target's proof: MAC(secret, data server label, initiator
/// nonce, target nonce).
pub fn data_server_proof(
    secret: &[u8],
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
) -> [u8; MAC_LEN] {
    mac(secret, DATA_SERVER_LABEL, client_nonce, server_nonce)
        .finalize()
        .into_bytes()
        .into()
}

/// Constant-time check of a data-plane initiator's proof.
pub fn verify_data_client(
    secret: &[u8],
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
    proof: &[u8; MAC_LEN],
) -> bool {
    mac(secret, DATA_CLIENT_LABEL, server_nonce, client_nonce)
        .verify_slice(proof)
        .is_ok()
}

/// Constant-time check of a data-plane target's proof.
pub fn verify_data_server(
    secret: &[u8],
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
    proof: &[u8; MAC_LEN],
) -> bool {
    mac(secret, DATA_SERVER_LABEL, client_nonce, server_nonce)
        .verify_slice(proof)
        .is_ok()
}

/// Channel binding for the shm handout socket: the server nonce folded
/// with what names the socket file the client actually connected through
/// (its device and inode). Both sides feed the result to the `shm_*_proof`
/// functions in place of the server nonce, so proofs relayed by a process
/// listening on another socket under the segment's name verify on neither
/// side.
pub fn shm_bound_nonce(server_nonce: &[u8; NONCE_LEN], binding: &[u8]) -> [u8; NONCE_LEN] {
    use sha2::Digest;
    let mut h = Sha256::new();
    h.update(b"tent-shm-channel-binding-v1");
    h.update(server_nonce);
    h.update((binding.len() as u64).to_le_bytes());
    h.update(binding);
    h.finalize().into()
}

/// A fresh random nonce from the kernel.
pub fn nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    let mut filled = 0;
    while filled < NONCE_LEN {
        // SAFETY: getrandom writes at most the given length into a valid buffer.
        let r = unsafe { libc::getrandom(n[filled..].as_mut_ptr().cast(), NONCE_LEN - filled, 0) };
        if r > 0 {
            filled += r as usize;
        } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            panic!("getrandom failed: {}", std::io::Error::last_os_error());
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_bind_secret_role_and_nonces() {
        let (s, c) = (nonce(), nonce());
        assert_ne!(s, c);
        let p = client_proof(b"0123456789abcdef", &s, &c);
        assert!(verify_client(b"0123456789abcdef", &s, &c, &p));
        assert!(!verify_client(b"0123456789abcdeX", &s, &c, &p));
        assert!(!verify_client(b"0123456789abcdef", &c, &s, &p));
        assert!(
            !verify_server(b"0123456789abcdef", &s, &c, &p),
            "roles differ"
        );
        let q = server_proof(b"0123456789abcdef", &s, &c);
        assert!(verify_server(b"0123456789abcdef", &s, &c, &q));
    }

    #[test]
    fn shm_proofs_do_not_open_the_control_door() {
        let (s, c, k) = (nonce(), nonce(), b"0123456789abcdef");
        let p = shm_client_proof(k, &s, &c);
        assert!(verify_shm_client(k, &s, &c, &p));
        assert!(!verify_client(k, &s, &c, &p), "labels differ");
        assert!(!verify_shm_client(k, &s, &c, &client_proof(k, &s, &c)));
        let q = shm_server_proof(k, &s, &c);
        assert!(verify_shm_server(k, &s, &c, &q));
        assert!(!verify_server(k, &s, &c, &q));
        assert!(!verify_shm_server(k, &s, &c, &p), "roles differ");
    }

    #[test]
    fn control_and_data_proofs_do_not_stand_in_for_each_other() {
        let (s, c) = (nonce(), nonce());
        let k = b"0123456789abcdef";
        let control = client_proof(k, &s, &c);
        assert!(!verify_data_client(k, &s, &c, &control));
        let data = data_client_proof(k, &s, &c);
        assert!(verify_data_client(k, &s, &c, &data));
        assert!(!verify_client(k, &s, &c, &data));
        assert!(!verify_shm_client(k, &s, &c, &data));
        assert!(!verify_data_server(k, &s, &c, &data), "roles differ");
        assert!(!verify_data_server(k, &s, &c, &server_proof(k, &s, &c)));
        assert!(verify_data_server(k, &s, &c, &data_server_proof(k, &s, &c)));
    }

    #[test]
    fn shm_bound_nonce_binds_the_socket_file() {
        let s = nonce();
        let a = shm_bound_nonce(&s, &[1, 2]);
        assert_eq!(a, shm_bound_nonce(&s, &[1, 2]));
        assert_ne!(a, shm_bound_nonce(&s, &[1, 3]));
        assert_ne!(a, shm_bound_nonce(&nonce(), &[1, 2]));
        assert_ne!(a, s);
    }
}
