//! `ustrace export --folded`: the folded stacks (`root;…;leaf count`) of a trace's stack
//! events, the input of flamegraph.pl, inferno and speedscope, and of `ustrace flamegraph`.
//!
//! ustrace records a stack as the built-in `ftrace:kernel_stack` event (the `stacktrace`
//! trigger and option: `size` frames in `caller`, innermost first) or `ftrace:user_stack`
//! (the `userstacktrace` option: up to eight frames, a 0 ends them). Each becomes one line
//! rooted at the thread's comm, as stackcollapse-perf roots its stacks; frames are named
//! from the trace's symbol table (kallsyms) when it has one, else written as addresses.
//! Identical stacks are merged and counted.

use super::Events;
use std::collections::BTreeMap;
use std::io;
use ustrace_tracedat::{Event, Value};

/// An address → function table, from the text of a kallsyms (`ADDR TYPE NAME [MODULE]`).
#[derive(Debug, Default)]
pub struct Symbols {
    /// Sorted by address.
    syms: Vec<(u64, String)>,
}

impl Symbols {
    /// Reads a kallsyms; lines it cannot read are skipped (as libtraceevent does).
    pub fn from_kallsyms(text: &str) -> Symbols {
        let mut syms: Vec<(u64, String)> = text
            .lines()
            .filter_map(|line| {
                let (addr, rest) = line.trim_start().split_once(char::is_whitespace)?;
                let addr = u64::from_str_radix(addr, 16).ok()?;
                let (kind, name) = rest.trim_start().split_once(char::is_whitespace)?;
                // Only code: a data symbol just below a function would claim its frames.
                if !matches!(kind, "t" | "T" | "w" | "W") {
                    return None;
                }
                // A module's symbols end in `\t[module]`; a demangled name may hold spaces.
                let name = match name.rsplit_once('\t') {
                    Some((n, m)) if m.starts_with('[') => n,
                    _ => name,
                };
                let name = name.trim();
                (!name.is_empty()).then(|| (addr, name.to_owned()))
            })
            .collect();
        syms.sort();
        Symbols { syms }
    }

    /// The function holding `addr`: the nearest symbol at or below it.
    pub fn name(&self, addr: u64) -> Option<&str> {
        let i = self.syms.partition_point(|(a, _)| *a <= addr);
        i.checked_sub(1).map(|i| self.syms[i].1.as_str())
    }

    /// What a frame is called in the folded text.
    fn frame(&self, addr: u64) -> String {
        match self.name(addr) {
            // `;` separates frames; one inside a (demangled) name would split it.
            Some(name) => name.replace(';', ":"),
            None => format!("{addr:#x}"),
        }
    }
}

/// The symbol table a trace.dat carries (empty when it was recorded without one: a
/// ustrace tracefs has no kallsyms, and then frames are written as addresses).
pub fn symbols_of(reader: &ustrace_tracedat::Reader) -> Symbols {
    Symbols::from_kallsyms(&String::from_utf8_lossy(&reader.meta().kallsyms))
}

/// The frames of a stack event, innermost first; `None` for any other event.
pub fn frames(ev: &Event) -> Option<Vec<u64>> {
    if ev.system != "ftrace" {
        return None;
    }
    let field = |name: &str| ev.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v);
    let Some(Value::Array(callers)) = field("caller") else {
        return None;
    };
    match ev.name.as_str() {
        "kernel_stack" => {
            let size = match field("size") {
                Some(Value::Int(n)) => usize::try_from(*n).unwrap_or(0),
                Some(Value::UInt(n)) => usize::try_from(*n).unwrap_or(usize::MAX),
                _ => callers.len(),
            };
            let mut frames: Vec<u64> = callers.iter().take(size).copied().collect();
            // The format declares eight callers, as the kernel's does, but the record holds
            // `size` of them (ustrace keeps up to 64): the rest are read from its bytes.
            frames.extend(
                (frames.len()..size)
                    .map_while(|i| ev.data.get(16 + 8 * i..24 + 8 * i))
                    .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))),
            );
            Some(frames)
        }
        "user_stack" => Some(callers.iter().copied().take_while(|&a| a != 0).collect()),
        _ => None,
    }
}

/// Folds the stacks of `events`: `(frames root first joined by ';', count)`, sorted.
pub fn fold(events: &dyn Events, symbols: &Symbols) -> io::Result<Vec<(String, u64)>> {
    let mut merged: BTreeMap<String, u64> = BTreeMap::new();
    events.for_each(&mut |ev| {
        let Some(addrs) = frames(ev) else {
            return Ok(());
        };
        if addrs.is_empty() {
            return Ok(());
        }
        let mut line = ev.comm.replace(';', ":");
        for &a in addrs.iter().rev() {
            line.push(';');
            line.push_str(&symbols.frame(a));
        }
        *merged.entry(line).or_insert(0) += 1;
        Ok(())
    })?;
    Ok(merged.into_iter().collect())
}

/// The folded text, one `stack count` a line.
pub fn text(stacks: &[(String, u64)]) -> String {
    stacks.iter().map(|(s, n)| format!("{s} {n}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::super::timeline::tests::ev;
    use super::*;

    #[test]
    fn stacks_fold_root_first_named_from_kallsyms_and_merge() {
        let k = |frames: Vec<u64>| {
            ev(
                1,
                1,
                "ftrace",
                "kernel_stack",
                vec![
                    ("size", Value::Int(frames.len() as i64)),
                    ("caller", Value::Array(frames)),
                ],
            )
        };
        let mut user = ev(
            2,
            1,
            "ftrace",
            "user_stack",
            vec![
                ("tgid", Value::UInt(100)),
                ("caller", Value::Array(vec![0x1010, 0x3000, 0, 0x1010])),
            ],
        );
        user.comm = "a;b".into();
        // `size` says how many of the recorded callers are frames.
        // A stack deeper than the eight callers of the format: the rest are in the record.
        let mut deep = k((0..8).map(|_| 0x1001).collect());
        deep.fields[0].1 = Value::Int(9);
        deep.data = vec![0; 16 + 8 * 9];
        deep.data[16 + 64..].copy_from_slice(&0x2000u64.to_le_bytes());
        let mut short = k(vec![0x2005, 0x1001, 0x1002]);
        short.fields[0].1 = Value::Int(2);
        let events = vec![
            k(vec![0x2005, 0x1001]),
            short,
            k(vec![0x1001]),
            deep,
            ev(3, 1, "kv", "get", vec![("caller", Value::Array(vec![1]))]),
            user,
        ];
        let symbols = Symbols::from_kallsyms("1000 T main\n2000 t work\n2800 D table\nzz T bad\n");
        let stacks = fold(&events, &symbols).unwrap();
        assert_eq!(
            text(&stacks),
            "a:b;work;main 1\nt1;main 1\nt1;main;work 2\nt1;work;main;main;main;main;main;main;main;main 1\n"
        );
        assert_eq!(symbols.name(0x2900), Some("work"));
        assert_eq!(Symbols::default().frame(0x2900), "0x2900");
        assert_eq!(symbols.name(0xfff), None);
    }
}
