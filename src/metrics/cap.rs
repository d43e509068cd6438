//! The label-cardinality cap (`metrics/max_labelled_peers`): the per-rail
//! and per-SQ tables have a series per peer, and a peer is anyone who
//! opened a segment to us, so 200 peers with a few rails each would make
//! thousands of series per scrape. At most `max` peers keep their own
//! series ([`kept_peers`]: those that carried the most bytes, ties by
//! name); the others' rows are summed ([`collapse`]) into one row per
//! family and per value of the labels that do not name a peer (the
//! transport, the QP slot), with every label that names one (segment,
//! local NIC, remote NIC) set to [`OTHER`]. Totals still add up: a
//! counter or an occupancy is the sum of what it replaces, a state the
//! worst of them, a high watermark the highest, an age the newest.
//!
//! Which peers are kept is decided anew at each scrape from the bytes
//! counters, which only grow, so the choice moves only when a peer
//! overtakes another; a peer that moves in or out of the kept set moves
//! its counts between its own series and `_other` (a scraper sees that as
//! a counter reset of the one it left, as when a peer closes).

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The label value that stands for every peer past the cap.
pub(crate) const OTHER: &str = "_other";

/// A value absent from a row (an age with no event yet): no sample.
pub(crate) const ABSENT: u64 = u64::MAX;

/// How a family's values from several rows make the one of `_other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Merge {
    /// Counters, occupancies, bandwidths: the sum.
    Sum,
    /// A state or tier where higher is worse, a high watermark: the highest.
    Max,
    /// An age: the newest, the smallest ([`ABSENT`] counts as none).
    Min,
}

impl Merge {
    /// `a` and `b` together.
    pub(crate) fn apply(self, a: u64, b: u64) -> u64 {
        match self {
            // Saturating short of ABSENT: a sum is never mistaken for none.
            Merge::Sum => a.saturating_add(b).min(ABSENT - 1),
            Merge::Max if a == ABSENT => b,
            Merge::Max if b == ABSENT => a,
            Merge::Max => a.max(b),
            Merge::Min => a.min(b),
        }
    }
}

/// One series' label values (in its table's label order) and its value
/// in each of the table's `F` families ([`ABSENT`]: no sample).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row<const F: usize> {
    /// Label values.
    pub(crate) labels: [String; 4],
    /// One value per family.
    pub(crate) values: [u64; F],
}

/// The peers that keep their own series: of the segments in `carried`
/// ((segment, bytes) per rail; a segment's rails add up, a segment with
/// none is listed with 0), the `max` that carried the most bytes, ties by
/// name. Pure: the same rows give the same peers.
pub(crate) fn kept_peers<'a>(
    carried: impl IntoIterator<Item = (&'a str, u64)>,
    max: usize,
) -> BTreeSet<&'a str> {
    let mut bytes: HashMap<&str, u64> = HashMap::new();
    for (segment, b) in carried {
        let total = bytes.entry(segment).or_default();
        *total = total.saturating_add(b);
    }
    let mut ranked: Vec<(&str, u64)> = bytes.into_iter().collect();
    ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    ranked.into_iter().take(max).map(|(s, _)| s).collect()
}

