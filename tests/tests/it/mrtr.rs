//! Multi round-trip requests (MRTR, 2026-07-28, SEP-2322) across pods: a server that seals its
//! `requestState` with a key of its own (one per pod) verifies a retry only where it issued the
//! state, and a retry is a new request that may enter any pod. tether hands the client the
//! state sealed, naming its pod; the retry is served there and the server gets its own string
//! back (`docs/design/routing.md#multi-round-trip-requests`).

use serde_json::{Value, json};
use tether_tests::client::McpClient;
use tether_tests::modern::{meta, send};

/// A request's `_meta` declaring form elicitation.
fn eliciting() -> Value {
    let mut m = meta(false);
    m["io.modelcontextprotocol/clientCapabilities"] = json!({"elicitation": {"form": {}}});
    m
}

/// `confirm` of `call_id` entering at `url`, the first round: the `InputRequiredResult`.
async fn first_round(mcp: &McpClient, url: &str, id: u64, call_id: &str) -> Value {
    let params =
        json!({"name": "confirm", "arguments": {"call_id": call_id}, "_meta": eliciting()});
    let (status, answer) = send(mcp, url, id, "tools/call", Some("confirm"), params)
        .await
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    let result = &answer["result"];
    assert_eq!(result["resultType"], "input_required", "{answer}");
    assert_eq!(
        result["inputRequests"]["confirm"]["method"], "elicitation/create",
        "{answer}"
    );
    assert!(result["requestState"].is_string(), "{answer}");
    result.clone()
}

/// The retry of `confirm` of `call_id` with `state`, entering at `url`: the answer.
async fn retry(mcp: &McpClient, url: &str, id: u64, call_id: &str, state: &Value) -> Value {
    let params = json!({"name": "confirm", "arguments": {"call_id": call_id},
        "inputResponses": {"confirm": {"action": "accept", "content": {"ok": true}}},
        "requestState": state, "_meta": eliciting()});
    let (status, answer) = send(mcp, url, id, "tools/call", Some("confirm"), params)
        .await
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], id, "{answer}");
    answer
}

/// 20 calls, each retried at the pod its first round did not enter: every retry verifies at
/// the pod that issued its state (10 each), none is refused, and a state altered by one
/// character never reaches a server.
#[tokio::test]
async fn m01_retries_reach_the_pod_that_issued_their_request_state() {
    let ips = tether_tests::addr::ips::<2>();
    let cluster =
        tether_tests::cluster::Cluster::start(&ips, tether_tests::pod::PodSpec::default())
            .await
            .unwrap();
    let mcp = McpClient::new("http://127.0.0.1:1/unused");
    let urls = [&cluster.pods[0].mcp_url, &cluster.pods[1].mcp_url];
    for i in 0..20u64 {
        let call_id = format!("c-{i}");
        let first = first_round(&mcp, urls[(i % 2) as usize], 1, &call_id).await;
        let answer = retry(
            &mcp,
            urls[((i + 1) % 2) as usize],
            2,
            &call_id,
            &first["requestState"],
        )
        .await;
        assert_eq!(
            answer["result"]["content"][0]["text"],
            format!("confirmed {call_id}: accept"),
            "{answer}"
        );
    }
    for pod in &cluster.pods {
        let stats = pod.stats().await.unwrap();
        assert_eq!(stats["request_states_verified"], 10, "{stats}");
        assert_eq!(stats["request_states_rejected"], 0, "{stats}");
        let forwarded = r#"tether_mrtr_retries_total{outcome="forwarded"}"#;
        let served = r#"tether_mrtr_retries_total{outcome="served_by_issuer"}"#;
        assert_eq!(pod.metric(forwarded).await.unwrap(), 10.0);
        assert_eq!(pod.metric(served).await.unwrap(), 10.0);
    }
    let first = first_round(&mcp, urls[0], 1, "c-forged").await;
    let state = first["requestState"].as_str().unwrap();
    let mut altered = state.to_owned();
    let last = if state.ends_with('A') { "B" } else { "A" };
    altered.replace_range(state.len() - 1.., last);
    for entry in urls {
        let answer = retry(&mcp, entry, 7, "c-forged", &json!(altered)).await;
        assert_eq!(answer["error"]["code"], -32602, "{answer}");
        assert_eq!(
            answer["error"]["data"]["reason"], "request_state_invalid",
            "{answer}"
        );
    }
    for pod in &cluster.pods {
        assert_eq!(pod.stats().await.unwrap()["request_states_rejected"], 0);
    }
    // A retry over 64 KiB cannot be resent by a forward: the pod it entered serves it, and
    // says so.
    let first = first_round(&mcp, urls[0], 1, "c-large").await;
    let params = json!({"name": "confirm", "arguments": {"call_id": "c-large"},
        "inputResponses": {"confirm": {"action": "accept", "content": {"note": "x".repeat(70_000)}}},
        "requestState": first["requestState"], "_meta": eliciting()});
    let (_, answer) = send(&mcp, urls[1], 8, "tools/call", Some("confirm"), params)
        .await
        .unwrap();
    assert_eq!(
        answer["error"]["code"], -32602,
        "refused by a server of another key: {answer}"
    );
    let too_large = r#"tether_mrtr_retries_total{outcome="too_large"}"#;
    assert_eq!(cluster.pods[1].metric(too_large).await.unwrap(), 1.0);
    assert_eq!(
        cluster.pods[1].stats().await.unwrap()["request_states_rejected"],
        1
    );
}

/// The pod that issued a state is gone before the retry: the retry is served where it entered.
/// A server with one key per pod refuses it there (so the client starts over); servers that
/// share their key across pods (`--request-state-key` here) complete it.
#[tokio::test]
async fn m01_a_retry_outliving_its_issuer_needs_a_key_shared_by_the_pods() {
    let ips = tether_tests::addr::ips::<4>();
    let key = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key.path(), [7u8; 32]).unwrap();
    let shared = tether_tests::pod::PodSpec {
        server_args: vec![
            "--request-state-key".into(),
            key.path().display().to_string(),
        ],
        ..tether_tests::pod::PodSpec::default()
    };
    for (pair, spec, completes) in [
        (&ips[..2], tether_tests::pod::PodSpec::default(), false),
        (&ips[2..], shared, true),
    ] {
        let mut cluster = tether_tests::cluster::Cluster::start(pair, spec)
            .await
            .unwrap();
        let mcp = McpClient::new("http://127.0.0.1:1/unused");
        let (a_url, b_url) = (
            cluster.pods[0].mcp_url.clone(),
            cluster.pods[1].mcp_url.clone(),
        );
        let first = first_round(&mcp, &a_url, 1, "c-gone").await;
        cluster.drain_and_remove(pair[0]).await.unwrap();
        let answer = retry(&mcp, &b_url, 2, "c-gone", &first["requestState"]).await;
        let b = cluster.pods.iter().find(|p| p.mcp_url == b_url).unwrap();
        let gone = r#"tether_mrtr_retries_total{outcome="issuer_gone"}"#;
        assert_eq!(b.metric(gone).await.unwrap(), 1.0);
        let stats = b.stats().await.unwrap();
        if completes {
            assert_eq!(
                answer["result"]["content"][0]["text"],
                "confirmed c-gone: accept"
            );
            assert_eq!(stats["request_states_verified"], 1, "{stats}");
        } else {
            assert_eq!(answer["error"]["code"], -32602, "{answer}");
            assert_eq!(stats["request_states_rejected"], 1, "{stats}");
        }
    }
}
