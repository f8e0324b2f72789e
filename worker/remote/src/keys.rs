//! Key files and data keys (envelope encryption).
//!
//! A remote's objects are sealed under one random 256-bit *data key* (see [`crate::seal`]).
//! The data key is stored in the remote's descriptor only *wrapped*: sealed with AES-256-GCM
//! under a key-encryption key derived from a *key file* (BLAKE3 `derive_key` over the file's
//! bytes). Several key files may wrap the same data key, which is how a key file is rotated
//! without re-encrypting the bucket: wrap the data key under the new file, then drop the old
//! file's wrapping ([`crate::rotate`]). Rotation replaces who can unwrap the data key; it does
//! not re-key data that someone holding the old file and the bucket may already have read.
//!
//! A key file is any file of at least 32 bytes (trailing white space ignored);
//! [`create_key_file`] writes 32 random bytes as hex.

use std::io::Write;
use std::path::Path;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use serde::{Deserialize, Serialize};

use crate::error::{IoCtx, RemoteError, Result};
use crate::seal::{random, DataKey};

const KEK_CONTEXT: &str = "revault remote key-encryption key v1";
const KEY_ID_CONTEXT: &str = "revault remote key file id v1";

/// What a key file yields: the key-encryption key and a short public id of it.
pub struct KeyFile {
    kek: [u8; 32],
    pub id: String,
}

impl KeyFile {
    pub fn read(path: &Path) -> Result<KeyFile> {
        let bytes = std::fs::read(path).ctx(|| format!("reading key file {}", path.display()))?;
        KeyFile::from_bytes(&bytes)
            .map_err(|e| RemoteError::Invalid(format!("key file {}: {e}", path.display())))
    }

    pub fn from_bytes(bytes: &[u8]) -> std::result::Result<KeyFile, String> {
        let end = bytes
            .iter()
            .rposition(|b| !b.is_ascii_whitespace())
            .map_or(0, |i| i + 1);
        let material = &bytes[..end];
        if material.len() < 32 {
            return Err(format!(
                "{} bytes; a key file holds at least 32 (e.g. `revault init --key-file` creates one, or `head -c 32 /dev/urandom | xxd -p -c 64`)",
                material.len()
            ));
        }
        let kek = blake3::derive_key(KEK_CONTEXT, material);
        let id = hex::encode(&blake3::derive_key(KEY_ID_CONTEXT, material)[..8]);
        Ok(KeyFile { kek, id })
    }

    fn aead(&self) -> LessSafeKey {
        LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &self.kek).expect("32-byte key"))
    }

    /// Wraps `key` of store `store` under this key file.
    pub fn wrap(&self, store: &str, key: &DataKey) -> Wrapped {
        let nonce: [u8; 12] = random();
        let mut buf = key.bytes().to_vec();
        let tag = self
            .aead()
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(wrap_aad(store, key.id)),
                &mut buf,
            )
            .expect("sealing 32 bytes");
        buf.extend_from_slice(tag.as_ref());
        let mut all = nonce.to_vec();
        all.extend_from_slice(&buf);
        Wrapped {
            data_key: key.id,
            key_file: self.id.clone(),
            wrapped: hex::encode(all),
        }
    }

    /// Unwraps the data key from the descriptor of `remote` (named in errors).
    pub fn unwrap(&self, remote: &str, d: &Descriptor) -> Result<DataKey> {
        let wrong = |detail: String| RemoteError::WrongKey {
            remote: remote.to_string(),
            detail,
        };
        let w = d
            .keys
            .iter()
            .find(|w| w.key_file == self.id)
            .ok_or_else(|| {
                let known: Vec<&str> = d.keys.iter().map(|w| w.key_file.as_str()).collect();
                wrong(format!(
                    "it is key file {} and the remote's data key is wrapped for {}",
                    self.id,
                    known.join(", ")
                ))
            })?;
        let all =
            hex::decode(&w.wrapped).map_err(|_| wrong("the wrapped key is not hex".into()))?;
        if all.len() != 12 + 32 + 16 {
            return Err(wrong("the wrapped key has the wrong length".into()));
        }
        let (nonce, rest) = all.split_at(12);
        let mut buf = rest.to_vec();
        let plain = self
            .aead()
            .open_in_place(
                Nonce::try_assume_unique_for_key(nonce).expect("12 bytes"),
                Aad::from(wrap_aad(&d.store, w.data_key)),
                &mut buf,
            )
            .map_err(|_| {
                wrong(format!(
                    "key file {} does not unwrap the data key (wrong key file, or the descriptor was changed)",
                    self.id
                ))
            })?;
        Ok(DataKey::new(
            w.data_key,
            plain.try_into().expect("32 bytes"),
        ))
    }
}

fn wrap_aad(store: &str, data_key: u32) -> Vec<u8> {
    let mut a = b"revault data key v1\0".to_vec();
    a.extend_from_slice(store.as_bytes());
    a.push(0);
    a.extend_from_slice(&data_key.to_le_bytes());
    a
}

/// Writes a new key file of 32 random bytes (hex) at `path`, readable by its owner only.
/// Refuses to overwrite a file that exists.
pub fn create_key_file(path: &Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let key: [u8; 32] = random();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .ctx(|| format!("creating key file {}", path.display()))?;
    f.write_all(format!("{}\n", hex::encode(key)).as_bytes())
        .and_then(|_| f.sync_all())
        .ctx(|| format!("writing key file {}", path.display()))?;
    // The file's name too: a key file that vanishes in a power cut after the remote was
    // rotated to it would leave a remote nobody can open.
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx(|| format!("syncing {}", dir.display()))
}

