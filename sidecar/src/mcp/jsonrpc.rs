//! JSON-RPC 2.0 envelopes as MCP carries them over Streamable HTTP.
//!
//! The sidecar never interprets tool calls; it needs only the envelope: whether a POST holds
//! requests (→ a response stream) or only notifications/responses (→ 202, spec T-05), their ids
//! (retry de-duplication, cancellation), `initialize`, and which upstream event answers which
//! request. Batches are parsed here; whether they are allowed depends on the version (B-01/B-02).

use std::collections::HashSet;

use bytes::Bytes;
use serde::de::{DeserializeSeed, IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::methods::INITIALIZE;

/// A JSON-RPC id as a map key: its JSON text, so `1` and `"1"` stay distinct.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub(crate) struct RequestKey(Box<str>);

impl RequestKey {
    /// The key of a JSON id value (string or number). Integral numbers written as floats
    /// (`7.0`, `1e2`, `-0`) are the same id as the integer, as servers answer with it.
    pub(crate) fn of(id: &Value) -> Self {
        if let Some(f) = id.as_f64().filter(|_| id.is_f64())
            && f.fract() == 0.0
            && f.abs() < 9.0e15
        {
            return Self((f as i64).to_string().into());
        }
        Self(id.to_string().into())
    }

    /// The id as JSON text, ready to embed in a message.
    pub(crate) fn as_json(&self) -> &str {
        &self.0
    }
}

/// One message of a POST body.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Message {
    /// A request: has `method` and a non-null `id`.
    Request {
        /// Its id.
        id: RequestKey,
        /// Its method, e.g. `tools/call`.
        method: String,
    },
    /// A notification: `method` without `id`.
    Notification {
        /// Its method, e.g. `notifications/cancelled`.
        method: String,
        /// Its params (`null` when absent).
        params: Value,
    },
    /// A response or error to a server-initiated request.
    Response,
}

/// A parsed POST body.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Envelope {
    /// Whether the body was a JSON array (a batch).
    pub(crate) batch: bool,
    /// The messages with their own JSON text (each forwarded on its own for batches).
    pub(crate) messages: Vec<(Message, Value)>,
    /// SHA-256 of the body's canonical JSON (keys sorted, no whitespace), for retry detection.
    pub(crate) digest: [u8; 32],
}

/// Bounds on what one POST body may hold, checked while it is parsed (a body over them costs
/// the parse of at most `max_batch` + 1 members, never the whole body).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EnvelopeLimits {
    /// Most messages in a batch (`--max-batch`).
    pub(crate) max_batch: usize,
}

/// Longest JSON-RPC request id, in bytes of its JSON text: ids are kept per request (retry
/// records, cancellation), so their size is bounded.
pub(crate) const MAX_ID_BYTES: usize = 256;

/// Why a body is not an acceptable JSON-RPC envelope.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EnvelopeError {
    /// Not JSON at all (JSON-RPC -32700).
    #[error("parse error: {0}")]
    Parse(String),
    /// JSON, but not a JSON-RPC 2.0 message (JSON-RPC -32600).
    #[error("invalid request: {0}")]
    Invalid(String),
}

impl Envelope {
    /// Parses a POST body within `limits`. Nesting is bounded by the JSON parser (128 levels).
    ///
    /// # Errors
    /// [`EnvelopeError`] when the body is not one JSON-RPC 2.0 message or a non-empty array of
    /// them, when a batch holds more than `limits.max_batch` messages or repeats a request id,
    /// or when a request id is longer than [`MAX_ID_BYTES`].
    pub(crate) fn parse(body: &[u8], limits: EnvelopeLimits) -> Result<Self, EnvelopeError> {
        let mut json = serde_json::Deserializer::from_slice(body);
        let value = Bounded(limits.max_batch)
            .deserialize(&mut json)
            .and_then(|v| json.end().map(|()| v))
            .map_err(|e| match e.to_string() {
                m if m.starts_with(TOO_MANY) => EnvelopeError::Invalid(format!(
                    "{TOO_MANY} {} messages (--max-batch)",
                    limits.max_batch
                )),
                m => EnvelopeError::Parse(m),
            })?;
        let mut hasher = Sha256::new();
        hash_canonical(&value, &mut hasher);
        let digest: [u8; 32] = hasher.finalize().into();
        let (batch, items) = match value {
            Value::Array(items) if items.is_empty() => {
                return Err(EnvelopeError::Invalid("empty batch".into()));
            }
            Value::Array(items) => (true, items),
            other => (false, vec![other]),
        };
        let mut messages = Vec::with_capacity(items.len());
        let mut ids = HashSet::with_capacity(items.len());
        for item in items {
            let message = classify(&item)?;
            if let Message::Request { id, .. } = &message
                && !ids.insert(id.clone())
            {
                return Err(EnvelopeError::Invalid(format!(
                    "request id {} repeats within the batch",
                    id.as_json()
                )));
            }
            messages.push((message, item));
        }
        Ok(Self {
            batch,
            messages,
            digest,
        })
    }

