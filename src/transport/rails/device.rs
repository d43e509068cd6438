//! What the rail selector needs to know about a local device: the NUMA node
//! it hangs off (for its tier, [`crate::topology::Topology::tier`]) and its
//! theoretical speed (the starting point of a rail's bandwidth estimate).
//!
//! Read from sysfs under a root that tests point at a temp tree. Every
//! value the kernel may leave unknown ("-1", a missing file, `EINVAL` from
//! a virtual or down interface) and every malformed one reads as `None`:
//! the selector then treats the device as local and of default speed,
//! rather than the engine failing to start over a sysfs oddity. An RDMA
//! NIC's speed comes from its port instead (`PortInfo::speed_gbps`).

use std::path::PathBuf;

use crate::topology::read_sysfs_text;

/// Longest device name accepted (Linux caps interface names at 15 bytes
/// and IB device names at 64).
const MAX_NAME_BYTES: usize = 64;

/// A local device as the rail selector sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DeviceInfo {
    /// The NUMA node the device hangs off; `None` when unknown (no PCI
    /// device behind it, or a single-node machine that says -1).
    pub numa_node: Option<u32>,
    /// The link's theoretical speed in Gbit/s; `None` when unknown.
    pub speed_gbps: Option<f64>,
}

/// The sysfs tree devices are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    /// The machine's own `/sys`.
    fn default() -> Sysfs {
        Sysfs::new("/sys")
    }
}

impl Sysfs {
    /// A sysfs tree rooted at `root` (tests: a temp directory laid out like
    /// `/sys`).
    pub(crate) fn new(root: impl Into<PathBuf>) -> Sysfs {
        Sysfs { root: root.into() }
    }

    /// A network interface: its NUMA node from
    /// `class/net/<ifname>/device/numa_node` and its speed from
    /// `class/net/<ifname>/speed` (Mb/s). A name that could leave
    /// `class/net` (see [`valid_name`]) reads as nothing known.
    ///
    /// ```
    /// use tent::transport::rails::Sysfs;
    ///
    /// // The loopback has no PCI device and no speed (reading it is EINVAL).
    /// let lo = Sysfs::default().netdev("lo");
    /// assert_eq!((lo.numa_node, lo.speed_gbps), (None, None));
    /// ```
    pub fn netdev(&self, ifname: &str) -> DeviceInfo {
        let Some(dir) = self.device_dir("class/net", ifname) else {
            return DeviceInfo::default();
        };
        DeviceInfo {
            numa_node: read_sysfs_text(&dir.join("device/numa_node"))
                .ok()
                .and_then(|s| parse_numa_node(&s)),
            speed_gbps: read_sysfs_text(&dir.join("speed"))
                .ok()
                .and_then(|s| parse_speed_mbps(&s)),
        }
    }

    /// An RDMA device's NUMA node, from
    /// `class/infiniband/<name>/device/numa_node`.
    pub(crate) fn ibdev_numa(&self, name: &str) -> Option<u32> {
        let dir = self.device_dir("class/infiniband", name)?;
        parse_numa_node(&read_sysfs_text(&dir.join("device/numa_node")).ok()?)
    }

    /// An RDMA device's PCI address (`0000:3b:00.0`), from where its
    /// `class/infiniband/<name>/device` link points; `None` without the
    /// link (Soft-RoCE has none) or when it names no PCI function.
    pub(crate) fn ibdev_pci(&self, name: &str) -> Option<String> {
        let dir = self.device_dir("class/infiniband", name)?;
        let target = std::fs::read_link(dir.join("device")).ok()?;
        let last = target.file_name()?.to_str()?;
        is_pci_address(last).then(|| last.to_owned())
    }

    /// The text of `class/infiniband/<name>/<rel>` (trimmed), for an RDMA
    /// device's port attributes; `None` when it cannot be read.
    pub(crate) fn ibdev_text(&self, name: &str, rel: &str) -> Option<String> {
        let dir = self.device_dir("class/infiniband", name)?;
        read_sysfs_text(&dir.join(rel)).ok()
    }

    /// Whether network interface `ifname` is up, from its `operstate`
    /// (`"unknown"`, which virtual devices report, counts as up); `None`
    /// when it cannot be read.
    pub(crate) fn netdev_up(&self, ifname: &str) -> Option<bool> {
        let dir = self.device_dir("class/net", ifname)?;
        let state = read_sysfs_text(&dir.join("operstate")).ok()?;
        Some(matches!(state.as_str(), "up" | "unknown"))
    }

