//! Bearer tokens from a file, scoped to namespaces, reloaded when the file
//! changes (a Kubernetes Secret mounted as a volume is updated in place).
//!
//! Format: one token per line, `TOKEN NAMESPACES`, where NAMESPACES is `*`
//! (every namespace, plus `/v1/stats` and `/v1/gc`) or a comma-separated list
//! of namespaces. Blank lines and lines starting with `#` are ignored.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::http::request::Parts;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::watched::WatchedFile;
use super::App;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    All,
    Namespaces(BTreeSet<String>),
}

impl Scope {
    pub fn allows(&self, ns: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Namespaces(set) => set.contains(ns),
        }
    }
}

struct TokenEntry {
    digest: [u8; 32],
    scope: Scope,
}

/// Who made a request: the digest of their token (restore reports are
/// scoped to it) and what they may see.
#[derive(Clone, Debug)]
pub struct Principal {
    pub owner: String,
    pub scope: Scope,
}

impl Principal {
    pub fn check_ns(&self, ns: &str) -> Result<(), ApiError> {
        if self.scope.allows(ns) {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!(
                "this token may not access namespace {ns}"
            )))
        }
    }

    pub fn check_all(&self, what: &str) -> Result<(), ApiError> {
        if self.scope == Scope::All {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!(
                "{what} needs a token for all namespaces (`*`)"
            )))
        }
    }
}

pub struct Auth {
    file: Option<WatchedFile>,
    tokens: RwLock<Vec<TokenEntry>>,
    /// Signs URLs when auth is disabled (random per process).
    anon_key: [u8; 32],
}

/// HMAC-SHA256 (RFC 2104).
pub fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(msg);
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// A public id for a token's signing key: lets a signed URL name the token
/// that signed it without revealing anything about the token.
fn key_id(key: &[u8; 32]) -> String {
    hex::encode(&hmac_sha256(key, b"revault signed-url key id")[..8])
}

/// A namespace name: the first half of a series name (a DNS label).
pub fn is_namespace(ns: &str) -> bool {
    revault_engine::check_series_name(&format!("{ns}/x")).is_ok()
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

pub fn parse_token_file(text: &str) -> Result<Vec<(String, Scope)>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let token = words.next().unwrap_or_default();
        let Some(ns) = words.next() else {
            bail!(
                "line {}: expected `TOKEN NAMESPACES` (NAMESPACES is `*` or a comma-separated list)",
                i + 1
            );
        };
        if words.next().is_some() {
            bail!("line {}: unexpected text after the namespaces", i + 1);
        }
        if token.len() < 8 {
            bail!("line {}: tokens must be at least 8 characters", i + 1);
        }
        let scope = if ns == "*" {
            Scope::All
        } else {
            let mut set = BTreeSet::new();
            for n in ns.split(',') {
                if !is_namespace(n) {
                    bail!("line {}: {n:?} is not a namespace name", i + 1);
                }
                set.insert(n.to_string());
            }
            Scope::Namespaces(set)
        };
        out.push((token.to_string(), scope));
    }
    Ok(out)
}

impl Auth {
    /// Loads the token file; without one, auth is disabled.
    pub fn load(file: Option<PathBuf>) -> Result<Auth> {
        let auth = Auth {
            file: file.map(WatchedFile::new),
            tokens: RwLock::new(Vec::new()),
            anon_key: rand::random(),
        };
        if let Some(w) = &auth.file {
            w.changed();
            let f = w.path();
            let n = auth.reload_from(f)?;
            tracing::info!(file = %f.display(), tokens = n, "loaded bearer tokens");
        } else {
            tracing::warn!("no --token-file: authentication is disabled, every request may access every namespace");
        }
        Ok(auth)
    }

    pub fn enabled(&self) -> bool {
        self.file.is_some()
    }

    pub fn count(&self) -> usize {
        self.tokens.read().unwrap().len()
    }

