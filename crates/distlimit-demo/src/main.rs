//! `distlimit-demo`: the demo service. `distlimit-demo --help` lists the flags.

use std::process::ExitCode;

use clap::Parser;
use distlimit_demo::{Args, Demo, shutdown_signal};

// The system allocator, not mimalloc: mimalloc ran 1 500 fewer instructions per request but
// served 4–6 % fewer requests per CPU second (the demo README, "Cost of the limits").

#[tokio::main]
async fn main() -> ExitCode {
    distlimit_serve::logging::init();
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let demo = Demo::build(&args).await?;
    let listener = Demo::bind(args.listen).await?;
    let shutdown = shutdown_signal();
    // Tests and scripts read the bound address (with --listen 127.0.0.1:0) from this line.
    tracing::info!("listening on http://{}", listener.local_addr()?);
    demo.serve(listener, shutdown).await?;
    tracing::info!("stopped");
    Ok(())
}
