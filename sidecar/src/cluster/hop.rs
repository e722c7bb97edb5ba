//! The hop headers of a request forwarded between sidecars: where it has been, signed by the
//! pod that forwarded it (`docs/design/routing.md#forwarding`,
//! `docs/design/peer-trust.md#hop-headers-protocol-2`).
//!
//! | header | protocol 2 | first protocol |
//! |---|---|---|
//! | `Tether-Hop` | hop number, 1 to [`MAX_HOPS`] | the same |
//! | `Tether-Visited` | comma-separated UIDs of the pods it passed | the same |
//! | `Tether-Hop-Time` | the sender's Unix time in milliseconds | — |
//! | `Tether-Hop-To` | the receiver's pod UID | — |
//! | `Tether-Hop-Mac` | `<key id>:<base64url 16 bytes>`, domain `tether/hop/v2`, over `"{hop}\n{visited}\n{session id}\n{time}\n{receiver}"` | base64url 16 bytes, domain `tether/hop/v1`, over `"{hop}\n{visited}\n{session id}"` |
//!
//! Protocol 2's arrive on the peer port only, where a request without them is refused; the first
//! protocol's on the MCP port only, while `--peer-min-protocol` is 1 ([`Accept`]). Either way a
//! header set that does not verify is 403 `forged_hop`, and never reaches the MCP server.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderMap, HeaderName, HeaderValue};
use std::time::Duration;

use crate::keys::{DOMAIN_HOP, KeyId, KeyRing};
use crate::mcp::rejection::Rejection;

/// Most hops a request takes between sidecars looking for the session's holder: the owner, the
/// owner among the settled pods, and the one before it (a session still on its way there,
/// `docs/design/routing.md#placement-and-routing`).
pub(crate) const MAX_WALK_HOPS: u8 = 3;
/// Most hops in all: the walk plus one "moved" forward from a holder that handed the session off.
pub(crate) const MAX_HOPS: u8 = 4;
/// The hop number of a forwarded request.
pub(crate) const TETHER_HOP: HeaderName = HeaderName::from_static("tether-hop");
/// Comma-separated UIDs of the pods a forwarded request already visited.
pub(crate) const TETHER_VISITED: HeaderName = HeaderName::from_static("tether-visited");
/// The signature of the hop headers.
pub(crate) const TETHER_HOP_MAC: HeaderName = HeaderName::from_static("tether-hop-mac");
/// The forwarding pod's Unix time, in milliseconds (protocol 2).
pub(crate) const TETHER_HOP_TIME: HeaderName = HeaderName::from_static("tether-hop-time");
/// The receiving pod's UID (protocol 2).
pub(crate) const TETHER_HOP_TO: HeaderName = HeaderName::from_static("tether-hop-to");
/// Every hop header, removed from what reaches the MCP server.
pub(crate) const HOP_HEADERS: [HeaderName; 5] = [
    TETHER_HOP,
    TETHER_VISITED,
    TETHER_HOP_MAC,
    TETHER_HOP_TIME,
    TETHER_HOP_TO,
];
/// Largest distance between a hop's time and the receiver's clock.
pub(crate) const HOP_WINDOW: Duration = Duration::from_secs(10);
/// Domain label of protocol 2's hop MACs.
const DOMAIN_HOP_V2: &[u8] = b"tether/hop/v2";
const MAC_LEN: usize = 16;

/// Which hop headers a listener takes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Accept<'a> {
    /// The MCP port of a sidecar that speaks the first protocol too: that protocol's headers,
    /// from a sidecar of that version; a request without any is at its entry pod.
    First,
    /// The MCP port otherwise: any hop header is refused.
    Nothing,
    /// The peer port: protocol 2's, addressed to `me` and within [`HOP_WINDOW`] of `now_ms`;
    /// a request without them is refused.
    Current {
        /// This pod's UID.
        me: &'a str,
        /// This pod's Unix time, in milliseconds.
        now_ms: u64,
    },
}

/// How a forward signs its hop headers.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Signing<'a> {
    /// For a sidecar of the first protocol (to its MCP port).
    First,
    /// Protocol 2 (to the peer port of `to`), at Unix time `now_ms`.
    Current {
        /// The receiving pod's UID.
        to: &'a str,
        /// This pod's Unix time, in milliseconds.
        now_ms: u64,
    },
}

/// Where a request has been: its hop count and the pods it visited.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Hop {
    /// Hops taken so far (0 at the entry pod).
    pub(crate) count: u8,
    /// UIDs of the pods that forwarded it, in order.
    pub(crate) visited: Vec<String>,
}

