//! The kernel's `tracing_map` for user space: a fixed-size, preallocated, lock-free hash table
//! from byte-string keys to per-key `u64` sums and variables.
//!
//! # Where it sits in the data path
//!
//! A hist trigger compiles its `keys=` into one fixed-width byte string and its `vals=` into
//! value slots. On every event record the trigger builds the key on the stack, calls
//! [`TracingMap::insert`] and adds into the returned [`Elt`] with [`Elt::add`]. Reading the
//! `hist` file walks the claimed elements with [`TracingMap::for_each`], sorts and prints them.
//! Inter-event variables (`$ts0`) live in an element's variable slots ([`Elt::set_var`],
//! [`Elt::take_var`]).
//!
//! # What it guarantees
//!
//! - `insert`, `lookup`, `add`, `set_val`, `val`, `set_var`, `var` and `take_var` take no lock,
//!   allocate nothing and make no system call (one exception: a thread waiting for another to
//!   publish a slot yields its CPU after a short spin, see below). Everything is allocated by
//!   [`TracingMap::new`]; `tests/no_alloc.rs` checks the allocation claim.
//! - A key is claimed at most once: two threads inserting the same new key at the same time get
//!   the same element.
//! - When the element pool is exhausted, `insert` of a new key returns `None` and counts a drop
//!   ([`TracingMap::drops`]); existing keys keep being found and updated.
//! - Every write to shared state is an atomic operation, so the map is `Send + Sync`, no
//!   interleaving of its methods touches memory outside its preallocated arrays, and the only
//!   plain (non-atomic) read is the slice [`Elt::key`] returns, whose bytes do not change while
//!   it is used correctly (see "Clearing while writers run").
//!
//! # Design points kept from the kernel (`kernel/trace/tracing_map.c`, histogram-design.rst)
//!
//! - The element pool (`max_elts` elements, each holding the key bytes, the sums and the
//!   variables) is allocated up front; a new key takes the next free element by an atomic
//!   counter, and elements are never freed one by one — only [`TracingMap::clear`] empties the
//!   map.
//! - The table has twice as many slots as there are elements, so open addressing with linear
//!   probing always finds a free slot quickly. A slot holds a 32-bit hash tag (never 0, 0 means
//!   free) and a reference to its element; a new key claims a free slot with compare-and-swap on
//!   the tag, then takes an element, writes the key into it and publishes the element in the
//!   slot.
//! - A reader meeting a slot whose tag matches but whose element is not yet published waits for
//!   the publisher, as the kernel's `dup_try` loop does, so the same key is never claimed twice.
//! - Keys are compared in full once the tags match; lookups never claim.
//! - When the pool is empty the slot that was claimed is given back and a drop is counted, as
//!   the kernel does.
//!
//! # Where it differs
//!
//! - The tag and the element index share one 64-bit word per slot, so a reader sees both with a
//!   single load; the kernel keeps a 32-bit key and an element pointer in two words.
//! - The hash is a 64-bit multiply–fold over 8-byte words (not jhash); the slot is chosen by its
//!   high bits and the tag is its low 32 bits, so a tag match says more than the slot position
//!   already did.
//!   A caller that finds one key in several maps of its size hashes it once ([`HashedKey`]).
//! - A full pool is detected before a slot is claimed, so a full map costs one shared load per
//!   new key instead of a compare-and-swap on the table.
//! - The kernel waits at most a bounded number of times for a half-published slot (it runs with
//!   preemption off, so the publisher is running). Here a publisher thread can be preempted, so
//!   after a short spin the waiter yields its CPU (`sched_yield`). This is the one system call the
//!   insert path can make, and only when another thread is between claiming and publishing a
//!   slot with the same tag.
//! - Keys are stored as 8-byte words, zero-padded, so comparing a key costs one compare per word.
//! - All elements live in one array of words (the kernel allocates each element and its parts
//!   separately and reaches them through pointers); an element is found from its slot's index
//!   by arithmetic, with no pointer to load.
//! - Each variable has a "set" word beside its value, as the kernel keeps a `var_set` flag per
//!   variable: setting one is two plain stores (no read-modify-write, so no locked instruction
//!   on the update path), and [`Elt::take_var`] clears the flag with one atomic swap and
//!   returns the value, so a variable reference consumes the variable as the kernel's does and
//!   of several takers exactly one gets it.
//! - A caller that updates the same sums and variables on every record can resolve their
//!   places once ([`TracingMap::val_at`], [`TracingMap::var_at`]) and reach them with one
//!   bounds check each ([`Elt::add_at`], [`Elt::set_var_at`], ...).
//!
//! # Clearing while writers run
//!
//! The kernel clears a histogram with its writers paused. [`TracingMap::clear`] is also correct
//! with writers running, in this sense: when it returns, and once the writers have stopped,
//! the map is consistent — every published element sits in one slot under its own key, is found
//! by `lookup`, and is counted by `len`. Claims of new keys never straddle a clear: a clear
//! waits for those under way (a handful of instructions each) and blocks new ones, and a claim
//! whose probe began before a clear probes again. What a concurrent clear does not give:
//!
//! - An update to an [`Elt`] obtained before the clear can land after the reset, in the zeroed
//!   sums, even after the element is claimed again for another key: counts may be torn. A new
//!   key inserted during the clear is refused (`None`, not counted as a drop).
//! - An [`Elt`] held across the clear can be claimed again for another key; a copy of its
//!   [`Elt::key`] taken meanwhile may mix the two keys (every read is atomic, so this is a
//!   wrong answer, never undefined behaviour). Pause the writers (and do not keep `Elt`s
//!   across a clear) to avoid both.
//!
//! `clear` itself takes a mutex (it only serialises clears) and may yield its CPU while it waits
//! for a claim to finish; it is a control-path operation.

