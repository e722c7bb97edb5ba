//! Authentication of peer-protocol messages (`docs/design/peer-protocol.md#authentication`), and
//! of their answers.
//!
//! A request is signed over its method, path, sender, receiver, time, nonce, length and body
//! digest ([`sign`]); the receiver checks all of it on the request head alone ([`check`]), so
//! nothing is spent on a message that is not a peer's, then checks the body against the digest
//! as it arrives ([`BodyCheck`]). Every answer carries an acknowledgement MAC over the receiver,
//! the nonce, the digest and the status ([`ack`]); a sender counts an answer only when it
//! verifies ([`verify_ack`]). MACs name their key ([`KeyId`]), signed with the current key and
//! verified with the one named.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use sha2::{Digest, Sha256};

use crate::keys::{Key, KeyId, KeyRing};

/// The sender's pod UID.
pub(crate) const TETHER_PEER: HeaderName = HeaderName::from_static("tether-peer");
/// The receiver's pod UID.
pub(crate) const TETHER_PEER_TO: HeaderName = HeaderName::from_static("tether-peer-to");
/// Unix time of the message, in milliseconds (in a 401, the receiver's own).
pub(crate) const TETHER_PEER_TIME: HeaderName = HeaderName::from_static("tether-peer-time");
/// 16 random bytes, base64url.
pub(crate) const TETHER_PEER_NONCE: HeaderName = HeaderName::from_static("tether-peer-nonce");
/// base64url SHA-256 of the body.
pub(crate) const TETHER_PEER_DIGEST: HeaderName = HeaderName::from_static("tether-peer-digest");
/// `<key id>:<base64url MAC>` of the request.
pub(crate) const TETHER_PEER_MAC: HeaderName = HeaderName::from_static("tether-peer-mac");
/// `<key id>:<base64url MAC>` of the answer (the acknowledgement).
pub(crate) const TETHER_PEER_ACK: HeaderName = HeaderName::from_static("tether-peer-ack");
/// Largest distance between a message's time and the receiver's clock.
pub(crate) const WINDOW: Duration = Duration::from_secs(30);
/// Domain label of request MACs.
const DOMAIN_REQUEST: &[u8] = b"tether/peer/v2";
/// Domain label of acknowledgement MACs.
const DOMAIN_ACK: &[u8] = b"tether/peer-ack/v2";
/// Bytes of a nonce.
const NONCE_LEN: usize = 16;

/// Unix time now, in milliseconds.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A nonce: 16 random bytes.
pub(crate) type Nonce = [u8; NONCE_LEN];

/// A signed request's headers, and what its answer must acknowledge.
#[derive(Debug)]
pub(crate) struct Signed {
    /// The headers to send (`Content-Length` included).
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    /// The nonce the acknowledgement must name.
    pub(crate) nonce: Nonce,
    /// The body digest the acknowledgement must name.
    pub(crate) digest: [u8; 32],
}

/// The signed fields of a request, as [`message`] lays them out.
struct Fields<'a> {
    method: &'a str,
    path: &'a str,
    from: &'a str,
    to: &'a str,
    time: u64,
    nonce: &'a str,
    length: u64,
    digest: &'a str,
}

fn message(f: &Fields<'_>) -> Vec<u8> {
    format!(
        "{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}",
        f.method, f.path, f.from, f.to, f.time, f.nonce, f.length, f.digest
    )
    .into_bytes()
}

fn ack_message(to: &str, nonce: &str, digest: &str, status: StatusCode) -> Vec<u8> {
    format!("{to}\n{nonce}\n{digest}\n{}", status.as_u16()).into_bytes()
}

/// `<key id>:<base64url tag>`.
fn tagged(key: &Key, tag: &[u8]) -> String {
    format!("{}:{}", key.id(), URL_SAFE_NO_PAD.encode(tag))
}

/// Splits `<key id>:<base64url tag>` and finds the key in `keys`.
fn untag(keys: &KeyRing, value: &str) -> Option<(Arc<Key>, Vec<u8>)> {
    let (id, tag) = value.split_once(':')?;
    let key = keys.get(KeyId::parse(id)?)?;
    Some((key, URL_SAFE_NO_PAD.decode(tag).ok()?))
}

