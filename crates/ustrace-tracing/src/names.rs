//! How a `tracing` callsite's target and name become an event's system and name.
//!
//! Event and system names are C identifiers in tracefs (filters, `set_event`, histogram
//! keys and `format` readers all parse them), so:
//!
//! - **system** = the target with each `::` replaced by one `_`, then every character that
//!   is not an ASCII letter, digit or `_` replaced by `_`: `hyper::proto::h1::conn` →
//!   `hyper_proto_h1_conn`, `my-app` → `my_app`. An empty target is `tracing`.
//! - **event name**: `tracing` names an event callsite `event FILE:LINE`; that becomes the
//!   file's stem and the line, `event src/handlers/user.rs:42` → `user_42` (the target
//!   already says which module). Any other name (explicit `name:` on an event, a span's
//!   name) is sanitized as a system is. Spans give two events, `NAME_enter` and `NAME_exit`.
//! - A name that starts with a digit gets a leading `_`.
//! - Two callsites that map to the same `system:name` (one name used twice in a target, or a
//!   name that an event of the program already has) get `_2`, `_3`, … in the order they
//!   register; for spans the number goes before the suffix (`work_2_enter`).

/// Maps every character that cannot be in an identifier to `_`.
pub fn sanitize(text: &str) -> String {
    let mut out: String = text
        .replace("::", "_")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// The system of a callsite's target.
pub fn system(target: &str) -> String {
    if target.is_empty() {
        return "tracing".into();
    }
    sanitize(target)
}

/// The event name of an event callsite.
pub fn event_name(name: &str) -> String {
    if let Some(place) = name.strip_prefix("event ") {
        if let Some((file, line)) = place.rsplit_once(':') {
            if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) {
                let base = file.rsplit(['/', '\\']).next().unwrap_or(file);
                let stem = base.split('.').next().unwrap_or(base);
                return sanitize(&format!("{stem}_{line}"));
            }
        }
    }
    if name.is_empty() {
        return "event".into();
    }
    sanitize(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_names_become_identifiers() {
        assert_eq!(system("hyper::proto::h1::conn"), "hyper_proto_h1_conn");
        assert_eq!(system("my-app"), "my_app");
        assert_eq!(system(""), "tracing");
        assert_eq!(event_name("event src/handlers/user.rs:42"), "user_42");
        assert_eq!(event_name("event C:\\x\\main.rs:7"), "main_7");
        assert_eq!(event_name("cache miss"), "cache_miss");
        assert_eq!(event_name("9lives"), "_9lives");
    }
}