#![warn(missing_docs)]

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The shape of a map: fixed at [`TracingMap::new`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapConfig {
    /// How many distinct keys the map holds (a power of two: the hist `size`, already rounded).
    pub max_elts: usize,
    /// Bytes of one key (compound keys concatenated, strings fixed-width).
    pub key_size: usize,
    /// `u64` sums per element (the hitcount is the caller's value 0).
    pub n_vals: usize,
    /// `u64` variables per element, each with a "set" flag.
    pub n_vars: usize,
}

/// Why [`TracingMap::new`] refused a configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapError {
    /// `max_elts` is 0 or not a power of two.
    NotPowerOfTwo(usize),
    /// `max_elts` is above [`MAX_ELTS`].
    TooManyElts(usize),
    /// `key_size` is 0: a map needs a key.
    EmptyKey,
    /// `key_size` above `u32::MAX`, or `n_vals` or `n_vars` above `u16::MAX`.
    FieldsTooLarge,
    /// The preallocation failed (the kernel's `ENOMEM`).
    NoMemory,
}

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MapError::NotPowerOfTwo(n) => write!(f, "map size {n} is not a power of two"),
            MapError::TooManyElts(n) => {
                write!(f, "map size {n} is above the maximum of {MAX_ELTS}")
            }
            MapError::EmptyKey => f.write_str("map key size is 0"),
            MapError::FieldsTooLarge => f.write_str("map key or value count too large"),
            MapError::NoMemory => f.write_str("cannot allocate the map"),
        }
    }
}

impl std::error::Error for MapError {}

/// The largest `max_elts` accepted: slot words keep an element index in 32 bits and the table
/// has `2 * max_elts` slots.
pub const MAX_ELTS: usize = 1 << 30;

/// A slot word: high 32 bits the hash tag (0 = free), low 32 bits the element index plus one
/// (0 = claimed but not yet published, [`DEAD`] = claimed when the pool had run out).
const TAG_SHIFT: u32 = 32;
const IDX_MASK: u64 = 0xffff_ffff;
/// The index of a slot whose claim found no element left. The slot stays taken until the
/// next clear: freeing it would open a hole in the probe run of any key that walked past it
/// meanwhile and settled further on, and lookups stop at the first free slot.
const DEAD: u64 = IDX_MASK;

/// How many times a reader spins on a half-published slot before yielding its CPU.
const SPINS_BEFORE_YIELD: u32 = 64;

/// The lock-free, preallocated hash table. See the module documentation.
pub struct TracingMap {
    cfg: MapConfig,
    /// `2 * max_elts` slot words, see [`TAG_SHIFT`].
    table: Box<[AtomicU64]>,
    /// `log2(table.len())`: the slot index is the hash's top `table_bits` bits.
    table_bits: u32,
    /// All elements, `stride` words each (see [`Elt`]), in one allocation.
    elt_words: Box<[AtomicU64]>,
    stride: usize,
    /// Key words per element, kept here so the hot path need not decode an element's shape.
    key_words: usize,
    /// Elements handed out; may run past `max_elts` by the number of racing failed claims.
    next_elt: AtomicUsize,
    drops: AtomicU64,
    /// Inserts between deciding to claim and publishing (or giving the slot back).
    claimers: AtomicUsize,
    /// Odd while a clear runs; bumped twice by each clear, so a claim can tell that its probe
    /// is older than the last clear.
    clear_seq: AtomicUsize,
    /// Serialises clears (control path only), so that `clear_seq` is odd exactly while one runs.
    clear_lock: Mutex<()>,
}

/// What a claim came to.
enum Claim<'a> {
    /// Claimed (`Some`), or refused: the pool is exhausted or a clear is under way (`None`).
    Done(Option<&'a Elt>),
    /// Another thread took the slot first: its current word, to re-examine.
    Taken(u64),
    /// A clear ran since the probe started: probe again.
    Stale,
}

/// Holds `claimers` up for the length of one claim.
struct ClaimGuard<'a>(&'a AtomicUsize);

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// One element: a key, its sums and its variables. Obtained from [`TracingMap::insert`],
/// [`TracingMap::lookup`] or [`TracingMap::for_each`].
///
/// It is a view of `stride` words of the map's one element array:
/// `[shape][key words][vals][(var, set flag) pairs]`. The shape word (written once by
/// [`TracingMap::new`]) lets the element find its parts without a pointer back to the map, so
/// reaching an element from its slot is arithmetic, not a load.
#[repr(transparent)]
pub struct Elt {
    words: [AtomicU64],
}

/// An element's shape word: key size in bits 0..32, `n_vals` in 32..48, `n_vars` in 48..64.
fn shape_word(cfg: &MapConfig) -> u64 {
    cfg.key_size as u64 | (cfg.n_vals as u64) << 32 | (cfg.n_vars as u64) << 48
}

/// Words before an element's key: the shape word.
const KEY_AT: usize = 1;

/// Where one sum lives in the elements of the map that gave it ([`TracingMap::val_at`]): a
/// word index, so an update reaches the sum without decoding the element's shape. Used with
/// an element of another map it names some word of that element (or panics past its end):
/// a wrong answer, never undefined behaviour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValAt(usize);

/// Where one variable (its value and set flag) lives in the elements of the map that gave
/// it ([`TracingMap::var_at`]); see [`ValAt`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VarAt(usize);

impl fmt::Debug for Elt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let vals: Vec<u64> = (0..self.n_vals()).map(|i| self.val(i)).collect();
        let vars: Vec<Option<u64>> = (0..self.n_vars()).map(|i| self.var(i)).collect();
        f.debug_struct("Elt")
            .field("key", &self.key())
            .field("vals", &vals)
            .field("vars", &vars)
            .finish()
    }
}

impl fmt::Debug for TracingMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TracingMap")
            .field("cfg", &self.cfg)
            .field("len", &self.len())
            .field("drops", &self.drops())
            .finish()
    }
}

const K_SEED: u64 = 0x9e37_79b9_7f4a_7c15;
const K_WORD: u64 = 0xbf58_476d_1ce4_e5b9;
const K_FINAL: u64 = 0x94d0_49bb_1331_11eb;

