//! Function parameters and their types from DWARF, for BTF-style fetch
//! arguments (`f:myprobe vfs_read count pos`, `prev->comm:string`).
//!
//! The kernel answers "what are the arguments of `vfs_read` and what is at
//! `file->f_inode`" from BTF. A user-space program's equivalent is DWARF: in
//! the object itself (`-g`) or in a separate debug file found by build-id
//! under `/usr/lib/debug/.build-id/xx/rest.debug` (compressed sections are
//! handled). This module turns one function's DWARF into a small, owned
//! description:
//!
//! ```text
//!   Symbol ──► object path, bias ──► DWARF (own or debug file)
//!          ──► CU whose ranges contain the entry ──► DW_TAG_subprogram
//!          ──► formal parameters ──► TypeTable (types by id, cycles allowed)
//!
//!   resolve(o: struct outer *, "->in.name")
//!     value = o
//!     Add(offsetof(outer, in) + offsetof(inner, name))  ──► address of o->in.name
//!     type  = char[16]                                  (":string" reads it there)
//!   resolve(o, "->next->x")
//!     Add(offsetof(outer,next)), Load, Add(offsetof(outer,x)) ──► address of x
//! ```
//!
//! Types refer to each other by [`TypeId`], so recursive structures
//! (`struct list { struct list *next; }`) are finite. Typedefs are kept (for
//! their names) and looked through by the helpers; `const`/`volatile`/
//! `restrict`/`_Atomic` are dropped.
//!
//! Parameter-to-register mapping ([`Param::abi_index`]) follows the x86-64
//! System V classification for the simple cases only (integers, pointers and
//! enums take the next integer register; floats take none; small aggregates
//! take one or two) — best effort, like the kernel's `$argN`.
//!
//! Loading reads the whole DWARF of the object each call: this is for
//! creating dynamic events, never for a probe hit.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use gimli::{AttributeValue, EndianArcSlice, LittleEndian, Reader as _, UnitSectionOffset};
use object::{Object, ObjectSection};

use crate::symbols::{self, Inventory, Symbol};

type R = EndianArcSlice<LittleEndian>;

/// Error finding or reading debug information.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebugInfoError(String);

impl std::fmt::Display for DebugInfoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DebugInfoError {}

fn err(msg: impl Into<String>) -> DebugInfoError {
    DebugInfoError(msg.into())
}

impl From<gimli::Error> for DebugInfoError {
    fn from(e: gimli::Error) -> Self {
        err(format!("bad dwarf: {e}"))
    }
}

/// Index of a type in a [`TypeTable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TypeId(pub u32);

/// How a base type's bits are to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseEncoding {
    /// Two's-complement signed integer.
    Signed,
    /// Unsigned integer (also `bool`).
    Unsigned,
    /// `char`, `signed char` or `unsigned char`.
    Char {
        /// Whether the character type is signed.
        signed: bool,
    },
    /// IEEE float.
    Float,
}

/// A member of a struct or union.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Name; `None` for an anonymous struct/union member.
    pub name: Option<String>,
    /// Byte offset from the start of the enclosing aggregate.
    pub offset: u64,
    /// Type of the member.
    pub ty: TypeId,
    /// For bitfields: (bit offset from `offset`'s byte, width in bits).
    pub bits: Option<(u64, u64)>,
}

/// What a type is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TypeKind {
    /// `void` (only behind pointers, or as a return type).
    Void,
    /// Integer, character or floating-point base type.
    Base(BaseEncoding),
    /// Pointer (or C++ reference) to another type.
    Pointer(TypeId),
    /// `struct` or `class`.
    Struct(Vec<Member>),
    /// `union`.
    Union(Vec<Member>),
    /// Array of `count` elements (`None` when unknown/flexible).
    Array {
        /// Element type.
        elem: TypeId,
        /// Number of elements (all dimensions multiplied).
        count: Option<u64>,
    },
    /// Enumeration (an integer).
    Enum {
        /// Whether the underlying integer is signed.
        signed: bool,
    },
    /// Named alias of another type.
    Typedef(TypeId),
    /// Function type (only behind pointers).
    Function,
}

/// One type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeNode {
    /// Name as written in the source (`unsigned long`, `outer`, `size_t`).
    pub name: Option<String>,
    /// Size in bytes, when known.
    pub size: Option<u64>,
    /// What it is.
    pub kind: TypeKind,
}

/// All types reachable from one function's parameters and return type.
#[derive(Debug, Clone, Default)]
pub struct TypeTable {
    nodes: Vec<TypeNode>,
}

/// One step of a field access, applied to a running value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// value += offset (address arithmetic).
    Add(u64),
    /// value = the pointer-sized word at address `value` (fault-safe read).
    Load,
}

/// Result of resolving `->a.b->c` against a type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRef {
    /// Steps from the base value to the *address* of the final field.
    pub steps: Vec<Step>,
    /// Type of the final field (read `size_of(ty)` bytes at the address for a
    /// scalar; a `char[]` is a string starting there).
    pub ty: TypeId,
    /// Bitfield position of the final field, if it is one.
    pub bits: Option<(u64, u64)>,
}

