//! The endpoint's key ring: what its Secret holds, shared by the operator, which writes it, and
//! the sidecar, which reads it from the mounted volume (`docs/design/peer-trust.md`).
//!
//! | Secret key | what | who uses it |
//! |---|---|---|
//! | [`CURRENT_KEY`] (`secret`) | the current HMAC key (32 random bytes as 64 hex characters) | signs session ids, hop headers and peer messages |
//! | [`PREVIOUS_KEY`] (`previous`) | the key before the last rotation, while sessions minted with it live | verifies |
//! | [`NEXT_KEY`] (`next`) | the key a rotation under way will promote | verifies |
//! | [`TLS_CERT`], [`TLS_KEY`] (`tls.crt`, `tls.key`) | the current peer certificate and its PKCS#8 key (PEM) | presented on the peer port, both ways |
//! | [`CA_BUNDLE`] (`ca.crt`) | the per-endpoint CA certificates a peer certificate must chain to (PEM, one or more) | trusted |
//! | [`NEXT_TLS_CERT`], [`NEXT_TLS_KEY`] | the certificate a rotation under way will promote (staged; sidecars ignore them) | the operator |
//!
//! A key file's **key** is its content without surrounding ASCII whitespace ([`key_material`]):
//! a Secret made by hand with `echo` ends in a newline that is not part of the key. A **key id**
//! names a key without revealing it: the first 4 bytes of
//! SHA-256(`tether/key-id/v1\0` ‖ key), as 8 lowercase hex characters ([`key_id`]). Session ids,
//! hop headers and peer MACs carry it, so a verifier picks the right key of the ring.
//!
//! A **generation** ([`Generation::new`]) is one HMAC key with one CA and one leaf certificate:
//! the CA signs the leaf and its private key is then dropped, so nobody can issue another
//! certificate the endpoint's sidecars would trust. The leaf names [`PEER_SERVER_NAME`] and may
//! serve and authenticate clients; certificates are valid until a rotation replaces them.
//!
//! Each sidecar reports what it loaded on its admin port (`GET /keys`, [`KeyReport`]); the
//! operator rotates in three steps, each only once every pod reports the step before:
//! stage the next key (verified everywhere), promote it (signing everywhere), retire the previous
//! one (no session minted with it is left).

use std::collections::BTreeMap;

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Secret key (and file name in the mounted volume) of the current HMAC key.
pub const CURRENT_KEY: &str = "secret";
/// Secret key of the previous HMAC key (optional).
pub const PREVIOUS_KEY: &str = "previous";
/// Secret key of the next HMAC key, staged by a rotation (optional).
pub const NEXT_KEY: &str = "next";
/// Secret key of the current peer certificate (PEM).
pub const TLS_CERT: &str = "tls.crt";
/// Secret key of the current peer certificate's private key (PKCS#8 PEM).
pub const TLS_KEY: &str = "tls.key";
/// Secret key of the trusted CA certificates (PEM bundle).
pub const CA_BUNDLE: &str = "ca.crt";
/// Secret key of the staged next peer certificate (PEM; the operator's, sidecars ignore it).
pub const NEXT_TLS_CERT: &str = "next-tls.crt";
/// Secret key of the staged next certificate's private key.
pub const NEXT_TLS_KEY: &str = "next-tls.key";
/// The DNS name every peer certificate carries and every sidecar asks for (TLS SNI): peers are
/// reached by pod IP, so the name is the endpoint's, not a host's.
pub const PEER_SERVER_NAME: &str = "tether-peer";
/// Random bytes of a new HMAC key (written as twice as many hex characters, so no byte of it is
/// whitespace a reader would trim).
pub const KEY_BYTES: usize = 32;
/// Shortest HMAC key a sidecar accepts, in bytes (128 bits).
pub const MIN_KEY_BYTES: usize = 16;
/// Characters of a key id.
pub const KEY_ID_LEN: usize = 8;

/// The key a key file holds: its content `raw` without surrounding ASCII whitespace (module
/// docs). The operator and the sidecar both read keys through it, so they agree on key ids.
pub fn key_material(raw: &[u8]) -> &[u8] {
    raw.trim_ascii()
}

/// The id of the HMAC key in the key file content `key`: 8 lowercase hex characters of its
/// [`key_material`] (module docs).
pub fn key_id(key: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(b"tether/key-id/v1\0");
    h.update(key_material(key));
    hex::encode(&h.finalize()[..KEY_ID_LEN / 2])
}

/// Domain label of log digests ([`log_digest`]).
pub const DOMAIN_LOG_DIGEST: &[u8] = b"tether/log-digest/v1";

/// HMAC-SHA256 keyed with `key` (a key's [`key_material`]), over `domain` (length-prefixed)
/// and whatever is added next: every MAC a sidecar makes, one domain per use.
pub fn keyed_mac(key: &[u8], domain: &[u8]) -> Hmac<Sha256> {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    mac.update(&(domain.len() as u64).to_be_bytes());
    mac.update(domain);
    mac
}

/// The digest a sidecar writes in its logs for `value` (a session id) under `key`: 12 hex
/// characters. It identifies a session across log lines without revealing its id; whoever holds
/// the key (the endpoint's Secret) finds a session's lines by it.
pub fn log_digest(key: &[u8], value: &str) -> String {
    let mut mac = keyed_mac(key, DOMAIN_LOG_DIGEST);
    mac.update(value.as_bytes());
    hex::encode(&mac.finalize().into_bytes()[..6])
}

