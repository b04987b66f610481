//! Tracepoints: typed hooks compiled into code, nearly free while nothing listens.
//!
//! A tracepoint is declared once with a prototype ([`declare_tracepoint!`](crate::declare_tracepoint)),
//! called from any number of places (`my_tp::trace(a, b)`), and has any number of *probes*
//! attached at run time. While no probe is attached a call site is a 5-byte NOP (x86-64:
//! a static key, patched into a jump when the first probe attaches and back when the last
//! leaves; one load of the key's flag on other architectures); the argument evaluation and
//! the call itself are behind it. `trace_checked` tests the flag with one relaxed load.
//!
//! ```text
//!  call site ─ enabled? ──no──> (nothing)
//!                 │yes
//!                 ▼
//!        rcu::read_lock ── load probe array ── probe₁(args) ─ probe₂(args) ─ … ── unlock
//! ```
//!
//! Probes are closures (`Arc<dyn Fn(args) + Send + Sync>`), kept in priority order (higher
//! first, as the kernel's `tracepoint_probe_register_prio`) in an immutable array that is
//! replaced — never edited — on registration changes and read inside an RCU section
//! ([`crate::rcu`]). The compiler checks a probe's signature against the prototype.
//!
//! Removal follows the kernel's contract: `unregister` unpublishes the probe at once; a call
//! that had already loaded the old array may still run it until
//! [`synchronize_unregister`] returns, after which no removed probe runs again.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::rcu;
pub use ustrace_fprobe::static_key::StaticKey;

/// Identifies one registration of a probe on one tracepoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProbeId(u64);

/// Why a registration change was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// The same function with the same data is already registered (the kernel's `EEXIST`).
    #[error("probe already registered on tracepoint {0}")]
    Exists(&'static str),
    /// No such probe on this tracepoint (the kernel's `ENOENT`).
    #[error("probe not registered on tracepoint {0}")]
    NotFound(&'static str),
}

struct Entry<P: ?Sized> {
    id: ProbeId,
    prio: i32,
    probe: Arc<P>,
    /// `(function address, data address)` for probes registered kernel-style with private
    /// data, so the same pair can be found again for unregistration.
    identity: Option<(usize, usize)>,
}

struct Registrations<P: ?Sized> {
    entries: Vec<Entry<P>>,
    /// Arrays unpublished but perhaps still being read; freed after the next grace period.
    retired: Vec<*mut ProbeArray<P>>,
}

/// What a call site walks: the probes in call order. `calls` holds each probe's closure
/// as a plain pointer, so a call loads the closure and its vtable and jumps, without first
/// working out where an `Arc` keeps its value; `_owners` keeps the closures alive for as
/// long as the array may be read.
struct ProbeArray<P: ?Sized> {
    calls: Vec<*const P>,
    _owners: Vec<Arc<P>>,
}

/// A probe that sees a tracepoint's arguments as raw words (dynamic `t:` events).
pub type RawProbe = Arc<dyn Fn(&[u64]) + Send + Sync>;

/// What every tracepoint tells about itself, whatever its prototype.
pub struct TracepointInfo {
    /// The tracepoint's name (the event name for `trace_event!` tracepoints).
    pub name: &'static str,
    /// The prototype as written, e.g. `["key: &str", "hit: bool"]`.
    pub args: &'static [&'static str],
    /// Attaches a [`RawProbe`]; set for tracepoints declared with the macros.
    pub register_raw: Option<fn(i32, RawProbe) -> ProbeId>,
}

/// How a tracepoint argument appears to a raw probe: integers as themselves, `bool` as 0 or
/// 1, pointers and references as addresses, `&str` and slices as two words (address, then
/// length: a `&str` is not NUL-terminated, so `:string` fetches must bound it). Any other
/// type is passed by address (see [`RawViaAddress`]).
pub trait RawArg {
    /// Writes the words into `out`; returns how many (0 when `out` is too short).
    fn raw(&self, out: &mut [u64]) -> usize;
}

macro_rules! raw_int {
    ($($t:ty),*) => {$(
        impl RawArg for $t {
            #[inline(always)]
            fn raw(&self, out: &mut [u64]) -> usize {
                match out.first_mut() {
                    Some(slot) => {
                        *slot = *self as u64;
                        1
                    }
                    None => 0,
                }
            }
        }
    )*};
}
raw_int!(u8, u16, u32, u64, usize, i8, i16, i32, i64, isize, bool, char);

