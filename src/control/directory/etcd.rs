//! The etcd store: the key layout, the record an engine publishes, the
//! lease that keeps it, and the watch that tells an engine about its
//! peers.
//!
//! A record is the owner's descriptor head in the control plane's own
//! encoding (a `Descriptor` message without regions): its control server's
//! address (`name`), host, pid, incarnation and the name it is published
//! under. The store holds nothing else: regions, rails and keys come from
//! the owner's control server when the segment is opened, so a record stays
//! a few hundred bytes however much memory the owner registers, and
//! registering memory writes nothing to etcd.
//!
//! Every record read is hostile input (whoever may write to the store may
//! write anything): it is decoded with the control plane's bounded decoder
//! and must name a control address, a non-zero incarnation and the key it
//! sits under ([`decode_record`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use tent_rings::ErrorKind;

use crate::config::Config;
use crate::control::etcd::{Credentials, EtcdClient, EtcdError, LeaseId, Tls, Watch, WatchEvent};
use crate::control::wire::{self, Message, SegmentDescriptor};
use crate::error::{Error, Result};

/// The longest a single etcd call may take: a sixth of the lease TTL, so
/// that a renewal every third of it may fail once and time out twice
/// before the lease lapses, and at most this.
const MAX_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The timeout of one etcd call under lease TTL `ttl`.
pub(crate) fn call_timeout(ttl: Duration) -> Duration {
    (ttl / 6).min(MAX_CALL_TIMEOUT)
}

/// What a record says about the owner of a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// Its control server, `ip:port`.
    pub control: String,
    /// Its incarnation (non-zero).
    pub incarnation: u64,
}

/// The record an engine publishes: `head` (its descriptor as its control
/// server gives it) without regions, pages or the metrics URL.
pub(crate) fn encode_record(head: &SegmentDescriptor) -> Vec<u8> {
    let record = SegmentDescriptor {
        name: head.name.clone(),
        host_id: head.host_id.clone(),
        pid: head.pid,
        incarnation: head.incarnation,
        published_as: head.published_as.clone(),
        ..Default::default()
    };
    wire::encode(&Message::Descriptor(record))
}

/// The record under `name`'s key, checked: one whole `Descriptor` message
/// in the control plane's encoding, published as `name`, naming an
/// `ip:port` control server and a non-zero incarnation.
///
/// # Errors
/// `InvalidArgument`, saying what is wrong (the value is never echoed).
pub(crate) fn decode_record(name: &str, value: &[u8]) -> Result<Record> {
    let refused = |why: String| {
        Error::new(
            ErrorKind::InvalidArgument,
            format!("etcd record of segment {name:?} ({} bytes) refused: {why}", value.len()),
        )
    };
    let desc = match wire::decode(value) {
        Ok((Message::Descriptor(d), used)) if used == value.len() => d,
        Ok((_, used)) if used != value.len() => {
            return Err(refused(format!("{} bytes follow the message", value.len() - used)));
        }
        Ok((other, _)) => {
            return Err(refused(format!("a {} message, not a descriptor", other.name())));
        }
        Err(e) => return Err(refused(format!("it does not decode: {e}"))),
    };
    if desc.published_as.as_deref() != Some(name) {
        return Err(refused(format!(
            "it is published as {:?}",
            desc.published_as
        )));
    }
    match desc.name.parse::<std::net::SocketAddr>() {
        Err(_) => return Err(refused("its control address is not ip:port".into())),
        // Nobody can be reached there: a record pointing at it is forged
        // or from an engine listening on a wildcard, useless to peers.
        Ok(a) if a.ip().is_unspecified() || a.ip().is_multicast() || a.port() == 0 => {
            return Err(refused(format!("its control address {a} reaches no engine")));
        }
        Ok(_) => {}
    }
    if desc.incarnation == 0 {
        return Err(refused("it names no incarnation".into()));
    }
    Ok(Record {
        control: desc.name,
        incarnation: desc.incarnation,
    })
}

