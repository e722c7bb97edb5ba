//! Who may make the operator write (`docs/design/security-model.md`): the checks that stop an
//! `McpEndpoint` from injecting a sidecar into a Deployment that did not ask for one
//! ([`check_opt_in`]: the Deployment's label [`OPT_IN_LABEL`] naming the endpoint, or the
//! namespace's label [`NAMESPACE_OPT_IN_LABEL`]`=enabled`), or an image the operator's installer
//! did not allow ([`Policy::check_image`], `--allowed-sidecar-images`). Each failure is a
//! [`Conflict`]: `TargetNotOptedIn` or `ImageNotAllowed`, and nothing is written.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use tether_crds::McpEndpoint;

use crate::names::Names;
use crate::validate::Conflict;

/// The Deployment label that opts it in to one endpoint's sidecar: its value is the
/// `McpEndpoint`'s name.
pub const OPT_IN_LABEL: &str = "mcp.tether.dev/endpoint";
/// The namespace label that opts every Deployment of the namespace in, with value
/// [`NAMESPACE_OPT_IN_VALUE`].
pub const NAMESPACE_OPT_IN_LABEL: &str = "mcp.tether.dev/injection";
/// The value of [`NAMESPACE_OPT_IN_LABEL`] that opts the namespace in.
pub const NAMESPACE_OPT_IN_VALUE: &str = "enabled";

/// The admission checks of endpoint `ep` (names `names`) on its target `deployment`: the
/// opt-in ([`check_opt_in`], with `namespace_labels`), then the image (`policy`).
///
/// # Errors
/// The first [`Conflict`]: `TargetNotOptedIn` or `ImageNotAllowed`.
pub(crate) fn admit(
    ep: &McpEndpoint,
    names: &Names,
    deployment: &Deployment,
    namespace_labels: Option<&BTreeMap<String, String>>,
    policy: &Policy,
) -> Result<(), Conflict> {
    check_opt_in(deployment, names, namespace_labels)?;
    policy.check_image(ep)
}

/// Whether `deployment` itself opts in to the sidecar of endpoint `names` (then the namespace's
/// labels need not be read).
pub(crate) fn deployment_opts_in(deployment: &Deployment, names: &Names) -> bool {
    opt_in_label(deployment).is_some_and(|v| *v == names.endpoint)
}

/// The value of `deployment`'s [`OPT_IN_LABEL`]: the endpoint it opted in to.
fn opt_in_label(deployment: &Deployment) -> Option<&String> {
    deployment.metadata.labels.as_ref()?.get(OPT_IN_LABEL)
}

/// Checks that `deployment` opted in to the sidecar of endpoint `names`: its own label, or
/// `namespace_labels` (the labels of its namespace, `None` when unread or missing) allowing
/// every Deployment.
///
/// # Errors
/// `TargetNotOptedIn`, saying which label to add.
pub(crate) fn check_opt_in(
    deployment: &Deployment,
    names: &Names,
    namespace_labels: Option<&BTreeMap<String, String>>,
) -> Result<(), Conflict> {
    let namespace_allows = namespace_labels
        .and_then(|l| l.get(NAMESPACE_OPT_IN_LABEL))
        .is_some_and(|v| v == NAMESPACE_OPT_IN_VALUE);
    if namespace_allows || deployment_opts_in(deployment, names) {
        return Ok(());
    }
    let target = deployment.metadata.name.as_deref().unwrap_or_default();
    let found = match opt_in_label(deployment) {
        Some(other) => format!(" (its label {OPT_IN_LABEL} names {other:?})"),
        None => String::new(),
    };
    Err(Conflict::new(
        "TargetNotOptedIn",
        format!(
            "Deployment {target:?} has not opted in to this endpoint's sidecar{found}; nothing was written to it. To opt it in: kubectl label deployment {target} {OPT_IN_LABEL}={endpoint} -n {namespace} (or opt in every Deployment of the namespace: kubectl label namespace {namespace} {NAMESPACE_OPT_IN_LABEL}={NAMESPACE_OPT_IN_VALUE})",
            endpoint = names.endpoint,
            namespace = names.namespace,
        ),
    ))
}

/// One pattern of `--allowed-sidecar-images`: an image reference without tag or digest (a
/// repository, e.g. `ghcr.io/tether-dev/tether-sidecar`: any tag or digest of it), or a
/// prefix ending in `/*` (e.g. `registry.example.com/tether/*`: any image under that path;
/// the `/` keeps `registry.example.com.evil.io/…` out).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImagePattern(String);

