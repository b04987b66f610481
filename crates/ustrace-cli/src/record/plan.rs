//! What `ustrace record`'s flags ask for, as the lines of a setup file
//! (`ustrace::setup`'s format): the agent applies them in the target before its `main`,
//! `record -P` writes them over the control socket.
//!
//! trace-cmd's flags bind to what comes before them: `-f FILTER` and `-R TRIGGER` apply to
//! the `-e` before them, so the plan is built from the command line's order, not from
//! clap's per-flag lists.

use std::path::Path;

/// One `-e` with what followed it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct EventSpec {
    /// `SYS`, `SYS:EVENT`, `SYS/EVENT` or `all`.
    pub event: String,
    pub filter: Option<String>,
    pub triggers: Vec<String>,
}

/// Everything to set up.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub events: Vec<EventSpec>,
    /// `dynamic_events` lines (`--probe`, and those `-F` makes).
    pub probes: Vec<String>,
    /// `-F` globs, resolved against the program's symbols.
    pub funcs: Vec<String>,
    pub buffer_kb: Option<u64>,
    pub clock: Option<String>,
    /// `-p TRACER` (trace-cmd's plugin): `function` or `function_graph`, over the
    /// functions `-l` (or, with `-p`, `-F`) names through `set_ftrace_filter`.
    pub tracer: Option<String>,
    /// `-l GLOB`: `set_ftrace_filter` words.
    pub ftrace_filter: Vec<String>,
}

/// Reads the flags of `record` in order from `args` (everything after `record`, up to
/// `--` or the first word that is not an option).
pub fn from_args(args: &[String]) -> Result<Plan, String> {
    let mut plan = Plan::default();
    let mut i = 0;
    let value = |i: &mut usize, flag: &str, inline: Option<&str>| -> Result<String, String> {
        if let Some(v) = inline {
            return Ok(v.to_string());
        }
        *i += 1;
        args.get(*i)
            .cloned()
            .ok_or_else(|| format!("{flag} needs a value"))
    };
    while i < args.len() {
        let arg = args[i].as_str();
        if arg == "--" {
            break;
        }
        // `-eX`, `--event=X` and `-e X` are the same.
        let (flag, inline) = if let Some(long) = arg.strip_prefix("--") {
            match long.split_once('=') {
                Some((f, v)) => (format!("--{f}"), Some(v)),
                None => (arg.to_string(), None),
            }
        } else if arg.len() > 2 && arg.starts_with('-') && !arg.starts_with("--") {
            (arg[..2].to_string(), Some(&arg[2..]))
        } else {
            (arg.to_string(), None)
        };
        match flag.as_str() {
            "-e" | "--event" => plan.events.push(EventSpec {
                event: value(&mut i, "-e", inline)?,
                ..EventSpec::default()
            }),
            "-f" | "--filter" => {
                let f = value(&mut i, "-f", inline)?;
                let Some(last) = plan.events.last_mut() else {
                    return Err("-f FILTER applies to the -e before it; there is none".into());
                };
                last.filter = Some(f);
            }
            "-R" | "--trigger" => {
                let t = value(&mut i, "-R", inline)?;
                let Some(last) = plan.events.last_mut() else {
                    return Err("-R TRIGGER applies to the -e before it; there is none".into());
                };
                last.triggers.push(t);
            }
            "--probe" => plan.probes.push(value(&mut i, "--probe", inline)?),
            "-F" | "--funcs" => plan.funcs.push(value(&mut i, "-F", inline)?),
            "-p" | "--plugin" => plan.tracer = Some(value(&mut i, "-p", inline)?),
            "-l" | "--ftrace-filter" => plan.ftrace_filter.push(value(&mut i, "-l", inline)?),
            "-b" | "--buffer-kb" => {
                let v = value(&mut i, "-b", inline)?;
                plan.buffer_kb = Some(
                    v.parse()
                        .map_err(|_| format!("-b {v}: not a size in KiB"))?,
                );
            }
            "-C" | "--clock" => plan.clock = Some(value(&mut i, "-C", inline)?),
            // Flags clap also knows that take a value and do not shape the setup.
            "-o" | "--output" | "-P" | "--pid" | "--agent" | "--follow" => {
                value(&mut i, &flag, inline)?;
            }
            _ if arg.starts_with('-') => {}
            // The command itself (clap allows it without `--`).
            _ => break,
        }
        i += 1;
    }
    if plan.tracer.is_some() {
        // With a tracer, `-F` names the functions it traces (issue's `record -p
        // function_graph -F GLOB`), resolved by the tracefs as set_ftrace_filter resolves
        // them, libraries included: no fprobe events.
        let funcs = std::mem::take(&mut plan.funcs);
        plan.ftrace_filter.extend(funcs);
    } else if !plan.ftrace_filter.is_empty() {
        return Err(
            "-l GLOB names the functions of a tracer: give -p function or -p function_graph".into(),
        );
    }
    Ok(plan)
}