impl RawArg for &str {
    #[inline(always)]
    fn raw(&self, out: &mut [u64]) -> usize {
        if out.len() < 2 {
            return 0;
        }
        out[0] = self.as_ptr() as u64;
        out[1] = self.len() as u64;
        2
    }
}

impl<T> RawArg for &[T] {
    #[inline(always)]
    fn raw(&self, out: &mut [u64]) -> usize {
        if out.len() < 2 {
            return 0;
        }
        out[0] = self.as_ptr() as u64;
        out[1] = self.len() as u64;
        2
    }
}

/// A reference is its address, so `+OFFS($argN)` fetches read the referenced value.
impl<T> RawArg for &T {
    #[inline(always)]
    fn raw(&self, out: &mut [u64]) -> usize {
        (*self as *const T as usize).raw(out)
    }
}

impl<T> RawArg for *const T {
    #[inline(always)]
    fn raw(&self, out: &mut [u64]) -> usize {
        (*self as usize).raw(out)
    }
}

impl<T> RawArg for *mut T {
    #[inline(always)]
    fn raw(&self, out: &mut [u64]) -> usize {
        (*self as usize).raw(out)
    }
}

/// Wraps an argument for raw conversion; see [`RawViaTrait`] and [`RawViaAddress`].
#[doc(hidden)]
pub struct RawWrap<'a, T: ?Sized>(pub &'a T);

/// Chosen when the argument's type is a [`RawArg`].
#[doc(hidden)]
pub trait RawViaTrait {
    fn raw_into(&self, out: &mut [u64]) -> usize;
}

impl<T: RawArg + ?Sized> RawViaTrait for RawWrap<'_, T> {
    #[inline(always)]
    fn raw_into(&self, out: &mut [u64]) -> usize {
        self.0.raw(out)
    }
}

/// Chosen (by auto-ref, one step later in method lookup) for every other type: the
/// argument's address, so fetch arguments can dereference into it.
#[doc(hidden)]
pub trait RawViaAddress {
    fn raw_into(&self, out: &mut [u64]) -> usize;
}

impl<T: ?Sized> RawViaAddress for &RawWrap<'_, T> {
    #[inline(always)]
    fn raw_into(&self, out: &mut [u64]) -> usize {
        (self.0 as *const T as *const () as usize).raw(out)
    }
}

/// A tracepoint whose probes have the type `P` (`dyn Fn(args…) + Send + Sync`).
pub struct Tracepoint<P: ?Sized + 'static> {
    info: TracepointInfo,
    /// The patched branch at call sites, when the tracepoint has one.
    key: Option<&'static StaticKey>,
    /// The same state as a flag, for call sites that test it with a load.
    enabled: AtomicBool,
    probes: AtomicPtr<ProbeArray<P>>,
    next_id: AtomicU64,
    registrations: Mutex<Registrations<P>>,
}

// SAFETY: the raw pointers in `retired` and `probes` own `ProbeArray<P>` values that are only
// freed under the registration lock after a grace period; `P` is `Send + Sync` by the bound
// on every method that creates them.
unsafe impl<P: ?Sized + Send + Sync> Sync for Tracepoint<P> {}
// SAFETY: as above.
unsafe impl<P: ?Sized + Send + Sync> Send for Tracepoint<P> {}