fn header_value(text: String) -> HeaderValue {
    // Every value is base64url, hex, digits or a UID (visible ASCII, checked by membership).
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Signs a request of `method` to `path` from pod `from` to pod `to` with `body`, at Unix time
/// `time_ms`, with the current key of `keys`.
pub(crate) fn sign(
    keys: &KeyRing,
    method: &Method,
    path: &str,
    from: &str,
    to: &str,
    body: &[u8],
    time_ms: u64,
) -> Signed {
    let nonce: Nonce = rand::random();
    let digest: [u8; 32] = Sha256::digest(body).into();
    let (nonce_text, digest_text) = (
        URL_SAFE_NO_PAD.encode(nonce),
        URL_SAFE_NO_PAD.encode(digest),
    );
    let length = body.len() as u64;
    let key = keys.current();
    let mac = key.mac(
        DOMAIN_REQUEST,
        &message(&Fields {
            method: method.as_str(),
            path,
            from,
            to,
            time: time_ms,
            nonce: &nonce_text,
            length,
            digest: &digest_text,
        }),
    );
    let headers = vec![
        (TETHER_PEER, header_value(from.to_owned())),
        (TETHER_PEER_TO, header_value(to.to_owned())),
        (TETHER_PEER_TIME, header_value(time_ms.to_string())),
        (TETHER_PEER_NONCE, header_value(nonce_text)),
        (TETHER_PEER_DIGEST, header_value(digest_text)),
        (header::CONTENT_LENGTH, header_value(length.to_string())),
        (TETHER_PEER_MAC, header_value(tagged(&key, &mac))),
    ];
    Signed {
        headers,
        nonce,
        digest,
    }
}

/// Why a request head was refused, before anything was spent on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    /// A header is missing or malformed (401).
    #[error("missing or malformed {0} header")]
    Header(&'static str),
    /// The key is not in the ring, or the MAC does not verify (401).
    #[error("the message MAC does not verify")]
    Mac,
    /// The message is for another pod (421).
    #[error("the message is addressed to another pod")]
    Misaddressed,
    /// The time is too far from this pod's clock (401, with this pod's time).
    #[error("message time is {0} ms away from this pod's clock")]
    Skew(u64),
    /// The announced length is over the limit (413).
    #[error("messages are limited to {0} bytes")]
    TooLarge(usize),
}

impl Refused {
    /// The answer's status.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Self::Header(_) | Self::Mac | Self::Skew(_) => StatusCode::UNAUTHORIZED,
            Self::Misaddressed => StatusCode::MISDIRECTED_REQUEST,
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }

    /// Why the message was refused, as counted in `tether_peer_auth_failures_total{reason}`.
    pub(crate) fn failure(&self) -> AuthFailure {
        match self {
            Self::Header(_) => AuthFailure::Header,
            Self::Mac => AuthFailure::Mac,
            Self::Misaddressed => AuthFailure::Misaddressed,
            Self::Skew(_) => AuthFailure::Skew,
            Self::TooLarge(_) => AuthFailure::MessageTooLarge,
        }
    }

    /// The reason label (answer body and `tether_peer_auth_failures_total{reason}`).
    pub(crate) fn reason(&self) -> &'static str {
        self.failure().label()
    }
}

/// Why a peer message or connection was refused before anything was spent on it
/// (`tether_peer_auth_failures_total{reason}`): a [`Refused`] head, or what the listeners find.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::VariantArray)]
pub(crate) enum AuthFailure {
    /// A missing or malformed header.
    Header,
    /// The key is not in the ring, or the MAC does not verify.
    Mac,
    /// The message is for another pod.
    Misaddressed,
    /// The message time is too far from this pod's clock.
    Skew,
    /// The announced length is over the limit.
    MessageTooLarge,
    /// A nonce seen within the time window.
    Replayed,
    /// The body does not match the digest its head announced.
    DigestMismatch,
    /// The TLS handshake failed or took too long.
    Tls,
    /// A connection that did not start a TLS handshake on a TLS peer port.
    Plaintext,
}

impl AuthFailure {
    /// The `reason` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Header => "header",
            Self::Mac => "mac",
            Self::Misaddressed => "misaddressed",
            Self::Skew => "skew",
            Self::MessageTooLarge => "message_too_large",
            Self::Replayed => "replayed",
            Self::DigestMismatch => "digest_mismatch",
            Self::Tls => "tls",
            Self::Plaintext => "plaintext",
        }
    }
}

