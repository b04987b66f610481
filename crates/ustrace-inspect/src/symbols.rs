//! Function symbols of every object loaded in this process: ustrace's kallsyms.
//!
//! The kernel names its functions from kallsyms and lists the traceable ones
//! in `available_filter_functions`. ustrace does the same for user space:
//!
//! ```text
//!   dl_iterate_phdr ──► (path, load bias) per object, plus the adds/subs counters
//!        │
//!        ▼
//!   ELF file on disk (mmap) ──► .symtab, or .dynsym when stripped, or the
//!        │                      .symtab of /usr/lib/debug/.build-id/xx/rest.debug
//!        ▼
//!   STT_FUNC / STT_GNU_IFUNC with size > 0, runtime addr = st_value + bias,
//!   names demangled (Rust without hash, C++), `.dynsym` versions spelled out
//!   (`name@@VERSION`, `name@VERSION`) as `.symtab` spells them, sorted by address
//!        │
//!        ▼
//!   Inventory (immutable, shared through Arc) ── lookup / find / glob / %pS
//! ```
//!
//! An IFUNC symbol (`strlen` in glibc) points at its *resolver*, code that runs
//! once at relocation time and is never the function callers reach. The
//! inventory therefore lists an IFUNC under its name at the address the
//! dynamic linker resolved it to (`dlsym`), with the size of the function found
//! there (from the symbol table, or from the `.eh_frame` FDE that covers it).
//! An IFUNC that cannot be resolved that way is left out.
//!
//! [`inventory`] caches the last snapshot and rebuilds it only when the
//! loader's `dlpi_adds`/`dlpi_subs` counters moved, so a `dlopen`ed library
//! shows up the next time somebody asks.

mod glob;

pub use glob::glob_match;

use std::collections::HashMap;
use std::ffi::{c_void, CStr, CString};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use object::elf;
use object::read::elf::{FileHeader, Sym};
use object::{Endianness, Object, ObjectSection};

/// How an ELF symbol is bound; used to choose the preferred name of aliases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Binding {
    /// `STB_GLOBAL` (and `STB_GNU_UNIQUE`).
    Global,
    /// `STB_WEAK`.
    Weak,
    /// `STB_LOCAL`.
    Local,
}

/// One function of one loaded object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbol {
    /// Demangled name: Rust paths without the hash, C++ via cpp_demangle,
    /// C names as they are.
    pub name: String,
    /// The name as written in the symbol table.
    pub mangled: String,
    /// Runtime address of the first instruction.
    pub addr: usize,
    /// Size in bytes (never zero).
    pub size: usize,
    /// Path of the loaded object the function lives in.
    pub object: Arc<str>,
    /// ELF binding of the symbol.
    pub binding: Binding,
    /// True when the symbol was an `STT_GNU_IFUNC`. Such a symbol is listed
    /// at the implementation its resolver selected (what `dlsym` and every
    /// caller get), with that implementation's size: `addr` is ordinary,
    /// patchable code. The resolver itself is never listed.
    pub ifunc: bool,
}

impl Symbol {
    /// Whether `addr` lies inside this function.
    pub fn contains(&self, addr: usize) -> bool {
        addr >= self.addr && addr - self.addr < self.size
    }

    /// Short name of the object (its file name), as the kernel names modules.
    pub fn object_name(&self) -> &str {
        basename(&self.object)
    }
}

/// Where the symbols of one object came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SymbolSource {
    /// The object's own `.symtab`.
    Symtab,
    /// The object's `.dynsym` (the file is stripped and no debug file was found).
    Dynsym,
    /// The `.symtab` of a separate debug file found by build-id.
    DebugFile(Arc<str>),
    /// The image in memory (the vDSO, which has no file).
    Memory,
    /// Nothing usable (file missing or unreadable); the reason in words.
    Unavailable(String),
}

/// One object mapped into the process, as `dl_iterate_phdr` reported it.
#[derive(Debug, Clone)]
pub struct LoadedObject {
    /// Path on disk (the main executable's comes from `/proc/self/exe`).
    pub path: Arc<str>,
    /// Load bias: runtime address minus ELF virtual address.
    pub bias: usize,
    /// True for the main executable.
    pub is_main: bool,
    /// GNU build-id, when the file has one.
    pub build_id: Option<Vec<u8>>,
    /// Where the function symbols were read from.
    pub source: SymbolSource,
}

/// Flags of the kernel's `seq_print_ip_sym`, from the `sym-offset` and
/// `sym-addr` trace options.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SymFlags {
    /// Append `+0xoff/0xsize` (and ` [object]` outside the main executable).
    pub offset: bool,
    /// Append ` <0000address>`.
    pub addr: bool,
}

/// Immutable snapshot of all functions of all loaded objects, sorted by address.
#[derive(Debug)]
pub struct Inventory {
    functions: Vec<Symbol>,
    objects: Vec<LoadedObject>,
    /// Indices into `functions`, sorted by demangled name.
    by_name: Vec<u32>,
    /// Indices into `functions`, sorted by mangled name.
    by_mangled: Vec<u32>,
    generation: (u64, u64),
}

impl Inventory {
    /// All functions, sorted by address; aliases at one address are ordered
    /// with the preferred name first.
    pub fn functions(&self) -> &[Symbol] {
        &self.functions
    }

    /// The objects the snapshot was built from, in loader order (main first).
    pub fn objects(&self) -> &[LoadedObject] {
        &self.objects
    }

