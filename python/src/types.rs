//! TENT's Python value types: `OpCode`, `TransferStatusEnum`, `Request`,
//! `TransferStatus`, `SegmentInfo`, `Notification`, and the ring API's
//! `Completion`; conversions to and from tent's Rust types.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use tent::{
    Cqe, Engine, ErrorKind, Priority, RemoteAddr, SegmentId, Sqe, TaskState, TransportKind, op,
};

use crate::errors::{IntoPyResult, invalid, raise};
use crate::memory::{Exported, Mem};

/// `OpCode.READ` (remote into local) and `OpCode.WRITE` (local to remote).
#[pyclass(module = "tent", eq, eq_int, hash, from_py_object, frozen)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(clippy::upper_case_acronyms)]
pub enum OpCode {
    /// Copy remote memory into local memory.
    READ = 0,
    /// Copy local memory into remote memory.
    WRITE = 1,
}

#[pymethods]
impl OpCode {
    /// `"READ"` or `"WRITE"` (as a pybind11 enum has it).
    #[getter]
    fn name(&self) -> &'static str {
        match self {
            OpCode::READ => "READ",
            OpCode::WRITE => "WRITE",
        }
    }

    /// The integer value.
    #[getter]
    fn value(&self) -> u8 {
        *self as u8
    }
}

impl From<tent::Opcode> for OpCode {
    fn from(o: tent::Opcode) -> OpCode {
        match o {
            tent::Opcode::Read => OpCode::READ,
            tent::Opcode::Write => OpCode::WRITE,
        }
    }
}

impl From<OpCode> for tent::Opcode {
    fn from(o: OpCode) -> tent::Opcode {
        match o {
            OpCode::READ => tent::Opcode::Read,
            OpCode::WRITE => tent::Opcode::Write,
        }
    }
}

/// A task's state, TENT's names.
#[pyclass(module = "tent", eq, eq_int, hash, from_py_object, frozen)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(clippy::upper_case_acronyms)]
pub enum TransferStatusEnum {
    /// Allocated in a batch, not submitted.
    INITIAL = 0,
    /// Submitted, not finished.
    PENDING = 1,
    /// Rejected before any byte moved.
    INVALID = 2,
    /// Canceled.
    CANCELED = 3,
    /// All bytes moved.
    COMPLETED = 4,
    /// Its deadline passed.
    TIMEOUT = 5,
    /// The transfer failed.
    FAILED = 6,
}

#[pymethods]
impl TransferStatusEnum {
    /// The state's name, e.g. `"COMPLETED"`.
    #[getter]
    fn name(&self) -> &'static str {
        match self {
            TransferStatusEnum::INITIAL => "INITIAL",
            TransferStatusEnum::PENDING => "PENDING",
            TransferStatusEnum::INVALID => "INVALID",
            TransferStatusEnum::CANCELED => "CANCELED",
            TransferStatusEnum::COMPLETED => "COMPLETED",
            TransferStatusEnum::TIMEOUT => "TIMEOUT",
            TransferStatusEnum::FAILED => "FAILED",
        }
    }

    /// The integer value.
    #[getter]
    fn value(&self) -> u8 {
        *self as u8
    }
}

impl From<TaskState> for TransferStatusEnum {
    fn from(s: TaskState) -> TransferStatusEnum {
        match s {
            TaskState::Initial => TransferStatusEnum::INITIAL,
            TaskState::Pending => TransferStatusEnum::PENDING,
            TaskState::Invalid => TransferStatusEnum::INVALID,
            TaskState::Canceled => TransferStatusEnum::CANCELED,
            TaskState::Completed => TransferStatusEnum::COMPLETED,
            TaskState::Timeout => TransferStatusEnum::TIMEOUT,
            TaskState::Failed => TransferStatusEnum::FAILED,
        }
    }
}

/// A priority from Python: `PRIO_HIGH` (0), `PRIO_MEDIUM` (1), `PRIO_LOW` (2).
pub fn priority(py: Python<'_>, p: u8) -> PyResult<Priority> {
    Priority::from_u8(p).ok_or_else(|| {
        invalid(
            py,
            format!("priority {p}: expected PRIO_HIGH (0), PRIO_MEDIUM (1) or PRIO_LOW (2)"),
        )
    })
}

