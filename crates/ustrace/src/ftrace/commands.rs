//! The function commands of `set_ftrace_filter` (ftrace.rst, "Filter commands"):
//! `FUNC:traceon[:count]`, `traceoff`, `snapshot`, `stacktrace`, `enable_event:SYS:EVENT`
//! and `disable_event:SYS:EVENT`, removed by a leading `!`. (`mod` is the function-set
//! module's own; `dump`/`cpudump` are not offered: printing the whole trace from inside an
//! arbitrary function — possibly one of the allocator's, with its lock held — is not safe
//! in user space.)
//!
//! Like the kernel's function probes, a command acts whenever its function runs, whatever
//! the current tracer: each (instance, command, counted or not) is one *probe group* with
//! its own entry-only fprobe on the group's functions.
//!
//! ```text
//!   write "f*:traceoff:3" ── filter.rs word ── TraceCmd::apply ── group (instance, traceoff,
//!                                                  counted): functions + per-function count
//!                                                  ── fprobe re-registered on the new set
//!   f() runs ── fprobe entry ── binary search of entry_ip ── count check ── action
//! ```
//!
//! The hit path takes no lock and allocates nothing: the group's functions are a sorted
//! array and each has an atomic count (`traceon`/`traceoff` spend one only when they change
//! `tracing_on`; `stacktrace` only while tracing is on; `enable_event` only when it flips
//! the event), as the kernel's callbacks do. The kernel's quirks are kept: a function has at
//! most one command of a kind (counted and unlimited being different kinds), so a second
//! `enable_event` on the same function fails even for another event, and `!` removes by
//! kind, whatever event or count it names.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, Weak};

use ustrace_ctl::vfs::Errno;
use ustrace_fprobe::{EntryAction, Fprobe};

use super::filter::{register_command, CommandCall, FunctionCommand, SetKind};
use crate::buffers::Shared;
use crate::event_file::EventFile;
use crate::trace::Instance;

/// What a command does when its function is hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Action {
    TraceOn,
    TraceOff,
    Snapshot,
    StackTrace,
    EnableEvent,
    DisableEvent,
}

impl Action {
    fn name(self) -> &'static str {
        match self {
            Action::TraceOn => "traceon",
            Action::TraceOff => "traceoff",
            Action::Snapshot => "snapshot",
            Action::StackTrace => "stacktrace",
            Action::EnableEvent => "enable_event",
            Action::DisableEvent => "disable_event",
        }
    }

    const ALL: [Action; 6] = [
        Action::TraceOn,
        Action::TraceOff,
        Action::Snapshot,
        Action::StackTrace,
        Action::EnableEvent,
        Action::DisableEvent,
    ];
}

/// One function of a group: its count (`-1`: unlimited) and, for the event commands, the
/// event file it switches.
struct Entry {
    count: AtomicI64,
    event: Option<Arc<EventFile>>,
}

/// What the fprobe handler of a group reads: immutable but for the counts.
struct Table {
    action: Action,
    counted: bool,
    shared: Arc<Shared>,
    addrs: Box<[usize]>,
    entries: Box<[Arc<Entry>]>,
}

/// Frames a `stacktrace` command records at most.
const MAX_FRAMES: usize = 64;

impl Table {
    #[inline]
    fn hit(&self, ip: usize, ret_ip: usize) {
        let Ok(i) = self.addrs.binary_search(&ip) else {
            return;
        };
        let entry = &self.entries[i];
        let shared = &self.shared;
        match self.action {
            Action::TraceOn | Action::TraceOff => {
                let on = self.action == Action::TraceOn;
                if !self.counted {
                    shared.set_tracing_on(on);
                    return;
                }
                // Spent only when the state changes, as `update_traceon_count`.
                let left = entry.count.load(Ordering::Acquire);
                if left <= 0 || shared.tracing_on() == on {
                    return;
                }
                if entry
                    .count
                    .compare_exchange(left, left - 1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    shared.set_tracing_on(on);
                }
            }
            Action::Snapshot => {
                if !self.counted || take_one(&entry.count) {
                    let _ = shared.take_snapshot();
                }
            }
            Action::StackTrace => {
                if !shared.tracing_on() {
                    return;
                }
                if !self.counted || take_one(&entry.count) {
                    record_stack(shared, ip, ret_ip);
                }
            }
            Action::EnableEvent | Action::DisableEvent => {
                let Some(event) = &entry.event else { return };
                let enable = self.action == Action::EnableEvent;
                if self.counted {
                    let left = entry.count.load(Ordering::Acquire);
                    // Nothing to spend when the event is already as asked.
                    if left == 0 || enable != event.is_soft_disabled() {
                        return;
                    }
                    if left > 0
                        && entry
                            .count
                            .compare_exchange(left, left - 1, Ordering::AcqRel, Ordering::Relaxed)
                            .is_err()
                    {
                        return;
                    }
                }
                event.set_soft_disabled(!enable);
            }
        }
    }
}

