//! `ustrace demo`: the built-in workload.

#[derive(clap::Args)]
pub struct DemoArgs {
    /// How long the workload runs, in seconds.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
}

pub fn run(_args: DemoArgs) -> Result<(), String> {
    Err("the demo is being written".into())
}