/// `rows` with those whose peer (label `segment`) is not in `kept`
/// summed: one row per distinct value of the labels `peer_named` leaves
/// alone, the others set to [`OTHER`], each family merged by its rule in
/// `merge`. Rows with the same labels are merged the same way wherever
/// they are (a peer that advertises one rail twice would otherwise make
/// two series with one name, a scrape Prometheus refuses part of). The
/// kept rows keep their order; the `_other` rows follow, ordered by their
/// labels.
pub(crate) fn collapse<const F: usize>(
    rows: Vec<Row<F>>,
    segment: usize,
    peer_named: [bool; 4],
    merge: [Merge; F],
    kept: &BTreeSet<&str>,
) -> Vec<Row<F>> {
    let fold = |values: &mut [u64; F], new: [u64; F]| {
        for ((v, new), m) in values.iter_mut().zip(new).zip(merge) {
            *v = m.apply(*v, new);
        }
    };
    let mut out: Vec<Row<F>> = Vec::new();
    let mut at: HashMap<[String; 4], usize> = HashMap::new();
    let mut other: BTreeMap<[String; 4], [u64; F]> = BTreeMap::new();
    for row in rows {
        if kept.contains(row.labels[segment].as_str()) {
            match at.get(&row.labels) {
                Some(&i) => fold(&mut out[i].values, row.values),
                None => {
                    at.insert(row.labels.clone(), out.len());
                    out.push(row);
                }
            }
            continue;
        }
        let mut labels = row.labels;
        for (l, named) in labels.iter_mut().zip(peer_named) {
            if named {
                OTHER.clone_into(l);
            }
        }
        match other.get_mut(&labels) {
            Some(values) => fold(values, row.values),
            None => {
                other.insert(labels, row.values);
            }
        }
    }
    for (labels, values) in other {
        // A kept row that already reads `_other` everywhere (names a
        // hostile peer chose) takes the sum rather than a second series.
        match at.get(&labels) {
            Some(&i) => fold(&mut out[i].values, values),
            None => out.push(Row { labels, values }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two rows with one set of labels (a peer advertising a rail twice)
    /// are one series, kept or past the cap.
    #[test]
    fn rows_with_the_same_labels_are_one_series() {
        let row = |seg: &str, v| Row {
            labels: ["tcp".into(), seg.into(), "eth0".into(), "eth0@p".into()],
            values: [v, 1],
        };
        let rows = vec![row("a", 5), row("a", 7), row("b", 1), row("b", 2)];
        let kept: BTreeSet<&str> = ["a"].into();
        let out = collapse(
            rows,
            1,
            [false, true, true, true],
            [Merge::Sum, Merge::Max],
            &kept,
        );
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!((out[0].labels[1].as_str(), out[0].values), ("a", [12, 1]));
        assert_eq!((out[1].labels[1].as_str(), out[1].values), (OTHER, [3, 1]));
    }

    #[test]
    fn kept_peers_are_the_busiest_then_by_name() {
        let carried = [
            ("c", 10),
            ("a", 5),
            ("b", 5),
            ("d", 1),
            ("d", 20), // a second rail of d
            ("e", 0),
        ];
        let kept = |max| kept_peers(carried, max).into_iter().collect::<Vec<_>>();
        assert_eq!(kept(2), ["c", "d"]);
        // a and b tie at 5: the name decides, whatever the input order.
        assert_eq!(kept(3), ["a", "c", "d"]);
        let reversed: Vec<_> = carried.iter().rev().copied().collect();
        assert_eq!(
            kept_peers(reversed, 3).into_iter().collect::<Vec<_>>(),
            ["a", "c", "d"]
        );
        assert_eq!(kept(0), Vec::<&str>::new());
        assert_eq!(kept(100).len(), 5);
    }

    #[test]
    fn merges_sum_take_the_worst_and_the_newest() {
        assert_eq!(Merge::Sum.apply(2, 3), 5);
        assert_eq!(Merge::Sum.apply(ABSENT - 1, 3), ABSENT - 1);
        assert_eq!(Merge::Max.apply(1, 3), 3);
        assert_eq!(Merge::Max.apply(ABSENT, 3), 3);
        assert_eq!(Merge::Min.apply(ABSENT, 7), 7);
        assert_eq!(Merge::Min.apply(ABSENT, ABSENT), ABSENT);
        assert_eq!(Merge::Min.apply(9, 7), 7);
    }

    #[test]
    fn collapse_keeps_the_kept_and_sums_the_rest_per_unnamed_label() {
        let row = |t: &str, seg: &str, v: [u64; 2]| Row {
            labels: [t.into(), seg.into(), format!("{seg}-nic"), "r".into()],
            values: v,
        };
        let rows = vec![
            row("tcp", "a", [1, 0]),
            row("tcp", "b", [2, 3]),
            row("rdma", "c", [4, 1]),
            row("tcp", "d", [8, 2]),
        ];
        let kept = BTreeSet::from(["a"]);
        let out = collapse(
            rows,
            1,
            [false, true, true, true],
            [Merge::Sum, Merge::Max],
            &kept,
        );
        let other = |t: &str, v| Row {
            labels: [t.into(), OTHER.into(), OTHER.into(), OTHER.into()],
            values: v,
        };
        assert_eq!(
            out,
            vec![
                row("tcp", "a", [1, 0]),
                other("rdma", [4, 1]),
                other("tcp", [10, 3]),
            ]
        );
    }
}
