//! include/tent.h is what cbindgen generates from this crate's source:
//! a stale checked-in header fails here, saying how to regenerate it.

use std::path::Path;

#[test]
fn header_is_up_to_date() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen parses src/")
        .write(&mut generated);
    let generated =
        parenthesize_negative_defines(&String::from_utf8(generated).expect("UTF-8 header"));
    // Every exported function is declared in it, and only the handles
    // are opaque: cbindgen skips what it cannot parse (a function would
    // still link, undeclared; a struct would become opaque).
    let exported = exported_functions(&dir.join("src"));
    assert!(exported.len() >= 30, "found only {exported:?}");
    for f in &exported {
        let declared = [" ", "*"]
            .iter()
            .any(|before| generated.contains(&format!("{before}{f}(")));
        assert!(declared, "{f} missing from the header");
    }
    for line in generated.lines() {
        if let Some(name) = line
            .strip_prefix("typedef struct ")
            .and_then(|l| l.strip_suffix(';'))
            .and_then(|l| l.split_once(' ').map(|(a, _)| a))
        {
            assert!(
                ["tent_engine_t", "tent_ring_t"].contains(&name),
                "{name} is opaque in the header (cbindgen could not read its fields)"
            );
        }
    }
    let path = dir.join("include/tent.h");
    if std::env::var_os("TENT_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write include/tent.h");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "capi/include/tent.h is stale (or missing): regenerate it with\n  \
         TENT_BLESS=1 cargo test -p tent-capi --test header\nand check it in"
    );
}

/// `#define TENT_ERR_TIMEOUT -8` as `(-8)`: cbindgen writes negative
/// constants bare, and a bare one breaks an expression it is pasted into
/// (`x-TENT_ERR_TIMEOUT` reads `x--8`).
fn parenthesize_negative_defines(header: &str) -> String {
    header
        .lines()
        .map(|line| {
            let mut parts = line.splitn(3, ' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("#define"), Some(name), Some(value)) if value.starts_with('-') => {
                    format!("#define {name} ({value})\n")
                }
                _ => format!("{line}\n"),
            }
        })
        .collect()
}

/// The names of the `extern "C"` functions in `src/*.rs`.
fn exported_functions(src: &Path) -> Vec<String> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(src).expect("src/") {
        let text = std::fs::read_to_string(entry.expect("src entry").path()).expect("read");
        for line in text.lines() {
            let Some(rest) = line.trim_start().strip_prefix("pub ") else {
                continue;
            };
            let rest = rest.strip_prefix("unsafe ").unwrap_or(rest);
            if let Some(sig) = rest.strip_prefix("extern \"C\" fn ") {
                names.push(sig.split('(').next().unwrap_or_default().to_owned());
            }
        }
    }
    names.sort();
    names
}
