//! Synthetic backup series in the style of RevDedup §4.1: an initial file tree;
//! each following version modifies α% of the files by β% of their contents (in
//! a few clustered edits: overwrites, inserts, deletes) and adds γ MiB of new
//! files. Deterministic for a given seed. Each version is written as one tar
//! (sorted names, fixed owner and mtime) or as a directory.
//!
//! Files are a mix of text built from a pseudo-word vocabulary (compresses like
//! source code, ~3-4× with zstd) and random binary data (incompressible).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use revault_engine::{Error, IoContext, Result, MIB};

#[derive(Clone, Debug)]
pub struct GenOptions {
    pub versions: u32,
    /// Size of the first version.
    pub initial_mib: f64,
    /// Percentage of files modified per version.
    pub alpha_pct: f64,
    /// Percentage of a modified file's bytes that change.
    pub beta_pct: f64,
    /// New data added per version.
    pub gamma_mib: f64,
    /// Share of files that are random binary data (the rest is text).
    pub binary_pct: f64,
    pub seed: u64,
    pub format: GenFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GenFormat {
    Tar,
    Dir,
}

impl Default for GenOptions {
    fn default() -> Self {
        GenOptions {
            versions: 10,
            initial_mib: 40.0,
            alpha_pct: 2.0,
            beta_pct: 10.0,
            gamma_mib: 1.0,
            binary_pct: 3.0,
            seed: 1,
            format: GenFormat::Tar,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct GenVersion {
    pub version: u32,
    pub path: PathBuf,
    pub files: usize,
    pub bytes: u64,
}

struct Vocab {
    words: Vec<Vec<u8>>,
}

impl Vocab {
    fn new(rng: &mut ChaCha8Rng) -> Self {
        let words = (0..3000)
            .map(|_| {
                let n = rng.random_range(2..12);
                (0..n)
                    .map(|_| b"etaoinshrdlucmfwypvbgkqjxz_"[rng.random_range(0..27)])
                    .collect()
            })
            .collect();
        Vocab { words }
    }

    fn text(&self, rng: &mut ChaCha8Rng, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 16);
        let mut col = 0;
        while out.len() < len {
            // Zipf-like: small indices are much more common, like real tokens.
            let r: f64 = rng.random();
            let i = ((r * r * r) * self.words.len() as f64) as usize;
            let w = &self.words[i.min(self.words.len() - 1)];
            out.extend_from_slice(w);
            col += w.len() + 1;
            if col > 72 || rng.random_ratio(1, 14) {
                out.push(b'\n');
                let indent = rng.random_range(0..4) * 4;
                out.extend(std::iter::repeat_n(b' ', indent));
                col = indent;
            } else {
                out.push(if rng.random_ratio(1, 9) { b'(' } else { b' ' });
            }
        }
        out.truncate(len);
        out
    }
}

fn content(vocab: &Vocab, rng: &mut ChaCha8Rng, binary: bool, len: usize) -> Vec<u8> {
    if binary {
        let mut v = vec![0u8; len];
        rng.fill_bytes(&mut v);
        v
    } else {
        vocab.text(rng, len)
    }
}

/// Log-uniform size in [lo, hi].
fn size(rng: &mut ChaCha8Rng, lo: f64, hi: f64) -> usize {
    (lo.ln() + rng.random::<f64>() * (hi.ln() - lo.ln())).exp() as usize
}

struct Tree {
    files: BTreeMap<String, (bool, Vec<u8>)>,
    next_id: u64,
}

impl Tree {
    fn bytes(&self) -> u64 {
        self.files.values().map(|f| f.1.len() as u64).sum()
    }

    fn add_files(&mut self, vocab: &Vocab, rng: &mut ChaCha8Rng, mib: f64, binary_pct: f64) {
        let target = (mib * MIB as f64) as u64;
        let mut added = 0u64;
        while added < target {
            let binary = rng.random::<f64>() * 100.0 < binary_pct;
            let len = if binary {
                size(rng, 16e3, 2e6)
            } else {
                size(rng, 256.0, 64e3)
            };
            let len = len.min((target - added) as usize).max(1);
            let id = self.next_id;
            self.next_id += 1;
            let name = format!(
                "src/d{:02}/s{:02}/f{:06}.{}",
                rng.random_range(0..16),
                rng.random_range(0..8),
                id,
                if binary { "bin" } else { "txt" }
            );
            self.files
                .insert(name, (binary, content(vocab, rng, binary, len)));
            added += len as u64;
        }
    }

    fn modify(&mut self, vocab: &Vocab, rng: &mut ChaCha8Rng, alpha: f64, beta: f64) {
        let names: Vec<String> = self.files.keys().cloned().collect();
        let n = ((names.len() as f64 * alpha / 100.0).round() as usize).max(1);
        for _ in 0..n {
            let name = &names[rng.random_range(0..names.len())];
            let (binary, data) = self.files.get_mut(name).unwrap();
            let budget = ((data.len() as f64 * beta / 100.0) as usize).max(1);
            let edits = rng.random_range(1..=3);
            for _ in 0..edits {
                let len = (budget / edits).max(1);
                let at = rng.random_range(0..=data.len());
                let new = content(vocab, rng, *binary, len);
                match rng.random_range(0..3) {
                    0 => {
                        let end = (at + len).min(data.len());
                        data.splice(at..end, new);
                    }
                    1 => {
                        data.splice(at..at, new);
                    }
                    _ => {
                        let end = (at + len).min(data.len());
                        data.drain(at..end);
                    }
                }
            }
        }
    }
}

/// Writes the series into `dir` (`v001.tar`, ... or `v001/`, ...).
pub fn generate(
    dir: &Path,
    opts: &GenOptions,
    mut progress: impl FnMut(&GenVersion),
) -> Result<Vec<GenVersion>> {
    if opts.versions == 0 || opts.versions > 9999 {
        return Err(Error::Invalid("versions must be between 1 and 9999".into()));
    }
    for (name, v) in [
        ("alpha", opts.alpha_pct),
        ("beta", opts.beta_pct),
        ("binary", opts.binary_pct),
    ] {
        if !(0.0..=100.0).contains(&v) {
            return Err(Error::Invalid(format!(
                "{name} is a percentage (0..100), got {v}"
            )));
        }
    }
    if opts.initial_mib <= 0.0 || opts.gamma_mib < 0.0 {
        return Err(Error::Invalid("sizes must be positive".into()));
    }
    std::fs::create_dir_all(dir).ctx(|| format!("creating {}", dir.display()))?;
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let vocab = Vocab::new(&mut rng);
    let mut tree = Tree {
        files: BTreeMap::new(),
        next_id: 0,
    };
    tree.add_files(&vocab, &mut rng, opts.initial_mib, opts.binary_pct);
    let mut out = Vec::new();
    for v in 1..=opts.versions {
        if v > 1 {
            let mut vr = ChaCha8Rng::seed_from_u64(opts.seed ^ (u64::from(v) << 32));
            tree.modify(&vocab, &mut vr, opts.alpha_pct, opts.beta_pct);
            tree.add_files(&vocab, &mut vr, opts.gamma_mib, opts.binary_pct);
        }
        let path = match opts.format {
            GenFormat::Tar => {
                let p = dir.join(format!("v{v:03}.tar"));
                write_tar(&p, &tree)?;
                p
            }
            GenFormat::Dir => {
                let p = dir.join(format!("v{v:03}"));
                write_dir(&p, &tree)?;
                p
            }
        };
        let gv = GenVersion {
            version: v,
            path,
            files: tree.files.len(),
            bytes: tree.bytes(),
        };
        progress(&gv);
        out.push(gv);
    }
    Ok(out)
}

fn write_tar(path: &Path, tree: &Tree) -> Result<()> {
    let f = File::create(path).ctx(|| format!("creating {}", path.display()))?;
    let mut b = tar::Builder::new(BufWriter::with_capacity(1 << 20, f));
    for (name, (_, data)) in &tree.files {
        let mut h = tar::Header::new_ustar();
        h.set_path(name)
            .ctx(|| format!("adding {name} to {}", path.display()))?;
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        b.append(&h, &data[..])
            .ctx(|| format!("writing {}", path.display()))?;
    }
    let mut w = b
        .into_inner()
        .ctx(|| format!("writing {}", path.display()))?;
    w.flush().ctx(|| format!("writing {}", path.display()))
}

fn write_dir(root: &Path, tree: &Tree) -> Result<()> {
    if root.exists() {
        std::fs::remove_dir_all(root).ctx(|| format!("replacing {}", root.display()))?;
    }
    for (name, (_, data)) in &tree.files {
        let p = root.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).ctx(|| format!("creating {}", p.display()))?;
        std::fs::write(&p, data).ctx(|| format!("writing {}", p.display()))?;
        filetime::set_file_mtime(&p, filetime::FileTime::from_unix_time(1_700_000_000, 0))
            .ctx(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_series_and_versions_differ_a_little() {
        let opts = GenOptions {
            versions: 3,
            initial_mib: 2.0,
            gamma_mib: 0.1,
            ..Default::default()
        };
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let va = generate(a.path(), &opts, |_| {}).unwrap();
        let vb = generate(b.path(), &opts, |_| {}).unwrap();
        for (x, y) in va.iter().zip(&vb) {
            assert_eq!(
                std::fs::read(&x.path).unwrap(),
                std::fs::read(&y.path).unwrap()
            );
        }
        let v1 = std::fs::read(&va[0].path).unwrap();
        let v2 = std::fs::read(&va[1].path).unwrap();
        assert_ne!(v1, v2);
        assert!(va[1].bytes > va[0].bytes, "new files are added");
        assert!(va[0].bytes as f64 >= 2.0 * MIB as f64 * 0.99);
    }
}
