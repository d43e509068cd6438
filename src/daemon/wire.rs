//! The daemon's set-up messages, over its unix socket: a frame is a
//! little-endian `u32` body length, then the body, a tag byte and the
//! message's fields. A descriptor rides with a reply's first byte
//! (`SCM_RIGHTS`). Every frame from the other side is hostile input: the
//! length is bounded before anything is read, a body is exactly its
//! message's size (a name at most [`MAX_NAME`] bytes), and an unknown tag
//! is refused.

use tent_rings::ErrorKind;

use crate::notify::{MAX_NOTIFY_MSG, MAX_NOTIFY_NAME};

/// The layout both sides must agree on: these messages, the rings' and
/// bells' memory. Checked at attach; a mismatch is refused naming both.
pub const LAYOUT_VERSION: u32 = 5;

/// The largest body either side sends or accepts (a notification's
/// message, name and sender fit).
pub(crate) const MAX_BODY: u32 = 8192;
/// The longest segment name a client may ask for.
pub(crate) const MAX_NAME: usize = 512;
/// The longest sender name a `Note` carries: what the control plane
/// takes (`NotifyFrame::from`).
pub(crate) const MAX_NOTE_FROM: usize = crate::control::wire::MAX_NAME;
/// The longest name a client gives (`daemon_client_name`).
pub(crate) const MAX_CLIENT_NAME: usize = 128;
/// The longest message a refusal carries.
pub(crate) const MAX_MESSAGE: usize = 1024;
/// The most regions one `Regions` reply lists (24 bytes each: its body
/// stays under [`MAX_BODY`]); a client asks again from where it stopped.
pub(crate) const MAX_REGIONS: usize = 80;

/// Which memory of a ring a `RingPart` reply hands over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    /// The submission ring (the client produces).
    Sq = 0,
    /// The completion ring (the client consumes).
    Cq = 1,
    /// The bells: the SQ bell word at 0, the CQ bell word at 128.
    Bells = 2,
}

/// A client's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    /// The first message: the layout the client speaks, and the name it
    /// gives (`daemon_client_name`; empty: none).
    Hello {
        version: u32,
        name: String,
    },
    Allocate {
        len: u64,
    },
    OpenSegment {
        name: String,
    },
    CreateRing {
        depth: u32,
    },
    /// Unregister one of the client's regions (once the ops on it end).
    FreeMemory {
        region: u64,
    },
    /// Retire one of the client's rings (`RingPart::ring`).
    CloseRing {
        ring: u32,
    },
    /// Close a segment the client opened (the daemon's own once no
    /// other client holds it).
    CloseSegment {
        segment: u64,
    },
    /// The regions of a segment the client opened, from the `skip`th on.
    SegmentRegions {
        segment: u64,
        skip: u32,
    },
    /// The client is going: `Done` once everything it held is released
    /// (its rings drained, its regions unregistered).
    Detach,
    /// Send a notification to the owner of a segment the client opened
    /// (the client its name ended with, if it named one), as this
    /// client: a `Ticket` at once, its fate by `NotifyOutcome`.
    Notify {
        segment: u64,
        name: String,
        msg: Vec<u8>,
    },
    /// How the notification with this ticket fared: `Done` (delivered; the
    /// ticket is spent), `Pending`, or `Refused` with why it failed.
    NotifyOutcome {
        ticket: u64,
    },
    /// The oldest notification for this client: `Note`, or `Pending` when
    /// none waits.
    TakeNotification,
}

/// One region of a segment, as a `Regions` reply lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RegionEntry {
    pub(crate) id: u64,
    pub(crate) addr: u64,
    pub(crate) len: u64,
}

/// The daemon's reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// With the client's mail page: the word bumped when a notification
    /// for it arrives at 0, when one it sent settles at 64.
    Welcome {
        version: u32,
        client: u32,
        /// Where notifications to this client go: its segment name is the
        /// daemon's, `#`, this in hex.
        mailbox: u64,
        /// The daemon's segment name (what peers open to reach a client's
        /// memory).
        segment: String,
    },
    /// With the region's memfd (its bytes from `data_offset`); `addr`
    /// is where the daemon maps them (what a peer's remote address names).
    Allocated {
        region: u64,
        len: u64,
        data_offset: u64,
        addr: u64,
    },
    Opened {
        segment: u64,
    },
    /// One of three, in `Part` order, each with its memfd; `ring` names
    /// the ring to `CloseRing`.
    RingPart {
        part: Part,
        depth: u32,
        ring: u32,
        /// The daemon's worker serving it.
        worker: u32,
    },
    /// A `FreeMemory`, `CloseRing` or `CloseSegment` is done.
    Done,
    /// Up to [`MAX_REGIONS`] regions from the asked-for one on, of
    /// `total`.
    Regions {
        total: u32,
        regions: Vec<RegionEntry>,
    },
    Refused {
        kind: ErrorKind,
        message: String,
    },
    /// A notification was queued: ask its fate with this.
    Ticket {
        ticket: u64,
    },
    /// Not yet: the notification is on its way, or none waits.
    Pending,
    /// A notification for this client.
    Note {
        from: String,
        name: String,
        msg: Vec<u8>,
    },
}

