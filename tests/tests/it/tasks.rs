//! Tasks of the tasks extension (SEP-2663, "io.modelcontextprotocol/tasks") across pods: the
//! task id a client sees names the pod whose MCP server holds the task, so a poll entering any
//! pod reaches it, through that pod's drain (spec K-01); ids tether did not issue get the
//! extension's not-found error (-32602, "Error Handling"; K-02) without reaching a server.

use std::time::Duration;

use serde_json::{Value, json};
use tether_tests::auth::Issuer;
use tether_tests::client::McpClient;
use tether_tests::modern::{get_task, request};
use tether_tests::pod::{Pod, PodSpec};

/// A `job` call with the tasks extension declared, entering at `url`: the task's id.
async fn create_task(mcp: &McpClient, url: &str, ms: u64, call_id: &str) -> String {
    let params = json!({"name": "job", "arguments": {"ms": ms, "call_id": call_id}});
    let (status, answer) = request(mcp, url, 1, "tools/call", Some("job"), params)
        .await
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    // Tasks extension, "Creating Tasks": a `CreateTaskResult` instead of the tool's result.
    assert_eq!(answer["result"]["resultType"], "task", "{answer}");
    assert_eq!(answer["result"]["status"], "working", "{answer}");
    answer["result"]["taskId"].as_str().unwrap().to_owned()
}

/// Polls `tasks/get` entering at `url` until the task is terminal (at most 20 s): its last
/// state.
async fn poll_until_terminal(mcp: &McpClient, url: &str, task_id: &str) -> Value {
    for attempt in 0..100 {
        let (status, answer) = get_task(mcp, url, 10 + attempt, task_id).await.unwrap();
        assert_eq!(status, 200, "{answer}");
        assert_eq!(
            answer["result"]["taskId"], task_id,
            "the id the client holds"
        );
        let state = &answer["result"]["status"];
        if state != "working" {
            return answer["result"].clone();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("task {task_id} still working after 20 s");
}

/// Created through pod A, polled entering at B and C while A drains: every poll reaches A,
/// whose drain serves them until the client has seen the task complete.
#[tokio::test]
async fn k01_tasks_are_polled_from_any_pod_through_the_drain_of_their_own() {
    let ips = tether_tests::addr::ips::<3>();
    let cluster =
        tether_tests::cluster::Cluster::start(&ips, tether_tests::pod::PodSpec::default())
            .await
            .unwrap();
    let [a, b, c] = [0, 1, 2].map(|i| &cluster.pods[i]);
    let mcp = McpClient::new("http://127.0.0.1:1/unused");
    let task_id = create_task(&mcp, &a.mcp_url, 2_000, "t-drain").await;
    assert_eq!(a.stats().await.unwrap()["tasks"], 1, "the task is A's");
    assert!(
        task_id.len() > 60 && !task_id.split('-').map(str::len).eq([8, 4, 4, 4, 12]),
        "the server's id is sealed: {task_id}"
    );
    let (_, first) = get_task(&mcp, &b.mcp_url, 2, &task_id).await.unwrap();
    assert_eq!(first["result"]["status"], "working", "{first}");
    let drain = a.start_drain();
    let done = poll_until_terminal(&mcp, &c.mcp_url, &task_id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "done t-drain");
    let drained = drain.await.unwrap().unwrap();
    assert_eq!(drained.body["tasksOpen"], 1, "{:?}", drained.body);
    assert_eq!(drained.body["tasksLeft"], 0, "{:?}", drained.body);
    assert!(drained.done, "{:?}", drained.body);
    for pod in [b, c] {
        let stats = pod.stats().await.unwrap();
        assert_eq!(stats["executions"], 0, "only A ran the job: {stats}");
    }
    assert_eq!(a.stats().await.unwrap()["duplicates"], json!({}));
}

/// Tasks nobody polls keep no drain waiting, and one caller whose tasks nobody polls to their
/// end cannot take the tracking of every other caller's.
#[tokio::test]
async fn tasks_nobody_polls_keep_no_drain_waiting_and_one_caller_cannot_fill_the_tracking() {
    let issuer = Issuer::new().unwrap();
    let pod = Pod::start(PodSpec {
        server_args: issuer.server_args(),
        sidecar_args: [
            "--max-principal-open-tasks",
            "2",
            "--task-poll-window",
            "1s",
        ]
        .map(String::from)
        .to_vec(),
        drain_timeout: "20s".into(),
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let as_user = |sub: &str| {
        let client = McpClient::new(pod.mcp_url.clone());
        let hour = Duration::from_secs(3600);
        client.set_authorization(Some(issuer.bearer("https://idp.example", sub, hour)));
        client
    };
    let (mallory, alice) = (as_user("mallory"), as_user("alice"));
    for n in 0..3 {
        create_task(&mallory, &pod.mcp_url, 60_000, &format!("m-{n}")).await;
    }
    let untracked = "tether_tasks_untracked_total";
    assert_eq!(pod.metric(untracked).await.unwrap(), 1.0, "mallory's third");
    create_task(&alice, &pod.mcp_url, 60_000, "a-0").await;
    assert_eq!(
        pod.metric(untracked).await.unwrap(),
        1.0,
        "alice's is tracked"
    );
    assert_eq!(pod.metric("tether_tasks_open").await.unwrap(), 3.0);
    // Nobody polls them: the drain does not wait for them until its deadline.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let started = std::time::Instant::now();
    let drained = pod.drain().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?} {:?}",
        started.elapsed(),
        drained.body
    );
    assert_eq!(drained.body["tasksOpen"], 0, "{:?}", drained.body);
    assert!(drained.done, "{:?}", drained.body);
}

/// A task still working when its pod's drain deadline passed is lost with the pod: a poll
/// entering another pod gets it `failed` (a terminal status, with its error inlined as the
/// tasks extension does), so the client stops polling instead of being told its id was never
/// valid.
#[tokio::test]
async fn k01_a_task_lost_with_its_pod_is_failed_not_unknown() {
    let ips = tether_tests::addr::ips::<2>();
    let spec = tether_tests::pod::PodSpec {
        drain_timeout: "1s".into(),
        ..tether_tests::pod::PodSpec::default()
    };
    let mut cluster = tether_tests::cluster::Cluster::start(&ips, spec)
        .await
        .unwrap();
    let mcp = McpClient::new("http://127.0.0.1:1/unused");
    let (a_url, b_url) = (
        cluster.pods[0].mcp_url.clone(),
        cluster.pods[1].mcp_url.clone(),
    );
    let task_id = create_task(&mcp, &a_url, 60_000, "t-lost").await;
    let drained = cluster.drain_and_remove(ips[0]).await.unwrap();
    assert_eq!(drained.body["tasksLeft"], 1, "{:?}", drained.body);
    let (status, answer) = get_task(&mcp, &b_url, 5, &task_id).await.unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], 5, "{answer}");
    let task = &answer["result"];
    assert_eq!(task["taskId"], task_id.as_str(), "{answer}");
    assert_eq!(task["status"], "failed", "{answer}");
    assert_eq!(task["error"]["data"]["reason"], "task_gone", "{answer}");
    assert!(task["createdAt"].is_string() && task["lastUpdatedAt"].is_string());
}

