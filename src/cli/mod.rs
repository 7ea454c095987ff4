//! The `criguard` command line: its subcommands and options (clap), the
//! validated settings they become ([`settings`]), and the commands that
//! are clients of a running criguard ([`client`]). Part of the binary, not
//! of the library: `anyhow` and process exit codes stay here.

pub mod adopt;
pub mod args;
pub mod client;
pub mod display;
pub mod generate;
pub mod settings;
pub mod tables;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use args::{CheckConfigCmd, NodeArgs, ServeCmd};
use settings::Settings;

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
    /// Print a running criguard's state on one screen: its configuration
    /// (or why it fails open, relaying only), each signal against its
    /// threshold, the conditions, the last evictions, the runtime and API
    /// connections; exit 2 while it fails open.
    Status {
        /// criguard's admin socket.
        #[arg(long, default_value = DEFAULT_ADMIN)]
        admin_socket: PathBuf,
        /// JSON instead of lines (the configuration only).
        #[arg(long)]
        json: bool,
        /// Only whether criguard guards the node: a valid configuration
        /// and, as an NRI plugin, attached with its model reconciled. One
        /// line; exit 0 when ready, 1 when not (a readiness probe).
        #[arg(long, conflicts_with = "json")]
        ready: bool,
        #[command(flatten)]
        checks: client::StatusChecks,
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
    /// Hand a running criguard's sockets to a new process started from the
    /// binary at its path (SIGUSR2), and wait until the new one serves: an
    /// upgrade or a restart the kubelet never notices.
    Handoff {
        /// criguard's admin socket.
        #[arg(long, default_value = DEFAULT_ADMIN)]
        admin_socket: PathBuf,
        /// The running criguard's PID (systemd's MAINPID).
        #[arg(long)]
        pid: u32,
        /// For the unit's ExecStop= during `systemctl restart` (SIGUSR1):
        /// systemd is not told the new PID; the process it starts next
        /// adopts the new one.
        #[arg(long)]
        for_restart: bool,
        /// How long to wait for the new process to serve.
        #[arg(long, default_value = "60s", value_parser = parse_seconds)]
        wait: std::time::Duration,
    },
    /// Point the kubelet at criguard (its --container-runtime-endpoint
    /// flag or containerRuntimeEndpoint), with a backup, once criguard
    /// answers; restart it. --undo restores the backup; --dry-run prints the change.
    Adopt(Box<adopt::AdoptCmd>),
    /// Print criguard's version.
    Version,
    /// Write the man pages or shell completions (for packaging).
    #[command(subcommand, hide = true)]
    Generate(generate::GenerateCmd),
}

/// Parses the command line. For `serve`, a flag whose value clap cannot
/// parse (`--node-taints=maybe`, `--drain=soon`) is a guardian setting
/// like any other: it is dropped (its default applies) and returned as the
/// configuration error `serve` fails open on, the first one if several.
/// Anything else clap refuses (an unknown flag, which may be a misspelt
/// relay essential; a stray word) ends the process as clap does, exit 2.
pub fn parse() -> (Cli, Option<criguard::config::ConfigError>) {
    parse_from(std::env::args_os().collect())
}

/// [`parse`] of `args` (the program name first).
pub fn parse_from(
    mut args: Vec<std::ffi::OsString>,
) -> (Cli, Option<criguard::config::ConfigError>) {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let mut first = None;
    loop {
        let err = match Cli::try_parse_from(&args) {
            Ok(cli) => return (cli, first),
            Err(e) => e,
        };
        let serve = args.iter().position(|a| a == "serve");
        let value_error = matches!(
            err.kind(),
            ErrorKind::InvalidValue | ErrorKind::ValueValidation
        );
        let text = |k| match err.get(k) {
            Some(ContextValue::String(s)) => Some(s.clone()),
            _ => None,
        };
        let (Some(serve), true, Some(arg), Some(value)) = (
            serve,
            value_error,
            text(ContextKind::InvalidArg),
            text(ContextKind::InvalidValue),
        ) else {
            err.exit()
        };
        // `--drain <DRAIN>`: the flag's name is the first word.
        let flag = arg.split_whitespace().next().unwrap_or(&arg).to_owned();
        let joined = format!("{flag}={value}");
        let at = (serve + 1..args.len()).find_map(|i| {
            if args[i] == joined.as_str() {
                Some((i, 1))
            } else if args[i] == flag.as_str()
                && args.get(i + 1).is_some_and(|v| v == value.as_str())
            {
                Some((i, 2))
            } else {
                None
            }
        });
        let Some((i, n)) = at else { err.exit() };
        args.drain(i..i + n);
        let rule = err
            .to_string()
            .lines()
            .next()
            .unwrap_or_default()
            .trim_start_matches("error: ")
            .to_owned();
        first.get_or_insert(criguard::config::ConfigError {
            key: flag,
            value,
            rule,
        });
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> (Cli, Option<criguard::config::ConfigError>) {
        parse_from(args.iter().map(Into::into).collect())
    }

    #[test]
    fn a_serve_flag_value_clap_cannot_parse_is_dropped_and_named() {
        let (cli, e) = parse(&[
            "criguard",
            "serve",
            "--node-taints=maybe",
            "--drain",
            "soon",
            "--listen",
            "/x.sock",
        ]);
        let e = e.expect("the first bad value");
        assert_eq!(
            (e.key.as_str(), e.value.as_str()),
            ("--node-taints", "maybe")
        );
        assert!(e.rule.contains("maybe"), "{e}");
        let Command::Serve(cmd) = cli.command else {
            panic!("serve")
        };
        // Both dropped: their defaults apply; the essentials are kept.
        assert_eq!(cmd.kube.node_taints, None);
        assert_eq!(cmd.drain, Duration::from_secs(30));
        assert_eq!(cmd.listen, PathBuf::from("/x.sock"));
        let (_, none) = parse(&["criguard", "serve", "--drain=5s"]);
        assert_eq!(none, None);
    }
}