/// A transport from Python: `None`, a name (`"shm"`, `"tcp"`, `"rdma"`,
/// `"local"`, `"any"`, any case) or its number.
fn transport_kind(obj: Option<&Bound<'_, PyAny>>) -> PyResult<TransportKind> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(TransportKind::Any);
    };
    let py = obj.py();
    let all = || (0..=u8::MAX).map_while(TransportKind::from_u8);
    let found = if let Ok(s) = obj.cast::<PyString>() {
        let s = s.to_str()?.to_ascii_lowercase();
        all().find(|k| k.name() == s)
    } else {
        obj.extract::<u8>().ok().and_then(TransportKind::from_u8)
    };
    found.ok_or_else(|| {
        let names: Vec<&str> = all().map(TransportKind::name).collect();
        invalid(
            py,
            format!("transport_hint {obj}: expected one of {names:?}"),
        )
    })
}

/// One transfer request (TENT's `Request`). `source` is a local address
/// (an int) or a buffer-protocol object (its memory must be registered);
/// `target_offset` is the address in the target segment, as
/// `get_segment_info(handle).buffers[i].base` gives it (plus an offset).
#[pyclass(module = "tent")]
pub struct Request {
    /// READ or WRITE.
    #[pyo3(get, set)]
    pub opcode: OpCode,
    source: Mem,
    /// The target segment's handle (`open_segment`; 0 is this engine).
    #[pyo3(get, set)]
    pub target_id: u64,
    /// The address in the target segment.
    #[pyo3(get, set)]
    pub target_offset: u64,
    /// Bytes to move.
    #[pyo3(get, set)]
    pub length: u64,
    /// `PRIO_HIGH`, `PRIO_MEDIUM` or `PRIO_LOW`.
    #[pyo3(get, set)]
    pub priority: u8,
    transport_hint: TransportKind,
    /// Absolute `CLOCK_MONOTONIC` deadline in ns (`time.monotonic_ns()`
    /// based); 0: the engine's default timeout.
    #[pyo3(get, set)]
    pub deadline_ns: u64,
}

#[pymethods]
impl Request {
    /// `Request(opcode, source, target_id, target_offset, length,
    /// priority=PRIO_HIGH, transport_hint=None, deadline_ns=0)`; with a
    /// buffer as `source`, `length` defaults to its size.
    #[new]
    #[pyo3(signature = (opcode=OpCode::READ, source=None, target_id=0, target_offset=0, length=None, priority=0, transport_hint=None, deadline_ns=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        opcode: OpCode,
        source: Option<&Bound<'_, PyAny>>,
        target_id: u64,
        target_offset: u64,
        length: Option<u64>,
        priority: u8,
        transport_hint: Option<&Bound<'_, PyAny>>,
        deadline_ns: u64,
    ) -> PyResult<Request> {
        let source = match source {
            Some(s) => Mem::extract(s)?,
            None => Mem::Addr(0),
        };
        let length = match (length, &source) {
            (Some(n), Mem::Buf(b)) => {
                b.require_len(py, n)?;
                n
            }
            (Some(n), Mem::Addr(_)) => n,
            (None, Mem::Buf(b)) => b.len(),
            (None, Mem::Addr(_)) => 0,
        };
        self::priority(py, priority)?;
        Ok(Request {
            opcode,
            source,
            target_id,
            target_offset,
            length,
            priority,
            transport_hint: transport_kind(transport_hint)?,
            deadline_ns,
        })
    }

    /// The local address (an int, whatever `source` was given as).
    #[getter]
    fn source(&self) -> u64 {
        self.source.addr()
    }

    #[setter]
    fn set_source(&mut self, source: &Bound<'_, PyAny>) -> PyResult<()> {
        self.source = Mem::extract(source)?;
        Ok(())
    }

    /// The preferred transport's name (`"any"`: the engine chooses).
    #[getter]
    fn transport_hint(&self) -> &'static str {
        self.transport_hint.name()
    }

    #[setter]
    fn set_transport_hint(&mut self, hint: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        self.transport_hint = transport_kind(hint)?;
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "Request(opcode={}, source={:#x}, target_id={}, target_offset={:#x}, length={}, priority={}, transport_hint={:?}, deadline_ns={})",
            self.opcode.name(),
            self.source.addr(),
            self.target_id,
            self.target_offset,
            self.length,
            self.priority,
            self.transport_hint.name(),
            self.deadline_ns
        )
    }
}