/// Multiply to 128 bits and fold the halves: every input bit reaches many output bits.
#[inline(always)]
fn fold_mul(a: u64, b: u64) -> u64 {
    let p = (a as u128).wrapping_mul(b as u128);
    (p as u64) ^ ((p >> 64) as u64)
}

/// Calls `f(i, word)` on the key's 8-byte words in order, in native byte order and the last
/// one zero-padded, so a word array holding them has the key's bytes at its start. Stops and
/// returns `false` as soon as `f` does. Full words first, then at most one tail, so the loop
/// has no per-word branch on the key's length.
#[inline(always)]
fn each_word(key: &[u8], mut f: impl FnMut(usize, u64) -> bool) -> bool {
    let mut chunks = key.chunks_exact(8);
    let mut i = 0;
    for c in &mut chunks {
        if !f(i, u64::from_ne_bytes(c.try_into().expect("8 bytes"))) {
            return false;
        }
        i += 1;
    }
    let tail = chunks.remainder();
    tail.is_empty() || f(i, tail_word(tail))
}

/// The last 1 to 7 bytes of a key, zero-padded, as a word (native byte order, like the full
/// words). Assembled in registers from fixed-size loads (4, 2, 1 bytes): copying the tail into
/// a stack buffer and loading it as a word costs a `memcpy` call or a store-forwarding stall,
/// either of which tripled the cost of an update with a 12-byte key.
#[inline(always)]
fn tail_word(tail: &[u8]) -> u64 {
    let n = tail.len();
    // Built as the little-endian reading of the padded bytes, then brought to native order.
    let mut le = 0u64;
    let mut at = 0;
    if n & 4 != 0 {
        le = u32::from_le_bytes(tail[..4].try_into().expect("4 bytes")) as u64;
        at = 4;
    }
    if n & 2 != 0 {
        let half = u16::from_le_bytes(tail[at..at + 2].try_into().expect("2 bytes"));
        le |= (half as u64) << (8 * at);
        at += 2;
    }
    if n & 1 != 0 {
        le |= (tail[at] as u64) << (8 * at);
    }
    u64::from_le(le)
}

/// The hash of a key: a multiply–fold per 8-byte word and a final fold.
#[inline]
fn hash_key(key: &[u8]) -> u64 {
    let mut h = K_SEED ^ key.len() as u64;
    each_word(key, |_, w| {
        h = fold_mul(h ^ w, K_WORD);
        true
    });
    fold_mul(h ^ (h >> 29), K_FINAL)
}

/// A key with its hash, computed once: a record that finds the same key in several maps
/// (a hist update and the variables it references in other triggers' maps) hashes it once.
/// The hash covers the key's length, so it serves every map of that key size.
#[derive(Clone, Copy, Debug)]
pub struct HashedKey<'a> {
    bytes: &'a [u8],
    hash: u64,
}

impl<'a> HashedKey<'a> {
    /// Hashes `bytes`.
    #[inline]
    pub fn new(bytes: &'a [u8]) -> HashedKey<'a> {
        HashedKey {
            bytes,
            hash: hash_key(bytes),
        }
    }

    /// The key's bytes.
    #[inline]
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
}

impl Elt {
    /// The element at `words` (`stride` words starting with a shape word).
    fn from_words(words: &[AtomicU64]) -> &Elt {
        // SAFETY: `Elt` is `repr(transparent)` over `[AtomicU64]`, so the two unsized types
        // have the same layout and pointer metadata (the slice length); the returned reference
        // borrows `words` for the same lifetime.
        unsafe { &*(words as *const [AtomicU64] as *const Elt) }
    }

    #[inline(always)]
    fn shape(&self) -> u64 {
        // Written once before the map is shared; never changes.
        self.words[0].load(Ordering::Relaxed)
    }

    #[inline(always)]
    fn key_size(&self) -> usize {
        self.shape() as u32 as usize
    }

    #[inline(always)]
    fn key_words(&self) -> usize {
        self.key_size().div_ceil(8)
    }

    #[inline(always)]
    fn n_vals(&self) -> usize {
        (self.shape() >> 32) as u16 as usize
    }

    #[inline(always)]
    fn n_vars(&self) -> usize {
        (self.shape() >> 48) as usize
    }

    /// A copy of the key bytes, `key_size` long. Read word by word with atomic loads, so it
    /// is sound whatever runs beside it; an element claimed again after a
    /// [`TracingMap::clear`] while the copy is taken may give a mix of two keys.
    pub fn key(&self) -> Vec<u8> {
        let size = self.key_size();
        let mut out = Vec::with_capacity(self.key_words() * 8);
        for word in &self.words[KEY_AT..KEY_AT + self.key_words()] {
            out.extend_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
        }
        out.truncate(size);
        out
    }

    /// Whether the key is `key`, `key_words` words long (the map passes its own count, so the
    /// hot path does not decode the shape word).
    #[inline(always)]
    fn key_eq(&self, key: &[u8], key_words: usize) -> bool {
        let words = &self.words[KEY_AT..KEY_AT + key_words];
        each_word(key, |i, w| words[i].load(Ordering::Relaxed) == w)
    }

    fn write_key(&self, key: &[u8]) {
        let words = &self.words[KEY_AT..KEY_AT + self.key_words()];
        each_word(key, |i, w| {
            words[i].store(w, Ordering::Relaxed);
            true
        });
    }

    #[inline(always)]
    fn val_slot(&self, val: usize) -> &AtomicU64 {
        assert!(val < self.n_vals(), "value index {val} out of range");
        &self.words[KEY_AT + self.key_words() + val]
    }

    #[inline(always)]
    fn var_pos(&self, var: usize) -> VarAt {
        assert!(var < self.n_vars(), "variable index {var} out of range");
        VarAt(KEY_AT + self.key_words() + self.n_vals() + 2 * var)
    }

    /// A variable's value word and its set flag (one bounds check for both).
    #[inline(always)]
    fn var_words(&self, at: VarAt) -> (&AtomicU64, &AtomicU64) {
        match self.words.get(at.0..at.0 + 2) {
            Some([value, set]) => (value, set),
            _ => panic!("variable position {} out of range", at.0),
        }
    }