    fn reload_from(&self, f: &Path) -> Result<usize> {
        let text = std::fs::read_to_string(f)
            .with_context(|| format!("cannot read token file {}", f.display()))?;
        let parsed =
            parse_token_file(&text).with_context(|| format!("token file {}", f.display()))?;
        let entries: Vec<TokenEntry> = parsed
            .into_iter()
            .map(|(t, scope)| TokenEntry {
                digest: digest(t.as_bytes()),
                scope,
            })
            .collect();
        let n = entries.len();
        *self.tokens.write().unwrap() = entries;
        Ok(n)
    }

    /// Reloads the file if it changed since the last look. A file that does
    /// not parse keeps the tokens in force (and logs why).
    pub fn poll(&self) -> bool {
        let Some(w) = self.file.as_ref().filter(|w| w.changed()) else {
            return false;
        };
        let f = w.path();
        match self.reload_from(f) {
            Ok(n) => {
                tracing::info!(file = %f.display(), tokens = n, "token file changed: reloaded");
                true
            }
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "token file changed but does not parse; keeping the tokens in force");
                false
            }
        }
    }

    /// Checks a presented token against every known one in constant time.
    pub fn authenticate(&self, presented: Option<&str>) -> Result<Principal, ApiError> {
        if !self.enabled() {
            return Ok(Principal {
                owner: "anonymous".into(),
                scope: Scope::All,
            });
        }
        let Some(tok) = presented else {
            return Err(ApiError::unauthorized(
                "missing bearer token (Authorization: Bearer TOKEN)",
            ));
        };
        let d = digest(tok.as_bytes());
        let tokens = self.tokens.read().unwrap();
        let mut found: Option<&Scope> = None;
        for t in tokens.iter() {
            // No early exit: every entry is compared.
            if bool::from(t.digest.ct_eq(&d)) {
                found = Some(&t.scope);
            }
        }
        match found {
            Some(scope) => Ok(Principal {
                owner: hex::encode(&d[..16]),
                scope: scope.clone(),
            }),
            None => Err(ApiError::unauthorized("invalid bearer token")),
        }
    }
}

impl Auth {
    /// Signs `msg` with the key of the token that `p` authenticated with:
    /// (key id, signature). URLs signed by a token stop working when the token
    /// is removed from the token file.
    pub fn sign(&self, p: &Principal, msg: &[u8]) -> Result<(String, String), ApiError> {
        let key = if self.enabled() {
            let tokens = self.tokens.read().unwrap();
            let Some(t) = tokens
                .iter()
                .find(|t| hex::encode(&t.digest[..16]) == p.owner)
            else {
                return Err(ApiError::unauthorized("the token was revoked"));
            };
            t.digest
        } else {
            self.anon_key
        };
        Ok((key_id(&key), hex::encode(hmac_sha256(&key, msg))))
    }

    /// Checks a signature made by [`Auth::sign`]; returns the signing token's scope.
    pub fn verify(&self, id: &str, msg: &[u8], sig: &str) -> Option<Scope> {
        let sig = hex::decode(sig).ok()?;
        let check = |key: &[u8; 32]| {
            key_id(key) == id && bool::from(hmac_sha256(key, msg).as_slice().ct_eq(&sig))
        };
        if !self.enabled() {
            return check(&self.anon_key).then_some(Scope::All);
        }
        let tokens = self.tokens.read().unwrap();
        tokens
            .iter()
            .find(|t| check(&t.digest))
            .map(|t| t.scope.clone())
    }
}

/// Polls the token file (and the quota file) every `every` until the process stops.
pub fn spawn_reloader(app: Arc<App>, every: Duration) {
    if !app.auth.enabled() && !app.quotas.enabled() {
        return;
    }
    tokio::spawn(async move {
        let mut t = tokio::time::interval(every);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            t.tick().await;
            let a = app.clone();
            let _ = tokio::task::spawn_blocking(move || {
                if a.auth.poll() {
                    a.metrics.tokens.set(a.auth.count() as i64);
                }
                a.quotas.poll();
            })
            .await;
        }
    });
}

