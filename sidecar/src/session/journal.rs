//! The session journal: the session-scoped requests needed to rebuild an upstream session
//! (`docs/design/architecture.md#vocabulary`, `session.migration: Replay`).
//!
//! It keeps the `initialize` request as sent upstream, whether `notifications/initialized` was
//! sent, the last `logging/setLevel` and the current `resources/subscribe` set (an
//! `unsubscribe` removes its URI). Replaying it on a fresh upstream session yields the same
//! session configuration; tool state that lives only inside the upstream (e.g. a counter) is
//! not rebuilt. Its size is bounded: at most [`MAX_SUBSCRIPTIONS`] subscriptions are kept.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::mcp::jsonrpc::Message;

/// Most resource subscriptions a journal keeps; later ones are not replayed.
pub(crate) const MAX_SUBSCRIPTIONS: usize = 1024;

/// What rebuilds one upstream session.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Journal {
    initialize: Value,
    initialized: bool,
    log_level: Option<Value>,
    subscriptions: BTreeMap<String, Value>,
}

impl Journal {
    /// A journal starting with the `initialize` request sent upstream.
    pub(crate) fn new(initialize: Value) -> Self {
        Self {
            initialize,
            initialized: false,
            log_level: None,
            subscriptions: BTreeMap::new(),
        }
    }

    /// A journal from its parts, as [`Journal::parts`] gave them (on another pod).
    pub(crate) fn from_parts(
        initialize: Value,
        initialized: bool,
        log_level: Option<Value>,
        subscriptions: BTreeMap<String, Value>,
    ) -> Self {
        Self {
            initialize,
            initialized,
            log_level,
            subscriptions,
        }
    }

    /// The parts: the `initialize` request, whether `notifications/initialized` was sent, the
    /// last `logging/setLevel` params and the subscriptions' params by URI.
    pub(crate) fn parts(&self) -> (&Value, bool, Option<&Value>, &BTreeMap<String, Value>) {
        (
            &self.initialize,
            self.initialized,
            self.log_level.as_ref(),
            &self.subscriptions,
        )
    }

    /// The `initialize` request.
    pub(crate) fn initialize(&self) -> &Value {
        &self.initialize
    }

    /// Records a client message if it belongs to the journal; returns whether it did.
    pub(crate) fn record(&mut self, message: &Message, raw: &Value) -> bool {
        let params = || raw.get("params").cloned().unwrap_or(Value::Null);
        let uri = || {
            raw.pointer("/params/uri")
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        match message {
            Message::Notification { method, .. } if method == "notifications/initialized" => {
                self.initialized = true;
            }
            Message::Request { method, .. } if method == "logging/setLevel" => {
                self.log_level = Some(params());
            }
            Message::Request { method, .. } if method == "resources/subscribe" => match uri() {
                Some(uri)
                    if self.subscriptions.len() < MAX_SUBSCRIPTIONS
                        || self.subscriptions.contains_key(&uri) =>
                {
                    self.subscriptions.insert(uri, params());
                }
                _ => return false,
            },
            Message::Request { method, .. } if method == "resources/unsubscribe" => {
                if let Some(uri) = uri() {
                    self.subscriptions.remove(&uri);
                }
            }
            _ => return false,
        }
        true
    }

    /// The messages to send after `initialize` to rebuild the session, in order. Requests get
    /// ids `tether-replay-<n>`, which no client request of the new upstream session can have.
    pub(crate) fn replay(&self) -> Vec<Value> {
        let mut out = Vec::new();
        if self.initialized {
            out.push(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        }
        let mut request = |method: &str, params: &Value| {
            let id = format!("tether-replay-{}", out.len());
            out.push(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        };
        if let Some(level) = &self.log_level {
            request("logging/setLevel", level);
        }
        for params in self.subscriptions.values() {
            request("resources/subscribe", params);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::jsonrpc::{Envelope, EnvelopeLimits};

    fn record(j: &mut Journal, body: Value) -> bool {
        let limits = EnvelopeLimits { max_batch: 64 };
        let env = Envelope::parse(body.to_string().as_bytes(), limits).unwrap();
        let (message, raw) = &env.messages[0];
        j.record(message, raw)
    }

    #[test]
    fn keeps_what_rebuilds_the_session_and_nothing_else() {
        let mut j = Journal::new(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize"}));
        assert!(record(
            &mut j,
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
        ));
        assert!(record(
            &mut j,
            json!({"jsonrpc": "2.0", "id": 2, "method": "logging/setLevel", "params": {"level": "info"}})
        ));
        assert!(record(
            &mut j,
            json!({"jsonrpc": "2.0", "id": 3, "method": "logging/setLevel", "params": {"level": "debug"}})
        ));
        for (id, uri) in [(4, "file:///a"), (5, "file:///b")] {
            assert!(record(
                &mut j,
                json!({"jsonrpc": "2.0", "id": id, "method": "resources/subscribe", "params": {"uri": uri}})
            ));
        }
        assert!(record(
            &mut j,
            json!({"jsonrpc": "2.0", "id": 6, "method": "resources/unsubscribe", "params": {"uri": "file:///a"}})
        ));
        assert!(!record(
            &mut j,
            json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "counter"}})
        ));
        let replay = j.replay();
        let methods: Vec<&str> = replay
            .iter()
            .map(|m| m["method"].as_str().unwrap())
            .collect();
        assert_eq!(
            methods,
            [
                "notifications/initialized",
                "logging/setLevel",
                "resources/subscribe"
            ]
        );
        assert_eq!(replay[1]["params"]["level"], "debug", "only the last level");
        assert_eq!(replay[2]["params"]["uri"], "file:///b");
        assert_eq!(replay[1]["id"], "tether-replay-1");
        assert!(replay[0].get("id").is_none(), "notifications have no id");
    }

    #[test]
    fn subscriptions_are_bounded() {
        let mut j = Journal::new(json!({}));
        for i in 0..MAX_SUBSCRIPTIONS + 10 {
            record(
                &mut j,
                json!({"jsonrpc": "2.0", "id": i, "method": "resources/subscribe", "params": {"uri": format!("u{i}")}}),
            );
        }
        assert_eq!(j.replay().len(), MAX_SUBSCRIPTIONS);
    }
}
