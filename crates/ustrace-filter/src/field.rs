//! Event fields as the `format` file describes them, and the kernel's
//! classification of a field's C type into what a filter may do with it.

/// One field of an event record, as printed by the event's `format` file
/// (`field:unsigned long args[6]; offset:16; size:48; signed:0;` is
/// `Field { name: "args", c_type: "unsigned long[6]", offset: 16, size: 48, signed: false }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    pub name: &'a str,
    pub c_type: &'a str,
    pub offset: usize,
    pub size: usize,
    pub signed: bool,
}

/// The four fields every event record starts with.
pub const COMMON_FIELDS: [Field<'static>; 4] = [
    Field {
        name: "common_type",
        c_type: "unsigned short",
        offset: 0,
        size: 2,
        signed: false,
    },
    Field {
        name: "common_flags",
        c_type: "unsigned char",
        offset: 2,
        size: 1,
        signed: false,
    },
    Field {
        name: "common_preempt_count",
        c_type: "unsigned char",
        offset: 3,
        size: 1,
        signed: false,
    },
    Field {
        name: "common_pid",
        c_type: "int",
        offset: 4,
        size: 4,
        signed: true,
    },
];

/// What the kernel's `filter_assign_type` makes of a field, plus the three
/// generic pseudo-fields (`CPU`/`cpu`/`common_cpu`, `COMM`/`comm` and
/// `STACKTRACE`/`stacktrace`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldClass {
    /// Integers, pointers, non-char arrays: compared as `size`-byte integers.
    Other,
    /// `char[N]` (any array type containing "char").
    StaticString,
    /// `__data_loc char[]`: u32 = length << 16 | offset in the record.
    DynString,
    /// `__rel_loc char[]`: like `DynString`, offset counted from the end of the u32.
    RelDynString,
    /// `char *` / `const char *`: an address read through `Context::read_str`.
    PtrString,
    /// `__data_loc cpumask_t` / `__rel_loc cpumask_t`: a CPU bitmap in the record.
    CpuMask { relative: bool },
    /// The CPU the event fires on (`Context::cpu`).
    Cpu,
    /// The current task's name (`Context::comm`).
    Comm,
    /// `STACKTRACE`/`stacktrace`: the kernel declares it (for histogram keys)
    /// as a generic field of no size and no sign, so a filter accepts it with
    /// unsigned numbers only and every predicate on it is the no-op (false,
    /// `!=` included); strings are "Expecting numeric field", `CPUS{}` and
    /// `.function` are "Illegal operation for field type". The kernel's own
    /// `common_stacktrace` spelling is not a filter field (6.18).
    StackTrace,
}

impl FieldClass {
    /// Classify a C type exactly as the kernel's `filter_assign_type` does.
    pub fn of_c_type(c_type: &str) -> FieldClass {
        if c_type.contains("__data_loc") {
            if c_type.contains("char") {
                return FieldClass::DynString;
            }
            if c_type.contains("cpumask_t") {
                return FieldClass::CpuMask { relative: false };
            }
        }
        if c_type.contains("__rel_loc") {
            if c_type.contains("char") {
                return FieldClass::RelDynString;
            }
            if c_type.contains("cpumask_t") {
                return FieldClass::CpuMask { relative: true };
            }
        }
        if c_type.contains('[') && c_type.contains("char") {
            return FieldClass::StaticString;
        }
        if c_type == "char *" || c_type == "const char *" {
            return FieldClass::PtrString;
        }
        FieldClass::Other
    }

    /// Whether string constants (and not numbers) apply.
    pub fn is_string(self) -> bool {
        matches!(
            self,
            FieldClass::StaticString
                | FieldClass::DynString
                | FieldClass::RelDynString
                | FieldClass::PtrString
                | FieldClass::Comm
        )
    }
}

/// A field resolved for compilation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Resolved {
    pub class: FieldClass,
    pub offset: usize,
    pub size: usize,
    pub signed: bool,
}

/// Look `name` up the way `trace_find_event_field` does: the event's own
/// fields, then the generic CPU/COMM names, then the common fields.
pub(crate) fn resolve(name: &[u8], fields: &[Field<'_>]) -> Option<Resolved> {
    let of = |f: &Field<'_>| Resolved {
        class: FieldClass::of_c_type(f.c_type),
        offset: f.offset,
        size: f.size,
        signed: f.signed,
    };
    if let Some(f) = fields.iter().find(|f| f.name.as_bytes() == name) {
        return Some(of(f));
    }
    match name {
        b"CPU" | b"cpu" | b"common_cpu" => {
            return Some(Resolved {
                class: FieldClass::Cpu,
                offset: 0,
                size: 4,
                signed: true,
            })
        }
        b"COMM" | b"comm" => {
            return Some(Resolved {
                class: FieldClass::Comm,
                offset: 0,
                // TASK_COMM_LEN: `comm.function` is refused for not being long-sized.
                size: 16,
                signed: true,
            });
        }
        b"STACKTRACE" | b"stacktrace" => {
            return Some(Resolved {
                class: FieldClass::StackTrace,
                offset: 0,
                size: 0,
                signed: false,
            })
        }
        _ => {}
    }
    COMMON_FIELDS
        .iter()
        .find(|f| f.name.as_bytes() == name)
        .map(of)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_like_the_kernel() {
        assert_eq!(FieldClass::of_c_type("char[16]"), FieldClass::StaticString);
        assert_eq!(
            FieldClass::of_c_type("unsigned char[6]"),
            FieldClass::StaticString
        );
        assert_eq!(
            FieldClass::of_c_type("__data_loc char[]"),
            FieldClass::DynString
        );
        assert_eq!(
            FieldClass::of_c_type("__rel_loc char[]"),
            FieldClass::RelDynString
        );
        assert_eq!(FieldClass::of_c_type("const char *"), FieldClass::PtrString);
        assert_eq!(FieldClass::of_c_type("char *"), FieldClass::PtrString);
        assert_eq!(FieldClass::of_c_type("const char*"), FieldClass::Other);
        assert_eq!(
            FieldClass::of_c_type("__data_loc cpumask_t"),
            FieldClass::CpuMask { relative: false }
        );
        assert_eq!(FieldClass::of_c_type("unsigned long[6]"), FieldClass::Other);
        assert_eq!(FieldClass::of_c_type("pid_t"), FieldClass::Other);
    }

    #[test]
    fn lookup_order() {
        let own_cpu = [Field {
            name: "cpu",
            c_type: "int",
            offset: 8,
            size: 4,
            signed: true,
        }];
        assert_eq!(resolve(b"cpu", &own_cpu).unwrap().class, FieldClass::Other);
        assert_eq!(resolve(b"CPU", &own_cpu).unwrap().class, FieldClass::Cpu);
        assert_eq!(resolve(b"comm", &[]).unwrap().class, FieldClass::Comm);
        assert!(resolve(b"common_comm", &[]).is_none());
        assert_eq!(
            resolve(b"STACKTRACE", &[]).unwrap().class,
            FieldClass::StackTrace
        );
        assert!(resolve(b"common_stacktrace", &[]).is_none());
        let own_stack = [Field {
            name: "stacktrace",
            c_type: "unsigned long",
            offset: 8,
            size: 8,
            signed: false,
        }];
        assert_eq!(
            resolve(b"stacktrace", &own_stack).unwrap().class,
            FieldClass::Other
        );
        assert_eq!(resolve(b"common_pid", &[]).unwrap().offset, 4);
    }
}
