//! Compiling the C test programs with `cc` against the library `cargo
//! test` built next to this test executable.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// How a C program links the library.
pub(crate) enum Link {
    /// `libtent_c.so`, found at run time through an rpath.
    Shared,
    /// `libtent_c.a` and the system libraries it needs.
    Static,
}

/// The library's name: `lib{LIB}.so`, `lib{LIB}.a`, `-l{LIB}`.
const LIB: &str = "tent_c";

/// Where `cargo test` put `libtent_c.so` and `libtent_c.a`: `deps/`, beside
/// this test executable (cargo builds the lib, with every crate type,
/// before the tests that depend on it; `deps/` holds what it built this
/// run, where the copies one level up may be stale or, in a workspace
/// with another lib named `tent`, the other's).
pub(crate) fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().expect("target/<profile>/deps").to_path_buf();
    for lib in [format!("lib{LIB}.so"), format!("lib{LIB}.a")] {
        assert!(
            dir.join(&lib).is_file(),
            "{} missing: cargo test builds it with the lib (crate-type cdylib, staticlib)",
            dir.join(&lib).display()
        );
    }
    dir
}

/// Compile `capi/tests/c/<name>.c` into `<name>-<suffix>`; the
/// executable's path. Warnings are errors: the header must compile clean.
pub(crate) fn compile(name: &str, link: Link) -> PathBuf {
    compile_source(&format!("tests/c/{name}.c"), name, link)
}

/// Compile `capi/<source>` into `<name>-<suffix>`, as [`compile`].
pub(crate) fn compile_source(source: &str, name: &str, link: Link) -> PathBuf {
    let capi = Path::new(env!("CARGO_MANIFEST_DIR"));
    let libs = lib_dir();
    let suffix = match link {
        Link::Shared => "shared",
        Link::Static => "static",
    };
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{suffix}"));
    let mut cc = Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()));
    cc.args([
        "-std=c11",
        "-D_POSIX_C_SOURCE=200809L",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-g",
    ])
    .arg("-I")
    .arg(capi.join("include"))
    .arg(capi.join(source))
    .arg("-o")
    .arg(&exe);
    match link {
        Link::Shared => {
            // DT_RPATH, not the default DT_RUNPATH: `cargo test` puts
            // `target/<profile>` on LD_LIBRARY_PATH, which RUNPATH yields
            // to, and the `libtent_c.so` there is the last `cargo build`'s,
            // not this run's.
            cc.arg("-L")
                .arg(&libs)
                .arg(format!("-l{LIB}"))
                .arg(format!("-Wl,-rpath,{}", libs.display()))
                .arg("-Wl,--disable-new-dtags");
        }
        Link::Static => {
            // What `cargo rustc --crate-type staticlib -- --print
            // native-static-libs` lists for this crate (README.md).
            cc.arg(libs.join(format!("lib{LIB}.a"))).args([
                "-lhwloc",
                "-ludev",
                "-lutil",
                "-lrt",
                "-lpthread",
                "-ldl",
                "-lm",
            ]);
        }
    }
    let out = cc.output().expect("run cc");
    assert!(
        out.status.success(),
        "{cc:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}
