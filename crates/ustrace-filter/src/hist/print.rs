//! How the kernel prints hist fields: the names in `hist` lines and sort keys
//! (`hist_field_name`), expression names (`expr_str`) and the `trigger info` line
//! (`event_hist_trigger_print`).

use super::{flags, HistData, HistField, Op};

/// The field's display name (`hist_field_name`).
pub(crate) fn field_name(f: &HistField, level: u32) -> String {
    if level > 1 {
        return String::new();
    }
    if let Some(ef) = &f.field {
        return ef.name.clone();
    }
    if f.has(flags::LOG2 | flags::ALIAS | flags::BUCKET) {
        return f
            .operands
            .first()
            .map(|o| field_name(o, level + 1))
            .unwrap_or_default();
    }
    if f.has(flags::CPU) {
        return "common_cpu".into();
    }
    if f.has(flags::COMM) {
        return "common_comm".into();
    }
    if f.has(flags::EXPR | flags::VAR_REF) {
        let name = f.name.clone().unwrap_or_default();
        return match (&f.system, &f.event) {
            (Some(s), Some(e)) => format!("{s}.{e}.{name}"),
            _ => name,
        };
    }
    if f.has(flags::TIMESTAMP) {
        return "common_timestamp".into();
    }
    if f.has(flags::STACKTRACE) {
        return "common_stacktrace".into();
    }
    if f.has(flags::HITCOUNT) {
        return "hitcount".into();
    }
    String::new()
}

/// The modifier a field prints with (`get_hist_field_flags`).
pub(crate) fn modifier(f: &HistField) -> Option<&'static str> {
    let table: [(u32, &str); 11] = [
        (flags::HEX, "hex"),
        (flags::SYM, "sym"),
        (flags::SYM_OFFSET, "sym-offset"),
        (flags::EXECNAME, "execname"),
        (flags::SYSCALL, "syscall"),
        (flags::LOG2, "log2"),
        (flags::BUCKET, "buckets"),
        (flags::TIMESTAMP_USECS, "usecs"),
        (flags::PERCENT, "percent"),
        (flags::GRAPH, "graph"),
        (flags::STACKTRACE, "stacktrace"),
    ];
    table
        .iter()
        .find(|(fl, _)| f.flags & fl != 0)
        .map(|(_, s)| *s)
}

fn expr_field_str(f: &HistField, out: &mut String) {
    if f.has(flags::VAR_REF) {
        out.push('$');
    } else if f.has(flags::CONST) {
        out.push_str(&f.constant.to_string());
    }
    out.push_str(&field_name(f, 0));
    if f.flags != 0 && !f.has(flags::VAR_REF) {
        if let Some(m) = modifier(f) {
            out.push('.');
            out.push_str(m);
        }
    }
}

/// The name of an expression field (`expr_str`); `None` where the kernel gets none (an
/// operand that is itself a `.log2` or `.buckets` field, or nesting past one level).
pub(crate) fn expr_str(f: &HistField) -> Option<String> {
    expr_str_at(f, 0)
}

fn expr_str_at(f: &HistField, level: u32) -> Option<String> {
    if level > 1 {
        return None;
    }
    let mut out = String::new();
    if f.operands.is_empty() {
        expr_field_str(f, &mut out);
        return Some(out);
    }
    if f.operator == Op::UnaryMinus {
        out.push_str("-(");
        out.push_str(&expr_str_at(&f.operands[0], level + 1)?);
        out.push(')');
        return Some(out);
    }
    let (Some(a), Some(b)) = (f.operands.first(), f.operands.get(1)) else {
        return None;
    };
    expr_field_str(a, &mut out);
    out.push(match f.operator {
        Op::Minus => '-',
        Op::Plus => '+',
        Op::Div => '/',
        Op::Mult => '*',
        _ => return None,
    });
    expr_field_str(b, &mut out);
    Some(out)
}

/// One field as the `trigger info` line shows it (`hist_field_print`).
pub(crate) fn field_print(f: &HistField, out: &mut String) {
    if let Some(v) = &f.var_name {
        out.push_str(v);
        out.push('=');
    }
    let name = field_name(f, 0);
    if f.has(flags::CPU) {
        out.push_str("common_cpu");
    } else if f.has(flags::CONST) {
        out.push_str(&f.constant.to_string());
    } else if !name.is_empty() {
        if f.has(flags::VAR_REF | flags::ALIAS) {
            out.push('$');
        }
        out.push_str(&name);
    } else if f.has(flags::TIMESTAMP) {
        out.push_str("common_timestamp");
    }
    // A stack variable (`st=common_stacktrace`) prints as its name alone, as the kernel's
    // `hist_field_print` skips the modifier of stacktrace fields.
    if f.flags != 0 && !f.has(flags::VAR_REF | flags::EXPR | flags::STACKTRACE) {
        if let Some(m) = modifier(f) {
            out.push('.');
            out.push_str(m);
        }
    }
    if f.buckets != 0 {
        out.push_str(&format!("={}", f.buckets));
    }
}

