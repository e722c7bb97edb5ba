//! The JSON-RPC envelope classifier (`sidecar/src/mcp/jsonrpc.rs`, `Envelope::parse`).
//!
//! The first byte sets `--max-batch` (1 to 16), the rest is a POST body. Invariants:
//!
//! - the verdict is the one the rules define, recomputed here from the body's JSON: refused as
//!   a parse error exactly when the body is not JSON (or a batch is refused for its size before
//!   its end is read); otherwise accepted or refused with the documented reason of the first
//!   member at fault;
//! - an accepted body is a batch exactly when it starts with `[`, holds 1 to `max_batch`
//!   messages each classified as its fields say (requests with ids of at most 256 bytes that do
//!   not repeat), and the same batch is refused with one member fewer allowed;
//! - bodies with the same JSON value (re-serialised) get the same verdict and digest;
//! - `response_id` finds an id exactly in responses.

#![no_main]

use std::collections::HashSet;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tether_sidecar::fuzzing::{
    Classified, EnvelopeRejection, MAX_ID_BYTES, is_batch, parse_envelope, request_key, response_id,
};

const TOO_MANY: &str = "a batch holds at most";

fuzz_target!(|data: &[u8]| {
    let Some((&limit, body)) = data.split_first() else {
        return;
    };
    let max_batch = 1 + usize::from(limit % 16);
    let verdict = parse_envelope(body, max_batch);
    let json: Result<Value, _> = serde_json::from_slice(body);
    match (&verdict, &json) {
        (Ok(envelope), Ok(value)) => {
            assert_eq!(model(value, max_batch), Ok(()), "{value}");
            check_accepted(envelope, value, max_batch);
            assert_eq!(envelope.batch, is_batch(body));
            if envelope.batch && envelope.messages.len() > 1 {
                let fewer = envelope.messages.len() - 1;
                match parse_envelope(body, fewer) {
                    Err(EnvelopeRejection::Invalid(m)) => {
                        assert!(m.starts_with(&format!("{TOO_MANY} {fewer} ")), "{m}")
                    }
                    other => panic!(
                        "a batch of {} under --max-batch {fewer}: {other:?}",
                        fewer + 1
                    ),
                }
            }
        }
        (Ok(_), Err(e)) => panic!("accepted a body that is not JSON: {e}"),
        (Err(EnvelopeRejection::Parse(m)), Ok(value)) => {
            panic!("JSON refused as not JSON ({m}): {value}")
        }
        (Err(EnvelopeRejection::Parse(_)), Err(_)) => {}
        (Err(EnvelopeRejection::Invalid(m)), _) if m.starts_with(TOO_MANY) => {
            assert!(is_batch(body), "{m}");
            assert_eq!(m, &format!("{TOO_MANY} {max_batch} messages (--max-batch)"));
            if let Ok(Value::Array(items)) = &json {
                assert!(items.len() > max_batch, "{m}: {} members", items.len());
            }
        }
        (Err(EnvelopeRejection::Invalid(m)), Ok(value)) => {
            assert_eq!(model(value, max_batch), Err(m.clone()), "{value}");
        }
        (Err(EnvelopeRejection::Invalid(m)), Err(e)) => {
            panic!("not JSON ({e}) but refused as invalid: {m}")
        }
    }
    // The same value, written compactly, gets the same verdict (and digest).
    if let Ok(value) = &json {
        let text = serde_json::to_vec(value).unwrap();
        let again: Value = serde_json::from_slice(&text).unwrap();
        if &again == value {
            assert_eq!(parse_envelope(&text, max_batch), verdict, "{value}");
        }
    }
    // JSON allows numbers beyond an f64, which serde_json's `Value` refuses ("number out of
    // range") while the response probe only skips over them: such a body is still the response
    // of its id, and the checks below need the `Value`.
    if let (Some(id), Ok(value)) = (response_id(body), &json) {
        let obj = value.as_object().expect("a response is an object");
        assert!(!obj.contains_key("method") || obj["method"].is_null());
        assert!(obj.contains_key("result") || obj.contains_key("error"));
        assert_eq!(request_key(&obj["id"]), id);
    }
});

