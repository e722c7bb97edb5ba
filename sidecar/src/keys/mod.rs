//! The endpoint's key ring as this sidecar holds it (`docs/design/peer-trust.md#the-key-ring`):
//! the current HMAC key, which signs, the previous and next ones, which only verify, and the peer
//! TLS material ([`tls`]). Every sidecar of an endpoint reads the same ring (the operator's
//! Secret, mounted as a directory, `--secret-dir`; a single key file, `--secret-file`, for a
//! sidecar run by hand without TLS).
//!
//! A [`KeyRing`] is a cheap handle, cloned into everything that signs or verifies; a reload
//! ([`KeyRing::reload`], polled by the server every [`RELOAD_INTERVAL`]) swaps the whole ring at
//! once, so a reader never sees half of one load. Keys are named by their [`KeyId`]
//! ([`tether_crds::keyring::key_id`]). Each use of a key has its own domain-separation label, so
//! a value computed for one purpose is never valid for another.

pub(crate) mod tls;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tether_crds::keyring::{
    CA_BUNDLE, CURRENT_KEY, KEY_ID_LEN, MIN_KEY_BYTES, NEXT_KEY, PREVIOUS_KEY, TLS_CERT, TLS_KEY,
};

use tls::PeerTls;

/// How often the secret directory is read for changes.
pub(crate) const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// Domain label of session-id MACs.
pub(crate) const DOMAIN_SESSION_ID: &[u8] = b"tether/session-id/v1";
/// Domain of the digest a session's principal is kept as (`mcp/principal.rs`).
pub(crate) const DOMAIN_PRINCIPAL: &[u8] = b"tether/principal/v1";
/// Domain of the key that seals task ids (`mcp/sealed.rs`).
pub(crate) const DOMAIN_TASK_ID_SEAL: &[u8] = b"tether/task-id/seal/v1";
/// Domain of the synthetic nonce of a sealed task id (`mcp/sealed.rs`).
pub(crate) const DOMAIN_TASK_ID_NONCE: &[u8] = b"tether/task-id/nonce/v1";
/// Domain of the key that seals `requestState`s (`mcp/sealed.rs`).
pub(crate) const DOMAIN_REQUEST_STATE_SEAL: &[u8] = b"tether/request-state/seal/v1";
/// Domain of the synthetic nonce of a sealed `requestState` (`mcp/sealed.rs`).
pub(crate) const DOMAIN_REQUEST_STATE_NONCE: &[u8] = b"tether/request-state/nonce/v1";

/// The id of a key: 4 bytes, written as 8 lowercase hex characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct KeyId(pub(crate) [u8; KEY_ID_LEN / 2]);

impl KeyId {
    /// The id of the key `bytes` ([`tether_crds::keyring::key_id`]).
    pub(crate) fn of(bytes: &[u8]) -> Self {
        Self::parse(&tether_crds::keyring::key_id(bytes))
            .unwrap_or_else(|| unreachable!("key_id gives 8 hex characters"))
    }

    /// Reads an id written as 8 hex characters.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let mut id = [0; KEY_ID_LEN / 2];
        (text.len() == KEY_ID_LEN)
            .then(|| hex::decode_to_slice(text, &mut id).ok())
            .flatten()
            .map(|()| Self(id))
    }
}

impl std::fmt::Display for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// One HMAC key of the ring.
pub(crate) struct Key {
    id: KeyId,
    bytes: Vec<u8>,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({})", self.id)
    }
}

impl Key {
    /// A key of `bytes` (any length: the caller checks [`MIN_KEY_BYTES`]).
    pub(crate) fn new(bytes: impl Into<Vec<u8>>) -> Self {
        let bytes = bytes.into();
        Self {
            id: KeyId::of(&bytes),
            bytes,
        }
    }

    /// Its id.
    pub(crate) fn id(&self) -> KeyId {
        self.id
    }

