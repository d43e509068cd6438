//! Model check of the SPSC ring against a simple sequential model.
//!
//! The model tracks the four indices the real ring has — local and published
//! on each side — because visibility is the subtle part: the consumer sees
//! only entries the producer has published, and the producer can only reuse
//! slots the consumer has published.

use proptest::prelude::*;
use tent_rings::spsc::{self, Consumer, Producer};

#[derive(Clone, Debug)]
enum Op {
    Push(u64),
    PushSlice(Vec<u64>),
    SyncProducer,
    Pop,
    Peek,
    PopInto(usize),
    SyncConsumer,
    Slots,
    Len,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => any::<u64>().prop_map(Op::Push),
        2 => prop::collection::vec(any::<u64>(), 0..12).prop_map(Op::PushSlice),
        2 => Just(Op::SyncProducer),
        3 => Just(Op::Pop),
        1 => Just(Op::Peek),
        2 => (0usize..12).prop_map(Op::PopInto),
        2 => Just(Op::SyncConsumer),
        1 => Just(Op::Slots),
        1 => Just(Op::Len),
    ]
}

/// Every value ever pushed, plus the ring's four indices as plain counts.
struct Model {
    capacity: usize,
    values: Vec<u64>,
    /// Published by the producer (`values[..tail_published]` are visible).
    tail_published: usize,
    /// Consumed locally by the consumer.
    head: usize,
    /// Released to the producer.
    head_published: usize,
}

impl Model {
    fn free(&self) -> usize {
        self.capacity - (self.values.len() - self.head_published)
    }
    fn available(&self) -> usize {
        self.tail_published - self.head
    }
}

fn run(capacity: u32, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let (mut p, mut c): (Producer<u64>, Consumer<u64>) = spsc::channel(capacity).unwrap();
    let mut m = Model {
        capacity: capacity as usize,
        values: Vec::new(),
        tail_published: 0,
        head: 0,
        head_published: 0,
    };
    for op in ops {
        match op {
            Op::Push(v) => {
                let fits = m.free() > 0;
                match p.push(v) {
                    Ok(()) => {
                        prop_assert!(fits, "push succeeded on a full ring");
                        m.values.push(v);
                    }
                    Err(e) => {
                        prop_assert!(!fits, "push failed with {} free", m.free());
                        prop_assert_eq!(e.0, v);
                    }
                }
            }
            Op::PushSlice(vs) => {
                let n = p.push_slice(&vs);
                prop_assert_eq!(n, vs.len().min(m.free()));
                m.values.extend_from_slice(&vs[..n]);
            }
            Op::SyncProducer => {
                p.sync();
                m.tail_published = m.values.len();
            }
            Op::Pop => {
                let expect = (m.available() > 0).then(|| m.values[m.head]);
                prop_assert_eq!(c.pop(), expect);
                if expect.is_some() {
                    m.head += 1;
                }
            }
            Op::Peek => {
                let expect = (m.available() > 0).then(|| m.values[m.head]);
                prop_assert_eq!(c.peek().copied(), expect);
            }
            Op::PopInto(len) => {
                let mut out = vec![0; len];
                let n = c.pop_into(&mut out);
                let k = len.min(m.available());
                prop_assert_eq!(n, k);
                prop_assert_eq!(&out[..n], &m.values[m.head..m.head + k]);
                m.head += k;
            }
            Op::SyncConsumer => {
                c.sync();
                m.head_published = m.head;
            }
            Op::Slots => prop_assert_eq!(p.slots(), m.free()),
            Op::Len => prop_assert_eq!(c.len(), m.available()),
        }
        prop_assert_eq!(p.pending(), m.values.len() - m.tail_published);
    }
    // Dropping the producer publishes what is pending.
    drop(p);
    prop_assert!(c.is_producer_closed());
    let rest: Vec<u64> = std::iter::from_fn(|| c.pop()).collect();
    prop_assert_eq!(&rest[..], &m.values[m.head..]);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn ring_matches_model(
        capacity in prop::sample::select(vec![2u32, 4, 8]),
        ops in prop::collection::vec(op(), 0..200),
    ) {
        run(capacity, ops)?;
    }
}