impl ImagePattern {
    /// Parses `pattern`.
    ///
    /// # Errors
    /// A message when it is empty or a bare `*`, holds whitespace, a `*` anywhere but in a
    /// final `/*`, or a tag or digest (which would match nothing: a pattern names repositories).
    pub fn parse(pattern: &str) -> Result<Self, String> {
        let form = "a pattern is a repository (any tag or digest of it, e.g. ghcr.io/tether-dev/tether-sidecar) or a path prefix ending in '/*' (e.g. registry.example.com/tether/*)";
        let body = pattern.strip_suffix("/*").unwrap_or(pattern);
        if body.is_empty() || body.contains('*') || pattern.chars().any(char::is_whitespace) {
            return Err(format!("{pattern:?}: {form}"));
        }
        if repository(body) != body {
            return Err(format!(
                "{pattern:?} names a tag or digest, which no other image matches: {form}"
            ));
        }
        Ok(Self(pattern.to_owned()))
    }

    /// The repository of `image` (`registry/path/name:tag@digest` → `registry/path/name`): the
    /// pattern that allows every tag and digest of it.
    #[must_use]
    pub fn repository_of(image: &str) -> Self {
        Self(repository(image).to_owned())
    }

    /// Whether `image` matches.
    #[must_use]
    pub fn matches(&self, image: &str) -> bool {
        match self.0.strip_suffix('*') {
            Some(prefix) => image.starts_with(prefix),
            None => repository(image) == self.0,
        }
    }
}

impl std::fmt::Display for ImagePattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `image` without its `@digest` and `:tag` (a `:` before the last `/` is a registry's port).
fn repository(image: &str) -> &str {
    let named = image.split_once('@').map_or(image, |(name, _)| name);
    match named.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => name,
        _ => named,
    }
}

/// What the operator's installer allows endpoints to ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Images an endpoint's `spec.sidecar.image` may name, besides [`Self::default_image`].
    allowed_images: Vec<ImagePattern>,
    /// The operator's own sidecar image (`--sidecar-image`): always allowed, named or not.
    default_image: String,
}

impl Policy {
    /// The policy of `--allowed-sidecar-images` = `patterns` for an operator whose default
    /// sidecar image is `default_image`; no patterns: any tag or digest of the default image's
    /// repository.
    #[must_use]
    pub fn new(patterns: Vec<ImagePattern>, default_image: &str) -> Self {
        let allowed_images = if patterns.is_empty() {
            vec![ImagePattern::repository_of(default_image)]
        } else {
            patterns
        };
        Self {
            allowed_images,
            default_image: default_image.to_owned(),
        }
    }

    /// The default policy of an operator whose default sidecar image is `sidecar_image`
    /// ([`Policy::new`] without patterns).
    #[must_use]
    pub fn for_default_image(sidecar_image: &str) -> Self {
        Self::new(Vec::new(), sidecar_image)
    }

