//! The session journal: the session-scoped requests needed to rebuild an upstream session
//! (`docs/design/architecture.md#vocabulary`, `session.migration: Replay`).
//!
//! It keeps the `initialize` request as sent upstream, whether `notifications/initialized` was
//! sent, the last `logging/setLevel` and the current `resources/subscribe` set (an
//! `unsubscribe` removes its URI). Replaying it on a fresh upstream session yields the same
//! session configuration; tool state that lives only inside the upstream (e.g. a counter) is
//! not rebuilt. It keeps each part as compact JSON text, so that what it holds is what it
//! counts; its size is bounded and counted ([`Journal::bytes`]): at most
//! [`MAX_SUBSCRIPTIONS`] subscriptions, at most the session's `--max-journal-bytes` in all; a
//! request that would grow it past either is refused before it is sent upstream (the
//! `initialize` itself is bounded by `--max-initialize-bytes` before the session exists), and an
//! entry is recorded only once the MCP server accepted the request that carries it, so a
//! credential the server refuses changes nothing.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::mcp::jsonrpc::Message;
use crate::mcp::methods::{
    INITIALIZED, LOGGING_SET_LEVEL, RESOURCES_SUBSCRIBE, RESOURCES_UNSUBSCRIBE,
};

/// Most resource subscriptions a journal keeps; a further `resources/subscribe` is refused.
pub(crate) const MAX_SUBSCRIPTIONS: usize = 1024;

/// Why a message cannot join the journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum JournalError {
    /// The journal would hold more than this many bytes.
    TooLarge(usize),
    /// The journal holds [`MAX_SUBSCRIPTIONS`] subscriptions.
    TooManySubscriptions,
    /// The pod's journals are full (what the admission callback refused).
    PodFull,
}

/// Whether `message` is of a kind the journal keeps (`notifications/initialized`,
/// `logging/setLevel`, `resources/subscribe`, `resources/unsubscribe`).
pub(crate) fn belongs(message: &Message) -> bool {
    match message {
        Message::Notification { method, .. } => method == INITIALIZED,
        Message::Request { method, .. } => matches!(
            method.as_str(),
            LOGGING_SET_LEVEL | RESOURCES_SUBSCRIBE | RESOURCES_UNSUBSCRIBE
        ),
        Message::Response => false,
    }
}

/// A JSON value as compact text.
fn text(value: &Value) -> Box<str> {
    value.to_string().into_boxed_str()
}

/// The value of JSON text this journal wrote ([`text`]).
fn value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

/// What rebuilds one upstream session.
#[derive(Clone, Debug, PartialEq, Hash)]
pub(crate) struct Journal {
    initialize: Box<str>,
    initialized: bool,
    log_level: Option<Box<str>>,
    subscriptions: BTreeMap<String, Box<str>>,
    /// What it takes as JSON text: the `initialize` request, the log level, each
    /// subscription's URI and params.
    bytes: usize,
}

impl Journal {
    /// A journal starting with the `initialize` request sent upstream.
    pub(crate) fn new(initialize: Value) -> Self {
        Self::from_parts(initialize, false, None, BTreeMap::new())
    }

    /// A journal from its parts, as [`Journal::parts`] gave them (on another pod).
    pub(crate) fn from_parts(
        initialize: Value,
        initialized: bool,
        log_level: Option<Value>,
        subscriptions: BTreeMap<String, Value>,
    ) -> Self {
        let initialize = text(&initialize);
        let log_level = log_level.as_ref().map(text);
        let subscriptions: BTreeMap<String, Box<str>> = subscriptions
            .into_iter()
            .map(|(uri, params)| (uri, text(&params)))
            .collect();
        let bytes = initialize.len()
            + log_level.as_ref().map_or(0, |l| l.len())
            + subscriptions
                .iter()
                .map(|(uri, params)| uri.len() + params.len())
                .sum::<usize>();
        Self {
            initialize,
            initialized,
            log_level,
            subscriptions,
            bytes,
        }
    }

    /// What the journal takes as JSON text, in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The parts: the `initialize` request, whether `notifications/initialized` was sent, the
    /// last `logging/setLevel` params and the subscriptions' params by URI.
    pub(crate) fn parts(&self) -> (Value, bool, Option<Value>, BTreeMap<String, Value>) {
        (
            value(&self.initialize),
            self.initialized,
            self.log_level.as_deref().map(value),
            self.subscriptions
                .iter()
                .map(|(uri, params)| (uri.clone(), value(params)))
                .collect(),
        )
    }

    /// The `initialize` request.
    pub(crate) fn initialize(&self) -> Value {
        value(&self.initialize)
    }

    /// The `initialize` request as compact JSON text (what is sent upstream).
    pub(crate) fn initialize_text(&self) -> &str {
        &self.initialize
    }

