use super::field::{Body, len_u32};
use super::*;
use proptest::prelude::*;

/// Typed writers for hand-built frames: inputs `encode` never makes.
impl Body {
    fn u8(&mut self, tag: u16, v: u8) {
        self.field(tag, &[v]);
    }

    fn u16(&mut self, tag: u16, v: u16) {
        self.field(tag, &v.to_le_bytes());
    }

    fn u32(&mut self, tag: u16, v: u32) {
        self.field(tag, &v.to_le_bytes());
    }

    fn u64(&mut self, tag: u16, v: u64) {
        self.field(tag, &v.to_le_bytes());
    }

    fn str(&mut self, tag: u16, v: &str) {
        self.field(tag, v.as_bytes());
    }
}

/// A QP bootstrap's fields, as `QpConnect` and `QpAccept` carry them.
fn encode_qp(b: &mut Body, qp: &QpBootstrap) {
    field::Schema::put(qp, b);
}

/// The module docs' tag table is the one the declarations render: a field,
/// message or record added, changed or removed in `message.rs` fails here
/// until the docs say so too.
#[test]
fn the_tag_table_in_the_docs_is_the_declarations() {
    let docs: Vec<&str> = include_str!("mod.rs")
        .lines()
        .filter_map(|l| l.strip_prefix("//! |"))
        .collect();
    let rendered = table::render();
    let rendered: Vec<&str> = rendered
        .iter()
        .map(|l| l.strip_prefix('|').expect("a table line"))
        .collect();
    assert!(
        docs == rendered,
        "the tag table in wire/mod.rs is not the declarations'; it should read:\n{}",
        rendered
            .iter()
            .map(|l| format!("//! |{l}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Every declaration lists its fields in tag order (so encoding is
/// canonical and no tag is declared twice), below the tags reserved for
/// tests' newer-peer fields; each message type has one number.
#[test]
fn declarations_are_in_tag_order() {
    fn check(owner: &str, rows: &[table::Row]) {
        for pair in rows.windows(2) {
            assert!(
                pair[0].tag < pair[1].tag,
                "{owner}: {} ({:#06x}) before {} ({:#06x})",
                pair[0].constant,
                pair[0].tag,
                pair[1].constant,
                pair[1].tag
            );
        }
        for row in rows {
            assert!(row.tag != 0 && row.tag < 0x8000, "{owner}: {}", row.constant);
        }
    }
    let messages = message::message_rows();
    let mut records = Vec::new();
    for (name, _, rows) in &messages {
        check(name, rows);
        records.extend(rows.iter().filter_map(|r| r.record));
    }
    let mut seen = std::collections::BTreeSet::new();
    while let Some(record) = records.pop() {
        if seen.insert(record.name) {
            let rows = (record.rows)();
            check(record.name, &rows);
            records.extend(rows.iter().filter_map(|r| r.record));
        }
    }
    let types: std::collections::BTreeSet<u16> = messages.iter().map(|m| m.1).collect();
    assert_eq!(types.len(), messages.len(), "type numbers are distinct");
    assert_eq!(types, (1..=TYPE_LAST).collect(), "types are 1..=TYPE_LAST");
}


fn region(i: u32) -> RegionEntry {
    RegionEntry {
        id: i,
        addr: 0x7f00_0000_0000 + u64::from(i) * 4096,
        len: 4096,
        key: u64::from(i) ^ 0xdead_beef,
        rkeys: Vec::new(),
        mr_step: None,
        chunk_rkeys: Vec::new(),
    }
}

fn small_descriptor() -> SegmentDescriptor {
    SegmentDescriptor {
        name: "10.0.0.1:17777".into(),
        host_id: "host-a".into(),
        pid: 4242,
        shm_name: Some("/tent-4242".into()),
        regions: vec![region(1), region(2)],
        transports: vec![0, 1],
        rails: vec![RailEntry {
            name: "mlx5_0".into(),
            addr: "fe80::1".into(),
        }],
        nics: vec![
            NicEntry {
                name: "mlx5_0".into(),
                gid: [0xfe; 16],
                lid: 0,
                mtu: 3,
                gid_type: Some(2),
                prefix: Some(120),
            },
            NicEntry {
                name: "mlx5_1".into(),
                gid: [7; 16],
                lid: 12,
                mtu: 5,
                gid_type: None,
                prefix: None,
            },
        ],
        regions_version: 9,
        regions_from: Some(0x7000_0000),
        metrics_url: Some("http://10.0.0.1:9464".into()),
        incarnation: 0x1234_5678_9abc_def0,
        published_as: Some("prefill-0".into()),
    }
    .with_rkeys()
}

impl SegmentDescriptor {
    /// Give every region an rkey per NIC.
    fn with_rkeys(mut self) -> Self {
        let n = self.nics.len() as u32;
        for r in &mut self.regions {
            r.rkeys = (0..n).map(|k| r.id * 100 + k).collect();
        }
        self
    }
}

fn full_descriptor() -> SegmentDescriptor {
    SegmentDescriptor {
        name: "n".repeat(MAX_NAME),
        host_id: "h".repeat(MAX_NAME),
        pid: u32::MAX,
        shm_name: Some("s".repeat(MAX_SHM_NAME)),
        regions: (0..MAX_REGIONS as u32).map(region).collect(),
        transports: (0..MAX_TRANSPORTS as u8).collect(),
        rails: (0..MAX_RAILS)
            .map(|i| RailEntry {
                name: format!("{i:0>width$}", width = MAX_RAIL_FIELD),
                addr: "a".repeat(MAX_RAIL_FIELD),
            })
            .collect(),
        nics: Vec::new(),
        regions_version: u64::MAX,
        regions_from: Some(u64::MAX),
        metrics_url: Some("u".repeat(MAX_NAME)),
        incarnation: u64::MAX,
        published_as: Some("p".repeat(MAX_NAME)),
    }
}

fn all_messages() -> Vec<Message> {
    vec![
        Message::Hello {
            nonce: [1; NONCE_LEN],
        },
        Message::Challenge {
            nonce: [2; NONCE_LEN],
            auth_required: true,
        },
        Message::Challenge {
            nonce: [3; NONCE_LEN],
            auth_required: false,
        },
        Message::Auth { mac: [4; MAC_LEN] },
        Message::AuthOk { mac: [5; MAC_LEN] },
        Message::GetDescriptor,
        Message::Descriptor(SegmentDescriptor {
            name: "x".into(),
            ..Default::default()
        }),
        Message::Descriptor(small_descriptor()),
        Message::QpConnect(qp_request()),
        Message::QpConnect(QpRequest {
            initiator: QpInitiator::new(u64::MAX, MAX_QP_WORKERS - 1, MAX_QP_RAILS - 1)
                .unwrap(),
            ..qp_request()
        }),
        Message::QpAccept {
            qp: QpBootstrap {
                gid: [4; 16],
                lid: 9,
                qpn: 0x22,
                psn: 1,
                mtu: 5,
            },
        },
        Message::Notify(notify_frame()),
        Message::Notify(NotifyFrame {
            name: String::new(),
            msg: Vec::new(),
            ..notify_frame()
        }),
        Message::Notify(NotifyFrame {
            to: 0x5eed_0000_0000_0001,
            ..notify_frame()
        }),
        Message::NotifyAck { seq: 3 },
        Message::GetRegions { from: 0 },
        Message::Regions(RegionsPage::default()),
        Message::Regions(RegionsPage {
            version: 7,
            regions: vec![region(1), region(2)],
            from: Some(1 << 40),
        }),
        Message::Error {
            code: 7,
            text: "access denied".into(),
        },
        Message::Error {
            code: 0,
            text: String::new(),
        },
    ]
}

/// A frame around a hand-built body, for inputs `encode` never makes.
fn notify_frame() -> NotifyFrame {
    NotifyFrame {
        sender: 0xfeed,
        from: "127.0.0.1:4000".into(),
        seq: 1,
        name: "kv-ready".into(),
        msg: vec![0xab; MAX_NOTIFY_MSG],
        resend_ms: 30_000,
        to: 0,
    }
}

/// A notification as a hostile peer writes it: every limit and
/// required field is checked before anything is kept.
#[test]
fn notify_limits_and_required_fields() {
    let full = |f: &dyn Fn(&mut Body)| {
        frame(TYPE_NOTIFY, |b| {
            b.u64(NOTIFY_SENDER, 1);
            b.str(NOTIFY_FROM, "a");
            b.u64(NOTIFY_SEQ, 1);
            b.str(NOTIFY_NAME, "n");
            f(b);
        })
    };
    assert!(matches!(
        decode_err(&full(&|b| b.field(NOTIFY_MSG, &[0; MAX_NOTIFY_MSG + 1]))),
        WireError::TooLarge {
            max: MAX_NOTIFY_MSG,
            ..
        }
    ));
    assert!(matches!(
        decode_err(&full(&|_| {})),
        WireError::MissingField {
            tag: NOTIFY_MSG,
            ..
        }
    ));
    let long_name = frame(TYPE_NOTIFY, |b| {
        b.u64(NOTIFY_SENDER, 1);
        b.str(NOTIFY_FROM, "a");
        b.u64(NOTIFY_SEQ, 1);
        b.field(NOTIFY_NAME, &[b'x'; MAX_NOTIFY_NAME + 1]);
        b.field(NOTIFY_MSG, &[]);
    });
    assert!(matches!(
        decode_err(&long_name),
        WireError::TooLarge {
            max: MAX_NOTIFY_NAME,
            ..
        }
    ));
    for zero in [NOTIFY_SENDER, NOTIFY_SEQ] {
        let bytes = frame(TYPE_NOTIFY, |b| {
            b.u64(NOTIFY_SENDER, u64::from(zero != NOTIFY_SENDER));
            b.str(NOTIFY_FROM, "a");
            b.u64(NOTIFY_SEQ, u64::from(zero != NOTIFY_SEQ));
            b.str(NOTIFY_NAME, "n");
            b.field(NOTIFY_MSG, &[]);
        });
        assert!(
            matches!(decode_err(&bytes), WireError::BadField { tag, .. } if tag == zero),
            "a zero field {zero:#x} is refused"
        );
    }
    // A newer peer's extra field is skipped.
    let extra = full(&|b| {
        b.field(NOTIFY_MSG, b"m");
        b.u64(0x8000, 5);
    });
    assert!(matches!(decode(&extra), Ok((Message::Notify(n), _)) if n.msg == b"m"));
}

fn frame(msg_type: u16, fill: impl FnOnce(&mut Body)) -> Vec<u8> {
    let mut b = Body(Vec::new());
    fill(&mut b);
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    out.extend_from_slice(&msg_type.to_le_bytes());
    out.extend_from_slice(&len_u32(b.0.len()).to_le_bytes());
    out.extend_from_slice(&b.0);
    out
}

fn decode_err(bytes: &[u8]) -> WireError {
    match decode(bytes) {
        Ok((m, _)) => panic!("decoded {m:?}, expected an error"),
        Err(e) => e,
    }
}

fn roundtrip(msg: &Message) {
    let bytes = encode(msg);
    let (back, used) = decode(&bytes).unwrap();
    assert_eq!(&back, msg);
    assert_eq!(used, bytes.len());
    assert_eq!(&read_message(&mut bytes.as_slice()).unwrap(), msg);
    assert_eq!(encode(&back), bytes, "canonical");
}

#[test]
fn every_variant_round_trips() {
    for m in all_messages() {
        roundtrip(&m);
    }
}

#[test]
fn full_descriptor_round_trips_within_max_body() {
    let msg = Message::Descriptor(full_descriptor());
    let bytes = encode(&msg);
    assert!(
        bytes.len() - HEADER_LEN <= MAX_BODY as usize,
        "a full descriptor must fit: {}",
        bytes.len()
    );
    roundtrip(&msg);
}

#[test]
fn type_codes_and_names_are_distinct() {
    let msgs = all_messages();
    for m in &msgs {
        let bytes = encode(m);
        assert_eq!(u16::from_le_bytes([bytes[6], bytes[7]]), m.type_code());
    }
    let mut names: Vec<_> = msgs.iter().map(|m| (m.type_code(), m.name())).collect();
    names.dedup();
    assert_eq!(names.len(), 13);
}

#[test]
fn consecutive_frames_decode_one_at_a_time() {
    let mut stream = encode(&Message::GetDescriptor);
    stream.extend(encode(&Message::Auth { mac: [9; MAC_LEN] }));
    let (first, used) = decode(&stream).unwrap();
    assert_eq!(first, Message::GetDescriptor);
    let (second, _) = decode(&stream[used..]).unwrap();
    assert_eq!(second, Message::Auth { mac: [9; MAC_LEN] });
    let mut r = stream.as_slice();
    assert_eq!(read_message(&mut r).unwrap(), Message::GetDescriptor);
    assert_eq!(
        read_message(&mut r).unwrap(),
        Message::Auth { mac: [9; MAC_LEN] }
    );
    assert!(matches!(
        read_message(&mut r),
        Err(WireError::Truncated {
            need: HEADER_LEN,
            have: 0
        })
    ));
}

#[test]
fn every_strict_prefix_is_truncated() {
    for m in all_messages() {
        let bytes = encode(&m);
        for n in 0..bytes.len() {
            match decode(&bytes[..n]) {
                Err(WireError::Truncated { have, need }) => {
                    assert_eq!(have, n);
                    assert!(need > n);
                }
                other => panic!("{} prefix {n}: {other:?}", m.name()),
            }
            match read_message(&mut &bytes[..n]) {
                Err(WireError::Truncated { have, .. }) => assert_eq!(have, n),
                other => panic!("{} prefix {n} (read): {other:?}", m.name()),
            }
        }
    }
}

/// Fails the test if anything past the header is read.
struct HeaderOnly {
    header: [u8; HEADER_LEN],
    pos: usize,
}

impl Read for HeaderOnly {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(rest) = self.header.get(self.pos..).filter(|r| !r.is_empty()) else {
            return Err(io::Error::other("read past the header"));
        };
        let n = rest.len().min(buf.len()).min(5); // short reads on purpose
        buf[..n].copy_from_slice(&rest[..n]);
        self.pos += n;
        Ok(n)
    }
}

#[test]
fn oversized_body_is_refused_from_the_header_alone() {
    let mut header = [0u8; HEADER_LEN];
    header[..4].copy_from_slice(&MAGIC);
    header[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    header[6..8].copy_from_slice(&TYPE_DESCRIPTOR.to_le_bytes());
    header[8..].copy_from_slice(&(MAX_BODY + 1).to_le_bytes());
    let mut r = HeaderOnly { header, pos: 0 };
    match read_message(&mut r) {
        Err(WireError::TooLarge {
            what: "message body",
            len,
            max,
        }) => {
            assert_eq!(len, MAX_BODY as usize + 1);
            assert_eq!(max, MAX_BODY as usize);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(r.pos, HEADER_LEN);
    assert!(matches!(decode(&header), Err(WireError::TooLarge { .. })));
    // At exactly MAX_BODY the header is fine and the body is awaited.
    header[8..].copy_from_slice(&MAX_BODY.to_le_bytes());
    assert!(matches!(decode(&header), Err(WireError::Truncated { .. })));
}

#[test]
fn interrupted_reads_are_retried() {
    struct Flaky<'a>(&'a [u8], bool);
    impl Read for Flaky<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.1 = !self.1;
            if self.1 {
                return Err(io::ErrorKind::Interrupted.into());
            }
            let n = self.0.len().min(buf.len()).min(3);
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }
    let msg = Message::Descriptor(small_descriptor());
    let bytes = encode(&msg);
    assert_eq!(read_message(&mut Flaky(&bytes, false)).unwrap(), msg);
}

#[test]
fn write_message_writes_the_encoding() {
    let msg = Message::Challenge {
        nonce: [8; NONCE_LEN],
        auth_required: true,
    };
    let mut out = Vec::new();
    write_message(&mut out, &msg).unwrap();
    assert_eq!(out, encode(&msg));
}

#[test]
fn bad_header_fields() {
    let good = encode(&Message::GetDescriptor);

    let mut b = good.clone();
    b[..4].copy_from_slice(b"HTTP");
    assert!(matches!(decode_err(&b), WireError::BadMagic(m) if &m == b"HTTP"));
    assert!(matches!(
        read_message(&mut b.as_slice()),
        Err(WireError::BadMagic(_))
    ));

    let mut b = good.clone();
    b[4..6].copy_from_slice(&2u16.to_le_bytes());
    assert!(matches!(decode_err(&b), WireError::UnsupportedVersion(2)));
    assert!(matches!(
        read_message(&mut b.as_slice()),
        Err(WireError::UnsupportedVersion(2))
    ));

    for t in [0u16, TYPE_LAST + 1, 0x8000, u16::MAX] {
        let mut b = good.clone();
        b[6..8].copy_from_slice(&t.to_le_bytes());
        assert!(matches!(decode_err(&b), WireError::UnknownMessage(x) if x == t));
        assert!(
            matches!(read_message(&mut b.as_slice()), Err(WireError::UnknownMessage(x)) if x == t)
        );
    }
}

#[test]
fn newer_peer_fields_are_skipped() {
    // A newer peer adds per-rail QP bootstrap data at the top level and
    // inside records, interleaved with the fields this side knows (the
    // NIC list and rkeys are left out here: this frame is hand-built).
    let mut expected = small_descriptor();
    expected.nics.clear();
    (expected.regions_version, expected.regions_from) = (0, None);
    expected.metrics_url = None;
    expected.incarnation = 0;
    expected.published_as = None;
    for r in &mut expected.regions {
        r.rkeys.clear();
    }
    let bytes = frame(TYPE_DESCRIPTOR, |b| {
        b.field(0x8001, b"future top-level field");
        b.str(DESC_NAME, &expected.name);
        b.str(DESC_HOST_ID, &expected.host_id);
        b.record(0x8002, |b| {
            b.field(0x0001, &[0xfe; 16]); // GID
            b.u32(0x0002, 0x1234); // QPN
            b.u32(0x0003, 0x5678); // PSN
            b.u32(0x0004, 4096); // MTU
        });
        b.u32(DESC_PID, expected.pid);
        b.str(DESC_SHM_NAME, expected.shm_name.as_deref().unwrap());
        for r in &expected.regions {
            b.record(DESC_REGION, |b| {
                b.record(0x8000, |b| b.u32(0x0002, 99)); // nested QP info
                b.u32(REGION_ID, r.id);
                b.u64(REGION_ADDR, r.addr);
                b.field(0x8003, &[]);
                b.u64(REGION_LEN, r.len);
                b.u64(REGION_KEY, r.key);
                b.field(0x8003, &[1, 2, 3]); // unknown tags may repeat
            });
        }
        for &t in &expected.transports {
            b.u8(DESC_TRANSPORT, t);
        }
        for rail in &expected.rails {
            b.record(DESC_RAIL, |b| {
                b.str(RAIL_NAME, &rail.name);
                b.field(0x8004, &0x1234u32.to_le_bytes()); // QPN
                b.str(RAIL_ADDR, &rail.addr);
            });
        }
        b.field(0xffff, &[0; 100]);
    });
    let (msg, used) = decode(&bytes).unwrap();
    assert_eq!(used, bytes.len());
    assert_eq!(msg, Message::Descriptor(expected.clone()));
    assert_eq!(
        read_message(&mut bytes.as_slice()).unwrap(),
        Message::Descriptor(expected)
    );

    // Every message type tolerates extra fields, GetDescriptor included.
    let get = frame(TYPE_GET_DESCRIPTOR, |b| b.u64(0x8000, 1));
    assert_eq!(decode(&get).unwrap().0, Message::GetDescriptor);
    let hello = frame(TYPE_HELLO, |b| {
        b.field(0x9000, b"x");
        b.field(HELLO_NONCE, &[6; NONCE_LEN]);
    });
    assert_eq!(
        decode(&hello).unwrap().0,
        Message::Hello {
            nonce: [6; NONCE_LEN]
        }
    );
}

fn descriptor_frame(skip_tag: Option<u16>, extra: impl FnOnce(&mut Body)) -> Vec<u8> {
    frame(TYPE_DESCRIPTOR, |b| {
        if skip_tag != Some(DESC_NAME) {
            b.str(DESC_NAME, "seg");
        }
        if skip_tag != Some(DESC_HOST_ID) {
            b.str(DESC_HOST_ID, "host");
        }
        if skip_tag != Some(DESC_PID) {
            b.u32(DESC_PID, 1);
        }
        extra(b);
    })
}

#[test]
fn missing_required_fields() {
    assert!(decode(&descriptor_frame(None, |_| {})).is_ok());
    for tag in [DESC_NAME, DESC_HOST_ID, DESC_PID] {
        let e = decode_err(&descriptor_frame(Some(tag), |_| {}));
        assert!(
            matches!(e, WireError::MissingField { msg: "Descriptor", tag: t } if t == tag),
            "{e:?}"
        );
    }
    let e = decode_err(&frame(TYPE_CHALLENGE, |b| {
        b.field(CHALLENGE_NONCE, &[0; NONCE_LEN])
    }));
    assert!(matches!(
        e,
        WireError::MissingField {
            msg: "Challenge",
            tag: CHALLENGE_AUTH_REQUIRED
        }
    ));
    let e = decode_err(&frame(TYPE_AUTH, |_| {}));
    assert!(matches!(
        e,
        WireError::MissingField {
            msg: "Auth",
            tag: AUTH_MAC
        }
    ));
    let e = decode_err(&frame(TYPE_ERROR, |b| b.u16(ERROR_CODE, 1)));
    assert!(matches!(
        e,
        WireError::MissingField {
            msg: "Error",
            tag: ERROR_TEXT
        }
    ));
    let e = decode_err(&descriptor_frame(None, |b| {
        b.record(DESC_REGION, |b| {
            b.u32(REGION_ID, 1);
            b.u64(REGION_ADDR, 2);
            b.u64(REGION_LEN, 3);
        })
    }));
    assert!(
        matches!(
            e,
            WireError::MissingField {
                msg: "RegionEntry",
                tag: REGION_KEY
            }
        ),
        "{e:?}"
    );
    let e = decode_err(&descriptor_frame(None, |b| {
        b.record(DESC_RAIL, |b| b.str(RAIL_NAME, "mlx5_0"))
    }));
    assert!(
        matches!(
            e,
            WireError::MissingField {
                msg: "RailEntry",
                tag: RAIL_ADDR
            }
        ),
        "{e:?}"
    );
}

#[test]
fn duplicate_fields() {
    let e = decode_err(&descriptor_frame(None, |b| b.str(DESC_NAME, "again")));
    assert!(
        matches!(e, WireError::DuplicateField { tag: DESC_NAME }),
        "{e:?}"
    );
    let e = decode_err(&descriptor_frame(None, |b| {
        b.str(DESC_SHM_NAME, "/a");
        b.str(DESC_SHM_NAME, "/b");
    }));
    assert!(
        matches!(e, WireError::DuplicateField { tag: DESC_SHM_NAME }),
        "{e:?}"
    );
    let e = decode_err(&frame(TYPE_HELLO, |b| {
        b.field(HELLO_NONCE, &[0; NONCE_LEN]);
        b.field(HELLO_NONCE, &[0; NONCE_LEN]);
    }));
    assert!(matches!(e, WireError::DuplicateField { tag: HELLO_NONCE }));
    let e = decode_err(&descriptor_frame(None, |b| {
        b.record(DESC_REGION, |b| {
            b.u32(REGION_ID, 1);
            b.u32(REGION_ID, 1);
        })
    }));
    assert!(
        matches!(e, WireError::DuplicateField { tag: REGION_ID }),
        "{e:?}"
    );
    // List fields repeat by design.
    let (msg, _) = decode(&descriptor_frame(None, |b| {
        b.u8(DESC_TRANSPORT, 1);
        b.u8(DESC_TRANSPORT, 1);
    }))
    .unwrap();
    assert!(matches!(msg, Message::Descriptor(d) if d.transports == [1, 1]));
}

#[test]
fn malformed_values() {
    let bool2 = frame(TYPE_CHALLENGE, |b| {
        b.field(CHALLENGE_NONCE, &[0; NONCE_LEN]);
        b.field(CHALLENGE_AUTH_REQUIRED, &[2]);
    });
    assert!(matches!(
        decode_err(&bool2),
        WireError::BadField {
            tag: CHALLENGE_AUTH_REQUIRED,
            ..
        }
    ));

    let bad_utf8 =
        descriptor_frame(Some(DESC_NAME), |b| b.field(DESC_NAME, &[b'a', 0xff, 0xfe]));
    assert!(matches!(
        decode_err(&bad_utf8),
        WireError::BadField { tag: DESC_NAME, .. }
    ));
    let bad_utf8 = frame(TYPE_ERROR, |b| {
        b.u16(ERROR_CODE, 1);
        b.field(ERROR_TEXT, &[0xc3]);
    });
    assert!(matches!(
        decode_err(&bad_utf8),
        WireError::BadField {
            tag: ERROR_TEXT,
            ..
        }
    ));

    let short_nonce = frame(TYPE_HELLO, |b| b.field(HELLO_NONCE, &[0; NONCE_LEN - 1]));
    assert!(matches!(
        decode_err(&short_nonce),
        WireError::BadField {
            tag: HELLO_NONCE,
            ..
        }
    ));
    let long_mac = frame(TYPE_AUTH_OK, |b| b.field(AUTH_OK_MAC, &[0; MAC_LEN + 1]));
    assert!(matches!(
        decode_err(&long_mac),
        WireError::BadField {
            tag: AUTH_OK_MAC,
            ..
        }
    ));
    let wide_pid = descriptor_frame(Some(DESC_PID), |b| b.u64(DESC_PID, 1));
    assert!(matches!(
        decode_err(&wide_pid),
        WireError::BadField { tag: DESC_PID, .. }
    ));

    let empty_name = descriptor_frame(Some(DESC_NAME), |b| b.str(DESC_NAME, ""));
    assert!(matches!(
        decode_err(&empty_name),
        WireError::BadField { tag: DESC_NAME, .. }
    ));
}

#[test]
fn field_framing_errors() {
    // A field header cut short by the end of the body.
    let cut = frame(TYPE_GET_DESCRIPTOR, |b| {
        b.0.extend_from_slice(&[0x01, 0x80, 0x00])
    });
    assert!(matches!(
        decode_err(&cut),
        WireError::BadField { tag: 0x8001, .. }
    ));
    let cut = frame(TYPE_GET_DESCRIPTOR, |b| b.0.push(7));
    assert!(matches!(
        decode_err(&cut),
        WireError::BadField { tag: 0, .. }
    ));
    // A value claiming more than its record holds, at the top level...
    let over = frame(TYPE_GET_DESCRIPTOR, |b| {
        b.0.extend_from_slice(&0x8000u16.to_le_bytes());
        b.0.extend_from_slice(&u32::MAX.to_le_bytes());
    });
    assert!(matches!(
        decode_err(&over),
        WireError::BadField { tag: 0x8000, .. }
    ));
    // ...and inside a record, even though the frame holds more bytes.
    let over = descriptor_frame(None, |b| {
        b.record(DESC_REGION, |b| {
            b.0.extend_from_slice(&REGION_ID.to_le_bytes());
            b.0.extend_from_slice(&4u32.to_le_bytes());
            b.0.extend_from_slice(&[1, 2]);
        });
        b.field(0x8000, &[0; 64]);
    });
    assert!(matches!(
        decode_err(&over),
        WireError::BadField { tag: REGION_ID, .. }
    ));
}

#[test]
fn limits() {
    let many = descriptor_frame(None, |b| {
        for i in 0..=MAX_REGIONS as u32 {
            b.record(DESC_REGION, |b| {
                let r = region(i);
                b.u32(REGION_ID, r.id);
                b.u64(REGION_ADDR, r.addr);
                b.u64(REGION_LEN, r.len);
                b.u64(REGION_KEY, r.key);
            });
        }
    });
    assert!(many.len() - HEADER_LEN <= MAX_BODY as usize);
    let e = decode_err(&many);
    assert!(
        matches!(e, WireError::TooLarge { what: "region list", len, max: MAX_REGIONS } if len == MAX_REGIONS + 1)
    );

    let e = decode_err(&descriptor_frame(None, |b| {
        for t in 0..=MAX_TRANSPORTS as u8 {
            b.u8(DESC_TRANSPORT, t);
        }
    }));
    assert!(
        matches!(
            e,
            WireError::TooLarge {
                what: "transport list",
                ..
            }
        ),
        "{e:?}"
    );

    let mut d = small_descriptor();
    d.rails = vec![d.rails[0].clone(); MAX_RAILS + 1];
    let e = decode_err(&encode(&Message::Descriptor(d)));
    assert!(
        matches!(
            e,
            WireError::TooLarge {
                what: "rail list",
                ..
            }
        ),
        "{e:?}"
    );

    let cases: Vec<(SegmentDescriptor, &str)> = vec![
        (
            SegmentDescriptor {
                name: "n".repeat(MAX_NAME + 1),
                ..small_descriptor()
            },
            "segment name",
        ),
        (
            SegmentDescriptor {
                host_id: "h".repeat(MAX_NAME + 1),
                ..small_descriptor()
            },
            "host id",
        ),
        (
            SegmentDescriptor {
                shm_name: Some("s".repeat(MAX_SHM_NAME + 1)),
                ..small_descriptor()
            },
            "shm name",
        ),
        (
            SegmentDescriptor {
                rails: vec![RailEntry {
                    name: "r".repeat(MAX_RAIL_FIELD + 1),
                    addr: String::new(),
                }],
                ..small_descriptor()
            },
            "rail name",
        ),
        (
            SegmentDescriptor {
                rails: vec![RailEntry {
                    name: String::new(),
                    addr: "a".repeat(MAX_RAIL_FIELD + 1),
                }],
                ..small_descriptor()
            },
            "rail address",
        ),
    ];
    for (d, expect) in cases {
        let e = decode_err(&encode(&Message::Descriptor(d)));
        assert!(
            matches!(e, WireError::TooLarge { what, .. } if what == expect),
            "{expect}: {e:?}"
        );
    }
    let e = decode_err(&encode(&Message::Error {
        code: 1,
        text: "e".repeat(MAX_MESSAGE_TEXT + 1),
    }));
    assert!(
        matches!(e, WireError::TooLarge { what: "error text", len, .. } if len == MAX_MESSAGE_TEXT + 1)
    );
}

#[test]
fn errors_display() {
    let e = WireError::MissingField {
        msg: "Descriptor",
        tag: 3,
    };
    assert_eq!(e.to_string(), "Descriptor: missing required field 0x0003");
    let e = WireError::BadMagic(*b"HTTP");
    assert!(e.to_string().contains("48"), "{e}");
}

fn arb_rail() -> impl Strategy<Value = RailEntry> {
    // \PC is any non-control char, up to 4 bytes: 16 chars stay within 64 bytes.
    ("\\PC{0,16}", "\\PC{0,16}").prop_map(|(name, addr)| RailEntry { name, addr })
}

#[test]
fn rkey_lists_and_qp_bootstrap_are_checked() {
    let region = |rkeys: &[u8]| {
        frame(TYPE_DESCRIPTOR, |b| {
            b.str(DESC_NAME, "n");
            b.str(DESC_HOST_ID, "h");
            b.u32(DESC_PID, 1);
            b.record(DESC_REGION, |b| {
                b.u32(REGION_ID, 1);
                b.u64(REGION_ADDR, 4096);
                b.u64(REGION_LEN, 4096);
                b.u64(REGION_KEY, 7);
                b.field(REGION_RKEYS, rkeys);
            });
        })
    };
    assert!(matches!(
        decode_err(&region(&[1, 2, 3])),
        WireError::BadField {
            tag: REGION_RKEYS,
            ..
        }
    ));
    assert!(matches!(
        decode_err(&region(&[0; (MAX_NICS + 1) * 4])),
        WireError::BadField {
            tag: REGION_RKEYS,
            ..
        }
    ));
    let Message::Descriptor(d) = decode(&region(&[1, 0, 0, 0, 2, 0, 0, 0])).unwrap().0 else {
        panic!("not a descriptor");
    };
    assert_eq!(d.regions[0].rkeys, vec![1, 2]);
    // A QP bootstrap without its QPN is refused, naming the field.
    let qp = frame(TYPE_QP_ACCEPT, |b| {
        b.field(QP_GID, &[1; 16]);
        b.u16(QP_LID, 0);
        b.u32(QP_PSN, 5);
        b.u32(QP_MTU, 3);
    });
    let e = decode_err(&qp);
    assert!(e.to_string().contains("QpAccept"), "{e}");
}

fn qp_request() -> QpRequest {
    QpRequest {
        initiator: QpInitiator::new(0x1234_5678_9abc_def0, 3, 1).unwrap(),
        initiator_nic: "rxe0".into(),
        target_nic: "rxe1".into(),
        qp: QpBootstrap {
            gid: [3; 16],
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            mtu: 3,
        },
        gid_type: Some(2),
    }
}

/// A hand-built `QpConnect`: NICs and bootstrap, then `extra`.
fn qp_connect_frame(extra: impl FnOnce(&mut Body)) -> Vec<u8> {
    frame(TYPE_QP_CONNECT, |b| {
        b.str(QP_INITIATOR_NIC, "rxe0");
        b.str(QP_TARGET_NIC, "rxe1");
        encode_qp(b, &qp_request().qp);
        extra(b);
    })
}

/// An initiator record of the given raw values (`None`: left out).
fn initiator_record(
    engine: Option<&[u8]>,
    worker: Option<&[u8]>,
    rail: Option<&[u8]>,
) -> impl FnOnce(&mut Body) {
    move |b| {
        b.record(QP_INITIATOR, |b| {
            for (tag, v) in [(QPI_ENGINE, engine), (QPI_WORKER, worker), (QPI_RAIL, rail)] {
                if let Some(v) = v {
                    b.field(tag, v);
                }
            }
        })
    }
}

fn initiator_of(bytes: &[u8]) -> (u64, usize, usize) {
    match decode(bytes).unwrap().0 {
        Message::QpConnect(r) => (
            r.initiator.engine(),
            r.initiator.worker(),
            r.initiator.rail(),
        ),
        m => panic!("decoded {m:?}"),
    }
}

#[test]
fn qp_initiator_round_trips_and_is_required() {
    for (e, w, r) in [(1, 0, 0), (u64::MAX, MAX_QP_WORKERS - 1, MAX_QP_RAILS - 1)] {
        roundtrip(&Message::QpConnect(QpRequest {
            initiator: QpInitiator::new(e, w, r).unwrap(),
            ..qp_request()
        }));
    }
    // As a peer writes it, with a newer peer's field inside the record.
    let bytes = qp_connect_frame(|b| {
        b.record(QP_INITIATOR, |b| {
            b.u64(QPI_ENGINE, 7);
            b.u16(QPI_WORKER, 2);
            b.field(0x8000, b"newer");
            b.u16(QPI_RAIL, 5);
        })
    });
    assert_eq!(initiator_of(&bytes), (7, 2, 5));
    // An older initiator's request, without the record, is refused
    // naming it (never filed under a made-up key).
    let e = decode_err(&qp_connect_frame(|_| {}));
    assert!(
        matches!(
            e,
            WireError::MissingField {
                msg: "QpConnect",
                tag: QP_INITIATOR
            }
        ),
        "{e:?}"
    );
    let (e8, w2, r2) = (7u64.to_le_bytes(), 2u16.to_le_bytes(), 5u16.to_le_bytes());
    for (rec, tag) in [
        (initiator_record(None, Some(&w2), Some(&r2)), QPI_ENGINE),
        (initiator_record(Some(&e8), None, Some(&r2)), QPI_WORKER),
        (initiator_record(Some(&e8), Some(&w2), None), QPI_RAIL),
    ] {
        let e = decode_err(&qp_connect_frame(rec));
        assert!(
            matches!(e, WireError::MissingField { msg: "QpInitiator", tag: t } if t == tag),
            "{e:?}"
        );
    }
}

#[test]
fn qp_initiator_is_checked() {
    let (e8, w2, r2) = (7u64.to_le_bytes(), 2u16.to_le_bytes(), 5u16.to_le_bytes());
    let good = || initiator_record(Some(&e8), Some(&w2), Some(&r2));
    assert_eq!(initiator_of(&qp_connect_frame(good())), (7, 2, 5));
    // Twice: the record, and a field inside it.
    let e = decode_err(&qp_connect_frame(|b| {
        good()(b);
        good()(b);
    }));
    assert!(
        matches!(e, WireError::DuplicateField { tag: QP_INITIATOR }),
        "{e:?}"
    );
    let e = decode_err(&qp_connect_frame(|b| {
        b.record(QP_INITIATOR, |b| {
            b.u64(QPI_ENGINE, 7);
            b.u16(QPI_WORKER, 2);
            b.u16(QPI_RAIL, 5);
            b.u64(QPI_ENGINE, 8);
        })
    }));
    assert!(
        matches!(e, WireError::DuplicateField { tag: QPI_ENGINE }),
        "{e:?}"
    );
    // Wrong widths and out-of-bounds values, each naming its field.
    let (e0, e4) = (0u64.to_le_bytes(), 7u32.to_le_bytes());
    let (w_max, w_wide) = ((MAX_QP_WORKERS as u16).to_le_bytes(), 2u32.to_le_bytes());
    let (r_max, r_all, r_short) = (
        (MAX_QP_RAILS as u16).to_le_bytes(),
        u16::MAX.to_le_bytes(),
        [5u8],
    );
    let cases: [(_, u16); 7] = [
        (
            initiator_record(Some(&e4), Some(&w2), Some(&r2)),
            QPI_ENGINE,
        ),
        (
            initiator_record(Some(&e0), Some(&w2), Some(&r2)),
            QPI_ENGINE,
        ),
        (
            initiator_record(Some(&e8), Some(&w_wide), Some(&r2)),
            QPI_WORKER,
        ),
        (
            initiator_record(Some(&e8), Some(&w_max), Some(&r2)),
            QPI_WORKER,
        ),
        (
            initiator_record(Some(&e8), Some(&w2), Some(&r_short)),
            QPI_RAIL,
        ),
        (
            initiator_record(Some(&e8), Some(&w2), Some(&r_max)),
            QPI_RAIL,
        ),
        (
            initiator_record(Some(&e8), Some(&w2), Some(&r_all)),
            QPI_RAIL,
        ),
    ];
    for (rec, tag) in cases {
        let e = decode_err(&qp_connect_frame(rec));
        assert!(
            matches!(e, WireError::BadField { tag: t, .. } if t == tag),
            "want BadField {tag:#x}: {e:?}"
        );
    }
    // A record whose field claims more bytes than the record holds.
    let e = decode_err(&qp_connect_frame(|b| {
        b.record(QP_INITIATOR, |b| {
            b.0.extend_from_slice(&QPI_ENGINE.to_le_bytes());
            b.0.extend_from_slice(&64u32.to_le_bytes());
            b.0.extend_from_slice(&[1; 8]);
        });
        b.field(0x8000, &[0; 64]);
    }));
    assert!(
        matches!(
            e,
            WireError::BadField {
                tag: QPI_ENGINE,
                ..
            }
        ),
        "{e:?}"
    );
    // In-process keys obey the same bounds.
    assert!(QpInitiator::new(0, 0, 0).is_err());
    assert!(QpInitiator::new(1, MAX_QP_WORKERS, 0).is_err());
    assert!(QpInitiator::new(1, 0, MAX_QP_RAILS).is_err());
    assert!(QpInitiator::new(1, usize::MAX, 0).is_err());
    assert!(
        QpInitiator::new(1, 1 << 16, 0).is_err(),
        "no wrap to worker 0"
    );
    let k = QpInitiator::new(1, MAX_QP_WORKERS - 1, MAX_QP_RAILS - 1).unwrap();
    assert_eq!(
        (k.engine(), k.worker(), k.rail(), k.queue()),
        (1, MAX_QP_WORKERS - 1, MAX_QP_RAILS - 1, 0)
    );
    assert!(k.with_queue(MAX_QP_PER_TRANSFER).is_err());
    assert!(k.with_queue(usize::MAX).is_err());
}

#[test]
fn qp_initiator_queue_round_trips_keys_apart_and_is_checked() {
    let base = QpInitiator::new(9, 3, 2).unwrap();
    let last = base.with_queue(MAX_QP_PER_TRANSFER - 1).unwrap();
    assert_ne!(base, last, "two QPs of one rail are two keys");
    for k in [base, base.with_queue(1).unwrap(), last] {
        roundtrip(&Message::QpConnect(QpRequest {
            initiator: k,
            ..qp_request()
        }));
    }
    // A forged queue index is a bad field, not a wrap to another key;
    // so is a wrong width.
    let (over, wide) = (
        (MAX_QP_PER_TRANSFER as u16).to_le_bytes(),
        1u32.to_le_bytes(),
    );
    for v in [&over[..], &wide[..]] {
        let e = decode_err(&qp_connect_frame(|b| {
            b.record(QP_INITIATOR, |b| {
                b.u64(QPI_ENGINE, 9);
                b.u16(QPI_WORKER, 3);
                b.u16(QPI_RAIL, 2);
                b.field(QPI_QUEUE, v);
            })
        }));
        assert!(
            matches!(e, WireError::BadField { tag: QPI_QUEUE, .. }),
            "{e:?}"
        );
    }
}

#[test]
fn qp_worker_bound_is_the_configs() {
    let cfg = |n: usize| {
        crate::config::Config::from_json_str(
            &format!(r#"{{"workers": {{"count": {n}}}}}"#),
            "t.json",
        )
    };
    assert!(cfg(MAX_QP_WORKERS).is_ok());
    assert!(cfg(MAX_QP_WORKERS + 1).is_err());
}

#[test]
fn qp_queue_bound_is_the_configs() {
    let cfg = |n: usize| {
        crate::config::Config::from_json_str(
            &format!(r#"{{"transports": {{"rdma": {{"qp_per_transfer": {n}}}}}}}"#),
            "t.json",
        )
    };
    assert!(cfg(MAX_QP_PER_TRANSFER).is_ok());
    assert!(cfg(MAX_QP_PER_TRANSFER + 1).is_err());
    assert!(cfg(0).is_err());
}

fn arb_nic() -> impl Strategy<Value = NicEntry> {
    (
        "\\PC{0,16}",
        any::<[u8; 16]>(),
        any::<u16>(),
        any::<u32>(),
        any::<Option<u8>>(),
        proptest::option::of(0u8..=128),
    )
        .prop_map(|(name, gid, lid, mtu, gid_type, prefix)| NicEntry {
            name,
            gid,
            lid,
            mtu,
            gid_type,
            prefix,
        })
}

fn arb_descriptor() -> impl Strategy<Value = SegmentDescriptor> {
    (
        "\\PC{1,64}",
        "\\PC{0,64}",
        any::<u32>(),
        proptest::option::of("\\PC{0,50}"),
        proptest::collection::vec(
            (
                any::<u32>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                proptest::collection::vec(any::<u32>(), 0..=4),
                any::<Option<u64>>(),
                proptest::collection::vec(any::<u32>(), 0..=8),
            )
                .prop_map(|(id, addr, len, key, rkeys, mr_step, chunk_rkeys)| RegionEntry {
                    id,
                    addr,
                    len,
                    key,
                    rkeys,
                    mr_step,
                    chunk_rkeys,
                }),
            0..40,
        ),
        proptest::collection::vec(any::<u8>(), 0..=MAX_TRANSPORTS),
        proptest::collection::vec(arb_rail(), 0..=8),
        proptest::collection::vec(arb_nic(), 0..=4),
    )
        .prop_map(
            |(name, host_id, pid, shm_name, regions, transports, rails, nics)| {
                SegmentDescriptor {
                    name,
                    host_id,
                    pid,
                    shm_name,
                    regions,
                    transports,
                    rails,
                    nics,
                    regions_version: u64::from(pid),
                    regions_from: (pid % 2 == 1).then_some(u64::from(pid) << 12),
                    metrics_url: (pid % 3 == 0).then(|| format!("http://127.0.0.1:{}", pid % 65536)),
                    incarnation: u64::from(pid).rotate_left(17),
                    published_as: (pid % 5 == 0).then(|| format!("seg-{pid}")),
                }
            },
        )
}

proptest! {
    #[test]
    fn descriptors_round_trip(d in arb_descriptor()) {
        let msg = Message::Descriptor(d);
        let bytes = encode(&msg);
        let (back, used) = decode(&bytes).unwrap();
        prop_assert_eq!(used, bytes.len());
        prop_assert_eq!(&back, &msg);
        prop_assert_eq!(encode(&back), bytes);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = decode(&bytes);
        let _ = read_message(&mut bytes.as_slice());
    }

    #[test]
    fn arbitrary_bodies_behind_valid_headers_never_panic(
        msg_type in 0u16..11,
        body in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        let bytes = frame(msg_type, |b| b.0.extend_from_slice(&body));
        let _ = decode(&bytes);
        let _ = read_message(&mut bytes.as_slice());
    }

    #[test]
    fn mutated_frames_never_panic(
        d in arb_descriptor(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let mut bytes = encode(&Message::Descriptor(d));
        for (i, v) in flips {
            let at = i.index(bytes.len());
            bytes[at] = v;
        }
        let _ = decode(&bytes);
        let _ = read_message(&mut bytes.as_slice());
    }
}

/// The seeds `tools/fuzz.sh` starts the `control_decode` target from, by
/// file name: one real encoding of every message type, the records among
/// them (regions with rkeys, rails, NICs, an initiator with a queue).
fn fuzz_seeds() -> Vec<(&'static str, Message)> {
    let bytes: [u8; 32] = std::array::from_fn(|i| i as u8);
    let qp = QpBootstrap {
        gid: [0xfe; 16],
        lid: 0,
        qpn: 0x11,
        psn: 0xabcdef,
        mtu: 3,
    };
    let request = QpRequest {
        initiator: QpInitiator::new(0x1234_5678_90ab_cdef, 3, 1).unwrap(),
        initiator_nic: "rxe0".into(),
        target_nic: "rxe1".into(),
        qp,
        gid_type: Some(2),
    };
    vec![
        ("hello", Message::Hello { nonce: bytes }),
        (
            "challenge",
            Message::Challenge {
                nonce: bytes,
                auth_required: true,
            },
        ),
        ("auth", Message::Auth { mac: bytes }),
        ("auth_ok", Message::AuthOk { mac: bytes }),
        ("get_descriptor", Message::GetDescriptor),
        ("descriptor_rdma", Message::Descriptor(small_descriptor())),
        (
            "error",
            Message::Error {
                code: 3,
                text: "no such segment".into(),
            },
        ),
        ("qp_connect", Message::QpConnect(request.clone())),
        (
            "qp_connect_queue",
            Message::QpConnect(QpRequest {
                initiator: request.initiator.with_queue(2).unwrap(),
                ..request
            }),
        ),
        ("qp_accept", Message::QpAccept { qp }),
        (
            "notify",
            Message::Notify(NotifyFrame {
                msg: b"kv-ready: layer 3".to_vec(),
                ..notify_frame()
            }),
        ),
        ("notify_ack", Message::NotifyAck { seq: 1 }),
        ("get_regions", Message::GetRegions { from: 0x7f00_0000_0000 }),
        (
            "regions",
            Message::Regions(RegionsPage {
                version: 42,
                regions: vec![RegionEntry {
                    id: 3,
                    addr: 0x7f00_0000_0000,
                    len: 16384,
                    key: 0x5eed,
                    rkeys: vec![0x11, 0x22],
                    mr_step: None,
                    chunk_rkeys: Vec::new(),
                }],
                from: Some(0x7f00_0000_4000),
            }),
        ),
    ]
}

/// Each seed above is on disk as `encode` writes it today (stale or
/// missing: `TENT_WRITE_SEEDS=1 cargo test -p tent --lib fuzz_seeds`
/// writes them); every seed on disk, hand-made ones too, decodes whole;
/// together they hold every message type.
#[test]
fn fuzz_seeds_are_real_messages_of_every_type() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/control_decode");
    let write = std::env::var_os("TENT_WRITE_SEEDS").is_some();
    for (name, msg) in fuzz_seeds() {
        let path = dir.join(name);
        let bytes = encode(&msg);
        if write {
            std::fs::write(&path, &bytes).unwrap();
        }
        assert!(
            std::fs::read(&path).is_ok_and(|b| b == bytes),
            "{} is not the encoding of {msg:?}: TENT_WRITE_SEEDS=1 writes it",
            path.display()
        );
    }
    let mut types = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        match decode(&bytes) {
            Ok((msg, used)) if used == bytes.len() => types.insert(msg.type_code()),
            other => panic!("{}: {other:?}", path.display()),
        };
    }
    assert_eq!(types, (1..=TYPE_LAST).collect(), "a seed of every type");
}

/// A NIC record's subnet prefix is at most a GID's 128 bits; absent, it is
/// unknown (an older owner).
#[test]
fn nic_prefix_is_checked_and_optional() {
    let nic = |prefix: Option<u8>| {
        descriptor_frame(None, |b| {
            b.record(DESC_NIC, |b| {
                b.str(NIC_NAME, "mlx5_0");
                b.field(NIC_GID, &[1; 16]);
                b.u16(NIC_LID, 0);
                b.u32(NIC_MTU, 5);
                if let Some(p) = prefix {
                    b.u8(NIC_PREFIX, p);
                }
            })
        })
    };
    let prefix_of = |frame: &[u8]| match decode(frame).unwrap().0 {
        Message::Descriptor(d) => d.nics[0].prefix,
        m => panic!("{m:?}"),
    };
    assert_eq!(prefix_of(&nic(Some(128))), Some(128));
    assert_eq!(prefix_of(&nic(Some(0))), Some(0));
    assert_eq!(prefix_of(&nic(None)), None);
    assert!(matches!(
        decode_err(&nic(Some(129))),
        WireError::BadField {
            tag: NIC_PREFIX,
            ..
        }
    ));
}
