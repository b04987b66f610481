//! The fprobe API (fprobe.rst in Rust) and the registry of patched sites.
//!
//! ```text
//!   FprobeBuilder --register(filter, notfilter) / register_ips / register_syms--> Fprobe
//!        |                                                                          |
//!        v                                                                          v
//!   Registry (mutex, slow path only)                                   unregister / drop
//!     sites: func addr -> SiteRec { &'static Site, SiteCode, probes }
//!       - first probe on a function: analyse + build stubs + patch (batched)
//!       - more probes: publish a longer ProbeList, same patch site
//!       - last probe gone: restore the original bytes
//! ```
//!
//! Registration publishes lists and patches before it returns, so handlers may run before
//! `register*` returns. `unregister` removes the fprobe from every list, bumps its slot
//! generation (outstanding exits stop matching it), restores sites left without probes and then
//! waits for quiescence: when it returns no thread is inside a handler of that fprobe and none
//! will enter one.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::arch::{self, PtRegs, SiteCode};
use crate::dispatch::{
    self, EntryAction, EntryHandler, ExitHandler, Probe, ProbeList, Site, PSLOTS,
};
use crate::Error;
use ustrace_inspect::symbols::Symbol;

/// A function a registration attempt could not attach to, with the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Function name (or address when no symbol covers it).
    pub function: String,
    /// Address of the function.
    pub addr: usize,
    /// Why it cannot be probed.
    pub reason: String,
}

struct SiteRec {
    site: &'static Site,
    name: String,
    code: Result<SiteCode, String>,
    patched: bool,
    probes: Vec<Arc<Probe>>,
    internal: Vec<bool>,
}

/// Hashes the registry's keys, code addresses, with one multiply: the standard SipHash was a
/// visible share of registering thousands of functions at once, and the keys are not chosen
/// by an adversary.
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_usize(&mut self, n: usize) {
        // Both ends of the result matter to the table (bucket index and tag bits).
        self.0 = (n as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29);
    }
}

type FilterEntry = (std::sync::Weak<Mutex<FpState>>, std::sync::Weak<Probe>);

struct Registry {
    sites: HashMap<usize, SiteRec, BuildHasherDefault<AddrHasher>>,
    /// Filter-registered fprobes, re-applied after dlopen.
    filters: Vec<FilterEntry>,
    free_slots: Vec<u32>,
    next_slot: u32,
    next_id: u64,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

fn registry() -> MutexGuard<'static, Option<Registry>> {
    let mut g = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() {
        *g = Some(Registry {
            sites: HashMap::default(),
            filters: Vec::new(),
            free_slots: Vec::new(),
            next_slot: 0,
            next_id: 1,
        });
        // SAFETY: registering a plain function as the fork child hook.
        unsafe { libc::pthread_atfork(None, None, Some(atfork_child)) };
    }
    g
}

extern "C" fn atfork_child() {
    dispatch::after_fork_in_child();
}

/// One function to attach to.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub addr: usize,
    pub size: Option<usize>,
    pub name: String,
}

fn excluded(name: &str) -> Option<&'static str> {
    if name.starts_with("ustrace_fprobe") || name.contains("ustrace_fprobe::") {
        return Some("part of the probe machinery (notrace)");
    }
    None
}

/// Functions of the C library and the dynamic loader (only there) that must not be probed although their
/// prologue could be patched: the kernel marks its own such code `notrace`/`NOKPROBE_SYMBOL`.
/// (name glob, why, whether only an fprobe that hooks the return is refused).
const NOTRACE: &[(&str, &str, bool)] = &[
    ("_dl_runtime_resolve*", "lazy-binding resolver: entered by a jump from the PLT with the link map and relocation index on the stack, not a return address", false),
    ("_dl_runtime_profile*", "lazy-binding resolver: entered by a jump from the PLT with the link map and relocation index on the stack, not a return address", false),
    ("_dl_tlsdesc_*", "TLS descriptor resolver: its callers expect every register preserved", false),
    ("__tls_get_addr*", "may be called with a misaligned stack (GCC bug 58066)", false),
    ("start_thread", "a new thread runs it with every signal blocked, and a thread that meets the int3 of a patch in progress with SIGTRAP blocked is killed", false),
    ("__ctype_init", "a new thread runs it with every signal blocked, and a thread that meets the int3 of a patch in progress with SIGTRAP blocked is killed", false),
    ("create_thread", "runs with every signal blocked, and a thread that meets the int3 of a patch in progress with SIGTRAP blocked is killed", false),
    ("__clone*", "runs with every signal blocked and returns on a new stack in the child", false),
    ("clone*", "runs with every signal blocked and returns on a new stack in the child", false),
    ("__spawni_child", "the posix_spawn child runs it with every signal blocked, on our memory", false),
    ("_Fork", "runs with every signal blocked", false),
    ("__sigsetjmp", "a new thread runs it with every signal blocked; it also returns twice", false),
    ("__sigjmp_save", "a new thread runs it with every signal blocked", false),
    ("*madvise", "an exiting thread runs it with every signal blocked", false),
    ("*getpagesize", "an exiting thread runs it with every signal blocked", false),
    ("__lll_lock_wa*_private", "new and exiting threads run it with every signal blocked", false),
    ("*setjmp", "returns twice: a later longjmp would return through a hook that is gone", true),
    ("getcontext", "returns twice: a later setcontext would return through a hook that is gone", true),
    ("__getcontext", "returns twice: a later setcontext would return through a hook that is gone", true),
    ("swapcontext", "returns on another context's stack", true),
    ("__start_context", "the first frame of a makecontext context: it has no caller to return to", true),
    ("*vfork", "returns twice on one stack (child, then parent)", true),
];