/// A name published in etcd and its record (`None`: it does not decode).
pub(crate) type Published = (String, Option<Record>);

/// etcd as this engine's directory: where its records live and the client
/// that reaches them (`None` while etcd is lost; the metadata thread
/// connects again).
pub(crate) struct EtcdDirectory {
    endpoints: Vec<String>,
    credentials: Option<Credentials>,
    tls: Option<Tls>,
    /// `<metadata_key_prefix>/segments/`.
    segments: Vec<u8>,
    ttl: Duration,
    client: ArcSwapOption<EtcdClient>,
    /// etcd was lost and has not been reached since (said once).
    lost: AtomicBool,
}

impl std::fmt::Debug for EtcdDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdDirectory")
            .field("endpoints", &self.endpoints)
            .field("segments", &String::from_utf8_lossy(&self.segments))
            .field("ttl", &self.ttl)
            .field("connected", &self.client.load().is_some())
            .finish_non_exhaustive()
    }
}

impl EtcdDirectory {
    /// Connected to the first healthy endpoint of `metadata_servers`.
    ///
    /// # Errors
    /// `Unreachable` naming every endpoint and why, `AccessDenied` for
    /// credentials etcd refuses.
    pub(crate) fn connect(cfg: &Config) -> Result<EtcdDirectory> {
        let credentials = (!cfg.metadata_password.expose().is_empty()).then(|| Credentials {
            user: cfg.metadata_user.clone(),
            password: cfg.metadata_password.clone(),
        });
        let prefix = cfg.metadata_key_prefix.trim_end_matches('/');
        let path = |p: &str| (!p.is_empty()).then(|| std::path::PathBuf::from(p));
        let (ca, cert, key) = (
            path(&cfg.metadata_tls_ca_file),
            path(&cfg.metadata_tls_cert_file),
            path(&cfg.metadata_tls_key_file),
        );
        let wants_tls = ca.is_some()
            || cert.is_some()
            || cfg.metadata_servers.iter().any(|e| e.trim().starts_with("https://"));
        let tls = match wants_tls {
            false => None,
            true => Some(
                Tls::from_files(ca.as_deref(), cert.as_deref().zip(key.as_deref())).map_err(|e| {
                    Error::new(ErrorKind::InvalidArgument, "etcd TLS files").with_source(e)
                })?,
            ),
        };
        let d = EtcdDirectory {
            endpoints: cfg.metadata_servers.clone(),
            credentials,
            tls,
            segments: format!("{prefix}/segments/").into_bytes(),
            ttl: cfg.metadata_lease_ttl_secs,
            client: ArcSwapOption::empty(),
            lost: AtomicBool::new(false),
        };
        d.reconnect().map_err(|e| d.lost(e))?;
        Ok(d)
    }

    /// Connect again (the first healthy endpoint), replacing the client.
    pub(crate) fn reconnect(&self) -> std::result::Result<Arc<EtcdClient>, EtcdError> {
        let c = Arc::new(EtcdClient::connect_secure(
            &self.endpoints,
            call_timeout(self.ttl),
            self.credentials.clone(),
            self.tls.clone(),
        )?);
        self.client.store(Some(c.clone()));
        if self.lost.swap(false, Ordering::Relaxed) {
            tracing::info!(
                endpoint = c.endpoint(),
                "etcd metadata store reached again: records republished, peers resynced"
            );
        }
        Ok(c)
    }