/// Spends one of a positive count; false when none is left.
fn take_one(count: &AtomicI64) -> bool {
    count
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
            (c > 0).then(|| c - 1)
        })
        .is_ok()
}

/// Records a `<stack trace>` entry that starts at the hit function, then its caller and
/// outwards: the frames of the probe machinery (everything inside the stack before the
/// caller's return address) are left out, as the kernel skips its ftrace frames.
#[inline(never)]
fn record_stack(shared: &Shared, ip: usize, ret_ip: usize) {
    let mut frames = [0usize; MAX_FRAMES];
    let n = ustrace_inspect::stack::capture(0, &mut frames[1..]);
    let start = frames[1..=n]
        .iter()
        .position(|&f| f == ret_ip)
        .map_or(n + 1, |p| p + 1);
    let mut out = [0usize; MAX_FRAMES];
    out[0] = ip;
    let mut len = 1;
    if start <= n {
        for &f in &frames[start..=n] {
            out[len] = f;
            len += 1;
        }
    } else {
        out[1] = ret_ip;
        len = 2;
    }
    let pid = crate::thread::current_tid(&shared.record_cmd);
    shared.write_kernel_stack(pid, &out[..len]);
}

/// A probe group: the functions one (instance, action, counted) acts on, and their fprobe.
struct Group {
    instance: Weak<Instance>,
    action: Action,
    counted: bool,
    /// Function address -> its entry, in address order.
    entries: BTreeMap<usize, Arc<Entry>>,
    probe: Option<Fprobe>,
    /// Registration order, newest listed first as the kernel's `func_probes` list.
    seq: u64,
}

impl Group {
    /// Publishes the entries: a new fprobe on exactly these functions replaces the old one.
    fn republish(&mut self, shared: &Arc<Shared>) -> Result<(), Errno> {
        let old = self.probe.take();
        if !self.entries.is_empty() {
            let table = Arc::new(Table {
                action: self.action,
                counted: self.counted,
                shared: shared.clone(),
                addrs: self.entries.keys().copied().collect(),
                entries: self.entries.values().cloned().collect(),
            });
            let t = table.clone();
            let probe = Fprobe::builder()
                .entry_handler(move |_, ip, ret_ip, _, _| {
                    t.hit(ip, ret_ip);
                    EntryAction::SkipExit
                })
                .register_ips(&table.addrs)
                .map_err(|_| Errno::ENOMEM);
            match probe {
                Ok(p) => self.probe = Some(p),
                Err(e) => {
                    self.probe = old;
                    return Err(e);
                }
            }
        }
        // The new probe is in place before the old one goes: no hit falls between.
        if let Some(old) = old {
            let _ = old.unregister();
        }
        Ok(())
    }
}

struct Registry {
    groups: Vec<Group>,
    next_seq: u64,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    groups: Vec::new(),
    next_seq: 0,
});

fn registry() -> MutexGuard<'static, Registry> {
    let mut reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    // Groups of removed instances go with their probes.
    reg.groups.retain(|g| g.instance.strong_count() > 0);
    reg
}

/// The command object registered under each name.
struct Command(Action);

