//! One line written to `dynamic_events`: probe definitions and removals,
//! their defaults, and the canonical text read back.
//!
//! ```text
//!  f[MAXACTIVE][:[GRP/][EVENT]] SYM[%return] [FETCHARGS]   fprobe (group "fprobes")
//!  t[:[GRP/][EVENT]] TRACEPOINT [FETCHARGS]                tprobe (group "tracepoints")
//!  e[:[GRP/][EVENT]] SYS.EVENT [FETCHARGS] [if FILTER]     eprobe (group "eprobes")
//!  p|r[:[GRP/][EVENT]] PATH:OFFSET[%return] [FETCHARGS]    uprobe (kernel-parity testing)
//!  -:[GRP/][EVENT] [MATCH...]                               removal
//! ```
//!
//! `SYM` is a symbol spec: a function name as `available_filter_functions` lists it, or a
//! bare name (its default version, as `dlsym` resolves it), or `name@VERSION` for one
//! version of a versioned library function (`pthread_cond_wait@GLIBC_2.2.5`). The tracefs
//! resolves it when the event is defined; a name that resolves to nothing is the kernel's
//! "Invalid probed address or symbol" (EINVAL).
//!
//! Default event names: `SYM__entry` / `SYM__exit` for fprobes, the
//! tracepoint name for tprobes (`_` prefixed when it starts with a digit),
//! the attached event's name for eprobes. **Rust paths**: every character of
//! the symbol that is not an ASCII letter, digit or `_` becomes `_` (the
//! kernel only rewrites `:` and `.`), and a leading digit gets a `_` prefix,
//! so `my_crate::io::read` defaults to `my_crate__io__read__entry` and
//! `<alloc::string::String>::push` to `_alloc__string__String___push__entry`;
//! names are cut at 63 bytes. (A symbol containing a space, such as
//! `<T as Trait>::f`, cannot be named: the command is split at whitespace.)

use crate::env::{FieldSpec, ProbeEnv};
use crate::error::{ArgError, Errno, ErrorId as E, ProbeError};
use crate::fetch::{
    find_retval, is_good_identifier, ArgDef, ArgFlags, ArgParser, DebugInfo, EntryArgs,
};
use crate::num::{kstrtouint, kstrtoul};

/// Most arguments per probe (`MAX_TRACE_ARGS`).
pub const MAX_TRACE_ARGS: usize = 128;
/// Event and group names are shorter than this (`MAX_EVENT_NAME_LEN`).
pub const MAX_EVENT_NAME_LEN: usize = 64;
/// Largest fprobe MAXACTIVE (`RETHOOK_MAXACTIVE_MAX`).
pub const MAXACTIVE_MAX: u32 = 4096;
/// Most entry-data bytes an exit probe may save (`MAX_FPROBE_DATA_SIZE`).
pub const MAX_ENTRY_DATA_SIZE: usize = 15 * 8;
/// Room for the names `$arg*`/`$argN` expand to (`MAX_BTF_ARGS_LEN`).
pub const MAX_BTF_ARGS_LEN: usize = 128;

/// Which kind of dynamic event a definition makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeKind {
    /// `f SYM`: function entry.
    Fentry,
    /// `f SYM%return`: function exit.
    Fexit,
    /// `t TRACEPOINT`.
    Tracepoint,
    /// `e SYS.EVENT`: on another event.
    Eprobe,
    /// `p PATH:OFFSET` (kernel-parity only; ustrace does not place uprobes).
    Uprobe,
    /// `r PATH:OFFSET` / `p PATH:OFFSET%return`.
    Uretprobe,
}

impl ProbeKind {
    /// The `error_log` location of this kind.
    pub fn subsystem(self) -> &'static str {
        match self {
            ProbeKind::Fentry | ProbeKind::Fexit | ProbeKind::Tracepoint => "trace_fprobe",
            ProbeKind::Eprobe => "event_probe",
            ProbeKind::Uprobe | ProbeKind::Uretprobe => "trace_uprobe",
        }
    }

    /// Whether records carry `__probe_func`/`__probe_ret_ip` (exit probes).
    pub fn is_return(self) -> bool {
        matches!(self, ProbeKind::Fexit | ProbeKind::Uretprobe)
    }

    /// The default group.
    pub fn default_group(self) -> &'static str {
        match self {
            ProbeKind::Fentry | ProbeKind::Fexit => "fprobes",
            ProbeKind::Tracepoint => "tracepoints",
            ProbeKind::Eprobe => "eprobes",
            ProbeKind::Uprobe | ProbeKind::Uretprobe => "uprobes",
        }
    }
}