/// Whether `path` is the C library or the dynamic loader, whose functions [`NOTRACE`] names.
fn is_glibc(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    ["libc.so", "libc-", "ld-linux", "ld-2.", "libpthread"]
        .iter()
        .any(|p| base.starts_with(p))
}

/// A quick necessary condition for `name` to match the glob `pat`: it starts with the
/// pattern's literal text before its first wildcard and ends with the text after its last.
/// Every C-library function is held against every [`NOTRACE`] pattern when a tracer is
/// switched on for all of them; this turns nearly all of those away without the matcher.
#[cfg(test)]
fn literal_ends_match(pat: &str, name: &str) -> bool {
    let (head, tail) = literal_ends(pat);
    name.starts_with(head) && name.ends_with(tail)
}

/// The literal text of `pat` before its first wildcard and after its last.
fn literal_ends(pat: &str) -> (&str, &str) {
    const WILD: [char; 4] = ['*', '?', '[', '\\'];
    let head = pat.find(WILD).unwrap_or(pat.len());
    let tail = pat.rfind(WILD).map_or(0, |i| i + 1);
    (&pat[..head], &pat[tail..])
}

/// [`literal_ends`] of every [`NOTRACE`] pattern, in its order, worked out once.
fn notrace_ends() -> &'static [(&'static str, &'static str)] {
    static ENDS: std::sync::OnceLock<Vec<(&'static str, &'static str)>> =
        std::sync::OnceLock::new();
    ENDS.get_or_init(|| {
        NOTRACE
            .iter()
            .map(|(pat, _, _)| literal_ends(pat))
            .collect()
    })
}

const ENTRY_POINT: &str = "a program's entry point: the loader jumps to it with no return \
     address (and the stack aligned as no call leaves it), so its entry cannot be probed (notrace: _start)";

/// The address the loader jumped to to start this program (`AT_ENTRY`; 0 when unknown).
fn program_entry() -> usize {
    // SAFETY: getauxval only reads the auxiliary vector the kernel gave the process.
    unsafe { libc::getauxval(libc::AT_ENTRY) as usize }
}

/// Why the function at `addr` (named `first` by the caller, plus every name the inventory has
/// for it) may not be probed by an fprobe that does (or does not) hook the return.
fn notrace(symbols: &[Symbol], addr: usize, first: &str, hooks_return: bool) -> Option<String> {
    if addr == program_entry() || first == "_start" {
        return Some(ENTRY_POINT.to_string());
    }
    let i = symbols.partition_point(|s| s.addr < addr);
    let here = symbols[i..].iter().take_while(|s| s.addr == addr);
    let glibc = here.clone().any(|s| is_glibc(&s.object));
    let names = std::iter::once(first).chain(here.map(|s| s.mangled.as_str()));
    for n in names {
        if let Some(why) = excluded(n) {
            return Some(why.to_string());
        }
        if n == "_start" {
            return Some(ENTRY_POINT.to_string());
        }
        if !glibc {
            continue;
        }
        let plain = n.split('@').next().unwrap_or(n);
        for ((pat, why, exit_only), (head, tail)) in NOTRACE.iter().zip(notrace_ends()) {
            if (!exit_only || hooks_return)
                && plain.starts_with(head)
                && plain.ends_with(tail)
                && ustrace_inspect::symbols::glob_match(pat.as_bytes(), plain.as_bytes())
            {
                return Some(format!("{why} (notrace: {plain})"));
            }
        }
    }
    None
}