/// `tasks/cancel` entering at another pod reaches the task's; ids tether did not issue (made
/// up, altered, or the server's own) are -32602 with the request's id, answered by tether.
#[tokio::test]
async fn k01_k02_tasks_are_cancelled_from_another_pod_and_unknown_ids_are_not_found() {
    let ips = tether_tests::addr::ips::<2>();
    let cluster =
        tether_tests::cluster::Cluster::start(&ips, tether_tests::pod::PodSpec::default())
            .await
            .unwrap();
    let [a, b] = [0, 1].map(|i| &cluster.pods[i]);
    let mcp = McpClient::new("http://127.0.0.1:1/unused");
    let task_id = create_task(&mcp, &a.mcp_url, 30_000, "t-cancel").await;
    let params = json!({"taskId": task_id});
    let (status, ack) = request(&mcp, &b.mcp_url, 3, "tasks/cancel", Some(&task_id), params)
        .await
        .unwrap();
    assert_eq!(status, 200, "{ack}");
    assert!(
        ack["result"].is_object() && ack.get("error").is_none(),
        "an acknowledgement: {ack}"
    );
    let cancelled = poll_until_terminal(&mcp, &b.mcp_url, &task_id).await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert_eq!(a.stats().await.unwrap()["aborted"], 1);

    let mut altered = task_id.clone().into_bytes();
    let last = altered.len() - 1;
    altered[last] = if altered[last] == b'A' { b'B' } else { b'A' };
    let altered = String::from_utf8(altered).unwrap();
    for (id, forged) in [(20, "made-up"), (21, altered.as_str())] {
        for (url, method) in [(&a.mcp_url, "tasks/get"), (&b.mcp_url, "tasks/update")] {
            let params = json!({"taskId": forged, "inputResponses": {}});
            let (status, answer) = request(&mcp, url, id, method, Some(forged), params)
                .await
                .unwrap();
            assert_eq!(status, 200, "{answer}");
            assert_eq!(answer["id"], id, "{answer}");
            assert_eq!(answer["error"]["code"], -32602, "{answer}");
            assert_eq!(answer["error"]["data"]["reason"], "task_not_found");
        }
    }
    let metric = "tether_rejections_total{status=\"200\",reason=\"task_not_found\"}";
    let counted = a.metric(metric).await.unwrap() + b.metric(metric).await.unwrap();
    assert_eq!(counted, 4.0);
}

