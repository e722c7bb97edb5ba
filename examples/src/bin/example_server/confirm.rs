//! The `confirm` tool: a multi round-trip request (MRTR, 2026-07-28, SEP-2322) as stateless
//! servers write it. The first call is answered with an `InputRequiredResult`: an
//! `elicitation/create` asking the user to confirm (when the client declared elicitation) and
//! a `requestState` sealed with this process's key (rmcp's `RequestStateCodec`: HMAC, bound to
//! the tool and the call id, 10-minute TTL). The retry brings the user's answer and the state
//! back; a state that does not verify is refused (-32602) and counted in `/stats`
//! `request_states_rejected`, a verified one in `request_states_verified`.
//!
//! Each process draws its own key unless `--request-state-key FILE` gives a shared one: with
//! one key per pod, a retry verifies only at the pod that issued its state.

use std::time::Duration;

use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, InputRequests,
    InputRequiredResult, RequestStateCodec, SealOptions,
};
use serde_json::json;

/// What the state is bound to besides its call id.
const CONTEXT: &[u8] = b"tools/call:confirm";
/// How long a state verifies.
const TTL: Duration = Duration::from_secs(600);

/// The codec of `key` (at least 32 bytes), or of 32 random bytes.
pub(crate) fn codec(key: Option<Vec<u8>>) -> std::io::Result<RequestStateCodec> {
    let key = key.unwrap_or_else(|| rand::random::<[u8; 32]>().to_vec());
    RequestStateCodec::try_new(key)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))
}

/// Answers a `confirm` call (`elicitation`: the client declared it).
pub(crate) fn call(
    codec: &RequestStateCodec,
    stats: &super::Stats,
    request: &CallToolRequestParams,
    elicitation: bool,
) -> Result<CallToolResponse, ErrorData> {
    let call_id = request
        .arguments
        .as_ref()
        .and_then(|a| a.get("call_id"))
        .and_then(|v| v.as_str())
        .ok_or_else(|| ErrorData::invalid_params("confirm takes a string call_id", None))?;
    let context = [CONTEXT, b"\n", call_id.as_bytes()].concat();
    let Some(state) = request.request_state.as_deref() else {
        let state = codec.seal_with(
            call_id.as_bytes(),
            &SealOptions::new().associated_data(&context).ttl(TTL),
        );
        let asks: InputRequests = if elicitation {
            serde_json::from_value(json!({"confirm": {
                "method": "elicitation/create",
                "params": {"mode": "form", "message": format!("Confirm {call_id}?"),
                    "requestedSchema": {"type": "object",
                        "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}},
            }}))
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?
        } else {
            InputRequests::new()
        };
        let asks = (!asks.is_empty()).then_some(asks);
        return Ok(InputRequiredResult::new(asks, Some(state)).into());
    };
    if codec.open_with(state, &context).is_err() {
        stats
            .request_states_rejected
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Err(ErrorData::invalid_params(
            "requestState does not verify",
            Some(json!({"reason": "request_state_rejected"})),
        ));
    }
    stats
        .request_states_verified
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let action = request
        .input_responses
        .as_ref()
        .and_then(|r| r.get("confirm"))
        .and_then(|r| r.get("action"))
        .and_then(|a| a.as_str())
        .unwrap_or("none");
    Ok(CallToolResponse::Complete(CallToolResult::success(vec![
        ContentBlock::text(format!("confirmed {call_id}: {action}")),
    ])))
}