impl Request {
    /// The submission entry: the source address resolved by the engine
    /// (`Engine::local_addr`: registered region and offset, or its typed
    /// error); a buffer source is checked for size and, for a READ, for
    /// being writable.
    pub fn to_sqe(&self, py: Python<'_>, engine: &Engine) -> PyResult<Sqe> {
        if let Mem::Buf(b) = &self.source {
            b.require_len(py, self.length)?;
            if self.opcode == OpCode::READ {
                b.require_writable(py, "a READ writes into the source")?;
            }
        }
        let local = engine.local_addr(self.source.addr(), self.length).py(py)?;
        let segment = segment_id(py, self.target_id)?;
        let remote = RemoteAddr::new(segment, self.target_offset);
        let p = priority(py, self.priority)?;
        Ok(
            op::Transfer::new(self.opcode.into(), local, remote, self.length)
                .priority(p)
                .transport_hint(self.transport_hint)
                .deadline_ns(self.deadline_ns)
                .build(),
        )
    }
}

/// A segment handle from Python (every 64-bit value is one; a handle
/// another engine gave is refused by the engine, typed).
pub fn segment_id(_py: Python<'_>, id: u64) -> PyResult<SegmentId> {
    Ok(SegmentId(id))
}

/// A task's (or a batch's) status: TENT's `.state` and `.bytes`, and why
/// it did not complete.
#[pyclass(module = "tent", get_all, frozen)]
#[derive(Clone)]
pub struct TransferStatus {
    /// A `TransferStatusEnum`.
    pub state: TransferStatusEnum,
    /// Bytes moved so far.
    pub bytes: u64,
    /// The error kind's name (e.g. `"SegmentNotFound"`), or None.
    pub error: Option<&'static str>,
    /// The transport that served it last (`"any"`: none did).
    pub transport: &'static str,
    /// Times it moved to another transport.
    pub failover_count: u8,
}

impl From<tent::TaskStatus> for TransferStatus {
    fn from(s: tent::TaskStatus) -> TransferStatus {
        TransferStatus {
            state: s.state.into(),
            bytes: s.transferred_bytes,
            error: s.error.map(ErrorKind::name),
            transport: s.transport.name(),
            failover_count: s.failover_count,
        }
    }
}

#[pymethods]
impl TransferStatus {
    fn __repr__(&self) -> String {
        format!(
            "TransferStatus(state={}, bytes={}, error={}, transport={:?})",
            self.state.name(),
            self.bytes,
            py_opt(self.error),
            self.transport
        )
    }
}

/// One registered region a segment offers.
#[pyclass(module = "tent", get_all, frozen)]
pub struct SegmentInfoBuffer {
    /// Its address in the segment (what `target_offset` names).
    pub base: u64,
    /// Its size in bytes.
    pub length: u64,
}

#[pymethods]
impl SegmentInfoBuffer {
    fn __repr__(&self) -> String {
        format!(
            "SegmentInfoBuffer(base={:#x}, length={})",
            self.base, self.length
        )
    }
}

/// What `get_segment_info` returns: the segment's registered regions.
#[pyclass(module = "tent", get_all, frozen)]
pub struct SegmentInfo {
    /// A list of `SegmentInfoBuffer`.
    pub buffers: Vec<Py<SegmentInfoBuffer>>,
}

/// A notification (TENT's `Notification(name, msg)`): `name` a str,
/// `msg` a str or a bytes-like object. Received ones also say who sent
/// them (`sender`: the sender's segment name). The engine checks the
/// limits (`tent.MAX_NOTIFY_NAME`, `tent.MAX_NOTIFY_MSG` bytes) when it
/// is sent.
#[pyclass(module = "tent")]
pub struct Notification {
    /// Its name.
    #[pyo3(get, set)]
    pub name: String,
    msg: Vec<u8>,
    /// The sender's segment name (received ones; None on ones made here).
    #[pyo3(get)]
    pub sender: Option<String>,
}