/// A parsed and compiled probe definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeDefinition {
    /// What kind of probe.
    pub kind: ProbeKind,
    /// Group (system) name.
    pub group: String,
    /// Event name.
    pub event: String,
    /// Function symbol, tracepoint name, attached event name, or uprobe path.
    pub target: String,
    /// The attached event's system (eprobes).
    pub target_system: String,
    /// Offset in the file (uprobes).
    pub uprobe_offset: u64,
    /// MAXACTIVE of an exit fprobe (0 = default).
    pub maxactive: u32,
    /// Compiled arguments, in order.
    pub args: Vec<ArgDef>,
    /// Entry arguments an exit probe saves at entry ("entry data").
    pub entry_args: EntryArgs,
    /// The raw filter text after `if` (eprobes), for the caller to compile
    /// against the attached event.
    pub filter: Option<String>,
    /// The words of the command as written, for errors found later.
    pub argv: Vec<String>,
}

/// A `-:[GRP/][EVENT] [MATCH...]` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    /// Group to match; `None` matches any.
    pub group: Option<String>,
    /// Event to match; `None` matches every event of the group.
    pub event: Option<String>,
    /// Further words: the probe point and `name=comm` arguments to match.
    pub match_args: Vec<String>,
}

/// What one line written to `dynamic_events` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DynCommand {
    /// Nothing (blank line or comment).
    Empty,
    /// Create this event (or add a probe to the existing event of that name).
    Create(ProbeDefinition),
    /// Remove the matching events (`ENOENT` when none matches).
    Remove(Removal),
}

/// Parses one line of `dynamic_events` input (a `#` starts a comment).
pub fn parse_command(line: &str, env: &dyn ProbeEnv) -> Result<DynCommand, ProbeError> {
    let line = line.split('#').next().unwrap_or("");
    let argv: Vec<String> = line.split_ascii_whitespace().map(str::to_owned).collect();
    if argv.is_empty() {
        return Ok(DynCommand::Empty);
    }
    let first = argv[0].as_bytes()[0];
    if first == b'-' || first == b'!' {
        return parse_removal(&argv).map(DynCommand::Remove);
    }
    if argv.len() < 2 {
        return Err(ProbeError::silent(Errno::Inval));
    }
    let def = match first {
        b'f' | b't' => parse_fprobe(argv, env)?,
        b'e' => parse_eprobe(argv, env)?,
        b'p' | b'r' => parse_uprobe(argv, env)?,
        _ => return Err(ProbeError::silent(Errno::Inval)),
    };
    Ok(DynCommand::Create(def))
}

fn parse_removal(argv: &[String]) -> Result<Removal, ProbeError> {
    let w = &argv[0];
    let spec = if w.starts_with('-') {
        w.strip_prefix("-:")
            .ok_or_else(|| ProbeError::silent(Errno::Inval))?
    } else {
        let c = w
            .find(':')
            .ok_or_else(|| ProbeError::silent(Errno::Inval))?;
        &w[c + 1..]
    };
    let (group, event) = match spec.find('/') {
        Some(s) => (Some(spec[..s].to_owned()), &spec[s + 1..]),
        None => (None, spec),
    };
    if group.is_none() && event.is_empty() {
        return Err(ProbeError::silent(Errno::Inval));
    }
    Ok(Removal {
        group,
        event: (!event.is_empty()).then(|| event.to_owned()),
        match_args: argv[1..].to_vec(),
    })
}

/// Builds errors against the command words.
struct Log<'a> {
    subsystem: &'static str,
    argv: &'a [String],
}

