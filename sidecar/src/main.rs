//! `tether-sidecar` binary: parse flags, load the endpoint manifest, run the pingora server;
//! `tether-sidecar drain` drains the sidecar of this pod through its drain socket;
//! `tether-sidecar keygen DIR` writes a key ring for sidecars run by hand.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tether_sidecar::{Cli, Config, DrainCli, KeygenCli, LogFormat};
use tracing_subscriber::EnvFilter;

/// jemalloc instead of glibc's malloc: in `make bench-proxy` (docs/dev/testing.md#proxy-cost) it
/// cut the CPU of a JSON request by about a fifth and of a resume storm's connections by a third;
/// mimalloc helped the first and tripled the second (fresh pages set up for every new
/// connection's buffers). Its background thread (`background_threads`) returns freed pages to
/// the system on time even when the pod goes quiet: after a sweep reaps thousands of sessions,
/// no further allocation comes to trigger the purge.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The log filter: `RUST_LOG` (default `info`). pingora's own debug logs print request headers,
/// session ids among them (which never appear in tether's logs,
/// `docs/design/architecture.md#observability`), so a debug or trace level leaves `pingora_proxy`
/// and `pingora_core` at `info` unless `RUST_LOG` sets a level for them itself.
fn log_directives(rust_log: Option<String>) -> String {
    let mut directives = rust_log.unwrap_or_else(|| "info".into());
    let lower = directives.to_ascii_lowercase();
    if lower.contains("debug") || lower.contains("trace") {
        for target in ["pingora_proxy", "pingora_core"] {
            // A directive for the target itself (`pingora_proxy=debug`) is the user's choice;
            // one for a module below it (`pingora_core::connectors=warn`) is not.
            if !lower
                .split(',')
                .any(|d| d.trim().starts_with(&format!("{target}=")))
            {
                directives.push_str(&format!(",{target}=info"));
            }
        }
    }
    directives
}

/// `tether-sidecar drain`: 0 drained, 1 not drained by `spec.drain.timeout`, 2 unreachable.
fn drain(cli: &DrainCli) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("tether-sidecar drain: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(tether_sidecar::request_drain(&cli.drain_socket)) {
        Ok((drained, body)) => {
            print!("{body}");
            ExitCode::from(if drained { 0 } else { 1 })
        }
        Err(e) => {
            eprintln!("tether-sidecar drain: {e}");
            ExitCode::from(2)
        }
    }
}

/// `tether-sidecar keygen DIR`: 0 written, 1 a key ring is there already, 2 an I/O error.
fn keygen(cli: &KeygenCli) -> ExitCode {
    match tether_sidecar::keygen(&cli.dir, &cli.label) {
        Ok(id) => {
            println!("wrote key ring {id} to {}", cli.dir.display());
            ExitCode::SUCCESS
        }
        Err(e @ tether_sidecar::KeygenError::Exists(_)) => {
            eprintln!("tether-sidecar keygen: {e}");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("tether-sidecar keygen: {e}");
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    match std::env::args_os().nth(1) {
        Some(a) if a == "drain" => {
            return drain(&DrainCli::parse_from(std::env::args_os().skip(1)));
        }
        Some(a) if a == "keygen" => {
            return keygen(&KeygenCli::parse_from(std::env::args_os().skip(1)));
        }
        _ => {}
    }
    let cli = Cli::parse();
    let filter = EnvFilter::try_new(log_directives(std::env::var("RUST_LOG").ok()))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
    let Err(e) = Config::load(&cli).and_then(tether_sidecar::run);
    tracing::error!("cannot start: {e}");
    ExitCode::from(2)
}

#[cfg(test)]
mod tests {
    use super::log_directives;

    #[test]
    fn debug_levels_keep_pingora_quiet_unless_asked() {
        assert_eq!(log_directives(None), "info");
        assert_eq!(
            log_directives(Some("debug".into())),
            "debug,pingora_proxy=info,pingora_core=info"
        );
        assert_eq!(
            log_directives(Some("debug,pingora_proxy=debug".into())),
            "debug,pingora_proxy=debug,pingora_core=info"
        );
        assert_eq!(log_directives(Some("warn".into())), "warn");
        assert_eq!(
            log_directives(Some("DEBUG".into())),
            "DEBUG,pingora_proxy=info,pingora_core=info"
        );
        assert_eq!(
            log_directives(Some("debug,pingora_core::connectors=warn".into())),
            "debug,pingora_core::connectors=warn,pingora_proxy=info,pingora_core=info"
        );
    }
}
