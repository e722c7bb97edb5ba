//! An endpoint's key ring as the operator rotates it (`docs/design/peer-trust.md#rotation`), and
//! the Secret volume each pod mounts it from.
//!
//! A [`RingState`] is the content of the endpoint's Secret at one step of a rotation: the current
//! generation, and optionally the previous and the next one; [`RingState::files`] are the files
//! the kubelet puts in the pod's volume ([`KeyFiles`]). [`mount`] writes them as the kubelet
//! updates a Secret volume: the files in a fresh hidden directory, then one atomic rename of the
//! `..data` symlink, so a reader sees either the whole old version or the whole new one of each
//! file. Each pod has its own volume ([`crate::pod::Pod::mount_keys`]), updated at a moment of its
//! own, as the kubelets of a cluster do.
//!
//! [`key_report`] reads a sidecar's `GET /keys`; [`session_key_id`] reads the key id a session id
//! of the second format names.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use tether_crds::keyring::{
    CA_BUNDLE, CURRENT_KEY, Generation, KeyReport, NEXT_KEY, PREVIOUS_KEY, TLS_CERT, TLS_KEY,
};

use crate::client::Http;
use crate::{HarnessError, Result};

/// The symlink to the volume's current version, as the kubelet names it.
const DATA_LINK: &str = "..data";

/// The files of a key-ring volume: `(file name, content)`. Its `Debug` names the files only.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyFiles(pub Vec<(&'static str, Vec<u8>)>);

impl std::fmt::Debug for KeyFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(name, _)| name))
            .finish()
    }
}

impl KeyFiles {
    /// The content of file `name`, if the volume has it.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, b)| b.as_slice())
    }
}

/// The endpoint's Secret at one step of a rotation.
#[derive(Clone, Debug)]
pub struct RingState {
    /// Signs; its certificate is the one presented.
    pub current: Generation,
    /// Verifies: the key before the last promotion, until it is retired.
    pub previous: Option<Generation>,
    /// Verifies: the key a rotation under way will promote.
    pub next: Option<Generation>,
}

impl RingState {
    /// A ring of one fresh generation for the endpoint `label` (`<namespace>/<name>`).
    ///
    /// # Errors
    /// [`HarnessError::Start`] when the certificates cannot be made.
    pub fn fresh(label: &str) -> Result<Self> {
        Ok(Self {
            current: generation(label)?,
            previous: None,
            next: None,
        })
    }

    /// Step 1 of a rotation: `next` staged (verifies everywhere, its CA trusted).
    pub fn staged(&self, next: Generation) -> Self {
        Self {
            next: Some(next),
            ..self.clone()
        }
    }

    /// Step 2: the staged key becomes current, the current one previous. `None` when nothing
    /// is staged.
    pub fn promoted(&self) -> Option<Self> {
        Some(Self {
            current: self.next.clone()?,
            previous: Some(self.current.clone()),
            next: None,
        })
    }

    /// Step 3: the previous key and its CA leave the ring.
    pub fn retired(&self) -> Self {
        Self {
            previous: None,
            ..self.clone()
        }
    }

    /// The Secret's files: the current key, certificate and private key, `previous` and `next`
    /// when present, and the CA bundle of every generation the ring holds (current, next,
    /// previous).
    pub fn files(&self) -> KeyFiles {
        let mut files = vec![
            (CURRENT_KEY, self.current.key.clone()),
            (TLS_CERT, self.current.cert_pem.clone().into_bytes()),
            (TLS_KEY, self.current.key_pem.clone().into_bytes()),
        ];
        if let Some(previous) = &self.previous {
            files.push((PREVIOUS_KEY, previous.key.clone()));
        }
        if let Some(next) = &self.next {
            files.push((NEXT_KEY, next.key.clone()));
        }
        let mut bundle = String::new();
        for g in std::iter::once(&self.current)
            .chain(&self.next)
            .chain(&self.previous)
        {
            bundle.push_str(&g.ca_pem);
            if !bundle.ends_with('\n') {
                bundle.push('\n');
            }
        }
        files.push((CA_BUNDLE, bundle.into_bytes()));
        KeyFiles(files)
    }
}