    /// HMAC-SHA256 over `domain` (length-prefixed) followed by `message`: 32 bytes.
    pub(crate) fn mac(&self, domain: &[u8], message: &[u8]) -> [u8; 32] {
        let mut mac = self.keyed(domain);
        mac.update(message);
        mac.finalize().into_bytes().into()
    }

    /// Checks in constant time that `tag` equals the leftmost `tag.len()` bytes of
    /// [`Key::mac`]. Tags shorter than 16 bytes are refused.
    pub(crate) fn verify(&self, domain: &[u8], message: &[u8], tag: &[u8]) -> bool {
        if tag.len() < 16 {
            return false;
        }
        let mut mac = self.keyed(domain);
        mac.update(message);
        mac.verify_truncated_left(tag).is_ok()
    }

    /// A short keyed digest of `value` for logs: 12 hex characters. It identifies a session
    /// across log lines without revealing its id.
    pub(crate) fn log_digest(&self, value: &str) -> String {
        tether_crds::keyring::log_digest(&self.bytes, value)
    }

    fn keyed(&self, domain: &[u8]) -> Hmac<Sha256> {
        tether_crds::keyring::keyed_mac(&self.bytes, domain)
    }
}

/// A fixed key for tests and fuzz targets.
#[cfg(any(test, fuzzing))]
pub(crate) fn test_key() -> Arc<Key> {
    Arc::new(Key::new(b"tether-test-key-0123456789".to_vec()))
}

/// What a key is to the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Signs and verifies.
    Current,
    /// Verifies: the key before the last rotation.
    Previous,
    /// Verifies: the key a rotation under way will promote.
    Next,
}

/// One load of the ring.
#[derive(Debug)]
pub(crate) struct Ring {
    current: Arc<Key>,
    previous: Option<Arc<Key>>,
    next: Option<Arc<Key>>,
    tls: Option<Arc<PeerTls>>,
    /// The files as read, to tell a change from a re-read.
    files: Files,
}

impl Ring {
    /// A ring of one key and no TLS.
    pub(crate) fn single(key: Key) -> Self {
        Self {
            current: Arc::new(key),
            previous: None,
            next: None,
            tls: None,
            files: Vec::new(),
        }
    }

    /// A ring of a current and maybe a previous key, no TLS (tests).
    #[cfg(test)]
    pub(crate) fn rotated(current: Key, previous: Option<Key>) -> Self {
        Self {
            previous: previous.map(Arc::new),
            ..Self::single(current)
        }
    }

    /// Every key with its role, the current one first.
    pub(crate) fn keys(&self) -> impl Iterator<Item = (Role, &Arc<Key>)> {
        std::iter::once((Role::Current, &self.current))
            .chain(self.next.iter().map(|k| (Role::Next, k)))
            .chain(self.previous.iter().map(|k| (Role::Previous, k)))
    }

    /// The key named `id`.
    pub(crate) fn get(&self, id: KeyId) -> Option<&Arc<Key>> {
        self.keys().map(|(_, k)| k).find(|k| k.id == id)
    }

    /// The peer TLS material, when the ring holds it.
    pub(crate) fn tls(&self) -> Option<&Arc<PeerTls>> {
        self.tls.as_ref()
    }
}

/// Why the ring could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A key is too short to key a MAC safely.
    #[error("{path} holds {len} bytes; a key needs at least {MIN_KEY_BYTES}")]
    TooShort {
        /// The file.
        path: String,
        /// Its length after trimming surrounding whitespace.
        len: usize,
    },
    /// The TLS files are incomplete or do not fit together.
    #[error("the peer TLS files in {dir}: {message}")]
    Tls {
        /// The secret directory.
        dir: String,
        /// What is wrong.
        message: String,
    },
}

/// Where the ring comes from.
#[derive(Clone, Debug)]
enum Source {
    /// A directory in the Secret's layout (`--secret-dir`).
    Dir(PathBuf),
    /// One key file (`--secret-file`).
    File(PathBuf),
    /// Fixed keys (tests).
    #[cfg(any(test, fuzzing))]
    Fixed,
}

