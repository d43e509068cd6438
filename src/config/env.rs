//! The last layer of a configuration: one environment variable per key,
//! `TENT_` and the key's path in capitals with `/` as `_`
//! (`transports/rdma/rail_cooldown_secs` is
//! `TENT_TRANSPORTS_RDMA_RAIL_COOLDOWN_SECS`), checked as the key is in a
//! file, with errors that name the variable.
//!
//! A value is JSON for numbers, bools and arrays (an array may also be
//! written bare, `1,2`), and the text as it is for a string key. A variable
//! set but empty is refused rather than taken for "no value" (an unset
//! shell variable in a deployment file would otherwise clear a secret and
//! turn authentication off); so is a variable given twice.
//! `TENT_CONF` and `TENT_LOG` are not keys. Any other `TENT_*` variable is
//! left alone, but one spelled close to a key's (in any case, or a key's
//! path with its first parts left out) is warned about once.

use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::ffi::OsString;

use serde_json::Value;

use super::{Config, ConfigError, ENV_VAR, Kind, RULES, SPECS, describe, levenshtein, set_key};

/// The variable that names the log filter, read by the tracing set-up.
const LOG_VAR: &str = "TENT_LOG";

/// What the environment changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Overrides {
    /// The variables applied, in name order.
    pub applied: Vec<String>,
    /// Keys set that no feature acts on yet.
    pub later: Vec<&'static str>,
    /// `TENT_*` variables that are no key but close to one: (variable, key
    /// variable it is probably meant to be).
    pub near_misses: Vec<(String, String)>,
}

/// The variable for the key at `path`.
pub(super) fn var_name(path: &str) -> String {
    let mut name = String::with_capacity(5 + path.len());
    name.push_str("TENT_");
    name.extend(path.chars().map(|c| match c {
        '/' => '_',
        c => c.to_ascii_uppercase(),
    }));
    name
}

/// Where an error found the value: the variable.
fn source(var: &str) -> String {
    format!("{var} (environment)")
}

/// Apply every `TENT_*` variable of `vars` that names a key to `cfg`, in
/// name order. The first bad one is refused whole (`cfg` is then not to be
/// used); the checks across keys are the caller's, once every layer is in.
pub(super) fn apply(
    cfg: &mut Config,
    vars: impl IntoIterator<Item = (OsString, OsString)>,
) -> Result<Overrides, ConfigError> {
    let mut ours: Vec<(String, OsString)> = vars
        .into_iter()
        .filter_map(|(k, v)| {
            let k = k.into_string().ok()?;
            (k.starts_with("TENT_") && k != ENV_VAR && k != LOG_VAR).then_some((k, v))
        })
        .collect();
    // Stable: a name given twice keeps its order, for the error below.
    ours.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Overrides::default();
    for (var, value) in ours {
        let Some(i) = SPECS.iter().position(|s| var_name(s.path) == var) else {
            if let Some(meant) = near_miss(&var) {
                out.near_misses.push((var, meant));
            }
            continue;
        };
        let (spec, rule) = (&SPECS[i], &RULES[i]);
        let src = source(&var);
        if out.applied.last() == Some(&var) {
            return Err(ConfigError::Invalid {
                file: src,
                key: spec.path.to_owned(),
                reason: "the variable is given twice in the environment".to_owned(),
            });
        }
        let Some(text) = value.to_str() else {
            return Err(ConfigError::Type {
                file: src,
                key: spec.path.to_owned(),
                expected: rule.kind.type_name(),
                found: "text that is not UTF-8".to_owned(),
            });
        };
        if text.trim().is_empty() {
            return Err(ConfigError::Invalid {
                file: src,
                key: spec.path.to_owned(),
                reason: "set but empty: give a value, or unset the variable to keep the value \
                         of the configuration before it"
                    .to_owned(),
            });
        }
        let json = to_json(rule.kind, text).map_err(|found| ConfigError::Type {
            file: src.clone(),
            key: spec.path.to_owned(),
            expected: rule.kind.type_name(),
            found,
        })?;
        set_key(i, &json, &src, cfg, &mut out.later)?;
        out.applied.push(var);
    }
    Ok(out)
}