impl FromRequestParts<Arc<App>> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .map(|v| v.to_str().unwrap_or(""));
        let token = match header {
            None => None,
            Some(h) => {
                let (scheme, rest) = h.trim().split_once(' ').unwrap_or((h, ""));
                if !scheme.eq_ignore_ascii_case("bearer") || rest.trim().is_empty() {
                    if app.auth.enabled() {
                        return Err(ApiError::unauthorized(
                            "the Authorization header must be `Bearer TOKEN`",
                        ));
                    }
                    None
                } else {
                    Some(rest.trim())
                }
            }
        };
        app.auth.authenticate(token)
    }
}

/// For routes open to everyone that show more to a token (`/metrics`): no
/// `Authorization` header is `None` when auth is enabled; a header present
/// must hold a valid token.
impl OptionalFromRequestParts<Arc<App>> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        app: &Arc<App>,
    ) -> Result<Option<Self>, ApiError> {
        let given = parts
            .headers
            .contains_key(axum::http::header::AUTHORIZATION);
        if app.auth.enabled() && !given {
            return Ok(None);
        }
        <Principal as FromRequestParts<Arc<App>>>::from_request_parts(parts, app)
            .await
            .map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_file_format() {
        let t =
            parse_token_file("# comment\n\nadmin-token-123 *\n  team-a-token-1 team-a,team-c \n")
                .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0], ("admin-token-123".to_string(), Scope::All));
        match &t[1].1 {
            Scope::Namespaces(s) => {
                assert!(s.contains("team-a") && s.contains("team-c") && s.len() == 2)
            }
            other => panic!("{other:?}"),
        }
        for bad in [
            "lonely-token-without-scope",
            "short a",
            "tok-12345678 Team_A",
            "tok-12345678 a b",
        ] {
            assert!(parse_token_file(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // RFC 4231 test case 2.
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block.
        let mac = hmac_sha256(
            &[0xaa; 131],
            b"Test Using Larger Than Block-Size Key - Hash Key First",
        );
        assert_eq!(
            hex::encode(mac),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn signatures_belong_to_their_token() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("tokens");
        std::fs::write(&f, "token-a-123456 team-a\ntoken-b-123456 team-b\n").unwrap();
        let a = Auth::load(Some(f.clone())).unwrap();
        let pa = a.authenticate(Some("token-a-123456")).unwrap();
        let (id, sig) = a.sign(&pa, b"message").unwrap();
        let scope = a.verify(&id, b"message", &sig).unwrap();
        assert!(scope.allows("team-a") && !scope.allows("team-b"));
        assert!(a.verify(&id, b"other message", &sig).is_none());
        assert!(a.verify("0000000000000000", b"message", &sig).is_none());
        assert!(a.verify(&id, b"message", "zz").is_none());
        // Revoking the token revokes what it signed.
        std::fs::write(&f, "token-b-123456 team-b\n").unwrap();
        assert!(a.poll());
        assert!(a.verify(&id, b"message", &sig).is_none());
    }

    #[test]
    fn authentication_and_reload() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("tokens");
        std::fs::write(&f, "first-token-1 team-a\n").unwrap();
        let a = Auth::load(Some(f.clone())).unwrap();
        assert!(a.authenticate(None).is_err());
        assert!(a.authenticate(Some("nope-nope-nope")).is_err());
        let p = a.authenticate(Some("first-token-1")).unwrap();
        assert!(p.scope.allows("team-a") && !p.scope.allows("team-b"));
        assert!(!a.poll(), "unchanged file is not reloaded");
        std::fs::write(&f, "second-token-22 *\n").unwrap();
        // Different length, so the change is seen even within one mtime tick.
        assert!(a.poll());
        assert!(a.authenticate(Some("first-token-1")).is_err());
        assert_eq!(
            a.authenticate(Some("second-token-22")).unwrap().scope,
            Scope::All
        );
        std::fs::write(&f, "broken\n").unwrap();
        assert!(!a.poll());
        assert!(a.authenticate(Some("second-token-22")).is_ok());
    }
}
