//! What the sidecar needs to watch its endpoint's peer Service (the Kubernetes membership
//! source): a Role ([`access::SIDECAR`]: `endpointslices: get, list, watch` in the namespace —
//! no read of Pods, whose specs may carry secrets in environment variables), a RoleBinding to
//! the pods' ServiceAccount, and a dedicated ServiceAccount only when the pod template names
//! none (a ServiceAccount the user chose is never replaced; binding to `default` would grant
//! every pod of the namespace the watch).

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::child_meta;
use crate::access;
use crate::names::Names;
use crate::validate::Target;

/// The dedicated ServiceAccount, when the pods name none (or name the one we created).
pub(crate) fn service_account(
    names: &Names,
    target: &Target<'_>,
    owner: &OwnerReference,
) -> Option<ServiceAccount> {
    target
        .users_service_account(names)
        .is_none()
        .then(|| ServiceAccount {
            metadata: child_meta(names, names.sidecar_rbac(), owner),
            ..ServiceAccount::default()
        })
}

/// Read access to the namespace's EndpointSlices ([`access::SIDECAR`]).
pub(crate) fn role(names: &Names, owner: &OwnerReference) -> Role {
    Role {
        metadata: child_meta(names, names.sidecar_rbac(), owner),
        rules: Some(access::policy_rules(access::SIDECAR)),
    }
}

/// Binds [`role`] to ServiceAccount `subject` of the namespace.
pub(crate) fn role_binding(names: &Names, owner: &OwnerReference, subject: &str) -> RoleBinding {
    RoleBinding {
        metadata: child_meta(names, names.sidecar_rbac(), owner),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "Role".to_owned(),
            name: names.sidecar_rbac(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: subject.to_owned(),
            namespace: Some(names.namespace.clone()),
            ..Subject::default()
        }]),
    }
}

/// Adds ServiceAccount `account` of the namespace to `binding`'s subjects (ours, while pods
/// still run with it after the user named their own).
pub(crate) fn also_bind(binding: &mut RoleBinding, account: &str) {
    let namespace = binding.metadata.namespace.clone();
    binding.subjects.get_or_insert_with(Vec::new).push(Subject {
        kind: "ServiceAccount".to_owned(),
        name: account.to_owned(),
        namespace,
        ..Subject::default()
    });
}
