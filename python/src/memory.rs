//! Memory named from Python: a raw address (an `int`, TENT's way) or an
//! object exporting the buffer protocol (bytearray, numpy array,
//! memoryview, mmap). The binding checks only what the buffer protocol
//! says (contiguity, writability, size); where the memory lies in
//! registered regions is the engine's question (`Engine::local_addr`).

use pyo3::buffer::{PyBuffer, PyUntypedBuffer};
use pyo3::prelude::*;
use pyo3::types::PyInt;
use tent::ErrorKind;

use crate::errors::{invalid, raise};

/// A buffer export held open: while it is, the exporter keeps the memory
/// where it is (a bytearray refuses to resize, a numpy array to reshape
/// its data away).
pub struct Exported {
    buf: PyUntypedBuffer,
}

impl Exported {
    /// Export `obj`'s memory; refused unless it is one contiguous range.
    pub fn get(obj: &Bound<'_, PyAny>) -> PyResult<Exported> {
        let buf = PyUntypedBuffer::get(obj).map_err(|e| {
            invalid(
                obj.py(),
                format!(
                    "expected an object with the buffer protocol, got {}: {e}",
                    type_name(obj)
                ),
            )
        })?;
        Exported::new(obj.py(), buf)
    }

    fn new(py: Python<'_>, buf: PyUntypedBuffer) -> PyResult<Exported> {
        if !(buf.is_c_contiguous() || buf.is_fortran_contiguous()) {
            return Err(invalid(
                py,
                format!(
                    "non-contiguous buffer (shape {:?}, strides {:?}): tent moves one contiguous \
                     byte range; pass a contiguous copy (numpy.ascontiguousarray)",
                    buf.shape(),
                    buf.strides()
                ),
            ));
        }
        Ok(Exported { buf })
    }

    /// Its first byte's address.
    pub fn addr(&self) -> u64 {
        self.buf.buf_ptr() as u64
    }

    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        self.buf.len_bytes() as u64
    }

    /// Exported read-only (bytes, a read-only memoryview or array).
    pub fn readonly(&self) -> bool {
        self.buf.readonly()
    }

    /// Refuse a read-only export where tent would write into the memory.
    pub fn require_writable(&self, py: Python<'_>, why: &str) -> PyResult<()> {
        if self.readonly() {
            return Err(invalid(
                py,
                format!("read-only buffer: {why}; pass a writable one (bytearray, numpy array)"),
            ));
        }
        Ok(())
    }

    /// Refuse `len` bytes from the start when the export is smaller.
    pub fn require_len(&self, py: Python<'_>, len: u64) -> PyResult<()> {
        if len > self.len() {
            return Err(raise(
                py,
                ErrorKind::OutOfBounds,
                format!(
                    "buffer too small: {len} bytes asked, the buffer holds {}",
                    self.len()
                ),
            ));
        }
        Ok(())
    }
}

/// An address argument: an `int` (anything with `__index__`) or a buffer.
pub enum Mem {
    /// A raw address, trusted as TENT trusts it.
    Addr(u64),
    /// A buffer's memory, held while this lives.
    Buf(Exported),
}

impl Mem {
    /// Read an address argument: an `int` is an address; so is a 0-d
    /// integer (a numpy scalar); any other buffer is its memory.
    pub fn extract(obj: &Bound<'_, PyAny>) -> PyResult<Mem> {
        let py = obj.py();
        if obj.is_instance_of::<PyInt>() {
            return Ok(Mem::Addr(obj.extract::<u64>()?));
        }
        if let Ok(buf) = PyUntypedBuffer::get(obj)
            && buf.dimensions() > 0
        {
            return Exported::new(py, buf).map(Mem::Buf);
        }
        obj.extract::<u64>().map(Mem::Addr).map_err(|e| {
            invalid(
                py,
                format!(
                    "expected an address (int) or an object with the buffer protocol, got {}: {e}",
                    type_name(obj)
                ),
            )
        })
    }

    /// The address it names.
    pub fn addr(&self) -> u64 {
        match self {
            Mem::Addr(a) => *a,
            Mem::Buf(b) => b.addr(),
        }
    }
}

/// A list of 64-bit addresses: a buffer of `uint64` (numpy, array('Q'),
/// memoryview) read in place, or any iterable of ints copied once.
pub enum U64s {
    /// Read in place; the export is held while this lives.
    Buf(PyBuffer<u64>),
    /// Copied from a sequence.
    Vec(Vec<u64>),
}

impl U64s {
    /// Read `obj` as `what` (named in errors).
    pub fn extract(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<U64s> {
        let py = obj.py();
        if let Ok(raw) = PyUntypedBuffer::get(obj) {
            if !raw.is_c_contiguous() {
                return Err(invalid(
                    py,
                    format!(
                        "{what}: non-contiguous array (strides {:?}); pass numpy.ascontiguousarray(...)",
                        raw.strides()
                    ),
                ));
            }
            let typed = raw.into_typed::<u64>().map_err(|e| {
                invalid(
                    py,
                    format!("{what}: expected unsigned 64-bit integers (numpy dtype uint64, array('Q')): {e}"),
                )
            })?;
            return Ok(U64s::Buf(typed));
        }
        let v: Vec<u64> = obj.extract().map_err(|e| {
            invalid(
                py,
                format!(
                    "{what}: expected a uint64 array or a sequence of non-negative ints, got {}: {e}",
                    type_name(obj)
                ),
            )
        })?;
        Ok(U64s::Vec(v))
    }

    /// The addresses.
    pub fn as_slice(&self) -> &[u64] {
        match self {
            // The export is held (and so the memory kept where it is) while
            // `self` lives, which outlives the returned slice; `as_slice_ptr`
            // checked format, alignment and C-contiguity. Another Python
            // thread writing the array meanwhile changes only which
            // addresses are read, as any plain u64 store would.
            U64s::Buf(b) => match b.as_slice_ptr() {
                // SAFETY: valid, aligned u64s for as long as `self` (above).
                Some(p) => unsafe { p.as_ref() },
                None => &[],
            },
            U64s::Vec(v) => v,
        }
    }
}

/// `type(obj).__name__`, for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_owned())
}
