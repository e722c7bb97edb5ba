//! The hop headers of a request forwarded between sidecars: where it has been, signed by the
//! pod that forwarded it (`docs/design/routing.md#forwarding`,
//! `docs/design/peer-protocol.md#hop-headers`).
//!
//! | header | value |
//! |---|---|
//! | `Tether-Hop` | hop number, 1 to [`MAX_HOPS`] |
//! | `Tether-Visited` | comma-separated UIDs of the pods it passed |
//! | `Tether-Hop-Time` | the sender's Unix time in milliseconds |
//! | `Tether-Hop-To` | the receiver's pod UID |
//! | `Tether-Hop-Mac` | `<key id>:<base64url 16 bytes>`, domain `tether/hop/v2`, over `"{hop}\n{visited}\n{session id}\n{time}\n{receiver}"` |
//!
//! They arrive on the peer port only, where a request without them is refused; on the MCP port
//! any of them is refused ([`Accept`]). Either way a header set that does not verify is 403
//! `forged_hop`, and never reaches the MCP server.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderMap, HeaderName, HeaderValue};
use std::time::Duration;

use crate::keys::{KeyId, KeyRing};
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
/// The forwarding pod's Unix time, in milliseconds.
pub(crate) const TETHER_HOP_TIME: HeaderName = HeaderName::from_static("tether-hop-time");
/// The receiving pod's UID.
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
/// Domain label of the hop MACs.
const DOMAIN_HOP: &[u8] = b"tether/hop/v2";
const MAC_LEN: usize = 16;

/// Which hop headers a listener takes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Accept<'a> {
    /// The MCP port: any hop header is refused; a request is at its entry pod.
    Nothing,
    /// The peer port: hop headers addressed to `me` and within [`HOP_WINDOW`] of `now_ms`; a
    /// request without them is refused.
    Peer {
        /// This pod's UID.
        me: &'a str,
        /// This pod's Unix time, in milliseconds.
        now_ms: u64,
    },
}

/// Whom a forward's hop headers are signed for: the peer port of `to`, at Unix time `now_ms`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Signing<'a> {
    /// The receiving pod's UID.
    pub(crate) to: &'a str,
    /// This pod's Unix time, in milliseconds.
    pub(crate) now_ms: u64,
}

/// Where a request has been: its hop count and the pods it visited.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Hop {
    /// Hops taken so far (0 at the entry pod).
    pub(crate) count: u8,
    /// UIDs of the pods that forwarded it, in order.
    pub(crate) visited: Vec<String>,
}

fn message(count: u8, visited: &str, session_id: Option<&str>, time: u64, to: &str) -> Vec<u8> {
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
        let (me, now_ms) = match accept {
            Accept::Nothing if any => return Err(Rejection::ForgedHop),
            Accept::Nothing => return Ok(Self::default()),
            Accept::Peer { me, now_ms } => (me, now_ms),
        };
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
        let genuine = tag.len() == MAC_LEN
            && key.verify(
                DOMAIN_HOP,
                &message(count, visited, session_id, time, to),
                &tag,
            )
            && to == me
            && u128::from(now_ms.abs_diff(time)) <= HOP_WINDOW.as_millis();
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
    /// current key of `keys` for `signing`'s receiver and time.
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
        let Signing { to, now_ms } = signing;
        let key = keys.current();
        let mac = key.mac(
            DOMAIN_HOP,
            &message(self.count, &visited, session_id, now_ms, to),
        );
        let tag = URL_SAFE_NO_PAD.encode(&mac[..MAC_LEN]);
        out.push((TETHER_HOP_TIME, value(now_ms.to_string())));
        out.push((TETHER_HOP_TO, value(to.to_owned())));
        out.push((TETHER_HOP_MAC, value(format!("{}:{tag}", key.id()))));
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
        Accept::Peer {
            me: "pod-b",
            now_ms,
        }
    }

    #[test]
    fn hop_headers_round_trip_and_bind_receiver_time_and_session() {
        let k = keys();
        let hop = Hop::default().next("pod-a");
        let to_b = Signing {
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
            Accept::Peer {
                me: "pod-c",
                now_ms: NOW,
            },
        );
        refused(
            &headers,
            Some("sid"),
            at_b(NOW + HOP_WINDOW.as_millis() as u64 + 1),
        );
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
            Accept::Peer {
                me: "pod-c",
                now_ms: NOW,
            },
        );
        let mut older = headers.clone();
        older.insert(TETHER_HOP_TIME, HeaderValue::from_static("999999"));
        refused(&older, Some("sid"), at_b(NOW));
        refused(&HeaderMap::new(), None, at_b(NOW));
        let mut partial = HeaderMap::new();
        partial.insert(TETHER_VISITED, HeaderValue::from_static("x"));
        refused(&partial, None, at_b(NOW));
        refused(&partial, None, Accept::Nothing);
        assert_eq!(
            Hop::read(&HeaderMap::new(), &k, None, Accept::Nothing),
            Ok(Hop::default())
        );
    }
}