impl TypeTable {
    /// The node for `id`.
    pub fn get(&self, id: TypeId) -> &TypeNode {
        &self.nodes[id.0 as usize]
    }

    /// Number of types.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Adds a type, for signatures built from something other than DWARF (a tracepoint's
    /// declaration).
    pub fn push(&mut self, node: TypeNode) -> TypeId {
        self.nodes.push(node);
        TypeId(self.nodes.len() as u32 - 1)
    }

    /// Looks through typedefs.
    pub fn strip(&self, mut id: TypeId) -> TypeId {
        for _ in 0..64 {
            match self.get(id).kind {
                TypeKind::Typedef(t) => id = t,
                _ => break,
            }
        }
        id
    }

    /// Size in bytes, looking through typedefs.
    pub fn size_of(&self, id: TypeId) -> Option<u64> {
        let n = self.get(id);
        n.size.or_else(|| match n.kind {
            TypeKind::Typedef(t) => self.size_of(t),
            TypeKind::Pointer(_) => Some(8),
            _ => None,
        })
    }

    /// Whether values of this type are signed integers.
    pub fn is_signed(&self, id: TypeId) -> bool {
        match self.get(self.strip(id)).kind {
            TypeKind::Base(BaseEncoding::Signed)
            | TypeKind::Base(BaseEncoding::Char { signed: true }) => true,
            TypeKind::Enum { signed } => signed,
            _ => false,
        }
    }

    /// Whether this is a pointer (after typedefs).
    pub fn is_pointer(&self, id: TypeId) -> bool {
        matches!(self.get(self.strip(id)).kind, TypeKind::Pointer(_))
    }

    fn is_char(&self, id: TypeId) -> bool {
        matches!(
            self.get(self.strip(id)).kind,
            TypeKind::Base(BaseEncoding::Char { .. })
        )
    }

    /// `char *` (any qualifiers/typedefs): the kernel lets `:string` apply.
    pub fn is_char_pointer(&self, id: TypeId) -> bool {
        matches!(self.get(self.strip(id)).kind, TypeKind::Pointer(t) if self.is_char(t))
    }

    /// `char [N]`: an embedded string.
    pub fn is_char_array(&self, id: TypeId) -> bool {
        matches!(self.get(self.strip(id)).kind, TypeKind::Array { elem, .. } if self.is_char(elem))
    }

    /// C spelling of the type: `unsigned long`, `struct outer *`, `char[16]`.
    pub fn c_name(&self, id: TypeId) -> String {
        self.c_name_depth(id, 0)
    }

    fn c_name_depth(&self, id: TypeId, depth: usize) -> String {
        if depth > 16 {
            return "...".into();
        }
        let n = self.get(id);
        let named = |kw: &str| match &n.name {
            Some(name) => format!("{kw} {name}"),
            None => format!("{kw} <anon>"),
        };
        match &n.kind {
            TypeKind::Void => "void".into(),
            TypeKind::Base(_) | TypeKind::Typedef(_) => {
                n.name.clone().unwrap_or_else(|| "<anon>".into())
            }
            TypeKind::Pointer(t) => {
                let inner = self.c_name_depth(*t, depth + 1);
                if inner.ends_with('*') {
                    format!("{inner}*")
                } else {
                    format!("{inner} *")
                }
            }
            TypeKind::Struct(_) => named("struct"),
            TypeKind::Union(_) => named("union"),
            TypeKind::Enum { .. } => named("enum"),
            TypeKind::Array { elem, count } => match count {
                Some(c) => format!("{}[{c}]", self.c_name_depth(*elem, depth + 1)),
                None => format!("{}[]", self.c_name_depth(*elem, depth + 1)),
            },
            TypeKind::Function => "<function>".into(),
        }
    }

    /// Finds `name` among the members of the struct/union `agg`, descending
    /// into anonymous members as C does. Returns (offset, member).
    pub fn member(&self, agg: TypeId, name: &str) -> Option<(u64, &Member)> {
        let members = match &self.get(self.strip(agg)).kind {
            TypeKind::Struct(m) | TypeKind::Union(m) => m,
            _ => return None,
        };
        for m in members {
            match &m.name {
                Some(n) if n == name => return Some((m.offset, m)),
                None => {
                    if let Some((off, inner)) = self.member(m.ty, name) {
                        return Some((m.offset + off, inner));
                    }
                }
                _ => {}
            }
        }
        None
    }

