//! The principal a session is bound to (`spec.auth.binding`, MCP security best practice: bind
//! sessions to the user, never use them for authentication).
//!
//! A [`Principal`] is a keyed digest (16 bytes of HMAC-SHA256, domain `tether/principal/v1`)
//! of what identifies the caller of a request, from its credential headers
//! (`spec.auth.forwardHeaders`): for `SubjectAndClient`, the `iss` and `sub` claims of a JWT
//! bearer token and the client it was issued to (`azp`, else `client_id`, RFC 9068); for
//! `Subject`, `iss` and `sub` only — decoded, not verified (the MCP server verifies the token; a
//! forged one it refuses) — else the credential itself; for `Credential`, the credential itself. A request without
//! credentials has no principal. Credentials and claims never leave this module, only the
//! digest: it is what the session keeps, compares and hands to a peer.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderMap, HeaderName, header};
use serde::Deserialize;
use tether_crds::AuthBinding;

use crate::keys::{DOMAIN_PRINCIPAL, Key};

/// Bytes of the digest kept.
const DIGEST_LEN: usize = 16;

/// A keyed digest of a caller's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Principal(pub(crate) [u8; DIGEST_LEN]);

impl Principal {
    /// Hex form (32 characters), as a handoff image carries it.
    pub(crate) fn to_hex(self) -> String {
        hex::encode(self.0)
    }

    /// Parses [`Principal::to_hex`]; `None` for anything else.
    pub(crate) fn from_hex(text: &str) -> Option<Self> {
        let bytes = hex::decode(text).ok()?;
        Some(Self(bytes.try_into().ok()?))
    }
}

/// What a session is bound to, fixed at its `initialize`: the binding then in force and the
/// principal of its caller (`None`: it presented no credential).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Binding {
    /// `spec.auth.binding` at the session's `initialize` (never [`AuthBinding::None`]).
    pub(crate) kind: AuthBinding,
    /// The caller's principal.
    pub(crate) principal: Option<Principal>,
}

impl Binding {
    /// The binding of a session whose `initialize` carried `headers`; `None` when
    /// `binding` is [`AuthBinding::None`].
    pub(crate) fn of(
        headers: &HeaderMap,
        names: &[HeaderName],
        binding: AuthBinding,
        key: &Key,
    ) -> Option<Self> {
        (binding != AuthBinding::None).then(|| Self {
            kind: binding,
            principal: principal(headers, names, binding, key),
        })
    }

    /// Whether a request with `headers` presents the session's principal.
    pub(crate) fn admits(&self, headers: &HeaderMap, names: &[HeaderName], key: &Key) -> bool {
        principal(headers, names, self.kind, key) == self.principal
    }

    /// The form a handoff image carries: `<kind>:anonymous` or `<kind>:<hex>`, the kind one of
    /// `subject-client`, `subject`, `credential`.
    pub(crate) fn to_image(self) -> String {
        let kind = match self.kind {
            AuthBinding::Credential => "credential",
            AuthBinding::Subject => "subject",
            _ => "subject-client",
        };
        match self.principal {
            None => format!("{kind}:anonymous"),
            Some(p) => format!("{kind}:{}", p.to_hex()),
        }
    }

    /// Parses [`Binding::to_image`]; `None` for anything else.
    pub(crate) fn from_image(text: &str) -> Option<Self> {
        let (kind, principal) = text.split_once(':')?;
        let kind = match kind {
            "subject-client" => AuthBinding::SubjectAndClient,
            "subject" => AuthBinding::Subject,
            "credential" => AuthBinding::Credential,
            _ => return None,
        };
        let principal = match principal {
            "anonymous" => None,
            hex => Some(Principal::from_hex(hex)?),
        };
        Some(Self { kind, principal })
    }
}

/// The claims that name a token's subject and the client it was issued to.
#[derive(Deserialize)]
struct Subject {
    #[serde(default)]
    iss: Option<String>,
    sub: String,
    /// OpenID Connect's authorized party.
    #[serde(default)]
    azp: Option<String>,
    /// The client of an OAuth 2.0 access token in JWT form (RFC 9068).
    #[serde(default)]
    client_id: Option<String>,
}

/// The principal of a request with `headers` under `binding`, keyed by `key` (the key of the
/// session's id: a session's digests never change with a rotation): `None` for a
/// request without credentials, and always with [`AuthBinding::None`].
pub(crate) fn principal(
    headers: &HeaderMap,
    names: &[HeaderName],
    binding: AuthBinding,
    key: &Key,
) -> Option<Principal> {
    let message = identity(headers, names, binding)?;
    let mac = key.mac(DOMAIN_PRINCIPAL, &message);
    let mut digest = [0; DIGEST_LEN];
    digest.copy_from_slice(&mac[..DIGEST_LEN]);
    Some(Principal(digest))
}

