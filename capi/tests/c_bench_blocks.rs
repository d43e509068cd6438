//! The C block-list benchmark (`bench/blocks.c`, run by
//! `tools/bench-c-blocks.sh`) builds against the header and runs to the
//! end on a small list: its figures are read by hand, but it must not rot.

mod support;

use std::process::Command;

use support::{Link, compile_source};

#[test]
fn the_c_block_list_bench_builds_and_moves_every_block() {
    let exe = compile_source("bench/blocks.c", "bench_blocks", Link::Static);
    // 64 blocks of 4 KiB, 3 repetitions: it exits non-zero on any call
    // that fails or a batch that ends short of every byte.
    let out = Command::new(&exe)
        .args(["64", "4096", "3"])
        .output()
        .expect("run bench/blocks");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench/blocks failed ({}):\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("block list, scattered"), "{stdout}");
    assert!(stdout.contains("# end to end vs one request"), "{stdout}");
}
