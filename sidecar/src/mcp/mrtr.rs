//! Multi round-trip requests (MRTR, 2026-07-28, SEP-2322) across pods
//! (`docs/design/routing.md#multi-round-trip-requests`).
//!
//! A server that needs the client's input answers a `tools/call`, `prompts/get` or
//! `resources/read` with an `InputRequiredResult` (`resultType: "input_required"`) that may
//! carry a `requestState`: an opaque string the client echoes back in `params.requestState`
//! when it retries the request with its `inputResponses`. Servers protect that state with a key
//! of their own; when each pod has its own key, the retry must reach the pod that issued the
//! state, and a retry is a new request that may enter any pod.
//!
//! So tether hands the client the state sealed ([`super::sealed`], [`REQUEST_STATE`]
//! purpose): naming the issuing pod and bound to the request's principal ([`Owner`]). A retry
//! is routed to the pod its state names ([`issuer`]), where the state is opened ([`open`]) and
//! the MCP server gets back exactly the string it issued. A state that does not open never
//! reaches a server: the retry gets -32602 `request_state_invalid`.
//!
//! [`REQUEST_STATE`]: super::sealed::REQUEST_STATE

use serde_json::Value;

use super::home::HomeToken;
use super::principal::Owner;
use super::sealed::{SealError, Sealer};

/// The field the state travels in, both ways.
pub(crate) const REQUEST_STATE_FIELD: &str = "requestState";

/// Whether requests of `method` may be answered with an `InputRequiredResult` (and so retried
/// with a `requestState`): MRTR, "Supported Requests".
pub(crate) fn may_require_input(method: &str) -> bool {
    matches!(method, "tools/call" | "prompts/get" | "resources/read")
}

/// Seals the `requestState` of an `InputRequiredResult` in `message` (one JSON-RPC message of
/// the MCP server) in place, for `owner` (the principal of the request it answers). Returns
/// whether it did.
///
/// # Errors
/// [`SealError::TooLong`]: a state tether cannot seal (the message must not reach the client).
pub(crate) fn seal(message: &mut Value, states: &Sealer, owner: &Owner) -> Result<bool, SealError> {
    let Some(result) = message.get_mut("result") else {
        return Ok(false);
    };
    if result.get("resultType").and_then(Value::as_str) != Some("input_required") {
        return Ok(false);
    }
    let Some(Value::String(state)) = result.get_mut(REQUEST_STATE_FIELD) else {
        return Ok(false);
    };
    *state = states.mint(state, owner)?;
    Ok(true)
}

/// The pod that issued the `requestState` of `message` (a client's request), when it carries
/// one that opens for `owner` (routing; [`open`] decides where it is served).
pub(crate) fn issuer(message: &Value, states: &Sealer, owner: &Owner) -> Option<HomeToken> {
    let state = message.get("params")?.get(REQUEST_STATE_FIELD)?.as_str()?;
    states.open(state, owner).ok().map(|opened| opened.home)
}

