//! One ustrace per process, however many copies of the crate are loaded.
//!
//! A program that links ustrace may also be started with the preload agent
//! (`ustrace-agent`, a shared object that carries its own copy of the crate). Two copies
//! would mean two tracefs trees, two sets of buffers and two servers fighting over one
//! control socket. So every copy marks the object it is linked into with an ELF note
//! (`.note.ustrace`), the agent marks its object with a second one (`.note.ustrace-agent`),
//! and at start-up each copy asks [`elected`] whether it is the one that acts: the first
//! loaded object (the main program first, in the dynamic linker's order) that carries the
//! crate and is not the agent; the agent's copy only when no such object exists.
//!
//! Notes sit in `PT_NOTE` segments, which the program headers the dynamic linker already
//! holds describe, so the walk costs no file access and works on stripped binaries. It is
//! start-up control only: nothing on the data path consults it.

use std::ffi::c_void;

/// The note's name: `ustrace` and the NUL, as `namesz` counts it.
const NAME: &[u8; 8] = b"ustrace\0";
/// The agent's note name, padded to a multiple of 4.
const AGENT_NAME: &[u8; 16] = b"ustrace-agent\0\0\0";
/// The note type (any value: the name is what identifies the note).
const NOTE_TYPE: u32 = 0x7573_7472;

/// An ELF note with an 8-byte name and a 4-byte descriptor (the layout version).
#[repr(C, align(4))]
pub struct Note {
    namesz: u32,
    descsz: u32,
    kind: u32,
    name: [u8; 8],
    desc: u32,
}

/// The agent's note: same shape, 14-byte name.
#[repr(C, align(4))]
pub struct AgentNote {
    namesz: u32,
    descsz: u32,
    kind: u32,
    name: [u8; 16],
    desc: u32,
}

#[used]
#[link_section = ".note.ustrace"]
static USTRACE_NOTE: Note = Note {
    namesz: NAME.len() as u32,
    descsz: 4,
    kind: NOTE_TYPE,
    name: *NAME,
    desc: 1,
};

/// The note the agent places in its object (`#[link_section = ".note.ustrace-agent"]`).
pub const AGENT_NOTE: AgentNote = AgentNote {
    namesz: 14,
    descsz: 4,
    kind: NOTE_TYPE,
    name: *AGENT_NAME,
    desc: 1,
};

#[derive(Default)]
struct Walk {
    /// The address of this copy's note.
    me: usize,
    /// Whether this copy's note was found at all (it is, unless a linker dropped it).
    found_me: bool,
    /// Whether the first non-agent object carrying the crate is the one holding `me`.
    winner_is_me: Option<bool>,
    /// Whether the first agent object carrying the crate is the one holding `me`.
    agent_is_me: Option<bool>,
    /// Whether the object holding `me` is the agent.
    me_in_agent: bool,
}

/// What one object's notes say: (carries the crate, is the agent, holds `me`).
fn scan_object(info: &libc::dl_phdr_info, me: usize) -> (bool, bool, bool) {
    let (mut crate_note, mut agent_note, mut holds_me) = (false, false, false);
    for i in 0..info.dlpi_phnum as usize {
        // SAFETY: the dynamic linker gives `dlpi_phnum` program headers at `dlpi_phdr`.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        if ph.p_type != libc::PT_NOTE {
            continue;
        }
        let start = info.dlpi_addr as usize + ph.p_vaddr as usize;
        let end = start + ph.p_memsz as usize;
        if (start..end).contains(&me) {
            holds_me = true;
        }
        let align = (ph.p_align as usize).clamp(4, 8);
        let mut at = start;
        while at + 12 <= end {
            // SAFETY: `at..at + 12` lies inside a loaded PT_NOTE segment (checked above),
            // which is mapped readable; notes are 4-aligned.
            let (namesz, descsz) = unsafe {
                (
                    (at as *const u32).read_unaligned() as usize,
                    ((at + 4) as *const u32).read_unaligned() as usize,
                )
            };
            let name_at = at + 12;
            let desc_at = name_at + namesz.next_multiple_of(align);
            let next = desc_at + descsz.next_multiple_of(align);
            if next > end || next <= at {
                break;
            }
            // SAFETY: the name lies inside the segment (`next <= end`).
            let name = unsafe { std::slice::from_raw_parts(name_at as *const u8, namesz) };
            if name == NAME {
                crate_note = true;
            } else if name == &AGENT_NAME[..14] {
                agent_note = true;
            }
            at = next;
        }
    }
    (crate_note, agent_note, holds_me)
}

unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> i32 {
    // SAFETY: called by dl_iterate_phdr with a valid info and our `Walk`.
    let (info, walk) = unsafe { (&*info, &mut *(data as *mut Walk)) };
    let (crate_note, agent_note, holds_me) = scan_object(info, walk.me);
    walk.found_me |= holds_me;
    walk.me_in_agent |= holds_me && agent_note;
    if crate_note && !agent_note && walk.winner_is_me.is_none() {
        walk.winner_is_me = Some(holds_me);
    }
    if crate_note && agent_note && walk.agent_is_me.is_none() {
        walk.agent_is_me = Some(holds_me);
    }
    0
}

fn walk() -> Walk {
    let mut walk = Walk {
        me: std::ptr::addr_of!(USTRACE_NOTE) as usize,
        ..Walk::default()
    };
    // SAFETY: `visit` matches the callback type and only reads what it is given.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut walk as *mut Walk).cast()) };
    walk
}

/// Whether this copy of ustrace is the one that sets up, serves and traces in this
/// process (see the module documentation). `true` when the notes cannot be found, so a
/// program is never left without its tracer.
pub fn elected() -> bool {
    let walk = walk();
    if !walk.found_me {
        return true;
    }
    match (walk.winner_is_me, walk.agent_is_me) {
        (Some(me), _) => me,
        (None, Some(me)) => me,
        (None, None) => true,
    }
}

/// Whether this copy is the one inside the preload agent, whose own constructor then
/// does the start-up work (quietly) instead of the crate's.
pub fn in_agent() -> bool {
    walk().me_in_agent
}