/// A task id names its owner: a task created with alice's token is found by alice's polls
/// alone. Another principal — bob, alice's token issued to another client application, no
/// token — gets the not-found of an id never issued, at any pod, and cannot cancel it.
#[tokio::test]
async fn k02_a_task_is_found_by_its_owner_only() {
    let issuer = tether_tests::auth::Issuer::new().unwrap();
    let ips = tether_tests::addr::ips::<2>();
    let spec = tether_tests::pod::PodSpec {
        server_args: issuer.server_args(),
        ..tether_tests::pod::PodSpec::default()
    };
    let cluster = tether_tests::cluster::Cluster::start(&ips, spec)
        .await
        .unwrap();
    let [a, b] = [0, 1].map(|i| &cluster.pods[i]);
    let hour = Duration::from_secs(3600);
    let as_user = |authorization: Option<String>| {
        let mcp = McpClient::new("http://127.0.0.1:1/unused");
        mcp.set_authorization(authorization);
        mcp
    };
    let alice = as_user(Some(issuer.bearer("https://idp.example", "alice", hour)));
    let task_id = create_task(&alice, &a.mcp_url, 30_000, "t-owned").await;
    let others = [
        as_user(Some(issuer.bearer("https://idp.example", "bob", hour))),
        as_user(Some(issuer.bearer_of_client(
            "https://idp.example",
            "alice",
            "another-app",
            hour,
        ))),
        as_user(None),
    ];
    for (n, other) in others.iter().enumerate() {
        for url in [&a.mcp_url, &b.mcp_url] {
            for method in ["tasks/get", "tasks/cancel"] {
                let params = json!({"taskId": task_id});
                let (status, answer) = request(other, url, 40, method, Some(&task_id), params)
                    .await
                    .unwrap();
                assert_eq!(status, 200, "caller {n}: {answer}");
                assert_eq!(answer["error"]["code"], -32602, "caller {n}: {answer}");
                assert_eq!(answer["error"]["data"]["reason"], "task_not_found");
            }
        }
    }
    let (status, answer) = get_task(&alice, &b.mcp_url, 41, &task_id).await.unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["result"]["status"], "working",
        "not cancelled: {answer}"
    );
    assert_eq!(a.stats().await.unwrap()["aborted"], 0);
}

/// A 2025-11-25 session whose client declares the tasks extension: the same sealed ids, in
/// the session's own stream (one mechanism for both eras).
#[tokio::test]
async fn k01_k02_a_session_gets_sealed_task_ids_too() {
    let pod = tether_tests::pod::Pod::start_default().await.unwrap();
    let client = tether_tests::client::McpClient::new(&pod.mcp_url);
    let mut init = tether_tests::client::initialize_body(1, "2025-11-25");
    init["params"]["capabilities"]["extensions"] = json!({tether_tests::modern::TASKS: {}});
    let resp = client.post(None, &init, &[]).await.unwrap();
    let session = tether_tests::client::Session {
        id: tether_tests::client::header_str(&resp, "mcp-session-id").unwrap(),
        version: "2025-11-25".into(),
    };
    tether_tests::client::messages(resp, Duration::from_secs(5))
        .await
        .unwrap();
    let call = tether_tests::client::tool_call(2, "job", json!({"ms": 300, "call_id": "s"}), None);
    let created = answer(&client, &session, &call).await;
    let task_id = created["result"]["taskId"].as_str().unwrap().to_owned();
    assert!(task_id.len() > 60, "{created}");
    let get =
        json!({"jsonrpc": "2.0", "id": 3, "method": "tasks/get", "params": {"taskId": task_id}});
    tokio::time::sleep(Duration::from_millis(600)).await;
    let got = answer(&client, &session, &get).await;
    assert_eq!(got["result"]["taskId"], task_id.as_str(), "{got}");
    assert_eq!(got["result"]["status"], "completed", "{got}");
    let forged =
        json!({"jsonrpc": "2.0", "id": 4, "method": "tasks/get", "params": {"taskId": "x"}});
    let miss = answer(&client, &session, &forged).await;
    assert_eq!(miss["error"]["code"], -32602, "{miss}");
}

async fn answer(
    client: &tether_tests::client::McpClient,
    session: &tether_tests::client::Session,
    body: &Value,
) -> Value {
    let resp = client.post(Some(session), body, &[]).await.unwrap();
    let messages = tether_tests::client::messages(resp, Duration::from_secs(10))
        .await
        .unwrap();
    messages.last().cloned().unwrap_or_default()
}
