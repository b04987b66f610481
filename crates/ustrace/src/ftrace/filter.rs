//! The function-set files: `set_ftrace_filter`, `set_ftrace_notrace`, `set_graph_function`
//! and `set_graph_notrace` (ftrace.rst, "dynamic ftrace").
//!
//! Their text is resolved against the process's functions — what
//! `available_filter_functions` lists, the symbol inventory of every loaded object — into a
//! [`FunctionSet`] of addresses. The function tracers read the sets (through
//! [`selected`]) to decide what to patch, and are told when a set changes
//! ([`subscribe`]); nothing here runs on the record path.
//!
//! ```text
//!   open(O_TRUNC?) ── working copy (empty when truncating) ──┐
//!   write(2)*      ── words (whitespace separated, a word may  │ glob / index / !glob /
//!                     continue into the next write)           │ func:cmd[:param]
//!   close          ── commit: publish the set, notify ────────┘
//! ```
//!
//! As on the kernel, a write's words act on the working copy one by one and the copy is
//! committed when the file is closed: a bad word fails that write (`EINVAL`) but the words
//! before it stay. A word is:
//!
//! - a glob (`*`, `?`, `[..]`, `\`) matched against every function name (demangled or as the
//!   symbol table spells it); `!glob` removes what it matches. A glob that matches nothing
//!   is `EINVAL`.
//! - a decimal index: the N-th line of `available_filter_functions` (from 1).
//! - `glob:mod:OBJECT`: the glob within the loaded objects whose file name (`libc.so.6`) or
//!   stem (`libc`) matches `OBJECT`; the main executable is the kernel's core (no module):
//!   `:mod:` alone names every library function, `:mod:!` the executable's. An object that
//!   is not loaded is remembered (listed as `glob:mod:OBJECT`) and applied when it is.
//! - `glob:command[:param]`: handed to the command registered under that name
//!   ([`register_command`]: `traceon`, `stacktrace`, ... live elsewhere); an unknown command
//!   is `EINVAL`. `mod` is built in, a registered `mod` takes its place.
//!
//! The graph files take globs and `!glob` only (no index, no command), and `!glob` of a
//! function that is not in the set is `EINVAL`, as the kernel's `ftrace_graph_set_hash`.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use ustrace_ctl::vfs::{Errno, OpenFile, OpenFlags};
use ustrace_inspect::symbols::{glob_match, Inventory, Symbol};

use crate::trace::Instance;

/// Which of the four files a set belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SetKind {
    /// `set_ftrace_filter`: only these functions are traced (all when empty).
    Filter,
    /// `set_ftrace_notrace`: these functions are never traced.
    Notrace,
    /// `set_graph_function`: the graph tracer records these functions and their callees.
    Graph,
    /// `set_graph_notrace`: the graph tracer records neither these nor their callees.
    GraphNotrace,
}

impl SetKind {
    /// Every kind, in index order.
    pub const ALL: [SetKind; 4] = [
        SetKind::Filter,
        SetKind::Notrace,
        SetKind::Graph,
        SetKind::GraphNotrace,
    ];

    /// The tracefs file of this set.
    pub fn file_name(self) -> &'static str {
        match self {
            SetKind::Filter => "set_ftrace_filter",
            SetKind::Notrace => "set_ftrace_notrace",
            SetKind::Graph => "set_graph_function",
            SetKind::GraphNotrace => "set_graph_notrace",
        }
    }

    /// The kind whose file is `name`.
    pub fn from_file_name(name: &str) -> Option<SetKind> {
        SetKind::ALL.into_iter().find(|k| k.file_name() == name)
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The line an empty set reads as.
    fn empty_text(self) -> &'static str {
        match self {
            SetKind::Filter | SetKind::Graph => "#### all functions enabled ####\n",
            SetKind::Notrace | SetKind::GraphNotrace => "#### no functions disabled ####\n",
        }
    }

    /// Whether the file takes `glob:command` words and indices (the `ftrace_regex` files).
    fn takes_commands(self) -> bool {
        matches!(self, SetKind::Filter | SetKind::Notrace)
    }
}

/// A set of functions, by entry address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FunctionSet {
    addrs: BTreeSet<usize>,
}