    /// [`Elt::add`] at a place resolved by [`TracingMap::val_at`].
    #[inline(always)]
    pub fn add_at(&self, at: ValAt, amount: u64) {
        self.words[at.0].fetch_add(amount, Ordering::Relaxed);
    }

    /// [`Elt::set_var`] at a place resolved by [`TracingMap::var_at`].
    #[inline(always)]
    pub fn set_var_at(&self, at: VarAt, v: u64) {
        let (value, set) = self.var_words(at);
        value.store(v, Ordering::Relaxed);
        // Release: a reader that sees the flag sees the value stored before it. A plain
        // store, not a read-modify-write: the flag word is this variable's alone.
        set.store(1, Ordering::Release);
    }

    /// [`Elt::var`] at a place resolved by [`TracingMap::var_at`].
    #[inline(always)]
    pub fn var_at(&self, at: VarAt) -> Option<u64> {
        let (value, set) = self.var_words(at);
        if set.load(Ordering::Acquire) == 0 {
            return None;
        }
        Some(value.load(Ordering::Relaxed))
    }

    /// [`Elt::take_var`] at a place resolved by [`TracingMap::var_at`].
    #[inline(always)]
    pub fn take_var_at(&self, at: VarAt) -> Option<u64> {
        let (value, set) = self.var_words(at);
        if set.load(Ordering::Relaxed) == 0 {
            // Not set: avoid the read-modify-write (and the cache-line ownership it takes).
            return None;
        }
        if set.swap(0, Ordering::Acquire) == 0 {
            return None;
        }
        Some(value.load(Ordering::Relaxed))
    }

    /// Adds `amount` to sum `val` (relaxed atomic add, wrapping).
    #[inline]
    pub fn add(&self, val: usize, amount: u64) {
        self.val_slot(val).fetch_add(amount, Ordering::Relaxed);
    }

    /// Sets sum `val` to `v` (for values that are not sums).
    #[inline]
    pub fn set_val(&self, val: usize, v: u64) {
        self.val_slot(val).store(v, Ordering::Relaxed);
    }

    /// Raises sum `val` to `v` if `v` is larger, atomically; returns the previous value. For
    /// `onmax()`-style values that several threads may raise at once.
    #[inline]
    pub fn update_max(&self, val: usize, v: u64) -> u64 {
        self.val_slot(val).fetch_max(v, Ordering::Relaxed)
    }

    /// The current value of sum `val`.
    #[inline]
    pub fn val(&self, val: usize) -> u64 {
        self.val_slot(val).load(Ordering::Relaxed)
    }

    /// Sets variable `var` to `v` and marks it set.
    #[inline]
    pub fn set_var(&self, var: usize, v: u64) {
        self.set_var_at(self.var_pos(var), v);
    }

    /// Variable `var`, or `None` when it has never been set (or was taken since).
    #[inline]
    pub fn var(&self, var: usize) -> Option<u64> {
        self.var_at(self.var_pos(var))
    }

    /// Reads variable `var` and unsets it in one atomic step on the set flag: of several threads
    /// taking the same set variable, exactly one gets the value. A `set_var` running at the same
    /// time may have its value returned here and still leave the variable set.
    #[inline]
    pub fn take_var(&self, var: usize) -> Option<u64> {
        self.take_var_at(self.var_pos(var))
    }

    /// Zeroes sums and variables (the key is rewritten by the next claim).
    fn reset(&self) {
        for w in &self.words[KEY_AT + self.key_words()..] {
            w.store(0, Ordering::Relaxed);
        }
    }
}

impl TracingMap {
    /// Allocates the table and the whole element pool.
    pub fn new(cfg: MapConfig) -> Result<TracingMap, MapError> {
        if cfg.max_elts == 0 || !cfg.max_elts.is_power_of_two() {
            return Err(MapError::NotPowerOfTwo(cfg.max_elts));
        }
        if cfg.max_elts > MAX_ELTS {
            return Err(MapError::TooManyElts(cfg.max_elts));
        }
        if cfg.key_size == 0 {
            return Err(MapError::EmptyKey);
        }
        let slots = cfg.max_elts * 2;
        let mut table = Vec::new();
        table
            .try_reserve_exact(slots)
            .map_err(|_| MapError::NoMemory)?;
        table.resize_with(slots, || AtomicU64::new(0));
        if cfg.key_size > u32::MAX as usize
            || cfg.n_vals > u16::MAX as usize
            || cfg.n_vars > u16::MAX as usize
        {
            return Err(MapError::FieldsTooLarge);
        }
        let key_words = cfg.key_size.div_ceil(8);
        let stride = KEY_AT + key_words + cfg.n_vals + 2 * cfg.n_vars;
        let n = stride.checked_mul(cfg.max_elts).ok_or(MapError::NoMemory)?;
        let mut elt_words = Vec::new();
        elt_words
            .try_reserve_exact(n)
            .map_err(|_| MapError::NoMemory)?;
        let shape = shape_word(&cfg);
        elt_words.extend((0..n).map(|i| AtomicU64::new(if i % stride == 0 { shape } else { 0 })));
        Ok(TracingMap {
            table_bits: slots.trailing_zeros(),
            cfg,
            table: table.into_boxed_slice(),
            elt_words: elt_words.into_boxed_slice(),
            stride,
            key_words,
            next_elt: AtomicUsize::new(0),
            drops: AtomicU64::new(0),
            claimers: AtomicUsize::new(0),
            clear_seq: AtomicUsize::new(0),
            clear_lock: Mutex::new(()),
        })
    }

    /// The configuration the map was built with.
    pub fn config(&self) -> &MapConfig {
        &self.cfg
    }

    /// Where sum `val` lives in this map's elements, for [`Elt::add_at`]. Panics when `val`
    /// is out of range, as [`Elt::add`] does.
    pub fn val_at(&self, val: usize) -> ValAt {
        assert!(val < self.cfg.n_vals, "value index {val} out of range");
        ValAt(KEY_AT + self.key_words + val)
    }

