//! tent's errors as Python exceptions: one class per [`ErrorKind`], named
//! `<Kind>Error` (TENT's scheme: `InvalidArgumentError`,
//! `AddressNotRegisteredError`, ...), all under `tent.TentException`.
//!
//! The classes are made in `tent/_errors.py` from [`error_kinds`], so the
//! taxonomy lives in one place (tent-rings' `ErrorKind`); this module only
//! looks a class up by the kind's name and raises it.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyModule, PyType};
use tent::{Error, ErrorKind};

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// `(name, code)` of every kind, in code order: what `tent._errors` makes
/// its classes from.
#[pyfunction]
pub fn error_kinds() -> Vec<(&'static str, u16)> {
    ErrorKind::ALL
        .iter()
        .map(|k| (k.name(), k.code()))
        .collect()
}

/// The Python exception for a tent error: the class of its kind, with the
/// error's text (`"Kind: what failed"`).
pub fn to_py(py: Python<'_>, e: Error) -> PyErr {
    new_err(py, e.kind(), e.to_string())
}

/// An exception of `kind` with `msg`, for what the binding itself refuses
/// (a buffer it cannot pass on, a closed engine).
pub fn raise(py: Python<'_>, kind: ErrorKind, msg: impl std::fmt::Display) -> PyErr {
    new_err(py, kind, format!("{kind}: {msg}"))
}

fn new_err(py: Python<'_>, kind: ErrorKind, msg: String) -> PyErr {
    match class(py, kind) {
        Ok(cls) => PyErr::from_type(cls, msg),
        // tent/_errors.py missing or broken: still an error, with the kind in words.
        Err(e) => PyRuntimeError::new_err(format!("{kind}: {msg} (tent._errors: {e})")),
    }
}

fn class(py: Python<'_>, kind: ErrorKind) -> PyResult<Bound<'_, PyType>> {
    let module =
        ERRORS.get_or_try_init(py, || PyResult::Ok(py.import("tent._errors")?.unbind()))?;
    Ok(module
        .bind(py)
        .getattr(format!("{}Error", kind.name()))?
        .cast_into::<PyType>()?)
}

/// `Result<T, tent::Error>` to `PyResult<T>`.
pub trait IntoPyResult<T> {
    /// Convert, raising the kind's class on error.
    fn py(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, Error> {
    fn py(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, e))
    }
}

/// Shorthand for an `InvalidArgumentError`.
pub fn invalid(py: Python<'_>, msg: impl std::fmt::Display) -> PyErr {
    raise(py, ErrorKind::InvalidArgument, msg)
}

/// A `TentException` (the base class), for a failure without a kind.
pub fn base(py: Python<'_>, msg: String) -> PyErr {
    let cls = ERRORS
        .get_or_try_init(py, || PyResult::Ok(py.import("tent._errors")?.unbind()))
        .and_then(|m| Ok(m.bind(py).getattr("TentException")?.cast_into::<PyType>()?));
    match cls {
        Ok(cls) => PyErr::from_type(cls, msg),
        Err(e) => PyRuntimeError::new_err(format!("{msg} (tent._errors: {e})")),
    }
}
