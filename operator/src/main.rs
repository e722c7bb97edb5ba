//! `tether-operator`: the control plane of tether (DESIGN.md §4).
//!
//! So far it prints the `McpEndpoint` CustomResourceDefinition generated from the Rust types
//! (`tether-operator crd`, what `make crds` commits); the library holds the validate and build
//! steps of the reconcile, and the controller that runs them against the API server is the next
//! part of issue #5.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// tether's operator.
#[derive(Debug, Parser)]
#[command(name = "tether-operator", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the McpEndpoint CustomResourceDefinition (YAML) to stdout.
    Crd,
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Crd => match tether_crds::crd_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("tether-operator: cannot render the CRD: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