impl FunctionSet {
    /// An empty set.
    pub fn new() -> FunctionSet {
        FunctionSet::default()
    }

    /// Whether `addr` (a function's entry) is in the set.
    pub fn contains(&self, addr: usize) -> bool {
        self.addrs.contains(&addr)
    }

    /// Number of functions.
    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    /// Whether the set is empty (for `set_ftrace_filter`: every function).
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// The addresses, ascending.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.addrs.iter().copied()
    }

    /// Adds a function; true when it was not there.
    pub fn insert(&mut self, addr: usize) -> bool {
        self.addrs.insert(addr)
    }

    /// Removes a function; true when it was there.
    pub fn remove(&mut self, addr: usize) -> bool {
        self.addrs.remove(&addr)
    }

    /// Removes every function.
    pub fn clear(&mut self) {
        self.addrs.clear()
    }
}

impl FromIterator<usize> for FunctionSet {
    fn from_iter<T: IntoIterator<Item = usize>>(iter: T) -> Self {
        FunctionSet {
            addrs: iter.into_iter().collect(),
        }
    }
}

/// One `glob:command[:param]` word, as a [`FunctionCommand`] receives it.
pub struct CommandCall<'a> {
    /// The instance whose file was written.
    pub instance: &'a Arc<Instance>,
    /// `Filter` or `Notrace` (the kernel's `enable` 1 or 0).
    pub kind: SetKind,
    /// The glob before the first `:`, with its `!` if it had one.
    pub glob: &'a str,
    /// The command's name.
    pub command: &'a str,
    /// What follows `command:`, if anything.
    pub param: Option<&'a str>,
    /// The working copy of the set being written (the `mod` command adds to it).
    pub set: &'a mut FunctionSet,
}

impl CommandCall<'_> {
    /// The functions `glob` (without a leading `!`) names, in address order, with their
    /// preferred symbol: what a command attaches to. Empty when nothing matches.
    pub fn matching(&self) -> Vec<(usize, String)> {
        let inv = ustrace_inspect::symbols::inventory();
        let glob = self.glob.strip_prefix('!').unwrap_or(self.glob);
        let mut out = Vec::new();
        for addr in match_glob(&inv, glob, None).unwrap_or_default() {
            let name = inv
                .lookup(addr)
                .map_or_else(|| format!("{addr:#x}"), |(s, _)| s.name.clone());
            out.push((addr, name));
        }
        out
    }
}

/// A function command of `set_ftrace_filter` (`traceon`, `stacktrace`, `enable_event`, ...):
/// the kernel's `struct ftrace_func_command`.
pub trait FunctionCommand: Send + Sync {
    /// Runs one `glob:command[:param]` word. An error fails the write with that errno.
    fn apply(&self, call: &mut CommandCall<'_>) -> Result<(), Errno>;
    /// Lines `set_ftrace_filter` of `instance` shows for this command after its functions
    /// (the kernel's probe listing), each ending in a newline.
    fn listing(&self, _instance: &Arc<Instance>) -> String {
        String::new()
    }
    /// A truncating open of `set_ftrace_filter` of `instance` (the kernel keeps function
    /// probes then; a command may drop its own state).
    fn on_truncate(&self, _instance: &Arc<Instance>) {}
}

type CommandTable = RwLock<Vec<(String, Arc<dyn FunctionCommand>)>>;

fn commands() -> &'static CommandTable {
    static COMMANDS: OnceLock<CommandTable> = OnceLock::new();
    COMMANDS.get_or_init(|| RwLock::new(Vec::new()))
}

/// Registers `command` under `name` for `glob:name[:param]` words (the kernel's
/// `register_ftrace_command`). `EBUSY` when the name is taken, as the kernel answers.
pub fn register_command(name: &str, command: Arc<dyn FunctionCommand>) -> Result<(), Errno> {
    let mut table = commands().write().unwrap_or_else(|e| e.into_inner());
    if table.iter().any(|(n, _)| n == name) {
        return Err(Errno(libc::EBUSY));
    }
    table.push((name.to_string(), command));
    Ok(())
}

/// Removes the command `name` (the kernel's `unregister_ftrace_command`); `ENODEV` when no
/// such command is registered.
pub fn unregister_command(name: &str) -> Result<(), Errno> {
    let mut table = commands().write().unwrap_or_else(|e| e.into_inner());
    let before = table.len();
    table.retain(|(n, _)| n != name);
    if table.len() == before {
        return Err(Errno(libc::ENODEV));
    }
    Ok(())
}

