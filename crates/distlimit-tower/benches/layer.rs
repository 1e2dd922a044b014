//! The layer's cost per request, side by side: a trivial service called directly, and through
//! the layer on the memory store (keyed by client IP, by header, with and without response
//! headers, and every request denied: the 429 with its headers and problem document). Run with `cargo bench -p distlimit-tower --bench layer`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use distlimit_memory::MemoryStore;
use distlimit_policy::{Limiter, PolicySet};
use distlimit_tower::{KeyExtractor, PeerAddr, RateLimitHeaders, RateLimitLayer};
use http::{HeaderName, Request, Response};
use tower::{Layer, Service, ServiceExt, service_fn};

const POLICIES: &str = r#"
[[policy]]
name = "api"
tiers = [{ name = "second", algorithm = "token_bucket", limit = 4000000000, per = "1s" }]
"#;

/// One request per hour: after the first, every request is denied.
const DENYING: &str = r#"
[[policy]]
name = "api"
tiers = [{ name = "second", algorithm = "token_bucket", limit = 1, per = "1h", burst = 1 }]
"#;

fn request(i: usize) -> Request<()> {
    let mut req = Request::new(());
    req.headers_mut()
        .insert("x-user-id", "user-1234".parse().unwrap());
    let peer = SocketAddr::from(([198, 51, 100, (i % 200) as u8], 40000));
    req.extensions_mut().insert(PeerAddr(peer));
    req
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let handler =
        service_fn(|_req: Request<()>| async { Ok::<_, Infallible>(Response::new(String::new())) });
    let layer_on = |policies: &str, headers, key: KeyExtractor| {
        let policies = PolicySet::from_toml_str(policies).unwrap();
        let limiter = Arc::new(Limiter::new(Arc::new(MemoryStore::new()), policies));
        RateLimitLayer::builder(limiter, "api")
            .headers(headers)
            .key(key)
            .build()
    };
    let layer = |headers, key: KeyExtractor| layer_on(POLICIES, headers, key);
    let user = || KeyExtractor::header(HeaderName::from_static("x-user-id"));

    let mut group = c.benchmark_group("layer");
    let mut i = 0usize;
    group.bench_function("no layer", |b| {
        let mut svc = handler;
        b.iter(|| {
            i += 1;
            rt.block_on(async { black_box(svc.ready().await.unwrap().call(request(i)).await) })
        })
    });
    for (name, layer) in [
        (
            "ip key",
            layer(RateLimitHeaders::Denied, KeyExtractor::client_ip()),
        ),
        ("header key", layer(RateLimitHeaders::Denied, user())),
        (
            "header key, headers always",
            layer(RateLimitHeaders::Always, user()),
        ),
        (
            "header key, denied",
            layer_on(DENYING, RateLimitHeaders::Denied, user()),
        ),
    ] {
        let mut svc = layer.layer(handler);
        group.bench_function(name, |b| {
            b.iter(|| {
                i += 1;
                rt.block_on(async { black_box(svc.ready().await.unwrap().call(request(i)).await) })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