/// What a verified head says: the body still has to match it ([`BodyCheck`]).
#[derive(Debug)]
pub(crate) struct Claim {
    /// The sender's pod UID.
    pub(crate) from: String,
    /// The nonce (replays are refused by [`super::nonces::Nonces`]).
    pub(crate) nonce: Nonce,
    /// The announced body digest.
    pub(crate) digest: [u8; 32],
    /// The announced body length, in bytes.
    pub(crate) length: usize,
}

/// Checks a request head of `method` to `path` for pod `me`, at this pod's Unix time `now_ms`,
/// with bodies of at most `max_length` bytes: every signed field is there and well formed, the
/// MAC verifies with the key it names, the receiver is `me`, the time is within [`WINDOW`] and the
/// length within the limit.
///
/// # Errors
/// [`Refused`], in that order of checks.
pub(crate) fn check(
    keys: &KeyRing,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    me: &str,
    now_ms: u64,
    max_length: usize,
) -> Result<Claim, Refused> {
    let text = |name: &HeaderName, label| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .ok_or(Refused::Header(label))
    };
    let from = text(&TETHER_PEER, "Tether-Peer")?;
    let to = text(&TETHER_PEER_TO, "Tether-Peer-To")?;
    let time_text = text(&TETHER_PEER_TIME, "Tether-Peer-Time")?;
    let time: u64 = time_text
        .parse()
        .map_err(|_| Refused::Header("Tether-Peer-Time"))?;
    let nonce_text = text(&TETHER_PEER_NONCE, "Tether-Peer-Nonce")?;
    let nonce: Nonce = URL_SAFE_NO_PAD
        .decode(nonce_text)
        .ok()
        .and_then(|n| n.try_into().ok())
        .ok_or(Refused::Header("Tether-Peer-Nonce"))?;
    let digest_text = text(&TETHER_PEER_DIGEST, "Tether-Peer-Digest")?;
    let digest: [u8; 32] = URL_SAFE_NO_PAD
        .decode(digest_text)
        .ok()
        .and_then(|d| d.try_into().ok())
        .ok_or(Refused::Header("Tether-Peer-Digest"))?;
    let length: u64 = text(&header::CONTENT_LENGTH, "Content-Length")?
        .parse()
        .map_err(|_| Refused::Header("Content-Length"))?;
    let (key, tag) = untag(keys, text(&TETHER_PEER_MAC, "Tether-Peer-Mac")?).ok_or(Refused::Mac)?;
    let fields = Fields {
        method: method.as_str(),
        path,
        from,
        to,
        time,
        nonce: nonce_text,
        length,
        digest: digest_text,
    };
    if tag.len() != 32 || !key.verify(DOMAIN_REQUEST, &message(&fields), &tag) {
        return Err(Refused::Mac);
    }
    if to != me {
        return Err(Refused::Misaddressed);
    }
    let skew = now_ms.abs_diff(time);
    if u128::from(skew) > WINDOW.as_millis() {
        return Err(Refused::Skew(skew));
    }
    let length = usize::try_from(length)
        .ok()
        .filter(|&l| l <= max_length)
        .ok_or(Refused::TooLarge(max_length))?;
    Ok(Claim {
        from: from.to_owned(),
        nonce,
        digest,
        length,
    })
}

/// Hashes a body as it arrives and checks it against its [`Claim`].
pub(crate) struct BodyCheck {
    hasher: Sha256,
    read: usize,
    length: usize,
    digest: [u8; 32],
}

impl BodyCheck {
    /// A check of a body announced by `claim`.
    pub(crate) fn new(claim: &Claim) -> Self {
        Self {
            hasher: Sha256::new(),
            read: 0,
            length: claim.length,
            digest: claim.digest,
        }
    }

    /// Takes the next chunk; `false` once the body is longer than announced.
    pub(crate) fn update(&mut self, chunk: &[u8]) -> bool {
        self.read += chunk.len();
        self.hasher.update(chunk);
        self.read <= self.length
    }

    /// Whether the whole body was the announced one.
    pub(crate) fn matches(self) -> bool {
        self.read == self.length && <[u8; 32]>::from(self.hasher.finalize()) == self.digest
    }
}

