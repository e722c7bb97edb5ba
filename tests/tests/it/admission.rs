//! Admission through a real pod: Origin, CORS, protocol versions, media types, session ids and
//! batches (spec T-03, T-04, S-02, S-04, P-02, P-03, O-01, O-02, B-01, B-02).

use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{Value, json};
use tether_tests::client::{
    ACCEPT_BOTH, body_text, header_str, initialize_body, json_error, messages, tools_list,
};
use tether_tests::pod::{Pod, PodSpec};

/// The body of the `tools/list` requests, as sent.
fn list() -> Bytes {
    Bytes::from(tools_list(2).to_string())
}

/// `initialize` with `Origin: origin`; the response status.
async fn initialize_from(pod: &Pod, origin: &'static str) -> StatusCode {
    let h = [
        ("accept", ACCEPT_BOTH),
        ("content-type", "application/json"),
        ("origin", origin),
    ];
    let init = Bytes::from(initialize_body(1, "2025-11-25").to_string());
    let http = pod.client().http().clone();
    http.send(Method::POST, &pod.mcp_url, &h, Some(init))
        .await
        .unwrap()
        .status()
}

/// Rewrites the pod's endpoint file with `spec` and waits until metric `sample` reaches `n`
/// (each change of the file is counted once).
async fn rewrite(pod: &Pod, spec: &PodSpec, sample: &str, n: f64) {
    pod.rewrite_endpoint(&spec.manifest()).unwrap();
    let within = Duration::from_secs(10);
    let seen = pod
        .wait_for_metric(sample, within, |v| v >= n)
        .await
        .unwrap();
    assert_eq!(seen, n, "{sample}");
}

/// `tools/list` on session `id` with `MCP-Protocol-Version: version`; status and body.
async fn list_tools(pod: &Pod, id: &str, version: &'static str) -> (StatusCode, String) {
    let h = [
        ("accept", ACCEPT_BOTH),
        ("content-type", "application/json"),
        ("mcp-protocol-version", version),
        ("mcp-session-id", id),
    ];
    let http = pod.client().http().clone();
    let resp = http
        .send(Method::POST, &pod.mcp_url, &h, Some(list()))
        .await
        .unwrap();
    (resp.status(), body_text(resp).await.unwrap())
}

#[tokio::test]
async fn o01_p03_a_changed_endpoint_file_is_reloaded_without_a_restart() {
    let spec = PodSpec {
        sidecar_args: vec!["--config-poll".into(), "100ms".into()],
        ..PodSpec::default()
    };
    let pod = Pod::start(spec.clone()).await.unwrap();
    let applied = r#"tether_config_reloads_total{result="applied"}"#;
    let invalid_total = r#"tether_config_reloads_total{result="invalid"}"#;
    assert_eq!(
        initialize_from(&pod, "https://new.example").await,
        StatusCode::FORBIDDEN
    );
    // A data-plane change: the new Origin is admitted, nothing is pending.
    let allowed = PodSpec {
        origins: vec!["https://new.example".into()],
        ..spec.clone()
    };
    rewrite(&pod, &allowed, applied, 1.0).await;
    assert_eq!(
        initialize_from(&pod, "https://new.example").await,
        StatusCode::OK
    );
    assert_eq!(
        initialize_from(&pod, "https://app.example.com").await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        pod.metric("tether_config_restart_pending").await.unwrap(),
        0.0
    );
    // A session negotiated at a version the next reload removes keeps working; a new one gets
    // a listed version, and naming the removed version on another session is refused.
    let client = pod.client();
    let old = client.initialize("2025-06-18").await.unwrap();
    let narrowed = PodSpec {
        versions: vec!["2025-11-25".into()],
        ..allowed.clone()
    };
    rewrite(&pod, &narrowed, applied, 2.0).await;
    let (status, _) = list_tools(&pod, &old.id, "2025-06-18").await;
    assert_eq!(status, StatusCode::OK, "the session keeps its version");
    let new = client.initialize("2025-06-18").await.unwrap();
    assert_eq!(new.version, "2025-11-25");
    let (status, body) = list_tools(&pod, &new.id, "2025-06-18").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let allowed = narrowed;
    // A pod setting: reported as pending, the running one stays.
    let pinned = PodSpec {
        migration: "Pin".into(),
        ..allowed.clone()
    };
    rewrite(&pod, &pinned, applied, 3.0).await;
    assert_eq!(
        pod.metric("tether_config_restart_pending").await.unwrap(),
        1.0
    );
    // An invalid file changes nothing and is counted once.
    let invalid = PodSpec {
        max_events: 0,
        origins: vec!["https://other.example".into()],
        ..pinned
    };
    rewrite(&pod, &invalid, invalid_total, 1.0).await;
    assert_eq!(
        initialize_from(&pod, "https://new.example").await,
        StatusCode::OK
    );
    assert_eq!(
        initialize_from(&pod, "https://other.example").await,
        StatusCode::FORBIDDEN
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        pod.metric(invalid_total).await.unwrap(),
        1.0,
        "counted once"
    );
    assert!(
        pod.sidecar_log().contains("spec.buffer.maxEvents"),
        "the warning names the field"
    );
}