/// Builder for an [`Fprobe`]: handlers and per-call data first, then one of the three
/// registration calls of fprobe.rst.
#[derive(Default)]
pub struct FprobeBuilder {
    entry: Option<Box<EntryHandler>>,
    exit: Option<Box<ExitHandler>>,
    entry_data_size: usize,
    nr_maxactive: u32,
    internal: bool,
    no_return_hook: bool,
}

impl std::fmt::Debug for FprobeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FprobeBuilder")
            .field("entry", &self.entry.is_some())
            .field("exit", &self.exit.is_some())
            .field("entry_data_size", &self.entry_data_size)
            .field("nr_maxactive", &self.nr_maxactive)
            .finish()
    }
}

impl FprobeBuilder {
    /// An fprobe with no handler yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Called at function entry with `(fprobe, entry_ip, ret_ip, regs, entry_data)`; returning
    /// [`EntryAction::SkipExit`] cancels this fprobe's exit handler for this call.
    pub fn entry_handler<F>(mut self, f: F) -> Self
    where
        F: Fn(&Probe, usize, usize, &PtRegs, &mut [u8]) -> EntryAction + Send + Sync + 'static,
    {
        self.entry = Some(Box::new(f));
        self
    }

    /// Called when the function returns, on the same thread, with the same `entry_data`.
    pub fn exit_handler<F>(mut self, f: F) -> Self
    where
        F: Fn(&Probe, usize, usize, &PtRegs, &mut [u8]) + Send + Sync + 'static,
    {
        self.exit = Some(Box::new(f));
        self
    }

    /// Bytes of per-call storage shared by the entry and exit handler (only with an exit
    /// handler, as in the kernel). Contents are unspecified when the entry handler starts.
    pub fn entry_data_size(mut self, bytes: usize) -> Self {
        self.entry_data_size = bytes;
        self
    }

    /// Most calls of this fprobe whose exit may be pending at once, over all threads (0: only
    /// the per-thread shadow-stack bound). Beyond it, exits are not hooked and `nmissed` grows.
    pub fn nr_maxactive(mut self, n: u32) -> Self {
        self.nr_maxactive = n;
        self
    }

    /// Machinery probe (unwinder hooks): runs first, never hooks returns.
    pub(crate) fn internal(mut self) -> Self {
        self.internal = true;
        self.no_return_hook = true;
        self
    }

    /// Machinery probe that needs its exit handler (the dlopen hook).
    pub(crate) fn internal_with_exit(mut self) -> Self {
        self.internal = true;
        self
    }

    /// `register_fprobe(fp, filter, notfilter)`: every function whose name matches one of the
    /// space-separated globs of `filter` and none of `notfilter`. Functions that cannot be
    /// patched are skipped and listed by [`Fprobe::refused`]; it is an error only when nothing
    /// could be attached.
    pub fn register(self, filter: &str, notfilter: Option<&str>) -> Result<Fprobe, Error> {
        let targets = resolve_filter(filter, notfilter);
        if targets.is_empty() {
            return Err(Error::NoMatch(filter.to_string()));
        }
        crate::unwind::ensure_dlopen_hook();
        let fp = self.register_targets(targets, false)?;
        fp.state().filter = Some((filter.to_string(), notfilter.map(str::to_string)));
        let mut g = registry();
        let reg = g.as_mut().expect("registry initialised");
        reg.filters.retain(|(st, _)| st.strong_count() > 0);
        reg.filters
            .push((Arc::downgrade(&fp.state), Arc::downgrade(&fp.probe)));
        Ok(fp)
    }

    /// `register_fprobe_ips`: functions by address. Every address must be the start of a
    /// function (or its patch address after `endbr64`) that can be patched, else nothing is
    /// registered.
    pub fn register_ips(self, ips: &[usize]) -> Result<Fprobe, Error> {
        let inv = ustrace_inspect::symbols::inventory();
        let targets = ips
            .iter()
            .map(|&ip| match inv.lookup(ip) {
                Some((s, off)) if off == 0 || off == 4 => Target {
                    addr: s.addr,
                    size: Some(s.size).filter(|&n| n > 0),
                    name: s.name.clone(),
                },
                _ => Target {
                    addr: ip,
                    size: None,
                    name: format!("{ip:#x}"),
                },
            })
            .collect();
        self.register_targets(targets, true)
    }