    /// The function containing `addr` and the offset of `addr` in it.
    ///
    /// Among aliases the preferred name wins (fewest leading underscores,
    /// then global over weak over local). No allocation, no lock.
    pub fn lookup(&self, addr: usize) -> Option<(&Symbol, usize)> {
        let end = self.functions.partition_point(|s| s.addr <= addr);
        // Look back over a few address groups: a function may be nested in a
        // larger one (e.g. an assembly routine with an inner global label).
        let mut groups = 0;
        let mut i = end;
        while i > 0 && groups < 8 {
            let group_addr = self.functions[i - 1].addr;
            let mut start = i - 1;
            while start > 0 && self.functions[start - 1].addr == group_addr {
                start -= 1;
            }
            if let Some(s) = self.functions[start..i].iter().find(|s| s.contains(addr)) {
                return Some((s, addr - s.addr));
            }
            i = start;
            groups += 1;
        }
        None
    }

    /// Every function `name` names, preferred first.
    ///
    /// A symbol table spells a versioned definition `name@@VERSION` (the default version,
    /// what new links and `dlsym` get) or `name@VERSION` (kept for old binaries); glibc has
    /// both for `pthread_cond_wait`, `realpath`, `clock_nanosleep`. So `name` is a symbol
    /// spec, as `dlsym`/`dlvsym` read one:
    ///
    /// * `name` (no `@`): the definitions spelled exactly so and the default version
    ///   `name@@VERSION`, as the linker and `dlsym` resolve `name`; when there are neither,
    ///   the other versions (a name kept only for old binaries is still that name).
    /// * `name@VERSION`: that version, whether or not it is the default one.
    /// * `name@@VERSION`: that version only if it is the default.
    ///
    /// A name with its version, as `available_filter_functions` lists it, is found by the
    /// exact rule. Exact matches come first, then by address.
    pub fn find(&self, name: &str) -> Vec<&Symbol> {
        fn add<'s>(rank: u8, s: &'s Symbol, out: &mut Vec<(u8, &'s Symbol)>) {
            match out.iter_mut().find(|(_, o)| std::ptr::eq(*o, s)) {
                Some(seen) => seen.0 = seen.0.min(rank),
                None => out.push((rank, s)),
            }
        }
        let mut out: Vec<(u8, &Symbol)> = Vec::new();
        for s in self.with_name(name) {
            add(0, s, &mut out);
        }
        match name.split_once('@') {
            None => {
                // Every `name@...`: the names sort right after `name@`, contiguously.
                let prefix = format!("{name}@");
                let versions = self.with_prefix(&prefix);
                let is_default = |s: &Symbol| {
                    [&s.name, &s.mangled]
                        .iter()
                        .any(|n| n.len() > prefix.len() && n[prefix.len()..].starts_with('@'))
                };
                for s in versions.iter().filter(|s| is_default(s)) {
                    add(1, s, &mut out);
                }
                if out.is_empty() {
                    for s in versions {
                        add(2, s, &mut out);
                    }
                }
            }
            Some((base, version)) if !version.starts_with('@') && !base.is_empty() => {
                // `name@VERSION` also names the default definition `name@@VERSION`.
                for s in self.with_name(&format!("{base}@@{version}")) {
                    add(1, s, &mut out);
                }
            }
            Some(_) => {}
        }
        out.sort_by_key(|(rank, s)| (*rank, s.addr));
        out.into_iter().map(|(_, s)| s).collect()
    }

    /// Functions whose demangled or mangled name is exactly `name`.
    fn with_name(&self, name: &str) -> Vec<&Symbol> {
        self.name_range(name, |key| key == name)
    }

    /// Functions whose demangled or mangled name starts with `prefix`.
    fn with_prefix(&self, prefix: &str) -> Vec<&Symbol> {
        self.name_range(prefix, |key| key.starts_with(prefix))
    }

    /// Both name indexes from the first key `>= start` for as long as `take` holds.
    fn name_range(&self, start: &str, take: impl Fn(&str) -> bool) -> Vec<&Symbol> {
        let mut out = Vec::new();
        for (index, key) in [
            (
                &self.by_name,
                (|s: &Symbol| s.name.as_str()) as fn(&Symbol) -> &str,
            ),
            (&self.by_mangled, |s: &Symbol| s.mangled.as_str()),
        ] {
            let first = index.partition_point(|&i| key(&self.functions[i as usize]) < start);
            out.extend(
                index[first..]
                    .iter()
                    .map(|&i| &self.functions[i as usize])
                    .take_while(|s| take(key(s))),
            );
        }
        out
    }

    /// Functions whose demangled or mangled name matches the ftrace filter
    /// glob `pattern` (`*`, `?`, `[..]`, `\` escapes), in address order.
    ///
    /// Aliases are collapsed: at most one symbol per address is returned (the
    /// first matching one in preference order), so a caller attaching a probe
    /// to each result attaches once per function.
    pub fn glob(&self, pattern: &str) -> Vec<&Symbol> {
        let pat = pattern.as_bytes();
        let mut out: Vec<&Symbol> = Vec::new();
        for s in &self.functions {
            if out.last().is_some_and(|l| l.addr == s.addr) {
                continue;
            }
            if glob_match(pat, s.name.as_bytes())
                || (s.mangled != s.name && glob_match(pat, s.mangled.as_bytes()))
            {
                out.push(s);
            }
        }
        out
    }

