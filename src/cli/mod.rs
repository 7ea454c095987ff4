//! The `criguard` command line: its subcommands and options (clap), the
//! validated settings they become ([`settings`]), and the commands that
//! are clients of a running criguard ([`client`]). Part of the binary, not
//! of the library: `anyhow` and process exit codes stay here.

pub mod args;
pub mod client;
pub mod settings;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use args::{CheckConfigCmd, ServeCmd};
use settings::{NodeArgs, Settings};

/// A CRI proxy that guards the node against resource pressure.
#[derive(Parser, Debug)]
#[command(name = "criguard", version, about)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "CRIGUARD_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve the CRI proxy: the kubelet's --container-runtime-endpoint points here.
    Serve(Box<ServeCmd>),
    /// Validate the eviction configuration and print it as criguard will use it.
    CheckConfig(Box<CheckConfigCmd>),
    /// Print the eviction signals as criguard reads them now.
    Signals {
        #[command(flatten)]
        node: NodeArgs,
    },
    /// Print the configuration a running criguard runs with, or why it
    /// fails open (relaying only); exit 2 while it fails open.
    Status {
        /// criguard's admin socket.
        #[arg(long, default_value = DEFAULT_ADMIN)]
        admin_socket: PathBuf,
        /// JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Print the evictions a running criguard made and the kernel OOM kills in pods it saw.
    Evictions {
        /// criguard's admin socket.
        #[arg(long, default_value = DEFAULT_ADMIN)]
        admin_socket: PathBuf,
        /// JSON instead of lines (with --watch: one JSON object per line).
        #[arg(long)]
        json: bool,
        /// Then keep printing each eviction as it is made, until criguard
        /// stops (evictions only, not kernel OOM kills).
        #[arg(long)]
        watch: bool,
    },
    /// Print per-pod disk and process usage as a running criguard reads it now.
    Usage {
        /// criguard's admin socket.
        #[arg(long, default_value = DEFAULT_ADMIN)]
        admin_socket: PathBuf,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print, for each signal, the order in which a running criguard would
    /// evict pods now (a dry run: nothing is stopped).
    Rank {
        /// criguard's admin socket.
        #[arg(long, default_value = DEFAULT_ADMIN)]
        admin_socket: PathBuf,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print the node model of a running criguard.
    Pods {
        /// criguard's admin socket.
        #[arg(long, default_value = DEFAULT_ADMIN)]
        admin_socket: PathBuf,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print criguard's version.
    Version,
}

/// Exit code for a configuration error: systemd's RestartPreventExitStatus=2
/// (`serve`: a bad relay essential only; `check-config`: any error;
/// `status`: criguard fails open).
pub const EXIT_CONFIG: u8 = 2;

pub const DEFAULT_ADMIN: &str = "/run/criguard/admin.sock";

/// A whole number of seconds, `10` or `10s`.
pub fn parse_seconds(s: &str) -> Result<Duration, String> {
    let n = s.strip_suffix('s').unwrap_or(s);
    n.parse::<u64>()
        .map(Duration::from_secs)
        .map_err(|_| format!("{s:?} is not a whole number of seconds like 10s"))
}

/// Logs to stderr, filtered by `CRIGUARD_LOG` (default `info`); colour
/// codes only when stderr is a terminal (never in the journal or a file).
pub fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("CRIGUARD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// `criguard check-config`: prints the settings as they will be used, or
/// the configuration error (exit 2).
pub fn check_config(c: &CheckConfigCmd) -> ExitCode {
    match Settings::load(&c.eviction, &c.gc, &c.kube) {
        Ok(c) => {
            print!("{}", c.describe());
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("criguard: invalid configuration: {err}");
            ExitCode::from(EXIT_CONFIG)
        }
    }
}
