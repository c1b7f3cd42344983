//! The `meridian` command: the command line over the broker daemon (`meridian-broker`), and the tools that
//! run beside it — the simulator, the benchmarks and the demo.

pub mod bench;
pub mod cli;
pub mod demo;
pub mod progress;
pub mod sim;