    /// ftrace's `pattern:mod:object` form: [`Inventory::glob`] restricted to
    /// objects whose file name (`libc.so.6`) or stem before `.so` (`libc`)
    /// matches the glob `object`. The main executable matches by its file name.
    pub fn glob_in_object(&self, pattern: &str, object: &str) -> Vec<&Symbol> {
        let obj_pat = object.as_bytes();
        self.glob(pattern)
            .into_iter()
            .filter(|s| {
                let base = s.object_name();
                let stem = base.split(".so").next().unwrap_or(base);
                glob_match(obj_pat, base.as_bytes()) || glob_match(obj_pat, stem.as_bytes())
            })
            .collect()
    }

    /// The kernel's `%pS`: `name+0x1a/0x40`, with ` [object]` appended for
    /// functions outside the main executable (as the kernel appends a module
    /// name); `0x<hex>` (unpadded, as `sprint_symbol`) when no function
    /// contains `addr`.
    pub fn format_sym_off(&self, addr: usize) -> String {
        let mut s = String::new();
        if self.lookup(addr).is_some() {
            self.write_sym(&mut s, addr, true);
        } else {
            let _ = write!(s, "{addr:#x}");
        }
        s
    }

    /// Appends the symbol of `addr` as `trace_seq_print_sym` does: with offset
    /// `name+0xoff/0xsize [object]`, without it just `name`; `0x%08lx` when unknown.
    pub fn write_sym(&self, out: &mut String, addr: usize, offset: bool) {
        match self.lookup(addr) {
            Some((sym, off)) if offset => {
                let _ = write!(out, "{}+{:#x}/{:#x}", sym.name, off, sym.size);
                if !self.is_main_object(&sym.object) {
                    let _ = write!(out, " [{}]", sym.object_name());
                }
            }
            Some((sym, _)) => out.push_str(&sym.name),
            None => {
                let _ = write!(out, "0x{addr:08x}");
            }
        }
    }

    /// Appends `addr` as the kernel's `seq_print_ip_sym` does: `0` for a null
    /// address, the symbol per [`Inventory::write_sym`], and ` <%016lx>` when
    /// `flags.addr`.
    pub fn write_ip_sym(&self, out: &mut String, addr: usize, flags: SymFlags) {
        if addr == 0 {
            out.push('0');
            return;
        }
        self.write_sym(out, addr, flags.offset);
        if flags.addr {
            let _ = write!(out, " <{addr:016x}>");
        }
    }

    /// Text of tracefs `available_filter_functions`: one function per line in
    /// [`Inventory::functions`] order (line N is `functions()[N-1]`, which is
    /// what writing an index into `set_ftrace_filter` refers to); functions
    /// outside the main executable carry ` [object]` as module functions do.
    pub fn available_filter_functions(&self) -> String {
        let mut out = String::with_capacity(self.functions.len() * 32);
        for s in &self.functions {
            out.push_str(&s.name);
            if !self.is_main_object(&s.object) {
                out.push_str(" [");
                out.push_str(s.object_name());
                out.push(']');
            }
            out.push('\n');
        }
        out
    }

    /// Text of tracefs `available_filter_functions_addrs`: `<hex addr> name` lines.
    pub fn available_filter_functions_addrs(&self) -> String {
        let mut out = String::with_capacity(self.functions.len() * 48);
        for s in &self.functions {
            let _ = write!(out, "{:x} {}", s.addr, s.name);
            if !self.is_main_object(&s.object) {
                let _ = write!(out, " [{}]", s.object_name());
            }
            out.push('\n');
        }
        out
    }

    /// The loader counters (`dlpi_adds`, `dlpi_subs`) this snapshot matches.
    pub fn generation(&self) -> (u64, u64) {
        self.generation
    }

    fn is_main_object(&self, path: &Arc<str>) -> bool {
        self.objects
            .first()
            .is_some_and(|o| o.is_main && Arc::ptr_eq(&o.path, path))
    }
}

/// Error building an inventory for a single file.
#[derive(Debug)]
pub struct SymbolError(String);

impl std::fmt::Display for SymbolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SymbolError {}

static CACHE: Mutex<Option<Arc<Inventory>>> = Mutex::new(None);

/// The current inventory: cached, rebuilt when objects were loaded or unloaded
/// since the cached one was built. Not for probe-hit paths (it takes the
/// loader lock briefly to read the counters); hold on to the returned `Arc`.
pub fn inventory() -> Arc<Inventory> {
    let started = std::time::Instant::now();
    loop {
        let generation = loader_generation();
        if let Some(inv) = cached(generation) {
            return inv;
        }
        // One builder at a time (building costs milliseconds), but never by
        // blocking: the build takes the loader's lock, and a library
        // constructor running under that lock may call inventory() itself;
        // waiting for BUILDING there could deadlock with the builder. So
        // poll, and after a while build without it.
        let guard = match BUILDING.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {
                if started.elapsed() < std::time::Duration::from_secs(1) {
                    std::thread::sleep(std::time::Duration::from_micros(500));
                    continue;
                }
                None
            }
        };
        if let Some(inv) = cached(loader_generation()) {
            return inv;
        }
        let inv = Arc::new(build_inventory());
        let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        let newer = cache.as_ref().is_none_or(|old| {
            old.generation.0 + old.generation.1 <= inv.generation.0 + inv.generation.1
        });
        if newer {
            *cache = Some(Arc::clone(&inv));
        }
        drop(guard);
        return inv;
    }
}

static BUILDING: Mutex<()> = Mutex::new(());

fn cached(generation: (u64, u64)) -> Option<Arc<Inventory>> {
    let cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    cache
        .as_ref()
        .filter(|inv| inv.generation == generation)
        .map(Arc::clone)
}