    /// Records a client message if it belongs to the journal; returns whether it did. A message
    /// that would grow the journal past `max_bytes` bytes or [`MAX_SUBSCRIPTIONS`] is refused,
    /// and so is one that `admit` refuses when given the journal's size with it (the pod's
    /// budget); a refused message changes nothing.
    ///
    /// # Errors
    /// [`JournalError`] naming the bound.
    pub(crate) fn record(
        &mut self,
        message: &Message,
        raw: &Value,
        max_bytes: usize,
        admit: impl FnOnce(usize) -> bool,
    ) -> Result<bool, JournalError> {
        let params = || raw.get("params").cloned().unwrap_or(Value::Null);
        let uri = || {
            raw.pointer("/params/uri")
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let current = self.bytes;
        let grow = |old: usize, new: usize| {
            let bytes = current - old + new;
            if bytes > current && bytes > max_bytes {
                return Err(JournalError::TooLarge(max_bytes));
            }
            if !admit(bytes) {
                return Err(JournalError::PodFull);
            }
            Ok(bytes)
        };
        match message {
            Message::Notification { method, .. } if method == INITIALIZED => {
                self.initialized = true;
            }
            Message::Request { method, .. } if method == LOGGING_SET_LEVEL => {
                let level = text(&params());
                self.bytes = grow(self.log_level.as_ref().map_or(0, |l| l.len()), level.len())?;
                self.log_level = Some(level);
            }
            Message::Request { method, .. } if method == RESOURCES_SUBSCRIBE => {
                let Some(uri) = uri() else { return Ok(false) };
                let old = self.subscriptions.get(&uri).map(|p| p.len());
                if old.is_none() && self.subscriptions.len() >= MAX_SUBSCRIPTIONS {
                    return Err(JournalError::TooManySubscriptions);
                }
                let params = text(&params());
                let old = old.map_or(0, |p| p + uri.len());
                self.bytes = grow(old, uri.len() + params.len())?;
                self.subscriptions.insert(uri, params);
            }
            Message::Request { method, .. } if method == RESOURCES_UNSUBSCRIBE => {
                if let Some(uri) = uri()
                    && let Some(params) = self.subscriptions.remove(&uri)
                {
                    self.bytes = grow(uri.len() + params.len(), 0)?;
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The messages to send after `initialize` to rebuild the session, in order. Requests get
    /// ids `tether-replay-<n>`, which no client request of the new upstream session can have.
    pub(crate) fn replay(&self) -> Vec<Value> {
        let mut out = Vec::new();
        if self.initialized {
            out.push(json!({"jsonrpc": "2.0", "method": INITIALIZED}));
        }
        let mut request = |method: &str, params: &Value| {
            let id = format!("tether-replay-{}", out.len());
            out.push(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        };
        if let Some(level) = &self.log_level {
            request(LOGGING_SET_LEVEL, &value(level));
        }
        for params in self.subscriptions.values() {
            request(RESOURCES_SUBSCRIBE, &value(params));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::jsonrpc::{Envelope, EnvelopeLimits};

    fn record_within(j: &mut Journal, body: Value, max: usize) -> Result<bool, JournalError> {
        let limits = EnvelopeLimits { max_batch: 64 };
        let env = Envelope::parse(body.to_string().as_bytes(), limits).unwrap();
        let (message, raw) = &env.messages[0];
        j.record(message, raw, max, |_| true)
    }

    fn record(j: &mut Journal, body: Value) -> bool {
        record_within(j, body, usize::MAX).unwrap()
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
    fn subscriptions_are_bounded_in_count_and_bytes_and_a_refusal_changes_nothing() {
        let subscribe = |i: usize, pad: usize| {
            json!({"jsonrpc": "2.0", "id": i, "method": "resources/subscribe",
                   "params": {"uri": format!("u{i}"), "pad": "x".repeat(pad)}})
        };
        let mut j = Journal::new(json!({}));
        for i in 0..MAX_SUBSCRIPTIONS {
            assert!(record(&mut j, subscribe(i, 0)));
        }
        let before = j.clone();
        assert_eq!(
            record_within(&mut j, subscribe(MAX_SUBSCRIPTIONS, 0), usize::MAX),
            Err(JournalError::TooManySubscriptions)
        );
        assert_eq!(j, before);
        assert!(record(&mut j, subscribe(7, 10)), "a known URI is replaced");
        assert_eq!(j.replay().len(), MAX_SUBSCRIPTIONS);

        let mut j = Journal::new(json!({"method": "initialize"}));
        let empty = j.bytes();
        assert_eq!(empty, r#"{"method":"initialize"}"#.len());
        assert!(record_within(&mut j, subscribe(1, 1000), 2000).unwrap());
        let one = j.bytes();
        assert!(one > empty + 1000, "{one}");
        assert_eq!(
            record_within(&mut j, subscribe(2, 1000), 2000),
            Err(JournalError::TooLarge(2000))
        );
        assert_eq!(j.bytes(), one, "refused: nothing kept");
        let refused_by_pod = {
            let limits = EnvelopeLimits { max_batch: 64 };
            let body = subscribe(3, 10).to_string();
            let env = Envelope::parse(body.as_bytes(), limits).unwrap();
            let (message, raw) = &env.messages[0];
            j.record(message, raw, usize::MAX, |_| false)
        };
        assert_eq!(refused_by_pod, Err(JournalError::PodFull));
        assert!(record(
            &mut j,
            json!({"jsonrpc": "2.0", "id": 9, "method": "resources/unsubscribe", "params": {"uri": "u1"}})
        ));
        assert_eq!(j.bytes(), empty, "an unsubscribe gives its bytes back");
        let (initialize, initialized, level, subscriptions) = j.parts();
        let copy = Journal::from_parts(initialize, initialized, level, subscriptions);
        assert_eq!(copy, j, "the parts rebuild the same journal");
        assert_eq!(
            copy.bytes(),
            j.bytes(),
            "a copy on another pod counts the same"
        );
    }
}
