//! A map that keeps at most a fixed number of entries and forgets the oldest first: the bound
//! of every per-session and per-pod record (retry records, ended and moved sessions).

use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// At most `cap` entries; inserting one more forgets the oldest.
#[derive(Debug)]
pub(crate) struct Bounded<K, V> {
    entries: HashMap<K, V>,
    /// Keys, oldest first; exactly the keys of `entries`.
    order: VecDeque<K>,
    cap: usize,
}

impl<K: Eq + Hash + Clone, V> Bounded<K, V> {
    /// An empty map holding at most `cap` entries.
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            entries: HashMap::new(),
            order: VecDeque::new(),
            cap,
        }
    }

    /// Sets `key` to `value`. A new key is the newest entry; a known one keeps its place.
    /// Returns the key forgotten to stay within the cap, if any.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<K> {
        if self.entries.insert(key.clone(), value).is_none() {
            self.order.push_back(key);
        }
        if self.order.len() <= self.cap {
            return None;
        }
        let old = self.order.pop_front()?;
        self.entries.remove(&old);
        Some(old)
    }

    /// The value of `key`.
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.entries.get(key)
    }

    /// Whether `key` is held.
    pub(crate) fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    /// Walks the entries oldest first and forgets each one `forget` says to.
    pub(crate) fn forget_where(&mut self, mut forget: impl FnMut(&K, &V) -> bool) {
        let entries = &mut self.entries;
        self.order.retain(|key| match entries.get(key) {
            Some(value) if forget(key, value) => {
                entries.remove(key);
                false
            }
            _ => true,
        });
    }

    /// Forgets the oldest entries `forget` says to until at most `keep` are left, walking from
    /// the oldest and stepping over the ones it keeps (so the walk costs what it forgets plus
    /// what it steps over); returns the keys forgotten.
    pub(crate) fn forget_oldest_beyond(
        &mut self,
        keep: usize,
        mut forget: impl FnMut(&K, &V) -> bool,
    ) -> Vec<K> {
        let mut forgotten = Vec::new();
        let mut i = 0;
        while self.entries.len() > keep && i < self.order.len() {
            let key = &self.order[i];
            match self.entries.get(key) {
                Some(value) if !forget(key, value) => i += 1,
                found => {
                    let known = found.is_some();
                    if let Some(key) = self.order.remove(i)
                        && known
                    {
                        self.entries.remove(&key);
                        forgotten.push(key);
                    }
                }
            }
        }
        forgotten
    }

    /// Every entry, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.order
            .iter()
            .filter_map(|k| self.entries.get(k).map(|v| (k, v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_entries_are_forgotten_first() {
        let mut b = Bounded::new(2);
        b.insert("a", 1);
        b.insert("b", 2);
        b.insert("a", 3);
        assert_eq!(b.get("a"), Some(&3), "a known key takes the new value");
        b.insert("c", 4);
        assert!(!b.contains(&"a"), "the oldest goes first");
        assert_eq!(b.iter().collect::<Vec<_>>(), [(&"b", &2), (&"c", &4)]);
        b.forget_where(|k, _| *k == "b");
        assert!(!b.contains(&"b"), "forget_where forgets what it is told to");
        b.insert("b", 2);
        b.forget_where(|k, _| *k == "b");
        b.insert("d", 5);
        b.insert("e", 6);
        assert_eq!(
            b.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            ["d", "e"],
            "a forgotten key no longer counts"
        );
    }

    #[test]
    fn the_oldest_beyond_a_count_are_forgotten_stepping_over_the_kept() {
        let mut b = Bounded::new(10);
        for (k, v) in [("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5)] {
            b.insert(k, v);
        }
        // Keep 2, but never "b" (a request still running).
        let forgotten = b.forget_oldest_beyond(2, |k, _| *k != "b");
        assert_eq!(forgotten, ["a", "c", "d"]);
        assert_eq!(b.iter().map(|(k, _)| *k).collect::<Vec<_>>(), ["b", "e"]);
    }
}