impl Log<'_> {
    fn err(&self, id: E, index: usize, offset: usize, errno: Errno) -> ProbeError {
        ProbeError {
            id: Some(id),
            errno,
            subsystem: self.subsystem,
            argv: self.argv.to_vec(),
            index,
            offset,
        }
    }

    fn arg(&self, e: ArgError, index: usize) -> ProbeError {
        self.err(e.id, index, e.offset, e.errno)
    }
}

/// `traceprobe_parse_event_name`: `[GROUP/]EVENT` (or `GROUP.EVENT`).
fn parse_event_name(s: &str, offset: usize) -> Result<(Option<String>, Option<String>), ArgError> {
    let mut offset = offset;
    let mut group = None;
    let mut event = s;
    let slash = s.find('/').or_else(|| s.find('.'));
    if let Some(sl) = slash {
        if sl == 0 {
            return Err(ArgError::new(E::NO_GROUP_NAME, offset));
        }
        if sl + 1 > MAX_EVENT_NAME_LEN {
            return Err(ArgError::new(E::GROUP_TOO_LONG, offset));
        }
        if !is_good_system_name(&s[..sl]) {
            return Err(ArgError::new(E::BAD_GROUP_NAME, offset));
        }
        group = Some(s[..sl].to_owned());
        offset += sl + 1;
        event = &s[sl + 1..];
    }
    if event.is_empty() {
        if slash.is_some() {
            return Ok((group, None));
        }
        return Err(ArgError::new(E::NO_EVENT_NAME, offset));
    }
    if event.len() >= MAX_EVENT_NAME_LEN {
        return Err(ArgError::new(E::EVENT_TOO_LONG, offset));
    }
    if !is_good_identifier(event) {
        return Err(ArgError::new(E::BAD_EVENT_NAME, offset));
    }
    Ok((group, Some(event.to_owned())))
}

/// Group names may also contain `-` (`is_good_system_name`).
fn is_good_system_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && !b[0].is_ascii_digit()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-')
}

/// The default-name rule (see the module docs).
pub fn sanitize_event_name(raw: &str) -> String {
    let mut s: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.as_bytes().first().is_some_and(u8::is_ascii_digit) {
        s.insert(0, '_');
    }
    s.truncate(MAX_EVENT_NAME_LEN - 1);
    s
}

/// The event prefix `X[...]:` of word 0: (text after ':' if any, its offset).
fn event_part(w0: &str) -> Option<(&str, usize)> {
    w0[1..].find(':').map(|c| (&w0[c + 2..], c + 2))
}