/// A handle to the endpoint's key ring (module docs).
#[derive(Clone)]
pub(crate) struct KeyRing {
    ring: Arc<ArcSwap<Ring>>,
    source: Source,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyRing(current {})", self.ring.load().current.id)
    }
}

impl KeyRing {
    /// The ring in directory `dir` (the Secret's layout, [`tether_crds::keyring`]).
    ///
    /// # Errors
    /// [`KeyError`] naming the file at fault.
    pub(crate) fn from_dir(dir: &Path) -> Result<Self, KeyError> {
        let source = Source::Dir(dir.to_owned());
        let ring = read(&source)?;
        Ok(Self {
            ring: Arc::new(ArcSwap::from_pointee(ring)),
            source,
        })
    }

    /// A ring of the one key in `path` (no TLS material, never rotated).
    ///
    /// # Errors
    /// [`KeyError`] when the file cannot be read or holds fewer than 16 bytes.
    pub(crate) fn from_file(path: &Path) -> Result<Self, KeyError> {
        let source = Source::File(path.to_owned());
        let ring = read(&source)?;
        Ok(Self {
            ring: Arc::new(ArcSwap::from_pointee(ring)),
            source,
        })
    }

    /// A ring of one key of raw bytes (tests and tools; any length).
    #[cfg(any(test, fuzzing))]
    pub(crate) fn from_bytes(bytes: impl Into<Vec<u8>>) -> Self {
        Self::fixed(Ring::single(Key::new(bytes)))
    }

    /// A ring that never reloads (tests).
    #[cfg(any(test, fuzzing))]
    pub(crate) fn fixed(ring: Ring) -> Self {
        Self {
            ring: Arc::new(ArcSwap::from_pointee(ring)),
            source: Source::Fixed,
        }
    }

    /// The ring as loaded now.
    pub(crate) fn load(&self) -> Arc<Ring> {
        self.ring.load_full()
    }

    /// The signing key.
    pub(crate) fn current(&self) -> Arc<Key> {
        Arc::clone(&self.ring.load().current)
    }

    /// The key named `id`, if the ring holds it.
    pub(crate) fn get(&self, id: KeyId) -> Option<Arc<Key>> {
        self.ring.load().get(id).cloned()
    }

    /// Reads the source again and swaps the ring in when a file changed: `Ok(true)` then,
    /// `Ok(false)` when nothing changed (a ring of a single file or of fixed keys never does).
    ///
    /// # Errors
    /// [`KeyError`]; the last good ring stays in force.
    pub(crate) fn reload(&self) -> Result<bool, KeyError> {
        let Source::Dir(dir) = &self.source else {
            return Ok(false);
        };
        if read_files(dir)? == self.ring.load().files {
            return Ok(false);
        }
        self.ring.store(Arc::new(read(&self.source)?));
        Ok(true)
    }
}

/// Why `tether-sidecar keygen` wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum KeygenError {
    /// The directory holds a key ring already.
    #[error("{0} holds a key ring already; it is never overwritten")]
    Exists(String),
    /// The directory or a file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The certificates could not be made.
    #[error(transparent)]
    Generate(#[from] tether_crds::keyring::GenerateError),
}

/// Writes a new key ring into `dir` (created when missing, files mode 0600), naming `label` in
/// its certificates; returns the new key's id.
///
/// # Errors
/// [`KeygenError`]; nothing is overwritten.
pub fn keygen(dir: &Path, label: &str) -> Result<String, KeygenError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if dir.join(CURRENT_KEY).exists() {
        return Err(KeygenError::Exists(dir.display().to_string()));
    }
    let failed = |path: &Path| {
        let path = path.display().to_string();
        move |source| KeygenError::Write { path, source }
    };
    std::fs::create_dir_all(dir).map_err(failed(dir))?;
    let generation = tether_crds::keyring::Generation::new(label)?;
    for (name, bytes) in generation.files() {
        let path = dir.join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(&bytes))
            .map_err(failed(&path))?;
    }
    Ok(generation.id())
}