/// A variable's text as the JSON value a file would hold for `kind`; on
/// failure, how the text reads (for the error).
fn to_json(kind: Kind, text: &str) -> Result<Value, String> {
    match kind {
        // A string key takes the text as it is: no quoting to get wrong.
        Kind::Str(_) | Kind::Choice(_) | Kind::AutoOrByte { .. } => {
            Ok(Value::String(text.to_owned()))
        }
        Kind::Devices | Kind::Endpoints if !text.trim().starts_with('[') => {
            Ok(Value::String(text.to_owned()))
        }
        Kind::FloatArray { .. } | Kind::UintArray { .. } if !text.trim().starts_with('[') => {
            serde_json::from_str(&format!("[{text}]"))
                .map_err(|_| describe(&Value::String(text.to_owned())))
        }
        // An etcd endpoint may carry user info: its text is never shown.
        Kind::Endpoints => {
            serde_json::from_str(text).map_err(|_| "(an etcd endpoint value, not shown)".to_owned())
        }
        _ => serde_json::from_str(text).map_err(|_| describe(&Value::String(text.to_owned()))),
    }
}

/// Longest variable name compared with the keys' (the distance costs the
/// product of the two lengths).
const NEAR_MISS_MAX_LEN: usize = 128;

/// The key variable `var` is probably a misspelling of, if any: the same
/// name in another case, one a few letters off, or a key's path with its
/// first parts left out (`TENT_SHARED_SECRET`, `TENT_RDMA_RAIL_COOLDOWN_SECS`).
fn near_miss(var: &str) -> Option<String> {
    if var.len() > NEAR_MISS_MAX_LEN {
        return None;
    }
    let upper = var.to_ascii_uppercase();
    let tail = format!("_{}", upper.strip_prefix("TENT_").unwrap_or(&upper));
    SPECS
        .iter()
        .map(|s| var_name(s.path))
        .filter_map(|known| {
            if known.ends_with(&tail) && tail.len() > 6 {
                return Some((0, known));
            }
            let most = (upper.len().max(known.len()) / 8).max(1);
            if upper.len().abs_diff(known.len()) > most {
                return None;
            }
            let d = levenshtein(&upper, &known);
            (d <= most).then_some((d, known))
        })
        .min_by_key(|(d, _)| *d)
        .map(|(_, known)| known)
}