    /// Functions by address, as [`FprobeBuilder::register_ips`], except that functions that
    /// cannot be patched are skipped and listed by [`Fprobe::refused`] (as a filter
    /// registration does): what a tracer of every function of the process needs. An error
    /// only when none could be attached.
    pub fn register_ips_lenient(self, ips: &[usize]) -> Result<Fprobe, Error> {
        let inv = ustrace_inspect::symbols::inventory();
        let targets = ips
            .iter()
            .map(|&ip| match inv.lookup(ip) {
                Some((s, 0)) => Target {
                    addr: s.addr,
                    size: Some(s.size).filter(|&n| n > 0),
                    name: s.name.clone(),
                },
                _ => Target {
                    addr: ip,
                    size: None,
                    name: format!("{ip:#x}"),
                },
            })
            .collect();
        self.register_targets(targets, false)
    }

    /// `register_fprobe_syms`: functions by exact (demangled or mangled) name; every name must
    /// resolve and be patchable, else nothing is registered.
    pub fn register_syms(self, syms: &[&str]) -> Result<Fprobe, Error> {
        let inv = ustrace_inspect::symbols::inventory();
        let mut targets = Vec::new();
        for name in syms {
            let found = find_versioned(&inv, name);
            if found.is_empty() {
                return Err(Error::NoMatch(name.to_string()));
            }
            for s in found {
                if !targets.iter().any(|t: &Target| t.addr == s.addr) {
                    targets.push(Target {
                        addr: s.addr,
                        size: Some(s.size).filter(|&n| n > 0),
                        name: s.name.clone(),
                    });
                }
            }
        }
        self.register_targets(targets, true)
    }

    pub(crate) fn register_internal(self, targets: Vec<Target>) -> Result<Fprobe, Error> {
        self.register_targets(targets, true)
    }

    fn register_targets(self, targets: Vec<Target>, strict: bool) -> Result<Fprobe, Error> {
        if !arch::SUPPORTED {
            return Err(Error::Unsupported(format!(
                "fprobes are not implemented for {}",
                std::env::consts::ARCH
            )));
        }
        if self.exit.is_some() && !self.no_return_hook {
            crate::unwind::ensure_hooks();
        }
        if self.entry.is_none() && self.exit.is_none() {
            return Err(Error::Invalid(
                "an fprobe needs an entry or an exit handler".into(),
            ));
        }
        if self.exit.is_some() && !self.no_return_hook && arch::hardware_shadow_stack() {
            return Err(Error::Unsupported(
                "exit handlers rewrite return addresses, which the CET shadow stack of this thread forbids".into(),
            ));
        }
        if dispatch::in_handler() {
            return Err(Error::Invalid(
                "cannot register from inside an fprobe handler".into(),
            ));
        }
        dispatch::prepare_slot_release();
        // Taken before the registry lock: building it may dlopen, whose hook takes that lock.
        let inv = ustrace_inspect::symbols::inventory();
        let mut g = registry();
        let reg = g.as_mut().expect("registry initialised");
        let slot = match reg.free_slots.pop() {
            Some(s) => s,
            None if (reg.next_slot as usize) < dispatch::PROBE_SLOTS => {
                reg.next_slot += 1;
                reg.next_slot - 1
            }
            None => return Err(Error::TooManyProbes),
        };
        let id = reg.next_id;
        reg.next_id += 1;
        let gen = PSLOTS[slot as usize].gen.load(Ordering::Relaxed);
        let probe = Arc::new(Probe {
            entry: self.entry,
            exit: self.exit,
            entry_data_size: self.entry_data_size,
            nr_maxactive: self.nr_maxactive,
            active: AtomicU32::new(0),
            nmissed: AtomicU64::new(0),
            disabled: AtomicBool::new(false),
            slot: AtomicU32::new(slot),
            id,
            record_hdr: slot as u64 | (gen as u64) << 32,
            entry_words: self.entry_data_size.div_ceil(8),
        });
        PSLOTS[slot as usize]
            .probe
            .store(Arc::as_ptr(&probe).cast_mut(), Ordering::Release);
        match attach(
            reg,
            inv.functions(),
            &probe,
            self.internal,
            self.no_return_hook,
            targets,
            strict,
        ) {
            Ok((funcs, refused)) => {
                if funcs.is_empty() {
                    release_slot(reg, &probe);
                    let why = refused
                        .first()
                        .map(|r| format!("{}: {}", r.function, r.reason));
                    return Err(Error::Refused(why.unwrap_or_else(|| "no function".into())));
                }
                Ok(Fprobe {
                    probe,
                    state: Arc::new(Mutex::new(FpState {
                        funcs,
                        refused,
                        filter: None,
                        registered: true,
                    })),
                    internal: self.internal,
                })
            }
            Err(e) => {
                release_slot(reg, &probe);
                Err(e)
            }
        }
    }
}

