//! The update path allocates nothing: after `new`, inserting (new keys, existing keys, into a
//! full map), looking up, adding, setting and taking variables, walking and clearing make no
//! call to the allocator.

use ustrace_tracemap::{MapConfig, TracingMap};

#[global_allocator]
static GLOBAL: ustrace_testalloc::CountingAllocator = ustrace_testalloc::CountingAllocator;

#[test]
fn update_path_does_not_allocate() {
    let map = TracingMap::new(MapConfig {
        max_elts: 64,
        key_size: 20,
        n_vals: 3,
        n_vars: 2,
    })
    .unwrap();
    let (hits, var1) = (map.val_at(0), map.var_at(1));
    let mut sum = 0u64;
    // This thread's allocations only: the test harness's other threads are not counted.
    let allocations = ustrace_testalloc::count_on_this_thread(|| {
        for round in 0..3u64 {
            for k in 0u64..100 {
                let mut key = [0u8; 20];
                key[..8].copy_from_slice(&k.to_ne_bytes());
                key[16] = 0x5a;
                // Keys 64.. find the pool full: the drop path must not allocate either.
                if let Some(e) = map.insert(&key) {
                    e.add(0, 1);
                    e.add(1, k);
                    e.set_val(2, k);
                    e.update_max(2, round);
                    e.set_var(0, k);
                    sum += e.take_var(0).unwrap_or(0) + e.var(1).unwrap_or(0) + e.val(1);
                    e.add_at(hits, 1);
                    e.set_var_at(var1, k);
                    sum += e.var_at(var1).unwrap_or(0) + e.take_var_at(var1).unwrap_or(0);
                }
                if let Some(e) = map.lookup(&key) {
                    sum += e.val(0) + e.val(2);
                }
            }
            map.for_each(|e| sum += e.val(0));
            sum += map.len() as u64 + map.drops();
            if round == 1 {
                map.clear();
            }
        }
    });
    assert!(sum > 0);
    assert_eq!(map.len(), 64);
    assert_eq!(allocations, 0, "allocations on the update path");
}
