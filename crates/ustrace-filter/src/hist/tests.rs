use super::*;

/// A kmalloc-like event (histogram.rst 2.1).
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
            f("ptr", "const void *", 16, 8, false),
            f("bytes_req", "size_t", 24, 8, false),
            f("bytes_alloc", "size_t", 32, 8, false),
            f("gfp_flags", "gfp_t", 40, 4, false),
            f("comm", "char[16]", 44, 16, false),
            f("name", "__data_loc char[]", 60, 4, false),
        ]
        .into_iter()
        .find(|f| f.name == name)
    }
}

fn info(spec: &str) -> String {
    let h = parse(spec, &Kmalloc, false).unwrap();
    h.info(None, h.filter.as_deref(), false)
}

fn err(spec: &str) -> (Option<HistErrorKind>, usize, i32) {
    let e = parse(spec, &Kmalloc, false).unwrap_err();
    (e.kind, e.pos, e.errno)
}

#[test]
fn info_lines_of_the_document() {
    assert_eq!(
        info("key=call_site:val=bytes_req"),
        "hist:keys=call_site:vals=hitcount,bytes_req:sort=hitcount:size=2048 [active]"
    );
    assert_eq!(
        info("key=call_site.sym-offset:val=bytes_req:sort=bytes_req.descending"),
        "hist:keys=call_site.sym-offset:vals=hitcount,bytes_req:sort=bytes_req.descending:size=2048 [active]"
    );
    assert_eq!(
        info("keys=call_site.sym:values=bytes_req,bytes_alloc:sort=bytes_alloc.descending"),
        "hist:keys=call_site.sym:vals=hitcount,bytes_req,bytes_alloc:sort=bytes_alloc.descending:size=2048 [active]"
    );
    assert_eq!(
        info("keys=common_stacktrace:values=bytes_req,bytes_alloc:sort=bytes_alloc"),
        "hist:keys=common_stacktrace:vals=hitcount,bytes_req,bytes_alloc:sort=bytes_alloc:size=2048 [active]"
    );
    assert_eq!(
        info("key=common_pid.execname,bytes_req:val=hitcount:sort=common_pid,bytes_req"),
        "hist:keys=common_pid.execname,bytes_req:vals=hitcount:sort=common_pid.execname,bytes_req:size=2048 [active]"
    );
    assert_eq!(
        info("key=comm:val=hitcount:size=256"),
        "hist:keys=comm:vals=hitcount:sort=hitcount:size=256 [active]"
    );
    assert_eq!(
        info("keys=call_site.hex:vals=hitcount,bytes_req:sort=hitcount if bytes_req > 4096"),
        "hist:keys=call_site.hex:vals=hitcount,bytes_req:sort=hitcount:size=2048 if bytes_req > 4096 [active]"
    );
    assert_eq!(
        info("keys=bytes_req.log2:vals=bytes_alloc:size=300"),
        "hist:keys=bytes_req.log2:vals=hitcount,bytes_alloc:sort=hitcount:size=512 [active]"
    );
    assert_eq!(
        info("keys=bytes_req.buckets=32:vals=bytes_alloc"),
        "hist:keys=bytes_req.buckets=32:vals=hitcount,bytes_alloc:sort=hitcount:size=2048 [active]"
    );
}

#[test]
fn a_second_hitcount_is_a_value() {
    assert_eq!(
        info("keys=call_site:vals=hitcount,hitcount"),
        "hist:keys=call_site:vals=hitcount,hitcount:sort=hitcount:size=2048 [active]"
    );
    assert_eq!(
        info("keys=call_site:vals=hitcount,bytes_req"),
        "hist:keys=call_site:vals=hitcount,bytes_req:sort=hitcount:size=2048 [active]"
    );
}

#[test]
fn bucketed_values_are_refused() {
    // The kernel's error position is the first occurrence of the value's text.
    let spec = "key=call_site:val=bytes_req.buckets=32";
    assert_eq!(
        err(spec),
        (
            Some(HistErrorKind::BadFieldModifier),
            "hist:key=call_site:val=".len(),
            EINVAL
        )
    );
}

