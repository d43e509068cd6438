//! The shm descriptor parser under arbitrary words: whatever a hostile
//! same-host owner writes, an admitted descriptor is bounded, sorted,
//! non-overlapping and non-wrapping, and a region is mapped only from a
//! sealed memfd that holds `DATA_OFFSET + len` bytes. The input's first 12
//! bytes are a handed-out file's size and seals; the rest are the words.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tent::transport::shm::desc::{
    DATA_OFFSET, DESC_BYTES, DESC_CAPACITY, DESC_WRITE_SEALS, MAX_REGION_LEN, REQUIRED_SEALS,
    admit_descriptor, admit_region, check_segment_name, encode, parse,
};

fuzz_target!(|data: &[u8]| {
    let mut head = [0u8; 12];
    let n = data.len().min(12);
    head[..n].copy_from_slice(&data[..n]);
    let size = u64::from_le_bytes(head[..8].try_into().unwrap());
    let seals = i32::from_le_bytes(head[8..].try_into().unwrap());
    let rest = &data[n..];
    if let Ok(map_len) = admit_descriptor(size, seals) {
        assert!(seals & REQUIRED_SEALS == REQUIRED_SEALS && seals & DESC_WRITE_SEALS != 0);
        assert_eq!(map_len, DESC_BYTES);
        assert!(map_len as u64 <= size);
    }
    if let Ok(name) = std::str::from_utf8(rest) {
        if check_segment_name(name).is_ok() {
            assert!(!name.contains('/') && !name.starts_with('.'), "{name:?}");
        }
    }
    let words: Vec<u64> = rest
        .chunks(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect();
    let Ok(entries) = parse(&words) else { return };
    assert!(entries.len() <= DESC_CAPACITY);
    for e in &entries {
        assert!(e.len > 0 && e.len <= MAX_REGION_LEN);
        assert!(e.base.checked_add(e.len).is_some());
        assert!(e.key != 0 && e.handle != 0);
        assert!((e.slot as usize) < DESC_CAPACITY, "a live-key slot past the key words");
        if let Ok(map_len) = admit_region(e, size, seals) {
            assert!(seals & REQUIRED_SEALS == REQUIRED_SEALS);
            assert!(seals & DESC_WRITE_SEALS == 0, "a write-sealed region admitted");
            assert_eq!(map_len as u64, e.len + DATA_OFFSET as u64);
            assert!(map_len as u64 <= size);
        }
    }
    for p in entries.windows(2) {
        assert!(p[0].base + p[0].len <= p[1].base, "overlap admitted");
    }
    assert_eq!(parse(&encode(&entries)), Ok(entries), "round trip");
});
