//! TLS: the server's certificate chain and key, read again when their files change.
//!
//! The operator rotates the workers' certificate by updating a Secret, which the kubelet swaps
//! into the pod's volume in place (one atomic symlink switch). The files are looked at again at
//! most once per `every`, during a handshake, and a new pair is served from then on without a
//! restart; connections already open keep the certificate they were made with. A pair that does
//! not load (a hand-written file caught half way, a key that does not match) is logged and the
//! previous certificate stays in force.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::watched::{stamp, Stamp};

/// The server's TLS settings: TLS 1.2 and 1.3 with the *ring* provider, HTTP/1.1 only, the
/// certificate from `files`.
pub fn server_config(files: Arc<CertFiles>) -> Result<rustls::ServerConfig> {
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_cert_resolver(files);
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate chain and key kept in two PEM files.
pub struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
    every: Duration,
    state: Mutex<Loaded>,
}

struct Loaded {
    key: Arc<CertifiedKey>,
    stamps: [Option<Stamp>; 2],
    checked: Instant,
}

impl fmt::Debug for CertFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertFiles")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl CertFiles {
    /// Reads the pair once; an error here stops the server from starting.
    pub fn load(cert: &Path, key: &Path, every: Duration) -> Result<Arc<CertFiles>> {
        let stamps = [stamp(cert), stamp(key)];
        let loaded = read_pair(cert, key)?;
        Ok(Arc::new(CertFiles {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            every,
            state: Mutex::new(Loaded {
                key: Arc::new(loaded),
                stamps,
                checked: Instant::now(),
            }),
        }))
    }

    /// The pair in force, read again first if the files changed since the last look (at most
    /// one look per `every`).
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.checked.elapsed() >= self.every {
            s.checked = Instant::now();
            let stamps = [stamp(&self.cert), stamp(&self.key)];
            if stamps != s.stamps {
                // Remembered even when the pair does not load, so a bad pair is reported once
                // per change rather than on every handshake.
                s.stamps = stamps;
                match read_pair(&self.cert, &self.key) {
                    Ok(k) => {
                        s.key = Arc::new(k);
                        tracing::info!(cert = %self.cert.display(), "TLS certificate changed: reloaded");
                    }
                    Err(e) => tracing::error!(
                        error = %format!("{e:#}"),
                        "TLS certificate files changed but do not load; serving the previous certificate"
                    ),
                }
            }
        }
        s.key.clone()
    }
}

impl ResolvesServerCert for CertFiles {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// Reads a PEM certificate chain and its PEM private key (PKCS#8, PKCS#1 or SEC1), and checks
/// that the key is the first certificate's.
fn read_pair(cert: &Path, key: &Path) -> Result<CertifiedKey> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("cannot read certificates from {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("{}: not a PEM certificate chain", cert.display()))?;
    if chain.is_empty() {
        bail!("{}: no certificate found", cert.display());
    }
    let der = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("cannot read a PEM private key from {}", key.display()))?;
    CertifiedKey::from_der(chain, der, &provider())
        .context("the TLS certificate and key do not match or are unsupported")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(dir: &Path, name: &str) -> (PathBuf, PathBuf, Vec<u8>) {
        let ck = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        let (c, k) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, ck.cert.pem()).unwrap();
        std::fs::write(&k, ck.key_pair.serialize_pem()).unwrap();
        (c, k, ck.cert.der().to_vec())
    }

    fn served(files: &CertFiles) -> Vec<u8> {
        files.current().cert[0].to_vec()
    }

    /// Installs `src` as `dst` the way the kubelet does: a new file renamed over the old one.
    fn swap(src: &Path, dst: &Path) {
        let tmp = dst.with_extension("new");
        std::fs::copy(src, &tmp).unwrap();
        std::fs::rename(&tmp, dst).unwrap();
    }

    #[test]
    fn a_rotated_pair_is_served_and_a_broken_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (c1, k1, der1) = pair(d, "one");
        let (c2, k2, der2) = pair(d, "two");
        let (cert, key) = (d.join("tls.crt"), d.join("tls.key"));
        swap(&c1, &cert);
        swap(&k1, &key);
        let files = CertFiles::load(&cert, &key, Duration::ZERO).unwrap();
        assert_eq!(served(&files), der1);

        // Half a rotation (a new certificate, the old key) does not load: the old pair stays.
        swap(&c2, &cert);
        assert_eq!(served(&files), der1);
        // The other half completes it.
        swap(&k2, &key);
        assert_eq!(served(&files), der2);

        // Garbage in the files keeps the pair in force.
        std::fs::write(d.join("junk"), b"not pem").unwrap();
        swap(&d.join("junk"), &cert);
        assert_eq!(served(&files), der2);
    }

    #[test]
    fn files_are_looked_at_no_more_often_than_asked() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (c1, k1, der1) = pair(d, "one");
        let (c2, k2, _) = pair(d, "two");
        let (cert, key) = (d.join("tls.crt"), d.join("tls.key"));
        swap(&c1, &cert);
        swap(&k1, &key);
        let files = CertFiles::load(&cert, &key, Duration::from_secs(3600)).unwrap();
        swap(&c2, &cert);
        swap(&k2, &key);
        assert_eq!(
            served(&files),
            der1,
            "within the interval the files are not read"
        );
    }

    #[test]
    fn a_mismatched_pair_is_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let (c1, _, _) = pair(dir.path(), "one");
        let (_, k2, _) = pair(dir.path(), "two");
        let e = CertFiles::load(&c1, &k2, Duration::ZERO).unwrap_err();
        assert!(format!("{e:#}").contains("do not match"), "{e:#}");
    }
}