    /// The request ids of the body, in order.
    pub(crate) fn request_ids(&self) -> Vec<RequestKey> {
        self.messages
            .iter()
            .filter_map(|(m, _)| match m {
                Message::Request { id, .. } => Some(id.clone()),
                _ => None,
            })
            .collect()
    }

    /// The id of the body's first request, if it holds one (what an error about the whole
    /// body answers).
    pub(crate) fn first_request_id(&self) -> Option<RequestKey> {
        self.messages.iter().find_map(|(m, _)| match m {
            Message::Request { id, .. } => Some(id.clone()),
            _ => None,
        })
    }

    /// Whether the body is a single `initialize` request.
    pub(crate) fn is_initialize(&self) -> bool {
        self.is_request_of(INITIALIZE)
    }

    /// Whether the body is a single request of `method`.
    pub(crate) fn is_request_of(&self, method: &str) -> bool {
        !self.batch
            && matches!(&self.messages[0].0, Message::Request { method: m, .. } if m == method)
    }

    /// Whether any message is `initialize` (which must not be batched).
    pub(crate) fn contains_initialize(&self) -> bool {
        self.messages
            .iter()
            .any(|(m, _)| matches!(m, Message::Request { method, .. } if method == INITIALIZE))
    }
}

/// Feeds `value` to `hasher` as canonical JSON: object keys sorted, no whitespace. (serde_json's
/// map keeps insertion order when any crate enables `preserve_order`, so sorting is explicit.)
fn hash_canonical(value: &Value, hasher: &mut Sha256) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            hasher.update(b"{");
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    hasher.update(b",");
                }
                hasher.update(Value::from(key.as_str()).to_string().as_bytes());
                hasher.update(b":");
                hash_canonical(&map[key], hasher);
            }
            hasher.update(b"}");
        }
        Value::Array(items) => {
            hasher.update(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    hasher.update(b",");
                }
                hash_canonical(item, hasher);
            }
            hasher.update(b"]");
        }
        scalar => hasher.update(scalar.to_string().as_bytes()),
    }
}

/// Whether `body` is a JSON array (a batch), from its first non-whitespace byte: known before
/// the body is parsed.
pub(crate) fn is_batch(body: &[u8]) -> bool {
    body.iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'[')
}

/// A request body read whole, its envelope parsed at most once: by whoever first needs it (the
/// request's lane, to tell an `initialize` from a request for a lost session), then handed on
/// with the body.
#[derive(Debug)]
pub(crate) struct Body {
    bytes: Bytes,
    envelope: Option<Result<Envelope, EnvelopeError>>,
}

impl Body {
    /// A body not parsed yet.
    pub(crate) fn new(bytes: Bytes) -> Self {
        Self {
            bytes,
            envelope: None,
        }
    }

    /// A body parsed now.
    pub(crate) fn parsed(bytes: Bytes, limits: EnvelopeLimits) -> Self {
        let envelope = Some(Envelope::parse(&bytes, limits));
        Self { bytes, envelope }
    }

    /// Whether the body parsed as a single `initialize` request.
    pub(crate) fn is_initialize(&self) -> bool {
        matches!(&self.envelope, Some(Ok(envelope)) if envelope.is_initialize())
    }

    /// The bytes and the envelope, parsed now if nobody parsed it before.
    pub(crate) fn into_parts(
        self,
        limits: EnvelopeLimits,
    ) -> (Bytes, Result<Envelope, EnvelopeError>) {
        let envelope = self
            .envelope
            .unwrap_or_else(|| Envelope::parse(&self.bytes, limits));
        (self.bytes, envelope)
    }
}

/// The start of the error a batch over the limit gets.
const TOO_MANY: &str = "a batch holds at most";

/// Deserializes a JSON value whose top level, when it is an array, holds at most `.0` members:
/// the parse stops at the first one over.
struct Bounded(usize);

