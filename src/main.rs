//! The `criguard` command: parses the command line and hands each
//! subcommand to its part. The options, their validation and the client
//! commands are in [`cli`]; `serve`, the proxy and its loops, in [`serve`].

mod cli;
mod serve;

use std::process::ExitCode;

use cli::{Command, client};

fn main() -> ExitCode {
    let (cli, flag_error) = cli::parse();
    cli::init_logging(cli.log_format);
    match cli.command {
        Command::Version => {
            println!("criguard {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::CheckConfig(c) => cli::check_config(&c),
        Command::Signals { node } => client::signals(&node),
        Command::Evictions {
            admin_socket,
            json,
            watch,
        } => client::run(client::evictions(admin_socket, json, watch)),
        Command::Status {
            admin_socket,
            ready: true,
            ..
        } => client::ready(admin_socket),
        Command::Status {
            admin_socket,
            json,
            checks,
            ..
        } => client::status(admin_socket, json, checks),
        Command::Pods { admin_socket, json } => client::run(client::pods(admin_socket, json)),
        Command::Rank { admin_socket, json } => client::run(client::rank(admin_socket, json)),
        Command::Usage { admin_socket, json } => client::run(client::usage(admin_socket, json)),
        Command::Handoff {
            admin_socket,
            pid,
            for_restart,
            wait,
        } => client::run(client::handoff(admin_socket, pid, for_restart, wait)),
        Command::Serve(cmd) => serve::main(*cmd, flag_error),
        Command::Generate(cmd) => cli::generate::run(cmd),
        Command::Adopt(cmd) => cli::adopt::run(&cmd),
    }
}