fn command(name: &str) -> Option<Arc<dyn FunctionCommand>> {
    let table = commands().read().unwrap_or_else(|e| e.into_inner());
    table
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, c)| c.clone())
}

/// A `glob:mod:OBJECT` word whose object is not loaded yet.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CachedMod {
    kind: SetKind,
    glob: String,
    module: String,
}

/// Called after a set of an instance changed.
pub type Listener = Arc<dyn Fn(&Arc<Instance>, SetKind) + Send + Sync>;

/// The four sets of one instance.
pub struct Sets {
    sets: [RwLock<Arc<FunctionSet>>; 4],
    cached_mods: Mutex<Vec<CachedMod>>,
    listeners: Mutex<Vec<Listener>>,
    /// Held from a writer's open to its close, as the kernel's `regex_lock` is held per
    /// commit; commits of one set are serialised.
    commit: Mutex<()>,
}

impl Default for Sets {
    fn default() -> Self {
        Sets {
            sets: std::array::from_fn(|_| RwLock::new(Arc::new(FunctionSet::new()))),
            cached_mods: Mutex::new(Vec::new()),
            listeners: Mutex::new(Vec::new()),
            commit: Mutex::new(()),
        }
    }
}

impl Sets {
    fn get(&self, kind: SetKind) -> Arc<FunctionSet> {
        self.sets[kind.index()]
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn publish(&self, kind: SetKind, set: FunctionSet) -> bool {
        let mut slot = self.sets[kind.index()]
            .write()
            .unwrap_or_else(|e| e.into_inner());
        if **slot == set {
            return false;
        }
        *slot = Arc::new(set);
        true
    }
}

/// The sets of `instance`.
fn sets_of(instance: &Arc<Instance>) -> Arc<Sets> {
    super::state(instance).sets.clone()
}

/// The functions `set_ftrace_filter` (or another set) of `instance` selects now.
pub fn selected(instance: &Arc<Instance>, kind: SetKind) -> Arc<FunctionSet> {
    sets_of(instance).get(kind)
}

/// Calls `listener` after every change of a set of `instance` (after the writer closed the
/// file, or a cached `:mod:` was applied), on the thread that made it.
pub fn subscribe(instance: &Arc<Instance>, listener: Listener) {
    sets_of(instance)
        .listeners
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(listener);
}

/// Replaces a set of `instance` from Rust (as a truncating write, then close, would) and
/// notifies the listeners when it changed.
pub fn set(instance: &Arc<Instance>, kind: SetKind, set: FunctionSet) {
    let sets = sets_of(instance);
    let _commit = sets.commit.lock().unwrap_or_else(|e| e.into_inner());
    if sets.publish(kind, set) {
        notify(instance, &sets, kind);
    }
}

fn notify(instance: &Arc<Instance>, sets: &Sets, kind: SetKind) {
    super::tracer::sets_changed(instance, kind);
    let listeners: Vec<Listener> = sets
        .listeners
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    for l in listeners {
        l(instance, kind);
    }
}

/// Applies remembered `glob:mod:OBJECT` words whose object is loaded now (after `dlopen`).
/// Returns whether a set changed.
pub fn apply_cached_mods(instance: &Arc<Instance>) -> bool {
    let sets = sets_of(instance);
    let inv = ustrace_inspect::symbols::inventory();
    let mut changed = Vec::new();
    {
        let _commit = sets.commit.lock().unwrap_or_else(|e| e.into_inner());
        let mut cached = sets.cached_mods.lock().unwrap_or_else(|e| e.into_inner());
        let mut keep = Vec::new();
        for c in cached.drain(..) {
            if !module_loaded(&inv, &c.module) {
                keep.push(c);
                continue;
            }
            let mut set = (*sets.get(c.kind)).clone();
            if let Ok(addrs) = match_glob(&inv, &c.glob, Some(&c.module)) {
                for a in addrs {
                    set.insert(a);
                }
            }
            if sets.publish(c.kind, set) && !changed.contains(&c.kind) {
                changed.push(c.kind);
            }
        }
        *cached = keep;
    }
    for kind in &changed {
        notify(instance, &sets, *kind);
    }
    !changed.is_empty()
}

/// The text a read of the set's file shows: the functions in `available_filter_functions`
/// order (address order), `name [object]` for library functions; then, for
/// `set_ftrace_filter`, the commands' lines; the remembered `:mod:` words last.
pub fn listing(instance: &Arc<Instance>, kind: SetKind) -> String {
    let sets = sets_of(instance);
    let set = sets.get(kind);
    listing_of(instance, &sets, kind, &set)
}

fn listing_of(instance: &Arc<Instance>, sets: &Sets, kind: SetKind, set: &FunctionSet) -> String {
    let mut out = String::new();
    if set.is_empty() {
        out.push_str(kind.empty_text());
    } else {
        let inv = ustrace_inspect::symbols::inventory();
        for addr in set.iter() {
            write_function(&inv, addr, &mut out);
        }
    }
    if kind == SetKind::Filter {
        let table: Vec<Arc<dyn FunctionCommand>> = commands()
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(_, c)| c.clone())
            .collect();
        for c in table {
            out.push_str(&c.listing(instance));
        }
    }
    for c in sets
        .cached_mods
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|c| c.kind == kind)
    {
        out.push_str(&format!("{}:mod:{}\n", c.glob, c.module));
    }
    out
}