fn release_slot(reg: &mut Registry, probe: &Arc<Probe>) {
    let slot = probe.slot.load(Ordering::Relaxed);
    PSLOTS[slot as usize]
        .probe
        .store(std::ptr::null_mut(), Ordering::Release);
    PSLOTS[slot as usize].gen.fetch_add(1, Ordering::AcqRel);
    reg.free_slots.push(slot);
}

/// Definitions of `name`, also when the symbol table spells it with a version
/// (`dlopen@@GLIBC_2.34`); one per address.
pub(crate) fn find_versioned<'a>(
    inv: &'a ustrace_inspect::symbols::Inventory,
    name: &str,
) -> Vec<&'a ustrace_inspect::symbols::Symbol> {
    let mut out = inv.find(name);
    for s in inv.glob(&format!("{name}@*")) {
        if !out.iter().any(|o| o.addr == s.addr) {
            out.push(s);
        }
    }
    out
}

pub(crate) fn resolve_filter(filter: &str, notfilter: Option<&str>) -> Vec<Target> {
    let inv = ustrace_inspect::symbols::inventory();
    let mut out: Vec<Target> = Vec::new();
    let nots: Vec<&str> = notfilter
        .map(|n| n.split_whitespace().collect())
        .unwrap_or_default();
    for pat in filter.split_whitespace() {
        for s in inv.glob(pat) {
            if out.iter().any(|t| t.addr == s.addr) {
                continue;
            }
            if nots
                .iter()
                .any(|n| !inv.glob(n).iter().all(|x| x.addr != s.addr))
            {
                continue;
            }
            out.push(Target {
                addr: s.addr,
                size: Some(s.size).filter(|&n| n > 0),
                name: s.name.clone(),
            });
        }
    }
    out
}

fn publish(rec: &SiteRec, retired: &mut Vec<*mut ProbeList>) {
    let new = if rec.probes.is_empty() {
        std::ptr::null_mut()
    } else {
        let probes: Box<[*const Probe]> = rec.probes.iter().map(Arc::as_ptr).collect();
        Box::into_raw(Box::new(ProbeList::new(probes)))
    };
    let old = rec.site.probes.swap(new, Ordering::AcqRel);
    if !old.is_null() {
        retired.push(old);
    }
}

fn free_retired(retired: Vec<*mut ProbeList>) {
    if retired.is_empty() {
        return;
    }
    dispatch::synchronize();
    for p in retired {
        // SAFETY: unpublished before the grace period that just ended; no reader remains.
        drop(unsafe { Box::from_raw(p) });
    }
}

type Attached = (Vec<usize>, Vec<Refusal>);

#[allow(clippy::too_many_arguments)]
fn attach(
    reg: &mut Registry,
    symbols: &[Symbol],
    probe: &Arc<Probe>,
    internal: bool,
    no_return_hook: bool,
    targets: Vec<Target>,
    strict: bool,
) -> Result<Attached, Error> {
    let mut refused = Vec::new();
    let mut ok = Vec::new();
    let hooks_return = probe.exit.is_some() && !no_return_hook;
    // Functions seen for the first time are analysed together (their code read in runs).
    let mut fresh: Vec<&Target> = targets
        .iter()
        .filter(|t| !reg.sites.contains_key(&t.addr))
        .collect();
    fresh.sort_unstable_by_key(|t| t.addr);
    fresh.dedup_by_key(|t| t.addr);
    for rec in new_sites(&fresh, symbols) {
        reg.sites.insert(rec.site.func, rec);
    }
    for t in targets {
        let rec = &reg.sites[&t.addr];
        // An IFUNC symbol is listed at the implementation its resolver selected (see
        // ustrace-inspect), which is ordinary code: it is judged like any other function.
        let reason = if let Some(why) = notrace(symbols, t.addr, &t.name, hooks_return) {
            Some(why)
        } else {
            rec.code.as_ref().err().cloned()
        };
        match reason {
            Some(reason) => refused.push(Refusal {
                function: t.name.clone(),
                addr: t.addr,
                reason,
            }),
            None => ok.push(t.addr),
        }
    }
    if ok.is_empty() || (strict && !refused.is_empty()) {
        if strict && !refused.is_empty() {
            let r = &refused[0];
            return Err(Error::Refused(format!(
                "{} ({:#x}): {}",
                r.function, r.addr, r.reason
            )));
        }
        return Ok((ok, refused));
    }
    let mut retired = Vec::new();
    let mut to_patch = Vec::new();
    for &f in &ok {
        let rec = reg.sites.get_mut(&f).expect("site just inserted");
        // Internal (unwinder) probes go first so they run before user handlers.
        let pos = if internal {
            rec.internal.iter().take_while(|&&i| i).count()
        } else {
            rec.probes.len()
        };
        rec.probes.insert(pos, probe.clone());
        rec.internal.insert(pos, internal);
        if no_return_hook {
            rec.site.no_return_hook.store(true, Ordering::Relaxed);
        }
        publish(rec, &mut retired);
        if !rec.patched {
            to_patch.push(f);
        }
    }
    let guard = arch::text_lock();
    let codes: Vec<&SiteCode> = to_patch
        .iter()
        .map(|f| {
            reg.sites[f]
                .code
                .as_ref()
                .expect("refused sites are filtered")
        })
        .collect();
    let res = arch::patch_sites(&codes, &guard);
    drop(guard);
    if let Err(e) = res {
        for &f in &ok {
            let rec = reg.sites.get_mut(&f).expect("site exists");
            if let Some(i) = rec.probes.iter().position(|p| Arc::ptr_eq(p, probe)) {
                rec.probes.remove(i);
                rec.internal.remove(i);
            }
            publish(rec, &mut retired);
        }
        free_retired(retired);
        return Err(e);
    }
    for f in &to_patch {
        reg.sites.get_mut(f).expect("site exists").patched = true;
    }
    free_retired(retired);
    Ok((ok, refused))
}

