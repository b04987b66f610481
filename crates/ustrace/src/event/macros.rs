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
/// get::trace("alpha", true, 1200);   // one relaxed load while the event is off
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
#[macro_export]
macro_rules! trace_event {
    (
        $(#[$meta:meta])*
        $vis:vis fn $system:ident :: $name:ident ( $($arg:ident : $aty:ty),* $(,)? ) {
            $( $field:ident : $fty:ty = $value:expr ),* $(,)?
        }
        print $fmt:literal $(, $parg:ident $([$idx:literal])?)* $(,)?;
    ) => {
        $(#[$meta])*
        #[allow(non_snake_case, dead_code)]
        $vis mod $name {
            #[allow(unused_imports)]
            use super::*;
            $crate::__tracepoint_items!($name($($arg: $aty),*));

            fn __layout() -> ::std::vec::Vec<$crate::event::FieldDesc> {
                let mut layout = $crate::event::Layout::new();
                $( layout.push::<$fty>(stringify!($field)); )*
                layout.finish()
            }

            fn __attach(
                file: ::std::sync::Arc<$crate::trace::EventFile>,
            ) -> $crate::tracepoint::ProbeId {
                register(0, move |$($arg: $aty),*| {
                    if !file.wants_record() {
                        return;
                    }
                    #[allow(unused_parens, clippy::unused_unit)]
                    let ($($field,)*): ($($fty,)*) = ($($value,)*);
                    let mut fixed = $crate::event::field::COMMON_SIZE;
                    let mut dynamic = 0usize;
                    $(
                        fixed = $crate::event::field::align_up(
                            fixed,
                            <$fty as $crate::event::FieldValue>::ALIGN,
                        ) + <$fty as $crate::event::FieldValue>::SIZE;
                        dynamic += $crate::event::FieldValue::dyn_len(&$field);
                    )*
                    file.record(fixed + dynamic, |record: &mut [u8]| {
                        let mut at = $crate::event::field::COMMON_SIZE;
                        let mut dyn_at = fixed;
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
                    });
                })
            }

            fn __detach(id: $crate::tracepoint::ProbeId) {
                let _ = TRACEPOINT.unregister(id);
            }

            /// The event's definition.
            pub static EVENT: $crate::event::StaticEvent = $crate::event::StaticEvent {
                system: stringify!($system),
                name: stringify!($name),
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
}