    /// Where variable `var` lives in this map's elements, for [`Elt::set_var_at`] and the
    /// other `*_at` accessors. Panics when `var` is out of range, as [`Elt::set_var`] does.
    pub fn var_at(&self, var: usize) -> VarAt {
        assert!(var < self.cfg.n_vars, "variable index {var} out of range");
        VarAt(KEY_AT + self.key_words + self.cfg.n_vals + 2 * var)
    }

    /// Finds `key`'s element or claims a new one for it. `None` when the pool is exhausted (a
    /// drop is counted), when a new key meets a [`clear`](Self::clear) under way, or when `key`
    /// is not `key_size` bytes long (neither counted).
    #[inline]
    pub fn insert(&self, key: &[u8]) -> Option<&Elt> {
        self.insert_hashed(HashedKey::new(key))
    }

    /// Finds `key`'s element; never claims one.
    #[inline]
    pub fn lookup(&self, key: &[u8]) -> Option<&Elt> {
        self.lookup_hashed(HashedKey::new(key))
    }

    /// [`TracingMap::insert`] of a key hashed already.
    #[inline]
    pub fn insert_hashed(&self, key: HashedKey<'_>) -> Option<&Elt> {
        if let Some(elt) = self.at_home(key.bytes, key.hash) {
            return Some(elt);
        }
        self.find::<true>(key.bytes, key.hash)
    }

    /// [`TracingMap::lookup`] of a key hashed already.
    #[inline]
    pub fn lookup_hashed(&self, key: HashedKey<'_>) -> Option<&Elt> {
        if let Some(elt) = self.at_home(key.bytes, key.hash) {
            return Some(elt);
        }
        self.find::<false>(key.bytes, key.hash)
    }

    /// The element of `key` when it is published in its home slot, the first a probe looks
    /// at, where most keys of a table at most half full sit: inline, with none of the
    /// probe loop's setup. `None` sends the caller to the full probe, which looks at the
    /// home slot again (so a slot that changes meanwhile is judged there, as ever).
    #[inline(always)]
    fn at_home(&self, key: &[u8], hash: u64) -> Option<&Elt> {
        let idx = (hash >> (64 - self.table_bits)) as usize;
        let word = self.table.get(idx)?.load(Ordering::Acquire);
        let tag = (hash as u32 | 1) as u64;
        let elt_idx = word & IDX_MASK;
        if word >> TAG_SHIFT != tag || elt_idx == 0 || elt_idx == DEAD {
            return None;
        }
        let i = elt_idx as usize - 1;
        (key.len() == self.cfg.key_size && self.key_matches(i, key)).then(|| self.elt(i))
    }

    /// New keys refused because the pool was exhausted, since creation or the last `clear`.
    pub fn drops(&self) -> u64 {
        self.drops.load(Ordering::Relaxed)
    }

    /// Elements claimed.
    pub fn len(&self) -> usize {
        self.next_elt.load(Ordering::Relaxed).min(self.cfg.max_elts)
    }

