//! The error taxonomy: one [`ErrorKind`] per outcome, carried per operation.
//!
//! Kinds live in `tent-rings` because a CQE carries them across the ring (and
//! across processes); this module adds the context a caller needs to act on
//! an error returned by an API call.

use std::borrow::Cow;
use std::fmt;

pub use tent_rings::ErrorKind;

/// An API-level error: a kind from the taxonomy plus what failed and why.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    context: Cow<'static, str>,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

/// `Result` with tent's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of `kind` with a human-readable context.
    pub fn new(kind: ErrorKind, context: impl Into<Cow<'static, str>>) -> Error {
        Error {
            kind,
            context: context.into(),
            source: None,
        }
    }

    /// Attach the underlying cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Error {
        self.source = Some(Box::new(source));
        self
    }

    /// The taxonomy kind (what a program branches on).
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// What failed, in words.
    pub fn context(&self) -> &str {
        &self.context
    }

    /// Shorthand for [`ErrorKind::InvalidArgument`].
    pub fn invalid(context: impl Into<Cow<'static, str>>) -> Error {
        Error::new(ErrorKind::InvalidArgument, context)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.context)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<crate::config::ConfigError> for Error {
    fn from(e: crate::config::ConfigError) -> Error {
        Error::new(ErrorKind::InvalidArgument, "configuration rejected").with_source(e)
    }
}

impl From<tent_rings::region::RegionError> for Error {
    fn from(e: tent_rings::region::RegionError) -> Error {
        use tent_rings::region::RegionError as R;
        let kind = match &e {
            R::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                ErrorKind::SegmentNotFound
            }
            R::Io { source, .. } if source.kind() == std::io::ErrorKind::OutOfMemory => {
                ErrorKind::OutOfMemory
            }
            _ => ErrorKind::InvalidArgument,
        };
        Error::new(kind, "shared region").with_source(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_kind_context_and_source() {
        let e = Error::invalid("zero length").with_source(std::io::Error::other("inner"));
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert_eq!(e.to_string(), "InvalidArgument: zero length: inner");
    }
}