#[test]
fn variables_expressions_and_actions() {
    assert_eq!(
        info("keys=common_pid:ts0=common_timestamp.usecs"),
        "hist:keys=common_pid:vals=hitcount:ts0=common_timestamp.usecs:sort=hitcount:size=2048:clock=global [active]"
    );
    assert_eq!(
        info("keys=common_pid:x=bytes_req+bytes_alloc,y=bytes_req*2:vals=bytes_req"),
        "hist:keys=common_pid:vals=hitcount,bytes_req:x=bytes_req+bytes_alloc,y=bytes_req*2:sort=hitcount:size=2048 [active]"
    );
    assert_eq!(
        info("keys=common_pid:c=10/3"),
        "hist:keys=common_pid:vals=hitcount:c=4:sort=hitcount:size=2048 [active]"
    );
    // histogram.rst's block_lat: a stack variable prints without a `.stacktrace` modifier
    // (the kernel's `hist_field_print`).
    assert_eq!(
        info("keys=common_pid:ts=common_timestamp.usecs,st=common_stacktrace  if bytes_req == 2"),
        "hist:keys=common_pid:vals=hitcount:ts=common_timestamp.usecs,st=common_stacktrace:sort=hitcount:size=2048:clock=global if bytes_req == 2 [active]"
    );
    let h = parse(
        "keys=common_pid:m=bytes_req:onmax($m).save(bytes_alloc,call_site)",
        &Kmalloc,
        false,
    )
    .unwrap();
    assert_eq!(h.actions.len(), 1);
    assert!(h
        .info(None, None, true)
        .ends_with(":onmax($m).save(bytes_alloc,call_site) [paused]"));
    let h = parse(
        "keys=common_pid:onmatch(sched.wakeup).trace(lat,$x,common_pid)",
        &Kmalloc,
        false,
    )
    .unwrap();
    assert_eq!(h.actions[0].synth_name(), Some("lat"));
    assert!(h
        .info(None, None, false)
        .contains(":onmatch(sched.wakeup).trace(lat,$x,common_pid)"));
}

/// Checks the error of `spec`: its kind, errno and the text the caret points at (the
/// first occurrence of `at` in the command, as the kernel's `errpos`; "" is byte 0).
fn check(spec: &str, kind: Option<HistErrorKind>, at: &str, errno: i32) {
    let cmd = format!("hist:{spec}");
    let pos = if at.is_empty() {
        0
    } else {
        cmd.find(at).expect("needle in command")
    };
    assert_eq!(err(spec), (kind, pos, errno), "{spec}");
}