/// Why a frame could not be read as a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Malformed(pub(crate) &'static str);

mod tag {
    pub(super) const HELLO: u8 = 1;
    pub(super) const ALLOCATE: u8 = 2;
    pub(super) const OPEN_SEGMENT: u8 = 3;
    pub(super) const CREATE_RING: u8 = 4;
    pub(super) const FREE_MEMORY: u8 = 5;
    pub(super) const CLOSE_RING: u8 = 6;
    pub(super) const CLOSE_SEGMENT: u8 = 7;
    pub(super) const SEGMENT_REGIONS: u8 = 8;
    pub(super) const DETACH: u8 = 9;
    pub(super) const NOTIFY: u8 = 10;
    pub(super) const NOTIFY_OUTCOME: u8 = 11;
    pub(super) const TAKE_NOTIFICATION: u8 = 12;
    pub(super) const WELCOME: u8 = 0x81;
    pub(super) const ALLOCATED: u8 = 0x82;
    pub(super) const OPENED: u8 = 0x83;
    pub(super) const RING_PART: u8 = 0x84;
    pub(super) const DONE: u8 = 0x85;
    pub(super) const REGIONS: u8 = 0x86;
    pub(super) const TICKET: u8 = 0x87;
    pub(super) const PENDING: u8 = 0x88;
    pub(super) const NOTE: u8 = 0x89;
    pub(super) const REFUSED: u8 = 0xff;
}

/// A body's fields, read front to back; every read checked.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], Malformed> {
        let (head, rest) = self
            .0
            .split_first_chunk::<N>()
            .ok_or(Malformed("short body"))?;
        self.0 = rest;
        Ok(*head)
    }
    fn u32(&mut self) -> Result<u32, Malformed> {
        self.take().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Result<u64, Malformed> {
        self.take().map(u64::from_le_bytes)
    }
    /// A `u32` length, then that many bytes, at most `max`.
    fn sized(&mut self, max: usize) -> Result<&[u8], Malformed> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(Malformed("field too long"));
        }
        if self.0.len() < n {
            return Err(Malformed("short body"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    /// [`Fields::sized`], as UTF-8.
    fn sized_text(&mut self, max: usize) -> Result<String, Malformed> {
        let b = self.sized(max)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| Malformed("text not UTF-8"))
    }
    /// The rest, at most `max` bytes.
    fn rest(&mut self, max: usize) -> Result<Vec<u8>, Malformed> {
        if self.0.len() > max {
            return Err(Malformed("field too long"));
        }
        let b = self.0.to_vec();
        self.0 = &[];
        Ok(b)
    }
    /// The rest as UTF-8 of at most `max` bytes.
    fn text(&mut self, max: usize) -> Result<String, Malformed> {
        if self.0.len() > max {
            return Err(Malformed("text too long"));
        }
        let s = std::str::from_utf8(self.0).map_err(|_| Malformed("text not UTF-8"))?;
        self.0 = &[];
        Ok(s.to_owned())
    }
    fn end(&self) -> Result<(), Malformed> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(Malformed("trailing bytes"))
        }
    }
}

/// `bytes` after their `u32` length (the caller bounds them).
fn put_sized(b: &mut Vec<u8>, bytes: &[u8]) {
    b.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    b.extend_from_slice(bytes);
}

