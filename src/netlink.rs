//! Link state from the kernel (rtnetlink) and the local interfaces.
//!
//! [`interfaces`] and [`link_up`] answer "what is the state now" (for
//! start-up); [`LinkWatch`] reports changes as the kernel announces them, so
//! a transport can fail over when a rail loses carrier instead of waiting
//! for its requests to time out.
//!
//! A link counts as up when it is administratively up and has carrier:
//! `IFF_UP && (IFF_LOWER_UP || IFF_RUNNING)`. `IFF_RUNNING` is accepted too
//! because some sources (the 16-bit `SIOCGIFFLAGS`) never carry `LOWER_UP`.

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::thread::JoinHandle;

use rustix::event::{self, EventfdFlags, PollFd, PollFlags};
use rustix::io::Errno;
use rustix::net::{
    self, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType, netlink::SocketAddrNetlink,
};

/// One local network interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// Kernel name, e.g. `eth0`.
    pub name: String,
    /// Kernel interface index (what [`LinkEvent::index`] refers to).
    pub index: u32,
    /// Administratively up and with carrier.
    pub up: bool,
    /// Its IPv4 and IPv6 addresses.
    pub addrs: Vec<IfAddr>,
}

/// One address of an interface and the length of its network prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IfAddr {
    /// The address.
    pub ip: IpAddr,
    /// Its prefix length in bits (`24` for a /24), from the netmask.
    pub prefix: u8,
}

/// A change of one link's state, as announced by the kernel.
///
/// The kernel sends `RTM_NEWLINK` for many attribute changes, so the same
/// state may be reported more than once: treat events as levels, not edges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkEvent {
    /// Kernel interface index.
    pub index: u32,
    /// The link's state after the change (`false` once it is deleted).
    pub up: bool,
}

fn flags_up(flags: u32) -> bool {
    let carrier = (libc::IFF_LOWER_UP | libc::IFF_RUNNING) as u32;
    flags & libc::IFF_UP as u32 != 0 && flags & carrier != 0
}

/// The local interfaces, loopback included, ordered by index.
pub fn interfaces() -> io::Result<Vec<Interface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into a valid out-pointer; freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out: Vec<Interface> = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) };
        let pos = match out
            .iter()
            .position(|i| i.name.as_bytes() == name.to_bytes())
        {
            Some(p) => p,
            None => {
                // SAFETY: `name` is a valid NUL-terminated C string.
                let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
                if index == 0 {
                    continue; // vanished since the dump
                }
                let name = name.to_string_lossy().into_owned();
                let up = flags_up(ifa.ifa_flags);
                out.push(Interface {
                    name,
                    index,
                    up,
                    addrs: Vec::new(),
                });
                out.len() - 1
            }
        };
        // SAFETY: a non-null ifa_addr points at a sockaddr of its family's size.
        if let Some(ip) = unsafe { sockaddr_ip(ifa.ifa_addr) } {
            // SAFETY: the same holds for ifa_netmask (null for some families).
            let mask = unsafe { sockaddr_ip(ifa.ifa_netmask) };
            out[pos].addrs.push(IfAddr {
                ip,
                prefix: mask.map_or(full_prefix(ip), prefix_len),
            });
        }
    }
    // SAFETY: `head` came from getifaddrs and no reference into it outlives this.
    unsafe { libc::freeifaddrs(head) };
    out.sort_by_key(|i| i.index);
    Ok(out)
}

/// # Safety
/// `sa` is null or points at a sockaddr whose size matches its `sa_family`.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: non-null and, per the contract, the family decides the real type.
    match i32::from(unsafe { (*sa).sa_family }) {
        libc::AF_INET => {
            // SAFETY: an AF_INET sockaddr is a sockaddr_in.
            let sin = unsafe { &*sa.cast::<libc::sockaddr_in>() };
            Some(Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()).into())
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6.
            let sin6 = unsafe { &*sa.cast::<libc::sockaddr_in6>() };
            Some(Ipv6Addr::from(sin6.sin6_addr.s6_addr).into())
        }
        _ => None,
    }
}

/// The length of the prefix a netmask covers: its leading one bits.
fn prefix_len(mask: IpAddr) -> u8 {
    let ones = match mask {
        IpAddr::V4(m) => u32::from(m).leading_ones(),
        IpAddr::V6(m) => u128::from(m).leading_ones(),
    };
    // At most 128.
    ones as u8
}