/// Why a generation could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot generate the peer certificate: {0}")]
pub struct GenerateError(#[from] rcgen::Error);

/// One HMAC key with its CA and peer certificate (module docs).
#[derive(Clone)]
pub struct Generation {
    /// The HMAC key: [`KEY_BYTES`] random bytes as lowercase hex text.
    pub key: Vec<u8>,
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// The leaf certificate, PEM, signed by the CA.
    pub cert_pem: String,
    /// The leaf's private key, PKCS#8 PEM.
    pub key_pem: String,
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation")
            .field("key_id", &key_id(&self.key))
            .finish_non_exhaustive()
    }
}

impl Generation {
    /// A new generation for the endpoint `label` (`<namespace>/<name>`, written into the
    /// certificates' common names for whoever inspects them).
    ///
    /// # Errors
    /// [`GenerateError`] when the certificates cannot be made (not expected: the parameters are
    /// fixed).
    pub fn new(label: &str) -> Result<Self, GenerateError> {
        let key = hex::encode(rand::random::<[u8; KEY_BYTES]>());
        Self::with_key(label, key.as_bytes())
    }

    /// A generation around the HMAC `key` with a new CA and leaf, whose common names carry the
    /// key's id.
    ///
    /// # Errors
    /// [`GenerateError`] as [`Generation::new`].
    fn with_key(label: &str, key: &[u8]) -> Result<Self, GenerateError> {
        use rcgen::{
            BasicConstraints, CertificateParams, DistinguishedName, DnType,
            ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
        };
        let name = |cn: String| {
            let mut dn = DistinguishedName::new();
            dn.push(DnType::CommonName, cn);
            dn
        };
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.distinguished_name = name(format!("tether peer CA {label} {}", key_id(key)));
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate()?;
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let mut leaf = CertificateParams::new(vec![PEER_SERVER_NAME.to_owned()])?;
        leaf.distinguished_name = name(format!("tether peer {label}"));
        leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        leaf.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let leaf_key = KeyPair::generate()?;
        let leaf_cert = leaf.signed_by(&leaf_key, &issuer)?;
        Ok(Self {
            key: key.to_vec(),
            ca_pem: ca_cert.pem(),
            cert_pem: leaf_cert.pem(),
            key_pem: leaf_key.serialize_pem(),
        })
    }

    /// This generation's key id.
    pub fn id(&self) -> String {
        key_id(&self.key)
    }

    /// The files of a key-ring directory holding only this generation as current: `(file name,
    /// content)` for [`CURRENT_KEY`], [`TLS_CERT`], [`TLS_KEY`] and [`CA_BUNDLE`].
    pub fn files(&self) -> [(&'static str, Vec<u8>); 4] {
        [
            (CURRENT_KEY, self.key.clone()),
            (TLS_CERT, self.cert_pem.clone().into_bytes()),
            (TLS_KEY, self.key_pem.clone().into_bytes()),
            (CA_BUNDLE, self.ca_pem.clone().into_bytes()),
        ]
    }
}

/// What one sidecar loaded and how many of its sessions each key minted: its admin port's
/// `GET /keys` answer (JSON, camelCase), read by the operator during a rotation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyReport {
    /// Id of the key the sidecar signs with.
    pub current: String,
    /// Id of the previous key, when the ring holds one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// Id of the staged next key, when the ring holds one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// Sessions held or still forwarding here, by the id of the key that minted them.
    #[serde(default)]
    pub sessions: BTreeMap<String, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_ids_are_short_stable_and_distinct() {
        let id = key_id(b"0123456789abcdef");
        assert_eq!(id.len(), KEY_ID_LEN);
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_eq!(id, key_id(b"0123456789abcdef"));
        assert_ne!(id, key_id(b"0123456789abcdeg"));
        assert_eq!(
            id,
            key_id(b" 0123456789abcdef\n"),
            "surrounding whitespace is not part of the key"
        );
        assert_eq!(key_material(b"\t\x0cab c\r\n"), b"ab c");
    }

    #[test]
    fn a_generation_holds_a_ca_a_leaf_and_a_fresh_key() {
        let a = Generation::new("ns/ep").unwrap();
        let b = Generation::new("ns/ep").unwrap();
        assert_eq!(a.key.len(), 2 * KEY_BYTES);
        assert!(
            a.key.iter().all(u8::is_ascii_hexdigit),
            "text, nothing to trim"
        );
        assert_ne!(a.key, b.key, "keys are random");
        assert_ne!(a.id(), b.id());
        assert!(a.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(a.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(a.key_pem.contains("PRIVATE KEY"));
        assert_ne!(a.ca_pem, a.cert_pem);
        let names: Vec<&str> = a.files().iter().map(|(n, _)| *n).collect();
        assert_eq!(names, [CURRENT_KEY, TLS_CERT, TLS_KEY, CA_BUNDLE]);
        assert!(
            !format!("{a:?}").contains("PRIVATE"),
            "Debug hides the keys"
        );
    }

    #[test]
    fn a_generation_around_a_given_key_keeps_it() {
        let key = [9_u8; KEY_BYTES];
        let kept = Generation::with_key("ns/ep", &key).unwrap();
        assert_eq!(kept.key, key);
        assert_eq!(kept.id(), key_id(&key));
        let other = Generation::with_key("ns/ep", &key).unwrap();
        assert_ne!(
            kept.ca_pem, other.ca_pem,
            "each generation has a CA of its own"
        );
    }

    #[test]
    fn a_key_report_round_trips_in_camel_case() {
        let report = KeyReport {
            current: "aaaaaaaa".into(),
            previous: Some("bbbbbbbb".into()),
            next: None,
            sessions: [("bbbbbbbb".to_owned(), 3)].into(),
        };
        let text = serde_json::to_string(&report).unwrap();
        assert_eq!(
            text,
            r#"{"current":"aaaaaaaa","previous":"bbbbbbbb","sessions":{"bbbbbbbb":3}}"#
        );
        assert_eq!(serde_json::from_str::<KeyReport>(&text).unwrap(), report);
    }
}
