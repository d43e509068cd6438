use super::fake::{Fakes, PROBE, Peer, SWEEP, T0, admit, id_at, key};
use super::*;

/// The refusal of a full table with `probing` probes in flight.
fn full(probing: usize) -> std::result::Result<usize, TableFull> {
    Err(TableFull { probing })
}

#[test]
fn of_two_requests_for_one_key_the_latest_files_its_qp_whichever_ends_first() {
    let f = Fakes::default();
    let mut t = PassiveTable::new(8);
    let k = key(7, 0, 0);
    let older = t.begin(k);
    let newer = t.begin(k);
    // The newer (a retry) connects first and is filed.
    assert!(t.finish(k, newer, f.qp(2).0, T0).unwrap().is_none());
    // The older one ends last: it files nothing and its QP comes back
    // to be destroyed; the newer one's QP stays.
    let back = t.finish(k, older, f.qp(1).0, T0).map(|_| ()).unwrap_err();
    assert_eq!(back.id, 1);
    drop(back);
    assert_eq!(id_at(&t, &k), Some(2));
    assert_eq!(f.dropped(), [1]);
    // In the other order the older is superseded as well.
    let older = t.begin(k);
    let newer = t.begin(k);
    let back = t.finish(k, older, f.qp(3).0, T0).map(|_| ()).unwrap_err();
    drop(back);
    assert_eq!(
        t.finish(k, newer, f.qp(4).0, T0).unwrap().map(|q| q.id),
        Some(2)
    );
    assert_eq!(id_at(&t, &k), Some(4));
    // A request that made no QP leaves nothing pending.
    let gone = t.begin(k);
    t.abandon(&k, gone);
    assert!(t.pending.is_empty());
}

#[test]
fn reconnect_under_the_same_key_replaces_the_old_qp() {
    let f = Fakes::default();
    let mut t = PassiveTable::new(8);
    assert!(admit(&mut t, key(7, 0, 0), f.qp(1).0, T0));
    assert!(admit(&mut t, key(7, 0, 1), f.qp(2).0, T0));
    // Worker 0 rail 0 of engine 7 reconnects: its old QP goes.
    assert!(admit(&mut t, key(7, 0, 0), f.qp(3).0, T0));
    assert_eq!(t.len(), 2);
    assert_eq!(id_at(&t, &key(7, 0, 0)), Some(3));
    assert_eq!(id_at(&t, &key(7, 0, 1)), Some(2));
    assert_eq!(f.dropped(), [1]);
    // Another worker, rail or engine is another key.
    assert!(admit(&mut t, key(7, 1, 0), f.qp(4).0, T0));
    assert!(admit(&mut t, key(8, 0, 0), f.qp(5).0, T0));
    assert_eq!(t.len(), 4);
    assert_eq!(f.dropped(), [1]);
    // insert hands the replaced QP back to the caller.
    let (q, _) = f.qp(6);
    let old = t.insert(key(8, 0, 0), q, T0).unwrap().expect("replaced");
    assert_eq!(old.id, 5);
}

#[test]
fn a_full_table_of_live_qps_refuses_a_newcomer_and_keeps_them_all() {
    let f = Fakes::default();
    let mut t = PassiveTable::new(3);
    for r in 0..3 {
        assert!(admit(&mut t, key(7, 0, r), f.qp(r as u32).0, T0));
    }
    assert_eq!(t.room(&key(9, 0, 0), T0), full(0));
    // Even past the sweep and probe intervals: the sweeps find nothing
    // dead, and the probes are acknowledged.
    for s in 1..=20 {
        assert!(t.room(&key(9, 0, 0), T0 + s * SWEEP).is_err());
    }
    let (q, _) = f.qp(9);
    let back = t.insert(key(9, 0, 0), q, T0).map(|_| ()).unwrap_err();
    assert_eq!(back.id, 9, "the refused QP comes back to its caller");
    drop(back);
    assert_eq!(t.len(), 3);
    for r in 0..3 {
        assert_eq!(id_at(&t, &key(7, 0, r)), Some(r as u32));
    }
    assert_eq!(f.dropped(), [9], "no filed QP was dropped");
    let c = t.probe_counts();
    assert!(c.acked > 0 && c.failed == 0, "{c:?}");
    // A reconnect of a filed key needs no free slot.
    assert!(admit(&mut t, key(7, 0, 1), f.qp(11).0, T0 + 20 * SWEEP));
    assert_eq!(id_at(&t, &key(7, 0, 1)), Some(11));
    assert_eq!(t.len(), 3);
}