/// A new generation for the endpoint `label`.
///
/// # Errors
/// [`HarnessError::Start`] when the certificates cannot be made.
pub fn generation(label: &str) -> Result<Generation> {
    Generation::new(label).map_err(|e| HarnessError::Start(format!("a key generation: {e}")))
}

/// Writes `files` into the Secret volume `dir` (created when missing) as the kubelet does
/// (its atomic writer): the files go into a fresh hidden directory `..<version>`; each file name
/// missing from the volume gets its symlink `name -> ..data/name` (dangling, i.e. absent, until
/// the swap); symlink `..data` is swapped to the new directory with one `rename` — the moment
/// every file changes at once —; then the names the new version does not have are removed, and
/// the old directory. A file of the volume that is not such a symlink yet (a volume written as
/// plain files) is replaced by one after the swap, each on its own (not atomically).
///
/// # Errors
/// [`HarnessError::Io`] when a file cannot be written.
pub fn mount(dir: &Path, files: &KeyFiles) -> Result<()> {
    static VERSION: AtomicU64 = AtomicU64::new(0);
    std::fs::create_dir_all(dir)?;
    let version = format!(
        "..{}_{}",
        std::process::id(),
        VERSION.fetch_add(1, Ordering::Relaxed)
    );
    let fresh = dir.join(&version);
    std::fs::create_dir(&fresh)?;
    for (name, bytes) in &files.0 {
        std::fs::write(fresh.join(name), bytes)?;
    }
    let link_to_data = |name: &str| Path::new(DATA_LINK).join(name);
    let entry = |name: &str| std::fs::symlink_metadata(dir.join(name)).ok();
    for (name, _) in &files.0 {
        if entry(name).is_none() {
            std::os::unix::fs::symlink(link_to_data(name), dir.join(name))?;
        }
    }
    let old = std::fs::read_link(dir.join(DATA_LINK)).ok();
    let aside = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&aside);
    std::os::unix::fs::symlink(&version, &aside)?;
    std::fs::rename(&aside, dir.join(DATA_LINK))?;
    for (name, _) in &files.0 {
        if entry(name).is_some_and(|m| !m.file_type().is_symlink()) {
            let aside = dir.join(format!("..{name}_tmp"));
            let _ = std::fs::remove_file(&aside);
            std::os::unix::fs::symlink(link_to_data(name), &aside)?;
            std::fs::rename(&aside, dir.join(name))?;
        }
    }
    for listed in std::fs::read_dir(dir)? {
        let name = listed?.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with("..") && !files.0.iter().any(|(n, _)| *n == name) {
            std::fs::remove_file(dir.join(&*name))?;
        }
    }
    if let Some(old) = old.filter(|old| *old != Path::new(&version)) {
        std::fs::remove_dir_all(dir.join(old))?;
    }
    Ok(())
}

/// The sidecar's `GET /keys` on its admin port `admin_url` (`http://ip:port`).
///
/// # Errors
/// [`HarnessError`] when it cannot be read or is not a [`KeyReport`].
pub async fn key_report(http: &Http, admin_url: &str) -> Result<KeyReport> {
    let (status, text) = http.get_text(&format!("{admin_url}/keys")).await?;
    if !status.is_success() {
        return Err(HarnessError::Protocol(format!(
            "GET {admin_url}/keys answered {status}: {text:.200}"
        )));
    }
    serde_json::from_str(&text)
        .map_err(|e| HarnessError::Protocol(format!("GET {admin_url}/keys: {e}: {text:.200}")))
}

