//! `tether-sidecar` binary: parse flags, load the endpoint manifest, run the pingora server.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tether_sidecar::cli::{Cli, LogFormat};
use tether_sidecar::config::Config;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
    let Err(e) = Config::load(&cli).and_then(tether_sidecar::server::run);
    tracing::error!("cannot start: {e}");
    ExitCode::from(2)
}