/// Who may use a task id (`docs/design/tasks.md#owners`): the identity of the principal whose
/// request the task's ids were minted for, sealed into them; an id opens only for a request
/// presenting the same one. Empty: anonymous (or no binding), a principal of its own.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Owner(Vec<u8>);

impl Owner {
    /// The owner of requests without credentials (or of an endpoint without binding).
    pub(crate) const ANONYMOUS: Owner = Owner(Vec::new());

    /// An owner of these identity bytes (tests).
    #[cfg(test)]
    pub(crate) fn from_bytes(bytes: &[u8]) -> Self {
        Self(bytes.to_vec())
    }

    /// The owner of a 2026-07-28 request with `headers`: what `binding` reads of its
    /// credentials (`iss`, `sub` and client of a JWT…), never kept beyond the request.
    pub(crate) fn of_request(
        headers: &HeaderMap,
        names: &[HeaderName],
        binding: AuthBinding,
    ) -> Self {
        Self(identity(headers, names, binding).unwrap_or_default())
    }

    /// The owner of tasks created in a session: the principal the session is bound to (its
    /// requests present it, or they are refused before this).
    pub(crate) fn of_session(binding: Option<Binding>) -> Self {
        let principal = binding.and_then(|b| b.principal);
        Self(principal.map_or_else(Vec::new, |p| {
            let mut owner = b"session\n".to_vec();
            owner.extend_from_slice(&p.0);
            owner
        }))
    }

    /// The bytes sealed into task ids.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// What identifies the caller of a request with `headers` under `binding`, the message its
/// [`Principal`] digests: `None` without credentials, and always with [`AuthBinding::None`].
fn identity(headers: &HeaderMap, names: &[HeaderName], binding: AuthBinding) -> Option<Vec<u8>> {
    if binding == AuthBinding::None {
        return None;
    }
    let subject = matches!(
        binding,
        AuthBinding::Subject | AuthBinding::SubjectAndClient
    )
    .then(|| jwt_claims::<Subject>(headers))
    .flatten();
    let message = match subject {
        Some(Subject {
            iss,
            sub,
            azp,
            client_id,
        }) => {
            let iss = iss.unwrap_or_default();
            match binding {
                AuthBinding::SubjectAndClient => {
                    let client = azp.or(client_id).unwrap_or_default();
                    format!("subject-client\n{iss}\n{sub}\n{client}").into_bytes()
                }
                _ => format!("subject\n{iss}\n{sub}").into_bytes(),
            }
        }
        None => {
            let mut message = b"credential".to_vec();
            let mut any = false;
            for name in names {
                for value in headers.get_all(name) {
                    message.push(b'\n');
                    message.extend_from_slice(name.as_str().as_bytes());
                    message.push(b':');
                    message.extend_from_slice(value.as_bytes());
                    any = true;
                }
            }
            if !any {
                return None;
            }
            message
        }
    };
    Some(message)
}

/// The `exp` claim of a JWT bearer token.
#[derive(Deserialize)]
struct Expiry {
    exp: u64,
}

/// When the JWT bearer token a request with `headers` presents expires: its `exp` claim, read,
/// not verified (a forged one the MCP server refused already, and a later expiry only lets the
/// server judge it again). `None` for other credentials, or a token without `exp`.
pub(crate) fn credential_expiry(headers: &HeaderMap) -> Option<std::time::SystemTime> {
    let Expiry { exp } = jwt_claims(headers)?;
    std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_secs(exp))
}

/// Whether the JWT bearer token a request with `headers` presents has expired by `now`.
pub(crate) fn credential_expired(headers: &HeaderMap, now: std::time::SystemTime) -> bool {
    credential_expiry(headers).is_some_and(|exp| exp <= now)
}