/// `name` or `name [object]`, as `available_filter_functions` spells the function at `addr`.
pub fn write_function(inv: &Inventory, addr: usize, out: &mut String) {
    match inv.lookup(addr) {
        Some((s, _)) => {
            out.push_str(&s.name);
            if !is_main(inv, s) {
                out.push_str(" [");
                out.push_str(s.object_name());
                out.push(']');
            }
        }
        None => out.push_str(&format!("{addr:#x}")),
    }
    out.push('\n');
}

fn is_main(inv: &Inventory, s: &Symbol) -> bool {
    inv.objects()
        .first()
        .is_some_and(|o| o.is_main && Arc::ptr_eq(&o.path, &s.object))
}

/// Whether a loaded object's name matches the module glob `module`.
fn object_matches(inv: &Inventory, s: &Symbol, module: &str) -> bool {
    if is_main(inv, s) {
        return false;
    }
    let base = s.object_name();
    let stem = base.split(".so").next().unwrap_or(base);
    glob_match(module.as_bytes(), base.as_bytes()) || glob_match(module.as_bytes(), stem.as_bytes())
}

fn module_loaded(inv: &Inventory, module: &str) -> bool {
    let module = module.strip_prefix('!').unwrap_or(module);
    inv.objects().iter().skip(1).any(|o| {
        let base = o.path.rsplit('/').next().unwrap_or(&o.path);
        let stem = base.split(".so").next().unwrap_or(base);
        glob_match(module.as_bytes(), base.as_bytes())
            || glob_match(module.as_bytes(), stem.as_bytes())
    })
}

/// The addresses `glob` (no `!`) names, restricted by a `:mod:` module glob if given (the
/// kernel's `ftrace_match_record`). `Err` when the glob is an index out of range.
fn match_glob(inv: &Inventory, glob: &str, module: Option<&str>) -> Result<Vec<usize>, ()> {
    let mut out: Vec<usize> = Vec::new();
    let Some(module) = module else {
        return Ok(inv.glob(glob).into_iter().map(|s| s.addr).collect());
    };
    let (exclude, module) = match module.strip_prefix('!') {
        Some(m) => (true, m),
        None => (false, module),
    };
    for s in inv.functions() {
        if out.last() == Some(&s.addr) {
            continue;
        }
        let in_module = if module.is_empty() {
            // A blank module: every library function, or with `!` the executable's.
            !is_main(inv, s)
        } else {
            object_matches(inv, s, module)
        };
        if in_module == exclude {
            continue;
        }
        if glob.is_empty()
            || glob_match(glob.as_bytes(), s.name.as_bytes())
            || (s.mangled != s.name && glob_match(glob.as_bytes(), s.mangled.as_bytes()))
        {
            out.push(s.addr);
        }
    }
    Ok(out)
}