/// Builds a fresh inventory without consulting or updating the cache.
pub fn build_inventory() -> Inventory {
    let (generation, loaded) = loaded_objects();
    let mut functions = Vec::new();
    let mut objects = Vec::with_capacity(loaded.len());
    for (i, (name, bias)) in loaded.into_iter().enumerate() {
        let is_main = i == 0 && name.is_empty();
        let path: String = if is_main {
            match std::fs::read_link("/proc/self/exe") {
                Ok(p) => p.to_string_lossy().into_owned(),
                Err(_) => continue,
            }
        } else {
            name
        };
        if path.starts_with("linux-vdso") || path.starts_with("linux-gate") {
            let path: Arc<str> = Arc::from(path.as_str());
            let mut obj = LoadedObject {
                path,
                bias,
                is_main: false,
                build_id: None,
                source: SymbolSource::Memory,
            };
            if let Err(e) = read_vdso_functions(&obj, &mut functions) {
                obj.source = SymbolSource::Unavailable(e.to_string());
            }
            objects.push(obj);
            continue;
        }
        if path.is_empty() || !path.starts_with('/') {
            // Anything else without a file on disk.
            continue;
        }
        let path: Arc<str> = Arc::from(path.as_str());
        let mut obj = LoadedObject {
            path: Arc::clone(&path),
            bias,
            is_main,
            build_id: None,
            source: SymbolSource::Unavailable(String::new()),
        };
        if let Err(e) = read_object_functions(&mut obj, &mut functions) {
            obj.source = SymbolSource::Unavailable(e.to_string());
        }
        objects.push(obj);
    }
    sort_and_dedup(&mut functions);
    let by_name = sorted_index(&functions, |s| &s.name);
    let by_mangled = sorted_index(&functions, |s| &s.mangled);
    Inventory {
        functions,
        objects,
        by_name,
        by_mangled,
        generation,
    }
}

fn sorted_index(functions: &[Symbol], key: fn(&Symbol) -> &String) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..functions.len() as u32).collect();
    idx.sort_unstable_by(|&a, &b| key(&functions[a as usize]).cmp(key(&functions[b as usize])));
    idx
}

fn alias_rank(s: &Symbol) -> (usize, Binding, usize) {
    let underscores = s.mangled.bytes().take_while(|&b| b == b'_').count();
    (underscores, s.binding, s.name.len())
}

fn sort_and_dedup(functions: &mut Vec<Symbol>) {
    functions.sort_by(|a, b| {
        a.addr
            .cmp(&b.addr)
            .then_with(|| alias_rank(a).cmp(&alias_rank(b)))
            .then_with(|| a.mangled.cmp(&b.mangled))
    });
    functions.dedup_by(|b, a| a.addr == b.addr && a.mangled == b.mangled && a.object == b.object);
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Demangles a symbol name: Rust (legacy and v0) without the hash, C++ through
/// cpp_demangle; anything else is returned unchanged.
pub fn demangle(mangled: &str) -> String {
    let rusty = mangled.starts_with("_R")
        || ((mangled.starts_with("_ZN") || mangled.starts_with("__ZN")) && has_rust_hash(mangled));
    if rusty {
        if let Ok(d) = rustc_demangle::try_demangle(mangled) {
            return format!("{d:#}");
        }
    }
    if mangled.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(mangled.as_bytes()) {
            if let Ok(d) = sym.demangle() {
                return d;
            }
        }
    }
    mangled.to_string()
}

/// Legacy Rust symbols end their path with `17h<16 hex digits>E` (possibly
/// followed by a `.llvm.NNN`-style suffix); C++ names never do. The path itself may hold
/// dots (`<A as B>::f` is mangled with `..` for the `::` inside the angle brackets), so
/// the hash is looked for wherever a suffix could start, not only at the first dot.
fn has_rust_hash(mangled: &str) -> bool {
    let b = mangled.as_bytes();
    let hash_ends_at = |end: usize| {
        end >= 20
            && b[end - 1] == b'E'
            && &b[end - 20..end - 17] == b"17h"
            && b[end - 17..end - 1].iter().all(|c| c.is_ascii_hexdigit())
    };
    hash_ends_at(b.len()) || (0..b.len()).any(|i| b[i] == b'.' && hash_ends_at(i))
}

/// Reads the loader's add/sub counters, stopping after the first object.
fn loader_generation() -> (u64, u64) {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        size: usize,
        data: *mut c_void,
    ) -> libc::c_int {
        // SAFETY: the loader passes a valid info of `size` bytes; data is the
        // `(u64, u64)` the caller passed and outlives the iteration.
        unsafe {
            if size >= std::mem::size_of::<libc::dl_phdr_info>() {
                let out = &mut *(data as *mut (u64, u64));
                *out = ((*info).dlpi_adds, (*info).dlpi_subs);
            }
        }
        1
    }
    let mut gen = (0u64, 0u64);
    // SAFETY: the callback only writes through the pointer we pass here.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut gen as *mut _ as *mut c_void) };
    gen
}

type ObjectList = Vec<(String, usize)>;

