//! The table from a callsite's metadata to its events, read on every `tracing` event.
//!
//! Callsites are `'static` and never go away, so neither do their entries: the table is an
//! open-addressing hash keyed by the metadata's address whose slots are written once. Readers
//! take no lock: they load the table, hash the address and probe. Writers (callsite
//! registration, rare) are serialized by a mutex; when the table is half full they build
//! one twice the size, copy the entries and publish it. Old tables are kept (never freed),
//! since a reader may still probe one; together they are less than the newest table's size.

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::Mutex;

use tracing_core::Metadata;

struct Slot<T: 'static> {
    key: AtomicUsize,
    value: AtomicPtr<T>,
}

struct Table<T: 'static> {
    mask: usize,
    slots: Box<[Slot<T>]>,
}

impl<T> Table<T> {
    fn new(capacity: usize) -> Table<T> {
        Table {
            mask: capacity - 1,
            slots: (0..capacity)
                .map(|_| Slot {
                    key: AtomicUsize::new(0),
                    value: AtomicPtr::new(std::ptr::null_mut()),
                })
                .collect(),
        }
    }

    #[inline(always)]
    fn start(&self, key: usize) -> usize {
        // Metadata addresses are aligned: drop the zero bits, then spread with Fibonacci
        // hashing so neighbouring callsites land far apart.
        ((key >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20) & self.mask
    }

    #[inline]
    fn get(&self, key: usize) -> Option<&'static T> {
        let mut at = self.start(key);
        loop {
            let slot = &self.slots[at];
            let k = slot.key.load(Ordering::Acquire);
            if k == key {
                // SAFETY: the value is stored (Release) before the key and is a leaked box
                // that is never freed.
                return unsafe { slot.value.load(Ordering::Acquire).as_ref() };
            }
            if k == 0 {
                return None;
            }
            at = (at + 1) & self.mask;
        }
    }

    /// Only under the writers' mutex.
    fn insert(&self, key: usize, value: *mut T) {
        let mut at = self.start(key);
        loop {
            let slot = &self.slots[at];
            if slot.key.load(Ordering::Relaxed) == 0 {
                slot.value.store(value, Ordering::Release);
                slot.key.store(key, Ordering::Release);
                return;
            }
            at = (at + 1) & self.mask;
        }
    }
}

/// Callsite metadata → `&'static T`.
pub struct SiteMap<T: 'static> {
    table: AtomicPtr<Table<T>>,
    writers: Mutex<Writers<T>>,
}

struct Writers<T: 'static> {
    len: usize,
    /// Every table made, the current one last; kept because readers may still use them.
    /// Boxed so that a table stays where readers found it when the vector grows.
    #[allow(clippy::vec_box)]
    tables: Vec<Box<Table<T>>>,
}

// SAFETY: the map hands out `&'static T` to any thread, so `T` must be Sync; the tables
// themselves are atomics.
unsafe impl<T: Sync> Sync for SiteMap<T> {}
// SAFETY: as above; the boxes it owns are only freed with the map.
unsafe impl<T: Sync + Send> Send for SiteMap<T> {}

impl<T> SiteMap<T> {
    pub const fn new() -> SiteMap<T> {
        SiteMap {
            table: AtomicPtr::new(std::ptr::null_mut()),
            writers: Mutex::new(Writers {
                len: 0,
                tables: Vec::new(),
            }),
        }
    }

    /// A callsite's metadata is a static of its own, so its address names it.
    fn key(meta: &Metadata<'_>) -> usize {
        meta as *const Metadata<'_> as usize
    }

    /// The entry of a callsite, if it registered. No lock, no allocation.
    #[inline]
    pub fn get(&self, meta: &Metadata<'_>) -> Option<&'static T> {
        let table = self.table.load(Ordering::Acquire);
        // SAFETY: a published table is never freed while the map lives, and the map is a
        // static.
        let table = unsafe { table.as_ref() }?;
        table.get(Self::key(meta))
    }

    /// The entry of a callsite, made by `make` if there is none yet (`None` from `make`
    /// leaves it absent).
    pub fn get_or_insert(
        &self,
        meta: &'static Metadata<'static>,
        make: impl FnOnce() -> Option<T>,
    ) -> Option<&'static T> {
        let mut writers = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = self.get(meta) {
            return Some(found);
        }
        let value: &'static T = Box::leak(Box::new(make()?));
        let capacity = writers.tables.last().map_or(0, |t| t.mask + 1);
        if (writers.len + 1) * 2 > capacity {
            let bigger = Box::new(Table::new((capacity * 2).max(256)));
            if let Some(old) = writers.tables.last() {
                for slot in old.slots.iter() {
                    let key = slot.key.load(Ordering::Relaxed);
                    if key != 0 {
                        bigger.insert(key, slot.value.load(Ordering::Relaxed));
                    }
                }
            }
            self.table.store(
                &*bigger as *const Table<T> as *mut Table<T>,
                Ordering::Release,
            );
            writers.tables.push(bigger);
        }
        let table = writers.tables.last().expect("a table was made");
        table.insert(Self::key(meta), value as *const T as *mut T);
        writers.len += 1;
        Some(value)
    }
}
