//! Property tests: the compilers never panic, compiled text round-trips, and
//! evaluation agrees with a direct tree-walking reference evaluator.

mod common;

use common::{maybe_broken_expression, trigger_text, SYS_ENTER};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use ustrace_filter::trigger::{self, Kind};
use ustrace_filter::{compile, CompileEnv, Context};

fn env() -> CompileEnv<'static> {
    CompileEnv {
        nr_cpus: 4,
        ..CompileEnv::default()
    }
}

/// The integer fields of sys_enter: (name, offset, size, signed).
const INT_FIELDS: [(&str, usize, u8, bool); 5] = [
    ("common_type", 0, 2, false),
    ("common_flags", 2, 1, false),
    ("common_preempt_count", 3, 1, false),
    ("common_pid", 4, 4, true),
    ("id", 8, 8, true),
];

#[derive(Debug, Clone)]
enum Expr {
    Pred {
        field: usize,
        op: &'static str,
        val: i64,
    },
    Cpu {
        op: &'static str,
        val: i32,
    },
    Not(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
}

impl Expr {
    fn render(&self) -> String {
        match self {
            Expr::Pred { field, op, val } => format!("{} {op} {val}", INT_FIELDS[*field].0),
            Expr::Cpu { op, val } => format!("CPU {op} {val}"),
            Expr::Not(e) => format!("!({})", e.render()),
            Expr::And(a, b) => format!("({}) && ({})", a.render(), b.render()),
            Expr::Or(a, b) => format!("({}) || ({})", a.render(), b.render()),
        }
    }

    /// Plain semantics: read the field at its width and signedness, convert
    /// the constant to that width the way a C cast does, compare.
    fn eval(&self, rec: &[u8], cpu: u32) -> bool {
        match self {
            Expr::Pred { field, op, val } => {
                let (_, off, size, signed) = INT_FIELDS[*field];
                if rec.len() < off + size as usize {
                    return false; // a field outside the record never matches
                }
                let mut raw = [0u8; 8];
                raw[..size as usize].copy_from_slice(&rec[off..off + size as usize]);
                let bits = 8 * u32::from(size);
                let field_u = u64::from_le_bytes(raw);
                let mask = if bits == 64 {
                    u64::MAX
                } else {
                    (1u64 << bits) - 1
                };
                let val_u = (*val as u64) & mask;
                let ord = if signed {
                    let sx = |v: u64| ((v << (64 - bits)) as i64) >> (64 - bits);
                    sx(field_u).cmp(&sx(val_u))
                } else {
                    field_u.cmp(&val_u)
                };
                match *op {
                    "==" => field_u == val_u,
                    "!=" => field_u != val_u,
                    "<" => ord.is_lt(),
                    "<=" => ord.is_le(),
                    ">" => ord.is_gt(),
                    ">=" => ord.is_ge(),
                    "&" => field_u & val_u != 0,
                    _ => unreachable!(),
                }
            }
            Expr::Cpu { op, val } => {
                let cpu = cpu as i32;
                match *op {
                    "==" => cpu == *val,
                    "!=" => cpu != *val,
                    "<" => cpu < *val,
                    "<=" => cpu <= *val,
                    ">" => cpu > *val,
                    ">=" => cpu >= *val,
                    // The kernel's CPU predicate has no `&`: always false.
                    "&" => false,
                    _ => unreachable!(),
                }
            }
            Expr::Not(e) => !e.eval(rec, cpu),
            Expr::And(a, b) => a.eval(rec, cpu) && b.eval(rec, cpu),
            Expr::Or(a, b) => a.eval(rec, cpu) || b.eval(rec, cpu),
        }
    }
}

fn leaf() -> impl Strategy<Value = Expr> {
    let op = prop::sample::select(vec!["==", "!=", "<", "<=", ">", ">=", "&"]);
    prop_oneof![
        4 => (0usize..INT_FIELDS.len(), op.clone(), prop_oneof![-3i64..300, any::<i32>().prop_map(i64::from)])
            .prop_filter_map("unsigned fields take no negative constant", |(field, op, val)| {
                let (_, _, size, signed) = INT_FIELDS[field];
                let fits = signed || val >= 0;
                let val = if !signed && size < 8 { val.rem_euclid(1 << (8 * size as u32)) } else { val };
                fits.then_some(Expr::Pred { field, op, val })
            }),
        1 => (op, -1i32..5).prop_map(|(op, val)| Expr::Cpu { op, val }),
    ]
}

fn expr() -> impl Strategy<Value = Expr> {
    leaf().prop_recursive(5, 24, 2, |inner| {
        prop_oneof![
            inner.clone().prop_map(|e| Expr::Not(Box::new(e))),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| Expr::And(Box::new(a), Box::new(b))),
            (inner.clone(), inner).prop_map(|(a, b)| Expr::Or(Box::new(a), Box::new(b))),
        ]
    })
}