    /// Resolves a field path (`->a.b->c`) starting from a value of type
    /// `base`. `->` needs a pointer to a struct/union, `.` a struct/union.
    pub fn resolve(&self, base: TypeId, path: &str) -> Result<FieldRef, DebugInfoError> {
        let mut steps = Vec::new();
        let mut cur = base;
        let mut bits = None;
        // Whether `value` currently holds the address of `cur` (after a
        // member access) rather than a value of type `cur`.
        let mut at_address = false;
        let mut rest = path;
        while !rest.is_empty() {
            let (arrow, after) = if let Some(r) = rest.strip_prefix("->") {
                (true, r)
            } else if let Some(r) = rest.strip_prefix('.') {
                (false, r)
            } else {
                return Err(err(format!("expected '->' or '.' at '{rest}' in '{path}'")));
            };
            let end = after.find(['-', '.']).unwrap_or(after.len());
            let name = &after[..end];
            if name.is_empty() {
                return Err(err(format!("missing field name in '{path}'")));
            }
            rest = &after[end..];
            let agg = if arrow {
                let TypeKind::Pointer(target) = self.get(self.strip(cur)).kind else {
                    return Err(err(format!(
                        "'->{name}' on non-pointer type {}",
                        self.c_name(cur)
                    )));
                };
                if at_address {
                    steps.push(Step::Load);
                }
                target
            } else {
                if !at_address {
                    return Err(err(format!(
                        "'.{name}' on a value of type {} (use '->' through a pointer)",
                        self.c_name(cur)
                    )));
                }
                cur
            };
            let (off, m) = self
                .member(agg, name)
                .ok_or_else(|| err(format!("{} has no member '{name}'", self.c_name(agg))))?;
            match steps.last_mut() {
                Some(Step::Add(prev)) => *prev += off,
                _ => steps.push(Step::Add(off)),
            }
            cur = m.ty;
            bits = m.bits;
            at_address = true;
        }
        if !at_address {
            return Err(err("empty field path"));
        }
        Ok(FieldRef {
            steps,
            ty: cur,
            bits,
        })
    }
}

/// One formal parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    /// Name (`arg<N>` when the DWARF has none).
    pub name: String,
    /// Type.
    pub ty: TypeId,
    /// Integer-register index under the x86-64 SysV ABI (0 = rdi ... 5 = r9),
    /// i.e. `$arg{abi_index+1}`; `None` when passed otherwise (float, memory).
    pub abi_index: Option<usize>,
}

/// A function's signature from DWARF.
#[derive(Debug, Clone)]
pub struct FunctionInfo {
    /// Name from DWARF (`DW_AT_name`).
    pub name: String,
    /// Parameters in declaration order.
    pub params: Vec<Param>,
    /// Return type; `None` for `void`.
    pub ret: Option<TypeId>,
    /// Every type the above refer to.
    pub types: TypeTable,
    /// The file the DWARF came from.
    pub source: Arc<str>,
}

impl FunctionInfo {
    /// The parameter called `name`.
    pub fn param(&self, name: &str) -> Option<&Param> {
        self.params.iter().find(|p| p.name == name)
    }
}

/// DWARF of one file, with owned (decompressed) sections.
struct Loaded {
    dwarf: gimli::Dwarf<R>,
    path: Arc<str>,
}

fn load_dwarf(path: &str) -> Result<Option<Loaded>, DebugInfoError> {
    let map = symbols::Mapped::open(path).map_err(|e| err(format!("{path}: {e}")))?;
    let file =
        object::File::parse(map.bytes()).map_err(|e| err(format!("{path}: bad elf: {e}")))?;
    if file.section_by_name(".debug_info").is_none() {
        return Ok(None);
    }
    let load = |id: gimli::SectionId| -> Result<R, DebugInfoError> {
        use gimli::SectionId as S;
        // Location lists, frames, macros and the name indexes are never
        // consulted here: skip decompressing them.
        let unused = matches!(
            id,
            S::DebugLoc
                | S::DebugLocLists
                | S::DebugFrame
                | S::DebugMacinfo
                | S::DebugMacro
                | S::DebugPubNames
                | S::DebugPubTypes
                | S::DebugTypes
                | S::DebugCuIndex
                | S::DebugTuIndex
        );
        let section = if unused {
            None
        } else {
            file.section_by_name(id.name())
        };
        let data: Arc<[u8]> = match section {
            Some(s) => match s
                .uncompressed_data()
                .map_err(|e| err(format!("{path}: {}: {e}", id.name())))?
            {
                Cow::Borrowed(b) => Arc::from(b),
                Cow::Owned(v) => Arc::from(v),
            },
            None => Arc::from(&[][..]),
        };
        Ok(EndianArcSlice::new(data, LittleEndian))
    };
    let dwarf = gimli::Dwarf::load(load)?;
    Ok(Some(Loaded {
        dwarf,
        path: Arc::from(path),
    }))
}

/// The last few objects' DWARF, so several lookups in one library (e.g.
/// `$arg*` on a few functions) decompress it once. Small on purpose: a
/// library's DWARF is megabytes.
static CACHE: std::sync::Mutex<Vec<(String, Arc<Loaded>)>> = std::sync::Mutex::new(Vec::new());
const CACHE_ENTRIES: usize = 2;

