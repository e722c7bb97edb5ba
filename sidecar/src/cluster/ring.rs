//! The session ring: rendezvous (highest-random-weight, HRW) hashing of session ids over pod
//! UIDs. It is a wire contract between the sidecar versions of a rollout, written down in
//! `docs/design/routing.md#the-session-ring-hash-contract-v1` and pinned by the golden vectors
//! of the tests: it never changes without a new version label. A lookup hashes the key once and
//! scores every pod: O(n), no allocation for [`SessionRing::owner`].

use sha2::{Digest, Sha256};

/// Domain prefix of pod hashes.
const POD_DOMAIN: &[u8] = b"tether/ring/v1/pod\0";
/// Domain prefix of key hashes.
const KEY_DOMAIN: &[u8] = b"tether/ring/v1/key\0";

/// A consistent mapping of session ids to members.
pub trait SessionRing {
    /// What the ring returns for a member (an index into the membership snapshot).
    type Member: Copy;

    /// The member that owns `key`; `None` for an empty ring.
    fn owner(&self, key: &str) -> Option<Self::Member>;

    /// Every member, in `key`'s preference order (the owner first).
    fn ranked(&self, key: &str) -> Vec<Self::Member>;
}

/// The pod hash of the contract.
pub(crate) fn pod_hash(uid: &str) -> u64 {
    prefix_hash(POD_DOMAIN, uid)
}

/// The key hash of the contract.
pub(crate) fn key_hash(key: &str) -> u64 {
    prefix_hash(KEY_DOMAIN, key)
}