#[tokio::test]
async fn o02_fr24_bad_origin_is_403_and_listed_or_missing_origins_pass() {
    let pod = Pod::start_default().await.unwrap();
    let http = pod.client().http().clone();
    let init = Bytes::from(initialize_body(1, "2025-11-25").to_string());
    let post = |origin: Option<&'static str>| {
        let (http, url, init) = (http.clone(), pod.mcp_url.clone(), init.clone());
        async move {
            let mut h = vec![
                ("accept", ACCEPT_BOTH),
                ("content-type", "application/json"),
            ];
            if let Some(o) = origin {
                h.push(("origin", o));
            }
            http.send(Method::POST, &url, &h, Some(init)).await.unwrap()
        }
    };
    let resp = post(Some("http://evil.example")).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert!(
        header_str(&resp, "access-control-expose-headers")
            .is_some_and(|v| v.contains("Mcp-Session-Id")),
        "CORS headers on errors too: a browser client reads the error only with them"
    );
    let (_, err) = json_error(resp).await.unwrap();
    assert_eq!(err["data"]["reason"], "origin_forbidden");
    let resp = post(Some("https://app.example.com")).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        header_str(&resp, "access-control-allow-origin").as_deref(),
        Some("https://app.example.com")
    );
    assert!(
        header_str(&resp, "access-control-expose-headers")
            .unwrap()
            .contains("Mcp-Session-Id")
    );
    assert!(resp.headers().contains_key("mcp-session-id"));
    assert_eq!(
        post(None).await.status(),
        StatusCode::OK,
        "no Origin: allowed (allowMissing)"
    );
    assert_eq!(
        pod.metric("tether_origin_rejections_total").await.unwrap(),
        1.0
    );
}

