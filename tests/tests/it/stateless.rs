//! 2026-07-28 (stateless) traffic through a real pod: passed through without sessions, and a
//! client disconnect cancels the upstream request (spec L-05, S-10, R-08).

use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{Value, json};
use tether_tests::client::{ACCEPT_BOTH, Events, body_text, header_str};
use tether_tests::pod::Pod;

const V4: &str = tether_tests::modern::VERSION;

fn call(id: u64, name: &str, arguments: Value, token: Option<&str>) -> Bytes {
    let mut meta = tether_tests::modern::meta(false);
    if let Some(t) = token {
        meta["progressToken"] = json!(t);
    }
    let body = json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": name, "arguments": arguments, "_meta": meta}
    });
    Bytes::from(body.to_string())
}

async fn post(
    url: &str,
    name: &'static str,
    body: Bytes,
    stale_sid: Option<&str>,
) -> http::Response<hyper::body::Incoming> {
    let mut h = vec![
        ("accept", ACCEPT_BOTH),
        ("content-type", "application/json"),
        ("mcp-protocol-version", V4),
        ("mcp-method", "tools/call"),
        ("mcp-name", name),
    ];
    if let Some(sid) = stale_sid {
        h.push(("mcp-session-id", sid));
        h.push(("last-event-id", "abcdefghijkl-1"));
    }
    tether_tests::client::Http::new()
        .send(Method::POST, url, &h, Some(body))
        .await
        .unwrap()
}

#[tokio::test]
async fn s10_stateless_requests_pass_through_without_session_headers() {
    let pod = Pod::start_default().await.unwrap();
    let resp = post(
        &pod.mcp_url,
        "echo",
        call(2, "echo", json!({"text": "v4"}), None),
        Some("stale-session"),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        resp.headers().get("mcp-session-id").is_none(),
        "never minted or echoed"
    );
    assert!(header_str(&resp, "access-control-expose-headers").is_some());
    assert!(body_text(resp).await.unwrap().contains("\"text\":\"v4\""));
    assert_eq!(
        pod.metric("tether_sessions_created_total").await.unwrap(),
        0.0
    );
    assert_eq!(
        pod.metric("tether_requests_total{method=\"POST\",era=\"stateless\"}")
            .await
            .unwrap(),
        1.0
    );
}

#[tokio::test]
async fn l05_fr19_a_disconnect_cancels_the_upstream_request() {
    let pod = Pod::start_default().await.unwrap();
    let args = json!({"count": 40, "interval_ms": 50, "call_id": "v4-cut"});
    let resp = post(
        &pod.mcp_url,
        "slow",
        call(2, "slow", args, Some("v4-cut")),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut events = Events::new(resp);
    let first = events.next_within(Duration::from_secs(5)).await.unwrap();
    assert!(first.data.unwrap().contains("notifications/progress"));
    drop(events);
    let stats = pod
        .wait_for_stats(Duration::from_secs(5), |stats| stats["aborted"] == 1)
        .await
        .unwrap();
    assert_eq!(stats["aborted"], 1, "upstream request aborted: {stats}");
    assert_eq!(stats["completed"], 0);
}

#[tokio::test]
async fn stateless_get_and_delete_reach_the_upstream_unchanged() {
    let pod = Pod::start_default().await.unwrap();
    let http = pod.client().http().clone();
    for method in [Method::GET, Method::DELETE] {
        let resp = http
            .send(
                method.clone(),
                &pod.mcp_url,
                &[
                    ("accept", "text/event-stream"),
                    ("mcp-protocol-version", V4),
                ],
                None,
            )
            .await
            .unwrap();
        assert_eq!(
            resp.status(),
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} (S-10)"
        );
    }
}

