//! What the engine reads about its own process and host from `/proc` and
//! the resource limits: `kB` fields of `/proc/meminfo` and
//! `/proc/self/status`, and the address space left to map. The footprint
//! check and the shm map budget both size themselves from these.

/// `FIELD:   123 kB` in `text` → 123 × 1024, with checked arithmetic (a
/// value past `u64` is no figure).
pub(crate) fn kib_field(text: &str, field: &str) -> Option<u64> {
    let kib = text
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    kib.checked_mul(1024)
}

/// This process's mapped bytes (`VmSize` in `/proc/self/status`).
pub(crate) fn vm_size() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    kib_field(&status, "VmSize:")
}

/// `RLIMIT_AS`, or `None` when the process has no such limit.
pub(crate) fn address_space_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::As).current
}

/// What this process may still map: the lower of `RLIMIT_AS` and `cap`,
/// less what it maps already (`VmSize`; a process that reserved much, as
/// GPU runtimes do, has less).
pub(crate) fn address_space_room(cap: u64) -> u64 {
    let limit = address_space_limit().map_or(cap, |l| l.min(cap));
    limit.saturating_sub(vm_size().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kib_fields_are_read_with_checked_arithmetic() {
        assert_eq!(
            kib_field(
                "MemTotal: 10 kB\nMemAvailable:   2048 kB\n",
                "MemAvailable:"
            ),
            Some(2 << 20)
        );
        assert_eq!(kib_field("MemTotal: 10 kB\n", "MemAvailable:"), None);
        assert_eq!(
            kib_field("Name:\tx\nVmSize:\t  2048 kB\n", "VmSize:"),
            Some(2 << 20)
        );
        assert_eq!(
            kib_field("VmSize:\t99999999999999999999 kB\n", "VmSize:"),
            None
        );
        assert_eq!(
            kib_field(&format!("VmSize: {} kB\n", u64::MAX), "VmSize:"),
            None
        );
        assert_eq!(kib_field("VmRSS: 1 kB\n", "VmSize:"), None);
        assert_eq!(kib_field("VmSize: 12\n", "VmSize:"), None);
    }

    #[test]
    fn the_room_is_below_the_cap_and_what_is_mapped_counts() {
        // Other tests map and unmap meanwhile, so VmSize only bounds it.
        assert!(vm_size().expect("VmSize on Linux") > 0);
        let room = address_space_room(1 << 47);
        assert!(room > 0 && room < 1 << 47);
        assert_eq!(address_space_room(0), 0);
    }
}