/// The function on line `index` (from 1) of `available_filter_functions`.
fn by_index(inv: &Inventory, index: &str) -> Option<usize> {
    let n: usize = index.parse().ok()?;
    inv.functions().get(n.checked_sub(1)?).map(|s| s.addr)
}

/// Applies one word to `set` (the kernel's `ftrace_process_regex`, or `ftrace_graph_set_hash`
/// for the graph files).
fn process_word(
    instance: &Arc<Instance>,
    sets: &Sets,
    kind: SetKind,
    set: &mut FunctionSet,
    word: &str,
) -> Result<(), Errno> {
    let inv = ustrace_inspect::symbols::inventory();
    if !kind.takes_commands() {
        let (remove, glob) = match word.strip_prefix('!') {
            Some(g) => (true, g),
            None => (false, word),
        };
        let mut hit = false;
        for addr in match_glob(&inv, glob, None).unwrap_or_default() {
            if remove {
                hit |= set.remove(addr);
            } else {
                set.insert(addr);
                hit = true;
            }
        }
        return if hit { Ok(()) } else { Err(Errno::EINVAL) };
    }
    let Some((glob, rest)) = split_lone_colon(word) else {
        return match_into(&inv, set, word, None).map(|_| ());
    };
    let (name, param) = match split_lone_colon(rest) {
        Some((n, p)) => (n, Some(p)),
        None => (rest, None),
    };
    if let Some(cmd) = command(name) {
        let mut call = CommandCall {
            instance,
            kind,
            glob,
            command: name,
            param,
            set,
        };
        return cmd.apply(&mut call);
    }
    if name != "mod" {
        return Err(Errno::EINVAL);
    }
    let module = param.unwrap_or("");
    if match_into(&inv, set, glob, Some(module)).is_ok() {
        return Ok(());
    }
    // Nothing matched: remember it for an object not loaded yet (the kernel's cache_mod).
    let mut cached = sets.cached_mods.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(plain) = glob.strip_prefix('!') {
        let before = cached.len();
        cached.retain(|c| {
            !(c.kind == kind && c.module == module && (plain == "*" || c.glob == plain))
        });
        return if cached.len() < before {
            Ok(())
        } else {
            Err(Errno::EINVAL)
        };
    }
    if module.is_empty() || module_loaded(&inv, module) {
        return Err(Errno::EINVAL);
    }
    let entry = CachedMod {
        kind,
        glob: glob.to_string(),
        module: module.to_string(),
    };
    if !cached.contains(&entry) {
        cached.push(entry);
    }
    Ok(())
}

/// Splits at the first `:` that is not half of a `::`: Rust and C++ names are paths
/// (`my_crate::parse`), and only a lone colon starts a command (`parse:traceoff`).
fn split_lone_colon(word: &str) -> Option<(&str, &str)> {
    let b = word.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b':' {
            if b.get(i + 1) == Some(&b':') {
                i += 2;
                continue;
            }
            return Some((&word[..i], &word[i + 1..]));
        }
        i += 1;
    }
    None
}

/// Adds (or with `!` removes) what `word` matches; `EINVAL` when it matches no function.
fn match_into(
    inv: &Inventory,
    set: &mut FunctionSet,
    word: &str,
    module: Option<&str>,
) -> Result<usize, Errno> {
    let (remove, glob) = match word.strip_prefix('!') {
        Some(g) => (true, g),
        None => (false, word),
    };
    let addrs = if glob.as_bytes().first().is_some_and(u8::is_ascii_digit) {
        // An index; the kernel reads it as a number even when digits are followed by more.
        let digits: String = glob.chars().take_while(char::is_ascii_digit).collect();
        by_index(inv, &digits).into_iter().collect()
    } else {
        match_glob(inv, glob, module).map_err(|_| Errno::EINVAL)?
    };
    if addrs.is_empty() {
        return Err(Errno::EINVAL);
    }
    for &a in &addrs {
        if remove {
            set.remove(a);
        } else {
            set.insert(a);
        }
    }
    Ok(addrs.len())
}

/// The longest word a write may hold (the kernel's `FTRACE_BUFF_MAX`).
const WORD_MAX: usize = 4096;

