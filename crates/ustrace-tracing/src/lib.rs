//! The `tracing` crate as a ustrace event source: every `tracing` event callsite and span
//! becomes an event in tracefs that can be enabled, filtered and triggered at run time.
//!
//! ```no_run
//! use tracing_subscriber::prelude::*;
//! tracing_subscriber::registry()
//!     .with(ustrace_tracing::layer())
//!     // other layers (fmt, OpenTelemetry) see every event as before
//!     .init();
//! ```
//!
//! How a `tracing` call reaches the ring buffer:
//!
//! ```text
//!  info!(status, "done") ── callsite interest (cached by `tracing`) ── never: nothing
//!     │ always (some instance records the event)
//!     ▼
//!  UstraceLayer::on_event ── SiteMap: metadata address ─> the callsite's event (no lock)
//!     ── build the record in the frame (record.rs) ── RuntimeEvent::emit
//!     ──> EventFile::record in each recording instance: filter, triggers, ring buffer
//! ```
//!
//! - A callsite registers its event the first time `tracing` asks about it (its
//!   `register_callsite`), so `available_events` lists every callsite `tracing` has seen.
//!   Names: [`names`]; record layout and field types: [`record`].
//! - The layer comes with its own per-layer filter ([`UstraceFilter`]): the callsite's
//!   interest follows the event's enable state (`never` while no instance records it), and
//!   enabling or disabling from tracefs rebuilds `tracing`'s interest cache. A per-layer
//!   filter's `never` does not turn the callsite off for the program's other layers.
//! - A span callsite `NAME` gives `NAME_enter` and `NAME_exit`, carrying `span_id` and the
//!   span's fields, which are recorded when the span is created (and updated by
//!   `Span::record`) into the span's extensions. A span created while both events were off
//!   produces neither, even if they are turned on during its life.
//! - `log` records (with `tracing_log::LogTracer` installed) become `TARGET:log`, one event
//!   per `log` target, registered on the target's first record, with the record's
//!   `log.module_path`, `log.file` and `log.line` as fields.
//! - Programs without a registry of their own install [`subscriber`].

pub mod names;
pub mod record;
mod sites;

use std::cell::Cell;

use tracing_core::span::{Attributes, Id, Record};
use tracing_core::subscriber::Interest;
use tracing_core::{Event, Metadata, Subscriber};
use tracing_subscriber::filter::Filtered;
use tracing_subscriber::layer::{Context, Filter, Layer};
use tracing_subscriber::registry::LookupSpan;
use ustrace::runtime_event::{RuntimeEvent, RuntimeEventDef};

use record::{Fill, Layout, StackRecord};
use sites::SiteMap;

/// The events of one callsite.
enum Site {
    Event {
        event: RuntimeEvent,
        layout: Layout,
    },
    Span {
        enter: RuntimeEvent,
        exit: RuntimeEvent,
        layout: Layout,
    },
    /// One of `tracing-log`'s per-level callsites, which carry every `log` record: each
    /// record's own target has its event in [`LOG_SITES`].
    Log,
}

impl Site {
    #[inline(always)]
    fn enabled(&self) -> bool {
        match self {
            Site::Event { event, .. } => event.is_enabled(),
            Site::Span { enter, exit, .. } => enter.is_enabled() || exit.is_enabled(),
            Site::Log => false,
        }
    }
}

static SITES: SiteMap<Site> = SiteMap::new();

/// Whether a callsite is one of `tracing-log`'s (or the metadata `LogTracer` builds from a
/// record, which names the same fields): a `log` record, whose target is its own.
fn is_log(meta: &Metadata<'_>) -> bool {
    meta.fields().field("log.target").is_some() && matches!(meta.name(), "log event" | "log record")
}

/// The events of `log` targets: `log` records have no callsite of their own, so each
/// target registers `TARGET:log` the first time one of its records is offered, and finds it
/// here after. Readers take no lock (RCU); a new target copies the map.
struct LogSites {
    map: ustrace::rcu::RcuCell<std::collections::HashMap<String, &'static Site>>,
    writers: std::sync::Mutex<()>,
}

static LOG_SITES: LogSites = LogSites {
    map: ustrace::rcu::RcuCell::empty(),
    writers: std::sync::Mutex::new(()),
};

