//! Printing results: aligned tables for people, JSON for programs.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

pub const MIB: f64 = 1024.0 * 1024.0;

pub fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / MIB)
}

pub fn ratio(a: u64, b: u64) -> String {
    if b == 0 {
        "-".into()
    } else {
        format!("{:.2}x", a as f64 / b as f64)
    }
}

pub fn rate(bytes: u64, secs: f64) -> String {
    if secs <= 0.0 {
        "-".into()
    } else {
        format!("{:.0}", bytes as f64 / MIB / secs)
    }
}

pub fn json<T: Serialize>(v: &T) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).expect("reports serialise")
    );
}

/// A simple left/right-aligned text table.
pub struct Table {
    head: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(head: &[&str]) -> Self {
        Table {
            head: head.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let n = self.head.len();
        let mut w: Vec<usize> = self.head.iter().map(|h| h.len()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(n) {
                w[i] = w[i].max(c.len());
            }
        }
        let mut out = String::new();
        let line = |cells: &[String], out: &mut String| {
            for (i, c) in cells.iter().enumerate().take(n) {
                if i == 0 {
                    out.push_str(&format!("{c:<width$}", width = w[i]));
                } else {
                    out.push_str(&format!("  {c:>width$}", width = w[i]));
                }
            }
            out.push('\n');
        };
        line(&self.head, &mut out);
        for r in &self.rows {
            line(r, &mut out);
        }
        out
    }
}

/// A byte progress bar on stderr, shown only on a terminal.
pub fn progress(total: Option<u64>, quiet: bool, msg: &str) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::with_draw_target(total, ProgressDrawTarget::hidden());
    }
    let pb = match total {
        Some(t) => ProgressBar::new(t).with_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{msg} {spinner} {bytes} {binary_bytes_per_sec}")
                .expect("valid template"),
        ),
    };
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    pb
}

/// A restore's output named like a tar file (`x.tar`, `x.tar.gz`): a directory version asked
/// for there is written as a tar archive, elsewhere it is extracted.
pub fn named_like_tar(output: &str) -> bool {
    let name = output.rsplit('/').next().unwrap_or(output);
    name.ends_with(".tar") || name.contains(".tar.")
}