    /// A call failed with `e`. A lost store (unreachable, timed out) is
    /// forgotten, said once, and reached again by the lease thread;
    /// anything else is logged (once per kind a second). True when lost.
    pub(crate) fn failed(&self, e: &EtcdError) -> bool {
        let kind = e.kind();
        if matches!(kind, ErrorKind::Unreachable | ErrorKind::Timeout) {
            self.client.store(None);
            if !self.lost.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    endpoints = %self.endpoints.join(", "),
                    error = %e,
                    "etcd metadata store lost: open segments keep serving, new opens fail until it returns; this engine's record lapses if it stays away past the lease TTL"
                );
            }
            true
        } else {
            crate::lograte::warn_limited!((kind.code(), "etcd"), error = %e, "etcd refused a metadata request");
            false
        }
    }

    /// The client, while etcd is reachable.
    pub(crate) fn client(&self) -> Option<Arc<EtcdClient>> {
        self.client.load_full()
    }

    /// `e` as the engine's error, naming the endpoints.
    pub(crate) fn lost(&self, e: EtcdError) -> Error {
        let kind = e.kind();
        Error::new(
            kind,
            format!("etcd metadata store ({})", self.endpoints.join(", ")),
        )
        .with_source(e)
    }

    /// The key `name` is published under.
    pub(crate) fn key(&self, name: &str) -> Vec<u8> {
        let mut k = self.segments.clone();
        k.extend_from_slice(name.as_bytes());
        k
    }

    /// The name a key under the segments prefix publishes (`None`: not
    /// one of ours, or not UTF-8).
    pub(crate) fn name_of<'k>(&self, key: &'k [u8]) -> Option<&'k str> {
        let rest = key.strip_prefix(self.segments.as_slice())?;
        std::str::from_utf8(rest).ok().filter(|n| !n.is_empty())
    }

    /// The lease TTL records are published with.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The record published under `name`, if any. A name that is an
    /// `ip:port` is that address: a record under it naming another is
    /// refused.
    ///
    /// # Errors
    /// etcd lost (`Unreachable` naming the endpoints: segments already
    /// open keep serving, new opens wait for it to return), the record
    /// malformed (`InvalidArgument`) or pointing an address name elsewhere
    /// (`AccessDenied`).
    pub(crate) fn lookup(&self, name: &str) -> Result<Option<Record>> {
        let Some(client) = self.client() else {
            return Err(Error::new(
                ErrorKind::Unreachable,
                format!(
                    "etcd metadata store ({}) is lost: segment {name:?} cannot be looked up until it returns (segments already open keep serving)",
                    self.endpoints.join(", ")
                ),
            ));
        };
        let record = match client.get(&self.key(name)) {
            Ok(Some((value, _))) => decode_record(name, &value)?,
            Ok(None) => return Ok(None),
            Err(e) => {
                self.failed(&e);
                return Err(self.lost(e));
            }
        };
        if crate::control::is_p2p_name(name) && record.control != name {
            return Err(Error::new(
                ErrorKind::AccessDenied,
                format!(
                    "segment {name:?}: its record in etcd points at {}, not the address the name is: refused",
                    record.control
                ),
            ));
        }
        Ok(Some(record))
    }

    /// May this engine (`incarnation`) publish under `name`? Not while
    /// another engine holds it that answers at its record's address: a
    /// name is one engine's. One whose record outlives it (killed, its
    /// lease not yet expired) does not answer (the connection refused or
    /// timed out), and the name is taken over; one that answers in any
    /// way (refusing our secret included) holds it.
    ///
    /// # Errors
    /// `InvalidArgument` naming the live holder; etcd unreachable.
    pub(crate) fn claim(&self, name: &str, incarnation: u64, secret: Option<&[u8]>) -> Result<()> {
        let record = match self.lookup(name) {
            Ok(Some(r)) if r.incarnation != incarnation => r,
            Ok(_) => return Ok(()),
            Err(e) if matches!(e.kind(), ErrorKind::Unreachable | ErrorKind::Timeout) => {
                return Err(e);
            }
            // Whatever is there is not a record an engine could use.
            Err(_) => return Ok(()),
        };
        let probe = call_timeout(self.ttl);
        let gone = match crate::control::client::fetch_descriptor_head(&record.control, secret, probe) {
            Ok(d) => d.incarnation != record.incarnation,
            Err(e) => matches!(
                e.kind(),
                ErrorKind::Unreachable | ErrorKind::Timeout | ErrorKind::ProcessFailed
            ),
        };
        if !gone {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "segment name {name:?} is held by a live engine at {} (incarnation {:#x}): choose another metadata_segment_name",
                    record.control, record.incarnation
                ),
            ));
        }
        tracing::info!(segment = name, previous = %record.control, "taking over a segment name whose engine no longer answers");
        Ok(())
    }

    /// Every name published now with its record (`None`: one that does
    /// not decode, logged) and the revision they were read at.
    pub(crate) fn snapshot(
        &self,
        client: &EtcdClient,
    ) -> std::result::Result<(Vec<Published>, i64), EtcdError> {
        let range = client.range_prefix(&self.segments)?;
        let mut out = Vec::with_capacity(range.kvs.len());
        for kv in range.kvs {
            if let Some(name) = self.name_of(&kv.key) {
                let record = self.change_of(&kv.key, Some(&kv.value)).and_then(|c| c.record);
                out.push((name.to_owned(), record));
            }
        }
        Ok((out, range.revision))
    }

    /// Watch every record from `revision`.
    pub(crate) fn watch(
        &self,
        client: &EtcdClient,
        revision: i64,
    ) -> std::result::Result<Watch, EtcdError> {
        client.watch_prefix(&self.segments, revision)
    }

    /// What a watch event says about a name (`None`: not a name, or a
    /// record that does not decode, logged).
    pub(crate) fn change(&self, event: &WatchEvent) -> Option<Change> {
        match event {
            WatchEvent::Put { key, value, .. } => self.change_of(key, Some(value)),
            WatchEvent::Delete { key, .. } => self.change_of(key, None),
        }
    }

    fn change_of(&self, key: &[u8], value: Option<&[u8]>) -> Option<Change> {
        let name = self.name_of(key)?;
        let record = match value {
            None => None,
            Some(v) => match decode_record(name, v) {
                Ok(r) => Some(r),
                Err(e) => {
                    crate::lograte::warn_limited!(
                        (name.to_owned(), "etcd-record"),
                        segment = name,
                        error = %e,
                        "a segment record in etcd is not one tent wrote: ignored"
                    );
                    return None;
                }
            },
        };
        Some(Change {
            name: name.to_owned(),
            record,
        })
    }
}