fn new_sites(targets: &[&Target], symbols: &[Symbol]) -> Vec<SiteRec> {
    let sites: Vec<&'static Site> = targets
        .iter()
        .map(|t| {
            &*Box::leak(Box::new(Site {
                orig_stub: Default::default(),
                func: t.addr,
                probes: AtomicPtr::new(std::ptr::null_mut()),
                no_return_hook: AtomicBool::new(false),
            }))
        })
        .collect();
    let reqs: Vec<arch::SiteRequest> = targets
        .iter()
        .zip(&sites)
        .filter(|(t, _)| excluded(&t.name).is_none())
        .map(|(t, site)| arch::SiteRequest {
            func: t.addr,
            size: t.size,
            site: *site as *const Site as usize,
        })
        .collect();
    let mut built = arch::build_sites(&reqs, symbols).into_iter();
    targets
        .iter()
        .zip(sites)
        .map(|(t, site)| {
            let code = if excluded(&t.name).is_some() {
                Err("not analysed".to_string())
            } else {
                built.next().expect("one result per request")
            };
            if let Ok(c) = &code {
                site.orig_stub.store(c.orig_stub, Ordering::Release);
            }
            SiteRec {
                site,
                name: t.name.clone(),
                code,
                patched: false,
                probes: Vec::new(),
                internal: Vec::new(),
            }
        })
        .collect()
}

fn detach(reg: &mut Registry, probe: &Arc<Probe>, funcs: &[usize]) -> Result<(), Error> {
    let slot = probe.slot.load(Ordering::Relaxed) as usize;
    // Outstanding exits of this probe stop matching from here on.
    PSLOTS[slot]
        .probe
        .store(std::ptr::null_mut(), Ordering::Release);
    PSLOTS[slot].gen.fetch_add(1, Ordering::AcqRel);
    let mut retired = Vec::new();
    let mut to_unpatch = Vec::new();
    for f in funcs {
        if let Some(rec) = reg.sites.get_mut(f) {
            if let Some(i) = rec.probes.iter().position(|p| Arc::ptr_eq(p, probe)) {
                rec.probes.remove(i);
                rec.internal.remove(i);
                publish(rec, &mut retired);
                if rec.probes.is_empty() && rec.patched {
                    to_unpatch.push(*f);
                }
            }
        }
    }
    let guard = arch::text_lock();
    let codes: Vec<&SiteCode> = to_unpatch
        .iter()
        .filter_map(|f| reg.sites[f].code.as_ref().ok())
        .collect();
    let res = arch::unpatch_sites(&codes, &guard);
    drop(guard);
    if res.is_ok() {
        for f in &to_unpatch {
            reg.sites.get_mut(f).expect("site exists").patched = false;
        }
    }
    // Even when unpatching failed the probe is out of every list: after this grace period no
    // handler of it can run, which is the promise unregister makes.
    dispatch::synchronize();
    for p in retired {
        // SAFETY: unpublished before the grace period above.
        drop(unsafe { Box::from_raw(p) });
    }
    reg.free_slots.push(slot as u32);
    res
}

struct FpState {
    funcs: Vec<usize>,
    refused: Vec<Refusal>,
    filter: Option<(String, Option<String>)>,
    registered: bool,
}

/// A registered fprobe. Dropping it unregisters it.
pub struct Fprobe {
    probe: Arc<Probe>,
    state: Arc<Mutex<FpState>>,
    internal: bool,
}