impl<'de> DeserializeSeed<'de> for Bounded {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Bounded {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON-RPC message or a batch of them")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Value>()? {
            if items.len() == self.0 {
                return Err(serde::de::Error::custom(TOO_MANY));
            }
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
        Value::deserialize(serde::de::value::MapAccessDeserializer::new(map))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

fn classify(item: &Value) -> Result<Message, EnvelopeError> {
    let Value::Object(obj) = item else {
        return Err(EnvelopeError::Invalid(
            "a message must be a JSON object".into(),
        ));
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(EnvelopeError::Invalid("\"jsonrpc\" must be \"2.0\"".into()));
    }
    let id = obj.get("id");
    match obj.get("method") {
        Some(Value::String(method)) => match id {
            None => Ok(Message::Notification {
                method: method.clone(),
                params: obj.get("params").cloned().unwrap_or(Value::Null),
            }),
            Some(id @ (Value::String(_) | Value::Number(_))) => {
                let id = RequestKey::of(id);
                if id.as_json().len() > MAX_ID_BYTES {
                    return Err(EnvelopeError::Invalid(format!(
                        "a request id may be at most {MAX_ID_BYTES} bytes of JSON; this one is {}",
                        id.as_json().len()
                    )));
                }
                Ok(Message::Request {
                    id,
                    method: method.clone(),
                })
            }
            Some(_) => Err(EnvelopeError::Invalid(
                "a request id must be a string or a number".into(),
            )),
        },
        Some(_) => Err(EnvelopeError::Invalid("\"method\" must be a string".into())),
        None if obj.contains_key("result") || obj.contains_key("error") => Ok(Message::Response),
        None => Err(EnvelopeError::Invalid(
            "a message needs \"method\", \"result\" or \"error\"".into(),
        )),
    }
}

/// Fields of a server message that tell whether it answers a request.
#[derive(Deserialize)]
struct Probe {
    id: Option<Value>,
    method: Option<IgnoredAny>,
    result: Option<IgnoredAny>,
    error: Option<IgnoredAny>,
}

/// The id of the request a server message answers, when it is a response or error: a JSON
/// object (as UTF-8 text) with `result` or `error`, an id and no `method`. A JSON array with
/// such values in the fields' places is no response (serde would read it as the struct), nor
/// is text with invalid UTF-8 in a part the probe skips.
pub(crate) fn response_id(data: &[u8]) -> Option<RequestKey> {
    match response_probe(data)?.id? {
        id @ (Value::String(_) | Value::Number(_)) => Some(RequestKey::of(&id)),
        _ => None,
    }
}

/// Whether `data` is a JSON-RPC response or error object, whatever its id (an error about an
/// unparsable request has `id: null`).
pub(crate) fn is_response(data: &[u8]) -> bool {
    response_probe(data).is_some()
}

fn response_probe(data: &[u8]) -> Option<Probe> {
    if !may_be_response(data) {
        return None;
    }
    let text = std::str::from_utf8(data).ok()?;
    if !text
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .starts_with('{')
    {
        return None;
    }
    let probe: Probe = serde_json::from_str(text).ok()?;
    (probe.method.is_none() && (probe.result.is_some() || probe.error.is_some())).then_some(probe)
}

/// Whether `data` may hold a `result` or `error` key: written plainly, or with a `\u` escape
/// (the only escape that spells letters). Every upstream event passes here, and most are
/// notifications that need no parse.
fn may_be_response(data: &[u8]) -> bool {
    use memchr::memmem::Finder;
    use std::sync::LazyLock;
    static KEYS: LazyLock<[Finder<'static>; 3]> = LazyLock::new(|| {
        [
            Finder::new(b"\"result\""),
            Finder::new(b"\"error\""),
            Finder::new(b"\\u"),
        ]
    });
    KEYS.iter().any(|key| key.find(data).is_some())
}

/// A JSON-RPC error response for request `id` (JSON text), as one line of JSON.
pub(crate) fn error_response(id: &RequestKey, code: i64, message: &str, reason: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":{code},"message":{},"data":{{"reason":{}}}}}}}"#,
        id.as_json(),
        Value::from(message),
        Value::from(reason)
    )
}