#[test]
fn limits_and_errors() {
    use HistErrorKind as K;
    check("", None, "", EINVAL);
    check("vals=bytes_req", None, "", EINVAL);
    check("keys=a,b,c,d", Some(K::FieldNotFound), "a", EINVAL);
    check("keys=common_pid,call_site,bytes_req,ptr", None, "", EINVAL);
    check(
        "keys=call_site:vals=bytes_req,bytes_alloc,ptr",
        None,
        "",
        EINVAL,
    );
    check("keys=call_site:size=100000000", None, "", EINVAL);
    check("keys=call_site:size=64", None, "", EINVAL);
    assert_eq!(
        parse("keys=call_site:size=129", &Kmalloc, false)
            .unwrap()
            .attrs
            .map_bits,
        8
    );
    check(
        "keys=call_site:vals=",
        Some(K::EmptyAssignment),
        "vals=",
        EINVAL,
    );
    check(
        "keys=call_site.foo",
        Some(K::BadFieldModifier),
        "foo",
        EINVAL,
    );
    check(
        "keys=bytes_req.execname",
        Some(K::BadFieldModifier),
        "execname",
        EINVAL,
    );
    check(
        "keys=bytes_req.percent",
        Some(K::BadFieldModifier),
        "percent",
        EINVAL,
    );
    check(
        "keys=bytes_req.buckets=x",
        Some(K::BadFieldModifier),
        "x",
        EINVAL,
    );
    check("keys=nope", Some(K::FieldNotFound), "nope", EINVAL);
    check(
        "keys=call_site:sort=bytes_req",
        Some(K::InvalidSortField),
        "bytes_req",
        EINVAL,
    );
    check(
        "keys=call_site:sort=hitcount.up",
        Some(K::InvalidSortModifier),
        "up",
        EINVAL,
    );
    check(
        "keys=call_site:sort=hitcount,",
        Some(K::EmptySortField),
        "sort=",
        EINVAL,
    );
    check(
        "keys=call_site:sort=hitcount,call_site,hitcount",
        Some(K::TooManySortFields),
        "sort=",
        EINVAL,
    );
    check(
        "keys=call_site:nohitcount",
        Some(K::NeedNohcVal),
        "",
        ENOENT,
    );
    check(
        "keys=call_site:x=bytes_req/0",
        Some(K::DivisionByZero),
        "0",
        EDOM,
    );
    check(
        "keys=call_site:x=1+2+3+4+5+6",
        Some(K::TooManySubexpr),
        "1+2",
        EINVAL,
    );
    check(
        "keys=call_site:x=comm+1",
        Some(K::InvalidStrOperand),
        "comm",
        EINVAL,
    );
    check(
        "keys=call_site:x=0xzz",
        Some(K::ExpectNumber),
        "0xzz",
        EINVAL,
    );
    check("keys=call_site:x=-bytes_req", None, "", EINVAL);
    check(
        "keys=call_site:x=-(bytes_req)+1",
        Some(K::UnaryMinusSubexpr),
        "bytes_req)",
        EINVAL,
    );
    check("keys=call_site:x", None, "", EINVAL);
    check(
        "keys=call_site:x=1,y",
        Some(K::MalformedAssignment),
        "y",
        EINVAL,
    );
    check("keys=call_site:x=1:x=2", Some(K::DuplicateVar), "x", EINVAL);
    check(
        "keys=call_site:x=bytes_req.log2",
        Some(K::BadFieldModifier),
        "bytes_req.log2",
        EINVAL,
    );
    check(
        "keys=call_site:vals=call_site.sym",
        Some(K::BadFieldModifier),
        "call_site.sym",
        EINVAL,
    );
    check("keys=$x", Some(K::VarNotFound), "x", EINVAL);
    check(
        "keys=call_site:onmatch(sched",
        Some(K::NoClosingParen),
        "sched",
        EINVAL,
    );
    check(
        "keys=call_site:onmatch(sched).trace(x,$y)",
        Some(K::SubsysNotFound),
        "sched",
        EINVAL,
    );
    check(
        "keys=call_site:onmatch(a.b)",
        Some(K::ActionNotFound),
        "",
        EINVAL,
    );
    check(
        "keys=call_site:onmatch(a.b).save(ab)",
        Some(K::ActionMismatch),
        "save",
        EINVAL,
    );
    check(
        "keys=call_site:onmax(x).save(ab)",
        Some(K::OnxNotVar),
        "x",
        EINVAL,
    );
    check(
        "keys=call_site:onmax($x).save(ab)",
        Some(K::OnxVarNotFound),
        "x",
        EINVAL,
    );
    check(
        "keys=call_site:onmatch(a.b).trace(x,y)",
        Some(K::InvalidParam),
        "x",
        EINVAL,
    );
    check("keys=call_site:bogus", None, "", EINVAL);
    let many: Vec<String> = (0..16).map(|i| format!("v{i}=1")).collect();
    check(
        &format!("keys=call_site:{}:w=1", many.join(",")),
        Some(K::TooManyVars),
        "w",
        EINVAL,
    );
    // One assignment holds at most 16: the kernel drops the rest of it unread.
    let h = parse(
        &format!("keys=call_site:{},v16=1", many.join(",")),
        &Kmalloc,
        false,
    )
    .unwrap();
    assert_eq!(h.n_vars, 16);
}

#[test]
fn the_filter_is_split_off_as_the_kernel_does() {
    let h = parse("keys=call_site if  bytes_req > 1", &Kmalloc, false).unwrap();
    assert_eq!(h.filter.as_deref(), Some(" bytes_req > 1"));
    assert_eq!(h.param, "keys=call_site");
    let h = parse("keys=call_site:name=difference", &Kmalloc, false).unwrap();
    assert_eq!(h.filter, None);
    assert_eq!(h.attrs.name.as_deref(), Some("difference"));
    assert_eq!(err("keys=call_site if"), (None, 0, EINVAL));
}

#[test]
fn compound_keys_are_laid_out_in_eight_byte_slots() {
    let h = parse("keys=gfp_flags,comm,name", &Kmalloc, false).unwrap();
    let offsets: Vec<_> = h.keys().iter().map(|k| (k.offset, k.size)).collect();
    assert_eq!(offsets, [(0, 8), (8, 16), (24, 256)]);
    assert_eq!(h.key_size, 280);
    assert_eq!(err("keys=name,name"), (None, 0, EINVAL));
}

#[test]
fn division_by_constants_rounds_as_the_kernel() {
    assert_eq!(eval_op(Op::Div, div_by(3), 10, 3), 4);
    assert_eq!(eval_op(Op::Div, div_by(4), 10, 4), 2);
    assert_eq!(eval_op(Op::Div, div_by(3), 3 << 21, 3), 1 << 21);
    assert_eq!(eval_op(Op::Div, DivBy::Runtime, 10, 0), u64::MAX);
}
