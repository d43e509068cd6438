//! [`Secret`]: the shared secret that guards every door (control plane,
//! TCP data port, shm handout), in a type that never prints it.

use std::fmt;

/// The shared secret (`rpc_shared_secret`). `Debug` and `Display` print
/// `***` (or `<none>` when empty), so a config printed or logged whole
/// reveals nothing; equality takes time that depends only on the lengths,
/// not on where two secrets first differ.
#[derive(Clone, Default)]
pub struct Secret(String);

impl Secret {
    /// A secret from its text.
    pub fn new(text: impl Into<String>) -> Secret {
        Secret(text.into())
    }

    /// No secret: no authentication.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The secret itself: for the HMACs that prove it, and for writing
    /// the configuration back out.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Secret {
    fn from(text: &str) -> Secret {
        Secret::new(text)
    }
}

impl From<String> for Secret {
    fn from(text: String) -> Secret {
        Secret(text)
    }
}

impl PartialEq for Secret {
    /// `subtle`'s constant-time comparison: the time depends on the
    /// lengths only (unequal lengths answer at once).
    fn eq(&self, other: &Secret) -> bool {
        use subtle::ConstantTimeEq;
        self.0.as_bytes().ct_eq(other.0.as_bytes()).into()
    }
}

impl Eq for Secret {}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_empty() { "<none>" } else { "***" })
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::Secret;

    #[test]
    fn a_secret_never_prints_and_compares_whole() {
        let s = Secret::from("0123456789abcdef-secret");
        assert_eq!(format!("{s:?}"), "***");
        assert_eq!(format!("{s}"), "***");
        assert_eq!(format!("{:?}", Secret::default()), "<none>");
        assert_eq!(s, Secret::from("0123456789abcdef-secret"));
        assert_ne!(s, Secret::from("0123456789abcdef-secreT"));
        assert_ne!(s, Secret::from("0123456789abcdef"));
        assert_eq!(s.expose(), "0123456789abcdef-secret");
    }
}