/// A frame: length, then `body`.
fn frame(body: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// A frame's body length from its 4-byte header, bounded.
pub(crate) fn body_len(header: [u8; 4]) -> Result<usize, Malformed> {
    let n = u32::from_le_bytes(header);
    if n == 0 || n > MAX_BODY {
        return Err(Malformed("frame length out of range"));
    }
    Ok(n as usize)
}

impl Request {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        match self {
            Request::Hello { version, name } => {
                b.push(tag::HELLO);
                b.extend_from_slice(&version.to_le_bytes());
                if name.len() <= MAX_CLIENT_NAME {
                    b.extend_from_slice(name.as_bytes());
                }
            }
            Request::Allocate { len } => {
                b.push(tag::ALLOCATE);
                b.extend_from_slice(&len.to_le_bytes());
            }
            Request::OpenSegment { name } => {
                b.push(tag::OPEN_SEGMENT);
                b.extend_from_slice(name.as_bytes());
            }
            Request::CreateRing { depth } => {
                b.push(tag::CREATE_RING);
                b.extend_from_slice(&depth.to_le_bytes());
            }
            Request::FreeMemory { region } => {
                b.push(tag::FREE_MEMORY);
                b.extend_from_slice(&region.to_le_bytes());
            }
            Request::CloseRing { ring } => {
                b.push(tag::CLOSE_RING);
                b.extend_from_slice(&ring.to_le_bytes());
            }
            Request::CloseSegment { segment } => {
                b.push(tag::CLOSE_SEGMENT);
                b.extend_from_slice(&segment.to_le_bytes());
            }
            Request::SegmentRegions { segment, skip } => {
                b.push(tag::SEGMENT_REGIONS);
                b.extend_from_slice(&segment.to_le_bytes());
                b.extend_from_slice(&skip.to_le_bytes());
            }
            Request::Detach => b.push(tag::DETACH),
            Request::Notify { segment, name, msg } => {
                b.push(tag::NOTIFY);
                b.extend_from_slice(&segment.to_le_bytes());
                put_sized(&mut b, name.as_bytes());
                b.extend_from_slice(msg);
            }
            Request::NotifyOutcome { ticket } => {
                b.push(tag::NOTIFY_OUTCOME);
                b.extend_from_slice(&ticket.to_le_bytes());
            }
            Request::TakeNotification => b.push(tag::TAKE_NOTIFICATION),
        }
        frame(b)
    }

    /// A body from a client (hostile input).
    pub(crate) fn decode(body: &[u8]) -> Result<Request, Malformed> {
        let (&t, rest) = body.split_first().ok_or(Malformed("empty body"))?;
        let mut f = Fields(rest);
        let r = match t {
            tag::HELLO => {
                let version = f.u32()?;
                let name = f.text(MAX_CLIENT_NAME)?;
                // As the configuration takes it: a label, not text.
                if !name.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(Malformed("client name not printable ASCII"));
                }
                Request::Hello { version, name }
            }
            tag::ALLOCATE => Request::Allocate { len: f.u64()? },
            tag::OPEN_SEGMENT => Request::OpenSegment {
                name: f.text(MAX_NAME)?,
            },
            tag::CREATE_RING => Request::CreateRing { depth: f.u32()? },
            tag::FREE_MEMORY => Request::FreeMemory { region: f.u64()? },
            tag::CLOSE_RING => Request::CloseRing { ring: f.u32()? },
            tag::CLOSE_SEGMENT => Request::CloseSegment { segment: f.u64()? },
            tag::SEGMENT_REGIONS => Request::SegmentRegions {
                segment: f.u64()?,
                skip: f.u32()?,
            },
            tag::DETACH => Request::Detach,
            tag::NOTIFY => Request::Notify {
                segment: f.u64()?,
                name: f.sized_text(MAX_NOTIFY_NAME)?,
                msg: f.rest(MAX_NOTIFY_MSG)?,
            },
            tag::NOTIFY_OUTCOME => Request::NotifyOutcome { ticket: f.u64()? },
            tag::TAKE_NOTIFICATION => Request::TakeNotification,
            _ => return Err(Malformed("unknown request")),
        };
        f.end()?;
        Ok(r)
    }
}

