//! A fixed-size log-linear latency histogram (no allocation while recording).

/// Nanosecond histogram: 64 power-of-two ranges x 32 linear sub-buckets
/// (about 3% resolution).
pub(crate) struct Histogram {
    counts: Vec<u64>,
    total: u64,
}

const SUB: u32 = 5;

impl Histogram {
    pub(crate) fn new() -> Histogram {
        Histogram {
            counts: vec![0; 64 << SUB],
            total: 0,
        }
    }

    fn index(ns: u64) -> usize {
        let v = ns.max(1);
        let log = 63 - v.leading_zeros();
        if log < SUB {
            return v as usize;
        }
        let sub = (v >> (log - SUB)) & ((1 << SUB) - 1);
        (((log - SUB + 1) << SUB) as u64 + sub) as usize
    }

    fn value(idx: usize) -> u64 {
        let (hi, sub) = ((idx >> SUB) as u32, (idx & ((1 << SUB) - 1)) as u64);
        if hi == 0 {
            return sub;
        }
        let log = hi + SUB - 1;
        ((1u64 << SUB) | sub) << (log - SUB)
    }

    #[inline]
    pub(crate) fn record(&mut self, ns: u64) {
        let i = Self::index(ns).min(self.counts.len() - 1);
        self.counts[i] += 1;
        self.total += 1;
    }

    pub(crate) fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
    }

    /// Value at quantile `q` (0..=1), in ns.
    pub(crate) fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((self.total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::value(i);
            }
        }
        Self::value(self.counts.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_within_resolution() {
        let mut h = Histogram::new();
        for v in 1..=100_000u64 {
            h.record(v);
        }
        let p50 = h.quantile(0.5) as f64;
        assert!((p50 - 50_000.0).abs() / 50_000.0 < 0.04, "{p50}");
        let p99 = h.quantile(0.99) as f64;
        assert!((p99 - 99_000.0).abs() / 99_000.0 < 0.04, "{p99}");
        assert_eq!(Histogram::index(7), 7);
        assert_eq!(Histogram::value(Histogram::index(31)), 31);
    }
}