impl<P: ?Sized + Send + Sync + 'static> Tracepoint<P> {
    /// A tracepoint with no probes, tested at call sites by a load of its flag.
    pub const fn new(name: &'static str, args: &'static [&'static str]) -> Self {
        Self::with_key(name, args, None, None)
    }

    /// A tracepoint whose call sites test `key`, a patched jump (what
    /// [`declare_tracepoint!`](crate::declare_tracepoint) makes).
    pub const fn with_key(
        name: &'static str,
        args: &'static [&'static str],
        key: Option<&'static StaticKey>,
        register_raw: Option<fn(i32, RawProbe) -> ProbeId>,
    ) -> Self {
        Tracepoint {
            info: TracepointInfo {
                name,
                args,
                register_raw,
            },
            key,
            enabled: AtomicBool::new(false),
            probes: AtomicPtr::new(std::ptr::null_mut()),
            next_id: AtomicU64::new(1),
            registrations: Mutex::new(Registrations {
                entries: Vec::new(),
                retired: Vec::new(),
            }),
        }
    }

    /// The tracepoint's name.
    pub fn name(&self) -> &'static str {
        self.info.name
    }

    /// Its name, prototype and raw registration.
    pub fn info(&self) -> &TracepointInfo {
        &self.info
    }

    /// Whether any probe is attached (one relaxed load): what `trace_checked` tests.
    #[inline(always)]
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Calls every attached probe through `call`, inside one read-side section.
    #[inline]
    pub fn for_each_probe(&self, mut call: impl FnMut(&P)) {
        let _section = rcu::read_lock();
        let array = self.probes.load(Ordering::Acquire);
        if array.is_null() {
            return;
        }
        // SAFETY: a published array is freed only after a grace period that cannot end while
        // this section is open.
        let probes = unsafe { &*array };
        match probes.calls[..] {
            // One probe, the common case: a call with the arguments still in their registers,
            // and no loop state to keep in saved registers around it.
            // SAFETY: `_owners` in the same array keeps every closure alive.
            [only] => call(unsafe { &*only }),
            _ => call_each(&probes.calls, call),
        }
    }

    /// As [`Tracepoint::for_each_probe`], for the tracepoint macro: `one` calls the only
    /// probe, `many` every probe of a longer list. Two closures, so that each can capture the
    /// arguments by value: the one-probe call keeps them in registers, where a single closure
    /// shared with the loop would need them stored in memory on every call.
    ///
    /// (A thread's first call, which registers the thread for read-side sections, stays in
    /// this frame: a path of its own would add a frame to that one call's stack, and stack
    /// keys skip a fixed count of record-path frames measured once.)
    #[doc(hidden)]
    #[inline(always)]
    pub fn call_probes(&self, one: impl FnOnce(&P), many: impl FnOnce(ProbeList<'_, P>)) {
        let _section = rcu::read_lock();
        let array = self.probes.load(Ordering::Acquire);
        if array.is_null() {
            return;
        }
        // SAFETY: as in `for_each_probe`.
        let probes = unsafe { &*array };
        match probes.calls[..] {
            // SAFETY: `_owners` in the same array keeps every closure alive.
            [only] => one(unsafe { &*only }),
            ref calls => many(ProbeList {
                calls,
                _section: std::marker::PhantomData,
            }),
        }
    }

    /// Attaches `probe`; higher `prio` runs first, equal priorities in registration order.
    /// The probe may be running on other threads before this returns.
    pub fn register(&self, probe: Arc<P>, prio: i32) -> ProbeId {
        self.insert(probe, prio, None)
            .expect("probes without identity never collide")
    }

    /// Attaches a kernel-style probe: a function plus private data, unregistered again by the
    /// same pair ([`Tracepoint::unregister_identity`]).
    pub fn register_identity(
        &self,
        probe: Arc<P>,
        prio: i32,
        identity: (usize, usize),
    ) -> Result<ProbeId, ProbeError> {
        self.insert(probe, prio, Some(identity))
    }

    fn insert(
        &self,
        probe: Arc<P>,
        prio: i32,
        identity: Option<(usize, usize)>,
    ) -> Result<ProbeId, ProbeError> {
        let mut regs = self.lock();
        if identity.is_some() && regs.entries.iter().any(|e| e.identity == identity) {
            return Err(ProbeError::Exists(self.info.name));
        }
        let id = ProbeId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let at = regs
            .entries
            .iter()
            .position(|e| e.prio < prio)
            .unwrap_or(regs.entries.len());
        regs.entries.insert(
            at,
            Entry {
                id,
                prio,
                probe,
                identity,
            },
        );
        self.publish(&mut regs);
        Ok(id)
    }

    /// Detaches a probe. It may still be running on another thread until
    /// [`synchronize_unregister`] returns.
    pub fn unregister(&self, id: ProbeId) -> Result<(), ProbeError> {
        let mut regs = self.lock();
        let at = regs
            .entries
            .iter()
            .position(|e| e.id == id)
            .ok_or(ProbeError::NotFound(self.info.name))?;
        regs.entries.remove(at);
        self.publish(&mut regs);
        Ok(())
    }

    /// Detaches the probe registered with this `(function, data)` pair.
    pub fn unregister_identity(&self, identity: (usize, usize)) -> Result<(), ProbeError> {
        let id = self
            .lock()
            .entries
            .iter()
            .find(|e| e.identity == Some(identity))
            .map(|e| e.id)
            .ok_or(ProbeError::NotFound(self.info.name))?;
        self.unregister(id)
    }

    /// How many probes are attached.
    pub fn probe_count(&self) -> usize {
        self.lock().entries.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registrations<P>> {
        self.registrations.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes a fresh array built from `regs.entries` and retires the old one.
    fn publish(&self, regs: &mut Registrations<P>) {
        let fresh: *mut ProbeArray<P> = if regs.entries.is_empty() {
            std::ptr::null_mut()
        } else {
            let owners: Vec<Arc<P>> = regs.entries.iter().map(|e| e.probe.clone()).collect();
            Box::into_raw(Box::new(ProbeArray {
                calls: owners.iter().map(Arc::as_ptr).collect(),
                _owners: owners,
            }))
        };
        let old = self.probes.swap(fresh, Ordering::AcqRel);
        let on = !fresh.is_null();
        self.enabled.store(on, Ordering::Relaxed);
        if let Some(key) = self.key {
            if key.is_enabled() != on {
                if on {
                    key.enable();
                } else {
                    key.disable();
                }
            }
        }
        if !old.is_null() {
            regs.retired.push(old);
        }
        // Free what earlier changes retired once no reader can hold it. Registration is a
        // cold path; waiting here keeps retired arrays from piling up. Skipped when called
        // from inside a probe, where waiting would wait for ourselves.
        if regs.retired.len() > 1 && !rcu::in_read_section() {
            rcu::synchronize();
            let keep = regs.retired.pop();
            for array in regs.retired.drain(..) {
                // SAFETY: unpublished before the grace period that just ended.
                drop(unsafe { Box::from_raw(array) });
            }
            regs.retired.extend(keep);
        }
    }

    /// Frees retired arrays after a grace period; part of [`synchronize_unregister`].
    fn reap(&self) {
        let mut regs = self.lock();
        for array in regs.retired.drain(..) {
            // SAFETY: the caller waited for a grace period after these were unpublished.
            drop(unsafe { Box::from_raw(array) });
        }
    }
}

impl<P: ?Sized + 'static> fmt::Debug for Tracepoint<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracepoint")
            .field("name", &self.info.name)
            .field("enabled", &self.enabled.load(Ordering::Relaxed))
            .finish()
    }
}

