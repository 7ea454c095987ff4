//! The commands that read a running criguard through its admin socket
//! (`status`, `pods`, `evictions`, `rank`, `usage`), and `signals`, which reads the
//! node itself. Each prints a table, or JSON with `--json`; errors go to
//! stderr with exit 1.

use std::path::PathBuf;
use std::process::ExitCode;

use criguard::admin;

use super::settings::NodeArgs;

/// Runs a client command to completion; errors go to stderr.
pub fn run(f: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("criguard: start tokio runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(f) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("criguard: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// `criguard status`: the configuration a running criguard runs with, or
/// why it fails open. Exit 2 (as `check-config`) while it fails open.
pub fn status(admin_socket: PathBuf, json: bool) -> ExitCode {
    let mut failing_open = false;
    let code = run(async {
        let s = admin::get_status(&admin_socket).await?;
        failing_open = !s.valid();
        if json {
            println!("{}", serde_json::to_string_pretty(&s)?);
        } else {
            print!("{}", s.text());
        }
        Ok(())
    });
    if failing_open {
        ExitCode::from(super::EXIT_CONFIG)
    } else {
        code
    }
}

/// `criguard evictions`.
pub async fn evictions(admin_socket: PathBuf, json: bool, watch: bool) -> anyhow::Result<()> {
    use futures::StreamExt;
    if !watch {
        let report = admin::get_evictions_report(&admin_socket).await?;
        if json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", admin::evictions_text(&report));
        }
        return Ok(());
    }
    let mut stream = std::pin::pin!(admin::watch_evictions(&admin_socket, true).await?);
    while let Some(e) = stream.next().await {
        let e = e?;
        if json {
            println!("{}", serde_json::to_string(&e)?);
        } else {
            println!("{}", admin::eviction_line(&e));
        }
    }
    Ok(())
}

/// `criguard rank`.
pub async fn rank(admin_socket: PathBuf, json: bool) -> anyhow::Result<()> {
    let (r, not_ranked) = admin::get_rank_report(&admin_socket).await?;
    for n in not_ranked {
        eprintln!("criguard: {n}");
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", admin::rank_table(&r));
    }
    Ok(())
}

/// `criguard usage`.
pub async fn usage(admin_socket: PathBuf, json: bool) -> anyhow::Result<()> {
    let u = admin::get_usage(&admin_socket).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&u)?);
    } else {
        print!("{}", admin::usage_table(&u));
    }
    Ok(())
}

/// `criguard pods`.
pub async fn pods(admin_socket: PathBuf, json: bool) -> anyhow::Result<()> {
    let pods = admin::get_pods(&admin_socket).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&pods)?);
    } else {
        print!("{}", admin::pods_table(&pods));
    }
    Ok(())
}

/// `criguard signals`: the eviction signals, read now, with when.
pub fn signals(node: &NodeArgs) -> ExitCode {
    match node.sources() {
        Ok(src) => {
            let obs = src.observe();
            let ms = criguard::signals::unix_ms(obs.at);
            println!("read at {}.{:03} (Unix time, s)", ms / 1000, ms % 1000);
            println!("{:<28} {:>16} {:>16}", "SIGNAL", "AVAILABLE", "CAPACITY");
            for (sig, o) in obs.signals {
                let show = |v: i64| {
                    if sig.is_bytes() && v >= 0 {
                        criguard::quantity::format_bytes(v as u64)
                    } else {
                        v.to_string()
                    }
                };
                println!(
                    "{:<28} {:>16} {:>16}",
                    sig.name(),
                    show(o.available),
                    show(o.capacity as i64)
                );
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("criguard: {err:#}");
            ExitCode::FAILURE
        }
    }
}