/// Integer comparisons only (no `CPU`, no `&`), with small constants: the
/// programs that take `Program`'s all-integer loop.
fn int_expr() -> impl Strategy<Value = Expr> {
    let op = prop::sample::select(vec!["==", "!=", "<", "<=", ">", ">="]);
    let leaf = (0usize..INT_FIELDS.len(), op, -3i64..6).prop_map(|(field, op, val)| {
        let (_, _, _, signed) = INT_FIELDS[field];
        Expr::Pred {
            field,
            op,
            val: if signed { val } else { val.rem_euclid(6) },
        }
    });
    leaf.prop_recursive(4, 16, 2, |inner| {
        prop_oneof![
            inner.clone().prop_map(|e| Expr::Not(Box::new(e))),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| Expr::And(Box::new(a), Box::new(b))),
            (inner.clone(), inner).prop_map(|(a, b)| Expr::Or(Box::new(a), Box::new(b))),
        ]
    })
}

/// A record whose integer fields hold small values (so comparisons with
/// `int_expr`'s constants land on their boundaries), at a length that is
/// sometimes too short for an 8-byte load of the last field.
fn small_record() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(-3i64..6, INT_FIELDS.len()),
        9usize..40,
    )
        .prop_map(|(vals, len)| {
            let mut r = vec![0u8; len.max(16)];
            for ((_, off, size, _), v) in INT_FIELDS.iter().zip(vals) {
                let bytes = v.to_le_bytes();
                r[*off..*off + *size as usize].copy_from_slice(&bytes[..*size as usize]);
            }
            r.truncate(len);
            r
        })
}

/// A record that often hits the constants the leaves use.
fn record() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(any::<u8>(), 64),
        prop::collection::vec(0u8..4, 16),
    )
        .prop_map(|(mut r, small)| {
            for (i, s) in small.iter().enumerate() {
                if *s == 0 {
                    r[i] = 0;
                }
            }
            r
        })
}

/// Same expression without the defensive parentheses: `&&` binds tighter.
fn render_bare(e: &Expr) -> String {
    match e {
        Expr::Or(a, b) => format!("{} || {}", render_bare(a), render_bare(b)),
        Expr::And(a, b) => {
            let side = |x: &Expr| match x {
                Expr::Or(..) => format!("({})", render_bare(x)),
                _ => render_bare(x),
            };
            format!("{} && {}", side(a), side(b))
        }
        Expr::Not(x) => match **x {
            Expr::Pred { .. } | Expr::Cpu { .. } | Expr::Not(..) => format!("!{}", render_bare(x)),
            _ => format!("!({})", render_bare(x)),
        },
        leaf => leaf.render(),
    }
}