/// A name's record changed: its new record, or `None` when it was
/// deleted (revoked, or its lease expired).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    pub name: String,
    pub record: Option<Record>,
}

/// This engine's record in etcd and the lease it lives by: what to do
/// next is decided from the state and `now` ([`Publication::due`]); the
/// metadata thread does the I/O.
#[derive(Debug)]
pub(crate) struct Publication {
    key: Vec<u8>,
    value: Vec<u8>,
    lease: Option<LeaseId>,
    /// When the lease is next kept alive.
    renew_at: Instant,
    /// The TTL the lease was granted with.
    ttl: Duration,
}

/// The next step of a [`Publication`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// No lease: grant one and put the record with it.
    Publish,
    /// Keep the lease alive now.
    Renew(LeaseId),
    /// Nothing before this instant.
    Wait(Instant),
}

impl Publication {
    pub(crate) fn new(key: Vec<u8>, value: Vec<u8>, ttl: Duration, now: Instant) -> Publication {
        Publication {
            key,
            value,
            lease: None,
            renew_at: now,
            ttl,
        }
    }

    /// What to do at `now`.
    pub(crate) fn due(&self, now: Instant) -> Step {
        match self.lease {
            None => Step::Publish,
            Some(l) if now >= self.renew_at => Step::Renew(l),
            Some(_) => Step::Wait(self.renew_at),
        }
    }

    /// The record is out under `lease` (granted, or renewed, at `now`):
    /// renew it a third of its TTL later, so two renewals may fail before
    /// it lapses.
    pub(crate) fn renewed(&mut self, lease: LeaseId, now: Instant) {
        self.lease = Some(lease);
        self.renew_at = now + self.ttl / 3;
    }

