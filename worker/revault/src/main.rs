//! `revault`: the offline CLI on a local store, the worker server, and the
//! clients backup and restore jobs run.

mod cli;
mod output;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "revault", version, about = "Revault: a deduplicating backup store", long_about = None)]
pub struct Cli {
    /// Print results as JSON.
    #[arg(long, global = true)]
    pub json: bool,
    /// No progress bars.
    #[arg(long, short, global = true)]
    pub quiet: bool,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Create a store in a directory.
    Init(cli::InitArgs),
    /// Back up a file, a directory or stdin as the next version of a series.
    Backup(cli::BackupArgs),
    /// Restore a version to a file, a directory or stdout.
    Restore(cli::RestoreArgs),
    /// List series, or the versions of one series.
    List(cli::ListArgs),
    /// Store totals: logical and stored bytes, dedup and compression ratios.
    Stats(cli::StoreArg),
    /// Verify every checksum and that every recipe resolves.
    Check(cli::StoreArg),
    /// Set a series' retention: versions kept, the live window, automatic slides.
    #[command(subcommand)]
    Retention(cli::RetentionCmd),
    /// Reverse-deduplicate versions that left the live window.
    Slide(cli::SeriesArgs),
    /// Delete versions: one, all before a time, or what retention no longer keeps.
    Expire(cli::ExpireArgs),
    /// Grouped mark-and-sweep: orphans, dead chunks in shared units, compaction.
    Gc(cli::GcArgs),
    /// Write a synthetic backup series (one tar or directory per version).
    GenSeries(cli::GenArgs),
}

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("REVAULT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let json = cli.json;
    if let Err(e) = cli::run(cli) {
        let (code, msg) = match e.downcast_ref::<revault_engine::Error>() {
            Some(err) => (err.code(), err.to_string()),
            None => ("error", format!("{e:#}")),
        };
        if json {
            output::json(&serde_json::json!({ "error": { "code": code, "message": msg } }));
        }
        eprintln!("error: {msg}");
        std::process::exit(1);
    }
}