/// The files of a ring directory as read: each name with its content, `None` when absent.
type Files = Vec<(&'static str, Option<Vec<u8>>)>;

/// The files of a ring directory, each `None` when absent.
fn read_files(dir: &Path) -> Result<Files, KeyError> {
    [
        CURRENT_KEY,
        PREVIOUS_KEY,
        NEXT_KEY,
        TLS_CERT,
        TLS_KEY,
        CA_BUNDLE,
    ]
    .into_iter()
    .map(|name| {
        let path = dir.join(name);
        match std::fs::read(&path) {
            Ok(bytes) => Ok((name, Some(bytes))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && name != CURRENT_KEY => {
                Ok((name, None))
            }
            Err(source) => Err(KeyError::Read {
                path: path.display().to_string(),
                source,
            }),
        }
    })
    .collect()
}

/// A key from the raw content of file `path`, trimmed of surrounding whitespace (a trailing
/// newline from `echo` is common).
fn key_of(path: &Path, raw: &[u8]) -> Result<Key, KeyError> {
    let bytes = tether_crds::keyring::key_material(raw);
    if bytes.len() < MIN_KEY_BYTES {
        return Err(KeyError::TooShort {
            path: path.display().to_string(),
            len: bytes.len(),
        });
    }
    Ok(Key::new(bytes))
}

fn read(source: &Source) -> Result<Ring, KeyError> {
    let dir = match source {
        Source::File(path) => {
            let raw = std::fs::read(path).map_err(|e| KeyError::Read {
                path: path.display().to_string(),
                source: e,
            })?;
            return Ok(Ring::single(key_of(path, &raw)?));
        }
        Source::Dir(dir) => dir,
        #[cfg(any(test, fuzzing))]
        Source::Fixed => unreachable!("a fixed ring is never read"),
    };
    let files = read_files(dir)?;
    let file = |name: &str| {
        files
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, bytes)| bytes.as_deref())
    };
    let key = |name: &'static str| {
        file(name)
            .map(|raw| key_of(&dir.join(name), raw).map(Arc::new))
            .transpose()
    };
    let current = key(CURRENT_KEY)?
        .unwrap_or_else(|| unreachable!("read_files fails without the current key"));
    let tls_error = |message: String| KeyError::Tls {
        dir: dir.display().to_string(),
        message,
    };
    let tls = match (file(TLS_CERT), file(TLS_KEY), file(CA_BUNDLE)) {
        (None, None, None) => None,
        (Some(cert), Some(key), Some(ca)) => Some(Arc::new(
            PeerTls::from_pem(cert, key, ca).map_err(tls_error)?,
        )),
        _ => {
            return Err(tls_error(format!(
                "{TLS_CERT}, {TLS_KEY} and {CA_BUNDLE} come together; some are missing"
            )));
        }
    };
    Ok(Ring {
        current,
        previous: key(PREVIOUS_KEY)?,
        next: key(NEXT_KEY)?,
        tls,
        files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_crds::keyring::Generation;

    #[test]
    fn domains_separate_macs() {
        let k = Key::new(b"0123456789abcdef".to_vec());
        assert_ne!(k.mac(b"a", b"m"), k.mac(b"b", b"m"));
        let tag = k.mac(DOMAIN_SESSION_ID, b"m");
        assert!(k.verify(DOMAIN_SESSION_ID, b"m", &tag[..16]));
        assert!(!k.verify(tether_crds::keyring::DOMAIN_LOG_DIGEST, b"m", &tag[..16]));
        assert!(
            !k.verify(DOMAIN_SESSION_ID, b"m", &tag[..8]),
            "short tags are refused"
        );
        let other = Key::new(b"fedcba9876543210".to_vec());
        assert!(!other.verify(DOMAIN_SESSION_ID, b"m", &tag[..16]));
        assert_eq!(
            k.id().to_string(),
            tether_crds::keyring::key_id(b"0123456789abcdef")
        );
        assert_eq!(KeyId::parse(&k.id().to_string()), Some(k.id()));
        assert_eq!(KeyId::parse("xyz"), None);
    }

    fn write(dir: &Path, files: &[(&str, &[u8])]) {
        for (name, bytes) in files {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }

    #[test]
    fn short_key_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("short");
        std::fs::write(&path, "tooshort\n").unwrap();
        let err = KeyRing::from_file(&path).unwrap_err().to_string();
        assert!(err.contains("at least 16"), "{err}");
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        assert!(KeyRing::from_file(&path).is_ok());
    }

    #[test]
    fn a_directory_ring_loads_whole_and_reloads_on_change() {
        let dir = tempfile::tempdir().unwrap();
        let g = Generation::new("ns/ep").unwrap();
        for (name, bytes) in g.files() {
            std::fs::write(dir.path().join(name), bytes).unwrap();
        }
        let ring = KeyRing::from_dir(dir.path()).unwrap();
        assert_eq!(ring.current().id().to_string(), g.id());
        assert!(ring.load().tls().is_some());
        assert!(!ring.reload().unwrap(), "nothing changed");
        // A rotation's first step: the next key is staged; it verifies, the current signs.
        let next = Generation::new("ns/ep").unwrap();
        write(dir.path(), &[(NEXT_KEY, &next.key)]);
        assert!(ring.reload().unwrap());
        let tag = Key::new(next.key.clone()).mac(DOMAIN_SESSION_ID, b"m");
        let found = ring.get(KeyId::of(&next.key)).unwrap();
        assert!(found.verify(DOMAIN_SESSION_ID, b"m", &tag));
        assert_eq!(found.id().to_string(), next.id());
        assert_eq!(
            ring.current().id().to_string(),
            g.id(),
            "still signs with the current"
        );
        // A TLS file without its partners is refused; the last good ring stays.
        std::fs::remove_file(dir.path().join(TLS_KEY)).unwrap();
        let err = ring.reload().unwrap_err().to_string();
        assert!(err.contains("come together"), "{err}");
        assert_eq!(ring.current().id().to_string(), g.id());
        assert!(ring.load().tls().is_some());
    }

    #[test]
    fn keygen_writes_a_ring_that_loads_and_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("ring");
        let id = keygen(&target, "ns/ep").unwrap();
        let ring = KeyRing::from_dir(&target).unwrap();
        assert_eq!(ring.current().id().to_string(), id);
        assert!(ring.load().tls().is_some());
        let err = keygen(&target, "ns/ep").unwrap_err().to_string();
        assert!(err.contains("never overwritten"), "{err}");
        assert_eq!(
            KeyRing::from_dir(&target)
                .unwrap()
                .current()
                .id()
                .to_string(),
            id
        );
    }

    #[test]
    fn the_sidecar_and_the_operator_agree_on_the_id_of_a_padded_key() {
        let dir = tempfile::tempdir().unwrap();
        let raw = b"\n 0123456789abcdef0123\t\n";
        write(dir.path(), &[(CURRENT_KEY, raw)]);
        let ring = KeyRing::from_dir(dir.path()).unwrap();
        assert_eq!(
            ring.current().id().to_string(),
            tether_crds::keyring::key_id(raw)
        );
    }

    #[test]
    fn a_ring_without_tls_files_loads_without_tls() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &[(CURRENT_KEY, b"0123456789abcdef0123\n")]);
        let ring = KeyRing::from_dir(dir.path()).unwrap();
        assert!(ring.load().tls().is_none());
        let missing = tempfile::tempdir().unwrap();
        let err = KeyRing::from_dir(missing.path()).unwrap_err().to_string();
        assert!(err.contains("cannot read"), "{err}");
    }
}
