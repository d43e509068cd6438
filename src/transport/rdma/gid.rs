//! Which entry of a port's GID table the RDMA transport addresses its QPs
//! with, and why: a decision over the table as read (`Context::gid_table`),
//! with no I/O of its own.
//!
//! A RoCE NIC lists each address of its network device several times:
//! mlx5 and bnxt_re give `[0]` link-local RoCE v1, `[1]` link-local RoCE
//! v2, `[2]` IPv4 RoCE v1, `[3]` IPv4 RoCE v2. The first non-zero entry
//! is RoCE v1 link-local, which no router forwards and whose packets carry
//! no IP header (so no DSCP, PFC class or ECN applies). On Ethernet the
//! choice is therefore, in order:
//!
//! 1. RoCE v2 with an IPv4 address,
//! 2. RoCE v2 with a global IPv6 address,
//! 3. RoCE v2 link-local,
//! 4. RoCE v1 (IPv4, then global, then link-local), only when the port has
//!    no v2 entry at all,
//!
//! each on a network device that is up (unknown counts as up), the lowest
//! index first within a class. On InfiniBand it is the lowest-index IB GID
//! (index 0, the port GID). A `gid_index` set in the configuration wins,
//! if the table has an address there.

use std::net::{IpAddr, Ipv6Addr};

use crate::netlink::IfAddr;
use crate::transport::rails::Sysfs;

/// The kind of a GID table entry (`ibv_gid_type`; the wire carries the
/// same numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GidType {
    /// An InfiniBand GID.
    Ib,
    /// RoCE v1: Ethernet frames, no IP header.
    RoceV1,
    /// RoCE v2: UDP over IP, routable.
    RoceV2,
}

impl GidType {
    /// Its `ibv_gid_type` number (what the wire carries).
    pub fn code(self) -> u8 {
        match self {
            GidType::Ib => 0,
            GidType::RoceV1 => 1,
            GidType::RoceV2 => 2,
        }
    }

    /// The type a number names; `None` for one this side does not know.
    pub fn from_code(code: u8) -> Option<GidType> {
        match code {
            0 => Some(GidType::Ib),
            1 => Some(GidType::RoceV1),
            2 => Some(GidType::RoceV2),
            _ => None,
        }
    }

    /// How sysfs spells it (`ports/<p>/gid_attrs/types/<i>`): `"IB/RoCE
    /// v1"` is IB on an InfiniBand port and RoCE v1 on an Ethernet one.
    pub(crate) fn from_sysfs(text: &str, link: LinkLayer) -> Option<GidType> {
        match text.trim() {
            "RoCE v2" => Some(GidType::RoceV2),
            "IB/RoCE v1" | "RoCE v1" | "IB" => Some(match link {
                LinkLayer::InfiniBand => GidType::Ib,
                LinkLayer::Ethernet => GidType::RoceV1,
            }),
            _ => None,
        }
    }
}

impl std::fmt::Display for GidType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GidType::Ib => "IB",
            GidType::RoceV1 => "RoCE v1",
            GidType::RoceV2 => "RoCE v2",
        })
    }
}

/// What a port's link runs over (`ibv_port_attr::link_layer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// InfiniBand: LIDs route within a subnet, a GRH only across subnets.
    InfiniBand,
    /// Ethernet (RoCE): every packet carries a GRH.
    Ethernet,
}

impl LinkLayer {
    /// From `ibv_port_attr::link_layer` (`IBV_LINK_LAYER_ETHERNET` is 2;
    /// 0, unspecified, is InfiniBand for old providers).
    pub(crate) fn from_verbs(code: u8) -> LinkLayer {
        if code == 2 {
            LinkLayer::Ethernet
        } else {
            LinkLayer::InfiniBand
        }
    }
}

/// One non-empty entry of a port's GID table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// Its index (an address handle holds 8 bits of it: entries past 255
    /// are never read).
    pub index: u8,
    /// The address.
    pub gid: [u8; 16],
    /// Its kind; `None` when the library and sysfs do not say.
    pub ty: Option<GidType>,
    /// Whether the network device behind it is up; `None` when there is
    /// none (InfiniBand) or it is unknown.
    pub netdev_up: Option<bool>,
}

