//! The `criguard` command.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use criguard::{cri, listen, runtime};

/// A CRI proxy that guards the node against resource pressure.
#[derive(Parser, Debug)]
#[command(name = "criguard", version, about)]
struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "CRIGUARD_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the CRI proxy: the kubelet's --container-runtime-endpoint points here.
    Serve {
        /// Socket to listen on (ignored under systemd socket activation).
        #[arg(long, default_value = "/run/criguard/criguard.sock")]
        listen: PathBuf,
        /// The runtime to forward to.
        #[arg(long, default_value = "unix:///run/containerd/containerd.sock")]
        runtime_endpoint: String,
        /// How long calls in flight may finish after SIGTERM.
        #[arg(long, default_value = "10s", value_parser = parse_seconds)]
        drain: Duration,
    },
    /// Print criguard's version.
    Version,
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let n = s.strip_suffix('s').unwrap_or(s);
    n.parse::<u64>()
        .map(Duration::from_secs)
        .map_err(|_| format!("{s:?} is not a whole number of seconds like 10s"))
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CRIGUARD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: draining"),
        _ = int.recv() => tracing::info!("SIGINT: draining"),
    }
}

async fn serve(
    activated: Option<std::os::unix::net::UnixListener>,
    listen_path: PathBuf,
    endpoint: &str,
    drain: Duration,
) -> anyhow::Result<()> {
    let endpoint = runtime::RuntimeEndpoint::parse(endpoint)?;
    let (listener, owned_path) = match activated {
        Some(l) => {
            tracing::info!("listening on the socket passed by systemd");
            let l = tokio::net::UnixListener::from_std(l)
                .context("socket activation: fd 3 is not a unix stream socket")?;
            (l, None)
        }
        None => {
            let l = listen::bind(&listen_path)?;
            tracing::info!(path = %listen_path.display(), "listening");
            (l, Some(listen_path))
        }
    };
    let upstream = runtime::Upstream::new(endpoint);
    tracing::info!(runtime = %upstream.endpoint(), "forwarding CRI calls");
    let proxy = cri::Proxy::new(&upstream);
    cri::serve(listener, proxy, shutdown_signal(), drain).await;
    if let Some(path) = owned_path {
        std::fs::remove_file(&path).with_context(|| format!("remove socket {}", path.display()))?;
    }
    tracing::info!("stopped");
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Command::Version => {
            println!("criguard {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Serve {
            listen,
            runtime_endpoint,
            drain,
        } => {
            let run = || -> anyhow::Result<()> {
                let activated = listen::from_systemd()?;
                let rt = tokio::runtime::Runtime::new().context("start tokio runtime")?;
                rt.block_on(serve(activated, listen, &runtime_endpoint, drain))
            };
            match run() {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    tracing::error!("{err:#}");
                    eprintln!("criguard: {err:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