fn check_accepted(envelope: &tether_sidecar::fuzzing::Envelope, value: &Value, max_batch: usize) {
    let items: Vec<&Value> = match value {
        Value::Array(items) => items.iter().collect(),
        one => vec![one],
    };
    assert_eq!(envelope.batch, value.is_array());
    assert!(!items.is_empty() && items.len() <= max_batch);
    assert!(envelope.batch || items.len() == 1);
    assert_eq!(envelope.messages.len(), items.len());
    let mut ids = Vec::new();
    for (message, item) in envelope.messages.iter().zip(&items) {
        let obj = item.as_object().expect("a message is an object");
        assert_eq!(obj.get("jsonrpc"), Some(&Value::from("2.0")));
        match message {
            Classified::Request { id, method, raw } => {
                assert_eq!(raw, *item);
                assert_eq!(obj.get("method"), Some(&Value::from(method.as_str())));
                let json_id = &obj["id"];
                assert!(json_id.is_string() || json_id.is_number());
                assert_eq!(&request_key(json_id), id);
                assert!(id.len() <= MAX_ID_BYTES, "{id}");
                ids.push(id.clone());
            }
            Classified::Notification {
                method,
                params,
                raw,
            } => {
                assert_eq!(raw, *item);
                assert_eq!(obj.get("method"), Some(&Value::from(method.as_str())));
                assert!(!obj.contains_key("id"));
                assert_eq!(params, obj.get("params").unwrap_or(&Value::Null));
            }
            Classified::Response { raw } => {
                assert_eq!(raw, *item);
                assert!(!obj.contains_key("method"));
                assert!(obj.contains_key("result") || obj.contains_key("error"));
            }
        }
    }
    assert_eq!(envelope.request_ids, ids);
    assert_eq!(
        ids.iter().collect::<HashSet<_>>().len(),
        ids.len(),
        "ids repeat"
    );
    let is_init =
        |m: &Classified| matches!(m, Classified::Request { method, .. } if method == "initialize");
    assert_eq!(
        envelope.is_initialize,
        !envelope.batch && is_init(&envelope.messages[0])
    );
    assert_eq!(
        envelope.contains_initialize,
        envelope.messages.iter().any(is_init)
    );
}

/// The rules, written out: `Ok` for an acceptable body, else the reason the first member at
/// fault is refused with.
fn model(value: &Value, max_batch: usize) -> Result<(), String> {
    let items: Vec<&Value> = match value {
        Value::Array(items) if items.is_empty() => return Err("empty batch".into()),
        Value::Array(items) if items.len() > max_batch => {
            return Err(format!("{TOO_MANY} {max_batch} messages (--max-batch)"));
        }
        Value::Array(items) => items.iter().collect(),
        one => vec![one],
    };
    let mut seen = HashSet::new();
    for item in items {
        let Value::Object(obj) = item else {
            return Err("a message must be a JSON object".into());
        };
        if obj.get("jsonrpc") != Some(&Value::from("2.0")) {
            return Err("\"jsonrpc\" must be \"2.0\"".into());
        }
        match (obj.get("method"), obj.get("id")) {
            (Some(Value::String(_)), None) => {}
            (Some(Value::String(_)), Some(id @ (Value::String(_) | Value::Number(_)))) => {
                let key = request_key(id);
                if key.len() > MAX_ID_BYTES {
                    return Err(format!(
                        "a request id may be at most {MAX_ID_BYTES} bytes of JSON; this one is {}",
                        key.len()
                    ));
                }
                if !seen.insert(key.clone()) {
                    return Err(format!("request id {key} repeats within the batch"));
                }
            }
            (Some(Value::String(_)), Some(_)) => {
                return Err("a request id must be a string or a number".into());
            }
            (Some(_), _) => return Err("\"method\" must be a string".into()),
            (None, _) if obj.contains_key("result") || obj.contains_key("error") => {}
            (None, _) => {
                return Err("a message needs \"method\", \"result\" or \"error\"".into());
            }
        }
    }
    Ok(())
}