fn parse_fprobe(argv: Vec<String>, env: &dyn ProbeEnv) -> Result<ProbeDefinition, ProbeError> {
    let log = Log {
        subsystem: "trace_fprobe",
        argv: &argv,
    };
    let w0 = argv[0].as_str();
    let is_tp = w0.starts_with('t');
    let event_spec = event_part(w0);

    let second = w0.as_bytes().get(1).copied().unwrap_or(0);
    let mut maxactive = 0;
    if second.is_ascii_digit() {
        let end = event_spec.map_or(w0.len(), |(_, off)| off - 1);
        let digits = &w0[1..end];
        if digits.len() > MAX_EVENT_NAME_LEN - 1 {
            return Err(log.err(E::BAD_MAXACT, 0, 1, Errno::Inval));
        }
        match kstrtouint(digits, 0) {
            Some(n) if n > 0 => maxactive = n,
            _ => return Err(log.err(E::BAD_MAXACT, 0, 1, Errno::Inval)),
        }
        if maxactive > MAXACTIVE_MAX {
            return Err(log.err(E::MAXACT_TOO_BIG, 0, 1, Errno::Inval));
        }
    } else if second != 0 && second != b':' {
        return Err(log.err(E::BAD_MAXACT, 0, 1, Errno::Inval));
    }

    // The probe point (word 1).
    let point = argv[1].as_str();
    let mut is_return = false;
    let symbol = match point.find('%') {
        Some(p) => {
            if !is_tp && &point[p..] == "%return" {
                is_return = true;
            } else {
                return Err(log.err(E::BAD_ADDR_SUFFIX, 1, p, Errno::Inval));
            }
            &point[..p]
        }
        None => point,
    };
    if !is_return {
        if is_tp {
            if let Some(bad) = symbol
                .bytes()
                .position(|c| !(c.is_ascii_alphanumeric() || c == b'_'))
            {
                return Err(log.err(E::BAD_TP_NAME, 1, bad, Errno::Inval));
            }
        }
        for (i, w) in argv.iter().enumerate().skip(2) {
            if let Some(p) = find_retval(w) {
                if is_tp {
                    return Err(log.err(E::RETVAL_ON_PROBE, i, p, Errno::Inval));
                }
                is_return = true;
                break;
            }
        }
    }
    if symbol.is_empty() {
        return Err(log.err(E::BAD_PROBE_ADDR, 1, 0, Errno::Inval));
    }
    if !is_return && maxactive != 0 {
        return Err(log.err(E::BAD_MAXACT_TYPE, 0, 1, Errno::Inval));
    }

    let (mut group, mut event) = (None, None);
    if let Some((spec, off)) = event_spec {
        let (g, e) = parse_event_name(spec, off).map_err(|e| log.arg(e, 0))?;
        group = g;
        event = e;
    }
    let kind = if is_tp {
        ProbeKind::Tracepoint
    } else if is_return {
        ProbeKind::Fexit
    } else {
        ProbeKind::Fentry
    };
    let event = event.unwrap_or_else(|| {
        if is_tp {
            sanitize_event_name(symbol)
        } else {
            sanitize_event_name(&format!(
                "{symbol}__{}",
                if is_return { "exit" } else { "entry" }
            ))
        }
    });
    if is_tp && !env.has_tracepoint(symbol) {
        return Err(log.err(E::NO_TRACEPOINT, 1, 0, Errno::Inval));
    }
    let flags = ArgFlags {
        kernel: true,
        ret: is_return,
        fentry: !is_return,
        tpoint: is_tp,
        fprobe: true,
        tevent: false,
    };
    let mut debug = if is_tp {
        DebugInfo::for_tracepoint(env, symbol)
    } else {
        DebugInfo::new(env, symbol)
    };
    let words = expand_meta_args(&argv, flags, &mut debug, &log)?;
    if words.len() > MAX_TRACE_ARGS {
        return Err(log.err(E::TOO_MANY_ARGS, 2, 0, Errno::TooBig));
    }
    let mut entry = EntryArgs::default();
    let (args, unresolved) = parse_args(&words, flags, &mut debug, env, None, &mut entry, &log)?;
    if entry.size() > MAX_ENTRY_DATA_SIZE {
        return Err(log.err(E::TOO_MANY_EARGS, 2, 0, Errno::TooBig));
    }
    if unresolved {
        return Err(log.err(E::BAD_PROBE_ADDR, 1, 0, Errno::Inval));
    }
    Ok(ProbeDefinition {
        kind,
        group: group.unwrap_or_else(|| kind.default_group().to_owned()),
        event,
        target: symbol.to_owned(),
        target_system: String::new(),
        uprobe_offset: 0,
        maxactive,
        args,
        entry_args: entry,
        filter: None,
        argv: argv.clone(),
    })
}

fn parse_args<'e>(
    words: &[String],
    flags: ArgFlags,
    debug: &mut DebugInfo<'e>,
    env: &'e dyn ProbeEnv,
    fields: Option<&[FieldSpec]>,
    entry: &mut EntryArgs,
    log: &Log<'_>,
) -> Result<(Vec<ArgDef>, bool), ProbeError> {
    let mut parser = ArgParser {
        flags,
        debug,
        env,
        fields,
        entry,
        size: 0,
        unresolved_symbol: false,
    };
    let mut args: Vec<ArgDef> = Vec::with_capacity(words.len());
    for (i, w) in words.iter().enumerate() {
        let a = parser.parse(i, w, &args).map_err(|e| log.arg(e, i + 2))?;
        args.push(a);
    }
    Ok((args, parser.unresolved_symbol))
}

