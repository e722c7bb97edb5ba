//! Counts by key that keep no entry at zero: what each source address, session, principal or
//! task owner holds of a pod-wide bound (connections, calls, sessions, tasks). Memory follows
//! what is held, never every key ever seen.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

/// A count per key; a key whose count falls to zero leaves.
#[derive(Debug)]
pub(crate) struct Counts<K>(HashMap<K, usize>);

impl<K> Default for Counts<K> {
    fn default() -> Self {
        Self(HashMap::new())
    }
}

impl<K: Eq + Hash> Counts<K> {
    /// The count of `key` (0 when it holds nothing).
    pub(crate) fn get<Q: Eq + Hash + ?Sized>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
    {
        self.0.get(key).copied().unwrap_or(0)
    }

    /// Adds `n` to `key`'s count.
    pub(crate) fn add(&mut self, key: K, n: usize) {
        *self.0.entry(key).or_default() += n;
    }

    /// Takes `n` off `key`'s count (never below zero); the key leaves at zero.
    pub(crate) fn sub<Q: Eq + Hash + ?Sized>(&mut self, key: &Q, n: usize)
    where
        K: Borrow<Q>,
    {
        if let Some(count) = self.0.get_mut(key) {
            *count = count.saturating_sub(n);
            if *count == 0 {
                self.0.remove(key);
            }
        }
    }

    /// Keys holding something.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no key holds anything.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::Counts;

    #[test]
    fn a_key_leaves_when_its_count_falls_to_zero() {
        let mut c = Counts::default();
        c.add("a", 2);
        c.add("b", 1);
        c.add("a", 1);
        assert_eq!((c.get(&"a"), c.get(&"b"), c.len()), (3, 1, 2));
        c.sub(&"a", 2);
        c.sub(&"b", 5);
        assert_eq!(
            (c.get(&"a"), c.get(&"b"), c.len()),
            (1, 0, 1),
            "never below zero"
        );
        c.sub(&"a", 1);
        c.sub(&"unknown", 1);
        assert!(c.is_empty());
    }
}