/// Opens the `requestState` of `message` (a client's request of a [`may_require_input`]
/// method, presenting `owner`) in place: the pod that issued it, `None` when the request
/// carries none.
///
/// # Errors
/// A state that does not open (forged, altered, another owner's, a retired key's, not a
/// string).
pub(crate) fn open(
    message: &mut Value,
    states: &Sealer,
    owner: &Owner,
) -> Result<Option<HomeToken>, SealError> {
    let Some(state) = message
        .get_mut("params")
        .and_then(|p| p.get_mut(REQUEST_STATE_FIELD))
    else {
        return Ok(None);
    };
    let opened = state
        .as_str()
        .ok_or(SealError::Malformed)
        .and_then(|sealed| states.open(sealed, owner))?;
    *state = Value::String(opened.upstream);
    Ok(Some(opened.home))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::keys::KeyRing;
    use crate::mcp::sealed::{MAX_UPSTREAM_REQUEST_STATE, REQUEST_STATE};

    fn states(pod: &str) -> Sealer {
        Sealer::new(
            KeyRing::from_bytes(b"0123456789abcdef".to_vec()),
            HomeToken::for_pod(pod),
            &REQUEST_STATE,
        )
    }

    fn input_required(state: &str) -> Value {
        json!({"jsonrpc": "2.0", "id": 1, "result": {"resultType": "input_required",
            "inputRequests": {"confirm": {"method": "elicitation/create", "params": {}}},
            "requestState": state}})
    }

    fn retry(state: Value) -> Value {
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "confirm",
            "inputResponses": {"confirm": {"action": "accept"}}, "requestState": state}})
    }

    #[test]
    fn only_the_three_supported_requests_may_require_input() {
        let cases = [
            ("tools/call", true),
            ("prompts/get", true),
            ("resources/read", true),
            ("tools/list", false),
            ("tasks/get", false),
            ("subscriptions/listen", false),
        ];
        for (method, expected) in cases {
            assert_eq!(may_require_input(method), expected, "{method}");
        }
    }

    /// The server's state goes out sealed and comes back to it byte for byte, at any pod of
    /// the endpoint, naming the pod that issued it.
    #[test]
    fn a_state_sealed_by_one_pod_names_it_and_opens_to_the_servers_bytes() {
        let (a, b) = (states("a"), states("b"));
        let alice = Owner::from_bytes(b"alice");
        let server_state = "eyJzdGVwIjoyfQ.c2lnbmF0dXJl+/=";
        let mut answer = input_required(server_state);
        assert_eq!(seal(&mut answer, &a, &alice), Ok(true));
        let sealed = answer["result"]["requestState"].clone();
        assert_ne!(sealed, server_state);
        assert!(!sealed.as_str().unwrap().contains("eyJzdGVwIjoyfQ"));
        let mut request = retry(sealed);
        assert_eq!(issuer(&request, &b, &alice), Some(HomeToken::for_pod("a")));
        assert_eq!(
            open(&mut request, &b, &alice),
            Ok(Some(HomeToken::for_pod("a")))
        );
        assert_eq!(request["params"]["requestState"], server_state);
        assert_eq!(
            request["params"]["inputResponses"]["confirm"]["action"],
            "accept"
        );
    }

    #[test]
    fn a_state_opens_only_for_its_principal() {
        let a = states("a");
        let mut answer = input_required("s-1");
        seal(&mut answer, &a, &Owner::from_bytes(b"alice")).unwrap();
        let request = retry(answer["result"]["requestState"].clone());
        for other in [Owner::from_bytes(b"bob"), Owner::ANONYMOUS] {
            assert_eq!(issuer(&request, &a, &other), None);
            assert_eq!(
                open(&mut request.clone(), &a, &other),
                Err(SealError::BadSeal)
            );
        }
    }

    /// Only an `InputRequiredResult`'s string state is sealed; a request without a state
    /// passes; one with a state tether did not seal (the server's own, forged) is refused.
    #[test]
    fn what_is_sealed_and_what_is_refused() {
        let a = states("a");
        let anon = Owner::ANONYMOUS;
        let untouched = [
            json!({"jsonrpc": "2.0", "id": 1, "result": {"resultType": "complete",
                "requestState": "s", "content": []}}),
            json!({"jsonrpc": "2.0", "id": 1, "result": {"resultType": "input_required",
                "inputRequests": {}}}),
            json!({"jsonrpc": "2.0", "id": 1, "result": {"resultType": "input_required",
                "requestState": 7}}),
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "x"}}),
        ];
        for mut message in untouched {
            let before = message.clone();
            assert_eq!(seal(&mut message, &a, &anon), Ok(false), "{before}");
            assert_eq!(message, before);
        }
        let mut first = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "confirm"}});
        assert_eq!(open(&mut first, &a, &anon), Ok(None));
        for forged in [
            json!("the-servers-own-state"),
            json!(""),
            json!(42),
            json!(null),
        ] {
            let mut request = retry(forged.clone());
            assert_eq!(issuer(&request, &a, &anon), None, "{forged}");
            assert!(open(&mut request, &a, &anon).is_err(), "{forged}");
        }
        let mut big = input_required(&"x".repeat(MAX_UPSTREAM_REQUEST_STATE + 1));
        assert_eq!(seal(&mut big, &a, &anon), Err(SealError::TooLong));
    }
}