fn first_message(count: u8, visited: &str, session_id: Option<&str>) -> Vec<u8> {
    format!("{count}\n{visited}\n{}", session_id.unwrap_or("")).into_bytes()
}

fn current_message(
    count: u8,
    visited: &str,
    session_id: Option<&str>,
    time: u64,
    to: &str,
) -> Vec<u8> {
    format!(
        "{count}\n{visited}\n{}\n{time}\n{to}",
        session_id.unwrap_or("")
    )
    .into_bytes()
}

impl Hop {
    /// Reads the hop headers of a request for `session_id` (`None` without a session), as
    /// `accept` allows.
    ///
    /// # Errors
    /// [`Rejection::ForgedHop`] when the headers are not allowed here, malformed, exceed
    /// [`MAX_HOPS`], or do not verify (wrong key, session, receiver, or too old).
    pub(crate) fn read(
        headers: &HeaderMap,
        keys: &KeyRing,
        session_id: Option<&str>,
        accept: Accept<'_>,
    ) -> Result<Self, Rejection> {
        let any = HOP_HEADERS.iter().any(|h| headers.contains_key(h));
        let current =
            headers.contains_key(&TETHER_HOP_TIME) || headers.contains_key(&TETHER_HOP_TO);
        match accept {
            Accept::First | Accept::Nothing if !any => return Ok(Self::default()),
            Accept::Nothing => return Err(Rejection::ForgedHop),
            Accept::First if current => return Err(Rejection::ForgedHop),
            Accept::Current { .. } if !current => return Err(Rejection::ForgedHop),
            _ => {}
        }
        let text = |name: &HeaderName| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .ok_or(Rejection::ForgedHop)
        };
        let count: u8 = text(&TETHER_HOP)?
            .parse()
            .ok()
            .filter(|c| (1..=MAX_HOPS).contains(c))
            .ok_or(Rejection::ForgedHop)?;
        let visited = text(&TETHER_VISITED)?;
        let mac = text(&TETHER_HOP_MAC)?;
        let genuine = match accept {
            Accept::Current { me, now_ms } => {
                let time: u64 = text(&TETHER_HOP_TIME)?
                    .parse()
                    .map_err(|_| Rejection::ForgedHop)?;
                let to = text(&TETHER_HOP_TO)?;
                let (id, tag) = mac.split_once(':').ok_or(Rejection::ForgedHop)?;
                let tag = URL_SAFE_NO_PAD
                    .decode(tag)
                    .map_err(|_| Rejection::ForgedHop)?;
                let key = KeyId::parse(id)
                    .and_then(|id| keys.get(id))
                    .ok_or(Rejection::ForgedHop)?;
                tag.len() == MAC_LEN
                    && key.verify(
                        DOMAIN_HOP_V2,
                        &current_message(count, visited, session_id, time, to),
                        &tag,
                    )
                    && to == me
                    && u128::from(now_ms.abs_diff(time)) <= HOP_WINDOW.as_millis()
            }
            _ => {
                let tag = URL_SAFE_NO_PAD
                    .decode(mac)
                    .map_err(|_| Rejection::ForgedHop)?;
                tag.len() == MAC_LEN
                    && keys
                        .verifying(DOMAIN_HOP, &first_message(count, visited, session_id), &tag)
                        .is_some()
            }
        };
        if !genuine {
            return Err(Rejection::ForgedHop);
        }
        Ok(Self {
            count,
            visited: visited
                .split(',')
                .filter(|u| !u.is_empty())
                .map(str::to_owned)
                .collect(),
        })
    }

    /// The hop state a request leaves this pod (`uid`) with.
    pub(crate) fn next(&self, uid: &str) -> Self {
        let mut visited = self.visited.clone();
        visited.push(uid.to_owned());
        Self {
            count: self.count.saturating_add(1),
            visited,
        }
    }

    /// Whether the request already visited `uid`.
    pub(crate) fn visited(&self, uid: &str) -> bool {
        self.visited.iter().any(|v| v == uid)
    }

    /// The signed headers of this hop state, to set on the forwarded request, signed with the
    /// current key of `keys` as `signing` says.
    pub(crate) fn headers(
        &self,
        keys: &KeyRing,
        session_id: Option<&str>,
        signing: Signing<'_>,
    ) -> Vec<(HeaderName, HeaderValue)> {
        let visited = self.visited.join(",");
        // UIDs are visible ASCII (checked by the membership sources); base64url and digits are.
        let value =
            |s: String| HeaderValue::from_str(&s).unwrap_or_else(|_| HeaderValue::from_static(""));
        let mut out = vec![
            (TETHER_HOP, value(self.count.to_string())),
            (TETHER_VISITED, value(visited.clone())),
        ];
        match signing {
            Signing::First => {
                let mac = keys.mac(DOMAIN_HOP, &first_message(self.count, &visited, session_id));
                out.push((
                    TETHER_HOP_MAC,
                    value(URL_SAFE_NO_PAD.encode(&mac[..MAC_LEN])),
                ));
            }
            Signing::Current { to, now_ms } => {
                let key = keys.current();
                let mac = key.mac(
                    DOMAIN_HOP_V2,
                    &current_message(self.count, &visited, session_id, now_ms, to),
                );
                let tag = URL_SAFE_NO_PAD.encode(&mac[..MAC_LEN]);
                out.push((TETHER_HOP_TIME, value(now_ms.to_string())));
                out.push((TETHER_HOP_TO, value(to.to_owned())));
                out.push((TETHER_HOP_MAC, value(format!("{}:{tag}", key.id()))));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> KeyRing {
        KeyRing::from_bytes(b"0123456789abcdef0123".to_vec())
    }

    fn map(pairs: Vec<(HeaderName, HeaderValue)>) -> HeaderMap {
        pairs.into_iter().collect()
    }

    const NOW: u64 = 1_000_000;

    fn at_b(now_ms: u64) -> Accept<'static> {
        Accept::Current {
            me: "pod-b",
            now_ms,
        }
    }

    #[test]
    fn current_hop_headers_round_trip_and_bind_receiver_time_and_session() {
        let k = keys();
        let hop = Hop::default().next("pod-a");
        let to_b = Signing::Current {
            to: "pod-b",
            now_ms: NOW,
        };
        let headers = map(hop.headers(&k, Some("sid"), to_b));
        assert_eq!(
            Hop::read(&headers, &k, Some("sid"), at_b(NOW)),
            Ok(hop.clone())
        );
        let refused = |h: &HeaderMap, sid, accept| {
            assert_eq!(Hop::read(h, &k, sid, accept), Err(Rejection::ForgedHop));
        };
        refused(&headers, Some("other"), at_b(NOW));
        refused(
            &headers,
            Some("sid"),
            Accept::Current {
                me: "pod-c",
                now_ms: NOW,
            },
        );
        refused(
            &headers,
            Some("sid"),
            at_b(NOW + HOP_WINDOW.as_millis() as u64 + 1),
        );
        refused(&headers, Some("sid"), Accept::First);
        refused(&headers, Some("sid"), Accept::Nothing);
        let other = KeyRing::from_bytes(b"fedcba9876543210fedc".to_vec());
        assert_eq!(
            Hop::read(&headers, &other, Some("sid"), at_b(NOW)),
            Err(Rejection::ForgedHop)
        );
        let mut tampered = headers.clone();
        tampered.insert(TETHER_HOP_TO, HeaderValue::from_static("pod-c"));
        refused(
            &tampered,
            Some("sid"),
            Accept::Current {
                me: "pod-c",
                now_ms: NOW,
            },
        );
        let mut older = headers.clone();
        older.insert(TETHER_HOP_TIME, HeaderValue::from_static("999999"));
        refused(&older, Some("sid"), at_b(NOW));
        refused(&HeaderMap::new(), None, at_b(NOW));
    }

    #[test]
    fn first_protocol_hop_headers_are_read_on_the_mcp_port_only() {
        let k = keys();
        let hop = Hop::default().next("pod-a");
        let headers = map(hop.headers(&k, Some("sid"), Signing::First));
        assert_eq!(Hop::read(&headers, &k, Some("sid"), Accept::First), Ok(hop));
        for accept in [Accept::Nothing, at_b(NOW)] {
            assert_eq!(
                Hop::read(&headers, &k, Some("sid"), accept),
                Err(Rejection::ForgedHop)
            );
        }
        assert_eq!(
            Hop::read(&headers, &k, Some("other"), Accept::First),
            Err(Rejection::ForgedHop)
        );
        let mut partial = HeaderMap::new();
        partial.insert(TETHER_VISITED, HeaderValue::from_static("x"));
        assert_eq!(
            Hop::read(&partial, &k, None, Accept::First),
            Err(Rejection::ForgedHop)
        );
        for accept in [Accept::First, Accept::Nothing] {
            assert_eq!(
                Hop::read(&HeaderMap::new(), &k, None, accept),
                Ok(Hop::default())
            );
        }
    }
}