/// A host route's prefix: the whole address.
fn full_prefix(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

/// The interface that holds local address `ip`, if any.
pub fn interface_of(ip: IpAddr) -> io::Result<Option<Interface>> {
    Ok(interfaces()?
        .into_iter()
        .find(|i| i.addrs.iter().any(|a| a.ip == ip)))
}

/// Whether link `index` is up now. An index with no interface (deleted, or
/// never existed) is down, matching what [`LinkWatch`] reports on deletion.
pub fn link_up(index: u32) -> io::Result<bool> {
    Ok(interfaces()?.iter().any(|i| i.index == index && i.up))
}

const NLMSG_HDRLEN: usize = 16;
const IFINFOMSG_LEN: usize = 16;

/// Set link `index` administratively up or down (`ip link set dev X
/// up|down` as one rtnetlink request, acknowledged; needs CAP_NET_ADMIN).
/// For chaos runs that must time a link going down without paying for a
/// process spawn.
pub fn set_link(index: u32, up: bool) -> io::Result<()> {
    let fd = route_socket()?;
    let len = NLMSG_HDRLEN + IFINFOMSG_LEN;
    let mut msg = [0u8; NLMSG_HDRLEN + IFINFOMSG_LEN];
    msg[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
    msg[4..6].copy_from_slice(&libc::RTM_NEWLINK.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16;
    msg[6..8].copy_from_slice(&flags.to_ne_bytes());
    msg[8..12].copy_from_slice(&1u32.to_ne_bytes()); // sequence
    // ifinfomsg: family (u8), pad, type (u16), index (i32), flags, change.
    let h = NLMSG_HDRLEN;
    msg[h + 4..h + 8].copy_from_slice(&(index as i32).to_ne_bytes());
    let iff_up = libc::IFF_UP as u32;
    msg[h + 8..h + 12].copy_from_slice(&(if up { iff_up } else { 0 }).to_ne_bytes());
    msg[h + 12..h + 16].copy_from_slice(&iff_up.to_ne_bytes());
    // The kernel is the peer: no address needed on a netlink socket's
    // default destination.
    net::send(&fd, &msg, SendFlags::empty())?;
    let mut ack = [0u8; 256];
    let (got, _) = net::recv(&fd, &mut ack[..], RecvFlags::empty())?;
    // NLMSG_ERROR carries an errno (0 = acknowledged).
    let ty = u16::from_ne_bytes([ack[4], ack[5]]);
    if ty == libc::NLMSG_ERROR as u16 && got >= NLMSG_HDRLEN + 4 {
        let errno = i32::from_ne_bytes(ack[h..h + 4].try_into().expect("4 bytes"));
        if errno != 0 {
            return Err(io::Error::from_raw_os_error(-errno));
        }
    }
    Ok(())
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

/// Parse one `recv()` buffer of netlink messages into events.
///
/// Malformed input never panics: a message too short for its `ifinfomsg` is
/// skipped, and a header whose length cannot be trusted ends the parse (the
/// next header's position would be a guess).
pub(crate) fn parse_link_messages(buf: &[u8], out: &mut Vec<LinkEvent>) {
    let mut off = 0;
    while buf.len() - off >= NLMSG_HDRLEN {
        let msg = &buf[off..];
        let len = u32_at(msg, 0).unwrap_or(0) as usize;
        if len < NLMSG_HDRLEN || len > msg.len() {
            return;
        }
        let ty = u16::from_ne_bytes([msg[4], msg[5]]);
        if ty == libc::NLMSG_DONE as u16 {
            return;
        }
        if (ty == libc::RTM_NEWLINK || ty == libc::RTM_DELLINK)
            && len >= NLMSG_HDRLEN + IFINFOMSG_LEN
        {
            // ifinfomsg: family u8, pad u8, type u16, index i32, flags u32, change u32.
            let index = u32_at(msg, NLMSG_HDRLEN + 4).unwrap_or(0);
            let flags = u32_at(msg, NLMSG_HDRLEN + 8).unwrap_or(0);
            if index as i32 > 0 {
                let up = ty == libc::RTM_NEWLINK && flags_up(flags);
                out.push(LinkEvent { index, up });
            }
        }
        // Messages are 4-byte aligned; the last one's padding may be absent.
        off = (off + len.next_multiple_of(4)).min(buf.len());
    }
}

/// A thread reading `RTMGRP_LINK` notifications and passing them on.
///
/// The thread sleeps in `poll` until the kernel speaks or the watch is
/// dropped (an eventfd), so an idle engine pays no periodic wakeup.
/// Dropping it stops and joins the thread.
pub struct LinkWatch {
    stop: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for LinkWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkWatch").finish_non_exhaustive()
    }
}

impl LinkWatch {
    /// Subscribe to link notifications and call `on_event` for each
    /// `RTM_NEWLINK` / `RTM_DELLINK`, on a thread of its own. The subscription
    /// is live when this returns, so no change after it is missed.
    pub fn start(on_event: impl Fn(LinkEvent) + Send + 'static) -> io::Result<LinkWatch> {
        let fd = open_socket().inspect_err(|e| {
            tracing::warn!(error = %e, "netlink: cannot open a link-notification socket");
        })?;
        let stop = Arc::new(event::eventfd(0, EventfdFlags::CLOEXEC)?);
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("tent-linkwatch".into())
            .spawn(move || watch(fd, &flag, on_event))?;
        Ok(LinkWatch {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for LinkWatch {
    fn drop(&mut self) {
        let _ = rustix::io::write(&*self.stop, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A `NETLINK_ROUTE` socket (protocol 0).
fn route_socket() -> io::Result<OwnedFd> {
    Ok(net::socket_with(
        AddressFamily::NETLINK,
        SocketType::RAW,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

fn open_socket() -> io::Result<OwnedFd> {
    let fd = route_socket()?;
    net::bind(&fd, &SocketAddrNetlink::new(0, libc::RTMGRP_LINK as u32))?;
    Ok(fd)
}

fn watch(fd: OwnedFd, stop: &OwnedFd, on_event: impl Fn(LinkEvent)) {
    let mut buf = vec![0u8; 32 * 1024];
    let mut events = Vec::new();
    loop {
        let mut fds = [
            PollFd::new(&fd, PollFlags::IN),
            PollFd::new(stop, PollFlags::IN),
        ];
        match event::poll(&mut fds, None) {
            Err(Errno::INTR) => continue,
            Err(_) => return,
            Ok(_) if !fds[1].revents().is_empty() => return,
            Ok(_) if fds[0].revents().is_empty() => continue,
            Ok(_) => {}
        }
        let (n, from) = match net::recvfrom(&fd, &mut buf[..], RecvFlags::DONTWAIT) {
            Ok((n, _, from)) => (n, from),
            Err(Errno::AGAIN | Errno::INTR) => continue,
            // The socket buffer overflowed: some events are lost, but the
            // socket still works and the next event carries full state.
            Err(Errno::NOBUFS) => {
                tracing::warn!("netlink: link events dropped (ENOBUFS)");
                continue;
            }
            Err(e) => {
                let e = io::Error::from(e);
                tracing::warn!(error = %e, "netlink: link watch stopped");
                return;
            }
        };
        // Only the kernel (port 0) speaks for the links; ignore other senders.
        let port = from.map(|a| SocketAddrNetlink::try_from(a).map(|nl| nl.pid()));
        if !matches!(port, None | Some(Ok(0))) {
            continue;
        }
        events.clear();
        parse_link_messages(&buf[..n], &mut events);
        for ev in &events {
            tracing::debug!(index = ev.index, up = ev.up, "netlink: link event");
            on_event(*ev);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UP: u32 = (libc::IFF_UP | libc::IFF_LOWER_UP | libc::IFF_RUNNING) as u32;

    fn msg(ty: u16, index: i32, flags: u32) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&32u32.to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&[0; 10]); // nlmsg flags, seq, pid
        m.extend_from_slice(&[0, 0, 1, 0]); // family, pad, type (ARPHRD_ETHER)
        m.extend_from_slice(&index.to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&u32::MAX.to_ne_bytes()); // change
        m
    }

    fn parse(buf: &[u8]) -> Vec<LinkEvent> {
        let mut out = Vec::new();
        parse_link_messages(buf, &mut out);
        out
    }

    #[test]
    fn a_netmask_gives_its_prefix_length() {
        let v4 = |a, b, c, d| IpAddr::V4(Ipv4Addr::new(a, b, c, d));
        assert_eq!(prefix_len(v4(255, 255, 255, 0)), 24);
        assert_eq!(prefix_len(v4(255, 255, 255, 254)), 31);
        assert_eq!(prefix_len(v4(0, 0, 0, 0)), 0);
        assert_eq!(prefix_len(IpAddr::V6(Ipv6Addr::from(!0u128 << 64))), 64);
        assert_eq!(prefix_len(IpAddr::V6(Ipv6Addr::from(!0u128))), 128);
        assert_eq!(full_prefix(v4(10, 0, 0, 1)), 32);
    }

    /// Every Linux host has loopback with 127.0.0.1/8.
    #[test]
    fn loopback_lists_its_address_with_its_prefix() {
        let lo = interface_of(IpAddr::V4(Ipv4Addr::LOCALHOST))
            .unwrap()
            .expect("loopback");
        let a = lo
            .addrs
            .iter()
            .find(|a| a.ip == IpAddr::V4(Ipv4Addr::LOCALHOST))
            .unwrap();
        assert_eq!(a.prefix, 8, "{lo:?}");
    }

    #[test]
    fn newlink_up_down_and_dellink() {
        let mut buf = msg(libc::RTM_NEWLINK, 3, UP);
        buf.extend(msg(libc::RTM_NEWLINK, 4, libc::IFF_UP as u32)); // no carrier
        buf.extend(msg(libc::RTM_NEWLINK, 5, 0));
        buf.extend(msg(libc::RTM_DELLINK, 6, UP));
        let ev = |index, up| LinkEvent { index, up };
        let want = [ev(3, true), ev(4, false), ev(5, false), ev(6, false)];
        assert_eq!(parse(&buf), want);
    }

    #[test]
    fn done_and_other_types_yield_nothing_more() {
        let mut buf = msg(libc::RTM_NEWADDR, 3, UP);
        buf.extend(msg(libc::RTM_NEWLINK, 7, UP));
        let mut done = msg(libc::NLMSG_DONE as u16, 0, 0);
        done.truncate(20);
        done[0..4].copy_from_slice(&20u32.to_ne_bytes());
        buf.extend(done);
        buf.extend(msg(libc::RTM_NEWLINK, 8, UP));
        assert_eq!(parse(&buf), [LinkEvent { index: 7, up: true }]);
    }

    #[test]
    fn malformed_input_does_not_panic() {
        let good = msg(libc::RTM_NEWLINK, 3, UP);
        for cut in 0..good.len() {
            assert!(parse(&good[..cut]).is_empty(), "cut at {cut}");
        }
        let mut long = good.clone();
        long[0..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(parse(&long).is_empty());
        for bad in [0u32, 8, 15] {
            let mut short = good.clone();
            short[0..4].copy_from_slice(&bad.to_ne_bytes());
            assert!(parse(&short).is_empty());
        }
        // Header claims only itself: no ifinfomsg, skipped; the next one counts.
        let mut buf = good.clone();
        buf[0..4].copy_from_slice(&16u32.to_ne_bytes());
        buf.truncate(16);
        buf.extend(msg(libc::RTM_NEWLINK, 9, UP));
        assert_eq!(parse(&buf), [LinkEvent { index: 9, up: true }]);
        let mut neg = msg(libc::RTM_NEWLINK, -1, UP);
        neg.extend(msg(libc::RTM_NEWLINK, 0, UP));
        assert!(parse(&neg).is_empty());
        let _ = parse(&[0xff; 7]);
    }

    #[test]
    fn loopback_is_listed_up_with_127_0_0_1() {
        let lo = interface_of(Ipv4Addr::LOCALHOST.into()).unwrap().unwrap();
        assert_eq!(lo.name, "lo");
        assert!(lo.up);
        assert!(interfaces().unwrap().contains(&lo));
        assert!(link_up(lo.index).unwrap());
        assert!(!link_up(u32::MAX).unwrap());
    }

    #[test]
    fn link_watch_stops_promptly_on_drop() {
        let watch = LinkWatch::start(|_| {}).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let t = std::time::Instant::now();
        drop(watch);
        assert!(t.elapsed() < std::time::Duration::from_millis(150));
    }
}
