//! Per-namespace quotas (`--quota-file`): a namespace whose series already store its quota
//! takes no new backup until versions expire or the quota is raised.
//!
//! Format: one namespace per line, `NAMESPACE BYTES` (a plain byte count). Blank lines and
//! lines starting with `#` are ignored; a namespace not listed has no quota. The file is
//! re-read when it changes, like the token file; one that does not parse keeps the quotas in
//! force.
//!
//! What a namespace is charged is the logical size of everything its series hold: the sum
//! of `logicalBytes` over every version still stored, backups and objects alike. Dedup and
//! compression only make the bytes on disk fewer, so this bounds what a namespace's versions
//! can keep on the worker, and nothing a tenant does lowers it but expiring versions (which is
//! then what frees their data). It is computed from the version records at each check, so
//! nothing extra is kept that a crash could leave wrong. The check runs when a backup or an
//! object upload is admitted and again once a queued backup gets its slot, before its body is
//! read: an upload that starts under the quota may end over it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use anyhow::{Context, Result};
use revault_engine::Store;

use super::auth::is_namespace;
use super::watched::WatchedFile;

/// The quotas in force, and where they come from.
pub struct Quotas {
    file: Option<WatchedFile>,
    limits: RwLock<HashMap<String, u64>>,
}

/// The quotas of a quota file, and what is wrong with each line that does not parse.
pub fn parse_quota_file(text: &str) -> (HashMap<String, u64>, Vec<String>) {
    let mut out = HashMap::new();
    let mut bad = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match parse_line(line) {
            Ok((ns, bytes)) => {
                if out.insert(ns.to_string(), bytes).is_some() {
                    bad.push(format!("line {}: namespace {ns} appears twice", i + 1));
                }
            }
            Err(why) => bad.push(format!("line {}: {why}", i + 1)),
        }
    }
    (out, bad)
}

fn parse_line(line: &str) -> Result<(&str, u64), String> {
    let mut f = line.split_whitespace();
    let (Some(ns), Some(bytes), None) = (f.next(), f.next(), f.next()) else {
        return Err("expected `NAMESPACE BYTES`".into());
    };
    if !is_namespace(ns) {
        return Err(format!("{ns:?} is not a namespace name"));
    }
    let bytes = bytes
        .parse::<u64>()
        .map_err(|_| format!("{bytes:?} is not a byte count"))?;
    Ok((ns, bytes))
}

impl Quotas {
    /// Loads the quota file; without one, no namespace has a quota. Nothing in it stops the
    /// server (a worker that cannot start backs nothing up): lines that do not parse are
    /// logged and left out, and a file that does not exist yet (a Secret key the operator adds
    /// after the pod started) or cannot be read applies once it appears or changes.
    pub fn load(file: Option<PathBuf>) -> Quotas {
        let q = Quotas {
            file: file.map(WatchedFile::new),
            limits: RwLock::new(HashMap::new()),
        };
        let Some(w) = &q.file else { return q };
        let f = w.path();
        if !w.changed() {
            tracing::warn!(file = %f.display(), "the quota file does not exist (yet): no namespace has a quota until it does");
            return q;
        }
        match read_quota_file(f) {
            Ok((limits, bad)) => {
                for why in &bad {
                    tracing::error!(file = %f.display(), "quota file {why}: that line is left out");
                }
                tracing::info!(file = %f.display(), namespaces = limits.len(), "loaded namespace quotas");
                *q.limits.write().unwrap() = limits;
            }
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "no namespace has a quota until the quota file changes")
            }
        }
        q
    }

    pub fn enabled(&self) -> bool {
        self.file.is_some()
    }

    /// Reloads the file if it changed since the last look; keeps the quotas in force when a
    /// line does not parse (and logs why): a typo must not lift a namespace's quota.
    pub fn poll(&self) {
        let Some(w) = self.file.as_ref().filter(|w| w.changed()) else {
            return;
        };
        let f = w.path();
        match read_quota_file(f) {
            Ok((limits, bad)) if bad.is_empty() => {
                tracing::info!(file = %f.display(), namespaces = limits.len(), "quota file changed: reloaded");
                *self.limits.write().unwrap() = limits;
            }
            Ok((_, bad)) => {
                tracing::error!(file = %f.display(), errors = %bad.join("; "), "quota file changed but does not parse; keeping the quotas in force")
            }
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "quota file changed but cannot be read; keeping the quotas in force")
            }
        }
    }

    /// The quota of namespace `ns`, if it has one.
    pub fn limit(&self, ns: &str) -> Option<u64> {
        self.limits.read().unwrap().get(ns).copied()
    }
}

fn read_quota_file(f: &Path) -> Result<(HashMap<String, u64>, Vec<String>)> {
    let text = std::fs::read_to_string(f)
        .with_context(|| format!("cannot read quota file {}", f.display()))?;
    Ok(parse_quota_file(&text))
}

/// What namespace `ns` is charged: `logicalBytes` summed over every version of its series
/// (object buckets included).
pub fn usage(store: &Store, ns: &str) -> revault_engine::Result<u64> {
    let mut total = 0u64;
    for s in store.series_in_namespace(ns)? {
        total = store
            .versions(&s)?
            .iter()
            .fold(total, |t, v| t.saturating_add(v.logical_bytes));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quota_file_names_namespaces_and_byte_counts() {
        let (q, bad) = parse_quota_file("# team quotas\n\nteam-a 1073741824\n  team-b   5 \n");
        assert_eq!(q.get("team-a"), Some(&(1 << 30)));
        assert_eq!(q.get("team-b"), Some(&5));
        assert!(bad.is_empty(), "{bad:?}");
        for (bad, why) in [
            ("team-a", "line 1: expected `NAMESPACE BYTES`"),
            ("team-a 1 2", "line 1: expected"),
            ("Team_A 10", "not a namespace name"),
            ("team-a 10Gi", "\"10Gi\" is not a byte count"),
            ("team-a -1", "is not a byte count"),
            (
                "team-a 1\nteam-a 2",
                "line 2: namespace team-a appears twice",
            ),
        ] {
            let e = parse_quota_file(bad).1.join("; ");
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }
}