    /// Checks the image `ep` asks for (`spec.sidecar.image`; unset: the default, allowed).
    ///
    /// # Errors
    /// `ImageNotAllowed`, naming the patterns and the flag that sets them.
    pub(crate) fn check_image(&self, ep: &McpEndpoint) -> Result<(), Conflict> {
        let Some(image) = ep.spec.sidecar.image.as_deref() else {
            return Ok(());
        };
        if image == self.default_image || self.allowed_images.iter().any(|p| p.matches(image)) {
            return Ok(());
        }
        let allowed: Vec<String> = self
            .allowed_images
            .iter()
            .map(|p| format!("{p:?}"))
            .collect();
        Err(Conflict::new(
            "ImageNotAllowed",
            format!(
                "spec.sidecar.image {image:?} matches none of the images this operator may inject ({}); use one of them, or ask the operator's installer to add it to --allowed-sidecar-images (chart value allowedSidecarImages)",
                allowed.join(", ")
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fixtures::{self, MINIMAL_ENDPOINT};

    fn names() -> Names {
        fixtures::names(&fixtures::endpoint(MINIMAL_ENDPOINT))
    }

    #[test]
    fn a_deployment_opts_in_by_its_label_or_by_its_namespace() {
        let names = names();
        let plain = fixtures::deployment_with(|d| {
            d["metadata"]["labels"] = json!({});
        });
        let err = check_opt_in(&plain, &names, None).unwrap_err();
        assert_eq!(err.reason, "TargetNotOptedIn");
        assert!(
            err.message.contains(
                "kubectl label deployment weather mcp.tether.dev/endpoint=weather -n tools"
            ),
            "{}",
            err.message
        );
        let labelled = |value: &str| {
            fixtures::deployment_with(|d| {
                d["metadata"]["labels"] = json!({OPT_IN_LABEL: value});
            })
        };
        assert!(check_opt_in(&labelled("weather"), &names, None).is_ok());
        let other = check_opt_in(&labelled("billing"), &names, None).unwrap_err();
        assert!(
            other.message.contains("names \"billing\""),
            "{}",
            other.message
        );
        let ns =
            |value: &str| BTreeMap::from([(NAMESPACE_OPT_IN_LABEL.to_owned(), value.to_owned())]);
        assert!(check_opt_in(&plain, &names, Some(&ns("enabled"))).is_ok());
        assert!(check_opt_in(&plain, &names, Some(&ns("disabled"))).is_err());
        assert!(check_opt_in(&plain, &names, Some(&BTreeMap::new())).is_err());
    }

    #[test]
    fn image_patterns_match_a_repository_or_a_prefix() {
        let repo = ImagePattern::parse("ghcr.io/tether-dev/tether-sidecar").unwrap();
        for image in [
            "ghcr.io/tether-dev/tether-sidecar",
            "ghcr.io/tether-dev/tether-sidecar:0.1.0",
            "ghcr.io/tether-dev/tether-sidecar@sha256:abc",
            "ghcr.io/tether-dev/tether-sidecar:0.1.0@sha256:abc",
        ] {
            assert!(repo.matches(image), "{image}");
        }
        for image in [
            "ghcr.io/tether-dev/tether-sidecar-evil:1",
            "ghcr.io/tether-dev/tether-sidecar/x:1",
            "evil.io/ghcr.io/tether-dev/tether-sidecar:1",
        ] {
            assert!(!repo.matches(image), "{image}");
        }
        let port = ImagePattern::repository_of("registry.local:5000/tether/sidecar:dev");
        assert_eq!(port.to_string(), "registry.local:5000/tether/sidecar");
        assert!(port.matches("registry.local:5000/tether/sidecar:other"));
        let prefix = ImagePattern::parse("registry.example.com/tether/*").unwrap();
        assert!(prefix.matches("registry.example.com/tether/sidecar:1"));
        assert!(!prefix.matches("registry.example.com/other/sidecar:1"));
        assert!(!prefix.matches("registry.example.com/tether-evil/sidecar:1"));
        let host = ImagePattern::parse("registry.example.com/*").unwrap();
        assert!(!host.matches("registry.example.com.evil.io/x:1"));
        for bad in [
            "",
            "*",
            "/*",
            "a*b",
            "a/*/c",
            "a b",
            "registry.example.com*",
            "repo:1.2",
            "repo@sha256:abc",
        ] {
            assert!(ImagePattern::parse(bad).is_err(), "{bad:?}");
        }
        assert!(ImagePattern::parse("registry.local:5000/tether/sidecar").is_ok());
    }

    #[test]
    fn only_allowed_images_are_injected() {
        let policy = Policy::for_default_image("ghcr.io/tether-dev/tether-sidecar:0.1.0");
        let asking = |image: Option<&str>| {
            let mut ep = fixtures::endpoint(MINIMAL_ENDPOINT);
            if let Some(image) = image {
                ep.spec.sidecar = serde_json::from_value(json!({"image": image})).unwrap();
            }
            ep
        };
        assert!(policy.check_image(&asking(None)).is_ok());
        assert!(
            policy
                .check_image(&asking(Some("ghcr.io/tether-dev/tether-sidecar:0.2.0")))
                .is_ok()
        );
        let err = policy
            .check_image(&asking(Some("evil.example/sidecar:1")))
            .unwrap_err();
        // With patterns, the operator's own image is still allowed by name.
        let strict = Policy::new(
            vec![ImagePattern::parse("registry.example.com/tether/*").unwrap()],
            "ghcr.io/tether-dev/tether-sidecar:0.1.0",
        );
        assert!(
            strict
                .check_image(&asking(Some("ghcr.io/tether-dev/tether-sidecar:0.1.0")))
                .is_ok()
        );
        assert!(
            strict
                .check_image(&asking(Some("ghcr.io/tether-dev/tether-sidecar:0.0.1")))
                .is_err()
        );
        assert_eq!(err.reason, "ImageNotAllowed");
        assert!(
            err.message.contains("--allowed-sidecar-images"),
            "{}",
            err.message
        );
    }
}
