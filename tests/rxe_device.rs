//! What the rail selector reads about RDMA NICs (port speed, NUMA node),
//! checked against the real kernel inside the Soft-RoCE guest
//! (`tools/rxe-vm.sh`, `TENT_RXE_GUEST=1`, rails rxe0 .. rxe{N-1} on dummy
//! netdevs). On the host, `rxe_guest` boots the guest once with this binary
//! and its `rxe_` tests and passes only if they pass there; the `rxe_`
//! tests return at once outside the guest and are not counted there.

use tent::transport::rails::{DeviceInfo, Sysfs};
use tent::transport::rdma::nic::NicSet;

fn in_guest() -> bool {
    std::env::var("TENT_RXE_GUEST").as_deref() == Ok("1")
}

#[path = "support/rxe_guest.rs"]
mod rxe_guest;

#[test]
fn rxe_guest() {
    rxe_guest::run_this_binary(env!("CARGO_MANIFEST_DIR"), 2);
}

/// The kernel's own reading of a port (`ports/1/rate`, written by
/// `rate_show`: `"<Gb/s> Gb/sec (<lanes>X <name>)"`; older kernels leave SDR's
/// name empty): (rounded Gb/s, lanes, speed name).
fn kernel_rate(dev: &str) -> (f64, u32, String) {
    let path = format!("/sys/class/infiniband/{dev}/ports/1/rate");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let (gbps, rest) = text
        .trim()
        .split_once(" Gb/sec (")
        .unwrap_or_else(|| panic!("{path}: {text:?}"));
    let (lanes, name) = rest
        .trim_end_matches(')')
        .split_once('X')
        .unwrap_or_else(|| panic!("{path}: {text:?}"));
    (
        gbps.parse()
            .unwrap_or_else(|e| panic!("{path}: {text:?}: {e}")),
        lanes
            .parse()
            .unwrap_or_else(|e| panic!("{path}: {text:?}: {e}")),
        name.trim().to_owned(),
    )
}

#[test]
fn rxe_nic_speed_is_the_kernels_port_rate() {
    if !in_guest() {
        return;
    }
    let set = NicSet::open(&[], tent::transport::rdma::NicOptions::default())
        .expect("the guest's rxe devices open");
    assert!(!set.nics().is_empty());
    for nic in set.nics() {
        let dev = nic.ctx.name();
        let port = nic.ctx.port(1).unwrap();
        let (kernel_gbps, lanes, name) = kernel_rate(dev);
        // The kernel names the codes it read; the signalling rate per lane
        // of each name is the IBTA's.
        let lane = match name.as_str() {
            "" | "SDR" => 2.5,
            "DDR" => 5.0,
            "QDR" => 10.0,
            "FDR10" => 10.3125,
            "FDR" => 14.0625,
            "EDR" => 25.78125,
            "HDR" => 53.125,
            "NDR" => 106.25,
            other => panic!("{dev}: speed {other:?} not in this test's table"),
        };
        let ours = nic.speed_gbps.unwrap_or_else(|| {
            panic!(
                "{dev}: no speed from active_speed {} active_width {}",
                port.active_speed, port.active_width
            )
        });
        assert_eq!(
            ours,
            lane * f64::from(lanes),
            "{dev}: kernel says {name:?} x{lanes}"
        );
        // The kernel's figure is the rounded data rate: within 7 %.
        assert!(
            (ours - kernel_gbps).abs() <= 0.07 * kernel_gbps,
            "{dev}: {ours} Gb/s vs the kernel's {kernel_gbps}"
        );
        println!(
            "RXE-OK {dev}: active_speed {} active_width {} -> {ours} Gb/s (kernel rate {kernel_gbps} Gb/s, {lanes}X{name:?})",
            port.active_speed, port.active_width
        );
    }
}

#[test]
fn rxe_nic_numa_node_is_what_sysfs_says() {
    if !in_guest() {
        return;
    }
    let set = NicSet::open(&[], tent::transport::rdma::NicOptions::default())
        .expect("the guest's rxe devices open");
    for nic in set.nics() {
        let dev = nic.ctx.name();
        let path = format!("/sys/class/infiniband/{dev}/device/numa_node");
        let raw = std::fs::read_to_string(&path).map(|s| s.trim().to_owned());
        let expected = raw.as_ref().ok().and_then(|s| s.parse::<u32>().ok());
        assert_eq!(nic.numa_node, expected, "{dev}: {path} reads {raw:?}");
        let netdev = nic.netdev().map_or_else(|| "-".to_owned(), |(n, _)| n);
        let netdev = netdev.as_str();
        let info = if netdev == "-" {
            DeviceInfo::default()
        } else {
            Sysfs::default().netdev(netdev)
        };
        println!(
            "RXE-OK {dev}: numa_node file {raw:?} -> {:?}; netdev {netdev}: {info:?}",
            nic.numa_node
        );
    }
}
