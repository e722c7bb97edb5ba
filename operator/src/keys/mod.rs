//! The endpoint's key ring (`docs/design/peer-trust.md#the-key-ring`), pure: given what the
//! reconcile found of its Secret (`crate::dereference::Found`) and the pods' reports
//! (`crate::reports`), what the user asks through the endpoint's annotations
//! ([`Asks`]), and what one reconcile does about it ([`decide`]): create the ring, take one
//! step of a rotation once every pod reports the step before, or stop with a conflict rather
//! than replace a Secret silently.
//!
//! - `ring`: the ring in the Secret's layout, and the stage, promote and retire steps;
//! - `rotation`: the decision of one reconcile, with the status and Event it gives;
//! - `pem`: enough of PEM and X.509 to tell which CA issued a certificate.

mod pem;
pub(crate) mod ring;
mod rotation;

use tether_crds::McpEndpoint;

pub(crate) use ring::Ring;
pub(crate) use rotation::{Decision, Write, decide, waits_on_pods};

/// Annotation on an `McpEndpoint`: a value other than the last one handled
/// (`status.keys.rotation`) starts a rotation, or waits for the one under way.
pub const ROTATE_ANNOTATION: &str = "mcp.tether.dev/rotate-key";
/// Annotation on an `McpEndpoint`: a value other than the last one handled
/// (`status.keys.retired`) drops the previous key at once (sessions minted with it end).
pub const RETIRE_ANNOTATION: &str = "mcp.tether.dev/retire-previous-key";
/// Annotation on an `McpEndpoint`: a value other than the last one handled
/// (`status.keys.newKey`) lets the operator create a new key ring when the endpoint's is gone
/// (`SecretMissing`); every session ends.
pub const NEW_KEY_ANNOTATION: &str = "mcp.tether.dev/new-key";
/// Annotation on the key-ring Secret: the [`ROTATE_ANNOTATION`] value whose rotation the ring
/// holds or last held, written with the step that staged it.
pub const ROTATION_ANNOTATION: &str = "mcp.tether.dev/rotation";

/// What the user asks of the endpoint's keys: its annotations' values (an empty one asks
/// nothing).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Asks {
    /// [`ROTATE_ANNOTATION`].
    pub(crate) rotate: Option<String>,
    /// [`RETIRE_ANNOTATION`].
    pub(crate) retire: Option<String>,
    /// [`NEW_KEY_ANNOTATION`].
    pub(crate) new_key: Option<String>,
}

impl Asks {
    /// The asks in `ep`'s annotations.
    pub(crate) fn of(ep: &McpEndpoint) -> Self {
        let annotations = ep.metadata.annotations.as_ref();
        let value = |key: &str| {
            annotations
                .and_then(|a| a.get(key))
                .filter(|v| !v.is_empty())
                .cloned()
        };
        Self {
            rotate: value(ROTATE_ANNOTATION),
            retire: value(RETIRE_ANNOTATION),
            new_key: value(NEW_KEY_ANNOTATION),
        }
    }
}