#[tokio::test]
async fn o01_missing_origin_is_refused_when_not_allowed() {
    let pod = Pod::start(PodSpec {
        allow_missing_origin: false,
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let resp = pod
        .client()
        .post(None, &initialize_body(1, "2025-11-25"), &[])
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn fr16_preflight_allows_the_mcp_headers() {
    let pod = Pod::start_default().await.unwrap();
    let resp = pod
        .client()
        .http()
        .send(
            Method::OPTIONS,
            &pod.mcp_url,
            &[
                ("origin", "https://app.example.com"),
                ("access-control-request-method", "POST"),
                (
                    "access-control-request-headers",
                    "content-type, mcp-session-id, mcp-protocol-version, last-event-id",
                ),
            ],
            None,
        )
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    let allowed = header_str(&resp, "access-control-allow-headers")
        .unwrap()
        .to_lowercase();
    for h in [
        "content-type",
        "mcp-session-id",
        "mcp-protocol-version",
        "last-event-id",
    ] {
        assert!(allowed.contains(h), "{h} not allowed: {allowed}");
    }
    assert!(
        header_str(&resp, "access-control-allow-methods")
            .unwrap()
            .contains("POST")
    );
    let resp = pod
        .client()
        .http()
        .send(
            Method::OPTIONS,
            &pod.mcp_url,
            &[
                ("origin", "http://evil.example"),
                ("access-control-request-method", "POST"),
            ],
            None,
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn t03_t04_media_types_are_checked() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    let http = client.http();
    let sid = session.id.as_str();
    let send = |method: Method, headers: Vec<(&'static str, &'static str)>| {
        let mut h: Vec<(&str, &str)> = headers;
        h.push(("mcp-session-id", sid));
        let body = (method == Method::POST).then(list);
        let url = pod.mcp_url.clone();
        async move { http.send(method, &url, &h, body).await.unwrap().status() }
    };
    assert_eq!(
        send(
            Method::POST,
            vec![
                ("accept", "application/json"),
                ("content-type", "application/json")
            ]
        )
        .await,
        StatusCode::NOT_ACCEPTABLE
    );
    assert_eq!(
        send(
            Method::POST,
            vec![("accept", ACCEPT_BOTH), ("content-type", "text/plain")]
        )
        .await,
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );
    assert_eq!(
        send(Method::GET, vec![("accept", "application/json")]).await,
        StatusCode::NOT_ACCEPTABLE
    );
    assert_eq!(
        send(
            Method::POST,
            vec![
                ("accept", ACCEPT_BOTH),
                ("content-type", "application/json")
            ]
        )
        .await,
        StatusCode::OK
    );
}

#[tokio::test]
async fn s02_minted_ids_are_visible_ascii_and_never_the_upstreams() {
    let pod = Pod::start_default().await.unwrap();
    let session = pod.client().initialize("2025-06-18").await.unwrap();
    assert!(session.id.bytes().all(|b| (0x21..=0x7e).contains(&b)));
    assert!(session.id.len() >= 32, "a cryptographically random id");
    // The upstream (rmcp) mints UUIDs; the client must never see one.
    assert!(!session.id.contains('-') || session.id.len() != 36);
    let malformed = pod
        .client()
        .post(None, &tools_list(2), &[("mcp-session-id", "has space")])
        .await
        .unwrap();
    assert_eq!(malformed.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn s04_requests_without_a_session_id_get_400() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let resp = client.post(None, &tools_list(2), &[]).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        json_error(resp).await.unwrap().1["data"]["reason"],
        "session_required"
    );
    let resp = client
        .http()
        .send(
            Method::GET,
            &pod.mcp_url,
            &[("accept", "text/event-stream")],
            None,
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn p02_p03_protocol_version_header() {
    let pod = Pod::start(PodSpec {
        versions: vec!["2025-06-18".into(), "2025-11-25".into()],
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    let with_version = |v: &'static str| {
        let (client, session) = (client.clone(), session.clone());
        async move {
            let h = [
                ("accept", ACCEPT_BOTH),
                ("content-type", "application/json"),
                ("mcp-session-id", session.id.as_str()),
                ("mcp-protocol-version", v),
            ];
            client
                .http()
                .send(Method::POST, &client.url, &h, Some(list()))
                .await
                .unwrap()
        }
    };
    let resp = with_version("1999-01-01").await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        json_error(resp).await.unwrap().1["data"]["reason"],
        "unsupported_protocol_version"
    );
    assert_eq!(
        with_version("2025-03-26").await.status(),
        StatusCode::BAD_REQUEST,
        "a known version outside spec.protocolVersions"
    );
    // P-02: without the header the session's negotiated version applies; the request is served.
    let resp = client
        .http()
        .send(
            Method::POST,
            &client.url,
            &[
                ("accept", ACCEPT_BOTH),
                ("content-type", "application/json"),
                ("mcp-session-id", session.id.as_str()),
            ],
            Some(list()),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let msgs = messages(resp, Duration::from_secs(5)).await.unwrap();
    assert!(
        msgs.iter()
            .any(|m| m["id"] == 2 && m["result"]["tools"].is_array())
    );
}

#[tokio::test]
async fn b02_batches_are_refused_after_2025_03_26() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-06-18").await.unwrap();
    let batch = json!([
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}
    ]);
    let resp = client.post(Some(&session), &batch, &[]).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        json_error(resp).await.unwrap().1["data"]["reason"],
        "batch_not_allowed"
    );
    // The negotiated version decides, not a header claiming 2025-03-26.
    let resp = client
        .post(
            Some(&session),
            &batch,
            &[("mcp-protocol-version", "2025-03-26")],
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let init_batch = json!([initialize_body(1, "2025-03-26")]);
    let resp = client.post(None, &init_batch, &[]).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn b01_batches_are_served_in_2025_03_26() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-03-26").await.unwrap();
    assert_eq!(session.version, "2025-03-26");
    let batch = json!([
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "a"}}},
        {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "x", "progress": 1}},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "b"}}}
    ]);
    let resp = client.post(Some(&session), &batch, &[]).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let msgs = messages(resp, Duration::from_secs(5)).await.unwrap();
    let text = |id: u64| {
        msgs.iter()
            .find(|m| m["id"] == id)
            .and_then(|m| m.pointer("/result/content/0/text"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    assert_eq!(text(2).as_deref(), Some("a"));
    assert_eq!(text(3).as_deref(), Some("b"));
    let notifications_only = json!([
        {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "x", "progress": 1}}
    ]);
    let resp = client
        .post(Some(&session), &notifications_only, &[])
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
}