/// Finds DWARF for the object at `path`: its own, else by build-id.
fn dwarf_for_object(path: &str, build_id: Option<&[u8]>) -> Result<Arc<Loaded>, DebugInfoError> {
    let key = match build_id {
        Some(id) => format!("{path}#{id:02x?}"),
        None => path.to_string(),
    };
    {
        let cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, l)) = cache.iter().find(|(k, _)| *k == key) {
            return Ok(Arc::clone(l));
        }
    }
    let loaded = dwarf_for_object_uncached(path, build_id).map(Arc::new)?;
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if cache.len() >= CACHE_ENTRIES {
        cache.remove(0);
    }
    cache.push((key, Arc::clone(&loaded)));
    Ok(loaded)
}

fn dwarf_for_object_uncached(
    path: &str,
    build_id: Option<&[u8]>,
) -> Result<Loaded, DebugInfoError> {
    if let Some(l) = load_dwarf(path)? {
        return Ok(l);
    }
    if let Some(dbg) = build_id.and_then(symbols::debug_file_for_build_id) {
        if let Some(l) = load_dwarf(&dbg)? {
            return Ok(l);
        }
    }
    Err(err(format!(
        "no debug info for {path} (not built with -g, and no /usr/lib/debug/.build-id file)"
    )))
}

/// The signature of `sym` from the DWARF of its object.
pub fn function_info(inv: &Inventory, sym: &Symbol) -> Result<FunctionInfo, DebugInfoError> {
    let obj = inv
        .objects()
        .iter()
        .find(|o| Arc::ptr_eq(&o.path, &sym.object) || *o.path == *sym.object)
        .ok_or_else(|| err(format!("object {} not in inventory", sym.object)))?;
    let loaded = dwarf_for_object(&obj.path, obj.build_id.as_deref())?;
    let file_addr = (sym.addr.wrapping_sub(obj.bias)) as u64;
    let mut ctx = Ctx::new(&loaded.dwarf)?;
    let (ui, off) = ctx.find_subprogram(file_addr)?.ok_or_else(|| {
        err(format!(
            "no DWARF subprogram at {:#x} for {}",
            file_addr, sym.name
        ))
    })?;
    let mut info = ctx.function(ui, off)?;
    info.source = Arc::clone(&loaded.path);
    Ok(info)
}

/// Convenience: the signature of the function called `name` (first match).
pub fn function_info_by_name(inv: &Inventory, name: &str) -> Result<FunctionInfo, DebugInfoError> {
    let sym = inv
        .find(name)
        .into_iter()
        .next()
        .ok_or_else(|| err(format!("no function named {name}")))?;
    function_info(inv, sym)
}

/// A member's byte offset: a constant (DWARF 3+), or the DWARF 2 form, an
/// expression `DW_OP_plus_uconst N` (also `DW_OP_constu N`).
fn member_offset(v: &AttributeValue<R>, encoding: gimli::Encoding) -> Option<u64> {
    if let Some(c) = v.udata_value() {
        return Some(c);
    }
    let AttributeValue::Exprloc(expr) = v else {
        return None;
    };
    let mut ops = expr.clone().operations(encoding);
    match ops.next().ok()?? {
        gimli::Operation::PlusConstant { value } | gimli::Operation::UnsignedConstant { value } => {
            ops.next().ok()?.is_none().then_some(value)
        }
        _ => None,
    }
}

struct Ctx<'d> {
    dwarf: &'d gimli::Dwarf<R>,
    /// Every unit header, in section order (cheap to read).
    headers: Vec<gimli::UnitHeader<R>>,
    /// Units parsed on first use (abbreviations and all), same indices.
    units: Vec<std::cell::OnceCell<gimli::Unit<R>>>,
    table: TypeTable,
    memo: HashMap<usize, TypeId>,
}

impl<'d> Ctx<'d> {
    fn new(dwarf: &'d gimli::Dwarf<R>) -> Result<Self, DebugInfoError> {
        let mut headers = Vec::new();
        let mut iter = dwarf.units();
        while let Some(h) = iter.next()? {
            headers.push(h);
        }
        let units = (0..headers.len())
            .map(|_| std::cell::OnceCell::new())
            .collect();
        Ok(Ctx {
            dwarf,
            headers,
            units,
            table: TypeTable::default(),
            memo: HashMap::new(),
        })
    }

    fn unit(&self, ui: usize) -> Result<&gimli::Unit<R>, DebugInfoError> {
        if let Some(u) = self.units[ui].get() {
            return Ok(u);
        }
        let u = self.dwarf.unit(self.headers[ui].clone())?;
        Ok(self.units[ui].get_or_init(|| u))
    }

    fn start_of(&self, ui: usize) -> usize {
        match self.headers[ui].offset() {
            UnitSectionOffset::DebugInfoOffset(o) => o.0,
            UnitSectionOffset::DebugTypesOffset(o) => o.0,
        }
    }