/// The GID a NIC uses, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidChoice {
    /// Its index in the port's table.
    pub index: u8,
    /// The address.
    pub gid: [u8; 16],
    /// Its kind, when known.
    pub ty: Option<GidType>,
    /// Why this one, for the log line at start.
    pub why: &'static str,
    /// How many leading bits of the GID name its subnet: 64 on
    /// InfiniBand (the subnet prefix), on RoCE the prefix of the address
    /// on its network device (96 more for an IPv4 one, which sits in the
    /// GID's last 32 bits); `None` when unknown.
    pub prefix: Option<u8>,
}

/// Is `gid` an IPv4 address (`::ffff:a.b.c.d`)?
fn is_ipv4(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// Is `gid` link-local (`fe80::/10`)?
fn is_link_local(gid: &[u8; 16]) -> bool {
    gid[0] == 0xfe && gid[1] & 0xc0 == 0x80
}

/// What kind of IP address a RoCE GID is: 0 IPv4, 1 global IPv6, 2
/// link-local. Two RoCE GIDs of different kinds cannot reach each other.
fn address_kind(gid: &[u8; 16]) -> u8 {
    if is_ipv4(gid) {
        0
    } else if is_link_local(gid) {
        2
    } else {
        1
    }
}

/// The class of an entry on an Ethernet port (lower is better), `None`
/// when it is never used.
fn roce_class(e: &GidEntry) -> Option<(u8, &'static str)> {
    if e.netdev_up == Some(false) {
        return None;
    }
    let family = address_kind(&e.gid);
    match e.ty {
        Some(GidType::RoceV2) => Some((
            family,
            [
                "RoCE v2, IPv4",
                "RoCE v2, global IPv6",
                "RoCE v2, link-local",
            ][usize::from(family)],
        )),
        // A provider that does not say is taken for v1: only when nothing
        // known to be v2 is there.
        Some(GidType::RoceV1) | None => Some((
            3 + family,
            [
                "RoCE v1, IPv4 (the port has no RoCE v2 GID)",
                "RoCE v1, global IPv6 (the port has no RoCE v2 GID)",
                "RoCE v1, link-local (the port has no RoCE v2 GID)",
            ][usize::from(family)],
        )),
        Some(GidType::Ib) => None,
    }
}

/// The GID to use from `table` (the port's non-empty entries) on a port
/// whose link is `link`; `wanted` is the configured index, if any. `Err`
/// says why none fits.
pub(crate) fn choose(
    table: &[GidEntry],
    link: LinkLayer,
    wanted: Option<u8>,
) -> Result<GidChoice, String> {
    let pick = |e: &GidEntry, why| GidChoice {
        index: e.index,
        gid: e.gid,
        ty: e.ty,
        why,
        prefix: None,
    };
    if let Some(i) = wanted {
        return table
            .iter()
            .find(|e| e.index == i)
            .map(|e| pick(e, "transports/rdma/gid_index"))
            .ok_or_else(|| {
                format!(
                    "GID index {i} is empty (no address behind it); the table has {}",
                    found(table)
                )
            });
    }
    let best = match link {
        LinkLayer::InfiniBand => table
            .iter()
            .filter(|e| matches!(e.ty, Some(GidType::Ib) | None))
            .min_by_key(|e| e.index)
            .map(|e| pick(e, "InfiniBand port GID")),
        LinkLayer::Ethernet => table
            .iter()
            .filter_map(|e| roce_class(e).map(|(class, why)| (class, e, why)))
            .min_by_key(|&(class, e, _)| (class, e.index))
            .map(|(_, e, why)| pick(e, why)),
    };
    best.ok_or_else(|| match link {
        LinkLayer::InfiniBand => format!("no InfiniBand GID; the table has {}", found(table)),
        LinkLayer::Ethernet => format!(
            "no RoCE GID on a network device that is up; the table has {}",
            found(table)
        ),
    })
}

/// What one entry is, for a reason or an error: `[2] RoCE v1 IPv4`, with
/// ` (network device down)` when its device is down or not ours.
fn describe(e: &GidEntry) -> String {
    let ty =
        e.ty.map_or_else(|| "type unknown".to_owned(), |t| t.to_string());
    let family = ["IPv4", "global IPv6", "link-local"][usize::from(address_kind(&e.gid))];
    let down = if e.netdev_up == Some(false) {
        " (network device down)"
    } else {
        ""
    };
    format!("[{}] {ty} {family}{down}", e.index)
}

/// The whole table described, lowest index first (`no entry` when empty):
/// what an error names as found instead.
fn found(table: &[GidEntry]) -> String {
    let mut t: Vec<&GidEntry> = table.iter().collect();
    t.sort_by_key(|e| e.index);
    if t.is_empty() {
        return "no entry".to_owned();
    }
    t.iter().map(|e| describe(e)).collect::<Vec<_>>().join(", ")
}

/// Why `chosen` (what [`choose`] gave for `table`, `link` and `wanted`)
/// is the GID in use, in words for the topology report: the configured
/// index (and what the automatic choice would have been), or the class
/// that won and every other entry it was preferred over.
pub(crate) fn reason(
    table: &[GidEntry],
    link: LinkLayer,
    wanted: Option<u8>,
    chosen: &GidChoice,
) -> String {
    if let Some(i) = wanted {
        let auto = match choose(table, link, None) {
            Ok(c) if c.index == i => "which is also the automatic choice".to_owned(),
            Ok(c) => format!("the automatic choice would be [{}] ({})", c.index, c.why),
            Err(why) => format!("there is no automatic choice: {why}"),
        };
        return format!("gid_index {i} from the configuration (transports/rdma/gid_index); {auto}");
    }
    let mut others: Vec<&GidEntry> = table.iter().filter(|e| e.index != chosen.index).collect();
    others.sort_by_key(|e| e.index);
    let why = match link {
        LinkLayer::InfiniBand => "InfiniBand port GID (the lowest-index IB entry)",
        LinkLayer::Ethernet => chosen.why,
    };
    if others.is_empty() {
        return format!("{why}: the only entry in the table");
    }
    let list: Vec<String> = others.iter().map(|e| describe(e)).collect();
    format!("{why}: preferred over {}", list.join(", "))
}

/// What sysfs says about GID `index` of `dev`'s `port`: its kind
/// (`gid_attrs/types/<i>`) and whether the network device behind it
/// (`gid_attrs/ndevs/<i>`) is up. A device this network namespace cannot
/// see (a port shared with other containers lists their addresses too)
/// counts as down: its address is not ours to send from.
pub(crate) fn sysfs_attrs(
    sysfs: &Sysfs,
    dev: &str,
    port: u8,
    index: u8,
    link: LinkLayer,
) -> (Option<GidType>, Option<bool>) {
    let ty = sysfs
        .ibdev_text(dev, &format!("ports/{port}/gid_attrs/types/{index}"))
        .and_then(|t| GidType::from_sysfs(&t, link));
    let up = sysfs
        .ibdev_text(dev, &format!("ports/{port}/gid_attrs/ndevs/{index}"))
        .map(|ndev| sysfs.netdev_up(&ndev).unwrap_or(false));
    (ty, up)
}

/// Can a QP addressed by GID `local` (of type `local_ty`) reach one
/// addressed by `remote`? The same RoCE version ([`compatible`]) and, on
/// RoCE, the same kind of address: an IPv4 GID cannot reach an IPv6 or a
/// link-local one (RTR fails resolving the route).
pub(crate) fn reachable(
    local_ty: Option<GidType>,
    local: &[u8; 16],
    remote_ty: Option<GidType>,
    remote: &[u8; 16],
) -> bool {
    if !compatible(local_ty, remote_ty) {
        return false;
    }
    let infiniband = local_ty == Some(GidType::Ib) || remote_ty == Some(GidType::Ib);
    infiniband || address_kind(local) == address_kind(remote)
}

/// The subnet prefix length of RoCE GID `gid` (see [`GidChoice::prefix`]),
/// from the addresses of the network device it belongs to: the prefix of
/// the address the GID carries, `None` when the device does not hold it.
pub(crate) fn roce_prefix(gid: &[u8; 16], addrs: &[IfAddr]) -> Option<u8> {
    let v6 = Ipv6Addr::from(*gid);
    let (ip, offset) = match v6.to_ipv4_mapped() {
        Some(v4) => (IpAddr::V4(v4), 96),
        None => (IpAddr::V6(v6), 0),
    };
    addrs
        .iter()
        .find(|a| a.ip == ip)
        .map(|a| a.prefix.saturating_add(offset).min(128))
}

/// Are GIDs `a` and `b`, whose subnet prefixes are `pa` and `pb` bits
/// long, known to be on the same subnet: each inside the other's (the
/// same leading bits over the longer prefix, so a /8 frontend does not
/// claim the /31 links inside its range)? `false` when either prefix is
/// unknown.
pub(crate) fn same_subnet(a: &[u8; 16], pa: Option<u8>, b: &[u8; 16], pb: Option<u8>) -> bool {
    let (Some(pa), Some(pb)) = (pa, pb) else {
        return false;
    };
    let bits = u32::from(pa.max(pb).min(128));
    let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
    u128::from_be_bytes(*a) & mask == u128::from_be_bytes(*b) & mask
}

/// Which of `local` × `remote` NIC pairs may be rails, row-major
/// (`local` index × `remote` + `remote` index), given which pairs can
/// `reach` each other and which are on the `same` subnet. A NIC with a
/// reachable partner on its own subnet pairs only on its subnet (a host
/// whose compute, storage and frontend NICs sit on separate subnets gets
/// no rail across them); a NIC with none (a routed fabric, one subnet per
/// NIC; or a peer that does not say its prefixes) pairs with any
/// reachable NIC of the other side that has none either.
pub(crate) fn subnet_rule(
    local: usize,
    remote: usize,
    reach: impl Fn(usize, usize) -> bool,
    same: impl Fn(usize, usize) -> bool,
) -> Vec<bool> {
    let near = |a, b| reach(a, b) && same(a, b);
    let local_has: Vec<bool> = (0..local)
        .map(|a| (0..remote).any(|b| near(a, b)))
        .collect();
    let remote_has: Vec<bool> = (0..remote)
        .map(|b| (0..local).any(|a| near(a, b)))
        .collect();
    (0..local)
        .flat_map(|a| (0..remote).map(move |b| (a, b)))
        .map(|(a, b)| near(a, b) || (reach(a, b) && !local_has[a] && !remote_has[b]))
        .collect()
}

/// Can a QP addressed with a GID of type `local` reach one of type
/// `remote`? Both ends must speak the same RoCE version (an unknown type,
/// from an older peer or provider, is given the benefit of the doubt).
pub(crate) fn compatible(local: Option<GidType>, remote: Option<GidType>) -> bool {
    match (local, remote) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

/// The rails between `local` NICs and `remote` ones, as (local, remote)
/// index pairs: only pairs `ok` allows, every NIC of either side that can
/// reach one of the other's in at least one pair, the load spread. Each
/// local NIC takes its least-used compatible remote NIC, then each remote
/// NIC left over takes its least-used compatible local one (ties go to the
/// NIC at the same position, then the next), so with every pair allowed
/// this is NIC `i % local` to NIC `i % remote` for `i` up to the larger
/// count.
pub(crate) fn pair_rails(
    local: usize,
    remote: usize,
    ok: impl Fn(usize, usize) -> bool,
) -> Vec<(usize, usize)> {
    let mut pairs: Vec<(usize, usize)> = Vec::with_capacity(local.max(remote));
    // Rails each NIC is in so far (a few dozen NICs at most: counted).
    let uses = |pairs: &[(usize, usize)], side: fn(&(usize, usize)) -> usize, nic: usize| {
        pairs.iter().filter(|p| side(p) == nic).count()
    };
    for a in 0..local {
        let best = (0..remote)
            .filter(|&b| ok(a, b))
            .min_by_key(|&b| (uses(&pairs, |p| p.1, b), (b + remote - a % remote) % remote));
        if let Some(b) = best {
            pairs.push((a, b));
        }
    }
    for b in 0..remote {
        if uses(&pairs, |p| p.1, b) > 0 {
            continue;
        }
        let best = (0..local)
            .filter(|&a| ok(a, b))
            .min_by_key(|&a| (uses(&pairs, |p| p.0, a), (a + local - b % local) % local));
        if let Some(a) = best {
            pairs.push((a, b));
        }
    }
    pairs
}

/// GIDs and table entries as tests write them (this module's and the
/// topology report's).
#[cfg(test)]
pub(crate) mod samples {
    use super::{GidEntry, GidType};

    /// The IPv4-mapped GID of 10.0.0.`last`.
    pub(crate) fn v4(last: u8) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[10, 0, 0, last]);
        g
    }

    /// A link-local (fe80::) GID.
    pub(crate) fn link_local() -> [u8; 16] {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[15] = 7;
        g
    }

    /// Entry `index`, of type `ty`, its netdev up.
    pub(crate) fn entry(index: u8, gid: [u8; 16], ty: GidType) -> GidEntry {
        GidEntry {
            index,
            gid,
            ty: Some(ty),
            netdev_up: Some(true),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::samples::{entry, link_local, v4};
    use super::*;

    fn global6() -> [u8; 16] {
        let mut g = [0u8; 16];
        g[0] = 0x20;
        g[1] = 0x01;
        g[15] = 9;
        g
    }

    /// What mlx5 and bnxt_re list for a netdev with one IPv4 address.
    fn mlx5_table() -> Vec<GidEntry> {
        vec![
            entry(0, link_local(), GidType::RoceV1),
            entry(1, link_local(), GidType::RoceV2),
            entry(2, v4(1), GidType::RoceV1),
            entry(3, v4(1), GidType::RoceV2),
        ]
    }

    #[test]
    fn an_mlx5_table_gives_the_ipv4_roce_v2_entry_not_the_first() {
        let c = choose(&mlx5_table(), LinkLayer::Ethernet, None).unwrap();
        assert_eq!((c.index, c.ty), (3, Some(GidType::RoceV2)));
        assert_eq!(c.why, "RoCE v2, IPv4");
    }

    #[test]
    fn roce_v2_global_ipv6_comes_before_link_local() {
        let mut t = mlx5_table();
        t.retain(|e| !is_ipv4(&e.gid));
        t.push(entry(5, global6(), GidType::RoceV2));
        t.push(entry(4, global6(), GidType::RoceV1));
        let c = choose(&t, LinkLayer::Ethernet, None).unwrap();
        assert_eq!((c.index, c.why), (5, "RoCE v2, global IPv6"));
        t.retain(|e| e.index != 5);
        let c = choose(&t, LinkLayer::Ethernet, None).unwrap();
        assert_eq!((c.index, c.why), (1, "RoCE v2, link-local"));
    }

    #[test]
    fn roce_v1_only_when_the_port_has_no_v2_entry() {
        let t: Vec<_> = mlx5_table()
            .into_iter()
            .filter(|e| e.ty == Some(GidType::RoceV1))
            .collect();
        let c = choose(&t, LinkLayer::Ethernet, None).unwrap();
        assert_eq!((c.index, c.ty), (2, Some(GidType::RoceV1)));
        assert!(c.why.contains("no RoCE v2"), "{}", c.why);
    }

    #[test]
    fn an_entry_on_a_netdev_that_is_down_is_passed_over() {
        let mut t = mlx5_table();
        t[3].netdev_up = Some(false);
        let c = choose(&t, LinkLayer::Ethernet, None).unwrap();
        assert_eq!(
            c.index, 1,
            "v2 link-local on an up device beats v2 IPv4 on a down one"
        );
        for e in &mut t {
            e.netdev_up = Some(false);
        }
        assert!(choose(&t, LinkLayer::Ethernet, None).is_err());
    }

    #[test]
    fn soft_roce_lists_only_v2_entries() {
        let t = vec![
            entry(0, link_local(), GidType::RoceV2),
            entry(1, v4(2), GidType::RoceV2),
        ];
        assert_eq!(choose(&t, LinkLayer::Ethernet, None).unwrap().index, 1);
    }

    #[test]
    fn infiniband_takes_the_port_gid() {
        let mut prefix = [0u8; 16];
        prefix[0] = 0xfe;
        prefix[1] = 0x80;
        prefix[15] = 1;
        let t = vec![entry(1, v4(3), GidType::Ib), entry(0, prefix, GidType::Ib)];
        let c = choose(&t, LinkLayer::InfiniBand, None).unwrap();
        assert_eq!((c.index, c.ty), (0, Some(GidType::Ib)));
        // An Ethernet port never takes an IB entry.
        assert!(choose(&t, LinkLayer::Ethernet, None).is_err());
    }

    #[test]
    fn a_configured_index_wins_if_it_holds_an_address() {
        let c = choose(&mlx5_table(), LinkLayer::Ethernet, Some(0)).unwrap();
        assert_eq!((c.index, c.ty), (0, Some(GidType::RoceV1)));
        assert_eq!(c.why, "transports/rdma/gid_index");
        let e = choose(&mlx5_table(), LinkLayer::Ethernet, Some(9)).unwrap_err();
        assert!(e.contains("GID index 9 is empty"), "{e}");
        assert!(
            e.ends_with("the table has [0] RoCE v1 link-local, [1] RoCE v2 link-local, [2] RoCE v1 IPv4, [3] RoCE v2 IPv4"),
            "{e}"
        );
    }

    #[test]
    fn the_reason_names_the_winning_class_and_every_entry_passed_over() {
        let t = mlx5_table();
        let c = choose(&t, LinkLayer::Ethernet, None).unwrap();
        assert_eq!(
            reason(&t, LinkLayer::Ethernet, None, &c),
            "RoCE v2, IPv4: preferred over [0] RoCE v1 link-local, \
             [1] RoCE v2 link-local, [2] RoCE v1 IPv4"
        );
        // An entry on a device that is down says so.
        let mut t = mlx5_table();
        t[3].netdev_up = Some(false);
        let c = choose(&t, LinkLayer::Ethernet, None).unwrap();
        let r = reason(&t, LinkLayer::Ethernet, None, &c);
        assert!(r.starts_with("RoCE v2, link-local: preferred over"), "{r}");
        assert!(r.ends_with("[3] RoCE v2 IPv4 (network device down)"), "{r}");
        // Soft-RoCE with one address: nothing else to prefer it over.
        let t = vec![entry(1, v4(2), GidType::RoceV2)];
        let c = choose(&t, LinkLayer::Ethernet, None).unwrap();
        assert_eq!(
            reason(&t, LinkLayer::Ethernet, None, &c),
            "RoCE v2, IPv4: the only entry in the table"
        );
    }

    #[test]
    fn a_configured_index_is_the_reason_and_the_automatic_choice_is_named() {
        let t = mlx5_table();
        let c = choose(&t, LinkLayer::Ethernet, Some(0)).unwrap();
        assert_eq!(
            reason(&t, LinkLayer::Ethernet, Some(0), &c),
            "gid_index 0 from the configuration (transports/rdma/gid_index); \
             the automatic choice would be [3] (RoCE v2, IPv4)"
        );
        let c = choose(&t, LinkLayer::Ethernet, Some(3)).unwrap();
        let r = reason(&t, LinkLayer::Ethernet, Some(3), &c);
        assert!(r.ends_with("which is also the automatic choice"), "{r}");
    }

    #[test]
    fn infiniband_reason_names_the_port_gid() {
        let t = vec![
            entry(0, link_local(), GidType::Ib),
            entry(1, global6(), GidType::Ib),
        ];
        let c = choose(&t, LinkLayer::InfiniBand, None).unwrap();
        assert_eq!(
            reason(&t, LinkLayer::InfiniBand, None, &c),
            "InfiniBand port GID (the lowest-index IB entry): preferred over [1] IB global IPv6"
        );
    }

    #[test]
    fn no_usable_gid_names_what_the_table_holds() {
        let mut t = mlx5_table();
        for e in &mut t {
            e.netdev_up = Some(false);
        }
        let e = choose(&t, LinkLayer::Ethernet, None).unwrap_err();
        assert!(
            e.contains("the table has [0] RoCE v1 link-local (network device down), ")
                && e.ends_with("[3] RoCE v2 IPv4 (network device down)"),
            "{e}"
        );
        let e = choose(&[], LinkLayer::InfiniBand, None).unwrap_err();
        assert_eq!(e, "no InfiniBand GID; the table has no entry");
    }

    #[test]
    fn an_unknown_type_is_used_as_v1() {
        let mut t = mlx5_table();
        for e in &mut t {
            e.ty = None;
        }
        let c = choose(&t, LinkLayer::Ethernet, None).unwrap();
        assert_eq!((c.index, c.ty), (2, None), "IPv4 first, type unknown");
    }

    #[test]
    fn sysfs_names_map_by_link_layer() {
        assert_eq!(
            GidType::from_sysfs("RoCE v2\n", LinkLayer::Ethernet),
            Some(GidType::RoceV2)
        );
        assert_eq!(
            GidType::from_sysfs("IB/RoCE v1", LinkLayer::Ethernet),
            Some(GidType::RoceV1)
        );
        assert_eq!(
            GidType::from_sysfs("IB/RoCE v1", LinkLayer::InfiniBand),
            Some(GidType::Ib)
        );
        assert_eq!(GidType::from_sysfs("", LinkLayer::Ethernet), None);
        for t in [GidType::Ib, GidType::RoceV1, GidType::RoceV2] {
            assert_eq!(GidType::from_code(t.code()), Some(t));
        }
        assert_eq!(GidType::from_code(3), None);
    }

    #[test]
    fn with_every_pair_allowed_rails_pair_index_to_index_round_the_larger_side() {
        for (l, r) in [(1, 1), (2, 2), (2, 4), (4, 2), (3, 2), (1, 3)] {
            let want: Vec<_> = (0..l.max(r)).map(|i| (i % l, i % r)).collect();
            assert_eq!(pair_rails(l, r, |_, _| true), want, "{l} x {r}");
        }
    }

    #[test]
    fn rails_pair_only_compatible_nics_and_leave_none_idle_that_could_serve() {
        use GidType::*;
        // Two RoCE v2 NICs and an InfiniBand one here; an InfiniBand and a
        // RoCE v2 NIC there.
        let local = [Some(RoceV2), Some(RoceV2), Some(Ib)];
        let remote = [Some(Ib), Some(RoceV2)];
        let pairs = pair_rails(3, 2, |a, b| compatible(local[a], remote[b]));
        assert_eq!(pairs, [(0, 1), (1, 1), (2, 0)]);
        // A RoCE v1 NIC reaches nothing there; the rest still pair.
        let local = [Some(RoceV1), Some(RoceV2)];
        let pairs = pair_rails(2, 2, |a, b| compatible(local[a], remote[b]));
        assert_eq!(pairs, [(1, 1)]);
        // Nothing in common: no rail.
        let pairs = pair_rails(1, 2, |_, b| compatible(Some(RoceV1), remote[b]));
        assert!(pairs.is_empty());
        // Several remote NICs for one local: each gets a rail.
        let pairs = pair_rails(1, 3, |_, _| true);
        assert_eq!(pairs, [(0, 0), (0, 1), (0, 2)]);
    }

    #[test]
    fn sysfs_gives_a_gids_type_and_whether_its_netdev_is_ours_and_up() {
        use crate::topology::fake_sysfs::FakeSysfs;
        let sys = FakeSysfs::new();
        let p = "class/infiniband/mlx5_0/ports/1/gid_attrs";
        sys.write(&format!("{p}/types/3"), "RoCE v2\n");
        sys.write(&format!("{p}/ndevs/3"), "eth0\n");
        sys.write("class/net/eth0/operstate", "up\n");
        sys.write(&format!("{p}/types/2"), "IB/RoCE v1\n");
        sys.write(&format!("{p}/ndevs/2"), "eth1\n");
        sys.write("class/net/eth1/operstate", "down\n");
        // Another container's macvlan: listed, not in this namespace.
        sys.write(&format!("{p}/types/5"), "RoCE v2\n");
        sys.write(&format!("{p}/ndevs/5"), "macvlan7\n");
        let s = Sysfs::new(sys.root());
        let at = |i| sysfs_attrs(&s, "mlx5_0", 1, i, LinkLayer::Ethernet);
        assert_eq!(at(3), (Some(GidType::RoceV2), Some(true)));
        assert_eq!(at(2), (Some(GidType::RoceV1), Some(false)));
        assert_eq!(at(5), (Some(GidType::RoceV2), Some(false)));
        // No entry at all: nothing known (InfiniBand has no netdev).
        assert_eq!(at(9), (None, None));
    }

    #[test]
    fn roce_gids_reach_only_their_own_kind_of_address() {
        use GidType::*;
        let v2 = Some(RoceV2);
        assert!(reachable(v2, &v4(1), v2, &v4(2)));
        assert!(!reachable(v2, &v4(1), v2, &link_local()));
        assert!(!reachable(v2, &global6(), v2, &link_local()));
        assert!(!reachable(v2, &v4(1), Some(RoceV1), &v4(2)));
        // A peer that does not say its type: the address still decides.
        assert!(reachable(v2, &v4(1), None, &v4(2)));
        assert!(!reachable(v2, &v4(1), None, &link_local()));
        // InfiniBand GIDs are no IP addresses.
        assert!(reachable(Some(Ib), &link_local(), Some(Ib), &global6()));
    }

    #[test]
    fn a_roce_gid_takes_the_prefix_of_its_address_on_the_netdev() {
        let addr = |ip: &str, prefix| IfAddr {
            ip: ip.parse().unwrap(),
            prefix,
        };
        let addrs = [
            addr("10.0.0.1", 24),
            addr("2001::9", 48),
            addr("fe80::1", 64),
        ];
        // v4(1) is 10.0.0.1: its /24 is the GID's first 120 bits.
        assert_eq!(roce_prefix(&v4(1), &addrs), Some(120));
        assert_eq!(roce_prefix(&global6(), &addrs), Some(48));
        // An address the device does not hold: unknown.
        assert_eq!(roce_prefix(&v4(9), &addrs), None);
        assert_eq!(roce_prefix(&link_local(), &[]), None);
    }

    #[test]
    fn gids_share_a_subnet_when_their_leading_bits_agree() {
        let (a, b) = (v4(1), v4(2));
        assert!(same_subnet(&a, Some(120), &b, Some(120)));
        // 10.0.0.1/31 and 10.0.0.2/31 are two point-to-point links.
        assert!(!same_subnet(&a, Some(127), &b, Some(127)));
        // Mismatched masks compare the longer prefix: a /24 does not
        // share a subnet with a /31 inside its range.
        assert!(!same_subnet(&a, Some(120), &b, Some(127)));
        assert!(same_subnet(&a, Some(120), &v4(1), Some(127)));
        assert!(!same_subnet(&a, None, &b, Some(120)));
        assert!(same_subnet(&a, Some(0), &global6(), Some(0)));
        // Out-of-range prefixes (a peer's) are clamped, never a panic.
        assert!(!same_subnet(&a, Some(200), &b, Some(255)));
        assert!(same_subnet(&a, Some(200), &a, Some(8)));
    }

    #[test]
    fn nics_with_a_partner_on_their_subnet_pair_only_there() {
        // Here: compute (subnet 1), storage (2), frontend (3). There:
        // frontend (3), compute (1). Every pair reaches (one routed
        // fabric), but storage has no partner on its subnet, and every
        // NIC there has one: storage gets no rail.
        let here = [1, 2, 3];
        let there = [3, 1];
        let ok = subnet_rule(3, 2, |_, _| true, |a, b| here[a] == there[b]);
        let pairs = pair_rails(3, 2, |a, b| ok[a * 2 + b]);
        assert_eq!(pairs, [(0, 1), (2, 0)]);
        // A routed fabric, one subnet per NIC: nothing shares a subnet,
        // everything reachable pairs, index to index.
        let ok = subnet_rule(2, 2, |_, _| true, |_, _| false);
        assert_eq!(pair_rails(2, 2, |a, b| ok[a * 2 + b]), [(0, 0), (1, 1)]);
        // Both: two compute NICs on their own /31s and a frontend NIC on a
        // shared subnet. The frontend pairs with its match, the compute
        // NICs among themselves.
        let here = [10, 11, 3];
        let there = [20, 21, 3];
        let ok = subnet_rule(3, 3, |_, _| true, |a, b| here[a] == there[b]);
        assert_eq!(
            pair_rails(3, 3, |a, b| ok[a * 3 + b]),
            [(0, 0), (1, 1), (2, 2)]
        );
        assert!(
            !ok[2 * 3] && !ok[2],
            "no rail between the frontend NIC and a compute one"
        );
        // Same subnet but unreachable (GID types differ): no rail, and
        // the NIC falls back to the others that have no partner.
        let ok = subnet_rule(1, 2, |_, b| b == 1, |_, b| b == 0);
        assert_eq!(ok, [false, true]);
    }

    #[test]
    fn only_the_same_known_type_is_compatible() {
        use GidType::*;
        assert!(compatible(Some(RoceV2), Some(RoceV2)));
        assert!(!compatible(Some(RoceV1), Some(RoceV2)));
        assert!(!compatible(Some(Ib), Some(RoceV2)));
        assert!(compatible(None, Some(RoceV2)));
        assert!(compatible(Some(RoceV1), None));
    }
}