impl LogSites {
    fn get(&self, target: &str) -> Option<&'static Site> {
        let guard = ustrace::rcu::read_lock();
        self.map.get(&guard)?.get(target).copied()
    }

    fn get_or_register(&self, meta: &Metadata<'_>) -> Option<&'static Site> {
        if let Some(site) = self.get(meta.target()) {
            return Some(site);
        }
        // Publishing the new map waits for a grace period, which a record logged from inside
        // a read-side section (a tracepoint probe) would never see end: such a target's
        // first record is dropped, and a later one registers it.
        if ustrace::rcu::in_read_section() {
            return None;
        }
        let _writers = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        let mut map = {
            let guard = ustrace::rcu::read_lock();
            self.map.get(&guard).cloned().unwrap_or_default()
        };
        if let Some(site) = map.get(meta.target()) {
            return Some(site);
        }
        let system = names::system(meta.target());
        let layout = Layout::new(meta.fields().iter().map(|f| f.name()), false);
        let name = free_base(&system, "log", &[""]);
        let event = register(&system, name, &layout)?;
        let site: &'static Site = Box::leak(Box::new(Site::Event { event, layout }));
        map.insert(meta.target().to_string(), site);
        self.map.replace(Some(map));
        Some(site)
    }
}

/// The first of `base`, `base_2`, `base_3`, … for which `system` has none of the events
/// `base` + each suffix (`""` for a callsite event, `_enter` and `_exit` for a span).
fn free_base(system: &str, base: &str, suffixes: &[&str]) -> String {
    let registry = ustrace::event::registry();
    let mut n = 1;
    loop {
        let candidate = if n == 1 {
            base.to_string()
        } else {
            format!("{base}_{n}")
        };
        if suffixes
            .iter()
            .all(|s| registry.find(system, &format!("{candidate}{s}")).is_none())
        {
            return candidate;
        }
        n += 1;
    }
}

fn register(system: &str, name: String, layout: &Layout) -> Option<RuntimeEvent> {
    let fields = layout.fields.clone();
    let render_fields = fields.clone();
    let render_name = name.clone();
    let def = RuntimeEventDef {
        system: system.into(),
        name,
        fields,
        print_fmt: layout.print_fmt.clone(),
        render: Some(Box::new(move |rec, out| {
            out.push_str(&render_name);
            out.push_str(": ");
            record::render(&render_fields, rec, out)
        })),
        // Interest is cached per callsite by `tracing`: have it ask again.
        on_change: Some(Box::new(tracing_core::callsite::rebuild_interest_cache)),
    };
    RuntimeEvent::register(def).ok()
}

fn make_site(meta: &'static Metadata<'static>) -> Option<Site> {
    if is_log(meta) {
        return Some(Site::Log);
    }
    let system = names::system(meta.target());
    let field_names = || meta.fields().iter().map(|f| f.name());
    if meta.is_span() {
        let layout = Layout::new(field_names(), true);
        let base = names::sanitize(meta.name());
        let base = if base.is_empty() { "span".into() } else { base };
        let base = free_base(&system, &base, &["_enter", "_exit"]);
        let enter = register(&system, format!("{base}_enter"), &layout)?;
        let exit = register(&system, format!("{base}_exit"), &layout)?;
        Some(Site::Span {
            enter,
            exit,
            layout,
        })
    } else {
        let layout = Layout::new(field_names(), false);
        let name = free_base(&system, &names::event_name(meta.name()), &[""]);
        let event = register(&system, name, &layout)?;
        Some(Site::Event { event, layout })
    }
}

fn site(meta: &'static Metadata<'static>) -> Option<&'static Site> {
    SITES
        .get(meta)
        .or_else(|| SITES.get_or_insert(meta, || make_site(meta)))
}

thread_local! {
    /// The callsite this thread recorded last and its site: a loop or a handler records
    /// the same callsite again and again, and one compare here spares the table's chain of
    /// dependent loads (table, slots, key, value).
    static LAST_SITE: Cell<(usize, *const Site)> = const { Cell::new((0, std::ptr::null())) };
}

