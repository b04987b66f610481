//! Properties of the hist-trigger parser on writes built from the grammar's pieces (and
//! mangled): it never panics, a caret never points past the command, a parsed trigger keeps
//! the kernel's limits, and its info line parses back to a trigger that prints the same line.

use proptest::prelude::*;
use ustrace_filter::hist::{self, EventField, HistEnv, KEYS_MAX, KEY_SIZE_MAX, VALS_MAX, VARS_MAX};

struct Kmalloc;

impl HistEnv for Kmalloc {
    fn event(&self) -> (&str, &str) {
        ("kmem", "kmalloc")
    }
    fn field(&self, name: &str) -> Option<EventField> {
        let f = |name: &str, c_type: &str, offset, size, signed| EventField {
            name: name.into(),
            c_type: c_type.into(),
            offset,
            size,
            signed,
        };
        [
            f("common_pid", "int", 4, 4, true),
            f("call_site", "unsigned long", 8, 8, false),
            f("bytes_req", "size_t", 16, 8, false),
            f("gfp_flags", "gfp_t", 24, 4, false),
            f("delta", "s64", 32, 8, true),
            f("comm", "char[16]", 40, 16, false),
            f("name", "__data_loc char[]", 56, 4, false),
        ]
        .into_iter()
        .find(|f| f.name == name)
    }
}

fn atom() -> impl Strategy<Value = String> {
    let field = prop_oneof![
        Just("common_pid"),
        Just("call_site"),
        Just("bytes_req"),
        Just("gfp_flags"),
        Just("delta"),
        Just("comm"),
        Just("name"),
        Just("common_timestamp"),
        Just("common_cpu"),
        Just("common_stacktrace"),
        Just("hitcount"),
        Just("cpu"),
        Just("nosuch"),
        Just("$x"),
        Just("12"),
        Just("0x1f"),
    ];
    let modifier = prop_oneof![
        Just(""),
        Just(".hex"),
        Just(".sym"),
        Just(".sym-offset"),
        Just(".execname"),
        Just(".syscall"),
        Just(".log2"),
        Just(".buckets=10"),
        Just(".usecs"),
        Just(".percent"),
        Just(".graph"),
        Just(".stacktrace"),
        Just(".descending"),
        Just(".bogus"),
    ];
    (field, modifier).prop_map(|(f, m)| format!("{f}{m}"))
}

fn expr() -> impl Strategy<Value = String> {
    let op = prop_oneof![Just("+"), Just("-"), Just("*"), Just("/")];
    prop_oneof![
        atom(),
        (atom(), op.clone(), atom()).prop_map(|(a, o, b)| format!("{a}{o}{b}")),
        (atom(), op.clone(), atom(), op, atom())
            .prop_map(|(a, o, b, p, c)| format!("{a}{o}{b}{p}{c}")),
        atom().prop_map(|a| format!("-({a})")),
    ]
}

fn list(s: impl Strategy<Value = String>, max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(s, 0..=max).prop_map(|v| v.join(","))
}

fn spec() -> impl Strategy<Value = String> {
    let attr = prop_oneof![
        list(atom(), 4).prop_map(|k| format!("keys={k}")),
        list(atom(), 4).prop_map(|k| format!("key={k}")),
        list(expr(), 3).prop_map(|v| format!("vals={v}")),
        list(atom(), 3).prop_map(|v| format!("sort={v}")),
        (0u32..300_000).prop_map(|n| format!("size={n}")),
        Just("name=foo".to_string()),
        Just("pause".to_string()),
        Just("cont".to_string()),
        Just("clear".to_string()),
        Just("nohitcount".to_string()),
        Just("clock=mono".to_string()),
        (prop::sample::select(vec!["x", "y", "ts0"]), expr()).prop_map(|(n, e)| format!("{n}={e}")),
        Just("onmax($x).save(bytes_req,call_site)".to_string()),
        Just("onchange($x).snapshot()".to_string()),
        Just("onmatch(sched.wakeup).trace(lat,$x,common_pid)".to_string()),
        Just("onmatch(sched.wakeup).lat($x)".to_string()),
        "[a-z=.,:()$ ]{0,12}",
    ];
    let filter = prop_oneof![
        Just(String::new()),
        Just(" if bytes_req > 10".to_string()),
        Just(" if  comm == \"bash\"".to_string()),
        Just(" if".to_string()),
    ];
    (prop::collection::vec(attr, 1..6), filter)
        .prop_map(|(attrs, f)| format!("{}{f}", attrs.join(":")))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_parser_keeps_its_promises(text in spec(), remove in any::<bool>()) {
        check(&text, remove);
    }

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,80}") {
        check(&text, false);
    }
}

fn check(text: &str, remove: bool) {
    match hist::parse(text, &Kmalloc, remove) {
        Err(e) => {
            assert!(e.pos <= text.len() + "hist:".len(), "{text}: {e:?}");
            assert!(e.errno > 0);
        }
        Ok(h) => {
            assert!((1..=KEYS_MAX).contains(&h.n_keys), "{text}");
            assert!((1..=VALS_MAX).contains(&h.n_sums()), "{text}");
            assert!(h.n_vars <= VARS_MAX, "{text}");
            assert!(h.key_size <= KEY_SIZE_MAX, "{text}");
            assert!(
                h.keys().iter().all(|k| k.offset + k.size <= h.key_size),
                "{text}"
            );
            assert!((1..=2).contains(&h.sort_keys.len()), "{text}");
            let info = h.info(None, h.filter.as_deref(), false);
            let spec = info
                .strip_prefix("hist:")
                .and_then(|s| s.strip_suffix(" [active]"))
                .expect("info line shape");
            // The info line is a fixed point: what it says parses to a trigger that prints
            // it again. (It need not name the same fields: the kernel prints
            // `common_stacktrace.log2` as `common_stacktrace`, and sort keys with modifiers
            // that `sort=` refuses; those fail to parse and are skipped.)
            // Nor is it one when a key is `common_timestamp.stacktrace`: the kernel prints
            // that as `common_stacktrace` yet the timestamp still sets `:clock=`, which the
            // printed line then cannot set again.
            let clock_without_timestamp =
                info.contains(":clock=") && !spec.contains("common_timestamp");
            if clock_without_timestamp {
                return;
            }
            if let Ok(again) = hist::parse(spec, &Kmalloc, remove) {
                assert_eq!(
                    again.info(None, again.filter.as_deref(), false),
                    info,
                    "{text}"
                );
            }
        }
    }
}

/// Found by the property above on a CI run: a `common_timestamp.stacktrace` key prints as
/// `common_stacktrace` with the timestamp's `:clock=global`.
#[test]
fn a_timestamp_stacktrace_key_prints_the_clock_it_set() {
    let text =
        "key=common_timestamp.stacktrace,call_site.syscall,gfp_flags.buckets=10 if bytes_req > 10";
    let h = hist::parse(text, &Kmalloc, false).expect("parses");
    assert_eq!(
        h.info(None, h.filter.as_deref(), false),
        "hist:keys=common_stacktrace,call_site.syscall,gfp_flags.buckets=10:vals=hitcount:sort=hitcount:size=2048:clock=global if bytes_req > 10 [active]"
    );
    check(text, false);
}
