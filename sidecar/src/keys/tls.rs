//! The peer TLS material of one key-ring load (`docs/design/peer-protocol.md#transport`): the
//! certificate this sidecar presents, the CA bundle a peer's certificate must chain to, and the
//! rustls configurations built from them once, at load, for the three places that speak TLS to
//! peers: the peer listener ([`PeerTls::server`]), the handoff client ([`PeerTls::client`]) and
//! pingora's forwards ([`PeerTls::cert_key`], [`PeerTls::ca`]).
//!
//! Both sides authenticate: the listener asks every client for a certificate of the bundle, the
//! clients check the listener's against the same bundle and the name
//! [`tether_crds::keyring::PEER_SERVER_NAME`] (peers are dialled by IP, so the name is the
//! endpoint's, not a host's).

use std::sync::Arc;

use pingora::utils::tls::CertKey;
use pingora::utils::tls::WrappedX509;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// ALPN of the peer port, in the order it prefers them: HTTP/2 (pingora's forwards), then
/// HTTP/1.1 (the handoff client, sidecars that offer only it).
const ALPN_PEER: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// The TLS material and configurations of one load.
pub(crate) struct PeerTls {
    /// The listener's configuration: presents the certificate, requires a client certificate
    /// of the bundle.
    pub(crate) server: Arc<ServerConfig>,
    /// The handoff client's configuration: presents the certificate, trusts only the bundle.
    pub(crate) client: Arc<ClientConfig>,
    /// The certificate and key in pingora's form, for forwards (`HttpPeer::client_cert_key`).
    pub(crate) cert_key: Arc<CertKey>,
    /// The CA bundle in pingora's form (`HttpPeer::options.ca`).
    pub(crate) ca: Arc<[WrappedX509]>,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerTls(<redacted>)")
    }
}

/// The crypto provider of every peer TLS configuration (ring, as pingora's and kube's).
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes ring the process's default rustls provider (pingora's connector builds its client
/// configurations with the default); harmless when one is installed already.
pub(crate) fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl PeerTls {
    /// Builds the material from the PEM texts of the certificate (`cert`, the leaf first), its
    /// private key (`key`) and the CA bundle (`ca`).
    ///
    /// # Errors
    /// A message naming what is wrong: a PEM that holds no certificate or key, a key that does
    /// not match the certificate, a certificate that does not chain to the bundle (checked as a
    /// peer would check it), or a rustls error.
    pub(crate) fn from_pem(cert: &[u8], key: &[u8], ca: &[u8]) -> Result<Self, String> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("tls.crt: {e}"))?;
        if chain.is_empty() {
            return Err("tls.crt holds no certificate".into());
        }
        let private = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("tls.key: {e}"))?;
        let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(ca)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("ca.crt: {e}"))?;
        if cas.is_empty() {
            return Err("ca.crt holds no certificate".into());
        }
        let mut roots = RootCertStore::empty();
        for cert in &cas {
            roots
                .add(cert.clone())
                .map_err(|e| format!("ca.crt: {e}"))?;
        }
        let roots = Arc::new(roots);
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), provider())
            .build()
            .map_err(|e| format!("ca.crt: {e}"))?;
        // The certificate must be one a peer accepts: checked here as the listener checks it.
        verifier
            .verify_client_cert(&chain[0], &chain[1..], UnixTime::now())
            .map_err(|e| format!("tls.crt does not chain to ca.crt: {e}"))?;
        let mut server = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), private.clone_key())
            .map_err(|e| format!("tls.key does not fit tls.crt: {e}"))?;
        server.alpn_protocols = ALPN_PEER.iter().map(|p| p.to_vec()).collect();
        // No resumption tickets: peers keep their connections pooled, and a ticket written
        // after the handshake would look like an answer to no request.
        server.send_tls13_tickets = 0;
        // No ALPN here: hyper-rustls sets it from the connector's protocols.
        let client = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(Arc::clone(&roots))
            .with_client_auth_cert(chain.clone(), private.clone_key())
            .map_err(|e| format!("tls.key does not fit tls.crt: {e}"))?;
        let cert_key = CertKey::new(
            chain.iter().map(|c| c.as_ref().to_vec()).collect(),
            private.secret_der().to_vec(),
        );
        let ca = cas
            .iter()
            .map(|c| WrappedX509::new(c.as_ref().to_vec(), pingora::utils::tls::parse_x509))
            .collect();
        Ok(Self {
            server: Arc::new(server),
            client: Arc::new(client),
            cert_key: Arc::new(cert_key),
            ca,
        })
    }
}

/// The TLS server name every peer certificate carries.
pub(crate) fn server_name() -> ServerName<'static> {
    ServerName::try_from(tether_crds::keyring::PEER_SERVER_NAME)
        .unwrap_or_else(|_| unreachable!("a valid DNS name"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_crds::keyring::Generation;

    #[test]
    fn a_generation_builds_and_mismatched_files_are_refused() {
        let g = Generation::new("ns/ep").unwrap();
        let other = Generation::new("ns/ep").unwrap();
        assert!(
            PeerTls::from_pem(
                g.cert_pem.as_bytes(),
                g.key_pem.as_bytes(),
                g.ca_pem.as_bytes()
            )
            .is_ok()
        );
        let bundle = format!("{}{}", other.ca_pem, g.ca_pem);
        assert!(
            PeerTls::from_pem(
                g.cert_pem.as_bytes(),
                g.key_pem.as_bytes(),
                bundle.as_bytes()
            )
            .is_ok(),
            "a bundle of two CAs (a rotation) trusts either"
        );
        let foreign_ca = PeerTls::from_pem(
            g.cert_pem.as_bytes(),
            g.key_pem.as_bytes(),
            other.ca_pem.as_bytes(),
        )
        .unwrap_err();
        assert!(foreign_ca.contains("does not chain"), "{foreign_ca}");
        let wrong_key = PeerTls::from_pem(
            g.cert_pem.as_bytes(),
            other.key_pem.as_bytes(),
            g.ca_pem.as_bytes(),
        )
        .unwrap_err();
        assert!(wrong_key.contains("does not fit"), "{wrong_key}");
        let empty = PeerTls::from_pem(b"", g.key_pem.as_bytes(), g.ca_pem.as_bytes()).unwrap_err();
        assert!(empty.contains("no certificate"), "{empty}");
    }
}
