//! `revault`: the offline CLI on a local store, the worker server, and the
//! clients backup and restore jobs run.

mod alloc;
mod cli;
mod client;
mod output;
mod remote_cli;
mod restore_out;
mod retention_cli;
mod server;

use clap::{Parser, Subcommand};

/// The command line: the offline commands plus the service and its clients.
#[derive(Parser)]
#[command(name = "revault", version, about = "Revault: a deduplicating backup store", long_about = None)]
struct Top {
    /// Print results as JSON.
    #[arg(long, global = true)]
    json: bool,
    /// No progress bars.
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    cmd: TopCmd,
}

#[derive(Subcommand)]
enum TopCmd {
    #[command(flatten)]
    Offline(Cmd),
    /// Run the worker: the HTTP API over a local store (see docs/service.md).
    Serve(Box<server::ServeArgs>),
    /// Back up a file, a directory or stdin to a worker (`revault serve`).
    Push(client::push::PushArgs),
    /// Restore a version from a worker to a file, a directory or stdout.
    Pull(client::pull::PullArgs),
    /// Move a series, every version with its number, from one worker to another (copied,
    /// checked byte for byte, then deleted from the source).
    Move(client::mover::MoveArgs),
}

pub struct Cli {
    pub json: bool,
    pub quiet: bool,
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
    Stats(cli::StatsArgs),
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
    /// Rebuild a store from its remote (an S3 bucket) alone.
    Recover(remote_cli::RecoverArgs),
    /// The store's remote: status, sync, evicting containers to it.
    #[command(subcommand)]
    Remote(remote_cli::RemoteCmd),
}

fn main() {
    alloc::configure();
    let top = Top::parse();
    let (json, quiet) = (top.json, top.quiet);
    let cli = match top.cmd {
        TopCmd::Offline(cmd) => Cli { json, quiet, cmd },
        TopCmd::Serve(a) => {
            server::init_logging(a.log_format);
            exit_on_error(server::run(*a), false);
            return;
        }
        TopCmd::Push(a) => {
            init_cli_logging();
            exit_on_error(client::push::push(a, json, quiet || json), json);
            return;
        }
        TopCmd::Pull(a) => {
            init_cli_logging();
            exit_on_error(client::pull::pull(a, json, quiet || json), json);
            return;
        }
        TopCmd::Move(a) => {
            init_cli_logging();
            exit_on_error(client::mover::move_series(a, json, quiet || json), json);
            return;
        }
    };
    // Offline commands end quietly when the pipe they print into closes
    // (`revault list | head`), like other Unix tools, instead of panicking in
    // `println!`. Not for serve, push and pull: their sockets must never raise
    // SIGPIPE, and an interrupted local command is crash-safe by design.
    // SAFETY: called before any thread is started; SIG_DFL is a valid handler.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    init_cli_logging();
    exit_on_error(cli::run(cli), json);
}

fn init_cli_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("REVAULT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
}

fn exit_on_error(r: anyhow::Result<()>, json: bool) {
    if let Err(e) = r {
        // The code of the error underneath, the message with what the command was doing.
        let (code, msg) = if let Some(err) = e.downcast_ref::<revault_engine::Error>() {
            (err.code().to_string(), format!("{e:#}"))
        } else if let Some(err) = e.downcast_ref::<client::RemoteError>() {
            (err.code.clone(), err.message.clone())
        } else if let Some(err) = e.downcast_ref::<revault_remote::RemoteError>() {
            (err.code().to_string(), format!("{e:#}"))
        } else if let Some(err) = e.downcast_ref::<remote_cli::NotDurable>() {
            ("not_durable".to_string(), err.to_string())
        } else {
            ("error".to_string(), format!("{e:#}"))
        };
        if json {
            output::json(&serde_json::json!({ "error": { "code": code, "message": msg } }));
        }
        eprintln!("error: {msg}");
        // Committed locally, not (yet) in the remote: a status of its own for scripts.
        let status = if code == "not_durable" {
            remote_cli::NOT_DURABLE_EXIT
        } else {
            1
        };
        std::process::exit(status);
    }
}