/// All loaded objects as `(dlpi_name, dlpi_addr)`, plus the counters.
fn loaded_objects() -> ((u64, u64), ObjectList) {
    struct Acc {
        gen: (u64, u64),
        list: ObjectList,
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        size: usize,
        data: *mut c_void,
    ) -> libc::c_int {
        // SAFETY: the loader passes a valid info of `size` bytes whose name is
        // a NUL-terminated string (or null); data is our `Acc`.
        unsafe {
            let acc = &mut *(data as *mut Acc);
            let info = &*info;
            if size >= std::mem::size_of::<libc::dl_phdr_info>() && acc.list.is_empty() {
                acc.gen = (info.dlpi_adds, info.dlpi_subs);
            }
            let name = if info.dlpi_name.is_null() {
                String::new()
            } else {
                CStr::from_ptr(info.dlpi_name)
                    .to_string_lossy()
                    .into_owned()
            };
            acc.list.push((name, info.dlpi_addr as usize));
        }
        0
    }
    let mut acc = Acc {
        gen: (0, 0),
        list: Vec::new(),
    };
    // SAFETY: the callback only touches the accumulator we pass.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut acc as *mut Acc as *mut c_void) };
    (acc.gen, acc.list)
}

/// A read-only private mapping of a whole file.
pub(crate) struct Mapped {
    ptr: *mut c_void,
    len: usize,
}

impl Mapped {
    pub(crate) fn open(path: &str) -> std::io::Result<Mapped> {
        let file = std::fs::File::open(path)?;
        let len = file.metadata()?.len() as usize;
        if len == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "empty file",
            ));
        }
        use std::os::fd::AsRawFd;
        // SAFETY: mapping a regular file read-only; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapped { ptr, len })
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes and lives as long as self.
        // Files under /usr/lib and the executable are not truncated while in use.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `open` mapped.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// Path of the separate debug file for `build_id`, if installed.
pub fn debug_file_for_build_id(build_id: &[u8]) -> Option<String> {
    if build_id.len() < 2 {
        return None;
    }
    let hex: String = build_id.iter().map(|b| format!("{b:02x}")).collect();
    let path = format!("/usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..]);
    std::path::Path::new(&path).exists().then_some(path)
}

struct RawFunc<'a> {
    /// As the symbol table spells it; for `.dynsym`, with the version added the way a
    /// `.symtab` spells versioned definitions (see `spell_versions`).
    name: std::borrow::Cow<'a, [u8]>,
    value: u64,
    size: u64,
    binding: Binding,
    ifunc: bool,
    /// Index in its symbol table.
    index: usize,
}

fn elf_functions(data: &[u8], table: elf::SectionType) -> Result<Vec<RawFunc<'_>>, SymbolError> {
    let err = |e: object::Error| SymbolError(format!("bad elf: {e}"));
    let header = elf::FileHeader64::<Endianness>::parse(data).map_err(err)?;
    let endian = header.endian().map_err(err)?;
    let sections = header.sections(endian, data).map_err(err)?;
    let symbols = sections.symbols(endian, data, table).map_err(err)?;
    let strings = symbols.strings();
    let mut out = Vec::with_capacity(symbols.len() / 2);
    for (index, sym) in symbols.iter().enumerate() {
        let ty = sym.st_type();
        let ifunc = ty == elf::STT_GNU_IFUNC;
        if (ty != elf::STT_FUNC && !ifunc) || sym.is_undefined(endian) {
            continue;
        }
        let size = sym.st_size(endian);
        if size == 0 && !ifunc {
            continue;
        }
        let Ok(name) = sym.name(endian, strings) else {
            continue;
        };
        if name.is_empty() {
            continue;
        }
        let binding = match sym.st_bind() {
            elf::STB_LOCAL => Binding::Local,
            elf::STB_WEAK => Binding::Weak,
            _ => Binding::Global,
        };
        out.push(RawFunc {
            name: std::borrow::Cow::Borrowed(name),
            value: sym.st_value(endian),
            size,
            binding,
            ifunc,
            index,
        });
    }
    if table == elf::SHT_DYNSYM {
        if let Ok(Some(versions)) = sections.versions(endian, data) {
            spell_versions(&mut out, |index| {
                let versym = versions.version_index(endian, object::SymbolIndex(index));
                let version = versions.version(versym.index()).ok().flatten()?;
                Some((version.name(), versym.is_hidden()))
            });
        }
    }
    Ok(out)
}