/// Calls every probe of an array of several, out of line so that the one-probe call in
/// [`Tracepoint::for_each_probe`] keeps no loop state across its call.
#[inline(never)]
fn call_each<P: ?Sized>(calls: &[*const P], mut call: impl FnMut(&P)) {
    for &probe in calls {
        // SAFETY: the caller holds a read-side section, and `_owners` in the array `calls`
        // belongs to keeps every closure alive.
        call(unsafe { &*probe });
    }
}

/// The probes [`Tracepoint::call_probes`] found, valid inside its read-side section only
/// (the borrow keeps them there).
#[doc(hidden)]
pub struct ProbeList<'a, P: ?Sized> {
    calls: &'a [*const P],
    /// Not `Send`: the section belongs to the calling thread.
    _section: std::marker::PhantomData<*const ()>,
}

impl<P: ?Sized> ProbeList<'_, P> {
    /// Calls `call` with every probe, in priority order.
    pub fn for_each(self, call: impl FnMut(&P)) {
        call_each(self.calls, call);
    }
}

/// Reclaims what a tracepoint retired, for [`synchronize_unregister`].
pub trait Reap: Sync {
    /// Frees probe arrays that no reader can still see.
    fn reap_retired(&self);
}

impl<P: ?Sized + Send + Sync + 'static> Reap for Tracepoint<P> {
    fn reap_retired(&self) {
        self.reap()
    }
}

/// Every tracepoint declared in the program, collected at link time.
#[linkme::distributed_slice]
pub static TRACEPOINTS: [&'static dyn TracepointEntry];

/// Type-erased view of a declared tracepoint.
pub trait TracepointEntry: Reap {
    /// Its name, prototype and raw registration.
    fn info(&self) -> &TracepointInfo;
    /// How many probes are attached now.
    fn probe_count(&self) -> usize;
    /// Detaches a probe whatever its type (raw probes included).
    fn unregister_id(&self, id: ProbeId) -> Result<(), ProbeError>;
}

impl<P: ?Sized + Send + Sync + 'static> TracepointEntry for Tracepoint<P> {
    fn info(&self) -> &TracepointInfo {
        &self.info
    }
    fn probe_count(&self) -> usize {
        Tracepoint::probe_count(self)
    }
    fn unregister_id(&self, id: ProbeId) -> Result<(), ProbeError> {
        self.unregister(id)
    }
}