    /// Whether no element is claimed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Back to empty: every slot freed, every sum and variable zeroed, drops reset; no memory
    /// is freed or allocated. Pause writers first (see the module documentation for what a
    /// concurrent writer can observe).
    pub fn clear(&self) {
        // Stop new claims and wait out those under way, so that no claim straddles the reset:
        // one would publish an element the reset has handed back to the pool, and the element
        // would end up in two slots under two keys. Claims are short and never wait for a
        // clear, so this wait is short too. SeqCst on both sides (here and in `claim`): either
        // the claim sees the odd `clear_seq` or this loop sees the claim.
        let _serial = self.clear_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.clear_seq.fetch_add(1, Ordering::SeqCst);
        let mut spins = 0u32;
        while self.claimers.load(Ordering::SeqCst) != 0 {
            spins += 1;
            if spins < SPINS_BEFORE_YIELD {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        // Slots first, so that no new lookup reaches an element being zeroed.
        for slot in self.table.iter() {
            slot.store(0, Ordering::Relaxed);
        }
        let used = self.len();
        for i in 0..used {
            self.elt(i).reset();
        }
        self.drops.store(0, Ordering::Relaxed);
        // Release: a claim that takes an element after this sees it zeroed.
        self.next_elt.store(0, Ordering::Release);
        self.clear_seq.fetch_add(1, Ordering::Release);
    }

    /// Calls `f` on every claimed and published element, in table order.
    pub fn for_each(&self, mut f: impl FnMut(&Elt)) {
        for slot in self.table.iter() {
            let word = slot.load(Ordering::Acquire);
            let idx = word & IDX_MASK;
            if idx != 0 && idx != DEAD {
                f(self.elt(idx as usize - 1));
            }
        }
    }

    /// Element `i` of the pool.
    #[inline(always)]
    fn elt(&self, i: usize) -> &Elt {
        Elt::from_words(&self.elt_words[i * self.stride..(i + 1) * self.stride])
    }

    /// Whether element `i` holds `key` (of the map's key size). A one-word key, the
    /// common single numeric key, is one load and one compare, with no element view made.
    #[inline(always)]
    fn key_matches(&self, i: usize, key: &[u8]) -> bool {
        if let Ok(word) = <[u8; 8]>::try_from(key) {
            return self
                .elt_words
                .get(i * self.stride + KEY_AT)
                .is_some_and(|w| w.load(Ordering::Relaxed) == u64::from_ne_bytes(word));
        }
        self.elt(i).key_eq(key, self.key_words)
    }

    #[inline]
    fn find<const CLAIM: bool>(&self, key: &[u8], hash: u64) -> Option<&Elt> {
        if key.len() != self.cfg.key_size {
            debug_assert!(
                false,
                "key of {} bytes in a map of {}-byte keys",
                key.len(),
                self.cfg.key_size
            );
            return None;
        }
        // Never 0: a tag of 0 marks a free slot.
        let tag = (hash as u32 | 1) as u64;
        let mask = self.table.len() - 1;
        'probe: loop {
            // Which clear generation this probe walks; a claim checks it is still current.
            let seq = if CLAIM {
                self.clear_seq.load(Ordering::Acquire)
            } else {
                0
            };
            let mut idx = (hash >> (64 - self.table_bits)) as usize;
            for _ in 0..self.table.len() {
                let slot = &self.table[idx];
                let mut word = slot.load(Ordering::Acquire);
                let mut spins = 0u32;
                loop {
                    if word == 0 {
                        if !CLAIM {
                            return None;
                        }
                        match self.claim(slot, tag, key, seq) {
                            Claim::Done(elt) => return elt,
                            Claim::Taken(now) => {
                                word = now;
                                continue;
                            }
                            Claim::Stale => continue 'probe,
                        }
                    }
                    if word >> TAG_SHIFT != tag {
                        break;
                    }
                    let elt_idx = (word & IDX_MASK) as usize;
                    if elt_idx as u64 == DEAD {
                        break;
                    }
                    if elt_idx == 0 {
                        // Another thread claimed this slot for a key with our tag and is
                        // writing the key: wait for it, or it could be our key and we would
                        // claim it twice.
                        spins += 1;
                        if spins < SPINS_BEFORE_YIELD {
                            std::hint::spin_loop();
                        } else {
                            // The publisher may have been preempted; give it the CPU.
                            std::thread::yield_now();
                        }
                        word = slot.load(Ordering::Acquire);
                        continue;
                    }
                    if self.key_matches(elt_idx - 1, key) {
                        return Some(self.elt(elt_idx - 1));
                    }
                    break;
                }
                idx = (idx + 1) & mask;
            }
            // Every slot taken by other tags: cannot happen with at most `max_elts` claimed of
            // `2 * max_elts` slots, as slots are freed only by a clear.
            if CLAIM {
                self.drops.fetch_add(1, Ordering::Relaxed);
            }
            return None;
        }
    }

    /// Settles a slot this thread took when no element was left for it: a drop. The kernel
    /// gives the slot back; that can hide a key that probed past this slot while it was taken
    /// and settled further on (lookups stop at the first free slot), so it stays taken, dead,
    /// until the next clear.
    fn abandon(&self, slot: &AtomicU64, tag: u64) {
        slot.store((tag << TAG_SHIFT) | DEAD, Ordering::Release);
        self.drops.fetch_add(1, Ordering::Relaxed);
    }

    /// Claims the free `slot` for `key`, found by a probe that started in clear generation
    /// `seq`.
    #[cold]
    fn claim(&self, slot: &AtomicU64, tag: u64, key: &[u8], seq: usize) -> Claim<'_> {
        // Checked before touching the shared `claimers`, so a full map costs one shared load.
        if self.next_elt.load(Ordering::Relaxed) >= self.cfg.max_elts {
            self.drops.fetch_add(1, Ordering::Relaxed);
            return Claim::Done(None);
        }
        self.claimers.fetch_add(1, Ordering::SeqCst);
        let _guard = ClaimGuard(&self.claimers);
        let now = self.clear_seq.load(Ordering::SeqCst);
        if now & 1 == 1 {
            // A clear is under way: the event is lost, as one arriving just before it would be
            // wiped; not a drop (the clear resets those).
            return Claim::Done(None);
        }
        if now != seq {
            // A clear ran since the probe started: the slots it walked past may be free now,
            // so claiming here could hide the key from lookups or claim it twice. Probe again.
            return Claim::Stale;
        }
        if let Err(now) =
            slot.compare_exchange(0, tag << TAG_SHIFT, Ordering::Acquire, Ordering::Acquire)
        {
            return Claim::Taken(now);
        }
        // Acquire pairs with clear's release, so the element is seen zeroed.
        let n = self.next_elt.fetch_add(1, Ordering::Acquire);
        if n >= self.cfg.max_elts {
            self.abandon(slot, tag);
            return Claim::Done(None);
        }
        let elt = self.elt(n);
        elt.write_key(key);
        // Release: whoever sees the index sees the key written above.
        slot.store((tag << TAG_SHIFT) | (n as u64 + 1), Ordering::Release);
        Claim::Done(Some(elt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(max_elts: usize, key_size: usize, n_vals: usize, n_vars: usize) -> TracingMap {
        TracingMap::new(MapConfig {
            max_elts,
            key_size,
            n_vals,
            n_vars,
        })
        .unwrap()
    }

    /// Two claims race for the last element: A takes slot S first, B (another key whose run
    /// passes S) settles in the next slot and gets the element, A finds none left. B's key
    /// must stay reachable after A settles S.
    #[test]
    fn a_claim_that_finds_the_pool_empty_leaves_no_hole_in_a_probe_run() {
        let m = map(1, 8, 1, 0);
        let b = 42u64.to_ne_bytes();
        let hash = hash_key(&b);
        let home = (hash >> (64 - m.table_bits)) as usize;
        let tag_b = (hash as u32 | 1) as u64;
        let tag_a = if tag_b == 3 { 5 } else { 3 };
        // A has taken B's home slot and is about to ask for an element.
        m.table[home].store(tag_a << TAG_SHIFT, Ordering::Release);
        let elt = m.insert(&b).expect("B gets the last element") as *const Elt;
        assert_eq!(m.len(), 1);
        // A finds the pool empty.
        m.abandon(&m.table[home], tag_a);
        let found = m.lookup(&b).expect("B is still found") as *const Elt;
        assert!(std::ptr::eq(found, elt));
        assert!(m.insert(&7u64.to_ne_bytes()).is_none());
        assert_eq!(m.drops(), 2);
        let mut seen = 0;
        m.for_each(|_| seen += 1);
        assert_eq!(seen, 1);
        m.clear();
        assert!(m.insert(&7u64.to_ne_bytes()).is_some());
    }

    #[test]
    fn tail_words_pad_with_zeros() {
        let bytes = [1u8, 2, 3, 4, 5, 6, 7];
        for n in 1..=7 {
            let mut want = [0u8; 8];
            want[..n].copy_from_slice(&bytes[..n]);
            assert_eq!(
                tail_word(&bytes[..n]),
                u64::from_ne_bytes(want),
                "{n} bytes"
            );
        }
    }

    #[test]
    fn map_and_elements_cross_threads() {
        fn send_sync<T: Send + Sync + ?Sized>() {}
        send_sync::<TracingMap>();
        send_sync::<Elt>();
    }

    #[test]
    fn rejects_bad_configs() {
        let cfg = |max_elts, key_size| MapConfig {
            max_elts,
            key_size,
            n_vals: 1,
            n_vars: 0,
        };
        assert_eq!(
            TracingMap::new(cfg(0, 8)).unwrap_err(),
            MapError::NotPowerOfTwo(0)
        );
        assert_eq!(
            TracingMap::new(cfg(3, 8)).unwrap_err(),
            MapError::NotPowerOfTwo(3)
        );
        assert_eq!(
            TracingMap::new(cfg(MAX_ELTS * 2, 8)).unwrap_err(),
            MapError::TooManyElts(MAX_ELTS * 2)
        );
        assert_eq!(TracingMap::new(cfg(4, 0)).unwrap_err(), MapError::EmptyKey);
        let wide = MapConfig {
            n_vars: 1 << 16,
            ..cfg(4, 8)
        };
        assert_eq!(TracingMap::new(wide).unwrap_err(), MapError::FieldsTooLarge);
        assert!(TracingMap::new(cfg(1, 1)).is_ok());
    }

    #[test]
    fn insert_then_lookup_same_element() {
        let m = map(16, 8, 2, 0);
        assert!(m.lookup(&7u64.to_ne_bytes()).is_none());
        assert!(m.is_empty());
        let e = m.insert(&7u64.to_ne_bytes()).unwrap();
        e.add(0, 1);
        e.add(1, 40);
        let again = m.insert(&7u64.to_ne_bytes()).unwrap();
        assert!(std::ptr::eq(e, again));
        again.add(1, 2);
        let l = m.lookup(&7u64.to_ne_bytes()).unwrap();
        assert_eq!((l.val(0), l.val(1)), (1, 42));
        assert_eq!(l.key(), &7u64.to_ne_bytes());
        assert_eq!(m.len(), 1);
        assert_eq!(m.drops(), 0);
    }

    /// A key hashed once finds the same element in every map of its key size as the plain
    /// calls do.
    #[test]
    fn a_hashed_key_finds_what_the_plain_calls_find() {
        let (a, b) = (map(16, 13, 1, 0), map(16, 13, 1, 0));
        let bytes = [3u8; 13];
        let key = HashedKey::new(&bytes);
        assert_eq!(key.bytes(), &bytes);
        assert!(a.lookup_hashed(key).is_none());
        let e = a.insert_hashed(key).unwrap();
        e.add(0, 4);
        assert!(std::ptr::eq(e, a.insert(&bytes).unwrap()));
        assert!(std::ptr::eq(e, a.lookup_hashed(key).unwrap()));
        assert!(b.lookup_hashed(key).is_none());
        b.insert(&bytes).unwrap().add(0, 9);
        assert_eq!(b.lookup_hashed(key).unwrap().val(0), 9);
        assert_eq!((a.len(), b.len()), (1, 1));
    }

    #[test]
    fn odd_key_sizes_compare_every_byte() {
        // 13 bytes: one full word and a padded tail; keys differing only in the last byte.
        let m = map(8, 13, 1, 0);
        let mut a = [1u8; 13];
        let b = {
            let mut b = a;
            b[12] = 2;
            b
        };
        m.insert(&a).unwrap().add(0, 1);
        m.insert(&b).unwrap().add(0, 5);
        assert_eq!(m.lookup(&a).unwrap().val(0), 1);
        assert_eq!(m.lookup(&b).unwrap().val(0), 5);
        assert_eq!(m.lookup(&b).unwrap().key(), &b);
        a[0] = 9;
        assert!(m.lookup(&a).is_none());
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn full_pool_drops_new_keys_keeps_old() {
        let m = map(4, 4, 1, 0);
        for k in 0u32..4 {
            m.insert(&k.to_ne_bytes()).unwrap().add(0, 1);
        }
        assert!(m.insert(&100u32.to_ne_bytes()).is_none());
        assert!(m.insert(&101u32.to_ne_bytes()).is_none());
        assert_eq!(m.drops(), 2);
        // Old keys still found and updated; lookups of missing keys are not drops.
        m.insert(&2u32.to_ne_bytes()).unwrap().add(0, 1);
        assert!(m.lookup(&100u32.to_ne_bytes()).is_none());
        assert_eq!(m.lookup(&2u32.to_ne_bytes()).unwrap().val(0), 2);
        assert_eq!(m.drops(), 2);
        assert_eq!(m.len(), 4);
    }

    #[test]
    fn wrong_key_length_is_refused() {
        let m = map(4, 8, 1, 0);
        // debug_assert fires in debug builds; the release behaviour is `None`.
        let r = std::panic::catch_unwind(|| m.insert(&[1, 2, 3]).is_none());
        assert!(r.is_err() || r.unwrap());
        assert_eq!(m.len(), 0);
    }

    #[test]
    fn clear_empties_and_keeps_working() {
        let m = map(4, 8, 1, 1);
        for k in 0u64..6 {
            if let Some(e) = m.insert(&k.to_ne_bytes()) {
                e.add(0, k + 1);
                e.set_var(0, k);
            }
        }
        assert_eq!((m.len(), m.drops()), (4, 2));
        m.clear();
        assert_eq!((m.len(), m.drops()), (0, 0));
        let mut seen = 0;
        m.for_each(|_| seen += 1);
        assert_eq!(seen, 0);
        assert!(m.lookup(&1u64.to_ne_bytes()).is_none());
        let e = m.insert(&9u64.to_ne_bytes()).unwrap();
        assert_eq!(e.val(0), 0, "reused element starts at zero");
        assert_eq!(e.var(0), None, "reused element's variable is unset");
        assert_eq!(e.key(), &9u64.to_ne_bytes());
    }

    #[test]
    fn for_each_visits_every_claimed_element_once() {
        let m = map(64, 8, 1, 0);
        for k in 0u64..50 {
            m.insert(&k.to_ne_bytes()).unwrap().add(0, k);
        }
        let mut got: Vec<(u64, u64)> = Vec::new();
        m.for_each(|e| got.push((u64::from_ne_bytes(e.key().try_into().unwrap()), e.val(0))));
        got.sort();
        let want: Vec<(u64, u64)> = (0..50).map(|k| (k, k)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn vars_set_take_and_unset() {
        let m = map(2, 1, 0, 70);
        let e = m.insert(&[1]).unwrap();
        assert_eq!(e.var(0), None);
        assert_eq!(e.take_var(69), None);
        e.set_var(69, 0);
        assert_eq!(e.var(69), Some(0), "a set zero is not unset");
        assert_eq!(e.var(5), None, "other variables untouched");
        assert_eq!(e.take_var(69), Some(0));
        assert_eq!(e.take_var(69), None, "taking consumes");
        assert_eq!(e.var(69), None);
        e.set_var(3, 11);
        e.set_var(3, 12);
        assert_eq!(e.var(3), Some(12));
        assert_eq!(e.var(3), Some(12), "reading does not consume");
    }

    #[test]
    fn resolved_places_reach_the_same_sums_and_variables() {
        let m = map(4, 12, 3, 5);
        let e = m.insert(&[7; 12]).unwrap();
        e.add_at(m.val_at(2), 5);
        e.add(2, 1);
        assert_eq!(e.val(2), 6);
        assert_eq!((e.val(0), e.val(1)), (0, 0));
        e.set_var_at(m.var_at(4), 9);
        assert_eq!(e.var(4), Some(9));
        assert_eq!(e.var_at(m.var_at(3)), None, "its neighbour untouched");
        e.set_var(3, 0);
        assert_eq!(e.var_at(m.var_at(3)), Some(0), "a set zero is set");
        assert_eq!(e.take_var_at(m.var_at(4)), Some(9));
        assert_eq!(e.var(4), None, "taken through its place, gone by index too");
        assert_eq!(e.take_var_at(m.var_at(4)), None);
        assert_eq!(e.var(3), Some(0));
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn var_place_out_of_range_panics() {
        map(2, 8, 1, 2).var_at(2);
    }

    #[test]
    fn set_val_and_update_max() {
        let m = map(2, 1, 2, 0);
        let e = m.insert(&[0]).unwrap();
        e.set_val(1, 10);
        assert_eq!(e.update_max(1, 5), 10);
        assert_eq!(e.val(1), 10);
        assert_eq!(e.update_max(1, 15), 10);
        assert_eq!(e.val(1), 15);
        e.set_val(1, 3);
        assert_eq!(e.val(1), 3);
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn val_index_out_of_range_panics() {
        let m = map(2, 1, 1, 0);
        m.insert(&[0]).unwrap().add(1, 1);
    }

    #[test]
    fn colliding_slots_probe_on() {
        // A tiny table: 2 elements, 4 slots; any two keys often share a start slot.
        for round in 0u64..200 {
            let m = map(2, 8, 1, 0);
            let (a, b) = (round * 2, round * 2 + 1);
            m.insert(&a.to_ne_bytes()).unwrap().add(0, 1);
            m.insert(&b.to_ne_bytes()).unwrap().add(0, 2);
            assert_eq!(m.lookup(&a.to_ne_bytes()).unwrap().val(0), 1);
            assert_eq!(m.lookup(&b.to_ne_bytes()).unwrap().val(0), 2);
            assert!(m.insert(&(round + 1000).to_ne_bytes()).is_none());
        }
    }

    /// The longest run of occupied slots (wrapping) once `keys` are inserted into a map of
    /// exactly `keys.len()` elements, i.e. at the table's full load of one half.
    fn longest_run(keys: &[Vec<u8>]) -> usize {
        let m = map(keys.len(), keys[0].len(), 1, 0);
        for k in keys {
            m.insert(k).unwrap();
        }
        assert_eq!(m.len(), keys.len());
        let used: Vec<bool> = m
            .table
            .iter()
            .map(|s| s.load(Ordering::Relaxed) != 0)
            .collect();
        let mut longest = 0;
        let mut run = 0;
        for u in used.iter().chain(used.iter()) {
            run = if *u { run + 1 } else { 0 };
            longest = longest.max(run);
        }
        longest
    }

    #[test]
    fn hash_spreads_typical_hist_keys() {
        // Common hist keys have little entropy in few bits: sequential pids, page- and
        // cache-line-aligned addresses, compound keys differing in one field, short strings.
        // None may pile into a few slots. At half load, linear probing's longest run is
        // typically 15-25 slots for 2048 slots with a good hash; a poor one gives hundreds.
        let n = 1024u64;
        let patterns: [(&str, Vec<Vec<u8>>); 5] = [
            (
                "pids",
                (0..n).map(|k| (k as u32).to_ne_bytes().to_vec()).collect(),
            ),
            (
                "pages",
                (0..n).map(|k| (k << 12).to_ne_bytes().to_vec()).collect(),
            ),
            (
                "pointers",
                (0..n)
                    .map(|k| (0x7fff_0000_0000 + k * 64).to_ne_bytes().to_vec())
                    .collect(),
            ),
            (
                "compound",
                (0..n)
                    .map(|k| {
                        let mut v = 4242u64.to_ne_bytes().to_vec();
                        v.extend_from_slice(&(k * 8).to_ne_bytes());
                        v.extend_from_slice(&7u64.to_ne_bytes());
                        v
                    })
                    .collect(),
            ),
            (
                "strings",
                (0..n)
                    .map(|k| {
                        let mut v = format!("worker-{k}").into_bytes();
                        v.resize(16, 0);
                        v
                    })
                    .collect(),
            ),
        ];
        for (name, keys) in &patterns {
            let longest = longest_run(keys);
            assert!(longest < 48, "{name}: longest occupied run {longest}");
        }
    }
}
