//! Data-plane frame headers under arbitrary bytes: every `decode` that
//! succeeds must round-trip through `encode`, and no decoded length may
//! exceed `MAX_OP_LEN`. Each decoder reads the input's first bytes (padded
//! with zeros when short), so one input exercises all of them: request,
//! fence and what the target reads after the handshake (`Inbound`: one or
//! the other, by magic), response, the v3 hello (header alone and whole,
//! with the initiator's ident) and the proof frame of the authenticated
//! handshake.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tent::transport::tcp::frame::{
    Fence, HELLO_HEADER_LEN, HELLO_LEN, Hello, Inbound, MAX_OP_LEN, PROOF_LEN, Proof,
    REQUEST_LEN, RESPONSE_LEN, Request, Response,
};

fn prefix<const N: usize>(data: &[u8]) -> [u8; N] {
    let mut b = [0u8; N];
    let n = data.len().min(N);
    b[..n].copy_from_slice(&data[..n]);
    b
}

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = Request::decode(&prefix::<REQUEST_LEN>(data)) {
        assert!(req.len <= MAX_OP_LEN, "request len {} above MAX_OP_LEN", req.len);
        assert_eq!(Request::decode(&req.encode()), Ok(req), "request round trip");
    }
    let head = prefix::<REQUEST_LEN>(data);
    if let Ok(fence) = Fence::decode(&head) {
        assert_eq!(Fence::decode(&fence.encode()), Ok(fence), "fence round trip");
        assert_eq!(fence.encode(), head, "a fence has one encoding");
    }
    match Inbound::decode(&head) {
        Ok(Inbound::Request(req)) => {
            assert_eq!(Request::decode(&head), Ok(req), "inbound request = request");
        }
        Ok(Inbound::Fence(fence)) => {
            assert_eq!(Fence::decode(&head), Ok(fence), "inbound fence = fence");
        }
        Err(_) => assert!(
            Request::decode(&head).is_err() && Fence::decode(&head).is_err(),
            "inbound refuses only what both refuse"
        ),
    }
    if let Ok(resp) = Response::decode(&prefix::<RESPONSE_LEN>(data)) {
        assert!(resp.len <= MAX_OP_LEN, "response len {} above MAX_OP_LEN", resp.len);
        assert_eq!(Response::decode(&resp.encode()), Ok(resp), "response round trip");
    }
    if let Ok(hello) = Hello::decode(&prefix::<HELLO_LEN>(data)) {
        assert_eq!(Hello::decode(&hello.encode()), Ok(hello), "hello round trip");
        let head = prefix::<HELLO_HEADER_LEN>(data);
        assert_eq!(
            Hello::decode_header(&head),
            Ok((hello.status, hello.flags)),
            "the header alone says what the whole hello says"
        );
    } else {
        assert!(
            Hello::decode_header(&prefix::<HELLO_HEADER_LEN>(data)).is_err(),
            "a hello refused whole is refused by its header"
        );
    }
    if let Ok(proof) = Proof::decode(&prefix::<PROOF_LEN>(data)) {
        assert_eq!(Proof::decode(&proof.encode()), Ok(proof), "proof round trip");
    }
});
