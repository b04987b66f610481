//! `ustrace flamegraph`: an SVG flame graph of a trace's stacks, drawn by inferno (the Rust
//! port of flamegraph.pl) from the folded stacks `ustrace export --folded` writes.
//!
//! FILE is a trace.dat (its stack events are folded as `export --folded` folds them) or a
//! folded-stacks text file already made, told apart by the trace.dat magic.

use crate::export;
use std::io::Write;
use std::path::PathBuf;

/// The first bytes of every trace.dat (trace-cmd.dat(5)): 0x17 0x08 0x44 "tracing".
const TRACE_DAT_MAGIC: &[u8] = b"\x17\x08\x44tracing";

#[derive(clap::Args)]
pub struct FlamegraphArgs {
    /// A trace.dat with stack events, or a folded-stacks file (`-` for standard input).
    #[arg(value_name = "FILE", default_value = "trace.dat")]
    pub file: PathBuf,
    /// Write the SVG to OUT instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "OUT.svg")]
    pub output: Option<PathBuf>,
    /// The title at the top of the graph.
    #[arg(long, value_name = "TEXT")]
    pub title: Option<String>,
}

/// The folded stacks of FILE, whichever kind it is.
fn folded_of(file: &std::path::Path) -> Result<String, String> {
    let raw = if file == std::path::Path::new("-") {
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut raw)
            .map_err(|e| format!("cannot read standard input: {e}"))?;
        raw
    } else {
        // Only the magic is read here: a trace.dat is read by the reader below.
        let mut head = [0u8; 10];
        let mut f = std::fs::File::open(file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let n = std::io::Read::read(&mut f, &mut head)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        if head[..n] == *TRACE_DAT_MAGIC {
            let reader = export::open(file)?;
            let symbols = export::folded::symbols_of(&reader);
            let stacks = export::folded::fold(&reader, &symbols)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            return Ok(export::folded::text(&stacks));
        }
        std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?
    };
    String::from_utf8(raw).map_err(|_| {
        format!(
            "{}: neither a trace.dat nor folded stacks (text lines `a;b;c COUNT`)",
            file.display()
        )
    })
}

/// Draws the SVG of `folded` (one `stack count` a line).
pub fn svg(folded: &str, title: &str, out: &mut dyn Write) -> std::io::Result<()> {
    let mut opts = inferno::flamegraph::Options::default();
    title.clone_into(&mut opts.title);
    "stacks".clone_into(&mut opts.count_name);
    inferno::flamegraph::from_lines(&mut opts, folded.lines(), out)
}

/// `ustrace flamegraph`.
pub fn run(args: FlamegraphArgs) -> Result<(), String> {
    let folded = folded_of(&args.file)?;
    if folded.lines().all(|l| l.trim().is_empty()) {
        return Err(format!(
            "{}: no stacks to draw (record with the stacktrace trigger, or the stacktrace \
             or userstacktrace option)",
            args.file.display()
        ));
    }
    let title = args
        .title
        .unwrap_or_else(|| format!("ustrace: {}", args.file.display()));
    let out = args.output.unwrap_or_else(|| PathBuf::from("-"));
    export::write_output(&out, |w| svg(&folded, &title, w))
}

#[cfg(test)]
mod tests {
    #[test]
    fn inferno_draws_each_frame_of_the_folded_stacks() {
        let mut out = Vec::new();
        super::svg("app;main;work 3\napp;main 1\n", "t", &mut out).unwrap();
        let svg = String::from_utf8(out).unwrap();
        assert!(svg.starts_with("<?xml"), "{svg}");
        for frame in ["app", "main", "work"] {
            assert!(svg.contains(&format!(">{frame}<")), "{frame} missing");
        }
        assert!(svg.contains("4 stacks"), "the total is counted");
    }
}
