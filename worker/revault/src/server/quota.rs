//! Per-namespace quotas (`--quota-file`): a namespace whose series already store its quota
//! takes no new backup until versions expire or the quota is raised.
//!
//! Format: one namespace per line, `NAMESPACE BYTES` (a plain byte count). Blank lines and
//! lines starting with `#` are ignored; a namespace not listed has no quota. The file is
//! re-read when it changes, like the token file; one that does not parse keeps the quotas in
//! force.
//!
//! What a namespace is charged is what its versions' listings show: the sum of `storedBytes`
//! (container bytes each version wrote when it was backed up) over every version its series
//! still hold. It is known to the tenant, does not depend on other namespaces' data beyond
//! what `newBytes` already says, and is computed from the version records alone, so nothing
//! extra is kept that a crash could leave wrong. The check runs when a backup is admitted,
//! before its body is read: a backup that starts under the quota may end over it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use anyhow::{bail, Context, Result};
use revault_engine::Store;

use super::auth::{is_namespace, stamp, Stamp};

/// The quotas in force, and where they come from.
pub struct Quotas {
    file: Option<PathBuf>,
    limits: RwLock<HashMap<String, u64>>,
    stamp: RwLock<Option<Stamp>>,
}

pub fn parse_quota_file(text: &str) -> Result<HashMap<String, u64>> {
    let mut out = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let n = i + 1;
        let mut f = line.split_whitespace();
        let (Some(ns), Some(bytes), None) = (f.next(), f.next(), f.next()) else {
            bail!("line {n}: expected `NAMESPACE BYTES`");
        };
        if !is_namespace(ns) {
            bail!("line {n}: {ns:?} is not a namespace name");
        }
        let Ok(bytes) = bytes.parse::<u64>() else {
            bail!("line {n}: {bytes:?} is not a byte count");
        };
        if out.insert(ns.to_string(), bytes).is_some() {
            bail!("line {n}: namespace {ns} appears twice");
        }
    }
    Ok(out)
}

impl Quotas {
    /// Loads the quota file; without one, no namespace has a quota. A file that does not
    /// parse is an error at start. One that does not exist yet is not (a Secret key the
    /// operator adds after the pod started): no quotas until it appears, loudly.
    pub fn load(file: Option<PathBuf>) -> Result<Quotas> {
        let q = Quotas {
            file,
            limits: RwLock::new(HashMap::new()),
            stamp: RwLock::new(None),
        };
        if let Some(f) = &q.file {
            let st = stamp(f);
            if st.is_none() && !f.exists() {
                tracing::warn!(file = %f.display(), "the quota file does not exist (yet): no namespace has a quota until it does");
                return Ok(q);
            }
            let n = q.reload_from(f)?;
            *q.stamp.write().unwrap() = st;
            tracing::info!(file = %f.display(), namespaces = n, "loaded namespace quotas");
        }
        Ok(q)
    }

    pub fn enabled(&self) -> bool {
        self.file.is_some()
    }

    fn reload_from(&self, f: &Path) -> Result<usize> {
        let text = std::fs::read_to_string(f)
            .with_context(|| format!("cannot read quota file {}", f.display()))?;
        let parsed =
            parse_quota_file(&text).with_context(|| format!("quota file {}", f.display()))?;
        let n = parsed.len();
        *self.limits.write().unwrap() = parsed;
        Ok(n)
    }

    /// Reloads the file if it changed since the last look; keeps the quotas in force when it
    /// does not parse (and logs why).
    pub fn poll(&self) {
        let Some(f) = &self.file else { return };
        let st = stamp(f);
        if st.is_none() || *self.stamp.read().unwrap() == st {
            return;
        }
        *self.stamp.write().unwrap() = st;
        match self.reload_from(f) {
            Ok(n) => {
                tracing::info!(file = %f.display(), namespaces = n, "quota file changed: reloaded")
            }
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "quota file changed but does not parse; keeping the quotas in force")
            }
        }
    }

    /// The quota of namespace `ns`, if it has one.
    pub fn limit(&self, ns: &str) -> Option<u64> {
        self.limits.read().unwrap().get(ns).copied()
    }
}

/// What namespace `ns` is charged: `storedBytes` summed over every version of its series.
pub fn usage(store: &Store, ns: &str) -> revault_engine::Result<u64> {
    let prefix = format!("{ns}/");
    let mut total = 0u64;
    for s in store.list_series()? {
        if s.name.starts_with(&prefix) {
            total = store
                .versions(&s)?
                .iter()
                .fold(total, |t, v| t.saturating_add(v.new_container_bytes));
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quota_file_names_namespaces_and_byte_counts() {
        let q = parse_quota_file("# team quotas\n\nteam-a 1073741824\n  team-b   5 \n").unwrap();
        assert_eq!(q.get("team-a"), Some(&(1 << 30)));
        assert_eq!(q.get("team-b"), Some(&5));
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
            let e = format!("{:#}", parse_quota_file(bad).unwrap_err());
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }
}