/// Finds a declared tracepoint by name.
pub fn find(name: &str) -> Option<&'static dyn TracepointEntry> {
    TRACEPOINTS
        .iter()
        .copied()
        .find(|tp| tp.info().name == name)
}

/// Waits until no probe unregistered before this call is running or can run again, then
/// frees what unregistration left behind. The kernel's `tracepoint_synchronize_unregister`.
pub fn synchronize_unregister() {
    rcu::synchronize();
    for tp in TRACEPOINTS.iter() {
        tp.reap_retired();
    }
}

/// Declares a tracepoint: a module with the tracepoint, its call and its registration.
///
/// Argument types must be `Copy` (every probe receives them): integers, references,
/// pointers, small `Copy` structs.
///
/// ```
/// ustrace::declare_tracepoint! {
///     /// A request was parsed.
///     pub fn request_parsed(method: &str, len: u64);
/// }
///
/// // At the traced site (a 5-byte NOP while no probe is attached):
/// request_parsed::trace("GET", 42);
///
/// // A probe, checked against the prototype by the compiler:
/// let id = request_parsed::register(0, |method: &str, len: u64| {
///     assert!(!method.is_empty() || len == 0);
/// });
/// request_parsed::trace("GET", 42);
/// request_parsed::TRACEPOINT.unregister(id).unwrap();
/// ustrace::tracepoint::synchronize_unregister();
/// ```
#[macro_export]
macro_rules! declare_tracepoint {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?);) => {
        $(#[$meta])*
        #[allow(non_snake_case, dead_code)]
        $vis mod $name {
            #[allow(unused_imports)]
            use super::*;
            $crate::__tracepoint_items!($name($($arg: $ty),*));
        }
    };
}

