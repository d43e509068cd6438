//! A fake shm segment owner's building blocks, shared by the shm tests
//! that speak the handout protocol raw: its constants, memfds, the
//! descriptor, and sending a memfd by `SCM_RIGHTS`.
#![allow(dead_code)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

pub(crate) const MAGIC: &[u8; 8] = b"TENTSHM2";
pub(crate) const HELLO_LEN: usize = 8 + 32;
pub(crate) const CHALLENGE_LEN: usize = 8 + 32 + 8 + 32;
pub(crate) const REPLY_LEN: usize = 16;
pub(crate) const REQUEST_LEN: usize = 24;
/// Header, 1024 entries of 8 words, then 1024 live-key words.
pub(crate) const KEY_WORDS_AT: usize = 8 + 1024 * 8;
pub(crate) const DESC_BYTES: usize = (KEY_WORDS_AT + 1024) * 8;

/// Send `bytes` with `fd` attached (`SCM_RIGHTS`), in one `sendmsg`.
pub(crate) fn send_fd(s: &UnixStream, bytes: &[u8], fd: RawFd) {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: msghdr is plain data; all zeroes is an empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes a size.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(4) } as _;
    // SAFETY: `msg_control` points at `cbuf`, 64 bytes, room for one
    // header and one fd (CMSG_SPACE(4)), so the first header is in it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(4) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
    }
    // SAFETY: `msg` points at `iov` and `cbuf`, both alive for the call.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    assert_eq!(n as usize, bytes.len());
}

/// A fresh memfd of `size` bytes that accepts seals.
pub(crate) fn memfd(size: u64) -> OwnedFd {
    // SAFETY: a NUL-terminated name and flags; no memory is passed.
    let raw = unsafe {
        libc::memfd_create(
            c"tent-test".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    assert!(raw >= 0);
    // SAFETY: `raw` is a fresh fd nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: a syscall on an fd we own.
    assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), size as i64) }, 0);
    fd
}

/// A fake owner's descriptor: mapped here, then write-sealed like a real
/// one (peers refuse a descriptor without a write seal).
pub(crate) struct FakeDesc {
    pub fd: OwnedFd,
    ptr: *mut u64,
}

impl FakeDesc {
    pub(crate) fn new() -> FakeDesc {
        let fd = memfd(DESC_BYTES as u64);
        // SAFETY: a new shared mapping of our own memfd; no memory of
        // ours is aliased.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                DESC_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let seals =
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL;
        assert_eq!(
            // SAFETY: a syscall on an fd we own.
            unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) },
            0
        );
        FakeDesc { fd, ptr: p.cast() }
    }

    pub(crate) fn word(&self, i: usize, v: u64) {
        assert!(i < DESC_BYTES / 8);
        // SAFETY: `i` is inside the DESC_BYTES mapping `ptr` starts.
        unsafe { std::ptr::write_volatile(self.ptr.add(i), v) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }

    /// Publish entries (id, base, len, key, handle) under sequence `seq`;
    /// entry `i` gets live-key slot `i`, which holds its key.
    pub(crate) fn write(&self, seq: u64, entries: &[(u64, u64, u64, u64, u64)]) {
        self.word(0, seq - 1); // odd while writing
        self.word(1, entries.len() as u64);
        self.word(2, u64::from_le_bytes(*b"TENTSHD3"));
        for (i, e) in entries.iter().enumerate() {
            self.word(KEY_WORDS_AT + i, e.3);
            for (j, w) in [e.0, e.1, e.2, e.3, e.4, i as u64].into_iter().enumerate() {
                self.word(8 + i * 8 + j, w);
            }
        }
        self.word(0, seq);
    }
}

impl Drop for FakeDesc {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made; nothing uses it after drop.
        unsafe { libc::munmap(self.ptr.cast(), DESC_BYTES) };
    }
}