/// The claims of a JWT in `Authorization: Bearer`, when it is one (three base64url parts, the
/// middle one a JSON object) and they read as `T`.
fn jwt_claims<T: serde::de::DeserializeOwned>(headers: &HeaderMap) -> Option<T> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut parts = token.trim().split('.');
    let (_, payload, _) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let json = URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    serde_json::from_slice(&json).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: &serde_json::Value) -> String {
        let part = |v: &serde_json::Value| URL_SAFE_NO_PAD.encode(v.to_string());
        format!(
            "Bearer {}.{}.c2lnbmF0dXJl",
            part(&serde_json::json!({"alg": "HS256", "typ": "JWT"})),
            part(claims)
        )
    }

    fn of(authorization: Option<&str>, binding: AuthBinding) -> Option<Principal> {
        let mut headers = HeaderMap::new();
        if let Some(v) = authorization {
            headers.insert(header::AUTHORIZATION, v.parse().unwrap());
        }
        let key = Key::new("test-secret-0123456789");
        principal(&headers, &[header::AUTHORIZATION], binding, &key)
    }

    #[test]
    fn a_jwt_expires_at_its_exp_and_other_credentials_never() {
        let at = |v: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, v.parse().unwrap());
            headers
        };
        let token = at(&jwt(&serde_json::json!({"sub": "alice", "exp": 1_000})));
        let exp = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000);
        assert_eq!(credential_expiry(&token), Some(exp));
        assert!(!credential_expired(
            &token,
            exp - std::time::Duration::from_secs(1)
        ));
        assert!(credential_expired(&token, exp));
        for other in [
            at(&jwt(&serde_json::json!({"sub": "alice"}))),
            at(&jwt(&serde_json::json!({"sub": "alice", "exp": "soon"}))),
            at("Bearer opaque"),
            HeaderMap::new(),
        ] {
            assert_eq!(credential_expiry(&other), None);
            assert!(!credential_expired(&other, exp));
        }
    }

    #[test]
    fn subjects_are_iss_and_sub_of_a_jwt_else_the_credential() {
        let alice = jwt(&serde_json::json!({"iss": "https://idp", "sub": "alice", "exp": 1}));
        let alice_later = jwt(&serde_json::json!({"iss": "https://idp", "sub": "alice", "exp": 2}));
        let bob = jwt(&serde_json::json!({"iss": "https://idp", "sub": "bob", "exp": 1}));
        let other_iss = jwt(&serde_json::json!({"iss": "https://evil", "sub": "alice"}));
        let s = AuthBinding::Subject;
        assert!(of(Some(&alice), s).is_some());
        assert_eq!(
            of(Some(&alice), s),
            of(Some(&alice_later), s),
            "a refreshed token"
        );
        assert_ne!(of(Some(&alice), s), of(Some(&bob), s));
        assert_ne!(
            of(Some(&alice), s),
            of(Some(&other_iss), s),
            "same sub, other iss"
        );
        assert_eq!(of(None, s), None, "anonymous");
        assert_eq!(
            of(Some("Bearer opaque-1"), s),
            of(Some("Bearer opaque-1"), s)
        );
        assert_ne!(
            of(Some("Bearer opaque-1"), s),
            of(Some("Bearer opaque-2"), s)
        );
        assert_ne!(
            of(Some("Bearer not.a.jwt"), s),
            of(Some(&alice), s),
            "an undecodable token is a credential"
        );
        let c = AuthBinding::Credential;
        assert_ne!(
            of(Some(&alice), c),
            of(Some(&alice_later), c),
            "a refresh changes it"
        );
        assert_eq!(of(Some(&alice), AuthBinding::None), None);
        // The client a token was issued to: part of the default binding, not of `Subject`.
        let claims = |client: serde_json::Value| {
            let mut c = serde_json::json!({"iss": "https://idp", "sub": "alice", "exp": 1});
            c.as_object_mut()
                .unwrap()
                .extend(client.as_object().unwrap().clone());
            jwt(&c)
        };
        let desktop = claims(serde_json::json!({"azp": "desktop"}));
        let desktop_later = claims(serde_json::json!({"azp": "desktop", "exp": 2}));
        let agent = claims(serde_json::json!({"azp": "agent"}));
        let agent_rfc9068 = claims(serde_json::json!({"client_id": "agent"}));
        let sc = AuthBinding::SubjectAndClient;
        assert_eq!(of(Some(&desktop), sc), of(Some(&desktop_later), sc));
        assert_ne!(
            of(Some(&desktop), sc),
            of(Some(&agent), sc),
            "another client"
        );
        assert_eq!(of(Some(&agent), sc), of(Some(&agent_rfc9068), sc));
        assert_ne!(
            of(Some(&desktop), sc),
            of(Some(&alice), sc),
            "a token naming no client is not one naming a client"
        );
        assert_eq!(of(Some(&desktop), s), of(Some(&agent), s), "any client");
        assert_ne!(of(Some(&desktop), sc), of(Some(&desktop), s));
        let p = of(Some(&alice), s).unwrap();
        assert_eq!(Principal::from_hex(&p.to_hex()), Some(p));
        assert_eq!(Principal::from_hex("zz"), None);
        for binding in [
            Binding {
                kind: s,
                principal: Some(p),
            },
            Binding {
                kind: c,
                principal: None,
            },
            Binding {
                kind: sc,
                principal: Some(p),
            },
        ] {
            assert_eq!(Binding::from_image(&binding.to_image()), Some(binding));
        }
        assert_eq!(Binding::from_image("none:anonymous"), None);
    }
}