/// A message from Python: str (UTF-8) or any bytes-like object.
fn msg_bytes(m: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(s) = m.cast::<PyString>() {
        return Ok(s.to_str()?.as_bytes().to_vec());
    }
    // Only buffers: bytes(5) would make five zero bytes of an int.
    Exported::get(m)?;
    Ok(m.py()
        .get_type::<PyBytes>()
        .call1((m,))?
        .cast_into::<PyBytes>()?
        .as_bytes()
        .to_vec())
}

impl Notification {
    /// The engine's notification (the engine checks the limits on send).
    pub fn to_tent(&self) -> tent::Notification {
        tent::Notification {
            name: self.name.clone(),
            msg: self.msg.clone(),
        }
    }
}

impl From<tent::Received> for Notification {
    fn from(r: tent::Received) -> Notification {
        Notification {
            name: r.name,
            msg: r.msg,
            sender: Some(r.from),
        }
    }
}

#[pymethods]
impl Notification {
    #[new]
    #[pyo3(signature = (name=String::new(), msg=None))]
    pub fn new(name: String, msg: Option<&Bound<'_, PyAny>>) -> PyResult<Notification> {
        Ok(Notification {
            name,
            msg: msg.map(msg_bytes).transpose()?.unwrap_or_default(),
            sender: None,
        })
    }

    /// The message as str (TENT's type); bytes that are not UTF-8 come
    /// through as surrogate escapes (`msg_bytes` has them exactly).
    #[getter]
    fn msg<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        PyBytes::new(py, &self.msg).call_method1("decode", ("utf-8", "surrogateescape"))
    }

    #[setter]
    fn set_msg(&mut self, msg: &Bound<'_, PyAny>) -> PyResult<()> {
        self.msg = msg_bytes(msg)?;
        Ok(())
    }

    /// The message's bytes, exactly.
    #[getter]
    fn msg_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.msg)
    }

    fn __repr__(&self) -> String {
        format!(
            "Notification(name={:?}, msg={:?}{})",
            self.name,
            String::from_utf8_lossy(&self.msg),
            self.sender
                .as_ref()
                .map(|s| format!(", sender={s:?}"))
                .unwrap_or_default()
        )
    }
}

/// One ring completion.
#[pyclass(module = "tent", frozen)]
pub struct Completion {
    /// The token the request was pushed with.
    #[pyo3(get)]
    pub user_data: u64,
    /// Bytes moved (0 when it failed).
    #[pyo3(get)]
    pub bytes: u64,
    kind: Option<ErrorKind>,
    /// The transport that served it.
    #[pyo3(get)]
    pub transport: &'static str,
    /// Served by a transport other than its first choice.
    #[pyo3(get)]
    pub fallback: bool,
}

impl From<Cqe> for Completion {
    fn from(c: Cqe) -> Completion {
        let (bytes, kind) = match c.result() {
            Ok(n) => (n, None),
            Err(k) => (0, Some(k)),
        };
        Completion {
            user_data: c.user_data(),
            bytes,
            kind,
            transport: c.transport().name(),
            fallback: c.fallback(),
        }
    }
}

#[pymethods]
impl Completion {
    /// True when the request moved all its bytes.
    #[getter]
    fn ok(&self) -> bool {
        self.kind.is_none()
    }

    /// The error kind's name (e.g. `"OutOfBounds"`), or None.
    #[getter]
    fn error(&self) -> Option<&'static str> {
        self.kind.map(ErrorKind::name)
    }

    /// Raise the error's class (e.g. `OutOfBoundsError`) if it failed.
    fn raise_for_error(&self, py: Python<'_>) -> PyResult<()> {
        match self.kind {
            Some(k) => Err(raise(py, k, format!("request {} failed", self.user_data))),
            None => Ok(()),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Completion(user_data={}, bytes={}, error={}, transport={:?})",
            self.user_data,
            self.bytes,
            py_opt(self.error()),
            self.transport
        )
    }
}

/// An optional name as Python shows it: `None` or `"Name"`.
fn py_opt(s: Option<&str>) -> String {
    s.map_or_else(|| "None".to_owned(), |s| format!("{s:?}"))
}
