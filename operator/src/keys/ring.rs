//! The key ring as the Secret holds it ([`tether_crds::keyring`]'s layout): read from the
//! Secret's data and checked the way a sidecar loads it, written back as data, and the three
//! steps of a rotation (`docs/design/peer-trust.md#rotation`): stage, promote, retire.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use tether_crds::keyring::{
    CA_BUNDLE, CURRENT_KEY, Generation, MIN_KEY_BYTES, NEXT_KEY, NEXT_TLS_CERT, NEXT_TLS_KEY,
    PREVIOUS_KEY, TLS_CERT, TLS_KEY, key_id, key_material,
};
use tether_crds::spec::KeyPhase;

use super::pem;

/// One certificate with its private key (PEM).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Leaf {
    /// The certificate.
    pub(crate) cert: String,
    /// Its PKCS#8 private key.
    pub(crate) key: String,
}

/// The endpoint's key ring.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Ring {
    /// The key that signs.
    pub(crate) current: Vec<u8>,
    /// The key before the last promotion, while sessions minted with it live.
    pub(crate) previous: Option<Vec<u8>>,
    /// The key a rotation under way staged.
    pub(crate) next: Option<Vec<u8>>,
    /// The certificate the sidecars present.
    pub(crate) leaf: Leaf,
    /// The CA certificates a peer's certificate must chain to, in order (the newest last).
    pub(crate) cas: Vec<String>,
    /// The certificate a rotation under way staged with the next key.
    pub(crate) next_leaf: Option<Leaf>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("current", &key_id(&self.current))
            .field("previous", &self.previous.as_deref().map(key_id))
            .field("next", &self.next.as_deref().map(key_id))
            .field("cas", &self.cas.len())
            .finish_non_exhaustive()
    }
}

/// Why a Secret's data is no key ring a sidecar would load: the file and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {why}")]
pub(crate) struct RingError {
    /// The Secret key (file) at fault.
    pub(crate) file: &'static str,
    /// What is wrong.
    pub(crate) why: String,
}

impl RingError {
    fn new(file: &'static str, why: impl Into<String>) -> Self {
        Self {
            file,
            why: why.into(),
        }
    }
}

impl Ring {
    /// A ring holding only `generation`.
    pub(crate) fn of(generation: &Generation) -> Self {
        Self {
            current: generation.key.clone(),
            previous: None,
            next: None,
            leaf: Leaf {
                cert: generation.cert_pem.clone(),
                key: generation.key_pem.clone(),
            },
            cas: vec![generation.ca_pem.clone()],
            next_leaf: None,
        }
    }