static WARNED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Warn once per process for each near miss.
pub(super) fn warn_near_misses(near: &[(String, String)]) {
    let mut warned = WARNED.lock();
    for (var, meant) in near {
        if warned.insert(var.clone()) {
            tracing::warn!(
                variable = %var,
                "environment variable {var} is no configuration key and is ignored; did you mean {meant}?"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{apply, var_name};
    use crate::config::{Config, ConfigError, SPECS};
    use std::ffi::OsString;

    fn vars(list: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        list.iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    #[test]
    fn every_key_has_its_own_variable_and_none_is_reserved() {
        let mut names: Vec<String> = SPECS.iter().map(|s| var_name(s.path)).collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "two keys map to one variable");
        assert!(!names.iter().any(|v| v == "TENT_CONF" || v == "TENT_LOG"));
        assert_eq!(
            var_name("transports/rdma/rail_cooldown_secs"),
            "TENT_TRANSPORTS_RDMA_RAIL_COOLDOWN_SECS"
        );
    }

    #[test]
    fn a_variable_sets_its_key_with_the_key_s_type() {
        let mut cfg = Config::default();
        let got = apply(
            &mut cfg,
            vars(&[
                ("TENT_TRANSPORTS_RDMA_RAIL_COOLDOWN_SECS", "5"),
                ("TENT_TRANSPORTS_TCP_ENABLE", "false"),
                ("TENT_TRANSPORTS_RDMA_DEVICES", "mlx5_0,mlx5_1"),
                ("TENT_METADATA_SERVERS", "127.0.0.1:2379,10.0.0.2:2379"),
                ("TENT_LOG", "debug"),
                ("TENT_CONF", "{}"),
                ("PATH", "/bin"),
            ]),
        )
        .unwrap();
        assert_eq!(
            cfg.transports.rdma.rail_cooldown_secs,
            std::time::Duration::from_secs(5)
        );
        assert!(!cfg.transports.tcp.enable);
        assert_eq!(cfg.transports.rdma.devices, ["mlx5_0", "mlx5_1"]);
        assert_eq!(cfg.metadata_servers, ["127.0.0.1:2379", "10.0.0.2:2379"]);
        assert_eq!(
            got.applied,
            [
                "TENT_METADATA_SERVERS",
                "TENT_TRANSPORTS_RDMA_DEVICES",
                "TENT_TRANSPORTS_RDMA_RAIL_COOLDOWN_SECS",
                "TENT_TRANSPORTS_TCP_ENABLE"
            ]
        );
        assert!(got.near_misses.is_empty());
    }

    #[test]
    fn a_bad_value_is_refused_naming_the_variable_and_the_key() {
        for (var, value, says) in [
            ("TENT_BLOCK_SIZE", "0", "out of range"),
            ("TENT_BLOCK_SIZE", "lots", "expected unsigned integer"),
            ("TENT_TRANSPORTS_TCP_ENABLE", "yes", "expected bool"),
            ("TENT_WORKERS_COUNT", "-1", "expected unsigned integer"),
        ] {
            let e = apply(&mut Config::default(), vars(&[(var, value)])).unwrap_err();
            let text = e.to_string();
            assert!(text.starts_with(&format!("{var} (environment)")), "{text}");
            assert!(text.contains(says), "{text}");
            assert!(
                matches!(e, ConfigError::Range { .. } | ConfigError::Type { .. }),
                "{e:?}"
            );
        }
    }

    #[test]
    fn a_secret_from_the_environment_is_never_echoed() {
        let e = apply(
            &mut Config::default(),
            vars(&[("TENT_RPC_SHARED_SECRET", "short-pw")]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("TENT_RPC_SHARED_SECRET (environment)"), "{e}");
        assert!(!e.contains("short-pw"), "{e}");
        let mut cfg = Config::default();
        apply(
            &mut cfg,
            vars(&[("TENT_RPC_SHARED_SECRET", "a-secret-of-24-bytes-xx")]),
        )
        .unwrap();
        assert_eq!(cfg.secret(), Some(&b"a-secret-of-24-bytes-xx"[..]));
        // Nor an etcd endpoint, which may carry a password.
        for value in [r#"["http://root:hunter2@h:1"#, "http://root:hunter2@h:1"] {
            let e = apply(
                &mut Config::default(),
                vars(&[("TENT_METADATA_SERVERS", value)]),
            )
            .unwrap_err()
            .to_string();
            assert!(!e.contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn an_empty_or_repeated_variable_is_refused() {
        let mut cfg = Config {
            rpc_shared_secret: "a-secret-of-24-bytes-xx".into(),
            ..Config::default()
        };
        for value in ["", "  "] {
            let e = apply(&mut cfg, vars(&[("TENT_RPC_SHARED_SECRET", value)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains("set but empty"), "{e}");
        }
        assert!(cfg.secret().is_some(), "the earlier layer's secret stays");
        let e = apply(&mut cfg, vars(&[("TENT_WORKERS_CORES", "")])).unwrap_err();
        assert!(e.to_string().contains("set but empty"), "{e}");
        let e = apply(
            &mut Config::default(),
            vars(&[("TENT_BLOCK_SIZE", "8192"), ("TENT_BLOCK_SIZE", "16384")]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("TENT_BLOCK_SIZE (environment)"), "{e}");
        assert!(e.contains("given twice"), "{e}");
    }

    #[test]
    fn misspellings_in_case_or_with_the_path_cut_short_are_near_misses() {
        for (typed, meant) in [
            ("TENT_block_size", "TENT_BLOCK_SIZE"),
            ("TENT_SHARED_SECRET", "TENT_RPC_SHARED_SECRET"),
            (
                "TENT_RDMA_RAIL_COOLDOWN_SECS",
                "TENT_TRANSPORTS_RDMA_RAIL_COOLDOWN_SECS",
            ),
        ] {
            let got = apply(&mut Config::default(), vars(&[(typed, "1")])).unwrap();
            assert_eq!(got.near_misses, [(typed.to_owned(), meant.to_owned())]);
        }
        let long = format!("TENT_{}", "A".repeat(100_000));
        let got = apply(&mut Config::default(), vars(&[(long.as_str(), "1")])).unwrap();
        assert!(got.near_misses.is_empty());
    }

    #[test]
    fn a_variable_spelled_close_to_a_key_is_a_near_miss_and_others_are_ignored() {
        let got = apply(
            &mut Config::default(),
            vars(&[
                ("TENT_TRANSPORTS_RDMA_RAIL_COOLDWN_SECS", "5"),
                ("TENT_NETNS_ROLE", "server"),
            ]),
        )
        .unwrap();
        assert!(got.applied.is_empty());
        assert_eq!(
            got.near_misses,
            [(
                "TENT_TRANSPORTS_RDMA_RAIL_COOLDWN_SECS".to_owned(),
                "TENT_TRANSPORTS_RDMA_RAIL_COOLDOWN_SECS".to_owned()
            )]
        );
    }
}