#[tokio::test]
async fn p04_initialize_does_not_exist_in_2026_07_28() {
    let pod = Pod::start_default().await.unwrap();
    let body = Bytes::from(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": V4, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
        .to_string(),
    );
    let h = [
        ("accept", ACCEPT_BOTH),
        ("content-type", "application/json"),
        ("mcp-protocol-version", V4),
        ("mcp-method", "initialize"),
    ];
    let resp = pod
        .client()
        .http()
        .send(Method::POST, &pod.mcp_url, &h, Some(body.clone()))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert!(body_text(resp).await.unwrap().contains("-32601"));
    // Named in the body only, it is refused the same way before the upstream, with its id.
    let resp = pod
        .client()
        .http()
        .send(Method::POST, &pod.mcp_url, &h[..3], Some(body))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert!(resp.headers().get("mcp-session-id").is_none());
    let answer: Value = serde_json::from_str(&body_text(resp).await.unwrap()).unwrap();
    assert_eq!(answer["error"]["code"], -32601);
    assert_eq!(answer["id"], 1);
    assert_eq!(
        pod.metric("tether_sessions_created_total").await.unwrap(),
        0.0
    );
}

/// A 2026-07-28 POST of `body` (`method` in the body) with the standard headers `extra` and
/// the usual ones; its status and JSON answer.
async fn post_v4(url: &str, extra: &[(&str, &str)], body: &Value) -> (StatusCode, Value) {
    let mut h = vec![
        ("accept", ACCEPT_BOTH),
        ("content-type", "application/json"),
        ("mcp-protocol-version", V4),
    ];
    h.extend_from_slice(extra);
    let resp = tether_tests::client::Http::new()
        .send(Method::POST, url, &h, Some(Bytes::from(body.to_string())))
        .await
        .unwrap();
    let status = resp.status();
    let text = body_text(resp).await.unwrap();
    let json = tether_tests::modern::last_message(&text).unwrap_or_else(|e| panic!("{e}"));
    (status, json)
}

/// SEP-2243 ("HTTP Header Standardization"), 2026-07-28 Streamable HTTP "Standard headers":
/// a header that disagrees with the body, or names nothing, is refused with `HeaderMismatch`
/// before the MCP server sees the request; `Mcp-Param-*` headers reach it unchanged.
#[tokio::test]
async fn p05_mismatched_headers_never_reach_the_server_and_mcp_param_headers_do() {
    let ip = tether_tests::addr::next_ip();
    let front = tether_tests::addr::next_ip();
    let tap = tether_tests::tap::Tap::start(
        (front, tether_tests::pod::UPSTREAM_PORT).into(),
        (ip, tether_tests::pod::UPSTREAM_PORT).into(),
        std::sync::Arc::new(|_: &str| false),
    )
    .await
    .unwrap();
    let spec = tether_tests::pod::PodSpec {
        upstream_via: Some(tap.addr),
        ..tether_tests::pod::PodSpec::default()
    };
    let pod = Pod::start_at(ip, spec).await.unwrap();
    let echo = json!({"jsonrpc": "2.0", "id": 41, "method": "tools/call", "params": {
        "name": "echo", "arguments": {"text": "eu"}, "_meta": tether_tests::modern::meta(false)}});
    let list = json!({"jsonrpc": "2.0", "id": 42, "method": "tools/list",
        "params": {"_meta": tether_tests::modern::meta(false)}});
    let refused = [
        (
            &echo,
            vec![("mcp-method", "tools/list"), ("mcp-name", "echo")],
        ),
        (
            &echo,
            vec![
                ("mcp-method", "tools/call"),
                ("mcp-name", "wrong_tool_name"),
            ],
        ),
        (&echo, vec![("mcp-method", "tools/call")]),
        (
            &list,
            vec![("mcp-method", "tools/list"), ("mcp-name", "echo")],
        ),
        (&list, vec![]),
    ];
    for (body, extra) in &refused {
        let (status, answer) = post_v4(&pod.mcp_url, extra, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{extra:?}: {answer}");
        assert_eq!(answer["error"]["code"], -32020, "{answer}");
        assert_eq!(answer["id"], body["id"], "the request's id: {answer}");
    }
    assert!(tap.recorded().is_empty(), "refused before the MCP server");
    let extra = [
        ("mcp-method", "tools/call"),
        ("mcp-name", " echo "),
        ("mcp-param-region", "eu-west"),
    ];
    let (status, answer) = post_v4(&pod.mcp_url, &extra, &echo).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["id"], 41);
    let seen = tap.recorded();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].header("mcp-param-region").as_deref(),
        Some("eu-west")
    );
    assert_eq!(seen[0].header("mcp-method").as_deref(), Some("tools/call"));
    // Optional whitespace is not part of a field value (RFC 9110 §5.5).
    assert_eq!(seen[0].header("mcp-name").as_deref(), Some("echo"));
    assert_eq!(
        pod.metric("tether_rejections_total{status=\"400\",reason=\"header_mismatch\"}")
            .await
            .unwrap(),
        refused.len() as f64
    );
}

