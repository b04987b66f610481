//! `trace_event!`: one macro that defines a tracepoint and the event recorded from it.

/// Defines a trace event: a tracepoint, its record layout and its print format.
///
/// ```
/// ustrace::trace_event! {
///     /// A lookup in the store finished.
///     pub fn kv::get(key: &str, hit: bool, latency_ns: u64) {
///         key: &str = key,
///         hit: bool = hit,
///         latency_ns: u64 = latency_ns,
///     }
///     print "key=%s hit=%d latency_ns=%llu", key, hit, latency_ns;
/// }
///
/// get::trace("alpha", true, 1200);   // a 5-byte NOP while the event is off (x86-64)
/// # #[cfg(target_arch = "x86_64")]
/// # {
/// #     // The claim above, checked: every inlined copy of the call site is the NOP
/// #     // `0f 1f 44 00 00` while off, and enabling patches each into a `jmp` (e9).
/// #     let key = &get::KEY as *const _ as usize;
/// #     let sites: Vec<usize> = ustrace_fprobe::static_key::jump_entries()
/// #         .iter()
/// #         .filter(|e| e.key == key)
/// #         .map(|e| e.site)
/// #         .collect();
/// #     assert!(!sites.is_empty());
/// #     // SAFETY: each site is an instruction of this program's text, which stays mapped
/// #     // and readable.
/// #     let nop = |site: usize| unsafe { std::slice::from_raw_parts(site as *const u8, 5) };
/// #     assert!(sites.iter().all(|&s| nop(s) == [0x0f, 0x1f, 0x44, 0x00, 0x00]));
/// #     use ustrace::FileSystem;
/// #     ustrace::tracefs().write_file("events/kv/get/enable", "1").unwrap();
/// #     assert!(sites.iter().all(|&s| nop(s)[0] == 0xe9));
/// #     ustrace::tracefs().write_file("events/kv/get/enable", "0").unwrap();
/// #     assert!(sites.iter().all(|&s| nop(s) == [0x0f, 0x1f, 0x44, 0x00, 0x00]));
/// # }
/// ```
///
/// The macro makes a module named after the event (`get`) holding the tracepoint (`trace`,
/// `enabled`, `register`, …, as [`declare_tracepoint!`](crate::declare_tracepoint) makes) and
/// the event definition `EVENT`, which the registry finds at link time. Each field says its
/// type (any [`FieldValue`](crate::event::FieldValue): integers, `bool`, `&str`, `&[u8]`,
/// `[T; N]`, [`FixedStr<N>`](crate::event::FixedStr), `*const c_char`) and the expression,
/// over the tracepoint's arguments, that gives its value; expressions are evaluated only
/// while the event is recording. `print` is a printf format and the fields it prints (an
/// element of an array field as `name[i]`, as the kernel's `REC->name[i]`).
///
/// # What a call site costs while the event is off
///
/// `trace(…)` and `enabled()` test a static key: on x86-64 the test is a 5-byte NOP in the
/// instruction stream, which enabling the event patches into a jump to the recording path
/// (and disabling patches back), so an off event costs no load and no branch. On other
/// architectures the test is one load of the key's flag. `trace_checked(…)` always tests
/// with one relaxed load instead of the patched branch, for code that must not be patched.
///
/// # Two events of the same name in one module
///
/// The module takes the event's name, so `kv::get` and `http::get` declared side by side
/// would make two modules `get` (error `E0428`). Name the module with `as`:
///
/// ```
/// ustrace::trace_event! {
///     pub fn kv::get(key: &str) as kv_get {
///         key: &str = key,
///     }
///     print "key=%s", key;
/// }
/// ustrace::trace_event! {
///     pub fn http::get(path: &str) as http_get {
///         path: &str = path,
///     }
///     print "path=%s", path;
/// }
///
/// use ustrace::FileSystem;
/// let tracefs = ustrace::tracefs();
/// tracefs.write_file("events/kv/get/enable", "1").unwrap();
/// tracefs.write_file("events/http/get/enable", "1").unwrap();
/// kv_get::trace("alpha");
/// http_get::trace("/index.html");
/// let trace = tracefs.read_to_string("trace").unwrap();
/// assert!(trace.contains("get: key=alpha"));
/// assert!(trace.contains("get: path=/index.html"));
/// ```
///
/// The event keeps its name (`kv:get`, `events/kv/get/`); only the Rust module differs.
/// Declaring the two in separate Rust modules works as well.
///
/// ```compile_fail,E0428
/// ustrace::trace_event! {
///     pub fn kv::get(key: &str) { key: &str = key, }
///     print "key=%s", key;
/// }
/// ustrace::trace_event! {
///     pub fn http::get(path: &str) { path: &str = path, }
///     print "path=%s", path;
/// }
/// ```
#[macro_export]
macro_rules! trace_event {
    // Evaluates the fields and records them through `$sink` (an `EventFile` or a `Direct`).
    (@record $sink:ident; $( $field:ident : $fty:ty = $value:expr ),*) => {{
        #[allow(unused_parens, clippy::unused_unit)]
        let ($($field,)*): ($($fty,)*) = ($($value,)*);
        // A constant, so that the closure below checks none of its field offsets against it
        // at run time.
        const FIXED: usize = {
            #[allow(unused_mut)]
            let mut fixed = $crate::event::field::COMMON_SIZE;
            $(
                fixed = $crate::event::field::align_up(
                    fixed,
                    <$fty as $crate::event::FieldValue>::ALIGN,
                ) + <$fty as $crate::event::FieldValue>::SIZE;
            )*
            fixed
        };
        #[allow(unused_mut)]
        let mut dynamic = 0usize;
        $(
            dynamic += $crate::event::FieldValue::dyn_len(&$field);
        )*
        // `move`: the closure holds the values rather than their addresses, so they stay in
        // registers on the direct path instead of being spilled for an out-of-line one.
        $sink.record(FIXED + dynamic, move |record: &mut [u8]| {
            #[allow(unused_mut)]
            let mut at = $crate::event::field::COMMON_SIZE;
            #[allow(unused_mut)]
            let mut dyn_at = FIXED;
            $(
                at = $crate::event::field::align_up(
                    at,
                    <$fty as $crate::event::FieldValue>::ALIGN,
                );
                let size = <$fty as $crate::event::FieldValue>::SIZE;
                let dyn_len = $crate::event::FieldValue::dyn_len(&$field);
                let (head, tail) = record.split_at_mut(dyn_at);
                $crate::event::FieldValue::write(
                    &$field,
                    &mut head[at..at + size],
                    &mut tail[..dyn_len],
                    dyn_at,
                );
                at += size;
                dyn_at += dyn_len;
            )*
            let _ = (at, dyn_at);
        })
    }};
    (
        @event $module:ident
        $(#[$meta:meta])*
        $vis:vis fn $system:ident :: $name:ident ( $($arg:ident : $aty:ty),* $(,)? ) {
            $( $field:ident : $fty:ty = $value:expr ),* $(,)?
        }
        print $fmt:literal $(, $parg:ident $([$idx:literal])?)* $(,)?;
    ) => {
        $(#[$meta])*
        #[allow(non_snake_case, dead_code)]
        $vis mod $module {
            #[allow(unused_imports)]
            use super::*;
            $crate::__tracepoint_items!($name($($arg: $aty),*));

            fn __layout() -> ::std::vec::Vec<$crate::event::FieldDesc> {
                let mut layout = $crate::event::Layout::new();
                $( layout.push::<$fty>(stringify!($field)); )*
                layout.finish()
            }

            fn __attach(
                file: ::std::sync::Arc<$crate::event_file::EventFile>,
            ) -> $crate::tracepoint::ProbeId {
                // Inside `__attach`, so that their symbols name `__attach` as the probe's did
                // (stack captures find where the record path ends by such names).
                /// The probe when the event needs no check: reserve, write, commit.
                #[inline(never)]
                #[allow(clippy::too_many_arguments)]
                fn __probe_direct(
                    direct: $crate::event_file::Direct<'_>,
                    $($arg: $aty),*
                ) {
                    $crate::trace_event!(@record direct; $($field: $fty = $value),*)
                }

                /// The probe when the event's filter is its only check: build on the stack,
                /// filter, write only what passes.
                #[inline(never)]
                #[allow(clippy::too_many_arguments)]
                fn __probe_filtered(
                    filtered: $crate::event_file::Filtered<'_>,
                    $($arg: $aty),*
                ) {
                    $crate::trace_event!(@record filtered; $($field: $fty = $value),*)
                }

                /// The probe when the event needs a check first: a filter, a cpu mask, stack
                /// options; triggers, soft-disable and a pid filter go on to `__probe_wanted`
                /// (a tail call again, so this frame stays small).
                #[inline(never)]
                #[allow(clippy::too_many_arguments)]
                fn __probe_checked(
                    file: &$crate::event_file::EventFile,
                    $($arg: $aty),*
                ) {
                    match file.checked() {
                        Some(checked) => {
                            $crate::trace_event!(@record checked; $($field: $fty = $value),*)
                        }
                        None => __probe_wanted(file, $($arg),*),
                    }
                }

                /// The probe when `wants_record` has work: triggers, soft-disable, a pid filter.
                #[inline(never)]
                #[allow(clippy::too_many_arguments)]
                fn __probe_wanted(
                    file: &$crate::event_file::EventFile,
                    $($arg: $aty),*
                ) {
                    if let Some(checked) = file.wanted() {
                        $crate::trace_event!(@record checked; $($field: $fty = $value),*)
                    }
                }

                // One flag load, then a tail call with the arguments still in registers:
                // no path pays for the registers and frame of another.
                register(0, move |$($arg: $aty),*| match {
                    // SAFETY: this closure is a tracepoint probe: it runs only from
                    // `Tracepoint::for_each_probe`, inside the section of the tracepoint's
                    // call, and the path is used before it returns.
                    unsafe { file.probe_path() }
                } {
                    $crate::event_file::ProbePath::Direct(direct) => {
                        __probe_direct(direct, $($arg),*)
                    }
                    $crate::event_file::ProbePath::Filtered(filtered) => {
                        __probe_filtered(filtered, $($arg),*)
                    }
                    $crate::event_file::ProbePath::Checked => __probe_checked(&file, $($arg),*),
                })
            }

            fn __detach(id: $crate::tracepoint::ProbeId) {
                let _ = TRACEPOINT.unregister(id);
            }

            /// The event's definition.
            pub static EVENT: $crate::event::StaticEvent = $crate::event::StaticEvent {
                system: stringify!($system),
                name: stringify!($name),
                module_path: module_path!(),
                layout: __layout,
                format: $fmt,
                print_args: &[$(concat!(stringify!($parg) $(, "[", stringify!($idx), "]")?)),*],
                attach: __attach,
                detach: __detach,
            };

            #[$crate::__private::linkme::distributed_slice($crate::event::EVENTS)]
            #[linkme(crate = $crate::__private::linkme)]
            static __EVENT_ENTRY: &'static $crate::event::StaticEvent = &EVENT;
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis fn $system:ident :: $name:ident ( $($arg:ident : $aty:ty),* $(,)? ) as $module:ident {
            $( $field:ident : $fty:ty = $value:expr ),* $(,)?
        }
        print $fmt:literal $(, $parg:ident $([$idx:literal])?)* $(,)?;
    ) => {
        $crate::trace_event! {
            @event $module
            $(#[$meta])*
            $vis fn $system :: $name ( $($arg : $aty),* ) {
                $( $field : $fty = $value ),*
            }
            print $fmt $(, $parg $([$idx])?)*;
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis fn $system:ident :: $name:ident ( $($arg:ident : $aty:ty),* $(,)? ) {
            $( $field:ident : $fty:ty = $value:expr ),* $(,)?
        }
        print $fmt:literal $(, $parg:ident $([$idx:literal])?)* $(,)?;
    ) => {
        $crate::trace_event! {
            @event $name
            $(#[$meta])*
            $vis fn $system :: $name ( $($arg : $aty),* ) {
                $( $field : $fty = $value ),*
            }
            print $fmt $(, $parg $([$idx])?)*;
        }
    };
}