/// JSON-RPC error code used for transport-level rejections. MCP leaves -32000..-32019 to
/// implementations and allocates its own codes from -32020 on (2026-07-28, "Error codes").
pub(crate) const CODE_TRANSPORT: i64 = -32000;
/// JSON-RPC error code for an unknown session, as the TypeScript SDK uses (implementation-defined
/// range).
pub(crate) const CODE_SESSION_NOT_FOUND: i64 = -32001;
/// MCP `HeaderMismatch` (2026-07-28): the standard headers (`Mcp-Method`, `Mcp-Name`,
/// `MCP-Protocol-Version`) are missing, malformed or do not match the body (SEP-2243).
pub(crate) const CODE_HEADER_MISMATCH: i64 = -32020;
/// MCP `UnsupportedProtocolVersionError` (2026-07-28, SEP-2575): `data.supported` lists the
/// versions the server implements, `data.requested` echoes the one asked for.
pub(crate) const CODE_UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
/// JSON-RPC parse error.
pub(crate) const CODE_PARSE_ERROR: i64 = -32700;
/// JSON-RPC invalid request.
pub(crate) const CODE_INVALID_REQUEST: i64 = -32600;
/// JSON-RPC method not found.
pub(crate) const CODE_METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC invalid params (used for an unsupported negotiated version, spec I-02).
pub(crate) const CODE_INVALID_PARAMS: i64 = -32602;
/// JSON-RPC internal error (used when the upstream fails a request).
pub(crate) const CODE_INTERNAL: i64 = -32603;

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: EnvelopeLimits = EnvelopeLimits { max_batch: 4 };

    fn parse(body: &[u8]) -> Result<Envelope, EnvelopeError> {
        Envelope::parse(body, LIMITS)
    }

    #[test]
    fn classifies_messages() {
        let e = parse(br#"{"jsonrpc":"2.0","id":1,"method":"initialize"}"#).unwrap();
        assert!(e.is_initialize());
        assert_eq!(e.request_ids(), vec![RequestKey::of(&Value::from(1))]);
        let e = parse(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap();
        assert!(e.request_ids().is_empty());
        let e = parse(br#"{"jsonrpc":"2.0","id":"a","result":{}}"#).unwrap();
        assert_eq!(e.messages[0].0, Message::Response);
    }

    #[test]
    fn integral_float_ids_equal_the_integer() {
        let int = RequestKey::of(&Value::from(100));
        for text in ["1e2", "100.0", "1.0e2"] {
            let v: Value = serde_json::from_str(text).unwrap();
            assert_eq!(RequestKey::of(&v), int, "{text}");
        }
        let v: Value = serde_json::from_str("-0").unwrap();
        assert_eq!(RequestKey::of(&v), RequestKey::of(&Value::from(0)));
        let v: Value = serde_json::from_str("1.5").unwrap();
        assert_eq!(RequestKey::of(&v).as_json(), "1.5");
    }

    #[test]
    fn ids_keep_their_type() {
        assert_ne!(
            RequestKey::of(&Value::from(1)),
            RequestKey::of(&Value::from("1"))
        );
    }

    #[test]
    fn rejects_bad_envelopes() {
        for (body, parse_error) in [
            (&b"{"[..], true),
            (b"\xff", true),
            (b"[]", false),
            (b"3", false),
            (br#"{"id":1,"method":"x"}"#, false),
            (br#"{"jsonrpc":"2.0","id":null,"method":"x"}"#, false),
            (br#"{"jsonrpc":"2.0","id":1}"#, false),
            (
                br#"[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","id":1,"method":"b"}]"#,
                false,
            ),
        ] {
            let err = parse(body).unwrap_err();
            assert_eq!(matches!(err, EnvelopeError::Parse(_)), parse_error, "{err}");
        }
    }

    fn batch(n: usize, id: impl Fn(usize) -> String) -> Vec<u8> {
        let members: Vec<String> = (0..n)
            .map(|i| format!(r#"{{"jsonrpc":"2.0","id":{},"method":"echo"}}"#, id(i)))
            .collect();
        format!("[{}]", members.join(",")).into_bytes()
    }

    #[test]
    fn a_batch_over_the_limit_is_refused_while_it_is_parsed() {
        let full = parse(&batch(4, |i| i.to_string())).unwrap();
        assert_eq!(full.messages.len(), 4);
        let over = parse(&batch(5, |i| i.to_string())).unwrap_err();
        assert_eq!(
            over,
            EnvelopeError::Invalid("a batch holds at most 4 messages (--max-batch)".into())
        );
        // Refused at the fifth member: the rest is never read, even when it is not JSON.
        let mut huge = batch(5, |i| i.to_string());
        huge.truncate(huge.len() - 1);
        huge.extend_from_slice(b",this is never parsed");
        assert!(matches!(parse(&huge), Err(EnvelopeError::Invalid(m)) if m.contains("at most 4")));
        // A single message, or trailing garbage, is no batch matter.
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":1,"method":"x"} x"#),
            Err(EnvelopeError::Parse(_))
        ));
    }

    #[test]
    fn a_batch_is_known_by_its_first_byte() {
        assert!(is_batch(b" \r\n\t[{}]"));
        assert!(!is_batch(br#" {"jsonrpc":"2.0"}"#));
        assert!(!is_batch(b""));
        assert!(!is_batch(b"   "));
    }

    #[test]
    fn repeated_ids_are_found_in_one_pass_and_long_ids_are_refused() {
        let limits = EnvelopeLimits { max_batch: 5000 };
        let distinct = batch(5000, |i| i.to_string());
        assert_eq!(
            Envelope::parse(&distinct, limits).unwrap().messages.len(),
            5000
        );
        let repeated = batch(5000, |i| if i == 4999 { "7".into() } else { i.to_string() });
        assert_eq!(
            Envelope::parse(&repeated, limits).unwrap_err(),
            EnvelopeError::Invalid("request id 7 repeats within the batch".into())
        );
        let longest = format!("\"{}\"", "x".repeat(MAX_ID_BYTES - 2));
        let body = format!(r#"{{"jsonrpc":"2.0","id":{longest},"method":"x"}}"#);
        assert!(parse(body.as_bytes()).is_ok());
        let longer = format!("\"{}\"", "x".repeat(MAX_ID_BYTES - 1));
        let body = format!(r#"{{"jsonrpc":"2.0","id":{longer},"method":"x"}}"#);
        assert_eq!(
            parse(body.as_bytes()).unwrap_err(),
            EnvelopeError::Invalid(format!(
                "a request id may be at most {MAX_ID_BYTES} bytes of JSON; this one is {}",
                MAX_ID_BYTES + 1
            ))
        );
        // Nesting is bounded by the parser.
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"x","params":{}1{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        assert!(
            matches!(parse(deep.as_bytes()), Err(EnvelopeError::Parse(m)) if m.contains("recursion"))
        );
    }

    #[test]
    fn digest_ignores_key_order_and_whitespace() {
        let a = parse(br#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":1,"b":2}}"#).unwrap();
        let b = parse(br#"{ "params": {"b":2, "a":1}, "method":"x", "id":1, "jsonrpc":"2.0" }"#)
            .unwrap();
        let c = parse(br#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":2}}"#).unwrap();
        assert_eq!(a.digest, b.digest);
        assert_ne!(a.digest, c.digest);
    }

    #[test]
    fn finds_responses() {
        assert_eq!(
            response_id(br#"{"jsonrpc":"2.0","id":7,"result":{}}"#),
            Some(RequestKey::of(&Value::from(7)))
        );
        assert_eq!(
            response_id(br#"{"jsonrpc":"2.0","id":"x","error":{"code":1,"message":"m"}}"#),
            Some(RequestKey::of(&Value::from("x")))
        );
        assert_eq!(
            response_id(br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#),
            None
        );
        assert_eq!(
            response_id(br#"{"jsonrpc":"2.0","id":3,"method":"sampling/createMessage"}"#),
            None
        );
        assert_eq!(response_id(b"not json"), None);
    }

    #[test]
    fn a_response_whose_keys_are_escaped_is_still_found() {
        // The pre-check that spares notifications the parse looks for the keys' plain spelling;
        // JSON may spell a key with `\u` escapes, and serde reads it as the same key.
        assert_eq!(
            response_id(br#"{"jsonrpc":"2.0","id":7,"res\u0075lt":{}}"#),
            Some(RequestKey::of(&Value::from(7)))
        );
        assert_eq!(
            response_id(br#"{"jsonrpc":"2.0","id":8,"\u0065rror":{"code":1,"message":"m"}}"#),
            Some(RequestKey::of(&Value::from(8)))
        );
        // A notification that merely mentions the words in its text is parsed, and no response.
        let mentions =
            br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"\"result\""}}"#;
        assert_eq!(response_id(mentions), None);
    }

    #[test]
    fn only_json_objects_are_responses() {
        assert_eq!(
            response_id(b" \r\n{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}"),
            Some(RequestKey::of(&Value::from(7)))
        );
        // A JSON array in the probe's field order (id, method, result, error) is no response.
        assert_eq!(response_id(br#"[7, null, {}, null]"#), None);
        // Invalid UTF-8 in a part the probe skips: not JSON, so no response.
        let skipped = b"{\"id\":\"x\",\"error\":{\"code\":-32601,\"me\xff\xffe\":\"m\"}}";
        assert!(serde_json::from_slice::<Value>(skipped).is_err());
        assert_eq!(response_id(skipped), None);
    }

    #[test]
    fn error_responses_are_valid_json() {
        let id = RequestKey::of(&Value::from("a\"b"));
        let text = error_response(&id, -32603, "lost \"it\"", "upstream_lost");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["id"], "a\"b");
        assert_eq!(v["error"]["code"], -32603);
        assert_eq!(v["error"]["data"]["reason"], "upstream_lost");
    }
}
