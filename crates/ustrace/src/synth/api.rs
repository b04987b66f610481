//! The in-process synthetic event API (events.rst 7.1–7.2): create an event in one call
//! or piece by piece, delete it, and record it piece by piece.
//!
//! Creation builds the same command text a shell would write to `synthetic_events` and
//! runs it through the same parser, so an event made here and one made from a shell are
//! the same, and a rejected definition leaves the same `error_log` entry.
//!
//! ```
//! use ustrace::synth::{self, SynthEventCmd, SynthValue};
//!
//! // synth_event_gen_cmd_start(&cmd, "doc_schedtest", THIS_MODULE, "pid_t", "next_pid_field", ...)
//! let mut cmd = SynthEventCmd::start("doc_schedtest");
//! cmd.add_field("pid_t", "next_pid_field")?;
//! // synth_event_add_fields(&cmd, fields, n)
//! cmd.add_fields(&[("char[16]", "next_comm_field"), ("u64", "ts_ns")])?;
//! // synth_event_add_field_str(&cmd, "unsigned int cpu")
//! cmd.add_field_str("unsigned int cpu")?;
//! // synth_event_gen_cmd_end(&cmd)
//! let event = cmd.end()?;
//! assert_eq!(event.fields().len(), 4);
//!
//! // synth_event_trace_start / add_next_val / add_val / trace_end
//! let mut t = event.trace_start();
//! t.add_next_val(777u32)?;
//! t.add_next_val("slinky")?;
//! t.add_next_val(1_000_000u64)?;
//! t.add_next_val(3u32)?;
//! t.end()?;
//!
//! // synth_event_delete
//! synth::delete("doc_schedtest")?;
//! # Ok::<(), synth::SynthError>(())
//! ```

use std::sync::Arc;

use ustrace_filter::synth::{is_valid_type, SYNTH_FIELDS_MAX};

use super::{find, remove_named, run_line, SynthError, SynthValue, Synthetic};

/// Creates a synthetic event from `(type, name)` pairs in one call (`synth_event_create`).
///
/// ```
/// use ustrace::synth;
/// let event = synth::create("doc_create", &[("u64", "lat"), ("char[]", "op")])?;
/// assert_eq!(event.definition().listing(), "doc_create\tu64 lat; char[] op");
/// assert!(synth::create("doc_create", &[("u64", "x")]).is_err()); // EEXIST
/// synth::delete("doc_create")?;
/// # Ok::<(), synth::SynthError>(())
/// ```
pub fn create(name: &str, fields: &[(&str, &str)]) -> Result<Arc<Synthetic>, SynthError> {
    let mut cmd = SynthEventCmd::start(name);
    cmd.add_fields(fields)?;
    cmd.end()
}

/// Deletes a synthetic event (`synth_event_delete`): [`SynthError::NotFound`] when there
/// is none, [`SynthError::Busy`] while it is enabled, held by a trigger, an eprobe or a
/// [`SynthHold`](super::SynthHold).
pub fn delete(name: &str) -> Result<(), SynthError> {
    remove_named(name)
}

/// A synthetic event definition being built (the kernel's `dynevent_cmd` of type synth).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SynthEventCmd {
    name: String,
    /// Each field's `type name` text.
    fields: Vec<String>,
}

impl SynthEventCmd {
    /// Starts a definition of event `name` with no fields yet (`synth_event_gen_cmd_start`).
    pub fn start(name: &str) -> SynthEventCmd {
        SynthEventCmd {
            name: name.to_string(),
            fields: Vec::new(),
        }
    }

    /// Starts a definition with fields from an array (`synth_event_gen_cmd_array_start`).
    pub fn start_with(name: &str, fields: &[(&str, &str)]) -> Result<SynthEventCmd, SynthError> {
        if fields.len() > SYNTH_FIELDS_MAX {
            return Err(SynthError::TooManyFields);
        }
        let mut cmd = SynthEventCmd::start(name);
        cmd.add_fields(fields)?;
        Ok(cmd)
    }

    /// Adds a field of type `ty` named `name` (`synth_event_add_field`). The type is
    /// checked now; a `[N]` may be on either (`char[16]`, `name[16]`).
    pub fn add_field(&mut self, ty: &str, name: &str) -> Result<&mut Self, SynthError> {
        let full_type = match name.find('[') {
            Some(i) => format!("{ty}{}", &name[i..]),
            None => ty.to_string(),
        };
        if !is_valid_type(&full_type) {
            return Err(SynthError::InvalidType(full_type));
        }
        self.push(format!("{ty} {name}"))
    }

    /// Adds several `(type, name)` fields (`synth_event_add_fields`), stopping at the
    /// first that fails.
    pub fn add_fields(&mut self, fields: &[(&str, &str)]) -> Result<&mut Self, SynthError> {
        for (ty, name) in fields {
            self.add_field(ty, name)?;
        }
        Ok(self)
    }