/// The standard headers mean nothing before 2026-07-28: a session's request that carries wrong
/// ones is served as its body says.
#[tokio::test]
async fn p05_sessionful_requests_are_not_checked_on_the_standard_headers() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    let resp = client
        .post(
            Some(&session),
            &tether_tests::client::tools_list(2),
            &[("mcp-method", "prompts/get"), ("mcp-name", "nothing")],
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let listed = tether_tests::client::messages(resp, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        listed.iter().any(|m| m["result"]["tools"].is_array()),
        "{listed:?}"
    );
}

/// SEP-2575 (2026-07-28 "Protocol version negotiation"; spec P-04): an endpoint that admits
/// 2026-07-28 answers an unknown version with `UnsupportedProtocolVersionError` (-32022, the
/// request's id, the versions usable without a handshake); one that does not answers a modern
/// request with a 400 whose body is no MCP code, so that a dual-era client falls back to
/// `initialize` (2026-07-28 "Backwards compatibility").
#[tokio::test]
async fn p04_era_signalling_with_and_without_2026_07_28() {
    let discover = |version: &str| {
        json!({"jsonrpc": "2.0", "id": 301, "method": "server/discover", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": version,
            "io.modelcontextprotocol/clientCapabilities": {}}}})
    };
    let dual = Pod::start_default().await.unwrap();
    let (status, answer) = post_v4(
        &dual.mcp_url,
        &[("mcp-method", "server/discover")],
        &discover(V4),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "server/discover passes through: {answer}"
    );
    let mut h = vec![
        ("accept", ACCEPT_BOTH),
        ("content-type", "application/json"),
        ("mcp-protocol-version", "2099-01-01"),
        ("mcp-method", "server/discover"),
    ];
    let resp = tether_tests::client::Http::new()
        .send(
            Method::POST,
            &dual.mcp_url,
            &h,
            Some(Bytes::from(discover("2099-01-01").to_string())),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let answer: Value = serde_json::from_str(&body_text(resp).await.unwrap()).unwrap();
    assert_eq!(answer["id"], 301, "{answer}");
    assert_eq!(answer["error"]["code"], -32022);
    assert_eq!(answer["error"]["data"]["supported"], json!([V4]));
    assert_eq!(answer["error"]["data"]["requested"], "2099-01-01");

    let old = Pod::start(tether_tests::pod::PodSpec {
        versions: vec!["2025-06-18".into(), "2025-11-25".into()],
        ..tether_tests::pod::PodSpec::default()
    })
    .await
    .unwrap();
    h[2] = ("mcp-protocol-version", V4);
    let bare = [h[0], h[1], h[3]];
    for headers in [&h[..], &bare[..]] {
        let resp = tether_tests::client::Http::new()
            .send(
                Method::POST,
                &old.mcp_url,
                headers,
                Some(Bytes::from(discover(V4).to_string())),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{headers:?}");
        let answer: Value = serde_json::from_str(&body_text(resp).await.unwrap()).unwrap();
        let code = answer["error"]["code"].as_i64().unwrap();
        assert!(
            !(-32099..=-32020).contains(&code),
            "no MCP code, so a dual-era client initializes: {answer}"
        );
    }
    // ...and the dual-era client's fallback works there.
    old.client().initialize("2025-11-25").await.unwrap();
}

/// Reads `resp`'s body until its text so far contains `needle`, for at most `within`; the text.
async fn read_until(
    body: &mut hyper::body::Incoming,
    text: &mut String,
    needle: &str,
    within: Duration,
) -> bool {
    use http_body_util::BodyExt as _;
    let deadline = tokio::time::Instant::now() + within;
    while !text.contains(needle) {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    text.push_str(&String::from_utf8_lossy(data));
                }
            }
            _ => return false,
        }
    }
    true
}