/// Parses a count as the kernel's `kstrtoul(…, 0, …)`: decimal, `0x` hex or `0` octal.
fn parse_count(text: &str) -> Result<i64, Errno> {
    let (digits, radix) = if let Some(h) = text.strip_prefix("0x").or(text.strip_prefix("0X")) {
        (h, 16)
    } else if text.len() > 1 && text.starts_with('0') {
        (&text[1..], 8)
    } else {
        (text, 10)
    };
    let digits = digits.strip_prefix('+').unwrap_or(digits);
    if digits.is_empty() {
        return Err(Errno::EINVAL);
    }
    let n = u64::from_str_radix(digits, radix).map_err(|_| Errno::EINVAL)?;
    Ok(n as i64)
}

impl FunctionCommand for Command {
    fn apply(&self, call: &mut CommandCall<'_>) -> Result<(), Errno> {
        // Function probes only work with set_ftrace_filter.
        if call.kind != SetKind::Filter {
            return Err(Errno::EINVAL);
        }
        let action = self.0;
        let mut param = call.param;
        let mut event = None;
        if matches!(action, Action::EnableEvent | Action::DisableEvent) {
            // SYS:EVENT[:count]
            let p = param.ok_or(Errno::EINVAL)?;
            let (system, rest) = p.split_once(':').ok_or(Errno::EINVAL)?;
            let (name, count) = match rest.split_once(':') {
                Some((n, c)) => (n, Some(c)),
                None => (rest, None),
            };
            event = Some(
                call.instance
                    .files_of(Some(system))
                    .into_iter()
                    .find(|f| f.event.name() == name)
                    .ok_or(Errno::EINVAL)?,
            );
            param = count;
        }
        let counted = param.is_some();
        let remove = call.glob.starts_with('!');
        let glob = call.glob.trim_start_matches('!');
        if remove {
            return unregister(call.instance, action, counted, glob);
        }
        let count = match param {
            // The number ends at the next `:`; an empty one leaves the count at -1
            // (the event commands refuse it).
            Some(p) => {
                let number = p.split(':').next().unwrap_or("");
                if number.is_empty() {
                    if event.is_some() {
                        return Err(Errno::EINVAL);
                    }
                    -1
                } else {
                    parse_count(number)?
                }
            }
            None => -1,
        };
        let funcs: Vec<usize> = call
            .matching()
            .into_iter()
            .map(|(addr, _)| addr)
            .filter(|&addr| ustrace_fprobe::check_patchable(addr).is_none())
            .collect();
        if funcs.is_empty() {
            return Err(Errno::EINVAL);
        }
        if action == Action::Snapshot {
            call.instance.shared.allocate_snapshot()?;
        }
        register(call.instance, action, counted, &funcs, count, event)
    }

    fn listing(&self, instance: &Arc<Instance>) -> String {
        // Every group is listed once, by the first command's call, newest group first.
        if self.0 != Action::ALL[0] {
            return String::new();
        }
        listing(instance)
    }
}

fn register(
    instance: &Arc<Instance>,
    action: Action,
    counted: bool,
    funcs: &[usize],
    count: i64,
    event: Option<Arc<EventFile>>,
) -> Result<(), Errno> {
    let mut reg = registry();
    let seq = reg.next_seq;
    let pos = match reg.groups.iter().position(|g| {
        g.action == action && g.counted == counted && g.instance.as_ptr() == Arc::as_ptr(instance)
    }) {
        Some(p) => p,
        None => {
            reg.next_seq += 1;
            reg.groups.push(Group {
                instance: Arc::downgrade(instance),
                action,
                counted,
                entries: BTreeMap::new(),
                probe: None,
                seq,
            });
            reg.groups.len() - 1
        }
    };
    let group = &mut reg.groups[pos];
    let fresh: Vec<usize> = funcs
        .iter()
        .copied()
        .filter(|a| !group.entries.contains_key(a))
        .collect();
    // Nothing new (every function already has this command): the kernel's "nothing added".
    if fresh.is_empty() {
        if group.entries.is_empty() {
            reg.groups.remove(pos);
        }
        return Err(Errno::EINVAL);
    }
    for (held, &addr) in fresh.iter().enumerate() {
        if let Some(ev) = &event {
            // Soft mode: the event's probe stays attached, recording only when switched on.
            if let Err(e) = ev.soft_mode_get() {
                for a in &fresh[..held] {
                    group.entries.remove(a);
                    ev.soft_mode_put();
                }
                if group.entries.is_empty() {
                    reg.groups.remove(pos);
                }
                return Err(e);
            }
        }
        group.entries.insert(
            addr,
            Arc::new(Entry {
                count: AtomicI64::new(count),
                event: event.clone(),
            }),
        );
    }
    if let Err(e) = group.republish(&instance.shared) {
        for addr in &fresh {
            if let Some(entry) = group.entries.remove(addr) {
                if let Some(ev) = &entry.event {
                    ev.soft_mode_put();
                }
            }
        }
        if group.entries.is_empty() {
            reg.groups.remove(pos);
        }
        return Err(e);
    }
    Ok(())
}