/// Spells `.dynsym` definitions as a `.symtab` does: a `.dynsym` name carries no version,
/// its version lives in `.gnu.version`, so a stripped glibc has two functions called
/// `realpath`. A definition only old binaries can reach (a hidden version) becomes
/// `name@VERSION`; the default one becomes `name@@VERSION` when the name has other
/// versions, and stays `name` otherwise (as most of a `.symtab` reads). `version` gives a
/// symbol index's version name and whether it is hidden.
fn spell_versions<'a>(
    funcs: &mut [RawFunc<'a>],
    version: impl Fn(usize) -> Option<(&'a [u8], bool)>,
) {
    let versions: Vec<Option<(&[u8], bool)>> = funcs.iter().map(|f| version(f.index)).collect();
    let mut per_name: HashMap<&[u8], usize> = HashMap::new();
    for (f, v) in funcs.iter().zip(&versions) {
        if v.is_some() {
            *per_name.entry(&f.name[..]).or_default() += 1;
        }
    }
    let several: Vec<bool> = funcs
        .iter()
        .map(|f| per_name.get(&f.name[..]).is_some_and(|&n| n > 1))
        .collect();
    for ((f, v), several) in funcs.iter_mut().zip(versions).zip(several) {
        let Some((ver, hidden)) = v else {
            continue;
        };
        let sep: &[u8] = match (hidden, several) {
            (true, _) => b"@",
            (false, true) => b"@@",
            (false, false) => continue,
        };
        f.name = std::borrow::Cow::Owned([&f.name[..], sep, ver].concat());
    }
}

fn read_object_functions(obj: &mut LoadedObject, out: &mut Vec<Symbol>) -> Result<(), SymbolError> {
    let map = Mapped::open(&obj.path).map_err(|e| SymbolError(format!("{}: {e}", obj.path)))?;
    let data = map.bytes();
    let file = object::read::elf::ElfFile64::<Endianness>::parse(data)
        .map_err(|e| SymbolError(format!("{}: bad elf: {e}", obj.path)))?;
    obj.build_id = file.build_id().ok().flatten().map(|b| b.to_vec());
    let has_symtab = !file.elf_symbol_table().is_empty();

    // Keep the debug file mapped while its names are borrowed.
    let debug_map;
    let raw = if has_symtab {
        obj.source = SymbolSource::Symtab;
        elf_functions(data, elf::SHT_SYMTAB)?
    } else if let Some((dpath, dmap)) = obj
        .build_id
        .as_deref()
        .and_then(debug_file_for_build_id)
        .and_then(|p| Mapped::open(&p).ok().map(|m| (p, m)))
    {
        debug_map = dmap;
        match elf_functions(debug_map.bytes(), elf::SHT_SYMTAB) {
            Ok(r) if !r.is_empty() => {
                obj.source = SymbolSource::DebugFile(Arc::from(dpath.as_str()));
                r
            }
            _ => {
                obj.source = SymbolSource::Dynsym;
                elf_functions(data, elf::SHT_DYNSYM)?
            }
        }
    } else {
        obj.source = SymbolSource::Dynsym;
        elf_functions(data, elf::SHT_DYNSYM)?
    };

    let first_new = out.len();
    let mut ifuncs = Vec::new();
    let mut names: HashMap<&[u8], (String, String)> = HashMap::new();
    for f in &raw {
        if f.ifunc {
            ifuncs.push(f);
            continue;
        }
        let (mangled, name) = names
            .entry(&f.name[..])
            .or_insert_with(|| {
                let m = String::from_utf8_lossy(&f.name).into_owned();
                let d = demangle(&m);
                (m, d)
            })
            .clone();
        out.push(Symbol {
            name,
            mangled,
            addr: (f.value as usize).wrapping_add(obj.bias),
            size: f.size as usize,
            object: Arc::clone(&obj.path),
            binding: f.binding,
            ifunc: false,
        });
    }
    if !ifuncs.is_empty() {
        resolve_ifuncs(obj, &file, &ifuncs, out, first_new);
    }
    Ok(())
}

/// The vDSO's functions, parsed from the image the kernel mapped (copied out
/// with fault-safe reads, its extent taken from its own ELF header).
fn read_vdso_functions(obj: &LoadedObject, out: &mut Vec<Symbol>) -> Result<(), SymbolError> {
    // SAFETY: getauxval has no preconditions.
    let base = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) } as usize;
    if base == 0 {
        return Err(SymbolError("no vdso (AT_SYSINFO_EHDR is 0)".into()));
    }
    let fault = |e: crate::uaccess::Fault| SymbolError(format!("vdso: {e}"));
    let mut ehdr = [0u8; 64];
    crate::uaccess::read(base, &mut ehdr).map_err(fault)?;
    if &ehdr[..4] != b"\x7fELF" || ehdr[4] != 2 {
        return Err(SymbolError("vdso: not a 64-bit elf image".into()));
    }
    let u16_at = |o: usize| u16::from_le_bytes([ehdr[o], ehdr[o + 1]]) as usize;
    let shoff = u64::from_le_bytes(ehdr[0x28..0x30].try_into().unwrap_or([0; 8])) as usize;
    let len = shoff + u16_at(0x3a) * u16_at(0x3c);
    if len == 0 || len > 1 << 20 {
        return Err(SymbolError(format!("vdso: implausible image size {len}")));
    }
    let mut image = vec![0u8; len];
    crate::uaccess::read(base, &mut image).map_err(fault)?;
    let mut raw = elf_functions(&image, elf::SHT_SYMTAB)?;
    if raw.is_empty() {
        raw = elf_functions(&image, elf::SHT_DYNSYM)?;
    }
    for f in raw.iter().filter(|f| !f.ifunc) {
        let mangled = String::from_utf8_lossy(&f.name).into_owned();
        out.push(Symbol {
            name: demangle(&mangled),
            mangled,
            addr: (f.value as usize).wrapping_add(obj.bias),
            size: f.size as usize,
            object: Arc::clone(&obj.path),
            binding: f.binding,
            ifunc: false,
        });
    }
    Ok(())
}