/// `traceprobe_expand_meta_args`: `$arg*` becomes every parameter name and
/// `$argN[:T]` the N-th parameter's name, when debug info is available.
fn expand_meta_args(
    argv: &[String],
    flags: ArgFlags,
    debug: &mut DebugInfo<'_>,
    log: &Log<'_>,
) -> Result<Vec<String>, ProbeError> {
    let words = &argv[2..];
    let entry_or_return = flags.kernel && (flags.ret || flags.fentry);
    let mut star = None;
    let mut last_index = 0;
    let mut found = false;
    for (i, w) in words.iter().enumerate() {
        // `$arg*` must stand alone: a name or type on it is refused (the
        // kernel says BAD_VAR or silently drops the type; ustrace says why).
        // The caret goes to the `$arg*` after a name, where the kernel's parser stands
        // when it refuses the variable (dynevent/fprobe_syntax_errors.tc checks it).
        if let Some(eq) = w.find("=$arg*") {
            return Err(log.err(E::BAD_VAR_ARGS, i + 2, eq + 1, Errno::Inval));
        }
        if w.starts_with("$arg*") && w.len() > 5 {
            return Err(log.err(E::BAD_VAR_ARGS, i + 2, 0, Errno::Inval));
        }
        let Some(rest) = w.strip_prefix("$arg") else {
            continue;
        };
        last_index = i + 2;
        if !entry_or_return {
            return Err(log.err(E::NOFENTRY_ARGS, i + 2, 0, Errno::Inval));
        }
        let c = rest.as_bytes().first().copied().unwrap_or(0);
        if c.is_ascii_digit() {
            found = true;
            continue;
        }
        if c != b'*' {
            return Err(log.err(E::BAD_VAR, i + 2, 0, Errno::Inval));
        }
        if star.is_some() {
            return Err(log.err(E::DOUBLE_ARGS, i + 2, 0, Errno::Inval));
        }
        found = true;
        star = Some(i);
    }
    if !found {
        return Ok(words.to_vec());
    }
    let params: Vec<String> = match debug.get() {
        Some(info) if !info.params.is_empty() => {
            info.params.iter().map(|p| p.name.clone()).collect()
        }
        _ => {
            if let Some(i) = star {
                return Err(log.err(E::NOSUP_BTFARG, i + 2, 0, Errno::Inval));
            }
            let _ = last_index;
            return Ok(words.to_vec());
        }
    };
    let mut out = Vec::with_capacity(words.len() + params.len());
    let mut used = 0;
    let mut add = |s: String, index: usize, out: &mut Vec<String>| -> Result<(), ProbeError> {
        used += s.len() + 1;
        if used > MAX_BTF_ARGS_LEN {
            return Err(log.err(E::ARGS_2LONG, index, 0, Errno::TooBig));
        }
        out.push(s);
        Ok(())
    };
    for (i, w) in words.iter().enumerate() {
        if Some(i) == star {
            for p in &params {
                add(p.clone(), i + 2, &mut out)?;
            }
            continue;
        }
        if let Some(rest) = w.strip_prefix("$arg") {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            let ty = &rest[digits..];
            if !(ty.is_empty() || ty.starts_with(':')) {
                return Err(log.err(E::BAD_VAR, i + 2, 0, Errno::NoEnt));
            }
            let n = kstrtoul(&rest[..digits], 10).unwrap_or(0);
            // The kernel reports NO_BTFARG here; ARGIDX_2BIG says it better.
            let Some(name) = n.checked_sub(1).and_then(|k| params.get(k as usize)) else {
                return Err(log.err(E::ARGIDX_2BIG, i + 2, 0, Errno::NoEnt));
            };
            add(format!("{name}{ty}"), i + 2, &mut out)?;
        } else {
            out.push(w.clone());
        }
    }
    Ok(out)
}