/// The HRW score of a key hash against a pod hash.
pub(crate) fn score(key_hash: u64, pod_hash: u64) -> u64 {
    let mut z = key_hash ^ pod_hash;
    z ^= z >> 30;
    z = z.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^= z >> 27;
    z = z.wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn prefix_hash(domain: &[u8], value: &str) -> u64 {
    let mut h = Sha256::new();
    h.update(domain);
    h.update(value.as_bytes());
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

#[derive(Clone, Debug)]
struct Member<T> {
    hash: u64,
    uid: String,
    value: T,
}

/// An immutable HRW ring over members identified by UID, carrying a value each.
#[derive(Clone, Debug)]
pub struct HrwRing<T = usize> {
    members: Vec<Member<T>>,
}

impl<T> Default for HrwRing<T> {
    fn default() -> Self {
        Self {
            members: Vec::new(),
        }
    }
}

impl<T: Copy> HrwRing<T> {
    /// A ring of `(uid, value)` members; the pod hashes are computed once, here.
    pub fn new<'a>(members: impl IntoIterator<Item = (&'a str, T)>) -> Self {
        Self {
            members: members
                .into_iter()
                .map(|(uid, value)| Member {
                    hash: pod_hash(uid),
                    uid: uid.to_owned(),
                    value,
                })
                .collect(),
        }
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the ring has no member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Whether `a` (with `score_a`) ranks before `b`.
    fn before(score_a: u64, a: &Member<T>, score_b: u64, b: &Member<T>) -> bool {
        score_a > score_b || (score_a == score_b && a.uid.as_bytes() < b.uid.as_bytes())
    }
}

impl<T: Copy> SessionRing for HrwRing<T> {
    type Member = T;

    fn owner(&self, key: &str) -> Option<T> {
        let kh = key_hash(key);
        let mut best: Option<(u64, &Member<T>)> = None;
        for m in &self.members {
            let s = score(kh, m.hash);
            match best {
                Some((bs, b)) if !Self::before(s, m, bs, b) => {}
                _ => best = Some((s, m)),
            }
        }
        best.map(|(_, m)| m.value)
    }

    fn ranked(&self, key: &str) -> Vec<T> {
        let kh = key_hash(key);
        let mut scored: Vec<(u64, &Member<T>)> = self
            .members
            .iter()
            .map(|m| (score(kh, m.hash), m))
            .collect();
        scored.sort_unstable_by(|(sa, a), (sb, b)| {
            sb.cmp(sa)
                .then_with(|| a.uid.as_bytes().cmp(b.uid.as_bytes()))
        });
        scored.into_iter().map(|(_, m)| m.value).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{RngExt, SeedableRng};

    fn ring(n: usize) -> HrwRing<usize> {
        let uids: Vec<String> = (0..n).map(uid).collect();
        HrwRing::new(uids.iter().map(String::as_str).zip(0..n))
    }

    fn uid(i: usize) -> String {
        format!("6f1c2a4e-0000-4000-8000-{i:012}")
    }

    /// 100,000 session-id-like keys from a seeded generator (reproducible).
    fn keys() -> Vec<String> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x7e7e_7e7e);
        (0..100_000)
            .map(|_| {
                let bytes: [u8; 16] = rng.random();
                hex::encode(bytes)
            })
            .collect()
    }

    /// Golden vectors of hash contract v1, computed independently (Python `hashlib` from the
    /// contract text in the module docs). If this test fails, sidecars of different
    /// versions would disagree on owners during a rollout: do not update the vectors, add a
    /// new contract version instead.
    #[test]
    fn golden_vectors_of_contract_v1() {
        assert_eq!(pod_hash("pod-a"), 0x3c2d_3568_d681_c50c);
        assert_eq!(key_hash("session-1"), 0x934e_7987_b9d7_c2ea);
        assert_eq!(score(0, 0), 0);
        assert_eq!(score(1, 0), 0x5692_161d_100b_05e5);
        let r = HrwRing::new(["pod-a", "pod-b", "pod-c"].into_iter().zip(["a", "b", "c"]));
        let owners: String = (0..24)
            .map(|i| r.owner(&format!("session-{i}")).unwrap())
            .collect();
        assert_eq!(owners, "aabbbbccabcaccbcacaaacab");
        assert_eq!(r.ranked("session-1"), vec!["a", "b", "c"]);
    }

    #[test]
    fn balance_within_5_percent_for_3_to_50_pods() {
        let keys = keys();
        let mut worst = 0.0f64;
        for n in 3..=50 {
            let r = ring(n);
            let mut load = vec![0usize; n];
            for k in &keys {
                load[r.owner(k).unwrap()] += 1;
            }
            let mean = keys.len() as f64 / n as f64;
            let max = *load.iter().max().unwrap() as f64;
            assert!(max / mean <= 1.05, "{n} pods: max/mean {:.4}", max / mean);
            worst = worst.max(max / mean);
        }
        println!("worst max/mean over 3..=50 pods: {worst:.4}");
    }

    #[test]
    fn a_join_or_leave_moves_the_ideal_share_and_nothing_else() {
        let keys = keys();
        for n in [3usize, 5, 10, 20, 50] {
            let before = ring(n);
            let joined = ring(n + 1);
            let moved = keys
                .iter()
                .filter(|k| {
                    let (a, b) = (before.owner(k).unwrap(), joined.owner(k).unwrap());
                    assert!(a == b || b == n, "a join only moves ids to the new pod");
                    a != b
                })
                .count();
            let share = moved as f64 / keys.len() as f64;
            let ideal = 1.0 / (n + 1) as f64;
            println!("join {n}→{}: moved {:.4}, ideal {ideal:.4}", n + 1, share);
            assert!(
                (share - ideal).abs() <= 0.01,
                "join {n}→{}: {share:.4} vs {ideal:.4}",
                n + 1
            );
            // A leave (the last pod) moves back exactly the same ids.
            let back = keys
                .iter()
                .filter(|k| joined.owner(k).unwrap() != before.owner(k).unwrap())
                .count();
            assert_eq!(back, moved);
        }
    }

    proptest! {
        #[test]
        fn owner_is_the_first_of_ranked_and_ranked_is_a_permutation(
            key in "[A-Za-z0-9_-]{1,60}",
            n in 0usize..40,
        ) {
            let r = ring(n);
            let ranked = r.ranked(&key);
            prop_assert_eq!(ranked.len(), n);
            prop_assert_eq!(r.owner(&key), ranked.first().copied());
            let mut sorted = ranked.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..n).collect::<Vec<_>>());
        }

        #[test]
        fn removing_a_pod_only_moves_its_own_keys(key in "[A-Za-z0-9_-]{55}", n in 2usize..30, gone in 0usize..30) {
            let gone = gone % n;
            let full = ring(n);
            let uids: Vec<String> = (0..n).filter(|&i| i != gone).map(uid).collect();
            let idx: Vec<usize> = (0..n).filter(|&i| i != gone).collect();
            let without = HrwRing::new(uids.iter().map(String::as_str).zip(idx));
            let before = full.owner(&key).unwrap();
            let after = without.owner(&key).unwrap();
            if before != gone {
                prop_assert_eq!(before, after);
            } else {
                // The successor is the second of the full ranking.
                prop_assert_eq!(after, full.ranked(&key)[1]);
            }
        }
    }
}
