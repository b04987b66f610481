//! Property tests: the parser never panics on any input, and the text read
//! back for an accepted definition parses to the same definition.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use ustrace_probe::*;

/// Fetch-argument bodies from the grammar's pieces (valid and not).
fn fetch_arg() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("$arg1".to_owned()),
        Just("$arg3".to_owned()),
        Just("$stack".to_owned()),
        Just("$stack2".to_owned()),
        Just("$comm".to_owned()),
        Just("$retval".to_owned()),
        Just("@0x1000".to_owned()),
        Just("%di".to_owned()),
        Just("\\\"lit\"".to_owned()),
        (0u32..5000).prop_map(|n| format!("\\{n}")),
        "[a-z_][a-z0-9_]{0,6}",
        "[$@%+\\\\a-z0-9()\\-:\\[\\]\"]{0,12}",
    ];
    let expr = leaf.prop_recursive(4, 16, 1, |inner| {
        (any::<bool>(), any::<bool>(), -64i32..64, inner).prop_map(|(u, neg, off, e)| {
            let sign = if neg { '-' } else { '+' };
            let u = if u { "u" } else { "" };
            format!("{sign}{u}{}({e})", off.unsigned_abs())
        })
    });
    let ty = prop_oneof![
        Just(String::new()),
        Just(":u8".to_owned()),
        Just(":s32".to_owned()),
        Just(":x64".to_owned()),
        Just(":string".to_owned()),
        Just(":ustring".to_owned()),
        Just(":symbol".to_owned()),
        Just(":char".to_owned()),
        Just(":b3@2/32".to_owned()),
        (1u32..70).prop_map(|n| format!(":u16[{n}]")),
        "[:a-z0-9@/\\[\\]]{0,8}",
    ];
    let name = prop_oneof![Just(String::new()), "[a-z_][a-z0-9_]{0,8}=".prop_map(|s| s)];
    (name, expr, ty).prop_map(|(n, e, t)| format!("{n}{e}{t}"))
}

fn head() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("f vfs_read".to_owned()),
        Just("f:grp/ev vfs_read%return".to_owned()),
        Just("f8 vfs_read%return".to_owned()),
        Just("f:my_crate::f".to_owned()),
        Just("f my_crate::io::read".to_owned()),
        Just("t sched_switch".to_owned()),
        Just("t:tp/x 9p_fid".to_owned()),
        Just("e sched.sched_switch".to_owned()),
        Just("e:a/b sched/sched_switch".to_owned()),
        "[a-z:/0-9._-]{1,12} [a-z_:%.]{1,12}",
    ]
}

struct Env;

impl ProbeEnv for Env {
    fn event_fields(&self, system: &str, event: &str) -> Option<Vec<FieldSpec>> {
        (system == "sched" && event == "sched_switch").then(|| {
            vec![FieldSpec {
                name: "prev_pid".to_owned(),
                c_type: "pid_t".to_owned(),
                offset: 8,
                size: 4,
                signed: true,
                kind: FieldKind::Int,
            }]
        })
    }
}

proptest! {
    // Regressions are kept beside this file (`props.proptest-regressions`): the default
    // (`SourceParallel`) looks for a lib.rs above a test in tests/, finds none and says so.
    #![proptest_config(ProptestConfig {
        cases: 3000,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn never_panics_on_bytes(s in "\\PC{0,200}") {
        let _ = parse_command(&s, &Env);
    }

    #[test]
    fn canonical_reparses_to_the_same_definition(
        h in head(),
        args in proptest::collection::vec(fetch_arg(), 0..6),
    ) {
        let line = format!("{h} {}", args.join(" "));
        match parse_command(&line, &Env) {
            Ok(DynCommand::Create(d)) => {
                let text = d.canonical();
                match parse_command(&text, &Env) {
                    Ok(DynCommand::Create(d2)) => {
                        prop_assert_eq!(d2.canonical(), text.clone());
                        prop_assert_eq!(d2.kind, d.kind);
                        prop_assert_eq!(&d2.group, &d.group);
                        prop_assert_eq!(&d2.event, &d.event);
                        prop_assert_eq!(&d2.args, &d.args);
                        prop_assert_eq!(&d2.entry_args, &d.entry_args);
                        let p = d.compile(None);
                        let fields = p.fields();
                        // Fixed fields tile the record without overlap.
                        let mut end = COMMON_HEADER_SIZE;
                        for f in &fields {
                            prop_assert_eq!(f.offset, end);
                            end += f.size;
                        }
                    }
                    other => prop_assert!(false, "{} re-parsed as {:?}", text, other),
                }
            }
            Ok(_) => {}
            Err(e) => {
                // Every logged error points inside or just after the command.
                if e.id.is_some() {
                    prop_assert!(e.caret() <= e.command().len() + 1, "{}", e);
                    prop_assert!(e.log_text().ends_with("^\n"));
                }
            }
        }
    }
}