proptest! {
    // Regressions are kept beside this file (`properties.proptest-regressions`): the default
    // (`SourceParallel`) looks for a lib.rs above a test in tests/, finds none and says so.
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,80}", rec in prop::collection::vec(any::<u8>(), 0..80)) {
        if let Ok(p) = compile(&text, &SYS_ENTER, &env()) {
            let _ = p.matches(&rec, &Context { cpu: 1, comm: b"x", read_str: None });
        }
        let _ = trigger::parse(&text);
    }

    #[test]
    fn generated_text_never_panics(text in maybe_broken_expression(), rec in prop::collection::vec(any::<u8>(), 0..80)) {
        match compile(&text, &SYS_ENTER, &env()) {
            Ok(p) => {
                let _ = p.matches(&rec, &Context { cpu: 1, comm: b"bash", read_str: None });
                // What `filter` shows compiles again to the same text.
                let again = compile(p.text(), &SYS_ENTER, &env()).unwrap();
                prop_assert_eq!(again.text(), p.text());
            }
            Err(e) => {
                let shown = e.filter_file_text(&text);
                prop_assert!(shown.ends_with("\n\n"));
                prop_assert!(e.errno() > 0);
            }
        }
    }

    #[test]
    fn evaluation_matches_reference(e in expr(), rec in record(), cpu in 0u32..4) {
        let c = Context { cpu, comm: b"x", read_str: None };
        let text = e.render();
        let p = compile(&text, &SYS_ENTER, &env()).unwrap();
        prop_assert_eq!(p.text(), text.as_str());
        prop_assert_eq!(p.matches(&rec, &c), e.eval(&rec, cpu), "{}", text);
        let bare = render_bare(&e);
        let q = compile(&bare, &SYS_ENTER, &env()).unwrap();
        prop_assert_eq!(q.matches(&rec, &c), e.eval(&rec, cpu), "{}", bare);
    }

    #[test]
    fn integer_programs_match_reference(e in int_expr(), rec in small_record()) {
        let c = Context { cpu: 0, comm: b"x", read_str: None };
        let text = render_bare(&e);
        let p = compile(&text, &SYS_ENTER, &env()).unwrap();
        prop_assert_eq!(p.matches(&rec, &c), e.eval(&rec, 0), "{} on {:?}", text, rec);
    }

    #[test]
    fn trigger_text_never_panics(text in trigger_text()) {
        if let Ok(cmd) = trigger::parse(&text) {
            if !cmd.remove {
                let _ = cmd.listing(cmd.count);
            }
        }
    }

    #[test]
    fn trigger_round_trip(
        kind in prop::sample::select(vec!["traceon", "traceoff", "snapshot", "stacktrace", "enable_event", "disable_event"]),
        count in prop::option::of(0u64..1_000_000),
        filter in prop::option::of("[a-z_]{1,8} == [0-9]{1,4}"),
        remove in any::<bool>(),
    ) {
        let target = if kind.ends_with("_event") { ":sched:sched_switch" } else { "" };
        let mut text = format!("{}{kind}{target}", if remove { "!" } else { "" });
        if let Some(n) = count { text.push_str(&format!(":{n}")); }
        if let Some(f) = &filter { text.push_str(&format!(" if {f}")); }
        let cmd = trigger::parse(&text).unwrap();
        prop_assert_eq!(cmd.remove, remove);
        prop_assert_eq!(cmd.kind.name(), kind);
        if kind.ends_with("_event") {
            prop_assert_eq!(cmd.kind.target(), Some(("sched", "sched_switch")));
        }
        if !remove {
            prop_assert_eq!(cmd.count, count);
            prop_assert_eq!(cmd.filter.as_deref(), filter.as_deref());
            let listing = cmd.listing(cmd.count);
            let expected_count = match count { Some(n) => format!("count={n}"), None => "unlimited".into() };
            prop_assert!(listing.starts_with(&format!("{kind}{target}:{expected_count}")), "{}", listing);
        } else {
            let known = !matches!(cmd.kind, Kind::Hist { .. } | Kind::EnableHist { .. } | Kind::DisableHist { .. });
            prop_assert!(known);
            prop_assert_eq!(cmd.count, None);
        }
    }
}
