//! Control-plane codec under arbitrary bytes: `decode` and `read_message`
//! must never panic, must agree with each other, whatever decodes must
//! survive an encode/decode round trip unchanged (encoding is canonical),
//! and a decoded `QpConnect` names an initiator within the responder's key
//! bounds (`QpInitiator::new` takes it).
#![no_main]

use std::io::Cursor;

use libfuzzer_sys::fuzz_target;
use tent::control::wire::{Message, QpInitiator, decode, encode, read_message};

fuzz_target!(|data: &[u8]| {
    let decoded = decode(data);
    let mut cursor = Cursor::new(data);
    let read = read_message(&mut cursor);

    match (&decoded, &read) {
        (Ok((msg, used)), Ok(streamed)) => {
            assert!(*used <= data.len(), "used {used} of {} bytes", data.len());
            assert_eq!(msg, streamed, "decode and read_message differ");
            // read_message consumes exactly one frame, as decode reports.
            assert_eq!(cursor.position(), *used as u64, "stream consumed a different length");
        }
        (Err(_), Err(_)) => {}
        _ => panic!("decode and read_message disagree: {decoded:?} vs {read:?}"),
    }

    if let Ok((Message::QpConnect(r), _)) = &decoded {
        let i = r.initiator;
        assert!(
            QpInitiator::new(i.engine(), i.worker(), i.rail()).is_ok(),
            "decoded an initiator out of bounds: {i:?}"
        );
    }

    if let Ok((msg, _)) = decoded {
        let bytes = encode(&msg);
        let (again, used) = match decode(&bytes) {
            Ok(v) => v,
            Err(e) => panic!("the encoding of a decoded {msg:?} does not decode: {e}"),
        };
        assert_eq!(used, bytes.len(), "re-decode took {used} of {} bytes", bytes.len());
        assert_eq!(again, msg, "round trip changed the message");
        assert_eq!(encode(&again), bytes, "encoding is not canonical");
    }
});