fn parse_eprobe(argv: Vec<String>, env: &dyn ProbeEnv) -> Result<ProbeDefinition, ProbeError> {
    let log = Log {
        subsystem: "event_probe",
        argv: &argv,
    };
    let (mut group, mut event) = (None, None);
    if let Some((spec, off)) = event_part(&argv[0]) {
        let (g, e) = parse_event_name(spec, off).map_err(|e| log.arg(e, 0))?;
        group = g;
        event = e;
    }
    let (sys, sys_event) = match parse_event_name(&argv[1], 0) {
        Ok((Some(s), Some(e))) => (s, e),
        _ => return Err(log.err(E::NO_EVENT_INFO, 1, 0, Errno::Inval)),
    };
    let event = event.unwrap_or_else(|| sys_event.clone());
    let mut words: Vec<String> = argv[2..].to_vec();
    let mut filter = None;
    if let Some(p) = words.iter().position(|w| w == "if") {
        let rest = words.split_off(p);
        filter = Some(rest[1..].join(" "));
    }
    let Some(fields) = env.event_fields(&sys, &sys_event) else {
        return Err(log.err(E::BAD_ATTACH_EVENT, 1, 0, Errno::NoDev));
    };
    if filter.as_deref() == Some("") {
        return Err(log.err(E::NO_EP_FILTER, argv.len(), 0, Errno::Inval));
    }
    if words.len() > MAX_TRACE_ARGS {
        return Err(log.err(E::TOO_MANY_ARGS, 2, 0, Errno::TooBig));
    }
    let flags = ArgFlags {
        kernel: true,
        tevent: true,
        ..ArgFlags::default()
    };
    let mut debug = DebugInfo::new(env, "");
    let mut entry = EntryArgs::default();
    let (args, unresolved) = parse_args(
        &words,
        flags,
        &mut debug,
        env,
        Some(&fields),
        &mut entry,
        &log,
    )?;
    if unresolved {
        return Err(log.err(E::BAD_PROBE_ADDR, 1, 0, Errno::Inval));
    }
    Ok(ProbeDefinition {
        kind: ProbeKind::Eprobe,
        group: group.unwrap_or_else(|| "eprobes".to_owned()),
        event,
        target: sys_event,
        target_system: sys,
        uprobe_offset: 0,
        maxactive: 0,
        args,
        entry_args: entry,
        filter,
        argv: argv.clone(),
    })
}

fn parse_uprobe(argv: Vec<String>, env: &dyn ProbeEnv) -> Result<ProbeDefinition, ProbeError> {
    let log = Log {
        subsystem: "trace_uprobe",
        argv: &argv,
    };
    let w0 = argv[0].as_str();
    let mut is_return = w0.starts_with('r');
    let event_spec = w0
        .strip_prefix(['p', 'r'])
        .and_then(|r| r.strip_prefix(':'));
    let point = argv[1].as_str();
    if !point.contains('/') {
        return Err(ProbeError::silent(Errno::Inval));
    }
    let Some(colon) = point.rfind(':') else {
        return Err(ProbeError::silent(Errno::Inval));
    };
    if !point
        .as_bytes()
        .get(colon + 1)
        .is_some_and(u8::is_ascii_digit)
    {
        return Err(ProbeError::silent(Errno::Inval));
    }
    if argv.len() - 2 > MAX_TRACE_ARGS {
        return Err(log.err(E::TOO_MANY_ARGS, 2, 0, Errno::TooBig));
    }
    let path = &point[..colon];
    match std::fs::metadata(path) {
        Err(_) => return Err(log.err(E::FILE_NOT_FOUND, 1, 0, Errno::NoEnt)),
        Ok(m) if !m.is_file() => return Err(log.err(E::NO_REGULAR_FILE, 1, 0, Errno::Inval)),
        Ok(_) => {}
    }
    let mut off_text = &point[colon + 1..];
    if let Some(p) = off_text.find('%') {
        if &off_text[p..] == "%return" {
            is_return = true;
            off_text = &off_text[..p];
        } else {
            return Err(log.err(E::BAD_ADDR_SUFFIX, 1, colon + 1 + p, Errno::Inval));
        }
    }
    let Some(offset) = kstrtoul(off_text, 0) else {
        return Err(log.err(E::BAD_UPROBE_OFFS, 1, colon + 1, Errno::Inval));
    };
    let (mut group, mut event) = (None, None);
    if let Some(spec) = event_spec {
        let (g, e) = parse_event_name(spec, 2).map_err(|e| log.arg(e, 0))?;
        group = g;
        event = e;
    }
    let event = event.unwrap_or_else(|| {
        let base = path.rsplit('/').next().unwrap_or(path);
        let cut = base.find(['.', '-', '_']).unwrap_or(base.len());
        format!("p_{}_0x{offset:x}", &base[..cut])
    });
    let flags = ArgFlags {
        ret: is_return,
        ..ArgFlags::default()
    };
    let mut debug = DebugInfo::new(env, "");
    let mut entry = EntryArgs::default();
    let (args, _) = parse_args(&argv[2..], flags, &mut debug, env, None, &mut entry, &log)?;
    let kind = if is_return {
        ProbeKind::Uretprobe
    } else {
        ProbeKind::Uprobe
    };
    Ok(ProbeDefinition {
        kind,
        group: group.unwrap_or_else(|| "uprobes".to_owned()),
        event,
        target: path.to_owned(),
        target_system: String::new(),
        uprobe_offset: offset,
        maxactive: 0,
        args,
        entry_args: entry,
        filter: None,
        argv: argv.clone(),
    })
}