impl std::fmt::Debug for Fprobe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state();
        f.debug_struct("Fprobe")
            .field("id", &self.probe.id)
            .field("functions", &st.funcs.len())
            .field("refused", &st.refused.len())
            .field("nmissed", &self.probe.nmissed())
            .finish()
    }
}

impl std::ops::Deref for Fprobe {
    type Target = Probe;
    fn deref(&self) -> &Probe {
        &self.probe
    }
}

impl Fprobe {
    /// Shorthand for [`FprobeBuilder::new`].
    pub fn builder() -> FprobeBuilder {
        FprobeBuilder::new()
    }

    /// Addresses of the functions this fprobe is attached to.
    pub fn functions(&self) -> Vec<usize> {
        self.state().funcs.clone()
    }

    fn state(&self) -> MutexGuard<'_, FpState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Functions matched by the filter that could not be patched, with reasons.
    pub fn refused(&self) -> Vec<Refusal> {
        self.state().refused.clone()
    }

    /// `disable_fprobe`: handlers stop being called (exits of calls already entered included);
    /// the code stays patched.
    pub fn disable(&self) {
        self.probe.disabled.store(true, Ordering::Release);
    }

    /// `enable_fprobe`: undoes [`Fprobe::disable`].
    pub fn enable(&self) {
        self.probe.disabled.store(false, Ordering::Release);
    }

    /// Re-applies the registration filter to the functions loaded now (for example after
    /// `dlopen`) and attaches to the new matches. Returns how many functions were added.
    /// Address and symbol registrations have nothing to rescan and return 0.
    pub fn rescan(&self) -> Result<usize, Error> {
        if dispatch::in_handler() {
            return Err(Error::Invalid(
                "cannot rescan from inside an fprobe handler".into(),
            ));
        }
        rescan_one(&self.state, &self.probe, self.internal)
    }

    /// `unregister_fprobe`: when this returns, neither handler of this fprobe runs again on any
    /// thread. Must not be called from inside a handler.
    pub fn unregister(mut self) -> Result<(), Error> {
        self.do_unregister()
    }

    fn do_unregister(&mut self) -> Result<(), Error> {
        if !self.state().registered {
            return Ok(());
        }
        if dispatch::in_handler() {
            return Err(Error::Invalid(
                "cannot unregister from inside an fprobe handler".into(),
            ));
        }
        let mut st = self.state();
        st.registered = false;
        let mut g = registry();
        let reg = g.as_mut().expect("registry initialised");
        detach(reg, &self.probe, &st.funcs)
    }
}

impl Drop for Fprobe {
    fn drop(&mut self) {
        if self.state().registered && dispatch::in_handler() {
            // Unregistering here would wait for ourselves; keep the probe alive instead.
            std::mem::forget(self.probe.clone());
            return;
        }
        let _ = self.do_unregister();
    }
}

/// Text of tracefs `enabled_functions`: one line per patched function, in address order,
/// `name (N) R` (N fprobes attached; `R` because handlers get full registers) followed by the
/// site's trampoline as the kernel prints it.
pub fn enabled_functions() -> String {
    let g = registry();
    let Some(reg) = g.as_ref() else {
        return String::new();
    };
    let mut rows: Vec<(&usize, &SiteRec)> = reg
        .sites
        .iter()
        .filter(|(_, r)| r.patched && !r.probes.is_empty())
        .collect();
    rows.sort_by_key(|(a, _)| **a);
    let mut out = String::new();
    for (_, r) in rows {
        let stub = r.code.as_ref().map(|c| c.entry_stub).unwrap_or(0);
        out.push_str(&format!(
            "{} ({}) R         \ttramp: {:#x}\n",
            r.name,
            r.probes.len(),
            stub
        ));
    }
    out
}

/// Why the function at `addr` cannot be probed, or `None` when it can (analysis only; nothing
/// is patched).
pub fn check_patchable(addr: usize) -> Option<String> {
    let inv = ustrace_inspect::symbols::inventory();
    let (name, size) = match inv.lookup(addr) {
        Some((s, 0)) => (s.name.clone(), Some(s.size).filter(|&n| n > 0)),
        _ => (format!("{addr:#x}"), None),
    };
    // Entry-only view: a registration that hooks the return may refuse a few more.
    if let Some(why) = notrace(inv.functions(), addr, &name, false) {
        return Some(why);
    }
    let g = registry();
    if let Some(rec) = g.as_ref().and_then(|r| r.sites.get(&addr)) {
        return rec.code.as_ref().err().cloned();
    }
    drop(g);
    arch::analyze_only(addr, size, inv.functions()).err()
}