/// [`SITES`]`.get(meta)` through the thread's one-entry cache.
#[inline(always)]
fn event_site(meta: &Metadata<'_>) -> Option<&'static Site> {
    let key = meta as *const Metadata<'_> as usize;
    if let Ok((last, site)) = LAST_SITE.try_with(Cell::get) {
        if last == key {
            // SAFETY: only `&'static Site`s from `SITES` are cached; sites are never freed.
            return unsafe { site.as_ref() };
        }
    }
    let site = SITES.get(meta)?;
    let _ = LAST_SITE.try_with(|last| last.set((key, site)));
    Some(site)
}

/// Copies a built record (after its header) into every instance recording `event`.
#[inline]
fn emit(event: &RuntimeEvent, built: &[u8]) {
    let body = &built[ustrace::event::field::COMMON_SIZE..];
    event.emit(built.len(), |record| {
        record[ustrace::event::field::COMMON_SIZE..].copy_from_slice(body);
    });
}

/// The per-layer filter: a callsite is of interest while its event records somewhere.
#[derive(Clone, Copy, Debug, Default)]
pub struct UstraceFilter;

impl<S> Filter<S> for UstraceFilter {
    fn enabled(&self, meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        if let Some(site) = SITES.get(meta) {
            return site.enabled();
        }
        // `LogTracer` asks with metadata made for the record, which carries its target.
        is_log(meta) && LOG_SITES.get_or_register(meta).is_some_and(Site::enabled)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        match site(meta) {
            // Records of every target pass here: `enabled` decides for each.
            Some(Site::Log) => Interest::sometimes(),
            Some(site) if site.enabled() => Interest::always(),
            _ => Interest::never(),
        }
    }
}

/// Writes `tracing` events and spans as ustrace events; use it through [`layer`].
#[derive(Clone, Copy, Debug, Default)]
pub struct UstraceLayer;

/// The layer with its filter: add it to a `tracing_subscriber::registry()`.
pub fn layer<S>() -> Filtered<UstraceLayer, UstraceFilter, S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    UstraceLayer.with_filter(UstraceFilter)
}

/// A whole subscriber for programs that set up no registry of their own: a
/// `tracing_subscriber` registry with the ustrace layer and nothing else. Install it with
/// `tracing::subscriber::set_global_default(ustrace_tracing::subscriber())`.
pub fn subscriber() -> impl Subscriber + Send + Sync + 'static {
    use tracing_subscriber::layer::SubscriberExt;
    tracing_subscriber::registry().with(layer())
}

/// A span's fields as a built record of its events, kept in the span's extensions.
struct SpanRecord(Vec<u8>);

impl<S> Layer<S> for UstraceLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let site = match event_site(event.metadata()) {
            // `tracing-log`'s callsites are not always registered with `tracing` (then no
            // subscriber hears of them): a miss may still be a `log` record.
            Some(Site::Log) | None => {
                use tracing_log::NormalizeEvent;
                let Some(meta) = event.normalized_metadata() else {
                    return;
                };
                LOG_SITES.get(meta.target())
            }
            site => site,
        };
        let Some(Site::Event { event: ev, layout }) = site else {
            return;
        };
        if !ev.is_enabled() {
            return;
        }
        let mut record = StackRecord::new();
        record.begin(layout, event.metadata().level());
        event.record(&mut Fill {
            layout,
            buf: &mut record,
        });
        emit(ev, record.as_slice());
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(site @ Site::Span { layout, .. }) = SITES.get(attrs.metadata()) else {
            return;
        };
        if !site.enabled() {
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        let mut buf = Vec::with_capacity(layout.fixed + 32);
        layout.begin(&mut buf, attrs.metadata().level());
        buf[record::SPAN_ID_OFFSET..record::SPAN_ID_OFFSET + 8]
            .copy_from_slice(&id.into_u64().to_ne_bytes());
        attrs.record(&mut Fill {
            layout,
            buf: &mut buf,
        });
        span.extensions_mut().insert(SpanRecord(buf));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let Some(Site::Span { layout, .. }) = SITES.get(span.metadata()) else {
            return;
        };
        let mut ext = span.extensions_mut();
        if let Some(SpanRecord(buf)) = ext.get_mut::<SpanRecord>() {
            // New text goes after the old; the old bytes stay unreferenced in the record.
            values.record(&mut Fill { layout, buf });
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        span_event(id, &ctx, true);
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        span_event(id, &ctx, false);
    }
}

fn span_event<S>(id: &Id, ctx: &Context<'_, S>, enter: bool)
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let Some(span) = ctx.span(id) else { return };
    let Some(Site::Span {
        enter: on_enter,
        exit: on_exit,
        ..
    }) = SITES.get(span.metadata())
    else {
        return;
    };
    let event = if enter { on_enter } else { on_exit };
    if !event.is_enabled() {
        return;
    }
    let ext = span.extensions();
    if let Some(SpanRecord(buf)) = ext.get::<SpanRecord>() {
        emit(event, buf);
    }
}