/// An open set file: the text at open for reads, a working copy for writes, committed on
/// close.
pub struct SetFile {
    instance: Arc<Instance>,
    sets: Arc<Sets>,
    kind: SetKind,
    content: Vec<u8>,
    pos: usize,
    /// The working copy, for a file opened for writing.
    working: Option<FunctionSet>,
    /// A word the last write ended in the middle of.
    partial: String,
    /// Whether a write changed the working copy or the file was truncated.
    dirty: bool,
}

/// Opens a set file of `instance`.
pub fn open(instance: Arc<Instance>, kind: SetKind, flags: OpenFlags) -> Box<dyn OpenFile> {
    let sets = sets_of(&instance);
    let current = sets.get(kind);
    let mut working = None;
    let mut dirty = false;
    if flags.write {
        if flags.truncate && !flags.append {
            working = Some(FunctionSet::new());
            dirty = true;
            // The kernel clears the remembered `:mod:` words of the set on a truncating open.
            sets.cached_mods
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|c| c.kind != kind);
            if kind == SetKind::Filter {
                let table: Vec<Arc<dyn FunctionCommand>> = commands()
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .map(|(_, c)| c.clone())
                    .collect();
                for c in table {
                    c.on_truncate(&instance);
                }
            }
        } else {
            working = Some((*current).clone());
        }
    }
    let content = if flags.read {
        listing_of(&instance, &sets, kind, &current).into_bytes()
    } else {
        Vec::new()
    };
    Box::new(SetFile {
        instance,
        sets,
        kind,
        content,
        pos: 0,
        working,
        partial: String::new(),
        dirty,
    })
}

impl SetFile {
    fn word(&mut self, word: &str) -> Result<(), Errno> {
        let Some(working) = self.working.as_mut() else {
            return Err(Errno::EINVAL);
        };
        self.dirty = true;
        process_word(&self.instance, &self.sets, self.kind, working, word)
    }
}

impl OpenFile for SetFile {
    fn read(&mut self, buf: &mut [u8], _timeout: Option<Duration>) -> Result<usize, Errno> {
        let rest = &self.content[self.pos.min(self.content.len())..];
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        self.pos += n;
        Ok(n)
    }

    fn write(&mut self, data: &[u8]) -> Result<usize, Errno> {
        if self.working.is_none() {
            return Err(Errno::EINVAL);
        }
        let text = std::str::from_utf8(data).map_err(|_| Errno::EINVAL)?;
        let mut rest = text;
        // A word left open by the previous write continues here, unless this write starts
        // with whitespace (which ends it).
        if !self.partial.is_empty() {
            let end = rest
                .find(|c: char| c.is_ascii_whitespace())
                .unwrap_or(rest.len());
            self.partial.push_str(&rest[..end]);
            rest = &rest[end..];
            if self.partial.len() >= WORD_MAX {
                self.partial.clear();
                return Err(Errno::EINVAL);
            }
            if rest.is_empty() {
                return Ok(data.len());
            }
            let word = std::mem::take(&mut self.partial);
            self.word(&word)?;
        }
        let ends_in_word = !rest.is_empty() && !rest.ends_with(|c: char| c.is_ascii_whitespace());
        let words: Vec<&str> = rest.split_ascii_whitespace().collect();
        let last = words.len();
        for (i, w) in words.into_iter().enumerate() {
            if w.len() >= WORD_MAX {
                return Err(Errno::EINVAL);
            }
            if i + 1 == last && ends_in_word {
                self.partial = w.to_string();
                break;
            }
            self.word(w)?;
        }
        Ok(data.len())
    }

    fn is_stream(&self) -> bool {
        false
    }
}

impl Drop for SetFile {
    fn drop(&mut self) {
        if self.working.is_none() {
            return;
        }
        if !self.partial.is_empty() {
            let word = std::mem::take(&mut self.partial);
            let _ = self.word(&word);
        }
        if !self.dirty {
            return;
        }
        let working = self.working.take().expect("checked above");
        let changed = {
            let _commit = self.sets.commit.lock().unwrap_or_else(|e| e.into_inner());
            self.sets.publish(self.kind, working)
        };
        if changed {
            notify(&self.instance, &self.sets, self.kind);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_kinds_round_trip_their_file_names() {
        for k in SetKind::ALL {
            assert_eq!(SetKind::from_file_name(k.file_name()), Some(k));
        }
        assert_eq!(SetKind::from_file_name("set_ftrace_pid"), None);
    }
}
