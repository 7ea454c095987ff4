//! `criguard adopt`: puts criguard in the kubelet's path. The kubelet's
//! runtime endpoint is set either by its `--container-runtime-endpoint`
//! flag (in a file its unit reads: a systemd drop-in, an EnvironmentFile
//! such as kubeadm's `kubeadm-flags.env`) or by `containerRuntimeEndpoint`
//! in its configuration file (`--config`), which a drop-in of its
//! `--config-dir` may override; the flag wins, so that is where the change
//! goes when it is there, then the last drop-in that sets the key, then
//! the configuration file. The file is backed up first; criguard
//! must answer a CRI Version call on its socket before anything is written
//! or the kubelet restarted. `--undo` restores the backup; `--dry-run`
//! prints the change and does nothing.
//!
//! The text rewrites are pure functions; reading `systemctl cat`, the
//! files, the CRI check and the restart are the edges ([`run`]).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

/// `criguard adopt`'s options.
#[derive(clap::Args, Debug, Clone)]
pub struct AdoptCmd {
    /// Restore the kubelet's file from the backup and restart it.
    #[arg(long)]
    pub undo: bool,
    /// Print the change; write nothing, restart nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// criguard's CRI socket, as the kubelet will dial it.
    #[arg(long, default_value = "unix:///run/criguard/criguard.sock")]
    pub endpoint: String,
    /// The kubelet's systemd unit.
    #[arg(long, default_value = "kubelet.service")]
    pub kubelet_unit: String,
    /// The kubelet's configuration file [default: its unit's --config,
    /// else /var/lib/kubelet/config.yaml].
    #[arg(long)]
    pub kubelet_config: Option<PathBuf>,
    /// The kubelet's configuration drop-in directory [default: its unit's
    /// --config-dir, if any].
    #[arg(long)]
    pub kubelet_config_dir: Option<PathBuf>,
    /// Files that may carry the kubelet's flags [default: its unit's
    /// drop-ins and EnvironmentFiles, from `systemctl cat`].
    #[arg(long)]
    pub flags_file: Vec<PathBuf>,
    /// Where the backup and its record are kept.
    #[arg(long, default_value = "/var/lib/criguard/adopt")]
    pub backup_dir: PathBuf,
    /// Write the change but do not restart the kubelet.
    #[arg(long)]
    pub no_restart: bool,
}

/// The kubelet's flag for its runtime endpoint.
pub const FLAG: &str = "--container-runtime-endpoint";
/// Its key in the kubelet's configuration file.
pub const KEY: &str = "containerRuntimeEndpoint";

/// One file's change: the old endpoint and the whole new text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The endpoint the file named (None: the key was absent and is added).
    pub old: Option<String>,
    /// The file's new text.
    pub text: String,
}

/// `text` (a kubelet flags file or unit drop-in) with every
/// `--container-runtime-endpoint=X` or `--container-runtime-endpoint X`
/// pointing at `endpoint`; `None` when it has no such flag. Quotes around
/// the value are kept.
pub fn rewrite_flag(text: &str, endpoint: &str) -> Option<Change> {
    let mut old = None;
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(FLAG) {
        let (before, from) = rest.split_at(at);
        out.push_str(before);
        out.push_str(FLAG);
        let after = &from[FLAG.len()..];
        let sep_len = match after.chars().next() {
            Some('=') => 1,
            Some(' ') => after.len() - after.trim_start_matches(' ').len(),
            _ => {
                // A longer flag name that starts the same: not ours.
                rest = after;
                continue;
            }
        };
        out.push_str(&after[..sep_len]);
        let value_and_rest = &after[sep_len..];
        let quote = value_and_rest
            .chars()
            .next()
            .filter(|c| *c == '"' || *c == '\'');
        let body = &value_and_rest[quote.map_or(0, char::len_utf8)..];
        let end = body
            .find(|c: char| c.is_whitespace() || Some(c) == quote || c == '"' || c == '\'')
            .unwrap_or(body.len());
        old.get_or_insert_with(|| body[..end].to_owned());
        if let Some(q) = quote {
            out.push(q);
        }
        out.push_str(endpoint);
        rest = &body[end..];
    }
    out.push_str(rest);
    old.map(|o| Change {
        old: Some(o),
        text: out,
    })
}