thread_local! {
    /// Set while this thread rescans: building the symbol inventory may itself call dlopen,
    /// whose hook must not start a nested rescan (it would wait for the locks held here).
    static IN_RESCAN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn rescan_one(state: &Mutex<FpState>, probe: &Arc<Probe>, internal: bool) -> Result<usize, Error> {
    if IN_RESCAN.with(|r| r.replace(true)) {
        return Ok(0);
    }
    let res = rescan_one_inner(state, probe, internal);
    IN_RESCAN.with(|r| r.set(false));
    res
}

fn rescan_one_inner(
    state: &Mutex<FpState>,
    probe: &Arc<Probe>,
    internal: bool,
) -> Result<usize, Error> {
    let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
    let Some((filter, notfilter)) = st.filter.clone() else {
        return Ok(0);
    };
    if !st.registered {
        return Ok(0);
    }
    let targets: Vec<Target> = resolve_filter(&filter, notfilter.as_deref())
        .into_iter()
        .filter(|t| !st.funcs.contains(&t.addr) && !st.refused.iter().any(|r| r.addr == t.addr))
        .collect();
    if targets.is_empty() {
        return Ok(0);
    }
    let inv = ustrace_inspect::symbols::inventory();
    let mut g = registry();
    let reg = g.as_mut().expect("registry initialised");
    let (funcs, refused) = attach(reg, inv.functions(), probe, internal, false, targets, false)?;
    let n = funcs.len();
    st.funcs.extend(funcs);
    st.refused.extend(refused);
    Ok(n)
}

/// Re-applies every filter-registered fprobe to the functions loaded now. Runs automatically
/// on the thread that called `dlopen`/`dlmopen`, after the call returns and before its caller
/// resumes. Returns the number of functions newly attached.
pub fn rescan_filters() -> usize {
    if dispatch::in_handler() || IN_RESCAN.with(|r| r.get()) {
        return 0;
    }
    let live: Vec<(Arc<Mutex<FpState>>, Arc<Probe>)> = {
        let g = registry();
        let Some(reg) = g.as_ref() else { return 0 };
        reg.filters
            .iter()
            .filter_map(|(s, p)| Some((s.upgrade()?, p.upgrade()?)))
            .collect()
    };
    live.iter()
        .map(|(s, p)| rescan_one(s, p, false).unwrap_or(0))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ustrace_inspect::symbols::Binding;

    fn sym(name: &str, addr: usize, object: &str) -> Symbol {
        Symbol {
            name: name.into(),
            mangled: name.into(),
            addr,
            size: 16,
            object: object.into(),
            binding: Binding::Global,
            ifunc: false,
        }
    }

    #[test]
    fn notrace_names_apply_to_glibc_only_and_exit_only_entries_to_return_hooks() {
        let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
        let syms = vec![
            sym("__clone", 0x1000, libc),
            sym("clone", 0x1000, libc),
            sym("_setjmp", 0x2000, libc),
            sym("clone_widget", 0x3000, "/opt/app/libwidget.so"),
            sym("memcpy", 0x4000, libc),
        ];
        assert!(notrace(&syms, 0x1000, "clone", false).is_some());
        assert!(notrace(&syms, 0x2000, "_setjmp", false).is_none());
        assert!(notrace(&syms, 0x2000, "_setjmp", true).is_some());
        assert!(notrace(&syms, 0x3000, "clone_widget", true).is_none());
        assert!(notrace(&syms, 0x4000, "memcpy", true).is_none());
        assert!(notrace(&syms, 0x5000, "ustrace_fprobe_thing", false).is_some());
    }

    #[test]
    fn literal_ends_turn_away_only_names_the_glob_cannot_match() {
        let names = [
            "__lll_lock_wait_private",
            "__lll_lock_wake_private",
            "__lll_lock_wait",
            "_setjmp",
            "setjmp",
            "__sigsetjmp",
            "madvise",
            "x",
            "",
            "clone3",
            "__clone_internal",
            "_dl_runtime_resolve_xsavec",
            "start_thread",
            "start_threads",
        ];
        for (pat, _, _) in NOTRACE {
            for n in names {
                let full = ustrace_inspect::symbols::glob_match(pat.as_bytes(), n.as_bytes());
                assert!(!full || literal_ends_match(pat, n), "{pat} {n}");
            }
        }
        assert!(!literal_ends_match(
            "__lll_lock_wa*_private",
            "__lll_lock_wait"
        ));
        assert!(literal_ends_match("a?c*z", "abcz") && !literal_ends_match("a?c*z", "bbcz"));
    }
}