/// The acknowledgement header of an answer with `status` from pod `me` to the request with
/// `nonce` and body `digest`, signed with the current key of `keys`.
pub(crate) fn ack(
    keys: &KeyRing,
    me: &str,
    nonce: &Nonce,
    digest: &[u8; 32],
    status: StatusCode,
) -> HeaderValue {
    let key = keys.current();
    let mac = key.mac(
        DOMAIN_ACK,
        &ack_message(
            me,
            &URL_SAFE_NO_PAD.encode(nonce),
            &URL_SAFE_NO_PAD.encode(digest),
            status,
        ),
    );
    header_value(tagged(&key, &mac))
}

/// Whether an answer with `status` and `headers` acknowledges, from pod `to`, the request
/// `signed`: its acknowledgement verifies for exactly that receiver, nonce, digest and status.
pub(crate) fn verify_ack(
    keys: &KeyRing,
    headers: &HeaderMap,
    to: &str,
    signed: &Signed,
    status: StatusCode,
) -> bool {
    let Some((key, tag)) = headers
        .get(&TETHER_PEER_ACK)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| untag(keys, v))
    else {
        return false;
    };
    tag.len() == 32
        && key.verify(
            DOMAIN_ACK,
            &ack_message(
                to,
                &URL_SAFE_NO_PAD.encode(signed.nonce),
                &URL_SAFE_NO_PAD.encode(signed.digest),
                status,
            ),
            &tag,
        )
}

