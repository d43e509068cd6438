//! rdma-core's verbs, loaded at run time.
//!
//! The bindings come from `build.rs` (bindgen over Debian's headers). No
//! binary links against libibverbs: [`verbs`] dlopens `libibverbs.so.1`
//! once, so a machine without rdma-core (or without RDMA devices) gets an
//! ordinary [`Unavailable`] answer and the engine goes on with TCP/SHM.
//! The static-inline hot-path verbs are ported in [`ops`].

pub(crate) mod ops;

/// The generated bindings.
#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    unsafe_op_in_unsafe_fn,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
pub mod ffi {
    include!(concat!(env!("OUT_DIR"), "/verbs.rs"));
}

use std::ffi::CStr;
use std::sync::OnceLock;

/// The library every binding loads from (`TENT_LIBIBVERBS` overrides it,
/// e.g. to test a machine without rdma-core).
pub(crate) const LIBIBVERBS: &str = "libibverbs.so.1";

/// Why RDMA cannot be used here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RDMA unavailable: {}; using TCP/SHM", self.0)
    }
}

impl std::error::Error for Unavailable {}

static LIB: OnceLock<Result<ffi::IbvLib, String>> = OnceLock::new();

/// The verbs library, loaded on first use.
pub(crate) fn verbs() -> Result<&'static ffi::IbvLib, Unavailable> {
    LIB.get_or_init(|| {
        let name = std::env::var("TENT_LIBIBVERBS").unwrap_or_else(|_| LIBIBVERBS.to_owned());
        // SAFETY: loading libibverbs runs its constructors, which only read the provider configuration; no other code is affected.
        unsafe { ffi::IbvLib::new(name.as_str()) }
            .map_err(|e| format!("cannot load {name} ({e}); install rdma-core"))
    })
    .as_ref()
    .map_err(|e| Unavailable(e.clone()))
}

/// The names of the RDMA devices on this machine.
pub fn devices() -> Result<Vec<String>, Unavailable> {
    let lib = verbs()?;
    let mut n: i32 = 0;
    // SAFETY: `n` is a valid out-parameter; a NULL result is handled below.
    let list = unsafe { lib.ibv_get_device_list(&mut n) };
    if list.is_null() {
        // Without kernel support the list is NULL with ENOSYS, not empty.
        let e = std::io::Error::last_os_error();
        return Err(Unavailable(no_device(
            &format!("libibverbs lists none ({e})"),
            &kernel_devices(std::path::Path::new("/sys")),
        )));
    }
    let mut names = Vec::with_capacity(n.max(0) as usize);
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds `n` device pointers, followed by NULL.
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: `dev` is a live device of the list; its name is a NUL-terminated string owned by the library.
        let name = unsafe { CStr::from_ptr(lib.ibv_get_device_name(dev)) };
        names.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { lib.ibv_free_device_list(list) };
    if names.is_empty() {
        return Err(Unavailable(no_device(
            "libibverbs lists none",
            &kernel_devices(std::path::Path::new("/sys")),
        )));
    }
    Ok(names)
}

/// The RDMA devices the kernel has (`<sys>/class/infiniband`), sorted:
/// what "no RDMA device" names as found when libibverbs lists none (a
/// device the kernel has and the library does not is a missing provider,
/// or one this container cannot open).
pub(crate) fn kernel_devices(sys: &std::path::Path) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(sys.join("class/infiniband")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = dir
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

/// The "no RDMA device" message: what libibverbs said, and what the
/// kernel has instead.
fn no_device(library: &str, kernel: &[String]) -> String {
    if kernel.is_empty() {
        format!(
            "no RDMA device: {library}, and the kernel has none (/sys/class/infiniband is empty or absent)"
        )
    } else {
        format!(
            "no RDMA device: {library}, though the kernel has {} (no user-space provider for it, or /dev/infiniband is not reachable here)",
            kernel.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_device_names_what_the_kernel_has_instead() {
        use crate::topology::fake_sysfs::FakeSysfs;
        let sys = FakeSysfs::new();
        assert!(kernel_devices(sys.root()).is_empty());
        let m = no_device("libibverbs lists none", &kernel_devices(sys.root()));
        assert!(m.contains("the kernel has none"), "{m}");
        sys.write("class/infiniband/mlx5_1/node_type", "1");
        sys.write("class/infiniband/mlx5_0/node_type", "1");
        let found = kernel_devices(sys.root());
        assert_eq!(found, ["mlx5_0", "mlx5_1"]);
        let m = no_device("libibverbs lists none", &found);
        assert!(
            m.starts_with(
                "no RDMA device: libibverbs lists none, though the kernel has mlx5_0, mlx5_1"
            ),
            "{m}"
        );
    }

    #[test]
    fn answers_with_devices_or_a_reason() {
        match devices() {
            Ok(d) => assert!(!d.is_empty()),
            Err(u) => {
                let s = u.to_string();
                assert!(s.starts_with("RDMA unavailable: "), "{s}");
                assert!(s.ends_with("; using TCP/SHM"), "{s}");
            }
        }
    }
}
