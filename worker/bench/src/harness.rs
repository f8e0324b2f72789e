//! What both benchmarks share: a series read from a directory, fresh stores,
//! progress bars and CSV output.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use revault_engine::{
    set_retention, InitOptions, OpenMode, Retention, Source, Store, StoreConfig, StreamSource,
    TreeSource, MIB,
};

/// The series every benchmark backs up into its stores.
pub const SERIES: &str = "bench/s";

/// The versions of a series: the entries of `dir` in name order (hidden ones
/// skipped), the first `limit` of them.
pub fn inputs(dir: &Path, limit: Option<usize>) -> Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    v.sort();
    if let Some(n) = limit {
        v.truncate(n);
    }
    if v.len() < 2 {
        bail!(
            "{} holds {} versions; a series needs at least two",
            dir.display(),
            v.len()
        );
    }
    Ok(v)
}

pub fn source(p: &Path) -> Result<Box<dyn Source>> {
    if p.is_dir() {
        Ok(Box::new(TreeSource::new(p)?))
    } else {
        let f = std::fs::File::open(p).with_context(|| format!("reading {}", p.display()))?;
        Ok(Box::new(StreamSource::new(p.display().to_string(), f)))
    }
}

/// Reverse dedup as the product runs it (one version in the live window, automatic slides;
/// a new series' default), or none at all: the schemes that compare inline dedup alone.
pub fn reverse_dedup(store: &Store, on: bool) -> Result<()> {
    set_retention(
        store,
        SERIES,
        Retention {
            live: 1,
            auto: on,
            ..Default::default()
        },
    )?;
    Ok(())
}

pub fn fresh_store(dir: &Path, container_mib: u64) -> Result<Store> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    let config = StoreConfig {
        container_bytes: container_mib * MIB,
        ..Default::default()
    };
    Store::init(
        dir,
        &InitOptions {
            config,
            data_dir: None,
        },
    )?;
    Ok(Store::open(dir, OpenMode::ReadWrite, "revault-bench")?)
}

pub fn mib_s(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 / MIB as f64 / secs
    } else {
        0.0
    }
}

pub fn progress(total: u64, json: bool) -> ProgressBar {
    let pb = if json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total)
    };
    pb.set_style(
        ProgressStyle::with_template("{msg:30} [{bar:30}] {pos}/{len} {elapsed_precise} ETA {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb
}

pub fn write_csv<T: Serialize>(path: &Path, rows: &[T]) -> Result<()> {
    let mut out = String::new();
    for (i, r) in rows.iter().enumerate() {
        let v = serde_json::to_value(r)?;
        let obj = v.as_object().expect("rows are structs");
        if i == 0 {
            out.push_str(&obj.keys().cloned().collect::<Vec<_>>().join(","));
            out.push('\n');
        }
        let cells: Vec<String> = obj
            .values()
            .map(|x| match x {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n
                    .as_f64()
                    .map(|f| {
                        if f.fract() == 0.0 {
                            format!("{f:.0}")
                        } else {
                            format!("{f:.4}")
                        }
                    })
                    .unwrap_or_default(),
                other => other.to_string(),
            })
            .collect();
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