    /// The ring in a Secret's `data`.
    ///
    /// # Errors
    /// [`RingError`] naming the first file a sidecar would refuse: a key missing or shorter than
    /// [`MIN_KEY_BYTES`], a certificate or private key missing, a certificate no CA of the bundle
    /// issued, a staged key without its certificate (or the reverse), or both a previous and a
    /// next key (no step of a rotation leaves both).
    pub(crate) fn parse(data: &BTreeMap<String, ByteString>) -> Result<Self, RingError> {
        let key = |file: &'static str| -> Result<Option<Vec<u8>>, RingError> {
            match data.get(file) {
                None => Ok(None),
                Some(ByteString(k)) => match key_material(k).len() {
                    n if n < MIN_KEY_BYTES => Err(RingError::new(
                        file,
                        format!(
                            "{n} bytes without surrounding whitespace, fewer than {MIN_KEY_BYTES}"
                        ),
                    )),
                    _ => Ok(Some(k.clone())),
                },
            }
        };
        let text = |file: &'static str| -> Result<Option<String>, RingError> {
            data.get(file)
                .map(|ByteString(b)| {
                    String::from_utf8(b.clone()).map_err(|_| RingError::new(file, "not PEM text"))
                })
                .transpose()
        };
        let current = key(CURRENT_KEY)?.ok_or_else(|| RingError::new(CURRENT_KEY, "missing"))?;
        let previous = key(PREVIOUS_KEY)?;
        let next = key(NEXT_KEY)?;
        if previous.is_some() && next.is_some() {
            return Err(RingError::new(
                NEXT_KEY,
                "a previous and a next key at once: a rotation is retired before the next starts",
            ));
        }
        let cas = pem::certificates(&text(CA_BUNDLE)?.unwrap_or_default());
        if cas.is_empty() {
            return Err(RingError::new(CA_BUNDLE, "no certificate"));
        }
        let leaf = |cert: &'static str, key: &'static str| -> Result<Option<Leaf>, RingError> {
            match (text(cert)?, text(key)?) {
                (None, None) => Ok(None),
                (Some(c), Some(k)) => {
                    let Some(first) = pem::certificates(&c).into_iter().next() else {
                        return Err(RingError::new(cert, "no certificate"));
                    };
                    if !pem::has_private_key(&k) {
                        return Err(RingError::new(key, "no private key"));
                    }
                    if !cas.iter().any(|ca| pem::issued_by(&first, ca)) {
                        return Err(RingError::new(
                            cert,
                            format!("issued by no CA of {CA_BUNDLE}"),
                        ));
                    }
                    Ok(Some(Leaf { cert: c, key: k }))
                }
                (Some(_), None) => Err(RingError::new(key, "missing")),
                (None, Some(_)) => Err(RingError::new(cert, "missing")),
            }
        };
        let current_leaf =
            leaf(TLS_CERT, TLS_KEY)?.ok_or_else(|| RingError::new(TLS_CERT, "missing"))?;
        let next_leaf = leaf(NEXT_TLS_CERT, NEXT_TLS_KEY)?;
        if next.is_some() != next_leaf.is_some() {
            let file = if next.is_some() {
                NEXT_TLS_CERT
            } else {
                NEXT_KEY
            };
            return Err(RingError::new(
                file,
                "missing: a staged key comes with its certificate",
            ));
        }
        Ok(Self {
            current,
            previous,
            next,
            leaf: current_leaf,
            cas,
            next_leaf,
        })
    }

    /// The Secret `data` of this ring, in the layout the sidecars read.
    pub(crate) fn data(&self) -> BTreeMap<String, ByteString> {
        let mut data = BTreeMap::new();
        let mut put = |file: &str, bytes: Vec<u8>| {
            data.insert(file.to_owned(), ByteString(bytes));
        };
        put(CURRENT_KEY, self.current.clone());
        if let Some(previous) = &self.previous {
            put(PREVIOUS_KEY, previous.clone());
        }
        if let Some(next) = &self.next {
            put(NEXT_KEY, next.clone());
        }
        put(TLS_CERT, self.leaf.cert.clone().into_bytes());
        put(TLS_KEY, self.leaf.key.clone().into_bytes());
        put(CA_BUNDLE, self.cas.concat().into_bytes());
        if let Some(leaf) = &self.next_leaf {
            put(NEXT_TLS_CERT, leaf.cert.clone().into_bytes());
            put(NEXT_TLS_KEY, leaf.key.clone().into_bytes());
        }
        data
    }

    /// The ids of the current, previous and next keys.
    pub(crate) fn ids(&self) -> Ids {
        Ids {
            current: key_id(&self.current),
            previous: self.previous.as_deref().map(key_id),
            next: self.next.as_deref().map(key_id),
        }
    }

    /// Where a rotation stands: a next key staged, a previous key not yet retired, or neither.
    pub(crate) fn phase(&self) -> KeyPhase {
        match (&self.next, &self.previous) {
            (Some(_), _) => KeyPhase::Staged,
            (None, Some(_)) => KeyPhase::Promoted,
            (None, None) => KeyPhase::Stable,
        }
    }

    /// Step 1: `generation`'s key as next, its CA added to the bundle, its certificate staged.
    pub(crate) fn stage(&self, generation: &Generation) -> Self {
        let mut ring = self.clone();
        ring.next = Some(generation.key.clone());
        ring.cas.push(generation.ca_pem.clone());
        ring.next_leaf = Some(Leaf {
            cert: generation.cert_pem.clone(),
            key: generation.key_pem.clone(),
        });
        ring
    }

    /// Step 2: the next key signs and its certificate is presented; the current one becomes
    /// previous. Unchanged when nothing is staged.
    pub(crate) fn promote(&self) -> Self {
        let mut ring = self.clone();
        if let (Some(next), Some(leaf)) = (ring.next.take(), ring.next_leaf.take()) {
            ring.previous = Some(std::mem::replace(&mut ring.current, next));
            ring.leaf = leaf;
        }
        ring
    }

    /// Step 3: the previous key leaves, and with it every CA but those that issued the current
    /// (or a staged) certificate.
    pub(crate) fn retire(&self) -> Self {
        let mut ring = self.clone();
        ring.previous = None;
        let leaves: Vec<&Leaf> = std::iter::once(&self.leaf)
            .chain(self.next_leaf.as_ref())
            .collect();
        ring.cas.retain(|ca| {
            leaves.iter().any(|leaf| {
                pem::certificates(&leaf.cert)
                    .first()
                    .is_some_and(|cert| pem::issued_by(cert, ca))
            })
        });
        ring
    }
}