/// The `trigger info` line without its newline (`event_hist_trigger_print`); `name` is
/// the shared histogram's name.
pub(crate) fn trigger_info(
    h: &HistData,
    name: Option<&str>,
    filter: Option<&str>,
    paused: bool,
) -> String {
    let mut out = String::from("hist:");
    if let Some(name) = name {
        out.push_str("name=");
        out.push_str(name);
        out.push(':');
    }
    out.push_str("keys=");
    for (i, f) in h.keys().iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        if f.has(flags::STACKTRACE) {
            match &f.field {
                Some(ef) => out.push_str(&format!("{}.stacktrace", ef.name)),
                None => out.push_str("common_stacktrace"),
            }
        } else {
            field_print(f, &mut out);
        }
    }
    out.push_str(":vals=");
    let mut have_var = false;
    let mut show_val = false;
    for (i, f) in h.vals().iter().enumerate() {
        if f.has(flags::VAR) {
            have_var = true;
            continue;
        }
        if i == 0 {
            if h.attrs.no_hitcount {
                continue;
            }
            out.push_str("hitcount");
        } else {
            if show_val {
                out.push(',');
            }
            field_print(f, &mut out);
        }
        show_val = true;
    }
    if have_var {
        out.push(':');
        for (n, f) in h.vals().iter().filter(|f| f.has(flags::VAR)).enumerate() {
            if n > 0 {
                out.push(',');
            }
            field_print(f, &mut out);
        }
    }
    out.push_str(":sort=");
    for (i, k) in h.sort_keys.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        if k.field_idx == 0 {
            out.push_str("hitcount");
        } else {
            field_print(h.sort_field(k.field_idx), &mut out);
        }
        if k.descending {
            out.push_str(".descending");
        }
    }
    let bits = if h.attrs.map_bits != 0 {
        h.attrs.map_bits
    } else {
        super::BITS_DEFAULT
    };
    out.push_str(&format!(":size={}", 1u64 << bits));
    if h.enable_timestamps {
        out.push_str(&format!(":clock={}", h.attrs.clock));
    }
    if h.attrs.no_hitcount {
        out.push_str(":nohitcount");
    }
    for a in &h.actions {
        out.push_str(&action_spec(h, a));
    }
    if let Some(filter) = filter {
        out.push_str(" if ");
        out.push_str(filter);
    }
    out.push_str(if paused { " [paused]" } else { " [active]" });
    out
}

fn action_spec(_h: &HistData, a: &super::Action) -> String {
    use super::{ActionKind, Handler};
    let mut out = match &a.handler {
        Handler::OnMatch { system, event } => format!(":onmatch({system}.{event})."),
        Handler::OnMax { var } => format!(":onmax({var})."),
        Handler::OnChange { var } => format!(":onchange({var})."),
    };
    out.push_str(&a.action_name);
    out.push('(');
    match a.kind {
        ActionKind::Save => out.push_str(&a.params.join(",")),
        ActionKind::Trace => {
            let mut parts = Vec::new();
            if a.use_trace_keyword {
                parts.push(a.synth_event_name.clone().unwrap_or_default());
            }
            parts.extend(a.params.iter().cloned());
            out.push_str(&parts.join(","));
        }
        ActionKind::Snapshot => {}
    }
    out.push(')');
    out
}

/// The kernel's `hist_trigger_match` on fields, sort keys and actions.
pub(crate) fn same_shape(a: &HistData, b: &HistData) -> bool {
    if a.n_vals != b.n_vals
        || a.fields.len() != b.fields.len()
        || a.sort_keys.len() != b.sort_keys.len()
    {
        return false;
    }
    let compatible = |x: &Option<super::EventField>, y: &Option<super::EventField>| match (x, y) {
        (None, None) => true,
        (Some(x), Some(y)) => {
            x.name == y.name && x.c_type == y.c_type && x.size == y.size && x.signed == y.signed
        }
        _ => false,
    };
    let fields_match = a.fields.iter().zip(&b.fields).all(|(x, y)| {
        x.flags == y.flags
            && compatible(&x.field, &y.field)
            && x.offset == y.offset
            && x.size == y.size
            && x.signed == y.signed
            && x.var_name == y.var_name
    });
    fields_match && a.sort_keys == b.sort_keys && actions_match(a, b)
}

fn actions_match(a: &HistData, b: &HistData) -> bool {
    a.actions.len() == b.actions.len()
        && a.actions.iter().zip(&b.actions).all(|(x, y)| {
            x.handler == y.handler
                && x.kind == y.kind
                && x.params == y.params
                && x.synth_name().unwrap_or(&x.action_name)
                    == y.synth_name().unwrap_or(&y.action_name)
        })
}