    /// The lease is gone (expired while etcd was lost, or revoked): publish
    /// again.
    pub(crate) fn lapsed(&mut self) {
        self.lease = None;
    }

    /// The lease, while the record is out.
    pub(crate) fn lease(&self) -> Option<LeaseId> {
        self.lease
    }

    pub(crate) fn key(&self) -> &[u8] {
        &self.key
    }

    pub(crate) fn value(&self) -> &[u8] {
        &self.value
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(name: &str, published_as: Option<&str>, incarnation: u64) -> SegmentDescriptor {
        SegmentDescriptor {
            name: name.into(),
            host_id: "host".into(),
            pid: 42,
            incarnation,
            published_as: published_as.map(str::to_owned),
            regions_version: 3,
            metrics_url: Some("http://10.0.0.1:9464".into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_record_reads_back_as_its_owner_s_address_and_incarnation() {
        let v = encode_record(&head("10.0.0.1:7000", Some("prefill-0"), 9));
        assert_eq!(
            decode_record("prefill-0", &v).unwrap(),
            Record {
                control: "10.0.0.1:7000".into(),
                incarnation: 9
            }
        );
    }

    #[test]
    fn a_record_that_is_not_one_tent_wrote_is_refused_typed() {
        let good = encode_record(&head("10.0.0.1:7000", Some("prefill-0"), 9));
        let refused = |name: &str, v: &[u8]| {
            let e = decode_record(name, v).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            e.to_string()
        };
        // Copied to another key.
        assert!(refused("decode-1", &good).contains("published as"));
        // Not the control plane's encoding at all.
        refused("prefill-0", b"{\"name\": \"10.0.0.1:7000\"}");
        refused("prefill-0", b"");
        // Truncated, and with bytes after the message.
        refused("prefill-0", &good[..good.len() - 1]);
        let mut long = good.clone();
        long.push(0);
        refused("prefill-0", &long);
        // Another message.
        refused("prefill-0", &wire::encode(&Message::GetDescriptor));
        // No control address, no incarnation.
        refused("prefill-0", &encode_record(&head("prefill-0", Some("prefill-0"), 9)));
        refused("prefill-0", &encode_record(&head("10.0.0.1:7000", Some("prefill-0"), 0)));
    }

    /// The fuzz target `etcd_gateway` starts from a record tent writes
    /// (`TENT_WRITE_SEEDS=1` writes it again).
    #[test]
    fn the_record_seed_is_one_tent_writes() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/seeds/etcd_gateway/record");
        let v = encode_record(&head("10.0.0.1:7000", Some("seg"), 9));
        if std::env::var_os("TENT_WRITE_SEEDS").is_some() {
            std::fs::write(path, &v).unwrap();
        }
        assert_eq!(std::fs::read(path).unwrap(), v, "TENT_WRITE_SEEDS=1 writes it");
        assert!(decode_record("seg", &v).is_ok());
    }

    #[test]
    fn a_lease_is_renewed_every_third_of_its_ttl_and_republished_once_it_lapses() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(6);
        let mut p = Publication::new(b"k".to_vec(), b"v".to_vec(), ttl, t0);
        assert_eq!(p.due(t0), Step::Publish);
        p.renewed(LeaseId(5), t0);
        assert_eq!(p.due(t0), Step::Wait(t0 + Duration::from_secs(2)));
        assert_eq!(p.due(t0 + Duration::from_secs(2)), Step::Renew(LeaseId(5)));
        p.renewed(LeaseId(5), t0 + Duration::from_secs(2));
        assert_eq!(p.due(t0 + Duration::from_secs(3)), Step::Wait(t0 + Duration::from_secs(4)));
        p.lapsed();
        assert_eq!(p.due(t0 + Duration::from_secs(3)), Step::Publish);
        assert_eq!(p.lease(), None);
    }
}