    /// `<root>/<class>/<name>`, for a name that stays inside `<class>`.
    fn device_dir(&self, class: &str, name: &str) -> Option<PathBuf> {
        if !valid_name(name) {
            tracing::debug!(name = %name.escape_debug(), class, "device name refused for a sysfs path");
            return None;
        }
        Some(self.root.join(class).join(name))
    }
}

/// Is `name` safe to join under a sysfs class directory: non-empty, at
/// most 64 bytes, no `/`, no `..`, no NUL? Names reach here from the
/// configuration and from device lists, and a descriptor may carry any
/// bytes; none of them gets to name a path outside the class.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name != "."
        && !name.contains("..")
        && !name.contains(['/', '\0'])
}

/// Is `s` a PCI address as sysfs names devices: `dddd:bb:dd.f` in hex
/// (domain, bus, device, function)?
fn is_pci_address(s: &str) -> bool {
    let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit());
    let mut parts = s.split(':');
    let (Some(domain), Some(bus), Some(rest), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let Some((dev, func)) = rest.split_once('.') else {
        return false;
    };
    hex(domain, 4) && hex(bus, 2) && hex(dev, 2) && hex(func, 1)
}

/// A sysfs `numa_node`: a non-negative node id; "-1" (no affinity) and
/// anything that is not a decimal `i32` are unknown.
fn parse_numa_node(text: &str) -> Option<u32> {
    u32::try_from(text.parse::<i32>().ok()?).ok()
}

