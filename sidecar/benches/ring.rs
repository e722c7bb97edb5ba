//! Ring lookup cost: `owner` and `ranked` of a session id over 3, 50 and 500 pods.
//!
//! `cargo bench -p tether-sidecar --bench ring` (or `make bench`).

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use tether_sidecar::{HrwRing, SessionRing};

fn lookups(c: &mut Criterion) {
    let id = "AbJ2v0mYx3yq9Yx0mYq9Yx0mYq9Yx0mYq9Yx0mYq9Yx0mYq9Yx0mYq9";
    let mut group = c.benchmark_group("ring");
    for pods in [3usize, 50, 500] {
        let uids: Vec<String> = (0..pods)
            .map(|i| format!("6f1c2a4e-0000-4000-8000-{i:012}"))
            .collect();
        let ring = HrwRing::new(uids.iter().map(String::as_str).zip(0..pods));
        group.bench_with_input(BenchmarkId::new("owner", pods), &ring, |b, r| {
            b.iter(|| r.owner(black_box(id)));
        });
        group.bench_with_input(BenchmarkId::new("ranked", pods), &ring, |b, r| {
            b.iter(|| r.ranked(black_box(id)));
        });
    }
    group.finish();
}

criterion_group!(benches, lookups);
criterion_main!(benches);
