//! The checks of a 2026-07-28 request's standard headers against its body, before the request
//! goes anywhere (2026-07-28 Streamable HTTP transport, "Standard headers"; SEP-2243 "HTTP Header
//! Standardization"; spec P-04, P-05):
//!
//! - a request names its method in `Mcp-Method`, exactly: values are case-sensitive, and the
//!   optional whitespace around a field value is not part of it (RFC 9110 §5.5);
//! - `tools/call` and `prompts/get` name `params.name` in `Mcp-Name`, `resources/read` its
//!   `params.uri`, and the tasks extension's `tasks/get`, `tasks/update` and `tasks/cancel` their
//!   `params.taskId` (SEP-2663, "Streamable HTTP: Routing Headers"); a value that is not visible ASCII travels as `=?base64?<base64 of its
//!   UTF-8>?=` (the lowercase sentinel only); a request of another method carries no `Mcp-Name`;
//! - `MCP-Protocol-Version` is the version the body's
//!   `params._meta["io.modelcontextprotocol/protocolVersion"]` names, when it names one (a body
//!   without it is the MCP server's to refuse, with -32602);
//! - a notification needs no `Mcp-Method`, but the headers it carries agree with it;
//! - `initialize` is not a method of the version (404, -32601).
//!
//! A failure is MCP's `HeaderMismatch` (400, -32020) with the request's id
//! ([`Rejection::HeaderMismatch`]). `Mcp-Param-*` headers belong to the MCP server, whose tools
//! declare them (`x-mcp-header`): tether forwards them unchanged and checks nothing of them.
//! Requests of the 2025 versions are never checked on, nor routed by, any of these headers.

use base64::Engine as _;
use http::{HeaderMap, HeaderName};

use super::headers::{MCP_METHOD, MCP_NAME, MCP_PROTOCOL_VERSION};
use super::jsonrpc::{Envelope, Message, RequestKey};
use super::rejection::Rejection;

/// The key of `params._meta` that names a 2026-07-28 request's protocol version.
pub(crate) const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";

/// The `_meta` key naming the subscription a listen stream's messages belong to: the listen
/// request's id.
const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// The SSE event that ends listen request `id` gracefully: its result, `resultType`
/// `complete`, naming the subscription (SEP-2575 subscriptions, "Graceful Closure"). A client
/// that reads it knows the server ended the subscription, not the network, and listens again.
pub(crate) fn listen_completed(id: &RequestKey) -> bytes::Bytes {
    let id: serde_json::Value =
        serde_json::from_str(id.as_json()).unwrap_or(serde_json::Value::Null);
    let result = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "result": {"resultType": "complete", "_meta": {META_SUBSCRIPTION_ID: id}},
    });
    bytes::Bytes::from(format!("event: message\ndata: {result}\n\n"))
}

/// The sentinel around a base64-encoded standard header value (SEP-2243, "Header Processing").
const BASE64_PREFIX: &str = "=?base64?";
const BASE64_SUFFIX: &str = "?=";

/// The body field `Mcp-Name` mirrors for `method`, if the method has one.
fn named_field(method: &str) -> Option<&'static str> {
    match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
        _ => None,
    }
}

/// Checks a 2026-07-28 POST's standard headers against its parsed body (one message: the
/// version has no batches, B-02).
///
/// # Errors
/// [`Rejection::BatchNotAllowed`] for a batch, [`Rejection::MethodNotFound`] for `initialize`,
/// [`Rejection::HeaderMismatch`] naming the header that is missing, repeated, undecodable or
/// different from the body.
pub(crate) fn check(headers: &HeaderMap, envelope: &Envelope) -> Result<(), Rejection> {
    let [(message, json)] = envelope.messages.as_slice() else {
        return Err(Rejection::BatchNotAllowed);
    };
    if envelope.batch {
        return Err(Rejection::BatchNotAllowed);
    }
    let (method, required) = match message {
        Message::Request { method, .. } => (method.as_str(), true),
        Message::Notification { method, .. } => (method.as_str(), false),
        Message::Response => return Ok(()),
    };
    if method == "initialize" {
        return Err(Rejection::MethodNotFound("initialize"));
    }
    match value(headers, &MCP_METHOD, "Mcp-Method")? {
        None if required => {
            return Err(mismatch(format!(
                "Mcp-Method is required and names the body's method ({method})"
            )));
        }
        Some(header) if header != method => {
            return Err(mismatch(format!(
                "Mcp-Method {header:?} is not the body's method {method:?}"
            )));
        }
        _ => {}
    }
    let params = &json["params"];
    let named = named_field(method).and_then(|field| params[field].as_str().map(|v| (field, v)));
    match (value(headers, &MCP_NAME, "Mcp-Name")?, named) {
        (None, Some((field, _))) => {
            return Err(mismatch(format!(
                "Mcp-Name is required for {method} and names params.{field}"
            )));
        }
        (Some(header), Some((field, body))) if header != body => {
            return Err(mismatch(format!(
                "Mcp-Name {header:?} is not the body's params.{field} {body:?}"
            )));
        }
        (Some(_), None) => {
            return Err(mismatch(format!(
                "Mcp-Name names nothing of {method}: only tools/call, prompts/get (params.name), \
                 resources/read (params.uri) and tasks/get, tasks/update, tasks/cancel \
                 (params.taskId) carry it"
            )));
        }
        _ => {}
    }
    if let Some(body) = params["_meta"][META_PROTOCOL_VERSION].as_str()
        && value(headers, &MCP_PROTOCOL_VERSION, "MCP-Protocol-Version")?.as_deref() != Some(body)
    {
        return Err(mismatch(format!(
            "MCP-Protocol-Version is not the body's _meta protocol version {body:?}"
        )));
    }
    Ok(())
}

