//! Shows the limiter deciding: two clients against 5 requests per second with a burst of 3.
//!
//! `cargo run --release -p distlimit-memory --example two_clients`

#![allow(clippy::print_stdout)] // a demo prints

use std::time::{Duration, Instant};

use distlimit_core::{Key, Limit, Quota, Request, StoreExt};
use distlimit_memory::MemoryStore;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = MemoryStore::new();
    let limit = Limit::token_bucket(Quota::per_second(5)?.with_burst(3)?);
    println!("limit: 5 per second, burst 3 (token bucket)\n");

    let start = Instant::now();
    for round in 0..6 {
        for client in ["alice", "bob"] {
            // alice sends two requests per round, bob one.
            let sends = if client == "alice" { 2 } else { 1 };
            for _ in 0..sends {
                let d = store.check(client, limit).await?;
                println!(
                    "t={:>4} ms  {client:<5}  {}  remaining={}  retry_after={:?}",
                    start.elapsed().as_millis(),
                    if d.is_allowed() { "allowed" } else { "DENIED " },
                    d.remaining(),
                    d.retry_after(),
                );
            }
        }
        if round < 5 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // Weighted requests and all-or-nothing batches.
    let heavy = store.check_cost("carol", limit, 3).await?;
    println!("\ncarol spends 3 at once: allowed={}", heavy.is_allowed());
    let too_big = store.check_cost("carol", limit, 4).await?;
    println!(
        "carol asks for 4 (> burst 3): never passes: {}",
        too_big.is_never()
    );

    let per_second = Limit::token_bucket(Quota::per_second(2)?);
    let per_minute = Limit::token_bucket(Quota::per_minute(3)?);
    for i in 1..=4 {
        let decisions = store.decide_all_sync(&[
            Request::new(Key::new("dave:s")?, per_second),
            Request::new(Key::new("dave:m")?, per_minute),
        ])?;
        let allowed = decisions.iter().all(|d| d.is_allowed());
        println!("dave, 2/s and 3/min together, request {i}: allowed={allowed}");
    }
    Ok(())
}
