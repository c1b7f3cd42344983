//! `meridian`: the broker, the client commands, the local federation, the simulator and the benchmarks (see
//! `meridian_tools::cli`).

use meridian_tools::cli::{self, Cmd};

/// mimalloc: placement allocates many small vectors per decision, and a broker that archived a million jobs
/// should give their pages back.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // One TLS provider for the process (the HTTP API's server side asks for the process default).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = cli::parse();
    let filter = match &cli.command {
        Cmd::Broker(_) => "info",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter)),
        )
        .with_target(false)
        .with_writer(std::io::stderr)
        .init();
    let outcome = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| {
            let r = rt.block_on(cli::run(cli));
            // Tasks still waiting on a server that is gone do not hold up the exit.
            rt.shutdown_timeout(std::time::Duration::from_secs(1));
            r
        });
    let code = match outcome {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("error: {e:#}");
            2
        }
    };
    std::process::exit(code);
}
