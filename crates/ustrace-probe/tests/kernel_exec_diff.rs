//! Differential test of *running* a definition: the kernel fires a uprobe on
//! `/bin/true`'s entry point, with the event enabled only in a private
//! tracing instance, and prints the fetched arguments; we run the same
//! definition against a copy of the file in memory and print ours. The
//! arguments read the probed file through `@+OFFSET` and immediates, so both
//! sides see the same bytes. The event and the instance are removed after.

use std::fs::{self, OpenOptions};
use std::io::Write;

mod common;

use ustrace_probe::*;

const TRACEFS: &str = "/sys/kernel/tracing";

fn u16_at(b: &[u8], o: usize) -> u64 {
    u64::from(u16::from_le_bytes(b[o..o + 2].try_into().unwrap()))
}
fn u32_at(b: &[u8], o: usize) -> u64 {
    u64::from(u32::from_le_bytes(b[o..o + 4].try_into().unwrap()))
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// (file offset of the entry point, file offset of the PT_INTERP string).
fn elf_offsets(elf: &[u8]) -> Option<(u64, u64)> {
    if elf.get(..5)? != b"\x7fELF\x02" {
        return None;
    }
    let entry = u64_at(elf, 0x18);
    let phoff = u64_at(elf, 0x20) as usize;
    let phentsize = u16_at(elf, 0x36) as usize;
    let phnum = u16_at(elf, 0x38) as usize;
    let mut entry_off = None;
    let mut interp = None;
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        let (ty, off, vaddr, filesz) = (
            u32_at(elf, ph),
            u64_at(elf, ph + 8),
            u64_at(elf, ph + 16),
            u64_at(elf, ph + 32),
        );
        if ty == 1 && entry >= vaddr && entry < vaddr + filesz {
            entry_off = Some(entry - vaddr + off);
        }
        if ty == 3 {
            interp = Some(off);
        }
    }
    Some((entry_off?, interp?))
}

fn write(path: &str, text: &str) -> std::io::Result<()> {
    OpenOptions::new()
        .append(true)
        .open(path)?
        .write_all(text.as_bytes())
}

struct FileCtx<'a> {
    file: &'a [u8],
}

impl FetchContext for FileCtx<'_> {
    fn arg(&self, _n: usize) -> u64 {
        0
    }
    fn stack_pointer(&self) -> u64 {
        0
    }
    fn comm(&self) -> &[u8] {
        b"true\0\0\0\0\0\0\0\0\0\0\0\0"
    }
    fn file_base(&self) -> u64 {
        self.file.as_ptr() as u64
    }
}

#[test]
fn fetched_values_print_like_the_kernel() {
    let _lock = common::KernelLock::take();
    let uprobe_events = format!("{TRACEFS}/uprobe_events");
    let Ok(file) = fs::read("/bin/true") else {
        eprintln!("skipped: no /bin/true");
        return;
    };
    if OpenOptions::new()
        .append(true)
        .open(&uprobe_events)
        .is_err()
    {
        eprintln!("skipped: {uprobe_events} is not writable (needs root and tracefs)");
        return;
    }
    let Some((entry, interp)) = elf_offsets(&file) else {
        eprintln!("skipped: /bin/true is not a 64-bit ELF with an interpreter");
        return;
    };
    let group = format!("ustrace_probe_exec{}", std::process::id());
    let instance = format!("{TRACEFS}/instances/{group}");
    let args = format!(
        "m=@+0:x32 w=@+0:s32 b=@+4:u8 h=@+0:x8[4] q=@+0:u16[2] s=@+{interp}:string \
         c=$comm i=\\-3:s16 k=\\\"lit\" bf=@+4:b2@0/8 ch=@+1:char x=\\255:x8 \
         f=+0(\\16):string t=@+{interp}:ustring fn=+0(\\16):u32"
    );
    let def = format!("p:{group}/ev /bin/true:{entry:#x} {args}");

    write(&uprobe_events, &format!("{def}\n")).expect("define the uprobe event");
    let result = (|| -> Result<String, String> {
        fs::create_dir(&instance).map_err(|e| format!("mkdir instance: {e}"))?;
        let enable = format!("{instance}/events/{group}/ev/enable");
        write(&enable, "1").map_err(|e| format!("enable: {e}"))?;
        let status = std::process::Command::new("/bin/true").status();
        let _ = write(&enable, "0");
        status.map_err(|e| format!("run /bin/true: {e}"))?;
        let trace = fs::read_to_string(format!("{instance}/trace")).map_err(|e| e.to_string())?;
        trace
            .lines()
            .find(|l| l.contains(" ev: ("))
            .map(str::to_owned)
            .ok_or_else(|| format!("no ev line in the instance trace:\n{trace}"))
    })();
    let _ = fs::remove_dir(&instance);
    write(&uprobe_events, &format!("-:{group}/ev\n")).expect("remove the uprobe event");
    assert!(!fs::read_to_string(&uprobe_events).unwrap().contains(&group));
    let kernel_line = match result {
        Ok(l) => l,
        Err(e) => {
            eprintln!("skipped: could not fire the uprobe: {e}");
            return;
        }
    };
    let kernel_args = &kernel_line[kernel_line.find(") ").expect("probe ip") + 1..];

    let Ok(DynCommand::Create(d)) = parse_command(&def, &NoEnv) else {
        panic!("we reject {def}");
    };
    let prog = d.compile(None);
    let ctx = FileCtx { file: &file };
    let mut rec = vec![0u8; COMMON_HEADER_SIZE + prog.record_size(&ctx)];
    prog.run(&ctx, &mut rec[COMMON_HEADER_SIZE..]);
    let mut ours = String::new();
    prog.print_args(&rec, None, &mut ours);
    eprintln!("kernel:{kernel_args}\nours:  {ours}");
    // The one explained difference: a uprobe copies an immediate string with
    // the user-memory routine, which faults on the kernel-held bytes, so the
    // kernel prints (fault); ustrace's probes (like the kernel's fprobes and
    // eprobes) store the literal.
    let kernel_args = kernel_args.replace(" k=(fault) ", " k=\"lit\" ");
    assert_eq!(ours, kernel_args);
}