/// The id of the key that minted session id `id`, for an id of the second format (60
/// base64url characters: version 2, then the 4 bytes of the key id; `sidecar/src/mcp/session_id.rs`);
/// `None` for an id of the first format or anything else.
pub fn session_key_id(id: &str) -> Option<String> {
    if id.len() != 60 {
        return None;
    }
    // 8 characters are 6 bytes: the version and the key id, and a byte of the random part.
    let mut bits = 0u64;
    for c in id.bytes().take(8) {
        let sextet = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        };
        bits = (bits << 6) | u64::from(sextet);
    }
    let bytes = bits.to_be_bytes();
    let (version, key) = (bytes[2], &bytes[3..7]);
    (version == 2).then(|| key.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rotation_s_rings_hold_the_right_keys_and_cas() {
        let start = RingState::fresh("test/endpoint").unwrap();
        let next = generation("test/endpoint").unwrap();
        let ca_count = |files: &KeyFiles| {
            String::from_utf8_lossy(files.get(CA_BUNDLE).unwrap())
                .matches("BEGIN CERTIFICATE")
                .count()
        };
        let first = start.files();
        assert_eq!(first.get(CURRENT_KEY), Some(start.current.key.as_slice()));
        assert_eq!((first.get(NEXT_KEY), first.get(PREVIOUS_KEY)), (None, None));
        assert_eq!(ca_count(&first), 1);

        let staged = start.staged(next.clone());
        let files = staged.files();
        assert_eq!(files.get(CURRENT_KEY), Some(start.current.key.as_slice()));
        assert_eq!(files.get(NEXT_KEY), Some(next.key.as_slice()));
        assert_eq!(ca_count(&files), 2);

        let promoted = staged.promoted().unwrap();
        let files = promoted.files();
        assert_eq!(files.get(CURRENT_KEY), Some(next.key.as_slice()));
        assert_eq!(files.get(PREVIOUS_KEY), Some(start.current.key.as_slice()));
        assert_eq!(files.get(TLS_CERT), Some(next.cert_pem.as_bytes()));
        assert_eq!(files.get(NEXT_KEY), None);
        assert_eq!(ca_count(&files), 2);
        assert!(promoted.promoted().is_none(), "nothing staged");

        let retired = promoted.retired().files();
        assert_eq!(retired.get(PREVIOUS_KEY), None);
        assert_eq!(ca_count(&retired), 1);
        assert!(!format!("{retired:?}").contains("PRIVATE"));
    }

    #[test]
    fn a_volume_is_swapped_whole_and_loses_removed_files() {
        let dir = tempfile::tempdir().unwrap();
        let v1 = KeyFiles(vec![("secret", b"one".to_vec()), ("next", b"n".to_vec())]);
        // A volume written as plain files first becomes the kubelet's layout.
        std::fs::write(dir.path().join("secret"), "plain").unwrap();
        mount(dir.path(), &v1).unwrap();
        assert_eq!(std::fs::read(dir.path().join("secret")).unwrap(), b"one");
        assert_eq!(std::fs::read(dir.path().join("next")).unwrap(), b"n");
        let v2 = KeyFiles(vec![
            ("secret", b"two".to_vec()),
            ("previous", b"p".to_vec()),
        ]);
        mount(dir.path(), &v2).unwrap();
        assert_eq!(std::fs::read(dir.path().join("secret")).unwrap(), b"two");
        assert_eq!(std::fs::read(dir.path().join("previous")).unwrap(), b"p");
        assert!(!dir.path().join("next").exists());
        let hidden: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".."))
            .collect();
        assert_eq!(hidden.len(), 2, "..data and one version: {hidden:?}");
    }

    #[test]
    fn the_key_id_of_a_second_format_id() {
        // Version 2, key id 0a1b2c3d, then random bytes: base64url of 02 0a 1b 2c 3d ff ...
        let mut raw = vec![2u8, 0x0a, 0x1b, 0x2c, 0x3d];
        raw.extend([0xff; 40]);
        let id = encode(&raw);
        assert_eq!(id.len(), 60);
        assert_eq!(session_key_id(&id).as_deref(), Some("0a1b2c3d"));
        raw[0] = 1;
        assert_eq!(session_key_id(&encode(&raw)), None, "not the second format");
        assert_eq!(session_key_id("short"), None);
    }

    /// base64url without padding, for the test above.
    fn encode(bytes: &[u8]) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
            for i in 0..=chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            }
        }
        out
    }
}
