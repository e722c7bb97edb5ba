//! A 2026-07-28 (stateless) client: each request carries its own `_meta` (protocol version,
//! client capabilities) and the standard headers (`Mcp-Method`, `Mcp-Name`), and its answer
//! is read whole, JSON or SSE (its last message). With the tasks extension declared, a
//! task-augmented `tools/call` returns a task that [`get_task`] polls from any entry. Requests
//! go through an [`McpClient`] (its credentials and headers) to the URL given.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::client::{ACCEPT_BOTH, McpClient, body_text};
use crate::{HarnessError, Result};

/// The protocol version.
pub const VERSION: &str = "2026-07-28";
/// The tasks extension's identifier (SEP-2663).
pub const TASKS: &str = "io.modelcontextprotocol/tasks";

/// A request's `_meta`: the version, and the tasks extension when `tasks`.
pub fn meta(tasks: bool) -> Value {
    let capabilities = if tasks {
        json!({"extensions": {TASKS: {}}})
    } else {
        json!({})
    };
    json!({
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": "tether-tests", "version": "0"},
    })
}

/// POSTs request `id` of `method` with `params` (its `_meta` added, tasks declared) to `url`,
/// with `Mcp-Name: name` when given: the status and the answer's last JSON-RPC message.
///
/// # Errors
/// [`HarnessError`] when the exchange fails or the answer holds no JSON.
pub async fn request(
    client: &McpClient,
    url: &str,
    id: u64,
    method: &str,
    name: Option<&str>,
    mut params: Value,
) -> Result<(StatusCode, Value)> {
    params["_meta"] = meta(true);
    send(client, url, id, method, name, params).await
}

/// [`request`] with `params` as given (their `_meta` included).
///
/// # Errors
/// As [`request`].
pub async fn send(
    client: &McpClient,
    url: &str,
    id: u64,
    method: &str,
    name: Option<&str>,
    params: Value,
) -> Result<(StatusCode, Value)> {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let mut headers = vec![
        ("accept", ACCEPT_BOTH),
        ("content-type", "application/json"),
        ("mcp-protocol-version", VERSION),
        ("mcp-method", method),
    ];
    if let Some(name) = name {
        headers.push(("mcp-name", name));
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(30),
        client.send_at(
            url,
            Method::POST,
            &headers,
            Some(Bytes::from(body.to_string())),
        ),
    )
    .await
    .map_err(|_| HarnessError::Protocol(format!("{method}: no answer within 30 s")))??;
    let status = resp.status();
    let text = body_text(resp).await?;
    Ok((status, last_message(&text)?))
}

/// `tasks/get` of `task_id` (named in `Mcp-Name` too).
///
/// # Errors
/// As [`request`].
pub async fn get_task(
    client: &McpClient,
    url: &str,
    id: u64,
    task_id: &str,
) -> Result<(StatusCode, Value)> {
    request(
        client,
        url,
        id,
        "tasks/get",
        Some(task_id),
        json!({"taskId": task_id}),
    )
    .await
}

/// The last JSON-RPC message of an answer: its JSON body, or its last SSE `data`.
///
/// # Errors
/// [`HarnessError::Protocol`] when neither is JSON.
pub fn last_message(text: &str) -> Result<Value> {
    serde_json::from_str(text)
        .or_else(|_| {
            let data = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .next_back()
                .unwrap_or_default();
            serde_json::from_str(data.trim())
        })
        .map_err(|_| HarnessError::Protocol(format!("not a JSON-RPC answer: {text:?}")))
}
