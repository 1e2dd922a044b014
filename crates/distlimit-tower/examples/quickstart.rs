//! One limit per client on an axum service: 60 requests a minute per client IP, up to 10 at
//! once, on the embedded memory store.
//!
//! ```text
//! cargo run -p distlimit-tower --example quickstart
//! curl -i http://127.0.0.1:3000/    # the 11th request within a second answers 429
//! ```

use std::net::SocketAddr;

use axum::{Router, routing::get};
use distlimit_tower::{Quota, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limit = RateLimitLayer::per_client(Quota::per_minute(60)?.with_burst(10)?).build();

    // On the route's methods only: a request no route serves (404, 405) spends nothing.
    let app = Router::new().route("/", get(|| async { "hello" }).route_layer(limit));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    eprintln!("listening on http://{}", listener.local_addr()?);
    // The layer keys clients by the peer address axum records here.
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}