/// `text` (a KubeletConfiguration in YAML) with its top-level
/// `containerRuntimeEndpoint` set to `endpoint`, added at the end if absent.
pub fn rewrite_config(text: &str, endpoint: &str) -> Change {
    let mut old = None;
    let mut lines: Vec<String> = Vec::new();
    for line in text.lines() {
        match line
            .strip_prefix(KEY)
            .and_then(|r| r.trim_start().strip_prefix(':'))
        {
            Some(value) if old.is_none() => {
                let v = value.split('#').next().unwrap_or("").trim();
                old = Some(v.trim_matches(|c| c == '"' || c == '\'').to_owned());
                lines.push(format!("{KEY}: {endpoint}"));
            }
            _ => lines.push(line.to_owned()),
        }
    }
    if old.is_none() {
        lines.push(format!("{KEY}: {endpoint}"));
    }
    let mut text = lines.join("\n");
    text.push('\n');
    Change { old, text }
}

/// From `systemctl cat UNIT`: the files it names (`# /path` headers of the
/// unit and its drop-ins, `EnvironmentFile=` paths without their `-`), and
/// the `--config` path of its `ExecStart=`, if any.
pub fn unit_files(cat: &str) -> (Vec<PathBuf>, Option<PathBuf>) {
    let mut files = Vec::new();
    let mut config = None;
    for line in cat.lines() {
        if let Some(p) = line.strip_prefix("# /") {
            files.push(PathBuf::from(format!("/{}", p.trim())));
        } else if let Some(p) = line.trim().strip_prefix("EnvironmentFile=") {
            files.push(PathBuf::from(p.trim().trim_start_matches('-')));
        } else if line.trim_start().starts_with("ExecStart=") {
            config = flag_value(line, "--config").or(config);
        }
    }
    (files, config)
}

/// The value of the kubelet flag `flag` (`--flag=V` or `--flag V`, quotes
/// around words dropped) in `text`, if any; the last one wins, as for any
/// repeated kubelet flag.
pub fn flag_value(text: &str, flag: &str) -> Option<PathBuf> {
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c == '"' || c == '\'')
        .filter(|w| !w.is_empty())
        .collect();
    let mut value = None;
    for (i, w) in words.iter().enumerate() {
        if let Some(v) = w.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            value = Some(PathBuf::from(v));
        } else if *w == flag {
            value = words.get(i + 1).map(PathBuf::from).or(value);
        }
    }
    value
}

/// The `--config-dir` path among the kubelet's command-line words in
/// `texts` (its `ExecStart=` lines, its flags files), if any; the last one
/// wins.
pub fn config_dir(texts: &[&str]) -> Option<PathBuf> {
    texts
        .iter()
        .rev()
        .find_map(|t| flag_value(t, "--config-dir"))
}

/// Of the drop-ins of a kubelet `--config-dir` (name, text), the one whose
/// `containerRuntimeEndpoint` the kubelet uses: it reads the `*.conf` files
/// in name order, each overriding the ones before, so the last one that
/// sets the key; `None` when none does (the configuration file decides).
pub fn deciding_drop_in(drop_ins: &[(String, String)]) -> Option<usize> {
    let mut order: Vec<usize> = (0..drop_ins.len())
        .filter(|&i| drop_ins[i].0.ends_with(".conf"))
        .collect();
    order.sort_by(|&a, &b| drop_ins[a].0.cmp(&drop_ins[b].0));
    order.into_iter().rev().find(|&i| {
        drop_ins[i].1.lines().any(|l| {
            l.strip_prefix(KEY)
                .is_some_and(|r| r.trim_start().starts_with(':'))
        })
    })
}

/// The record of one adoption, kept beside its backup for `--undo`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// The file changed.
    pub path: PathBuf,
    /// Its copy from before the change.
    pub backup: PathBuf,
    /// The endpoint it named before.
    pub old: Option<String>,
    /// The endpoint it names now.
    pub new: String,
}

/// The lines that differ between `old` and `new`, as `- old` / `+ new`.
pub fn diff(old: &str, new: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let mut out = String::new();
    for i in 0..a.len().max(b.len()) {
        match (a.get(i), b.get(i)) {
            (Some(x), Some(y)) if x == y => {}
            (x, y) => {
                if let Some(x) = x {
                    out.push_str(&format!("- {x}\n"));
                }
                if let Some(y) = y {
                    out.push_str(&format!("+ {y}\n"));
                }
            }
        }
    }
    out
}

