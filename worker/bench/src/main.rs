//! `revault-bench`: the measurements behind docs/benchmarks.md and
//! docs/performance.md, and the synthetic series they (and `make demo`) run on.
//! A tool for developers and for users sizing a store on their own data; the
//! worker image ships only `revault`.
//!
//! - `schemes`: every (dedup unit × rewrite policy) on a series, every version
//!   restored with every cache, knob sweeps and cache memory (src/schemes.rs);
//! - `expire`: the cost of expiring the oldest version as the store grows
//!   (src/expire.rs);
//! - `gen-series`: a deterministic synthetic series (src/gen.rs);
//! - `index`: the sampled fingerprint index as the store grows (src/index.rs).

// The same allocator, with the same settings, as the `revault` binary: the
// figures depend on it. One file, so the two cannot drift apart; the bench
// does not use the server's `release_free`.
#[allow(dead_code)]
#[path = "../../revault/src/alloc.rs"]
mod alloc;
mod expire;
mod gen;
mod gen_series;
mod harness;
mod index;
mod plot;
mod plot_index;
mod report;
mod schemes;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "revault-bench",
    version,
    about = "Revault's benchmarks and synthetic backup series",
    long_about = None
)]
struct Top {
    /// Print results as JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Every dedup unit x rewrite policy x restore cache on a series.
    Schemes(schemes::SchemesArgs),
    /// Expiry cost as the store grows, beside a full mark-and-sweep.
    Expire(expire::ExpireArgs),
    /// Write a synthetic backup series (one tar or directory per version).
    GenSeries(gen_series::GenArgs),
    /// The sampled fingerprint index as a store grows to many TiB, without the bytes.
    Index(index::IndexArgs),
}

fn main() {
    alloc::configure();
    let top = Top::parse();
    // Reports printed into a closed pipe end the tool quietly, as for
    // `revault`'s offline commands.
    // SAFETY: called before any thread is started; SIG_DFL is a valid handler.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("REVAULT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let json = top.json;
    let r = match top.cmd {
        Cmd::Schemes(a) => schemes::schemes(a, json),
        Cmd::Expire(a) => expire::expire_bench(a, json),
        Cmd::GenSeries(a) => gen_series::gen_series(a, json),
        Cmd::Index(a) => index::index(a, json),
    };
    exit_on_error(r, json);
}

/// Prints the error (as JSON too with `--json`, in `revault`'s shape) and
/// exits with status 1.
fn exit_on_error(r: anyhow::Result<()>, json: bool) {
    if let Err(e) = r {
        let (code, msg) = match e.downcast_ref::<revault_engine::Error>() {
            Some(err) => (err.code().to_string(), err.to_string()),
            None => ("error".to_string(), format!("{e:#}")),
        };
        if json {
            print_json(&serde_json::json!({ "error": { "code": code, "message": msg } }));
        }
        eprintln!("error: {msg}");
        std::process::exit(1);
    }
}

fn print_json<T: serde::Serialize>(v: &T) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).expect("reports serialise")
    );
}