/// The tracefs directory of an `-e` word: `events/SYS` or `events/SYS/EVENT`.
fn event_dir(word: &str) -> Result<String, String> {
    if word == "all" {
        return Ok("events".into());
    }
    let (sys, name) = match word.split_once([':', '/']) {
        Some((s, n)) => (s, Some(n)),
        None => (word, None),
    };
    let bad = |s: &str| s.is_empty() || s.contains(['/', ' ', '.']);
    if bad(sys) || name.is_some_and(|n| bad(n) && n != "*") {
        return Err(format!("-e {word}: expected SYS, SYS:EVENT or all"));
    }
    Ok(match name {
        None | Some("*") => format!("events/{sys}"),
        Some(n) => format!("events/{sys}/{n}"),
    })
}

/// The group of the event a `dynamic_events` line creates, so it can be enabled: the one
/// it names (`f:GRP/EVENT`) or the type's default.
pub fn probe_group(line: &str) -> Result<String, String> {
    let head = line.split_whitespace().next().unwrap_or("");
    let kind = head.chars().next().unwrap_or(' ');
    let default = match kind {
        'f' => "fprobes",
        't' => "tracepoints",
        'e' => "eprobes",
        'p' | 'r' => "kprobes",
        's' => "synthetic",
        _ => return Err(format!("--probe {line:?}: not a dynamic_events line")),
    };
    let name = head.split_once(':').map(|(_, n)| n).unwrap_or("");
    Ok(match name.split_once('/') {
        Some((g, _)) if !g.is_empty() => g.to_string(),
        _ => default.to_string(),
    })
}

/// The entry and exit fprobes `-F` makes for one function.
pub fn func_probes(func: &str) -> [String; 2] {
    [
        format!("f:funcs/{func}__entry {func}"),
        format!("f:funcs/{func}__exit {func}%return ret=$retval"),
    ]
}

/// Whether `name` matches the glob `pat` (`*`, `?` and `[...]`).
pub fn glob(pat: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], n) || (!n.is_empty() && go(p, &n[1..])),
            (Some(b'?'), Some(_)) => go(&p[1..], &n[1..]),
            (Some(b'['), Some(c)) => match p.iter().position(|b| *b == b']') {
                Some(end) if end > 1 => {
                    let set = &p[1..end];
                    let (neg, set) = match set.first() {
                        Some(b'!' | b'^') => (true, &set[1..]),
                        _ => (false, set),
                    };
                    let mut hit = false;
                    let mut k = 0;
                    while k < set.len() {
                        if k + 2 < set.len() && set[k + 1] == b'-' {
                            hit |= (set[k]..=set[k + 2]).contains(c);
                            k += 3;
                        } else {
                            hit |= set[k] == *c;
                            k += 1;
                        }
                    }
                    hit != neg && go(&p[end + 1..], &n[1..])
                }
                _ => *c == b'[' && go(&p[1..], &n[1..]),
            },
            (Some(a), Some(b)) => a == b && go(&p[1..], &n[1..]),
            _ => false,
        }
    }
    go(pat.as_bytes(), name.as_bytes())
}