#[test]
fn a_full_table_evicts_dead_qps_and_only_them() {
    let f = Fakes::default();
    let mut t = PassiveTable::new(4);
    let mut kill = Vec::new();
    for r in 0..4 {
        let (q, live) = f.qp(r as u32);
        assert!(admit(&mut t, key(7, 0, r), q, T0));
        kill.push(live);
    }
    // Rails 1 and 3 went to ERROR.
    kill[1].set(false);
    kill[3].set(false);
    assert_eq!(t.room(&key(9, 0, 0), T0), Ok(2));
    assert_eq!(f.dropped(), [1, 3]);
    assert_eq!(id_at(&t, &key(7, 0, 0)), Some(0));
    assert_eq!(id_at(&t, &key(7, 0, 2)), Some(2));
    assert!(t.insert(key(9, 0, 0), f.qp(10).0, T0).is_ok());
    assert!(admit(&mut t, key(9, 0, 1), f.qp(11).0, T0));
    // Full again, all live: the next newcomer is refused.
    assert!(!admit(&mut t, key(9, 0, 2), f.qp(12).0, T0 + SWEEP));
    assert_eq!(t.len(), 4);
    assert_eq!(f.dropped(), [1, 3, 12]);
}

#[test]
fn a_full_table_is_swept_at_most_once_per_interval() {
    let f = Fakes::default();
    let mut t = PassiveTable::new(2);
    let (q0, live0) = f.qp(0);
    assert!(admit(&mut t, key(7, 0, 0), q0, T0));
    assert!(admit(&mut t, key(7, 0, 1), f.qp(1).0, T0));
    // A sweep that finds nothing dead...
    assert_eq!(t.room(&key(9, 0, 0), T0), full(0));
    // ...is not repeated before SWEEP_EVERY, even once a QP dies.
    live0.set(false);
    assert_eq!(t.room(&key(9, 0, 0), T0 + SWEEP - 1), full(0));
    assert!(f.dropped().is_empty());
    assert_eq!(t.room(&key(9, 0, 0), T0 + SWEEP), Ok(1));
    assert_eq!(f.dropped(), [0]);
    // A table with room never sweeps (nor waits for the interval).
    assert_eq!(t.room(&key(9, 0, 0), T0 + SWEEP), Ok(0));
}

#[test]
fn keys_are_bounded() {
    // A table key is a QpInitiator, which only QpInitiator::new makes.
    assert!(QpInitiator::new(0, 0, 0).is_err(), "engine 0 is reserved");
    assert!(QpInitiator::new(1, crate::control::wire::MAX_QP_WORKERS, 0).is_err());
    assert!(QpInitiator::new(1, 0, crate::control::wire::MAX_QP_RAILS).is_err());
    let mut t = PassiveTable::<super::fake::Fake>::new(0);
    // A zero-capacity table takes nothing (and sweeps nothing).
    assert_eq!(t.room(&key(1, 0, 0), T0), full(0));
    assert!(t.is_empty());
}

#[test]
fn a_full_table_probes_its_qps_only_once_they_are_a_probe_interval_old() {
    let f = Fakes::default();
    let mut t = PassiveTable::new(3);
    let mut ctl = Vec::new();
    for r in 0..3 {
        let (q, c) = f.probed(r as u32);
        assert!(admit(&mut t, key(7, 0, r), q, T0));
        ctl.push(c);
    }
    // Fresh QPs (their initiators may still be connecting) go unprobed.
    let newcomer = key(9, 0, 0);
    assert_eq!(t.room(&newcomer, T0), full(0));
    assert_eq!(t.room(&newcomer, T0 + PROBE - SWEEP), full(0));
    assert!(ctl.iter().all(|c| c.probes.get() == 0));
    // Rail 2 reconnects: its new QP starts a grace of its own.
    let (q, c) = f.probed(22);
    assert!(admit(&mut t, key(7, 0, 2), q, T0 + PROBE - SWEEP));
    ctl[2] = c;
    // Due: one probe each on the others, in flight until reaped.
    assert_eq!(t.room(&newcomer, T0 + PROBE), full(2));
    let probes: Vec<_> = ctl.iter().map(|c| c.probes.get()).collect();
    assert_eq!(probes, [1, 1, 0]);
    assert_eq!(t.probe_counts().posted, 2);
    // Between sweeps nothing is reaped or posted.
    assert_eq!(t.room(&newcomer, T0 + PROBE + SWEEP - 1), full(2));
    assert_eq!(t.probe_counts().acked, 0);
    // Live initiators acknowledge: nothing dropped.
    assert_eq!(t.room(&newcomer, T0 + PROBE + SWEEP), full(0));
    assert_eq!(t.probe_counts().acked, 2);
    assert_eq!(f.dropped(), [2], "only the QP its reconnect replaced");
    assert_eq!(t.len(), 3);
    // A table with room neither sweeps nor probes.
    let mut roomy = PassiveTable::new(4);
    let (q, c) = f.probed(40);
    assert!(admit(&mut roomy, key(8, 0, 0), q, T0));
    for s in 0..100 {
        assert_eq!(roomy.room(&newcomer, T0 + s * SWEEP), Ok(0));
    }
    assert_eq!(c.probes.get(), 0);
}