/// The receiver's clock in a 401 `skew` answer: the sender's correction, in milliseconds to
/// add to its own clock (`None` when the answer carries no usable time).
pub(crate) fn skew_correction(headers: &HeaderMap, sent_at_ms: u64) -> Option<i64> {
    let theirs: i64 = headers
        .get(&TETHER_PEER_TIME)?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    Some(theirs - i64::try_from(sent_at_ms).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Ring;

    const MAX: usize = 1 << 20;

    fn keys() -> KeyRing {
        KeyRing::from_bytes(*b"0123456789abcdef0123")
    }

    fn head(signed: &Signed) -> HeaderMap {
        signed.headers.iter().cloned().collect()
    }

    fn check_at(keys: &KeyRing, h: &HeaderMap, me: &str, now: u64) -> Result<Claim, Refused> {
        check(keys, &Method::POST, "/v2/sessions", h, me, now, MAX)
    }

    #[test]
    fn a_signed_head_verifies_and_every_field_is_covered() {
        let k = keys();
        let now = now_ms();
        let signed = sign(
            &k,
            &Method::POST,
            "/v2/sessions",
            "pod-a",
            "pod-b",
            b"{}",
            now,
        );
        let h = head(&signed);
        let claim = check_at(&k, &h, "pod-b", now).unwrap();
        assert_eq!(claim.from, "pod-a");
        assert_eq!(claim.length, 2);
        let mut body = BodyCheck::new(&claim);
        assert!(body.update(b"{}"));
        assert!(body.matches());
        // Each signed header changed on its own breaks the MAC.
        for (name, other) in [
            (TETHER_PEER, "pod-x"),
            (TETHER_PEER_TO, "pod-x"),
            (TETHER_PEER_TIME, "1"),
            (TETHER_PEER_NONCE, "AAAAAAAAAAAAAAAAAAAAAA"),
            (
                TETHER_PEER_DIGEST,
                "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            ),
            (header::CONTENT_LENGTH, "3"),
        ] {
            let mut tampered = h.clone();
            tampered.insert(name.clone(), HeaderValue::from_static(other));
            assert_eq!(
                check_at(&k, &tampered, "pod-b", now).unwrap_err(),
                Refused::Mac,
                "{name} is signed"
            );
        }
        assert_eq!(
            check(&k, &Method::POST, "/v2/tail", &h, "pod-b", now, MAX).unwrap_err(),
            Refused::Mac,
            "the path is signed"
        );
        assert_eq!(
            check(&k, &Method::PUT, "/v2/sessions", &h, "pod-b", now, MAX).unwrap_err(),
            Refused::Mac,
            "the method is signed"
        );
        let foreign = KeyRing::from_bytes(*b"another key, 20bytes");
        assert_eq!(
            check_at(&foreign, &h, "pod-b", now).unwrap_err(),
            Refused::Mac
        );
        assert_eq!(
            check_at(&k, &HeaderMap::new(), "pod-b", now).unwrap_err(),
            Refused::Header("Tether-Peer")
        );
    }

    #[test]
    fn misaddressed_stale_and_oversized_heads_are_refused() {
        let k = keys();
        let now = now_ms();
        let h = head(&sign(
            &k,
            &Method::POST,
            "/v2/sessions",
            "a",
            "b",
            b"{}",
            now,
        ));
        assert_eq!(
            check_at(&k, &h, "c", now).unwrap_err(),
            Refused::Misaddressed
        );
        let late = now + WINDOW.as_millis() as u64 + 1;
        assert!(matches!(check_at(&k, &h, "b", late), Err(Refused::Skew(_))));
        assert_eq!(
            check(&k, &Method::POST, "/v2/sessions", &h, "b", now, 1).unwrap_err(),
            Refused::TooLarge(1)
        );
        assert_eq!(
            Refused::Misaddressed.status(),
            StatusCode::MISDIRECTED_REQUEST
        );
    }

    #[test]
    fn a_body_other_than_the_signed_one_does_not_match() {
        let k = keys();
        let now = now_ms();
        let h = head(&sign(&k, &Method::POST, "/v2/tail", "a", "b", b"abcd", now));
        let claim = check(&k, &Method::POST, "/v2/tail", &h, "b", now, MAX).unwrap();
        let mut other = BodyCheck::new(&claim);
        assert!(other.update(b"abce"));
        assert!(!other.matches());
        let mut longer = BodyCheck::new(&claim);
        assert!(!longer.update(b"abcde"), "longer than announced");
        let mut shorter = BodyCheck::new(&claim);
        assert!(shorter.update(b"abc"));
        assert!(!shorter.matches());
    }

    #[test]
    fn acknowledgements_bind_receiver_nonce_digest_and_status() {
        let k = keys();
        let signed = sign(&k, &Method::POST, "/v2/sessions", "a", "b", b"{}", now_ms());
        let mut answer = HeaderMap::new();
        answer.insert(
            TETHER_PEER_ACK,
            ack(&k, "b", &signed.nonce, &signed.digest, StatusCode::OK),
        );
        assert!(verify_ack(&k, &answer, "b", &signed, StatusCode::OK));
        assert!(
            !verify_ack(&k, &answer, "c", &signed, StatusCode::OK),
            "another receiver"
        );
        assert!(
            !verify_ack(&k, &answer, "b", &signed, StatusCode::SERVICE_UNAVAILABLE),
            "another status"
        );
        let other = sign(&k, &Method::POST, "/v2/sessions", "a", "b", b"{}", now_ms());
        assert!(
            !verify_ack(&k, &answer, "b", &other, StatusCode::OK),
            "another nonce"
        );
        assert!(
            !verify_ack(&k, &HeaderMap::new(), "b", &signed, StatusCode::OK),
            "a 200 without an acknowledgement counts for nothing"
        );
    }

    #[test]
    fn a_message_signed_with_the_previous_key_verifies_during_a_rotation() {
        let old = KeyRing::from_bytes(*b"the previous key 0123");
        let rotated = KeyRing::fixed(Ring::rotated(
            Key::new(*b"the current key 01234"),
            Some(Key::new(*b"the previous key 0123")),
        ));
        let now = now_ms();
        let h = head(&sign(&old, &Method::POST, "/v2/tail", "a", "b", b"x", now));
        assert!(check(&rotated, &Method::POST, "/v2/tail", &h, "b", now, MAX).is_ok());
        let h = head(&sign(
            &rotated,
            &Method::POST,
            "/v2/tail",
            "a",
            "b",
            b"x",
            now,
        ));
        assert_eq!(
            check(&old, &Method::POST, "/v2/tail", &h, "b", now, MAX).unwrap_err(),
            Refused::Mac,
            "a ring without the new key refuses it (hence the staged step)"
        );
    }

    #[test]
    fn a_skew_answer_gives_the_correction() {
        let mut h = HeaderMap::new();
        h.insert(TETHER_PEER_TIME, HeaderValue::from_static("5000"));
        assert_eq!(skew_correction(&h, 3000), Some(2000));
        assert_eq!(skew_correction(&HeaderMap::new(), 3000), None);
    }
}
