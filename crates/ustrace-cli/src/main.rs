//! `ustrace`: the command-line door to ustrace.
//!
//! `demo` and `bench` run in this process on the built-in workload; the other verbs reach a
//! running process's tracefs over its control socket (`ps`, `cat`, `write`, `ls`, `pipe`,
//! `hist`, `top`) or a FUSE mount (`mount`).

/// `println!` for what the verbs print: a reader that went away (`ustrace demo | head`) ends
/// the process quietly and successfully, where `println!` would panic on the broken pipe.
macro_rules! outln {
    () => {
        $crate::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` with [`outln!`]'s handling of a broken pipe.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::write_out(format_args!($($arg)*))
    };
}

mod bench;
mod bench_ftrace;
mod bench_inter;
mod bench_measure;
mod bench_peers;
mod bench_record;
mod bench_scale;
mod demo;
mod exec;
mod export;
mod flamegraph;
mod hist;
mod mount;
mod record;
mod remote;
mod report;
mod stream;
mod top;

use clap::{CommandFactory, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

const EXAMPLES: &str = "\
Examples:
  USTRACE_SERVE=1 ./my-program &        start a program that serves its tracefs
  ustrace demo --serve &                or the built-in workload
  ustrace ps                            list the processes that serve one
  ustrace ls -p 1234 events/kv          look around
  ustrace write -p 1234 events/kv/enable 1
  ustrace cat -p 1234 trace
  ustrace pipe -p 1234                  stream events until Ctrl-C
  ustrace hist -p 1234 kv:get           draw the event's hist (after a hist: trigger)
  sudo ustrace mount -p 1234 /mnt/t &   then use it as /sys/kernel/tracing:
  echo 1 > /mnt/t/events/kv/enable; cat /mnt/t/trace_pipe";

#[derive(Parser)]
#[command(
    name = "ustrace",
    version,
    about = "The kernel's event tracing, inside any Linux process",
    after_help = EXAMPLES,
    // Our own `help` verb below: clap's answers `help --help` with a usage error.
    disable_help_subcommand = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the built-in key-value store workload with tracing on and print its trace.
    Demo(demo::DemoArgs),
    /// Measure the cost of each hot path on this machine.
    Bench(bench::BenchArgs),
    /// List the processes that serve a tracefs: user, events declared and enabled, command line.
    #[command(after_help = "Examples:\n  ustrace ps\n  ustrace ps --sockets")]
    Ps(remote::PsArgs),
    /// Print a tracefs file of a running process (streams a pipe until Ctrl-C).
    #[command(after_help = "Examples:\n  ustrace cat -p 1234 trace\n  \
                            ustrace cat -p 1234 events/kv/get/format")]
    Cat(remote::CatArgs),
    /// Write to a tracefs file of a running process, as `echo TEXT > FILE` would.
    #[command(
        after_help = "Examples:\n  ustrace write -p 1234 events/kv/enable 1\n  \
                            ustrace write -p 1234 events/kv/get/filter 'latency_ns > 1000'\n  \
                            ustrace write -p 1234 --append set_event 'kv:put'\n  \
                            ustrace write -p 1234 trace ''      (clears the buffer)"
    )]
    Write(remote::WriteArgs),
    /// List a directory of a running process's tracefs.
    #[command(after_help = "Examples:\n  ustrace ls -p 1234\n  ustrace ls -p 1234 events")]
    Ls(remote::LsArgs),
    /// Stream a running process's trace_pipe until interrupted.
    #[command(after_help = "Examples:\n  ustrace pipe -p 1234\n  \
                            ustrace pipe -p 1234 --instance foo")]
    Pipe(remote::PipeArgs),
    /// Draw an event's hist as bar charts; write a flame graph of a stacktrace-keyed one.
    #[command(after_help = "Examples:\n  \
                            ustrace write -p 1234 events/kv/get/trigger 'hist:keys=latency_ns.log2'\n  \
                            ustrace hist -p 1234 kv:get\n  \
                            ustrace hist -p 1234 --svg kv.svg kv/get     (keys=common_stacktrace)\n  \
                            ustrace hist --tracefs /sys/kernel/tracing kmem:kmalloc\n  \
                            ustrace hist --file saved.hist --value bytes_req")]
    Hist(hist::HistArgs),
    /// Print a trace.dat as `trace-cmd report` does (or its per-CPU stats).
    #[command(after_help = "Examples:\n  ustrace report\n  \
                            ustrace report trace.dat --cpu 0 -F kv:get\n  \
                            ustrace report --stats trace.dat")]
    Report(report::ReportArgs),
    /// Print a process's (or a tracefs's) events live, as `trace-cmd stream` does.
    #[command(after_help = "Examples:\n  ustrace stream -p 1234\n  \
                            ustrace stream --tracefs /sys/kernel/tracing --duration 5")]
    Stream(stream::StreamArgs),
    /// Show a running process's function profile live, sorted by total time.
    #[command(after_help = "Examples:\n  ustrace top -p 1234 -F 'kv_*'\n  \
                            ustrace top -p 1234                 (the functions set_ftrace_filter names)\n  \
                            ustrace top -p 1234 --all           (every function, when the filter is empty)\n  \
                            ustrace top -p 1234 --once -F 'kv_*'   (one plain table)\n  \
                            ustrace top -p 1234 -n 5 -d 0.5\n\
                            It turns function_profile_enabled on, reads trace_stat/function<cpu> \
                            each refresh, and turns the profiler (and a -F filter) off again at \
                            the end or on Ctrl-C.")]
    Top(top::TopArgs),
    /// Mount a running process's tracefs on a directory until interrupted.
    #[command(after_help = "Examples:\n  ustrace mount -p 1234 /mnt/t &\n  \
                            echo 1 > /mnt/t/events/kv/enable\n  cat /mnt/t/trace\n  \
                            mkdir /mnt/t/instances/foo\n  \
                            cat /mnt/t/trace_pipe       (Ctrl-C to stop)\n  \
                            ustrace mount -p 1234 --allow-group tracing /mnt/t   \
                            (members of `tracing` may read it too)\n\
                            As root no helper is needed; a user mounts through the setuid \
                            fusermount3 (package fuse3). A mount left by a killed \
                            `ustrace mount` is cleaned up by the next one on the same directory.")]
    Mount(mount::MountArgs),
    /// Run a command in a mount namespace where a process's tracefs is the tracefs
    /// (/sys/kernel/tracing, and the tracefs of /proc/mounts): trace-cmd works unchanged.
    #[command(after_help = "Examples:\n  \
                            ustrace exec -P 1234 -- trace-cmd record -e kv sleep 1\n  \
                            ustrace exec -P 1234 -- trace-cmd extract   (then: trace-cmd report)\n  \
                            ustrace exec -P 1234 -- trace-cmd show\n  \
                            ustrace exec -P 1234 -- sh      (cat /sys/kernel/tracing/trace)\n\
                            Root unshares a mount namespace; a user also a user namespace, and \
                            needs a /dev/fuse they may open. Exits with the command's status.")]
    Exec(exec::ExecArgs),
    /// Convert a trace.dat for other viewers: Perfetto, Chrome JSON, folded stacks.
    #[command(after_help = "Examples:\n  \
                            ustrace export --perfetto trace.pftrace     (open in ui.perfetto.dev)\n  \
                            ustrace export --chrome trace.json --counter kv:get:latency_ns\n  \
                            ustrace export --folded stacks.folded saved.dat\n\
                            Fprobe entry/exit pairs become slices; every other event an instant \
                            on its thread's track, its fields as args.")]
    Export(export::ExportArgs),
    /// Draw a flame graph (SVG) of a trace.dat's stack events, or of folded stacks.
    #[command(after_help = "Examples:\n  \
                            ustrace flamegraph -o stacks.svg trace.dat\n  \
                            ustrace flamegraph -o stacks.svg stacks.folded")]
    Flamegraph(flamegraph::FlamegraphArgs),
    /// Run a program (any dynamically linked one) with tracing set up, and save its trace.
    #[command(after_help = "Examples:\n  \
                            ustrace record -F 'work*' -- ./prog arg      (fprobes on functions)\n  \
                            ustrace record -e kv:get -f 'hit == 0' -o kv.dat -- ./server\n  \
                            ustrace record --probe 'f:my/ent parse len=$arg2' -- ./prog\n  \
                            ustrace record -P 1234 -e kv      (a process that serves; Ctrl-C ends)")]
    Record(record::RecordArgs),
    /// Print the shell completion script for SHELL (bash, zsh, fish, elvish, powershell).
    #[command(after_help = "Examples:\n  \
                            ustrace completions bash > /etc/bash_completion.d/ustrace\n  \
                            ustrace completions zsh > /usr/local/share/zsh/site-functions/_ustrace\n  \
                            ustrace completions fish > ~/.config/fish/completions/ustrace.fish")]
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
    /// Write the manual pages (ustrace.1, ustrace-VERB.1) into DIR, creating it if needed.
    #[command(after_help = "Examples:\n  ustrace man /usr/local/share/man/man1\n  \
                            ustrace man /tmp/m && man /tmp/m/ustrace-mount.1")]
    Man {
        /// The directory to write the pages into.
        dir: PathBuf,
    },
    /// Print the help of ustrace, or of one of its verbs.
    #[command(after_help = "Examples:\n  ustrace help\n  ustrace help mount")]
    Help {
        /// The verb to describe.
        verb: Option<String>,
    },
}

/// Writes to stdout for [`outln!`] and [`out!`]. Output is what a verb is for, so a stdout
/// that fails for any other reason ends the process too, with the reason.
fn write_out(args: std::fmt::Arguments) {
    use std::io::Write;
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("ustrace: stdout: {e}");
        std::process::exit(1);
    }
}

/// `ustrace help [VERB]`: the same text as `--help`.
fn help(verb: Option<&str>) -> Result<(), String> {
    let mut cmd = Cli::command();
    // Building fills in each verb's `ustrace VERB` usage line.
    cmd.build();
    let text = match verb {
        None => cmd.render_long_help(),
        Some(name) => match cmd.find_subcommand_mut(name) {
            Some(sub) => sub.render_long_help(),
            None => {
                let verbs: Vec<String> = Cli::command()
                    .get_subcommands()
                    .map(|c| c.get_name().to_owned())
                    .collect();
                return Err(format!(
                    "no verb named {name:?}; the verbs are: {}",
                    verbs.join(", ")
                ));
            }
        },
    };
    out!("{text}");
    Ok(())
}

/// `ustrace man DIR`: one page for `ustrace` and one per verb, named as `man` looks them up.
fn man_pages(dir: &std::path::Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let cmd = Cli::command();
    let mut written = Vec::new();
    let mut page = |cmd: clap::Command| -> Result<(), String> {
        let man = clap_mangen::Man::new(cmd);
        let path = man
            .generate_to(dir)
            .map_err(|e| format!("cannot write a page into {}: {e}", dir.display()))?;
        written.push(path);
        Ok(())
    };
    let mut cmd = cmd;
    cmd.build();
    page(cmd.clone())?;
    for sub in cmd.get_subcommands() {
        // The page of `ustrace mount` is `ustrace-mount(1)`, as git and cargo name theirs.
        let name = format!("ustrace-{}", sub.get_name());
        page(
            sub.clone()
                .bin_name(format!("ustrace {}", sub.get_name()))
                .display_name(name),
        )?;
    }
    for path in &written {
        outln!("{}", path.display());
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Ps(args) => remote::ps(args),
        Command::Cat(args) => remote::cat(args),
        Command::Write(args) => remote::write(args),
        Command::Ls(args) => remote::ls(args),
        Command::Pipe(args) => remote::pipe(args),
        Command::Hist(args) => hist::run(args),
        Command::Top(args) => top::run(args),
        Command::Mount(args) => mount::run(args),
        Command::Exec(args) => match exec::run(args) {
            Ok(code) => return ExitCode::from(code),
            Err(e) => Err(e),
        },
        Command::Record(args) => match record::run(args) {
            Ok(code) => return ExitCode::from(code),
            Err(e) => Err(e),
        },
        Command::Report(args) => report::run(args),
        Command::Stream(args) => stream::run(args),
        Command::Export(args) => export::run(args),
        Command::Flamegraph(args) => flamegraph::run(args),
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "ustrace", &mut out);
            out!("{}", String::from_utf8_lossy(&out));
            Ok(())
        }
        Command::Man { dir } => man_pages(&dir),
        Command::Help { verb } => help(verb.as_deref()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ustrace: {e}");
            ExitCode::FAILURE
        }
    }
}