/// A CRI Version call on `endpoint` within 5 s: what answered, or why not.
fn answers(endpoint: &str) -> Result<String, String> {
    let ep = criguard::runtime::RuntimeEndpoint::parse(endpoint).map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let mut c = criguard::runtime::Upstream::new(ep).runtime();
        let call = c.version(k8s_cri::v1::VersionRequest::default());
        match tokio::time::timeout(Duration::from_secs(5), call).await {
            Ok(Ok(v)) => {
                let v = v.into_inner();
                Ok(format!("{} {}", v.runtime_name, v.runtime_version))
            }
            Ok(Err(e)) => Err(format!("{:?}: {}", e.code(), e.message())),
            Err(_) => Err("no answer within 5s".into()),
        }
    })
}

fn systemctl(args: &[&str]) -> Result<String, String> {
    let out = Command::new("systemctl")
        .args(args)
        .output()
        .map_err(|e| format!("systemctl {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "systemctl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

const RECORD: &str = "adopt.json";

/// What to change: the first flags file with the flag, else the
/// configuration file.
fn plan(cmd: &AdoptCmd) -> Result<(PathBuf, String, Change), String> {
    let (mut files, unit_config) = if cmd.flags_file.is_empty() || cmd.kubelet_config.is_none() {
        match systemctl(&["cat", &cmd.kubelet_unit]) {
            Ok(cat) => unit_files(&cat),
            Err(e) if !cmd.flags_file.is_empty() => {
                eprintln!("criguard adopt: {e}");
                (Vec::new(), None)
            }
            Err(e) => return Err(e),
        }
    } else {
        (Vec::new(), None)
    };
    if !cmd.flags_file.is_empty() {
        files = cmd.flags_file.clone();
    }
    let texts: Vec<(PathBuf, String)> = files
        .into_iter()
        .filter_map(|f| Some((f.clone(), std::fs::read_to_string(&f).ok()?)))
        .collect();
    for (f, text) in &texts {
        if let Some(change) = rewrite_flag(text, &cmd.endpoint) {
            return Ok((f.clone(), text.clone(), change));
        }
    }
    let dir = cmd
        .kubelet_config_dir
        .clone()
        .or_else(|| config_dir(&texts.iter().map(|(_, t)| t.as_str()).collect::<Vec<_>>()));
    if let Some((path, text)) = dir.and_then(|d| drop_in(&d)) {
        let change = rewrite_config(&text, &cmd.endpoint);
        return Ok((path, text, change));
    }
    let config = cmd
        .kubelet_config
        .clone()
        .or(unit_config)
        .unwrap_or_else(|| PathBuf::from("/var/lib/kubelet/config.yaml"));
    let text = std::fs::read_to_string(&config)
        .map_err(|e| format!("the kubelet's configuration {}: {e}", config.display()))?;
    let change = rewrite_config(&text, &cmd.endpoint);
    Ok((config, text, change))
}

/// The drop-in of the kubelet's configuration directory `dir` that sets its
/// runtime endpoint (see [`deciding_drop_in`]), with its text.
fn drop_in(dir: &Path) -> Option<(PathBuf, String)> {
    let drop_ins: Vec<(String, String)> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            Some((name, std::fs::read_to_string(e.path()).ok()?))
        })
        .collect();
    let i = deciding_drop_in(&drop_ins)?;
    let (name, text) = drop_ins.into_iter().nth(i)?;
    Some((dir.join(name), text))
}

fn restart(cmd: &AdoptCmd, path: &Path) -> Result<(), String> {
    if cmd.no_restart {
        println!(
            "not restarted (--no-restart): restart {} yourself",
            cmd.kubelet_unit
        );
        return Ok(());
    }
    if path.starts_with("/etc/systemd")
        || path.starts_with("/lib/systemd")
        || path.starts_with("/usr/lib/systemd")
    {
        systemctl(&["daemon-reload"])?;
    }
    systemctl(&["restart", &cmd.kubelet_unit])?;
    println!("{} restarted", cmd.kubelet_unit);
    Ok(())
}

fn adopt(cmd: &AdoptCmd) -> Result<(), String> {
    let record_path = cmd.backup_dir.join(RECORD);
    let (path, before, change) = plan(cmd)?;
    if change.old.as_deref() == Some(cmd.endpoint.as_str()) {
        println!(
            "{}: the kubelet already dials {} ({})",
            path.display(),
            cmd.endpoint,
            if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                KEY
            } else {
                FLAG
            }
        );
        return Ok(());
    }
    println!(
        "{}: {} -> {}",
        path.display(),
        change.old.as_deref().unwrap_or("(not set)"),
        cmd.endpoint
    );
    print!("{}", diff(&before, &change.text));
    if cmd.dry_run {
        println!("dry run: nothing written, nothing restarted");
        return Ok(());
    }
    let what = answers(&cmd.endpoint).map_err(|e| {
        format!(
            "criguard does not answer on {}: {e}; nothing changed",
            cmd.endpoint
        )
    })?;
    println!("{} answers ({what})", cmd.endpoint);
    if record_path.exists() {
        return Err(format!(
            "{} exists: an adoption is in place (criguard adopt --undo first)",
            record_path.display()
        ));
    }
    std::fs::create_dir_all(&cmd.backup_dir).map_err(|e| e.to_string())?;
    let backup = cmd.backup_dir.join(format!(
        "{}.orig",
        path.to_string_lossy()
            .trim_start_matches('/')
            .replace('/', "_")
    ));
    std::fs::copy(&path, &backup).map_err(|e| format!("backup {}: {e}", backup.display()))?;
    let record = Record {
        path: path.clone(),
        backup: backup.clone(),
        old: change.old.clone(),
        new: cmd.endpoint.clone(),
    };
    let json = serde_json::to_string_pretty(&record).map_err(|e| e.to_string())?;
    std::fs::write(&record_path, json).map_err(|e| e.to_string())?;
    // The new text beside the file, then renamed over it: never half written.
    let tmp = path.with_extension("criguard-adopt.tmp");
    std::fs::write(&tmp, &change.text).map_err(|e| e.to_string())?;
    let perms = std::fs::metadata(&path)
        .map_err(|e| e.to_string())?
        .permissions();
    std::fs::set_permissions(&tmp, perms).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, &path).map_err(|e| e.to_string())?;
    println!("backup: {}", backup.display());
    restart(cmd, &path)
}