impl ProbeDefinition {
    /// An error against this definition's command, for failures found after
    /// parsing: `EVENT_EXIST` (index 0), `BAD_PROBE_ADDR` (index 1),
    /// `DIFF_ARG_TYPE` (index of the first differing argument + 1), ...
    pub fn error(&self, id: E, index: usize, offset: usize, errno: Errno) -> ProbeError {
        ProbeError {
            id: Some(id),
            errno,
            subsystem: self.kind.subsystem(),
            argv: self.argv.clone(),
            index,
            offset,
        }
    }

    /// The line `dynamic_events` shows for this event (without newline):
    /// `f:fprobes/myprobe vfs_read count=count pos=pos`. An eprobe's filter
    /// is not shown, as in the kernel.
    pub fn canonical(&self) -> String {
        let mut s = match self.kind {
            ProbeKind::Fentry | ProbeKind::Fexit => {
                let mut s = String::from("f");
                if self.kind == ProbeKind::Fexit && self.maxactive != 0 {
                    s.push_str(&self.maxactive.to_string());
                }
                s.push_str(&format!(
                    ":{}/{} {}{}",
                    self.group,
                    self.event,
                    self.target,
                    if self.kind == ProbeKind::Fexit {
                        "%return"
                    } else {
                        ""
                    }
                ));
                s
            }
            ProbeKind::Tracepoint => format!("t:{}/{} {}", self.group, self.event, self.target),
            ProbeKind::Eprobe => format!(
                "e:{}/{} {}.{}",
                self.group, self.event, self.target_system, self.target
            ),
            ProbeKind::Uprobe | ProbeKind::Uretprobe => format!(
                "{}:{}/{} {}:0x{:016x}",
                if self.kind == ProbeKind::Uretprobe {
                    'r'
                } else {
                    'p'
                },
                self.group,
                self.event,
                self.target,
                self.uprobe_offset
            ),
        };
        for a in &self.args {
            s.push(' ');
            s.push_str(&a.name);
            s.push('=');
            s.push_str(&a.comm);
        }
        s
    }

    /// Whether a removal line selects this event (`dyn_event_release` +
    /// each kind's `match`).
    pub fn matches(&self, r: &Removal) -> bool {
        if r.group.as_deref().is_some_and(|g| g != self.group) {
            return false;
        }
        if r.event.as_deref().is_some_and(|e| e != self.event) {
            return false;
        }
        let Some((head, rest)) = r.match_args.split_first() else {
            return true;
        };
        let head_ok = match self.kind {
            ProbeKind::Eprobe => {
                let sep = head.find('/').or_else(|| head.find('.'));
                sep.is_some_and(|p| head[..p] == self.target_system && head[p + 1..] == self.target)
            }
            ProbeKind::Uprobe | ProbeKind::Uretprobe => {
                *head == format!("{}:0x{:x}", self.target, self.uprobe_offset)
                    || *head == format!("{}:0x{:016x}", self.target, self.uprobe_offset)
            }
            _ => *head == self.target,
        };
        if !head_ok || rest.len() > self.args.len() {
            return false;
        }
        rest.iter()
            .zip(&self.args)
            .all(|(w, a)| *w == format!("{}={}", a.name, a.comm))
    }
}
