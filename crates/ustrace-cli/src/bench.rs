//! `ustrace bench`: hot-path costs on this machine.

#[derive(clap::Args)]
pub struct BenchArgs {
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(_args: BenchArgs) -> Result<(), String> {
    Err("the benchmarks are being written".into())
}
