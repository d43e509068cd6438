//! The fuzz targets' bodies (`tent::fuzzing`) over every seed
//! (`fuzz/seeds/TARGET`) and every input a campaign kept because it found
//! something (`fuzz/regressions/TARGET`): a defect a campaign found stays
//! found, and the targets build and run with every `cargo test`.

use std::path::Path;

#[test]
fn every_seed_and_kept_input_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let targets = std::fs::read_dir(root.join("fuzz_targets"))
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            (p.extension()? == "rs").then(|| p.file_stem().unwrap().to_string_lossy().into_owned())
        })
        .collect::<std::collections::BTreeSet<_>>();
    let known: std::collections::BTreeSet<_> = tent::fuzzing::TARGETS
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    assert_eq!(
        targets, known,
        "fuzz/fuzz_targets and tent::fuzzing::TARGETS differ"
    );
    for (name, body) in tent::fuzzing::TARGETS {
        let mut seeds = 0;
        for dir in ["seeds", "regressions"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(name)) else {
                continue;
            };
            for e in entries {
                let path = e.unwrap().path();
                let data = std::fs::read(&path).unwrap();
                let r = std::panic::catch_unwind(|| body(&data));
                assert!(r.is_ok(), "{name}: {} fails its target", path.display());
                seeds += usize::from(dir == "seeds");
            }
        }
        assert!(seeds > 0, "{name} has no seed in fuzz/seeds/{name}");
    }
}
