//! Leader election against the in-memory API server ([`crate::support`]): a sole candidate creates the
//! Lease, holds it under its identity with the operator's field manager, and keeps holding it.

use std::time::Duration;

use crate::support::{api_with, client_of};
use tether_operator::leader::{Election, LEASE_SECONDS, lead};

const LEASE_PATH: &str =
    "/apis/coordination.k8s.io/v1/namespaces/tether-system/leases/tether-operator";

#[tokio::test]
async fn a_sole_candidate_takes_the_lease_and_keeps_it() {
    let api = api_with(&[]);
    let election = Election {
        namespace: "tether-system".into(),
        name: "tether-operator".into(),
        identity: "operator-0".into(),
    };
    let leading = tokio::time::timeout(
        Duration::from_secs(10),
        lead(client_of(&api, "tether-system"), &election),
    )
    .await
    .expect("the lease is taken within 10 s")
    .expect("leader election starts");
    assert!(*leading.borrow(), "holding the lease");
    let server = api.lock().unwrap();
    let lease = &server.objects[LEASE_PATH];
    assert_eq!(lease["spec"]["holderIdentity"], "operator-0", "{lease}");
    assert_eq!(
        lease["spec"]["leaseDurationSeconds"], LEASE_SECONDS,
        "{lease}"
    );
    let applies: Vec<_> = server
        .writes
        .iter()
        .filter(|w| w.path == LEASE_PATH && w.method == http::Method::PATCH)
        .collect();
    assert!(
        !applies.is_empty(),
        "the holder is written with server-side apply"
    );
    for w in applies {
        assert!(w.query.contains("fieldManager=tether-operator"), "{w:?}");
    }
}
