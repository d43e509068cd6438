//! Configuration text as JSON, read strictly: a key written twice in one
//! object is refused, naming its full path, where `serde_json::Value`
//! would keep the last one and drop the first without a word.

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Parse `text` as one JSON value, refusing duplicate keys. The parser's
/// own limits stay (serde_json's recursion limit bounds hostile nesting).
pub(super) fn parse(text: &str) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = Strict { path: "" }.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// A value at `path` (the key path of the object it sits in, `/`-joined,
/// as errors name keys).
struct Strict<'p> {
    path: &'p str,
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // Always finite: JSON text has no NaN or infinity, and serde_json
        // refuses a literal out of f64's range.
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        loop {
            let path = format!("{}[{}]", self.path, out.len());
            let Some(v) = seq.next_element_seed(Strict { path: &path })? else {
                break;
            };
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = if self.path.is_empty() {
                key.clone()
            } else {
                format!("{}/{key}", self.path)
            };
            if out.contains_key(&key) {
                return Err(de::Error::custom(format_args!(
                    "duplicate key \"{}\" (each key may be given once)",
                    super::truncate(&path)
                )));
            }
            let value = map.next_value_seed(Strict { path: &path })?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_key_given_twice_is_refused_by_its_full_path() {
        let e = parse(r#"{"transports": {"tcp": {"enable": true, "enable": false}}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("duplicate key \"transports/tcp/enable\""), "{e}");
        let e = parse(r#"{"block_size": 1, "block_size": 2}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("duplicate key \"block_size\""), "{e}");
        let e = parse(r#"{"a": [{"x": 1}, {"x": 2, "x": 3}]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("duplicate key \"a[1]/x\""), "{e}");
        let long = "k".repeat(10_000);
        let e = parse(&format!(r#"{{"{long}": 1, "{long}": 2}}"#))
            .unwrap_err()
            .to_string();
        assert!(e.len() < 1_000, "a hostile key is not echoed whole");
    }

    #[test]
    fn the_same_name_in_two_objects_is_two_keys() {
        let v = parse(r#"{"a": {"x": 1}, "b": {"x": [1, 2.5, -3, "s", null, {"x": 0}]}}"#).unwrap();
        assert_eq!(v["b"]["x"][1], 2.5);
        assert_eq!(v["b"]["x"][2], -3);
        assert_eq!(v["a"]["x"], 1);
    }

    #[test]
    fn it_reads_what_serde_json_reads() {
        for text in [
            "{}",
            "[]",
            "1",
            "18446744073709551615",
            "-9223372036854775808",
            "1e308",
            "\"\\u00e9\"",
            "{\"a\": [true, false, null]}",
        ] {
            let strict = parse(text).unwrap();
            let plain: serde_json::Value = serde_json::from_str(text).unwrap();
            assert_eq!(strict, plain, "{text}");
        }
        for bad in ["", "{", "{\"a\":1,}", "1 2", "[1e999]"] {
            assert_eq!(
                parse(bad).is_err(),
                serde_json::from_str::<serde_json::Value>(bad).is_err(),
                "{bad}"
            );
        }
    }
}
