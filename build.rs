//! Bindings to rdma-core's verbs, generated at build time from Debian's
//! `libibverbs-dev` headers.
//!
//! Nothing links against libibverbs: bindgen emits the exported functions
//! as fields of one `IbvLib` struct that `src/sys` fills by dlopen at run
//! time, so the binaries start on machines without rdma-core and fall back
//! to TCP/SHM. The hot-path static inlines (`ibv_post_send`, `ibv_poll_cq`,
//! `ibv_req_notify_cq`) are not bound: they dispatch through `ctx->ops`
//! and are ported to Rust in `src/sys/ops.rs`.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=csrc/verbs.h");
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    bindgen::Builder::default()
        .header("csrc/verbs.h")
        // `_*`: ibv_query_port / ibv_reg_mr are macros onto ___ibv_query_port
        // / __ibv_reg_mr; binding the plain names would take the compat
        // symbols with the old struct layouts.
        .allowlist_function("_*ibv_.*")
        .allowlist_type("_*ibv_.*")
        // The extended context a provider allocates around `ibv_context`
        // (static-inline verbs such as ibv_query_port reach through it).
        .allowlist_type("verbs_context")
        .allowlist_var("_*IBV_.*")
        // C may hand back values outside a Rust enum (and a Rust enum makes
        // mem::zeroed unsound): newtypes over the integer.
        .default_enum_style(bindgen::EnumVariation::NewType {
            is_bitfield: false,
            is_global: false,
        })
        .bitfield_enum("ibv_access_flags")
        .bitfield_enum("ibv_send_flags")
        .bitfield_enum("ibv_qp_attr_mask")
        .bitfield_enum("ibv_wc_flags")
        .dynamic_library_name("IbvLib")
        // A symbol missing from an older libibverbs fails at its call, not
        // at load.
        .dynamic_link_require_all(false)
        .generate_inline_functions(false)
        .derive_default(true)
        .layout_tests(false)
        .wrap_unsafe_ops(true)
        .generate()
        .expect("bindgen over <infiniband/verbs.h> (install libibverbs-dev and libclang-dev: tools/setup.sh)")
        .write_to_file(out.join("verbs.rs"))
        .expect("write verbs.rs");
}