/// A sysfs `speed` in Mb/s, as Gbit/s. "-1" (`SPEED_UNKNOWN`, also seen as
/// its unsigned 4294967295), 0 and anything not a decimal `u32` are
/// unknown. Out-of-range speeds are the selector's to clamp.
fn parse_speed_mbps(text: &str) -> Option<f64> {
    let mbps = text.parse::<u32>().ok()?;
    (mbps != 0 && mbps != u32::MAX).then(|| f64::from(mbps) / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::fake_sysfs::FakeSysfs;

    #[test]
    fn netdev_reads_node_and_speed() {
        let sys = FakeSysfs::new();
        sys.write("class/net/eth1/device/numa_node", "1\n");
        sys.write("class/net/eth1/speed", "100000\n");
        sys.write("class/net/eth2/device/numa_node", "0");
        sys.write("class/net/eth2/speed", "25000");
        let s = Sysfs::new(sys.root());
        assert_eq!(
            s.netdev("eth1"),
            DeviceInfo {
                numa_node: Some(1),
                speed_gbps: Some(100.0)
            }
        );
        assert_eq!(s.netdev("eth2").numa_node, Some(0));
        assert_eq!(s.netdev("eth2").speed_gbps, Some(25.0));
    }

    #[test]
    fn netdev_unknowns_read_as_none() {
        let sys = FakeSysfs::new();
        // A virtual interface: no device directory, speed "-1".
        sys.write("class/net/veth0/speed", "-1\n");
        // Node -1 (no affinity), speed 0.
        sys.write("class/net/eth0/device/numa_node", "-1\n");
        sys.write("class/net/eth0/speed", "0\n");
        let s = Sysfs::new(sys.root());
        assert_eq!(s.netdev("veth0"), DeviceInfo::default());
        assert_eq!(s.netdev("eth0"), DeviceInfo::default());
        assert_eq!(s.netdev("absent"), DeviceInfo::default());
    }

    #[test]
    fn hostile_contents_read_as_none() {
        let bad: &[&[u8]] = &[
            b"",
            b"\n",
            b"-5",
            b"-2147483649",
            b"4294967295",
            b"99999999999999999999999",
            b"1e3",
            b"0x10",
            b"1 2",
            b"\xff\xfe",
            b"1\0",
            b"one",
        ];
        for &contents in bad {
            let sys = FakeSysfs::new();
            sys.write("class/net/eth0/device/numa_node", contents);
            sys.write("class/net/eth0/speed", contents);
            sys.write("class/infiniband/mlx5_0/device/numa_node", contents);
            let s = Sysfs::new(sys.root());
            let what = String::from_utf8_lossy(contents);
            assert_eq!(s.netdev("eth0"), DeviceInfo::default(), "{what:?}");
            assert_eq!(s.ibdev_numa("mlx5_0"), None, "{what:?}");
        }
        // A node id beyond i32 is garbage, not a huge node.
        assert_eq!(parse_numa_node("2147483648"), None);
        assert_eq!(parse_numa_node("2147483647"), Some(i32::MAX as u32));
        // Over-long: more than any sysfs attribute holds.
        let sys = FakeSysfs::new();
        sys.write(
            "class/net/eth0/speed",
            format!("1000{}", " ".repeat(70_000)),
        );
        assert_eq!(Sysfs::new(sys.root()).netdev("eth0").speed_gbps, None);
    }

    #[test]
    fn speed_is_megabits_to_gigabits() {
        assert_eq!(parse_speed_mbps("1000"), Some(1.0));
        assert_eq!(parse_speed_mbps("400000"), Some(400.0));
        assert_eq!(parse_speed_mbps("10"), Some(0.01));
        // The largest real value is passed on; clamping is the selector's.
        assert_eq!(parse_speed_mbps("4294967294"), Some(4_294_967.294));
    }

    #[test]
    fn ibdev_numa_reads_the_device_node() {
        let sys = FakeSysfs::new();
        sys.write("class/infiniband/mlx5_1/device/numa_node", "3\n");
        sys.write("class/infiniband/rxe0/device/numa_node", "-1\n");
        let s = Sysfs::new(sys.root());
        assert_eq!(s.ibdev_numa("mlx5_1"), Some(3));
        assert_eq!(s.ibdev_numa("rxe0"), None);
        assert_eq!(s.ibdev_numa("mlx5_9"), None);
    }

    #[test]
    fn ibdev_pci_is_where_the_device_link_points() {
        let sys = FakeSysfs::new();
        sys.write(
            "devices/pci0000:3a/0000:3a:00.0/0000:3b:00.1/vendor",
            "0x15b3",
        );
        sys.write("class/infiniband/mlx5_1/node_type", "1");
        sys.write("class/infiniband/rxe0/node_type", "1");
        sys.write("class/infiniband/virt0/node_type", "1");
        let ib = sys.root().join("class/infiniband");
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.1",
            ib.join("mlx5_1/device"),
        )
        .unwrap();
        // A device that is no PCI function (a virtual bus).
        std::os::unix::fs::symlink("../../../devices/virtual/net/eth0", ib.join("virt0/device"))
            .unwrap();
        let s = Sysfs::new(sys.root());
        assert_eq!(s.ibdev_pci("mlx5_1").as_deref(), Some("0000:3b:00.1"));
        // Soft-RoCE: no device link.
        assert_eq!(s.ibdev_pci("rxe0"), None);
        assert_eq!(s.ibdev_pci("virt0"), None);
        assert_eq!(s.ibdev_pci("../mlx5_1"), None);
        assert!(is_pci_address("0000:00:1f.6"));
        for bad in [
            "",
            "0000:3b:00",
            "00:3b:00.1",
            "0000:3b:00.1x",
            "0000:3b:0g.1",
            "a:b:c:d.e",
        ] {
            assert!(!is_pci_address(bad), "{bad:?}");
        }
    }

    #[test]
    fn names_that_could_leave_the_class_are_refused() {
        let sys = FakeSysfs::new();
        // Files a hostile name would reach if it were joined as is.
        sys.write("class/numa_node", "1");
        sys.write("class/net/device/numa_node", "1");
        sys.write("class/net/speed", "1000");
        sys.write("class/net/a/b/device/numa_node", "1");
        sys.write("class/device/numa_node", "1");
        sys.write("class/infiniband/device/numa_node", "1");
        let long = "x".repeat(65);
        sys.write(&format!("class/net/{long}/speed"), "1000");
        let s = Sysfs::new(sys.root());
        for name in ["", ".", "..", "../net", "a/b", "/", "a\0b", "x..y", &long] {
            assert_eq!(s.netdev(name), DeviceInfo::default(), "{name:?}");
            assert_eq!(s.ibdev_numa(name), None, "{name:?}");
            assert!(!valid_name(name), "{name:?}");
        }
        for name in ["eth0", "mlx5_0", "rxe0", "enp65s0f0np0", "a.b", &long[..64]] {
            assert!(valid_name(name), "{name:?}");
        }
    }

    #[test]
    fn the_loopback_on_this_machine_has_no_node_and_no_speed() {
        // The real kernel: reading lo's speed fails with EINVAL.
        assert!(
            std::path::Path::new("/sys/class/net/lo").exists(),
            "no /sys/class/net/lo"
        );
        assert_eq!(Sysfs::default().netdev("lo"), DeviceInfo::default());
    }
}
