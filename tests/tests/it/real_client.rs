//! An SDK client through the sidecar: rmcp's Streamable HTTP client (reqwest) runs
//! `initialize`, `tools/list` and `slow`; its connection is cut mid-stream by a relay; the client
//! resumes with `GET` + `Last-Event-ID` and gets every progress notification and the result
//! exactly once (spec, L-01).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, ClientConfig, ProgressNotificationParam, ProtocolVersion,
};
use rmcp::service::NotificationContext;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use tether_tests::pod::{LISTEN_PORT, Pod};
use tether_tests::relay::Relay;

/// A client handler that records progress and asks for protocol version 2025-11-25.
struct Recorder {
    progress: Arc<Mutex<Vec<f64>>>,
    version: ProtocolVersion,
}

impl ClientHandler for Recorder {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::default().with_protocol_version(self.version.clone())
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push(params.progress);
    }
}

async fn cut_mid_stream(version: ProtocolVersion) {
    let pod = Pod::start_default().await.unwrap();
    let relay = Relay::start((pod.ip, 0).into(), (pod.ip, LISTEN_PORT).into())
        .await
        .unwrap();
    let progress = Arc::new(Mutex::new(Vec::new()));
    let transport = StreamableHttpClientTransport::from_uri(format!("http://{}/mcp", relay.addr));
    let client = Recorder {
        progress: Arc::clone(&progress),
        version: version.clone(),
    }
    .serve(transport)
    .await
    .expect("initialize through the sidecar");
    let tools = client.peer().list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "slow"), "{tools:?}");
    let args =
        serde_json::json!({"count": 10, "interval_ms": 100, "call_id": format!("rmcp-{version}")});
    let peer = client.peer().clone();
    let call = tokio::spawn(async move {
        peer.call_tool(
            CallToolRequestParams::new("slow")
                .with_arguments(args.as_object().cloned().unwrap_or_default()),
        )
        .await
    });
    for _ in 0..100 {
        if progress.lock().unwrap().clone().len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        progress.lock().unwrap().clone().len() >= 3,
        "progress flows before the cut"
    );
    relay.cut();
    let result = tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .expect("the call finishes after the cut")
        .unwrap()
        .expect("tools/call succeeds");
    let text = result
        .content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.clone())
        .unwrap_or_default();
    assert_eq!(text, "done 10");
    assert_eq!(
        progress.lock().unwrap().clone(),
        (1..=10).map(f64::from).collect::<Vec<_>>(),
        "every progress notification exactly once"
    );
    assert!(
        pod.metric("tether_resumes_total{result=\"hit\",reason=\"none\"}")
            .await
            .unwrap()
            >= 1.0,
        "the client resumed with Last-Event-ID"
    );
    let stats = pod.stats().await.unwrap();
    assert_eq!(stats["executions"], 1, "{stats}");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn rmcp_client_resumes_after_a_cut_2025_11_25() {
    cut_mid_stream(ProtocolVersion::V_2025_11_25).await;
}

#[tokio::test]
async fn rmcp_client_resumes_after_a_cut_2025_06_18() {
    cut_mid_stream(ProtocolVersion::V_2025_06_18).await;
}