/// The ids of a ring's keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ids {
    /// The current key's.
    pub(crate) current: String,
    /// The previous key's.
    pub(crate) previous: Option<String>,
    /// The next key's.
    pub(crate) next: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generation() -> Generation {
        Generation::new("tools/weather").unwrap()
    }

    #[test]
    fn a_ring_round_trips_through_secret_data() {
        let g = generation();
        let ring = Ring::of(&g);
        let data = ring.data();
        let names: Vec<&str> = data.keys().map(String::as_str).collect();
        assert_eq!(names, [CA_BUNDLE, CURRENT_KEY, TLS_CERT, TLS_KEY]);
        for (file, content) in g.files() {
            assert_eq!(
                data[file].0, content,
                "{file}: the layout of keyring::Generation"
            );
        }
        assert_eq!(Ring::parse(&data).unwrap(), ring);
        assert_eq!(ring.phase(), KeyPhase::Stable);
        assert_eq!(ring.ids().current, g.id());
    }

    #[test]
    fn a_rotation_stages_promotes_and_retires() {
        let old = generation();
        let new = generation();
        let ring = Ring::of(&old);
        let staged = ring.stage(&new);
        assert_eq!(staged.phase(), KeyPhase::Staged);
        assert_eq!(
            staged.ids(),
            Ids {
                current: old.id(),
                previous: None,
                next: Some(new.id())
            }
        );
        assert_eq!(staged.cas, [old.ca_pem.clone(), new.ca_pem.clone()]);
        assert_eq!(
            staged.leaf.cert, old.cert_pem,
            "the old certificate is still presented"
        );
        let data = staged.data();
        assert_eq!(data[NEXT_TLS_CERT].0, new.cert_pem.as_bytes());
        assert_eq!(Ring::parse(&data).unwrap(), staged);

        let promoted = staged.promote();
        assert_eq!(promoted.phase(), KeyPhase::Promoted);
        assert_eq!(promoted.current, new.key);
        assert_eq!(promoted.previous.as_deref(), Some(&old.key[..]));
        assert_eq!(promoted.leaf.cert, new.cert_pem);
        assert!(promoted.next_leaf.is_none() && promoted.next.is_none());
        assert_eq!(promoted.cas.len(), 2, "both CAs while the old key verifies");
        assert_eq!(Ring::parse(&promoted.data()).unwrap(), promoted);

        let retired = promoted.retire();
        assert_eq!(retired.phase(), KeyPhase::Stable);
        assert_eq!(
            retired.cas,
            std::slice::from_ref(&new.ca_pem),
            "the old CA leaves"
        );
        assert_eq!(retired.current, new.key);
        assert!(!retired.data().contains_key(PREVIOUS_KEY));
        assert_eq!(Ring::parse(&retired.data()).unwrap(), retired);
        assert_eq!(ring.promote(), ring, "nothing staged, nothing promoted");
    }

    #[test]
    fn what_a_sidecar_would_refuse_is_named_by_its_file() {
        let g = generation();
        let staged = Ring::of(&g).stage(&generation());
        let refused = |edit: &dyn Fn(&mut BTreeMap<String, ByteString>)| {
            let mut data = staged.data();
            edit(&mut data);
            Ring::parse(&data).unwrap_err().file
        };
        assert_eq!(refused(&|d| drop(d.remove(CURRENT_KEY))), CURRENT_KEY);
        assert_eq!(
            refused(&|d| drop(d.insert(NEXT_KEY.into(), ByteString(vec![1; 15])))),
            NEXT_KEY
        );
        assert_eq!(refused(&|d| drop(d.remove(TLS_KEY))), TLS_KEY);
        assert_eq!(refused(&|d| drop(d.remove(NEXT_TLS_CERT))), NEXT_TLS_CERT);
        assert_eq!(
            refused(&|d| drop(d.insert(CA_BUNDLE.into(), ByteString(g.ca_pem.clone().into())))),
            NEXT_TLS_CERT,
            "the staged certificate's CA is gone"
        );
        assert_eq!(
            refused(&|d| drop(d.insert(PREVIOUS_KEY.into(), ByteString(vec![2; 32])))),
            NEXT_KEY
        );
        assert_eq!(
            refused(&|d| drop(d.insert(TLS_CERT.into(), ByteString(b"junk".to_vec())))),
            TLS_CERT
        );
        // A key without certificates is no ring.
        let mut key_only = BTreeMap::new();
        key_only.insert(CURRENT_KEY.to_owned(), ByteString(vec![7; 32]));
        assert_eq!(Ring::parse(&key_only).unwrap_err().file, CA_BUNDLE);
    }
}