impl Reply {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        match self {
            Reply::Welcome {
                version,
                client,
                mailbox,
                segment,
            } => {
                b.push(tag::WELCOME);
                b.extend_from_slice(&version.to_le_bytes());
                b.extend_from_slice(&client.to_le_bytes());
                b.extend_from_slice(&mailbox.to_le_bytes());
                if segment.len() <= MAX_NAME {
                    b.extend_from_slice(segment.as_bytes());
                }
            }
            Reply::Allocated {
                region,
                len,
                data_offset,
                addr,
            } => {
                b.push(tag::ALLOCATED);
                b.extend_from_slice(&region.to_le_bytes());
                b.extend_from_slice(&len.to_le_bytes());
                b.extend_from_slice(&data_offset.to_le_bytes());
                b.extend_from_slice(&addr.to_le_bytes());
            }
            Reply::Opened { segment } => {
                b.push(tag::OPENED);
                b.extend_from_slice(&segment.to_le_bytes());
            }
            Reply::RingPart {
                part,
                depth,
                ring,
                worker,
            } => {
                b.push(tag::RING_PART);
                b.extend_from_slice(&(*part as u32).to_le_bytes());
                b.extend_from_slice(&depth.to_le_bytes());
                b.extend_from_slice(&ring.to_le_bytes());
                b.extend_from_slice(&worker.to_le_bytes());
            }
            Reply::Done => b.push(tag::DONE),
            Reply::Regions { total, regions } => {
                b.push(tag::REGIONS);
                b.extend_from_slice(&total.to_le_bytes());
                for r in regions.iter().take(MAX_REGIONS) {
                    b.extend_from_slice(&r.id.to_le_bytes());
                    b.extend_from_slice(&r.addr.to_le_bytes());
                    b.extend_from_slice(&r.len.to_le_bytes());
                }
            }
            Reply::Refused { kind, message } => {
                b.push(tag::REFUSED);
                b.extend_from_slice(&kind.code().to_le_bytes());
                let mut end = message.len().min(MAX_MESSAGE);
                while !message.is_char_boundary(end) {
                    end -= 1;
                }
                b.extend_from_slice(&message.as_bytes()[..end]);
            }
            Reply::Ticket { ticket } => {
                b.push(tag::TICKET);
                b.extend_from_slice(&ticket.to_le_bytes());
            }
            Reply::Pending => b.push(tag::PENDING),
            Reply::Note { from, name, msg } => {
                b.push(tag::NOTE);
                put_sized(&mut b, from.as_bytes());
                put_sized(&mut b, name.as_bytes());
                b.extend_from_slice(msg);
            }
        }
        frame(b)
    }

    /// A body from the daemon (checked as strictly: a client trusts the
    /// daemon's memory, not its bytes).
    pub(crate) fn decode(body: &[u8]) -> Result<Reply, Malformed> {
        let (&t, rest) = body.split_first().ok_or(Malformed("empty body"))?;
        let mut f = Fields(rest);
        let r = match t {
            tag::WELCOME => Reply::Welcome {
                version: f.u32()?,
                client: f.u32()?,
                mailbox: f.u64()?,
                segment: f.text(MAX_NAME)?,
            },
            tag::ALLOCATED => Reply::Allocated {
                region: f.u64()?,
                len: f.u64()?,
                data_offset: f.u64()?,
                addr: f.u64()?,
            },
            tag::OPENED => Reply::Opened { segment: f.u64()? },
            tag::RING_PART => Reply::RingPart {
                part: match f.u32()? {
                    0 => Part::Sq,
                    1 => Part::Cq,
                    2 => Part::Bells,
                    _ => return Err(Malformed("unknown ring part")),
                },
                depth: f.u32()?,
                ring: f.u32()?,
                worker: f.u32()?,
            },
            tag::DONE => Reply::Done,
            tag::REGIONS => {
                let total = f.u32()?;
                let mut regions = Vec::new();
                while !f.0.is_empty() {
                    if regions.len() == MAX_REGIONS {
                        return Err(Malformed("too many regions"));
                    }
                    regions.push(RegionEntry {
                        id: f.u64()?,
                        addr: f.u64()?,
                        len: f.u64()?,
                    });
                }
                Reply::Regions { total, regions }
            }
            tag::REFUSED => Reply::Refused {
                kind: ErrorKind::from_code(u16::from_le_bytes(f.take()?))
                    .ok_or(Malformed("unknown error kind"))?,
                message: f.text(MAX_MESSAGE)?,
            },
            tag::TICKET => Reply::Ticket { ticket: f.u64()? },
            tag::PENDING => Reply::Pending,
            tag::NOTE => Reply::Note {
                from: f.sized_text(MAX_NOTE_FROM)?,
                name: f.sized_text(MAX_NOTIFY_NAME)?,
                msg: f.rest(MAX_NOTIFY_MSG)?,
            },
            _ => return Err(Malformed("unknown reply")),
        };
        f.end()?;
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(frame: &[u8]) -> &[u8] {
        let n = body_len(frame[..4].try_into().unwrap()).unwrap();
        assert_eq!(frame.len(), 4 + n);
        &frame[4..]
    }

    #[test]
    fn every_message_comes_back_as_it_went() {
        for r in [
            Request::Hello {
                version: 7,
                name: String::new(),
            },
            Request::Hello {
                version: 7,
                name: "prefill-0".into(),
            },
            Request::Allocate { len: 1 << 40 },
            Request::OpenSegment {
                name: "127.0.0.1:1234".into(),
            },
            Request::CreateRing { depth: 256 },
            Request::FreeMemory { region: 1 << 40 },
            Request::CloseRing { ring: 3 },
            Request::CloseSegment { segment: 9 },
            Request::SegmentRegions {
                segment: 9,
                skip: 80,
            },
            Request::Detach,
            Request::Notify {
                segment: 9,
                name: "kv-ready".into(),
                msg: vec![7; MAX_NOTIFY_MSG],
            },
            Request::Notify {
                segment: 9,
                name: String::new(),
                msg: Vec::new(),
            },
            Request::NotifyOutcome { ticket: 3 },
            Request::TakeNotification,
        ] {
            assert_eq!(Request::decode(body(&r.encode())), Ok(r));
        }
        for r in [
            Reply::Welcome {
                version: 1,
                client: 9,
                mailbox: u64::MAX,
                segment: "127.0.0.1:1234".into(),
            },
            Reply::Ticket { ticket: 1 },
            Reply::Pending,
            Reply::Note {
                from: "x".repeat(MAX_NOTE_FROM),
                name: "n".repeat(MAX_NOTIFY_NAME),
                msg: vec![1; MAX_NOTIFY_MSG],
            },
            Reply::Allocated {
                region: u64::MAX,
                len: 4096,
                data_offset: 4096,
                addr: 0x7f00_0000_1000,
            },
            Reply::Opened { segment: 3 },
            Reply::RingPart {
                part: Part::Bells,
                depth: 64,
                ring: 2,
                worker: 1,
            },
            Reply::Done,
            Reply::Regions {
                total: 81,
                regions: vec![
                    RegionEntry {
                        id: 1,
                        addr: 1 << 40,
                        len: 4096
                    };
                    MAX_REGIONS
                ],
            },
            Reply::Refused {
                kind: ErrorKind::OutOfMemory,
                message: "quota".into(),
            },
        ] {
            assert_eq!(Reply::decode(body(&r.encode())), Ok(r));
        }
    }

    /// The `daemon_setup` fuzz target's seeds: one body of each message
    /// (`TENT_WRITE_SEEDS=1 cargo test -p tent --lib fuzz_seeds` writes
    /// them).
    #[test]
    fn fuzz_seeds_are_every_message() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/daemon_setup");
        let seeds: Vec<(&str, Vec<u8>)> = vec![
            (
                "hello",
                Request::Hello {
                    version: LAYOUT_VERSION,
                    name: "prefill-0".into(),
                }
                .encode(),
            ),
            ("allocate", Request::Allocate { len: 4096 }.encode()),
            (
                "open_segment",
                Request::OpenSegment {
                    name: "127.0.0.1:12345".into(),
                }
                .encode(),
            ),
            ("create_ring", Request::CreateRing { depth: 64 }.encode()),
            (
                "welcome",
                Reply::Welcome {
                    version: LAYOUT_VERSION,
                    client: 1,
                    mailbox: 0x5eed,
                    segment: "127.0.0.1:7000".into(),
                }
                .encode(),
            ),
            (
                "allocated",
                Reply::Allocated {
                    region: 1 << 32 | 1,
                    len: 4096,
                    data_offset: 4096,
                    addr: 0x7f00_0000_1000,
                }
                .encode(),
            ),
            ("opened", Reply::Opened { segment: 7 }.encode()),
            (
                "ring_part",
                Reply::RingPart {
                    part: Part::Cq,
                    depth: 64,
                    ring: 1,
                    worker: 0,
                }
                .encode(),
            ),
            (
                "free_memory",
                Request::FreeMemory {
                    region: 1 << 32 | 1,
                }
                .encode(),
            ),
            ("close_ring", Request::CloseRing { ring: 1 }.encode()),
            ("detach", Request::Detach.encode()),
            (
                "close_segment",
                Request::CloseSegment { segment: 7 }.encode(),
            ),
            (
                "segment_regions",
                Request::SegmentRegions {
                    segment: 7,
                    skip: 0,
                }
                .encode(),
            ),
            (
                "regions",
                Reply::Regions {
                    total: 1,
                    regions: vec![RegionEntry {
                        id: 1,
                        addr: 0x7f00_0000_0000,
                        len: 1 << 20,
                    }],
                }
                .encode(),
            ),
            ("done", Reply::Done.encode()),
            (
                "notify",
                Request::Notify {
                    segment: 7,
                    name: "kv-ready".into(),
                    msg: b"layer 3".to_vec(),
                }
                .encode(),
            ),
            (
                "notify_outcome",
                Request::NotifyOutcome { ticket: 1 }.encode(),
            ),
            ("take_notification", Request::TakeNotification.encode()),
            ("ticket", Reply::Ticket { ticket: 1 }.encode()),
            ("pending", Reply::Pending.encode()),
            (
                "note",
                Reply::Note {
                    from: "127.0.0.1:7000#0000000000005eed".into(),
                    name: "kv-ready".into(),
                    msg: b"layer 3".to_vec(),
                }
                .encode(),
            ),
            (
                "refused",
                Reply::Refused {
                    kind: ErrorKind::OutOfMemory,
                    message: "a client may hold 16 rings".into(),
                }
                .encode(),
            ),
        ];
        // A seed is a body, as the decoders take it.
        let seeds: Vec<(&str, Vec<u8>)> = seeds
            .into_iter()
            .map(|(n, f)| (n, f[4..].to_vec()))
            .collect();
        if std::env::var_os("TENT_WRITE_SEEDS").is_some() {
            std::fs::create_dir_all(&dir).unwrap();
            for (name, body) in &seeds {
                std::fs::write(dir.join(name), body).unwrap();
            }
        }
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut want: Vec<String> = seeds.iter().map(|s| s.0.to_owned()).collect();
        want.sort();
        assert_eq!(names, want, "fuzz/seeds/daemon_setup holds other seeds");
        for (name, body) in &seeds {
            assert_eq!(
                &std::fs::read(dir.join(name)).unwrap(),
                body,
                "{name} is stale"
            );
            assert!(
                Request::decode(body).is_ok() || Reply::decode(body).is_ok(),
                "{name} decodes"
            );
        }
    }

    #[test]
    fn bad_frames_are_refused_before_use() {
        assert!(body_len(0u32.to_le_bytes()).is_err());
        assert!(body_len((MAX_BODY + 1).to_le_bytes()).is_err());
        assert!(Request::decode(&[]).is_err());
        assert!(Request::decode(&[0x7f]).is_err(), "unknown tag");
        assert!(Request::decode(&[1, 0, 0]).is_err(), "short");
        assert!(Request::decode(&[1, 0, 0, 0, 0, 9]).is_err(), "trailing");
        let long = [vec![3u8], vec![b'a'; MAX_NAME + 1]].concat();
        assert!(Request::decode(&long).is_err(), "name too long");
        assert!(Request::decode(&[3, 0xff, 0xfe]).is_err(), "not UTF-8");
        assert!(
            Reply::decode(&[0x84, 9, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]).is_err(),
            "part 9"
        );
        assert!(Reply::decode(&[0xff, 0xff, 0xff]).is_err(), "kind 0xffff");
        // A refusal's message is cut at a character boundary.
        let r = Reply::Refused {
            kind: ErrorKind::InvalidArgument,
            message: "é".repeat(MAX_MESSAGE),
        };
        let Ok(Reply::Refused { message, .. }) = Reply::decode(body(&r.encode())) else {
            panic!("a long refusal decodes");
        };
        assert!(message.len() <= MAX_MESSAGE);
        // A sized field past its bound, or past the body.
        let mut n = vec![10u8];
        n.extend_from_slice(&9u64.to_le_bytes());
        n.extend_from_slice(&(MAX_NOTIFY_NAME as u32 + 1).to_le_bytes());
        n.extend(vec![b'a'; MAX_NOTIFY_NAME + 1]);
        assert!(Request::decode(&n).is_err(), "name too long");
        let mut n = vec![10u8];
        n.extend_from_slice(&9u64.to_le_bytes());
        n.extend_from_slice(&8u32.to_le_bytes());
        n.extend_from_slice(b"abc");
        assert!(Request::decode(&n).is_err(), "name past the body");
        let mut n = vec![10u8];
        n.extend_from_slice(&9u64.to_le_bytes());
        n.extend_from_slice(&0u32.to_le_bytes());
        n.extend(vec![0u8; MAX_NOTIFY_MSG + 1]);
        assert!(Request::decode(&n).is_err(), "message too long");
    }
}