/// The functions of the ELF file `exe` (defined, sized, in text) that match `globs`; a
/// word without glob characters is kept as it is (it may live in a library).
pub fn resolve_funcs(exe: &Path, globs: &[String]) -> Result<Vec<String>, String> {
    use object::{Object, ObjectSymbol, SymbolKind};
    let mut out: Vec<String> = Vec::new();
    let is_glob = |g: &str| g.contains(['*', '?', '[']);
    let mut names: Vec<String> = Vec::new();
    if globs.iter().any(|g| is_glob(g)) {
        let data =
            std::fs::read(exe).map_err(|e| format!("-F: cannot read {}: {e}", exe.display()))?;
        let file = object::File::parse(&*data)
            .map_err(|e| format!("-F: {} is not an ELF file: {e}", exe.display()))?;
        for sym in file.symbols().chain(file.dynamic_symbols()) {
            if sym.kind() == SymbolKind::Text && sym.is_definition() && sym.size() > 0 {
                if let Ok(n) = sym.name() {
                    names.push(n.to_string());
                }
            }
        }
        names.sort();
        names.dedup();
    }
    for g in globs {
        if !is_glob(g) {
            out.push(g.clone());
            continue;
        }
        let before = out.len();
        // Names an event cannot carry (versioned or compiler-made symbols) are left out.
        out.extend(
            names
                .iter()
                .filter(|n| glob(g, n) && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
                .cloned(),
        );
        if out.len() == before {
            return Err(format!("-F {g}: no function of {} matches", exe.display()));
        }
    }
    out.dedup();
    Ok(out)
}

impl Plan {
    /// The setup file's lines, in the order they must be applied.
    pub fn setup_lines(&self, funcs: &[String]) -> Result<Vec<String>, String> {
        let mut lines = Vec::new();
        if let Some(clock) = &self.clock {
            lines.push(format!("trace_clock {clock}"));
        }
        if let Some(kb) = self.buffer_kb {
            lines.push(format!("buffer_size_kb {kb}"));
        }
        let mut groups: Vec<String> = Vec::new();
        for p in &self.probes {
            lines.push(format!("dynamic_events >> {p}"));
            let g = probe_group(p)?;
            if !groups.contains(&g) {
                groups.push(g);
            }
        }
        for f in funcs {
            for p in func_probes(f) {
                lines.push(format!("dynamic_events >> {p}"));
            }
        }
        if !funcs.is_empty() {
            groups.push("funcs".into());
        }
        for e in &self.events {
            let dir = event_dir(&e.event)?;
            if let Some(f) = &e.filter {
                lines.push(format!("{dir}/filter {f}"));
            }
            for t in &e.triggers {
                if dir.matches('/').count() != 2 {
                    return Err(format!("-R {t}: a trigger needs one event (-e SYS:EVENT)"));
                }
                lines.push(format!("{dir}/trigger >> {t}"));
            }
            lines.push(format!("{dir}/enable 1"));
        }
        for g in groups {
            lines.push(format!("events/{g}/enable 1"));
        }
        if let Some(tracer) = &self.tracer {
            for glob in &self.ftrace_filter {
                if glob.contains(char::is_whitespace) {
                    return Err(format!("-l {glob:?}: one glob per flag"));
                }
                lines.push(format!("set_ftrace_filter >> {glob}"));
            }
            lines.push(format!("current_tracer {tracer}"));
        }
        Ok(lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn filters_and_triggers_bind_to_the_event_before_them() {
        let plan = from_args(&args(&[
            "-e", "kv:get", "-f", "hit == 1", "-e", "sched", "-R", "traceoff", "-eA:b", "-b", "64",
            "-C", "global", "--", "prog",
        ]))
        .unwrap();
        assert_eq!(plan.events.len(), 3);
        assert_eq!(plan.events[0].filter.as_deref(), Some("hit == 1"));
        assert_eq!(plan.events[1].triggers, ["traceoff"]);
        assert_eq!(plan.events[2].event, "A:b");
        assert_eq!(plan.buffer_kb, Some(64));
        assert!(from_args(&args(&["-f", "x == 1"])).is_err());
        let lines = plan.setup_lines(&[]);
        assert!(lines.is_err(), "a trigger on a whole system is refused");
    }

    #[test]
    fn setup_lines_follow_the_flags() {
        let plan = from_args(&args(&[
            "-C",
            "mono",
            "-e",
            "kv:get",
            "-f",
            "hit == 1",
            "--probe",
            "f:my/ent work",
        ]))
        .unwrap();
        let lines = plan.setup_lines(&["other".into()]).unwrap();
        assert_eq!(
            lines,
            [
                "trace_clock mono",
                "dynamic_events >> f:my/ent work",
                "dynamic_events >> f:funcs/other__entry other",
                "dynamic_events >> f:funcs/other__exit other%return ret=$retval",
                "events/kv/get/filter hit == 1",
                "events/kv/get/enable 1",
                "events/my/enable 1",
                "events/funcs/enable 1",
            ]
        );
    }

    #[test]
    fn probe_groups_default_by_type() {
        assert_eq!(probe_group("f:a/b sym").unwrap(), "a");
        assert_eq!(probe_group("f sym").unwrap(), "fprobes");
        assert_eq!(probe_group("f:ev sym%return").unwrap(), "fprobes");
        assert_eq!(probe_group("t:x/y sched_switch").unwrap(), "x");
        assert!(probe_group("zzz").is_err());
    }

    #[test]
    fn globs_match_like_a_shell() {
        assert!(glob("work*", "work_one"));
        assert!(glob("w?rk", "work"));
        assert!(glob("[a-c]x", "bx"));
        assert!(!glob("[!a-c]x", "bx"));
        assert!(!glob("work", "worker"));
        assert!(glob("*", ""));
    }
}