/// One wrapping of the data key.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Wrapped {
    pub data_key: u32,
    /// The id of the key file that unwraps it.
    pub key_file: String,
    /// Hex: 12-byte nonce, the sealed 32-byte key, 16-byte tag.
    pub wrapped: String,
}

/// The remote's descriptor, `PREFIX/revault-remote.json`: plain JSON that says what the
/// prefix holds. Nothing in it is secret; everything that matters in it is authenticated
/// elsewhere (the wrapped key by its tag; the objects carry their own frame size).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub format: u32,
    /// The store's id: random, fixed at `init`, kept by `recover`.
    pub store: String,
    pub created: String,
    pub frame_log2: u8,
    pub keys: Vec<Wrapped>,
    /// Every object is written with S3 Object Lock (set by `init`, kept by `recover`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_lock: Option<crate::bucket::ObjectLock>,
    /// A MAC of everything above under the data key: whoever can write to the bucket but
    /// has no key cannot change the descriptor (e.g. drop its Object Lock) unnoticed.
    #[serde(default)]
    pub mac: String,
}

const DESCRIPTOR_MAC_CONTEXT: &str = "revault remote descriptor mac v1";

impl Descriptor {
    fn mac_of(&self, key: &DataKey) -> String {
        let mut d = self.clone();
        d.mac = String::new();
        let text = serde_json::to_vec(&d).expect("descriptor serialises");
        hex::encode(
            blake3::keyed_hash(
                &blake3::derive_key(DESCRIPTOR_MAC_CONTEXT, key.bytes()),
                &text,
            )
            .as_bytes(),
        )
    }

    /// Seals the descriptor with its MAC.
    pub fn sign(&mut self, key: &DataKey) {
        self.mac = self.mac_of(key);
    }

    /// Checks the MAC once the data key is unwrapped.
    pub fn verify(&self, remote: &str, key: &DataKey) -> Result<()> {
        let want = self.mac_of(key);
        #[allow(deprecated)] // ring's constant-time comparison; the MAC is no secret either way
        let same =
            ring::constant_time::verify_slices_are_equal(self.mac.as_bytes(), want.as_bytes())
                .is_ok();
        if !same {
            return Err(RemoteError::tampered(
                &format!("{remote}/{}", crate::layout::DESCRIPTOR),
                "its MAC does not match: it was changed by someone without the key",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor(kf: &KeyFile, key: &DataKey) -> Descriptor {
        Descriptor {
            format: 1,
            store: "s1".into(),
            created: "now".into(),
            frame_log2: 16,
            keys: vec![kf.wrap("s1", key)],
            object_lock: None,
            mac: String::new(),
        }
    }

    #[test]
    fn a_key_file_unwraps_its_data_key_and_no_other_does() {
        let kf = KeyFile::from_bytes(&[1u8; 32]).unwrap();
        let key = DataKey::new(1, random());
        let d = descriptor(&kf, &key);
        assert_eq!(kf.unwrap("r", &d).unwrap().bytes(), key.bytes());
        let other = KeyFile::from_bytes(&[2u8; 40]).unwrap();
        let e = other.unwrap("s3://b/p", &d).unwrap_err();
        assert_eq!(e.code(), "wrong_key");
        assert!(e.to_string().contains("s3://b/p"), "{e}");
    }

    #[test]
    fn a_changed_descriptor_does_not_unwrap() {
        let kf = KeyFile::from_bytes(b"0123456789abcdef0123456789abcdef\n").unwrap();
        let key = DataKey::new(1, random());
        let mut d = descriptor(&kf, &key);
        d.store = "s2".into();
        assert_eq!(kf.unwrap("r", &d).unwrap_err().code(), "wrong_key");
        let mut d = descriptor(&kf, &key);
        let mut w = hex::decode(&d.keys[0].wrapped).unwrap();
        w[20] ^= 1;
        d.keys[0].wrapped = hex::encode(w);
        assert_eq!(kf.unwrap("r", &d).unwrap_err().code(), "wrong_key");
    }

    #[test]
    fn a_descriptor_changed_without_the_key_fails_its_mac() {
        let kf = KeyFile::from_bytes(&[3u8; 32]).unwrap();
        let key = DataKey::new(1, random());
        let mut d = descriptor(&kf, &key);
        d.object_lock = Some(crate::bucket::ObjectLock {
            compliance: true,
            seconds: 86_400,
        });
        d.sign(&key);
        d.verify("r", &key).unwrap();
        let mut dropped = d.clone();
        dropped.object_lock = None;
        assert_eq!(
            dropped.verify("r", &key).unwrap_err().code(),
            "remote_corrupt"
        );
        let mut shortened = d.clone();
        shortened.object_lock = Some(crate::bucket::ObjectLock {
            compliance: true,
            seconds: 1,
        });
        assert!(shortened.verify("r", &key).is_err());
        assert!(d.verify("r", &DataKey::new(1, random())).is_err());
    }

    #[test]
    fn short_key_files_are_refused_and_whitespace_ignored() {
        let e = KeyFile::from_bytes(b"short\n").err().unwrap();
        assert!(e.contains("at least 32"), "{e}");
        let a = KeyFile::from_bytes(b"0123456789abcdef0123456789abcdef").unwrap();
        let b = KeyFile::from_bytes(b"0123456789abcdef0123456789abcdef\n\n").unwrap();
        assert_eq!(a.id, b.id);
    }

    #[test]
    fn created_key_files_are_private_and_never_overwritten() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("key");
        create_key_file(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        KeyFile::read(&p).unwrap();
        let before = std::fs::read(&p).unwrap();
        assert!(create_key_file(&p).is_err());
        assert_eq!(std::fs::read(&p).unwrap(), before);
    }
}