#[test]
fn a_qp_whose_initiator_vanished_fails_its_probe_and_gives_up_its_slot_at_the_next_sweep() {
    let f = Fakes::default();
    let mut t = PassiveTable::new(3);
    let mut ctl = Vec::new();
    for r in 0..3 {
        let (q, c) = f.probed(r as u32);
        assert!(admit(&mut t, key(7, 0, r), q, T0));
        ctl.push(c);
    }
    // Rail 1's initiator vanished: its passive QP is still RTS.
    ctl[1].peer.set(Peer::Gone);
    let newcomer = key(9, 0, 0);
    assert_eq!(t.room(&newcomer, T0 + PROBE), full(3));
    assert!(f.dropped().is_empty(), "in RTS, nothing tells it dead yet");
    assert_eq!(t.room(&newcomer, T0 + PROBE + SWEEP - 1), full(3));
    assert!(f.dropped().is_empty());
    // The next sweep reaps the failed probe: its slot is the newcomer's.
    assert!(admit(&mut t, newcomer, f.probed(9).0, T0 + PROBE + SWEEP));
    assert_eq!(f.dropped(), [1]);
    assert_eq!(id_at(&t, &key(7, 0, 0)), Some(0));
    assert_eq!(id_at(&t, &key(7, 0, 2)), Some(2));
    assert_eq!(
        t.probe_counts(),
        ProbeCounts {
            posted: 3,
            acked: 2,
            failed: 1
        }
    );
}

#[test]
fn live_qps_are_never_evicted_and_each_is_probed_at_most_once_per_interval() {
    let f = Fakes::default();
    let mut t = PassiveTable::new(2);
    let (a, ca) = f.probed(0);
    let (b, cb) = f.probed(1);
    assert!(admit(&mut t, key(7, 0, 0), a, T0));
    assert!(admit(&mut t, key(7, 0, 1), b, T0));
    // A newcomer knocks every 100 ms for a simulated minute.
    let step = 100_000_000;
    let minute = 60_000_000_000;
    let mut probed_at: Vec<Vec<u64>> = vec![Vec::new(), Vec::new()];
    let mut now = T0;
    while now < T0 + minute {
        let before = [ca.probes.get(), cb.probes.get()];
        assert!(!admit(&mut t, key(9, 0, 0), f.probed(9).0, now));
        for (i, c) in [&ca, &cb].into_iter().enumerate() {
            if c.probes.get() != before[i] {
                probed_at[i].push(now);
            }
        }
        now += step;
    }
    let mut dropped = f.dropped();
    dropped.dedup();
    assert_eq!(dropped, [9], "only the refused newcomers were dropped");
    assert_eq!((id_at(&t, &key(7, 0, 0)), id_at(&t, &key(7, 0, 1))), (Some(0), Some(1)));
    for at in &probed_at {
        assert!(at.len() >= 5, "probed at {at:?}");
        assert!(at[0] >= T0 + PROBE, "no probe within the grace");
        for w in at.windows(2) {
            assert!(w[1] - w[0] >= PROBE, "probes {} ns apart", w[1] - w[0]);
        }
    }
    let c = t.probe_counts();
    assert_eq!((c.failed, c.posted - c.acked <= 2), (0, true), "{c:?}");
}

#[test]
fn a_qp_has_one_probe_in_flight_at_most_and_an_unanswered_one_evicts_nothing() {
    let f = Fakes::default();
    let mut t = PassiveTable::new(1);
    let (q, c) = f.probed(0);
    c.peer.set(Peer::Silent);
    assert!(admit(&mut t, key(7, 0, 0), q, T0));
    let newcomer = key(9, 0, 0);
    assert_eq!(t.room(&newcomer, T0 + PROBE), full(1));
    // The device retries: many sweeps later still one probe, QP kept
    // (the fake panics on a second probe in flight).
    for s in 1..=50 {
        assert_eq!(t.room(&newcomer, T0 + PROBE + s * SWEEP), full(1));
    }
    assert_eq!(c.probes.get(), 1);
    assert!(f.dropped().is_empty());
    // Its retries run out: the next sweep drops it.
    c.peer.set(Peer::Gone);
    assert_eq!(t.room(&newcomer, T0 + PROBE + 51 * SWEEP), Ok(1));
    assert_eq!(f.dropped(), [0]);
}

#[test]
fn a_probe_that_cannot_be_posted_evicts_nothing_and_is_tried_again_a_probe_interval_later() {
    let f = Fakes::default();
    let mut t = PassiveTable::new(1);
    let (q, c) = f.probed(0);
    c.peer.set(Peer::Unpostable);
    assert!(admit(&mut t, key(7, 0, 0), q, T0));
    let newcomer = key(9, 0, 0);
    assert_eq!(t.room(&newcomer, T0 + PROBE), full(0));
    assert_eq!(t.probe_counts().posted, 0);
    // The post works again (its initiator is gone meanwhile), but the
    // next try waits its interval.
    c.peer.set(Peer::Gone);
    assert_eq!(t.room(&newcomer, T0 + 2 * PROBE - SWEEP), full(0));
    assert_eq!(c.probes.get(), 0);
    assert!(f.dropped().is_empty());
    assert_eq!(t.room(&newcomer, T0 + 2 * PROBE), full(1));
    assert_eq!(t.room(&newcomer, T0 + 2 * PROBE + SWEEP), Ok(1));
    assert_eq!(f.dropped(), [0]);
}