/// Lists each IFUNC at the function the dynamic linker chose for it.
fn resolve_ifuncs(
    obj: &LoadedObject,
    file: &object::read::elf::ElfFile64<'_, Endianness>,
    ifuncs: &[&RawFunc<'_>],
    out: &mut Vec<Symbol>,
    first_new: usize,
) {
    let Some(handle) = DlHandle::open_loaded(if obj.is_main { None } else { Some(&obj.path) })
    else {
        return;
    };
    // Symbols of this object sorted by address, to size resolved targets.
    let mut own: Vec<(usize, usize)> = out[first_new..].iter().map(|s| (s.addr, s.size)).collect();
    own.sort_unstable();
    let unwind = EhFrameSizes::new(file);
    for f in ifuncs {
        if f.binding == Binding::Local {
            continue; // not reachable through dlsym
        }
        let Some(target) = handle.sym_spec(&f.name) else {
            continue;
        };
        let exact = own
            .binary_search_by_key(&target, |&(a, _)| a)
            .ok()
            .map(|i| own[i].1);
        let size = exact.or_else(|| {
            unwind
                .as_ref()
                .and_then(|u| u.function_at(target.wrapping_sub(obj.bias) as u64))
                .map(|(start, len)| {
                    (start as usize + obj.bias + len as usize).saturating_sub(target)
                })
        });
        let Some(size) = size.filter(|&s| s > 0) else {
            continue;
        };
        let mangled = String::from_utf8_lossy(&f.name).into_owned();
        out.push(Symbol {
            name: demangle(&mangled),
            mangled,
            addr: target,
            size,
            object: Arc::clone(&obj.path),
            binding: f.binding,
            ifunc: true,
        });
    }
}

/// A `dlopen(RTLD_NOLOAD)` handle to an object that is already loaded.
struct DlHandle(*mut c_void);

impl DlHandle {
    fn open_loaded(path: Option<&str>) -> Option<DlHandle> {
        let c = match path {
            Some(p) => Some(CString::new(p).ok()?),
            None => None,
        };
        let ptr = c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        // SAFETY: RTLD_NOLOAD never loads anything new (so no constructors
        // run); it only takes a reference on an object already mapped.
        let h = unsafe { libc::dlopen(ptr, libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        (!h.is_null()).then_some(DlHandle(h))
    }

    fn sym(&self, name: &CStr) -> Option<usize> {
        // SAFETY: valid handle and NUL-terminated name; for an IFUNC dlsym
        // returns the resolver's choice, which is what callers reach.
        let p = unsafe { libc::dlsym(self.0, name.as_ptr()) };
        (!p.is_null()).then_some(p as usize)
    }

    /// A symbol as a symbol table spells it: `name`, or a versioned `name@VERSION` /
    /// `name@@VERSION` (glibc's `memcpy@@GLIBC_2.14` is an IFUNC), which dlsym does not
    /// know but dlvsym does.
    fn sym_spec(&self, spelled: &[u8]) -> Option<usize> {
        let Some(at) = spelled.iter().position(|&b| b == b'@') else {
            return self.sym(&CString::new(spelled).ok()?);
        };
        let name = CString::new(&spelled[..at]).ok()?;
        let version = spelled[at + 1..]
            .strip_prefix(b"@")
            .unwrap_or(&spelled[at + 1..]);
        let version = CString::new(version).ok()?;
        // SAFETY: valid handle and NUL-terminated name and version; as for dlsym, an
        // IFUNC gives the resolver's choice.
        let p = unsafe { libc::dlvsym(self.0, name.as_ptr(), version.as_ptr()) };
        (!p.is_null()).then_some(p as usize)
    }
}

impl Drop for DlHandle {
    fn drop(&mut self) {
        // SAFETY: balances the reference taken by dlopen.
        unsafe { libc::dlclose(self.0) };
    }
}

/// Function extents from `.eh_frame_hdr`'s search table (file addresses).
struct EhFrameSizes<'a> {
    hdr: gimli::ParsedEhFrameHdr<gimli::EndianSlice<'a, gimli::LittleEndian>>,
    frame: gimli::EhFrame<gimli::EndianSlice<'a, gimli::LittleEndian>>,
    bases: gimli::BaseAddresses,
}

impl<'a> EhFrameSizes<'a> {
    fn new(file: &object::read::elf::ElfFile64<'a, Endianness>) -> Option<Self> {
        let hdr_sec = file.section_by_name(".eh_frame_hdr")?;
        let frame_sec = file.section_by_name(".eh_frame")?;
        let text = file.section_by_name(".text").map_or(0, |s| s.address());
        let bases = gimli::BaseAddresses::default()
            .set_eh_frame_hdr(hdr_sec.address())
            .set_eh_frame(frame_sec.address())
            .set_text(text);
        let hdr_data = hdr_sec.data().ok()?;
        let frame_data = frame_sec.data().ok()?;
        let hdr = gimli::EhFrameHdr::new(hdr_data, gimli::LittleEndian)
            .parse(&bases, 8)
            .ok()?;
        let frame = gimli::EhFrame::new(frame_data, gimli::LittleEndian);
        Some(EhFrameSizes { hdr, frame, bases })
    }

    fn function_at(&self, file_addr: u64) -> Option<(u64, u64)> {
        let table = self.hdr.table()?;
        let fde = table
            .fde_for_address(
                &self.frame,
                &self.bases,
                file_addr,
                <gimli::EhFrame<_> as gimli::UnwindSection<_>>::cie_from_offset,
            )
            .ok()?;
        Some((fde.initial_address(), fde.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles_rust_legacy_without_hash() {
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
    }

    #[test]
    fn demangles_rust_legacy_trait_impls_whose_paths_hold_dots() {
        // `<ustrace::Inter as ustrace::HistHooks>::after_update`, with and without a suffix.
        let m = "_ZN67_$LT$ustrace..stage..Inter$u20$as$u20$ustrace..stage..HistHooks$GT$\
                 12after_update17hd111912c7f946886E";
        let want = "<ustrace::stage::Inter as ustrace::stage::HistHooks>::after_update";
        assert_eq!(demangle(m), want);
        assert_eq!(demangle(&format!("{m}.llvm.123")), want);
    }

    #[test]
    fn demangles_rust_v0() {
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo"), "mycrate::foo");
    }

    #[test]
    fn demangles_cpp() {
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(
            demangle("_ZNSt6vectorIiSaIiEE9push_backERKi"),
            "std::vector<int, std::allocator<int> >::push_back(int const&)"
        );
    }

    #[test]
    fn leaves_c_names() {
        assert_eq!(demangle("strlen"), "strlen");
        assert_eq!(demangle("_Z!bad"), "_Z!bad");
    }

    fn sym(name: &str, addr: usize, size: usize, obj: &Arc<str>) -> Symbol {
        Symbol {
            name: name.into(),
            mangled: name.into(),
            addr,
            size,
            object: Arc::clone(obj),
            binding: Binding::Global,
            ifunc: false,
        }
    }

    fn synthetic() -> Inventory {
        let main: Arc<str> = Arc::from("/bin/prog");
        let lib: Arc<str> = Arc::from("/lib/libx.so.1");
        let mut functions = vec![
            sym("b", 0x2000, 0x10, &main),
            sym("__a", 0x1000, 0x40, &main),
            sym("a", 0x1000, 0x40, &main),
            sym("inner", 0x1010, 0x8, &main),
            sym("libfn", 0x9000, 0x20, &lib),
        ];
        sort_and_dedup(&mut functions);
        let by_name = sorted_index(&functions, |s| &s.name);
        let by_mangled = sorted_index(&functions, |s| &s.mangled);
        Inventory {
            functions,
            objects: vec![LoadedObject {
                path: main,
                bias: 0,
                is_main: true,
                build_id: None,
                source: SymbolSource::Symtab,
            }],
            by_name,
            by_mangled,
            generation: (0, 0),
        }
    }

    #[test]
    fn lookup_prefers_plain_alias_and_handles_nesting() {
        let inv = synthetic();
        assert_eq!(inv.format_sym_off(0x1000), "a+0x0/0x40");
        assert_eq!(inv.format_sym_off(0x1012), "inner+0x2/0x8");
        // Past the nested symbol but still inside the outer one.
        assert_eq!(inv.format_sym_off(0x1020), "a+0x20/0x40");
        assert_eq!(inv.format_sym_off(0x1040), "0x1040");
        let mut padded = String::new();
        inv.write_sym(&mut padded, 0x1040, true);
        assert_eq!(padded, "0x00001040");
        assert_eq!(inv.format_sym_off(0x9004), "libfn+0x4/0x20 [libx.so.1]");
        let mut s = String::new();
        inv.write_ip_sym(
            &mut s,
            0x9004,
            SymFlags {
                offset: false,
                addr: true,
            },
        );
        assert_eq!(s, "libfn <0000000000009004>");
        s.clear();
        inv.write_ip_sym(&mut s, 0, SymFlags::default());
        assert_eq!(s, "0");
    }

    fn versioned() -> Inventory {
        let lib: Arc<str> = Arc::from("/lib/libc.so.6");
        let mut functions = vec![
            sym("cond_wait@GLIBC_2.2.5", 0x1000, 0x10, &lib),
            sym("cond_wait@@GLIBC_2.3.2", 0x2000, 0x10, &lib),
            sym("nanosleep@GLIBC_2.2.5", 0x3000, 0x10, &lib),
            sym("nanosleep@@GLIBC_2.17", 0x3000, 0x10, &lib),
            sym("cond_wait_x", 0x4000, 0x10, &lib),
            sym("plain", 0x5000, 0x10, &lib),
            sym("compat_only@GLIBC_2.2.5", 0x6000, 0x10, &lib),
            sym("compat_only@GLIBC_2.3", 0x7000, 0x10, &lib),
        ];
        sort_and_dedup(&mut functions);
        let by_name = sorted_index(&functions, |s| &s.name);
        let by_mangled = sorted_index(&functions, |s| &s.mangled);
        Inventory {
            functions,
            objects: Vec::new(),
            by_name,
            by_mangled,
            generation: (0, 0),
        }
    }

    #[test]
    fn find_reads_symbol_versions() {
        let inv = versioned();
        let addrs = |spec: &str| -> Vec<usize> { inv.find(spec).iter().map(|s| s.addr).collect() };
        // A bare name: the default version, as dlsym resolves it; not `cond_wait_x`.
        assert_eq!(addrs("cond_wait"), [0x2000]);
        assert_eq!(
            inv.find("nanosleep")
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>(),
            ["nanosleep@@GLIBC_2.17"]
        );
        // Only old versions: still found by the bare name.
        assert_eq!(addrs("compat_only"), [0x6000, 0x7000]);
        // Names as listed, and `name@VERSION` for a default version.
        assert_eq!(addrs("cond_wait@@GLIBC_2.3.2"), [0x2000]);
        assert_eq!(addrs("cond_wait@GLIBC_2.2.5"), [0x1000]);
        assert_eq!(addrs("cond_wait@GLIBC_2.3.2"), [0x2000]);
        // `@@` names the default version only.
        assert!(inv.find("cond_wait@@GLIBC_2.2.5").is_empty());
        assert!(inv.find("cond_wait@GLIBC_9").is_empty());
        assert!(inv.find("cond_wai").is_empty());
        assert!(inv.find("@GLIBC_2.2.5").is_empty());
        assert_eq!(addrs("plain"), [0x5000]);
    }

    #[test]
    fn glob_collapses_aliases_and_find_sees_them() {
        let inv = synthetic();
        let names: Vec<_> = inv.glob("*a").iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a"]);
        assert_eq!(inv.find("__a").len(), 1);
        assert_eq!(inv.find("nope").len(), 0);
        assert_eq!(
            inv.available_filter_functions(),
            "a\n__a\ninner\nb\nlibfn [libx.so.1]\n"
        );
    }
}