    /// Index of the unit whose entries contain section offset `o`.
    fn unit_containing(&self, o: usize) -> Option<usize> {
        // Headers are in section order: binary search on their start offsets.
        let (mut lo, mut hi) = (0, self.headers.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.start_of(mid) <= o {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let ui = lo.checked_sub(1)?;
        let end = self.start_of(ui) + self.headers[ui].length_including_self();
        (o < end).then_some(ui)
    }

    /// Candidate units for `addr`: from .debug_aranges when it covers it,
    /// else every unit whose ranges contain it.
    fn units_for_address(&self, addr: u64) -> Result<Vec<usize>, DebugInfoError> {
        let mut out = Vec::new();
        let mut headers = self.dwarf.debug_aranges.headers();
        while let Some(h) = headers.next()? {
            let mut entries = h.entries();
            while let Some(e) = entries.next()? {
                let r = e.range();
                if r.begin <= addr && addr < r.end {
                    if let Some(ui) = self.unit_containing(h.debug_info_offset().0) {
                        out.push(ui);
                    }
                    break;
                }
            }
        }
        if !out.is_empty() {
            return Ok(out);
        }
        for ui in 0..self.headers.len() {
            let unit = self.unit(ui)?;
            let mut ranges = self.dwarf.unit_ranges(unit)?;
            while let Some(r) = ranges.next()? {
                if r.begin <= addr && addr < r.end {
                    out.push(ui);
                    break;
                }
            }
        }
        Ok(out)
    }

    fn find_subprogram(
        &self,
        addr: u64,
    ) -> Result<Option<(usize, gimli::UnitOffset)>, DebugInfoError> {
        for ui in self.units_for_address(addr)? {
            let unit = self.unit(ui)?;
            let mut cursor = unit.entries();
            while let Some((_, e)) = cursor.next_dfs()? {
                if e.tag() != gimli::DW_TAG_subprogram {
                    continue;
                }
                let low = match e.attr_value(gimli::DW_AT_low_pc)? {
                    Some(v) => self.dwarf.attr_address(unit, v)?,
                    None => None,
                };
                let hit = match low {
                    Some(l) => l == addr,
                    None => {
                        let mut rs = self.dwarf.die_ranges(unit, e)?;
                        let mut starts_here = false;
                        while let Some(r) = rs.next()? {
                            if r.begin == addr {
                                starts_here = true;
                                break;
                            }
                        }
                        starts_here
                    }
                };
                if hit {
                    return Ok(Some((ui, e.offset())));
                }
            }
        }
        Ok(None)
    }

    /// Unit index and unit offset for a reference attribute.
    fn deref(&self, ui: usize, v: &AttributeValue<R>) -> Option<(usize, gimli::UnitOffset)> {
        match v {
            AttributeValue::UnitRef(o) => Some((ui, *o)),
            AttributeValue::DebugInfoRef(o) => {
                let ui = self.unit_containing(o.0)?;
                Some((ui, o.to_unit_offset(&self.headers[ui])?))
            }
            _ => None,
        }
    }

    fn global(&self, ui: usize, off: gimli::UnitOffset) -> usize {
        off.to_debug_info_offset(&self.headers[ui])
            .map_or(usize::MAX, |o| o.0)
    }

    fn name_of(
        &self,
        ui: usize,
        e: &gimli::DebuggingInformationEntry<'_, '_, R>,
    ) -> Result<Option<String>, DebugInfoError> {
        Ok(match e.attr_value(gimli::DW_AT_name)? {
            Some(v) => Some(
                self.dwarf
                    .attr_string(self.unit(ui)?, v)?
                    .to_string_lossy()?
                    .into_owned(),
            ),
            None => None,
        })
    }

    /// Follows DW_AT_abstract_origin / DW_AT_specification to the DIE that
    /// carries the name and type.
    fn origin(
        &self,
        ui: usize,
        off: gimli::UnitOffset,
    ) -> Result<(usize, gimli::UnitOffset), DebugInfoError> {
        let (mut ui, mut off) = (ui, off);
        for _ in 0..8 {
            let e = self.unit(ui)?.entry(off)?;
            if e.attr_value(gimli::DW_AT_name)?.is_some() {
                break;
            }
            let next = match e.attr_value(gimli::DW_AT_abstract_origin)? {
                Some(v) => Some(v),
                None => e.attr_value(gimli::DW_AT_specification)?,
            };
            match next.and_then(|v| self.deref(ui, &v)) {
                Some(t) => (ui, off) = t,
                None => break,
            }
        }
        Ok((ui, off))
    }

    fn type_attr(
        &mut self,
        ui: usize,
        off: gimli::UnitOffset,
    ) -> Result<Option<TypeId>, DebugInfoError> {
        let v = self.unit(ui)?.entry(off)?.attr_value(gimli::DW_AT_type)?;
        match v.and_then(|v| self.deref(ui, &v)) {
            Some((tu, to)) => Ok(Some(self.ty(tu, to, 0)?)),
            None => Ok(None),
        }
    }

    fn void(&mut self) -> TypeId {
        self.table.push(TypeNode {
            name: Some("void".into()),
            size: None,
            kind: TypeKind::Void,
        })
    }

    fn ty(
        &mut self,
        ui: usize,
        off: gimli::UnitOffset,
        depth: usize,
    ) -> Result<TypeId, DebugInfoError> {
        let key = self.global(ui, off);
        if let Some(&id) = self.memo.get(&key) {
            return Ok(id);
        }
        if depth > 64 {
            return Err(err("type nesting too deep"));
        }
        let e = self.unit(ui)?.entry(off)?;
        let tag = e.tag();
        let name = self.name_of(ui, &e)?;
        let size = e
            .attr_value(gimli::DW_AT_byte_size)?
            .and_then(|v| v.udata_value());
        let target = e
            .attr_value(gimli::DW_AT_type)?
            .and_then(|v| self.deref(ui, &v));
        let sub = |this: &mut Self| -> Result<TypeId, DebugInfoError> {
            match target {
                Some((tu, to)) => this.ty(tu, to, depth + 1),
                None => Ok(this.void()),
            }
        };
        let id = match tag {
            gimli::DW_TAG_const_type
            | gimli::DW_TAG_volatile_type
            | gimli::DW_TAG_restrict_type
            | gimli::DW_TAG_atomic_type => {
                let t = sub(self)?;
                self.memo.insert(key, t);
                return Ok(t);
            }
            gimli::DW_TAG_base_type => {
                let enc = e.attr_value(gimli::DW_AT_encoding)?;
                let enc = match enc {
                    Some(AttributeValue::Encoding(x)) => x,
                    _ => gimli::DW_ATE_unsigned,
                };
                let kind = match enc {
                    gimli::DW_ATE_signed => BaseEncoding::Signed,
                    gimli::DW_ATE_signed_char => BaseEncoding::Char { signed: true },
                    gimli::DW_ATE_unsigned_char => BaseEncoding::Char { signed: false },
                    gimli::DW_ATE_float => BaseEncoding::Float,
                    _ => BaseEncoding::Unsigned,
                };
                self.table.push(TypeNode {
                    name,
                    size,
                    kind: TypeKind::Base(kind),
                })
            }
            gimli::DW_TAG_pointer_type
            | gimli::DW_TAG_reference_type
            | gimli::DW_TAG_rvalue_reference_type => {
                // Reserve first: the pointee may point back here.
                let id = self.table.push(TypeNode {
                    name,
                    size: Some(size.unwrap_or(8)),
                    kind: TypeKind::Void,
                });
                self.memo.insert(key, id);
                let t = sub(self)?;
                self.table.nodes[id.0 as usize].kind = TypeKind::Pointer(t);
                return Ok(id);
            }
            gimli::DW_TAG_typedef => {
                let id = self.table.push(TypeNode {
                    name,
                    size: None,
                    kind: TypeKind::Void,
                });
                self.memo.insert(key, id);
                let t = sub(self)?;
                self.table.nodes[id.0 as usize].kind = TypeKind::Typedef(t);
                return Ok(id);
            }
            gimli::DW_TAG_structure_type | gimli::DW_TAG_class_type | gimli::DW_TAG_union_type => {
                let id = self.table.push(TypeNode {
                    name,
                    size,
                    kind: TypeKind::Struct(Vec::new()),
                });
                self.memo.insert(key, id);
                let members = self.members(ui, off, depth)?;
                self.table.nodes[id.0 as usize].kind = if tag == gimli::DW_TAG_union_type {
                    TypeKind::Union(members)
                } else {
                    TypeKind::Struct(members)
                };
                return Ok(id);
            }
            gimli::DW_TAG_array_type => {
                let elem = sub(self)?;
                let count = self.array_count(ui, off)?;
                let elem_size = self.table.size_of(elem);
                self.table.push(TypeNode {
                    name: None,
                    size: size.or_else(|| Some(elem_size? * count?)),
                    kind: TypeKind::Array { elem, count },
                })
            }
            gimli::DW_TAG_enumeration_type => {
                let signed = match target {
                    Some((tu, to)) => {
                        let t = self.ty(tu, to, depth + 1)?;
                        self.table.is_signed(t)
                    }
                    None => false,
                };
                self.table.push(TypeNode {
                    name,
                    size,
                    kind: TypeKind::Enum { signed },
                })
            }
            gimli::DW_TAG_subroutine_type => self.table.push(TypeNode {
                name,
                size: None,
                kind: TypeKind::Function,
            }),
            _ => self.table.push(TypeNode {
                name,
                size,
                kind: TypeKind::Void,
            }),
        };
        self.memo.insert(key, id);
        Ok(id)
    }

    fn members(
        &mut self,
        ui: usize,
        off: gimli::UnitOffset,
        depth: usize,
    ) -> Result<Vec<Member>, DebugInfoError> {
        let mut raw = Vec::new();
        {
            let unit = &self.unit(ui)?;
            let mut tree = unit.entries_tree(Some(off))?;
            let root = tree.root()?;
            let mut children = root.children();
            while let Some(child) = children.next()? {
                let e = child.entry();
                if e.tag() != gimli::DW_TAG_member {
                    continue;
                }
                let loc = e
                    .attr_value(gimli::DW_AT_data_member_location)?
                    .and_then(|v| member_offset(&v, unit.encoding()));
                let bit_size = e
                    .attr_value(gimli::DW_AT_bit_size)?
                    .and_then(|v| v.udata_value());
                let data_bit = e
                    .attr_value(gimli::DW_AT_data_bit_offset)?
                    .and_then(|v| v.udata_value());
                let ty = e.attr_value(gimli::DW_AT_type)?;
                raw.push((e.offset(), loc, bit_size, data_bit, ty));
            }
        }
        let mut out = Vec::with_capacity(raw.len());
        for (moff, loc, bit_size, data_bit, ty) in raw {
            let e = self.unit(ui)?.entry(moff)?;
            let name = self.name_of(ui, &e)?;
            let ty = match ty.and_then(|v| self.deref(ui, &v)) {
                Some((tu, to)) => self.ty(tu, to, depth + 1)?,
                None => self.void(),
            };
            let (offset, bits) = match (loc, data_bit, bit_size) {
                (Some(o), _, Some(w)) => (o, Some((0, w))),
                (None, Some(db), Some(w)) => (db / 8, Some((db % 8, w))),
                (Some(o), _, None) => (o, None),
                (None, Some(db), None) => (db / 8, None),
                (None, None, w) => (0, w.map(|w| (0, w))),
            };
            out.push(Member {
                name,
                offset,
                ty,
                bits,
            });
        }
        Ok(out)
    }

    fn array_count(
        &self,
        ui: usize,
        off: gimli::UnitOffset,
    ) -> Result<Option<u64>, DebugInfoError> {
        let unit = &self.unit(ui)?;
        let mut tree = unit.entries_tree(Some(off))?;
        let root = tree.root()?;
        let mut children = root.children();
        let mut total: Option<u64> = None;
        let mut any = false;
        while let Some(child) = children.next()? {
            let e = child.entry();
            if e.tag() != gimli::DW_TAG_subrange_type {
                continue;
            }
            any = true;
            let n = match e
                .attr_value(gimli::DW_AT_count)?
                .and_then(|v| v.udata_value())
            {
                Some(c) => Some(c),
                None => e
                    .attr_value(gimli::DW_AT_upper_bound)?
                    .and_then(|v| v.udata_value())
                    .map(|u| u + 1),
            };
            total = match (total, n) {
                (None, n) if total.is_none() => n,
                (Some(t), Some(n)) => Some(t * n),
                _ => None,
            };
            if n.is_none() {
                return Ok(None);
            }
        }
        Ok(if any { total } else { None })
    }

    fn function(
        &mut self,
        ui: usize,
        off: gimli::UnitOffset,
    ) -> Result<FunctionInfo, DebugInfoError> {
        let (nu, no) = self.origin(ui, off)?;
        let name = {
            let e = self.unit(nu)?.entry(no)?;
            self.name_of(nu, &e)?.unwrap_or_default()
        };
        let ret = self.type_attr(nu, no)?;
        // Parameters: the concrete DIE's children (they may only carry an
        // abstract origin); fall back to the origin's when it has none.
        let mut params = self.param_dies(ui, off)?;
        if params.is_empty() && (nu, no) != (ui, off) {
            params = self.param_dies(nu, no)?;
        }
        let mut out = Vec::with_capacity(params.len());
        let mut int_regs = 0usize;
        for (i, (pu, po)) in params.into_iter().enumerate() {
            let (ou, oo) = self.origin(pu, po)?;
            let pname = {
                let e = self.unit(ou)?.entry(oo)?;
                self.name_of(ou, &e)?
            };
            let ty = match self.type_attr(ou, oo)? {
                Some(t) => t,
                None => self.void(),
            };
            let abi_index = self.classify(ty, &mut int_regs);
            out.push(Param {
                name: pname.unwrap_or_else(|| format!("arg{}", i + 1)),
                ty,
                abi_index,
            });
        }
        // Line-tables-only debug info (`-C debuginfo=1`, `-g1`) still has the function's DIE
        // but no types: a function with no parameters and no return type in a unit without a
        // single base type is "unknown", not "returns void".
        if ret.is_none() && out.is_empty() && !self.unit_has_types(nu)? {
            return Err(err(format!(
                "no type information for {name} (line tables only?)"
            )));
        }
        Ok(FunctionInfo {
            name,
            params: out,
            ret,
            types: std::mem::take(&mut self.table),
            source: Arc::from(""),
        })
    }

    /// SysV x86-64, simple cases: which integer register carries this param.
    fn classify(&self, ty: TypeId, int_regs: &mut usize) -> Option<usize> {
        let t = &self.table;
        let node = t.get(t.strip(ty));
        match node.kind {
            TypeKind::Base(BaseEncoding::Float) => None,
            TypeKind::Base(_) | TypeKind::Pointer(_) | TypeKind::Enum { .. } => {
                let r = *int_regs;
                *int_regs += 1;
                (r < 6).then_some(r)
            }
            TypeKind::Struct(_) | TypeKind::Union(_) | TypeKind::Array { .. } => {
                if let Some(sz) = t.size_of(ty) {
                    let regs = sz.div_ceil(8) as usize;
                    if sz <= 16 && *int_regs + regs <= 6 {
                        *int_regs += regs;
                    }
                }
                None
            }
            _ => None,
        }
    }

    /// Whether unit `ui` describes any type at all.
    fn unit_has_types(&self, ui: usize) -> Result<bool, DebugInfoError> {
        let unit = &self.unit(ui)?;
        let mut entries = unit.entries();
        while let Some((_, e)) = entries.next_dfs()? {
            if matches!(
                e.tag(),
                gimli::DW_TAG_base_type | gimli::DW_TAG_pointer_type | gimli::DW_TAG_structure_type
            ) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn param_dies(
        &self,
        ui: usize,
        off: gimli::UnitOffset,
    ) -> Result<Vec<(usize, gimli::UnitOffset)>, DebugInfoError> {
        let unit = &self.unit(ui)?;
        let mut tree = unit.entries_tree(Some(off))?;
        let root = tree.root()?;
        let mut children = root.children();
        let mut out = Vec::new();
        while let Some(child) = children.next()? {
            let e = child.entry();
            if e.tag() == gimli::DW_TAG_formal_parameter {
                out.push((ui, e.offset()));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// struct node { int v; struct node *next; union { char tag[4]; long w; }; };
    /// with `p` a `struct node *` and `c` a `char`.
    fn table() -> (TypeTable, TypeId, TypeId) {
        let mut t = TypeTable::default();
        let int = t.push(TypeNode {
            name: Some("int".into()),
            size: Some(4),
            kind: TypeKind::Base(BaseEncoding::Signed),
        });
        let long = t.push(TypeNode {
            name: Some("long".into()),
            size: Some(8),
            kind: TypeKind::Base(BaseEncoding::Signed),
        });
        let ch = t.push(TypeNode {
            name: Some("char".into()),
            size: Some(1),
            kind: TypeKind::Base(BaseEncoding::Char { signed: true }),
        });
        let tag = t.push(TypeNode {
            name: None,
            size: Some(4),
            kind: TypeKind::Array {
                elem: ch,
                count: Some(4),
            },
        });
        let node = t.push(TypeNode {
            name: Some("node".into()),
            size: Some(24),
            kind: TypeKind::Void,
        });
        let ptr = t.push(TypeNode {
            name: None,
            size: Some(8),
            kind: TypeKind::Pointer(node),
        });
        let anon = t.push(TypeNode {
            name: None,
            size: Some(8),
            kind: TypeKind::Union(vec![
                Member {
                    name: Some("tag".into()),
                    offset: 0,
                    ty: tag,
                    bits: None,
                },
                Member {
                    name: Some("w".into()),
                    offset: 0,
                    ty: long,
                    bits: None,
                },
            ]),
        });
        t.nodes[node.0 as usize].kind = TypeKind::Struct(vec![
            Member {
                name: Some("v".into()),
                offset: 0,
                ty: int,
                bits: None,
            },
            Member {
                name: Some("next".into()),
                offset: 8,
                ty: ptr,
                bits: None,
            },
            Member {
                name: None,
                offset: 16,
                ty: anon,
                bits: None,
            },
        ]);
        (t, ptr, ch)
    }

    #[test]
    fn resolves_recursive_struct_paths() {
        let (t, p, ch) = table();
        assert_eq!(t.c_name(p), "struct node *");
        let r = t.resolve(p, "->next->next->v").unwrap();
        assert_eq!(
            r.steps,
            [
                Step::Add(8),
                Step::Load,
                Step::Add(8),
                Step::Load,
                Step::Add(0)
            ]
        );
        let r = t.resolve(p, "->next->tag").unwrap();
        assert_eq!(r.steps, [Step::Add(8), Step::Load, Step::Add(16)]);
        assert!(t.is_char_array(r.ty));
        assert_eq!(t.c_name(r.ty), "char[4]");
        assert!(!t.is_char_pointer(r.ty));
        assert!(t.is_signed(ch));
        assert!(t.resolve(p, "").is_err());
        assert!(t.resolve(p, "->").is_err());
        assert!(t.resolve(p, "->v->x").is_err());
        assert!(t.resolve(p, "next").is_err());
    }

    proptest! {
        #[test]
        fn resolve_never_panics(path in "(->|\\.|-|>|[a-z]{0,5}){0,8}") {
            let (t, p, _) = table();
            let _ = t.resolve(p, &path);
        }
    }
}
