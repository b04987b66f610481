//! The map against a `HashMap` model: per-key sums, variables, `len`, drops when the pool is
//! full, `for_each` and `clear`, for random key sizes and operation sequences (one thread).

use proptest::prelude::*;
use std::collections::HashMap;
use ustrace_tracemap::{MapConfig, TracingMap};

#[derive(Clone, Debug)]
enum Op {
    Insert { key: u8, val: usize, amount: u64 },
    Lookup { key: u8 },
    SetVar { key: u8, v: u64 },
    TakeVar { key: u8 },
    Clear,
}

fn op() -> impl Strategy<Value = Op> {
    // Keys from a space larger than the pool so that it fills and drops.
    let key = 0u8..48;
    prop_oneof![
        8 => (key.clone(), 0usize..2, 0u64..1000)
            .prop_map(|(key, val, amount)| Op::Insert { key, val, amount }),
        3 => key.clone().prop_map(|key| Op::Lookup { key }),
        2 => (key.clone(), any::<u64>()).prop_map(|(key, v)| Op::SetVar { key, v }),
        2 => key.prop_map(|key| Op::TakeVar { key }),
        1 => Just(Op::Clear),
    ]
}

/// A distinct `key_size`-byte key per index; byte 0 is the index, the rest vary with it so
/// keys differ in every word.
fn key_bytes(idx: u8, key_size: usize) -> Vec<u8> {
    (0..key_size)
        .map(|i| idx.wrapping_mul(i as u8 + 1).wrapping_add(i as u8))
        .collect()
}

#[derive(Default)]
struct Model {
    elts: HashMap<u8, ([u64; 2], Option<u64>)>,
    drops: u64,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn matches_hashmap_model(
        bits in 0u32..6,
        key_size in 1usize..24,
        ops in proptest::collection::vec(op(), 1..300),
    ) {
        let max_elts = 1usize << bits;
        let map = TracingMap::new(MapConfig { max_elts, key_size, n_vals: 2, n_vars: 1 }).unwrap();
        let mut model = Model::default();
        for op in ops {
            match op {
                Op::Insert { key, val, amount } => {
                    let got = map.insert(&key_bytes(key, key_size));
                    let full = model.elts.len() == max_elts;
                    match model.elts.get_mut(&key) {
                        Some(m) => {
                            let e = got.expect("existing key found");
                            e.add(val, amount);
                            m.0[val] += amount;
                        }
                        None if full => {
                            prop_assert!(got.is_none(), "new key accepted by a full map");
                            model.drops += 1;
                        }
                        None => {
                            let e = got.expect("new key claimed");
                            prop_assert_eq!(e.val(0), 0);
                            prop_assert_eq!(e.var(0), None);
                            e.add(val, amount);
                            let mut sums = [0; 2];
                            sums[val] = amount;
                            model.elts.insert(key, (sums, None));
                        }
                    }
                }
                Op::Lookup { key } => {
                    let got = map.lookup(&key_bytes(key, key_size));
                    prop_assert_eq!(got.is_some(), model.elts.contains_key(&key));
                    if let Some(e) = got {
                        prop_assert_eq!(e.key(), &key_bytes(key, key_size)[..]);
                        prop_assert_eq!([e.val(0), e.val(1)], model.elts[&key].0);
                    }
                }
                Op::SetVar { key, v } => {
                    let got = map.lookup(&key_bytes(key, key_size));
                    prop_assert_eq!(got.is_some(), model.elts.contains_key(&key));
                    if let (Some(e), Some(m)) = (got, model.elts.get_mut(&key)) {
                        e.set_var(0, v);
                        m.1 = Some(v);
                    }
                }
                Op::TakeVar { key } => {
                    if let (Some(e), Some(m)) =
                        (map.lookup(&key_bytes(key, key_size)), model.elts.get_mut(&key))
                    {
                        prop_assert_eq!(e.var(0), m.1);
                        prop_assert_eq!(e.take_var(0), m.1.take());
                        prop_assert_eq!(e.var(0), None);
                    }
                }
                Op::Clear => {
                    map.clear();
                    model = Model::default();
                }
            }
            prop_assert_eq!(map.len(), model.elts.len());
            prop_assert_eq!(map.drops(), model.drops);
        }
        let mut seen = HashMap::new();
        map.for_each(|e| {
            *seen.entry(e.key().to_vec()).or_insert(0) += 1;
        });
        prop_assert_eq!(seen.len(), model.elts.len());
        for (key, (sums, var)) in &model.elts {
            let kb = key_bytes(*key, key_size);
            prop_assert_eq!(seen.get(&kb).copied(), Some(1), "visited once");
            let e = map.lookup(&kb).unwrap();
            prop_assert_eq!([e.val(0), e.val(1)], *sums);
            prop_assert_eq!(e.var(0), *var);
        }
    }
}