fn undo(cmd: &AdoptCmd) -> Result<(), String> {
    let record_path = cmd.backup_dir.join(RECORD);
    let json = std::fs::read_to_string(&record_path)
        .map_err(|e| format!("no adoption to undo ({}: {e})", record_path.display()))?;
    let record: Record = serde_json::from_str(&json).map_err(|e| e.to_string())?;
    let now = std::fs::read_to_string(&record.path).unwrap_or_default();
    let before = std::fs::read_to_string(&record.backup)
        .map_err(|e| format!("backup {}: {e}", record.backup.display()))?;
    println!(
        "{}: {} -> {} (from {})",
        record.path.display(),
        record.new,
        record.old.as_deref().unwrap_or("(not set)"),
        record.backup.display()
    );
    print!("{}", diff(&now, &before));
    if cmd.dry_run {
        println!("dry run: nothing written, nothing restarted");
        return Ok(());
    }
    std::fs::write(&record.path, before).map_err(|e| e.to_string())?;
    std::fs::remove_file(&record_path).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&record.backup);
    restart(cmd, &record.path)
}

/// `criguard adopt [--undo] [--dry-run]`: exit 1 with the reason on error.
pub fn run(cmd: &AdoptCmd) -> ExitCode {
    let r = if cmd.undo { undo(cmd) } else { adopt(cmd) };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("criguard adopt: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CRIGUARD: &str = "unix:///run/criguard/criguard.sock";

    #[test]
    fn the_flag_is_rewritten_in_both_spellings_and_quotes_kept() {
        let env = "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock --pod-infra-container-image=registry.k8s.io/pause:3.9\"\n";
        let c = rewrite_flag(env, CRIGUARD).unwrap();
        assert_eq!(
            c.old.as_deref(),
            Some("unix:///var/run/containerd/containerd.sock")
        );
        assert_eq!(
            c.text,
            "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/criguard/criguard.sock --pod-infra-container-image=registry.k8s.io/pause:3.9\"\n"
        );
        let dropin = "[Service]\nEnvironment=\"KUBELET_EXTRA_ARGS=--container-runtime-endpoint 'unix:///run/containerd/containerd.sock'\"\n";
        let c = rewrite_flag(dropin, CRIGUARD).unwrap();
        assert_eq!(
            c.old.as_deref(),
            Some("unix:///run/containerd/containerd.sock")
        );
        assert!(
            c.text
                .contains("--container-runtime-endpoint 'unix:///run/criguard/criguard.sock'\""),
            "{}",
            c.text
        );
        assert_eq!(
            rewrite_flag("--container-runtime-endpoint-x=1\n", CRIGUARD),
            None
        );
        assert_eq!(
            rewrite_flag("[Service]\nExecStart=/usr/bin/kubelet\n", CRIGUARD),
            None
        );
    }

    #[test]
    fn the_config_key_is_replaced_or_added() {
        let yaml = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncontainerRuntimeEndpoint: \"unix:///run/containerd/containerd.sock\" # set by kubeadm\ncgroupDriver: systemd\n";
        let c = rewrite_config(yaml, CRIGUARD);
        assert_eq!(
            c.old.as_deref(),
            Some("unix:///run/containerd/containerd.sock")
        );
        assert_eq!(
            c.text,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///run/criguard/criguard.sock\ncgroupDriver: systemd\n"
        );
        let c = rewrite_config("kind: KubeletConfiguration\n", CRIGUARD);
        assert_eq!(c.old, None);
        assert_eq!(
            c.text,
            "kind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///run/criguard/criguard.sock\n"
        );
        // Nested keys of the same name are not the kubelet's.
        let c = rewrite_config("foo:\n  containerRuntimeEndpoint: x\n", CRIGUARD);
        assert_eq!(c.old, None);
    }

    #[test]
    fn systemctl_cat_names_the_drop_ins_environment_files_and_config() {
        let cat = "# /lib/systemd/system/kubelet.service\n[Service]\nExecStart=/usr/bin/kubelet\n\n# /etc/systemd/system/kubelet.service.d/10-kubeadm.conf\n[Service]\nEnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env\nExecStart=\nExecStart=/usr/bin/kubelet --config=/var/lib/kubelet/config.yaml $KUBELET_KUBEADM_ARGS\n";
        let (files, config) = unit_files(cat);
        assert_eq!(
            files,
            [
                PathBuf::from("/lib/systemd/system/kubelet.service"),
                PathBuf::from("/etc/systemd/system/kubelet.service.d/10-kubeadm.conf"),
                PathBuf::from("/var/lib/kubelet/kubeadm-flags.env"),
            ]
        );
        assert_eq!(config, Some(PathBuf::from("/var/lib/kubelet/config.yaml")));
        let (_, config) =
            unit_files("ExecStart=/usr/local/bin/kubelet --config /etc/kubernetes/kubelet.yaml\n");
        assert_eq!(config, Some(PathBuf::from("/etc/kubernetes/kubelet.yaml")));
    }

    #[test]
    fn the_config_dir_is_found_and_its_last_drop_in_setting_the_key_decides() {
        let unit =
            "ExecStart=/usr/bin/kubelet --config=/etc/k/config.yaml --config-dir /etc/k/conf.d\n";
        let flags = "KUBELET_ARGS=\"--config-dir=/etc/k/other.d --v=2\"\n";
        assert_eq!(config_dir(&[unit]), Some(PathBuf::from("/etc/k/conf.d")));
        assert_eq!(
            config_dir(&[unit, flags]),
            Some(PathBuf::from("/etc/k/other.d")),
            "the last one wins"
        );
        assert_eq!(
            config_dir(&["ExecStart=/usr/bin/kubelet --config=/c\n"]),
            None
        );
        let d = |n: &str, t: &str| (n.to_owned(), t.to_owned());
        let drop_ins = [
            d("90-late.conf", "maxPods: 50\n"),
            d(
                "20-runtime.conf",
                "containerRuntimeEndpoint: unix:///a.sock\n",
            ),
            d(
                "10-runtime.conf",
                "containerRuntimeEndpoint: unix:///b.sock\n",
            ),
            d(
                "99-ignored.yaml",
                "containerRuntimeEndpoint: unix:///c.sock\n",
            ),
        ];
        assert_eq!(
            deciding_drop_in(&drop_ins),
            Some(1),
            "20 overrides 10; .yaml is not read"
        );
        assert_eq!(deciding_drop_in(&drop_ins[..1]), None, "no drop-in sets it");
    }

    #[test]
    fn the_diff_shows_only_changed_lines() {
        assert_eq!(diff("a\nb\nc\n", "a\nB\nc\nd\n"), "- b\n+ B\n+ d\n");
    }
}
