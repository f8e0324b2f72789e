//! `revault-bench gen-series`: a synthetic series on disk (src/gen.rs), for
//! `make demo`, the benchmarks and anyone's own experiments.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

use revault_engine::MIB;

use crate::gen::{generate, GenFormat, GenOptions};
use crate::print_json;

#[derive(Args)]
pub struct GenArgs {
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, default_value_t = 10)]
    pub versions: u32,
    /// Size of the first version, MiB.
    #[arg(long, default_value_t = 40.0)]
    pub initial_mib: f64,
    /// Percent of files modified per version.
    #[arg(long, default_value_t = 2.0)]
    pub alpha: f64,
    /// Percent of a modified file that changes.
    #[arg(long, default_value_t = 10.0)]
    pub beta: f64,
    /// New data per version, MiB.
    #[arg(long, default_value_t = 1.0)]
    pub gamma_mib: f64,
    /// Percent of files that are incompressible binary data.
    #[arg(long, default_value_t = 3.0)]
    pub binary: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// `tar` (one tar per version) or `dir` (one directory per version).
    #[arg(long, default_value = "tar")]
    pub format: String,
}

pub fn gen_series(a: GenArgs, json: bool) -> Result<()> {
    let format = match a.format.as_str() {
        "tar" => GenFormat::Tar,
        "dir" => GenFormat::Dir,
        f => bail!("--format {f:?}: expected `tar` or `dir`"),
    };
    let opts = GenOptions {
        versions: a.versions,
        initial_mib: a.initial_mib,
        alpha_pct: a.alpha,
        beta_pct: a.beta,
        gamma_mib: a.gamma_mib,
        binary_pct: a.binary,
        seed: a.seed,
        format,
    };
    let vs = generate(&a.out, &opts, |v| {
        if !json {
            eprintln!(
                "  {} ({} files, {:.1} MiB)",
                v.path.display(),
                v.files,
                v.bytes as f64 / MIB as f64
            );
        }
    })?;
    if json {
        print_json(&vs);
    }
    Ok(())
}