fn unregister(
    instance: &Arc<Instance>,
    action: Action,
    counted: bool,
    glob: &str,
) -> Result<(), Errno> {
    let mut reg = registry();
    let Some(pos) = reg.groups.iter().position(|g| {
        g.action == action && g.counted == counted && g.instance.as_ptr() == Arc::as_ptr(instance)
    }) else {
        return Err(Errno::EINVAL);
    };
    let inv = ustrace_inspect::symbols::inventory();
    let group = &mut reg.groups[pos];
    // `*` or nothing: every function of the group.
    let all = glob.is_empty() || glob == "*";
    let gone: Vec<usize> = group
        .entries
        .keys()
        .copied()
        .filter(|&addr| {
            all || inv.lookup(addr).is_some_and(|(s, _)| {
                ustrace_inspect::symbols::glob_match(glob.as_bytes(), s.name.as_bytes())
                    || ustrace_inspect::symbols::glob_match(glob.as_bytes(), s.mangled.as_bytes())
            })
        })
        .collect();
    if gone.is_empty() {
        return Err(Errno::EINVAL);
    }
    let removed: Vec<Arc<Entry>> = gone
        .iter()
        .filter_map(|a| group.entries.remove(a))
        .collect();
    let res = group.republish(&instance.shared);
    // Released after the probe that could flip them is gone.
    for entry in removed {
        if let Some(ev) = &entry.event {
            ev.soft_mode_put();
        }
    }
    if group.entries.is_empty() {
        reg.groups.remove(pos);
    }
    res
}

/// The lines `set_ftrace_filter` of `instance` shows for its commands: newest group first,
/// its functions in address order, `FUNC:CMD[:SYS:EVENT]:unlimited` or `...:count=N`.
pub fn listing(instance: &Arc<Instance>) -> String {
    let reg = registry();
    let inv = ustrace_inspect::symbols::inventory();
    let mut groups: Vec<&Group> = reg
        .groups
        .iter()
        .filter(|g| g.instance.as_ptr() == Arc::as_ptr(instance))
        .collect();
    groups.sort_by_key(|g| std::cmp::Reverse(g.seq));
    let mut out = String::new();
    for g in groups {
        for (&addr, entry) in &g.entries {
            let mut func = String::new();
            super::filter::write_function(&inv, addr, &mut func);
            out.push_str(func.trim_end_matches('\n'));
            out.push(':');
            out.push_str(g.action.name());
            if let Some(ev) = &entry.event {
                out.push_str(&format!(":{}:{}", ev.event.system(), ev.event.name()));
            }
            let count = entry.count.load(Ordering::Relaxed);
            if g.counted {
                out.push_str(&format!(":count={count}\n"));
            } else {
                out.push_str(":unlimited\n");
            }
        }
    }
    out
}

/// Registers the commands with the function-set files (once per process).
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for action in Action::ALL {
            // A name someone registered first keeps its command.
            let _ = register_command(action.name(), Arc::new(Command(action)));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_parse_like_kstrtoul_base_0() {
        assert_eq!(parse_count("5"), Ok(5));
        assert_eq!(parse_count("0x10"), Ok(16));
        assert_eq!(parse_count("010"), Ok(8));
        assert_eq!(parse_count("0"), Ok(0));
        assert!(parse_count("x").is_err());
        assert!(parse_count("5a").is_err());
    }
}