/// The items of a tracepoint module, shared by `declare_tracepoint!` and `trace_event!`.
#[doc(hidden)]
#[macro_export]
macro_rules! __tracepoint_items {
    ($name:ident($($arg:ident : $ty:ty),*)) => {
        /// The probe type: a closure taking the tracepoint's arguments.
        pub type Probe = dyn Fn($($ty),*) + Send + Sync;

        /// The patched branch at every call site.
        pub static KEY: $crate::tracepoint::StaticKey = $crate::tracepoint::StaticKey::new();

        /// The tracepoint itself.
        pub static TRACEPOINT: $crate::tracepoint::Tracepoint<Probe> =
            $crate::tracepoint::Tracepoint::with_key(
                stringify!($name),
                &[$(concat!(stringify!($arg), ": ", stringify!($ty))),*],
                Some(&KEY),
                Some(register_raw),
            );

        #[$crate::__private::linkme::distributed_slice($crate::tracepoint::TRACEPOINTS)]
        #[linkme(crate = $crate::__private::linkme)]
        static __TRACEPOINT_ENTRY: &'static dyn $crate::tracepoint::TracepointEntry = &TRACEPOINT;

        /// Whether a probe is attached; guard work done only for the tracepoint. Costs one
        /// patched 5-byte NOP while off.
        #[inline(always)]
        pub fn enabled() -> bool {
            $crate::__private::static_branch_unlikely!(KEY)
        }

        /// Fires the tracepoint: a patched NOP while no probe is attached.
        #[inline(always)]
        pub fn trace($($arg: $ty),*) {
            if $crate::__private::static_branch_unlikely!(KEY) {
                __call_probes($($arg),*);
            }
        }

        /// Fires the tracepoint, testing a flag with one relaxed load instead of the
        /// patched branch (for code that must not be patched, and to compare the two).
        #[inline(always)]
        pub fn trace_checked($($arg: $ty),*) {
            if TRACEPOINT.enabled() {
                __call_probes($($arg),*);
            }
        }

        #[inline(never)]
        #[cold]
        fn __call_probes($($arg: $ty),*) {
            // `move`: each closure holds the arguments, not their addresses, so they need no
            // home in memory on the one-probe path; several probes take a call of their own.
            TRACEPOINT.call_probes(
                move |probe| probe($($arg),*),
                move |probes| __call_each(probes, $($arg),*),
            );
        }

        #[inline(never)]
        #[cold]
        #[allow(clippy::too_many_arguments)]
        fn __call_each(
            probes: $crate::tracepoint::ProbeList<'_, Probe>,
            $($arg: $ty),*
        ) {
            probes.for_each(move |probe| probe($($arg),*));
        }

        /// Attaches a probe closure; higher `prio` runs first.
        pub fn register<F>(prio: i32, probe: F) -> $crate::tracepoint::ProbeId
        where
            F: Fn($($ty),*) + Send + Sync + 'static,
        {
            TRACEPOINT.register(::std::sync::Arc::new(probe), prio)
        }

        /// Attaches `probe` with private `data`, as the kernel's
        /// `register_trace_NAME(probe, data)`; the pair identifies the registration.
        pub fn register_with_data<D: Send + Sync + 'static>(
            probe: fn(&D, $($ty),*),
            data: ::std::sync::Arc<D>,
            prio: i32,
        ) -> ::std::result::Result<$crate::tracepoint::ProbeId, $crate::tracepoint::ProbeError> {
            let identity = (probe as usize, ::std::sync::Arc::as_ptr(&data) as *const () as usize);
            TRACEPOINT.register_identity(
                ::std::sync::Arc::new(move |$($arg: $ty),*| probe(&data, $($arg),*)),
                prio,
                identity,
            )
        }

        /// Attaches a probe that sees the arguments as raw words (see
        /// [`RawArg`]($crate::tracepoint::RawArg)), for dynamic `t:` events.
        pub fn register_raw(
            prio: i32,
            probe: $crate::tracepoint::RawProbe,
        ) -> $crate::tracepoint::ProbeId {
            register(prio, move |$($arg: $ty),*| {
                #[allow(unused_imports)]
                use $crate::tracepoint::{RawViaAddress as _, RawViaTrait as _};
                let mut words = [0u64; 64];
                #[allow(unused_mut)]
                let mut n = 0usize;
                $( n += (&$crate::tracepoint::RawWrap(&$arg)).raw_into(&mut words[n..]); )*
                probe(&words[..n]);
            })
        }

        /// Detaches the probe registered with this `(probe, data)` pair.
        pub fn unregister_with_data<D: Send + Sync + 'static>(
            probe: fn(&D, $($ty),*),
            data: &::std::sync::Arc<D>,
        ) -> ::std::result::Result<(), $crate::tracepoint::ProbeError> {
            let identity = (probe as usize, ::std::sync::Arc::as_ptr(data) as *const () as usize);
            TRACEPOINT.unregister_identity(identity)
        }
    };
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::Arc;

    crate::declare_tracepoint! {
        fn tp_test_order(x: u64);
    }
    crate::declare_tracepoint! {
        fn tp_test_data(s: &str, n: u32);
    }
    crate::declare_tracepoint! {
        fn tp_test_stress(x: u64);
    }

    pub struct Opaque {
        pub _inner: u64,
    }

    crate::declare_tracepoint! {
        fn tp_test_raw(a: u32, s: &str, flag: bool, o: &Opaque, t: (u8, u8));
    }

    #[test]
    fn raw_probes_see_words_and_addresses() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = seen.clone();
        let register = super::find("tp_test_raw")
            .unwrap()
            .info()
            .register_raw
            .unwrap();
        let id = register(
            0,
            Arc::new(move |words: &[u64]| sink.lock().unwrap().push(words.to_vec())),
        );
        let o = Opaque { _inner: 7 };
        tp_test_raw::trace(5, "hey", true, &o, (1, 2));
        let words = seen.lock().unwrap()[0].clone();
        assert_eq!(words.len(), 6);
        assert_eq!(words[0], 5);
        // SAFETY: the probe ran during the call above, while "hey" (a static) was alive.
        let text = unsafe { std::slice::from_raw_parts(words[1] as *const u8, words[2] as usize) };
        assert_eq!(text, b"hey");
        assert_eq!(words[3], 1);
        assert_eq!(
            words[4], &o as *const Opaque as u64,
            "references are passed as addresses"
        );
        super::find("tp_test_raw")
            .unwrap()
            .unregister_id(id)
            .unwrap();
    }

    crate::declare_tracepoint! {
        fn tp_test_first_call(x: u64);
    }

    /// A thread's first call registers the thread for read-side sections on the way; it and
    /// the later calls reach the probe.
    #[test]
    fn a_threads_first_call_and_later_ones_reach_the_probe() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = seen.clone();
        let id = tp_test_first_call::register(0, move |x| sink.lock().unwrap().push(x));
        std::thread::spawn(|| {
            assert!(!crate::rcu::in_read_section());
            tp_test_first_call::trace(1);
            tp_test_first_call::trace(2);
        })
        .join()
        .unwrap();
        assert_eq!(*seen.lock().unwrap(), vec![1, 2]);
        tp_test_first_call::TRACEPOINT.unregister(id).unwrap();
    }

    #[test]
    fn probes_run_in_priority_order_and_stop_after_unregister() {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (l1, l2, l3) = (log.clone(), log.clone(), log.clone());
        assert!(!tp_test_order::enabled());
        let low = tp_test_order::register(1, move |x| l1.lock().unwrap().push(("low", x)));
        let high = tp_test_order::register(10, move |x| l2.lock().unwrap().push(("high", x)));
        let mid = tp_test_order::register(5, move |x| l3.lock().unwrap().push(("mid", x)));
        assert!(tp_test_order::enabled());
        tp_test_order::trace(7);
        assert_eq!(
            *log.lock().unwrap(),
            vec![("high", 7), ("mid", 7), ("low", 7)]
        );
        for id in [low, high, mid] {
            tp_test_order::TRACEPOINT.unregister(id).unwrap();
        }
        assert!(!tp_test_order::enabled());
        super::synchronize_unregister();
        tp_test_order::trace(8);
        assert_eq!(log.lock().unwrap().len(), 3);
        assert_eq!(
            tp_test_order::TRACEPOINT.unregister(low),
            Err(super::ProbeError::NotFound("tp_test_order"))
        );
    }

    fn count_len(data: &AtomicUsize, s: &str, n: u32) {
        data.fetch_add(s.len() * n as usize, Ordering::Relaxed);
    }

    #[test]
    fn kernel_style_probes_with_private_data() {
        let data = Arc::new(AtomicUsize::new(0));
        tp_test_data::register_with_data(count_len, data.clone(), 0).unwrap();
        assert_eq!(
            tp_test_data::register_with_data(count_len, data.clone(), 0),
            Err(super::ProbeError::Exists("tp_test_data"))
        );
        tp_test_data::trace("abc", 2);
        assert_eq!(data.load(Ordering::Relaxed), 6);
        tp_test_data::unregister_with_data(count_len, &data).unwrap();
        super::synchronize_unregister();
        tp_test_data::trace("abc", 2);
        assert_eq!(data.load(Ordering::Relaxed), 6);
        assert!(super::find("tp_test_data").is_some());
        assert_eq!(
            super::find("tp_test_data").unwrap().info().args,
            ["s: &str", "n: u32"]
        );
    }

    /// Four threads call the tracepoint while probes come and go; once
    /// `synchronize_unregister` returns, a removed probe's counter never moves again.
    #[test]
    fn no_probe_runs_after_synchronize_unregister() {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let callers: Vec<_> = (0..4)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        tp_test_stress::trace(i);
                        i += 1;
                    }
                    i
                })
            })
            .collect();
        let mut late_calls = 0;
        let mut total_calls = 0;
        for round in 0..200 {
            let hits = Arc::new(AtomicU64::new(0));
            let h = hits.clone();
            let id = tp_test_stress::register(round % 3, move |_| {
                h.fetch_add(1, Ordering::Relaxed);
            });
            while hits.load(Ordering::Relaxed) == 0 {
                std::hint::spin_loop();
            }
            tp_test_stress::TRACEPOINT.unregister(id).unwrap();
            super::synchronize_unregister();
            let settled = hits.load(Ordering::Relaxed);
            std::thread::sleep(std::time::Duration::from_micros(200));
            late_calls += hits.load(Ordering::Relaxed) - settled;
            total_calls += settled;
        }
        stop.store(true, Ordering::Relaxed);
        let calls: u64 = callers.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(calls > 0 && total_calls >= 200);
        assert_eq!(
            late_calls, 0,
            "a probe ran after synchronize_unregister returned"
        );
    }
}