    /// Adds a field given as one `type name` text, unchecked until the end
    /// (`synth_event_add_field_str`).
    pub fn add_field_str(&mut self, type_name: &str) -> Result<&mut Self, SynthError> {
        self.push(type_name.to_string())
    }

    fn push(&mut self, field: String) -> Result<&mut Self, SynthError> {
        if self.fields.len() == SYNTH_FIELDS_MAX {
            return Err(SynthError::TooManyFields);
        }
        self.fields.push(field);
        Ok(self)
    }

    /// The command as it would be written to `synthetic_events`.
    pub fn text(&self) -> String {
        let mut text = self.name.clone();
        for field in &self.fields {
            text.push(' ');
            text.push_str(field);
            text.push(';');
        }
        text
    }

    /// Creates the event (`synth_event_gen_cmd_end`). A rejected definition fails with
    /// the kernel's error, which `error_log` also shows.
    pub fn end(&self) -> Result<Arc<Synthetic>, SynthError> {
        run_line(&self.text())?;
        find(&self.name).ok_or(SynthError::NotFound)
    }
}

/// A piecewise trace of a synthetic event (`synth_event_trace_state`): values are added
/// one after the other ([`SynthTrace::add_next_val`]) or by field name
/// ([`SynthTrace::add_val`]), not both, and [`SynthTrace::end`] records the event. A field
/// given no value records 0 (an empty string, an empty stack). The values are kept on the
/// stack until the end: nothing is allocated. Unlike the kernel's, dynamic strings may be
/// added this way too.
pub struct SynthTrace<'s, 'v> {
    event: &'s Synthetic,
    /// One instance's file, or every instance that has the event on.
    file: Option<&'s crate::trace::EventFile>,
    values: [SynthValue<'v>; SYNTH_FIELDS_MAX],
    next: usize,
    by_name: bool,
}

impl<'s, 'v> SynthTrace<'s, 'v> {
    pub(super) fn new(
        event: &'s Synthetic,
        file: Option<&'s crate::trace::EventFile>,
    ) -> SynthTrace<'s, 'v> {
        let mut values = [SynthValue::U64(0); SYNTH_FIELDS_MAX];
        for (slot, field) in values.iter_mut().zip(event.fields()) {
            *slot = field.zero();
        }
        SynthTrace {
            event,
            file,
            values,
            next: 0,
            by_name: false,
        }
    }

    fn set(&mut self, at: usize, value: SynthValue<'v>) -> Result<(), SynthError> {
        let field = &self.event.fields()[at];
        if !field.accepts(&value) {
            return Err(SynthError::WrongType {
                field: at,
                expected: field.wants(),
            });
        }
        self.values[at] = value;
        Ok(())
    }

    /// Sets the next field's value (`synth_event_add_next_val`).
    pub fn add_next_val(&mut self, value: impl Into<SynthValue<'v>>) -> Result<(), SynthError> {
        if self.by_name {
            return Err(SynthError::MixedAdd);
        }
        if self.next >= self.event.fields().len() {
            return Err(SynthError::TooManyValues);
        }
        // A refused value does not use the field up: it can be given again.
        self.set(self.next, value.into())?;
        self.next += 1;
        Ok(())
    }

    /// Sets the value of the field named `name` (`synth_event_add_val`).
    pub fn add_val(
        &mut self,
        name: &str,
        value: impl Into<SynthValue<'v>>,
    ) -> Result<(), SynthError> {
        if self.next > 0 {
            return Err(SynthError::MixedAdd);
        }
        self.by_name = true;
        let Some((at, _)) = self.event.field(name) else {
            return Err(SynthError::NoSuchField);
        };
        self.set(at, value.into())
    }

    /// Records the event with the values added (`synth_event_trace_end`), into every
    /// instance that has it enabled (or the one instance of the file it was started on).
    pub fn end(self) -> Result<(), SynthError> {
        let values = &self.values[..self.event.fields().len()];
        match self.file {
            Some(file) => self.event.trace_file(file, values),
            None => self.event.trace(values),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_field_checks_the_type_as_the_kernel() {
        let mut cmd = SynthEventCmd::start("unit_cmd");
        assert!(cmd.add_field("u64", "a").is_ok());
        assert!(cmd.add_field("char", "s[16]").is_ok());
        assert!(cmd.add_field("char[]", "d").is_ok());
        assert!(cmd.add_field("unsigned long[]", "st").is_ok());
        assert_eq!(
            cmd.add_field("u65", "x").err(),
            Some(SynthError::InvalidType("u65".into()))
        );
        assert_eq!(
            cmd.text(),
            "unit_cmd u64 a; char s[16]; char[] d; unsigned long[] st;"
        );
        let mut full = SynthEventCmd::start("unit_full");
        for i in 0..SYNTH_FIELDS_MAX {
            full.add_field("u8", &format!("f{i}")).unwrap();
        }
        assert_eq!(
            full.add_field("u8", "over").err(),
            Some(SynthError::TooManyFields)
        );
    }
}