/// SEP-2575 `subscriptions/listen` (2026-07-28 Streamable HTTP, "Listening for notifications";
/// spec L-05): the stream's headers and its first frame reach the client at once, unbuffered,
/// and an idle stream carries `: keep-alive` comments every `--keep-alive`.
#[tokio::test]
async fn l05_a_listen_stream_is_relayed_at_once_with_keep_alives_in_its_silences() {
    let pod = Pod::start(tether_tests::pod::PodSpec {
        server: tether_tests::pod::Upstream::PythonSdk,
        sidecar_args: vec!["--keep-alive".into(), "300ms".into()],
        ..tether_tests::pod::PodSpec::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let listen = json!({"jsonrpc": "2.0", "id": 9, "method": "subscriptions/listen", "params": {
        "_meta": tether_tests::modern::meta(false), "notifications": {"toolsListChanged": true}}});
    let h = [
        ("accept", ACCEPT_BOTH),
        ("content-type", "application/json"),
        ("mcp-protocol-version", V4),
        ("mcp-method", "subscriptions/listen"),
    ];
    let started = std::time::Instant::now();
    let resp = tokio::time::timeout(
        Duration::from_secs(1),
        tether_tests::client::Http::new().send(
            Method::POST,
            &pod.mcp_url,
            &h,
            Some(Bytes::from(listen.to_string())),
        ),
    )
    .await
    .expect("headers within a second")
    .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        header_str(&resp, "x-accel-buffering").as_deref(),
        Some("no")
    );
    let mut body = resp.into_body();
    let mut text = String::new();
    let acknowledged = "notifications/subscriptions/acknowledged";
    assert!(
        read_until(&mut body, &mut text, acknowledged, Duration::from_secs(1)).await,
        "the first frame within a second of the request: {text:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(
        read_until(
            &mut body,
            &mut text,
            ": keep-alive\n",
            Duration::from_secs(2)
        )
        .await,
        "a keep-alive comment in the silence: {text:?}"
    );
}

/// 2026-07-28 "Cancellation" and SEP-2575: a stateless call cannot move to another pod, and
/// re-issuing it could run its tool twice; so a draining pod lets the calls in flight finish,
/// and places new ones on a routable peer.
#[tokio::test]
async fn a_drain_lets_2026_07_28_calls_finish_and_places_new_ones_on_a_peer() {
    let [a, b] = tether_tests::addr::ips::<2>();
    let cluster =
        tether_tests::cluster::Cluster::start(&[a, b], tether_tests::pod::PodSpec::default())
            .await
            .unwrap();
    let (pod_a, pod_b) = (cluster.pod(a).unwrap(), cluster.pod(b).unwrap());
    let mut running = Vec::new();
    for n in 0..4u64 {
        let call_id = format!("v4-drain-{n}");
        let args = json!({"count": 15, "interval_ms": 100, "call_id": call_id});
        let resp = post(
            &pod_a.mcp_url,
            "slow",
            call(n, "slow", args, Some(&call_id)),
            None,
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let mut events = Events::new(resp);
        let first = events.next_within(Duration::from_secs(5)).await.unwrap();
        assert!(first.data.unwrap().contains("notifications/progress"));
        running.push(tokio::spawn(async move {
            events.rest(Duration::from_secs(10)).await
        }));
    }
    let drain = pod_a.start_drain();
    pod_a.wait_draining(Duration::from_secs(5)).await.unwrap();
    let args = json!({"text": "placed"});
    let resp = post(&pod_a.mcp_url, "echo", call(9, "echo", args, None), None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(body_text(resp).await.unwrap().contains("placed"));
    for call in running {
        let rest = call.await.unwrap().expect("the call's stream ends cleanly");
        let last = rest.last().and_then(|e| e.data.clone()).unwrap_or_default();
        assert!(last.contains("done 15"), "the call completed: {last}");
    }
    let drained = drain.await.unwrap().unwrap();
    assert!(drained.done, "{:?}", drained.body);
    assert_eq!(drained.body["statelessInFlight"], 4, "{:?}", drained.body);
    assert_eq!(drained.body["inFlight"], 0);
    let stats = pod_a.stats().await.unwrap();
    assert_eq!(stats["completed"], 4, "{stats}");
    assert_eq!(stats["aborted"], 0, "{stats}");
    assert_eq!(stats["duplicates"], json!({}), "{stats}");
    let served_by_b = pod_b.stats().await.unwrap();
    assert_eq!(
        served_by_b["executions"], 0,
        "echo is no slow call: {served_by_b}"
    );
    assert!(
        pod_b
            .metric("tether_requests_total{method=\"POST\",era=\"stateless\"}")
            .await
            .unwrap()
            >= 1.0,
        "the new request was placed on the routable peer"
    );
}

/// SEP-2575 `subscriptions/listen` through a drain: the draining pod ends its listen streams
/// cleanly at once, each with its request's completion result, and the client's next listen, entering at the same pod, is served by a
/// routable peer.
#[tokio::test]
async fn a_drain_ends_listen_streams_cleanly_and_the_client_listens_again_on_a_peer() {
    let [a, b] = tether_tests::addr::ips::<2>();
    let spec = tether_tests::pod::PodSpec {
        server: tether_tests::pod::Upstream::PythonSdk,
        ..tether_tests::pod::PodSpec::default()
    };
    let cluster = tether_tests::cluster::Cluster::start(&[a, b], spec)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (pod_a, pod_b) = (cluster.pod(a).unwrap(), cluster.pod(b).unwrap());
    let (mut body, mut text) = listen(&pod_a.mcp_url).await;
    let drain = pod_a.start_drain();
    let ended = tokio::time::timeout(Duration::from_secs(2), async {
        use http_body_util::BodyExt as _;
        while let Some(frame) = body.frame().await {
            let frame = frame.expect("a clean end, not a cut");
            if let Some(data) = frame.data_ref() {
                text.push_str(&String::from_utf8_lossy(data));
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the listen stream ended within 2 s of the drain: {text:?}"
    );
    // Graceful closure: the last event is the listen request's completion result.
    let normalized = text.replace("\r\n", "\n");
    let last = normalized
        .split("\n\n")
        .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("data: ")))
        .last()
        .unwrap_or_else(|| panic!("no event: {text:?}"));
    let last: Value = serde_json::from_str(last).unwrap();
    assert_eq!(last["id"], 9, "{last}");
    assert_eq!(last["result"]["resultType"], "complete", "{last}");
    assert_eq!(
        last["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"], 9,
        "{last}"
    );
    let (_again, text) = listen(&pod_a.mcp_url).await;
    assert!(text.contains("acknowledged"));
    assert!(
        pod_b
            .metric("tether_requests_total{method=\"POST\",era=\"stateless\"}")
            .await
            .unwrap()
            >= 1.0,
        "the second listen was served by the routable peer"
    );
    let drained = drain.await.unwrap().unwrap();
    assert_eq!(drained.body["listenClosed"], 1, "{:?}", drained.body);
}

/// SEP-2575 (a closed response stream *is* the cancellation; spec L-05): a client that closes
/// its listen stream ends the MCP server's subscription within a second.
#[tokio::test]
async fn l05_closing_a_listen_stream_ends_the_servers_subscription() {
    let pod = Pod::start_default().await.unwrap();
    let (body, _) = listen(&pod.mcp_url).await;
    assert_eq!(pod.stats().await.unwrap()["listening"], 1);
    drop(body);
    let mut listening = json!(1);
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        listening = pod.stats().await.unwrap()["listening"].clone();
        if listening == 0 {
            break;
        }
    }
    assert_eq!(listening, 0, "the subscription ended within a second");
}

/// Opens a `subscriptions/listen` stream at `url` and reads it up to its acknowledgement.
async fn listen(url: &str) -> (hyper::body::Incoming, String) {
    let listen = json!({"jsonrpc": "2.0", "id": 9, "method": "subscriptions/listen", "params": {
        "_meta": tether_tests::modern::meta(false), "notifications": {"toolsListChanged": true}}});
    let h = [
        ("accept", ACCEPT_BOTH),
        ("content-type", "application/json"),
        ("mcp-protocol-version", V4),
        ("mcp-method", "subscriptions/listen"),
    ];
    let resp = tether_tests::client::Http::new()
        .send(Method::POST, url, &h, Some(Bytes::from(listen.to_string())))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let mut text = String::new();
    let acknowledged = "notifications/subscriptions/acknowledged";
    assert!(
        read_until(&mut body, &mut text, acknowledged, Duration::from_secs(2)).await,
        "acknowledged: {text:?}"
    );
    (body, text)
}

/// A dual-era endpoint (SEP-2575 "Backwards compatibility"; spec S-10): a 2025-11-25 session
/// and 2026-07-28 requests side by side on three pods, each entering anywhere. The session stays
/// with its holder (its counter counts on); each 2026-07-28 request is served by the pod it
/// enters, even when it carries that session's id, which it never gets back (S-10).
#[tokio::test]
async fn s10_a_dual_era_endpoint_serves_both_eras_side_by_side_on_three_pods() {
    let ips = tether_tests::addr::ips::<3>();
    let cluster =
        tether_tests::cluster::Cluster::start(&ips, tether_tests::pod::PodSpec::default())
            .await
            .unwrap();
    let client = cluster.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    let urls: Vec<String> = cluster.pods.iter().map(|p| p.mcp_url.clone()).collect();
    for round in 0..9u64 {
        let counted = tether_tests::client::tool_call(100 + round, "counter", json!({}), None);
        let resp = client.post(Some(&session), &counted, &[]).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let answers = tether_tests::client::messages(resp, Duration::from_secs(10))
            .await
            .unwrap();
        let text = answers.last().and_then(tether_tests::client::result_text);
        assert_eq!(text, Some((round + 1).to_string().as_str()), "{answers:?}");

        let entry = usize::try_from(round).unwrap() % cluster.pods.len();
        let call_id = format!("v4-{round}");
        let args = json!({"count": 1, "interval_ms": 1, "call_id": call_id});
        let resp = post(
            &urls[entry],
            "slow",
            call(round, "slow", args, None),
            Some(&session.id),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.headers().get("mcp-session-id").is_none());
        assert!(body_text(resp).await.unwrap().contains("done 1"));
        let stats = cluster.pods[entry].stats().await.unwrap();
        assert_eq!(
            stats["calls"][&call_id], 1,
            "served by the pod it entered: {stats}"
        );
    }
    assert_eq!(
        cluster
            .metric_sum("tether_sessions_created_total")
            .await
            .unwrap(),
        1.0,
        "the 2026-07-28 requests opened no session"
    );
}
