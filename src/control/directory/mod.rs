//! The directory: how a segment name leads to the control server of the
//! process that owns it, and how this engine is found by others. One type,
//! two stores:
//!
//! - **p2p** (the embedded default): a name is the owner's `ip:port`, and
//!   nothing is published; any other name is an shm segment on this host.
//! - **etcd**: each engine publishes a small record (its control address,
//!   its incarnation, the name) at `<prefix>/segments/<name>` with a lease
//!   it keeps alive; [`Directory::locate`] reads it. A name etcd does not
//!   hold falls back to the p2p rules, so `ip:port` names keep working.
//!
//! Either way the descriptor itself comes from the owner's control server
//! (authenticated with the shared secret when one is set), never from the
//! store: a record in etcd only says where to ask and whom to expect.
//! Whoever can write to the store can point a name elsewhere, so the
//! opener checks that the owner it reaches calls itself by that name and
//! has the incarnation the record says ([`Expected::check`]).

pub(crate) mod etcd;

use tent_rings::ErrorKind;

use super::wire::SegmentDescriptor;
use crate::config::{Config, MetadataType};
use crate::error::{Error, Result};

pub(crate) use etcd::EtcdDirectory;

/// Where segment names lead.
#[derive(Debug)]
pub(crate) enum Directory {
    /// Names are `ip:port` (or an shm segment's name).
    P2p,
    /// Names are looked up in etcd first.
    Etcd(EtcdDirectory),
}

/// Where a name leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Located {
    /// Ask the control server at `addr` (`ip:port`) for the descriptor,
    /// and, when a store named the owner, expect it to be that one.
    Control {
        addr: String,
        expected: Option<Expected>,
    },
    /// A shared-memory segment's name on this host.
    Shm,
}

/// Whom a store says owns a name: the owner's descriptor must agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Expected {
    /// The name it was found under.
    pub name: String,
    /// The owner's incarnation, as published.
    pub incarnation: u64,
}

impl Expected {
    /// Does the owner's own descriptor agree with the record? It must call
    /// itself by the name it was found under and be the incarnation
    /// published: else the record was copied from another key or forged
    /// (`AccessDenied`), or the owner restarted since it was read
    /// (`ProcessFailed`: look again).
    pub(crate) fn check(&self, desc: &SegmentDescriptor) -> Result<()> {
        if desc.published_as.as_deref() != Some(self.name.as_str()) {
            return Err(Error::new(
                ErrorKind::AccessDenied,
                format!(
                    "segment {:?}: the engine its record points at ({}) calls itself {:?}: the record was copied or forged, refused",
                    self.name, desc.name, desc.published_as
                ),
            ));
        }
        if desc.incarnation != self.incarnation {
            return Err(Error::new(
                ErrorKind::ProcessFailed,
                format!(
                    "segment {:?}: its record names incarnation {:#x}, its owner answers as {:#x} (it restarted since)",
                    self.name, self.incarnation, desc.incarnation
                ),
            ));
        }
        Ok(())
    }
}

/// The name this engine publishes its segment under: `None` in p2p mode
/// (nothing is published), `Some(None)` for its control server's
/// `ip:port`, `Some(Some(name))` for `metadata_segment_name`.
pub(crate) fn published_name(cfg: &Config) -> Option<Option<String>> {
    match cfg.metadata_type {
        MetadataType::P2p => None,
        MetadataType::Etcd => Some(
            (!cfg.metadata_segment_name.is_empty()).then(|| cfg.metadata_segment_name.clone()),
        ),
    }
}

/// Where `name` leads without a store: a p2p name is its own address.
fn by_name(name: &str) -> Located {
    if super::is_p2p_name(name) {
        Located::Control {
            addr: name.to_owned(),
            expected: None,
        }
    } else {
        Located::Shm
    }
}

impl Directory {
    /// The directory `cfg` names: for etcd, connected now (etcd down is an
    /// error naming every endpoint and why).
    pub(crate) fn start(cfg: &Config) -> Result<Directory> {
        Ok(match cfg.metadata_type {
            MetadataType::P2p => Directory::P2p,
            MetadataType::Etcd => Directory::Etcd(EtcdDirectory::connect(cfg)?),
        })
    }

    /// Where `name` leads now, asking the store (within its call timeout,
    /// a sixth of the lease TTL).
    ///
    /// # Errors
    /// The store unreachable (`Unreachable`, naming its endpoints) or its
    /// record malformed (`InvalidArgument`).
    pub(crate) fn locate(&self, name: &str) -> Result<Located> {
        match self {
            Directory::P2p => Ok(by_name(name)),
            Directory::Etcd(d) => Ok(match d.lookup(name)? {
                Some(record) => Located::Control {
                    addr: record.control,
                    expected: Some(Expected {
                        name: name.to_owned(),
                        incarnation: record.incarnation,
                    }),
                },
                None => by_name(name),
            }),
        }
    }

    /// The etcd store, when it is the one.
    pub(crate) fn etcd(&self) -> Option<&EtcdDirectory> {
        match self {
            Directory::P2p => None,
            Directory::Etcd(d) => Some(d),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(published_as: Option<&str>, incarnation: u64) -> SegmentDescriptor {
        SegmentDescriptor {
            name: "10.0.0.1:7000".into(),
            published_as: published_as.map(str::to_owned),
            incarnation,
            ..Default::default()
        }
    }

    #[test]
    fn an_owner_must_call_itself_by_the_name_and_incarnation_published() {
        let e = Expected {
            name: "prefill-0".into(),
            incarnation: 7,
        };
        assert!(e.check(&desc(Some("prefill-0"), 7)).is_ok());
        let copied = e.check(&desc(Some("decode-3"), 7)).unwrap_err();
        assert_eq!(copied.kind(), ErrorKind::AccessDenied, "{copied}");
        let unnamed = e.check(&desc(None, 7)).unwrap_err();
        assert_eq!(unnamed.kind(), ErrorKind::AccessDenied);
        let restarted = e.check(&desc(Some("prefill-0"), 8)).unwrap_err();
        assert_eq!(restarted.kind(), ErrorKind::ProcessFailed, "{restarted}");
    }

    #[test]
    fn without_a_store_a_name_is_an_address_or_an_shm_segment() {
        let d = Directory::P2p;
        assert_eq!(
            d.locate("127.0.0.1:9").unwrap(),
            Located::Control {
                addr: "127.0.0.1:9".into(),
                expected: None
            }
        );
        assert_eq!(d.locate("tent-1234-abcd").unwrap(), Located::Shm);
    }

    #[test]
    fn only_etcd_publishes_and_an_empty_name_means_the_address() {
        let mut cfg = Config::default();
        assert_eq!(published_name(&cfg), None);
        cfg.metadata_type = MetadataType::Etcd;
        assert_eq!(published_name(&cfg), Some(None));
        cfg.metadata_segment_name = "prefill-0".into();
        assert_eq!(published_name(&cfg), Some(Some("prefill-0".into())));
    }
}