fn mismatch(detail: String) -> Rejection {
    Rejection::HeaderMismatch(detail)
}

/// The value of standard header `name`: its one field value without surrounding whitespace,
/// base64-decoded when wrapped in the sentinel.
fn value(
    headers: &HeaderMap,
    name: &HeaderName,
    display: &str,
) -> Result<Option<String>, Rejection> {
    let mut values = headers.get_all(name).iter();
    let Some(raw) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(mismatch(format!("{display} is repeated")));
    }
    let text = raw
        .to_str()
        .map_err(|_| mismatch(format!("{display} is not visible ASCII (use =?base64?…?=)")))?
        .trim_matches([' ', '\t']);
    let Some(encoded) = text
        .strip_prefix(BASE64_PREFIX)
        .and_then(|rest| rest.strip_suffix(BASE64_SUFFIX))
    else {
        return Ok(Some(text.to_owned()));
    };
    base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .map(Some)
        .ok_or_else(|| mismatch(format!("{display} is not valid base64 of UTF-8 text")))
}

/// `text` as a standard header value: as it is when it is visible ASCII with no whitespace at
/// its ends, else wrapped in the base64 sentinel (SEP-2243, "Header Processing").
pub(crate) fn header_value(text: &str) -> http::HeaderValue {
    let plain = !text.is_empty()
        && text.bytes().all(|b| (0x20..0x7f).contains(&b))
        && !text.starts_with([' ', '\t'])
        && !text.ends_with([' ', '\t'])
        && !text.starts_with(BASE64_PREFIX);
    let value = if plain {
        text.to_owned()
    } else {
        let encoded = base64::engine::general_purpose::STANDARD.encode(text);
        format!("{BASE64_PREFIX}{encoded}{BASE64_SUFFIX}")
    };
    http::HeaderValue::try_from(value)
        .unwrap_or_else(|_| unreachable!("visible ASCII is a valid header value"))
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;
    use serde_json::{Value, json};

    use super::*;
    use crate::mcp::jsonrpc::EnvelopeLimits;

    const LIMITS: EnvelopeLimits = EnvelopeLimits { max_batch: 16 };

    fn envelope(body: &Value) -> Envelope {
        Envelope::parse(body.to_string().as_bytes(), LIMITS).unwrap()
    }

    #[test]
    fn a_listen_stream_ends_with_its_requests_completion_result() {
        for id in [json!(9), json!("listen-\"a\"")] {
            let event = listen_completed(&RequestKey::of(&id));
            let text = std::str::from_utf8(&event).unwrap();
            let data = text
                .strip_prefix("event: message\ndata: ")
                .and_then(|t| t.strip_suffix("\n\n"))
                .expect(text);
            let message: Value = serde_json::from_str(data).unwrap();
            assert_eq!(message["id"], id);
            assert_eq!(message["result"]["resultType"], "complete");
            assert_eq!(message["result"]["_meta"][META_SUBSCRIPTION_ID], id);
        }
    }

    fn call(name: &str) -> Value {
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
            "name": name, "arguments": {},
            "_meta": {META_PROTOCOL_VERSION: "2026-07-28"}}})
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            "mcp-protocol-version",
            HeaderValue::from_static("2026-07-28"),
        );
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_bytes(v.as_bytes()).unwrap());
        }
        h
    }

    fn refused(h: &HeaderMap, body: &Value) -> String {
        match check(h, &envelope(body)) {
            Err(Rejection::HeaderMismatch(detail)) => detail,
            other => panic!("expected a header mismatch, got {other:?}"),
        }
    }

    #[test]
    fn p05_matching_headers_pass_with_whitespace_and_any_name_case() {
        let h = headers(&[("MCP-METHOD", " tools/call\t"), ("mcp-name", "  echo  ")]);
        assert_eq!(check(&h, &envelope(&call("echo"))), Ok(()));
        let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
        assert_eq!(
            check(&headers(&[("mcp-method", "tools/list")]), &envelope(&list)),
            Ok(())
        );
    }

    #[test]
    fn p05_a_request_without_or_with_another_mcp_method_is_refused() {
        let body = call("echo");
        assert!(refused(&headers(&[("mcp-name", "echo")]), &body).contains("required"));
        let h = headers(&[("mcp-method", "prompts/get"), ("mcp-name", "echo")]);
        assert!(refused(&h, &body).contains("\"prompts/get\""));
        // Values are case-sensitive.
        let h = headers(&[("mcp-method", "TOOLS/CALL"), ("mcp-name", "echo")]);
        refused(&h, &body);
        let h = headers(&[
            ("mcp-method", "tools/call"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "echo"),
        ]);
        assert!(refused(&h, &body).contains("repeated"));
    }

    #[test]
    fn p05_mcp_name_mirrors_name_or_uri_and_is_an_orphan_elsewhere() {
        let h = headers(&[
            ("mcp-method", "tools/call"),
            ("mcp-name", "wrong_tool_name"),
        ]);
        assert!(refused(&h, &call("echo")).contains("wrong_tool_name"));
        assert!(
            refused(&headers(&[("mcp-method", "tools/call")]), &call("echo")).contains("required")
        );
        let read = json!({"jsonrpc": "2.0", "id": 2, "method": "resources/read",
            "params": {"uri": "file:///a.txt"}});
        let h = headers(&[
            ("mcp-method", "resources/read"),
            ("mcp-name", "file:///a.txt"),
        ]);
        assert_eq!(check(&h, &envelope(&read)), Ok(()));
        let list = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"});
        let h = headers(&[("mcp-method", "tools/list"), ("mcp-name", "echo")]);
        assert!(refused(&h, &list).contains("names nothing"));
        // SEP-2663: the tasks extension's requests name their task.
        let get = json!({"jsonrpc": "2.0", "id": 4, "method": "tasks/get",
            "params": {"taskId": "t-1"}});
        let h = headers(&[("mcp-method", "tasks/get"), ("mcp-name", "t-1")]);
        assert_eq!(check(&h, &envelope(&get)), Ok(()));
        let h = headers(&[("mcp-method", "tasks/get")]);
        assert!(refused(&h, &get).contains("params.taskId"));
    }

    #[test]
    fn p05_base64_names_are_decoded_with_the_lowercase_sentinel_only() {
        let body = call("tööl");
        let encoded = format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode("tööl")
        );
        let h = headers(&[("mcp-method", "tools/call"), ("mcp-name", &encoded)]);
        assert_eq!(check(&h, &envelope(&body)), Ok(()));
        let h = headers(&[("mcp-method", "tools/call"), ("mcp-name", "=?base64?!!!?=")]);
        assert!(refused(&h, &body).contains("base64"));
        // Another case of the sentinel is a literal value, not base64.
        let upper = encoded.replace("base64", "BASE64");
        let h = headers(&[("mcp-method", "tools/call"), ("mcp-name", &upper)]);
        refused(&h, &body);
    }

    #[test]
    fn p04_the_version_header_is_the_bodys_meta_version() {
        let mut h = headers(&[("mcp-method", "tools/call"), ("mcp-name", "echo")]);
        h.insert(
            "mcp-protocol-version",
            HeaderValue::from_static("2025-11-25"),
        );
        assert!(refused(&h, &call("echo")).contains("_meta"));
        // A body without a _meta version is the MCP server's to refuse.
        let bare = json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}});
        assert_eq!(
            check(
                &headers(&[("mcp-method", "server/discover")]),
                &envelope(&bare)
            ),
            Ok(())
        );
    }

    #[test]
    fn notifications_need_no_mcp_method_and_initialize_and_batches_are_refused() {
        let note = json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {}});
        assert_eq!(check(&headers(&[]), &envelope(&note)), Ok(()));
        let h = headers(&[("mcp-method", "notifications/other")]);
        refused(&h, &note);
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}});
        assert_eq!(
            check(&headers(&[]), &envelope(&init)),
            Err(Rejection::MethodNotFound("initialize"))
        );
        let batch = json!([{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}]);
        assert_eq!(
            check(&headers(&[("mcp-method", "tools/list")]), &envelope(&batch)),
            Err(Rejection::BatchNotAllowed)
        );
    }

    #[test]
    fn values_round_trip_through_the_header() {
        for text in ["t-1", "  padded ", "ünïcode", "=?base64?x?=", ""] {
            let mut h = headers(&[]);
            h.insert(MCP_NAME, header_value(text));
            assert_eq!(
                value(&h, &MCP_NAME, "Mcp-Name").unwrap().as_deref(),
                Some(text)
            );
        }
        assert_eq!(header_value("t-1"), "t-1");
    }
}
