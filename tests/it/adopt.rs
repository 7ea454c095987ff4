//! `criguard adopt` on a kubelet's files laid out in a temporary directory
//! (the kubelet itself, and its restart, are the cluster tier's): the
//! flag in a flags file is changed where it is set, else the configuration
//! file's key, or the last drop-in of its `--config-dir` that sets it; a
//! dry run changes nothing; nothing is written while the
//! endpoint does not answer CRI; `--undo` restores the file byte for byte.
//! The endpoint that answers is a private containerd's socket (any CRI
//! runtime answers Version as criguard does).

use crate::common;

use std::path::Path;
use std::process::Command;

use common::containerd::PrivateContainerd;

const CONFIG: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///run/containerd/containerd.sock\ncgroupDriver: systemd\n";
const FLAGS: &str = "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock --node-ip=10.0.0.5\"\n";

fn adopt(dir: &Path, endpoint: &str, flags: &Path, extra: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_criguard"))
        .arg("adopt")
        .args(["--endpoint", endpoint])
        .arg("--kubelet-config")
        .arg(dir.join("config.yaml"))
        .arg("--flags-file")
        .arg(flags)
        .arg("--backup-dir")
        .arg(dir.join("backup"))
        .arg("--no-restart")
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap()
}

#[test]
fn adopt_changes_where_the_endpoint_is_set_and_undo_restores_it() {
    let ctrd = PrivateContainerd::start();
    let answering = format!("unix://{}", ctrd.socket.display());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (config, flags) = (dir.join("config.yaml"), dir.join("kubeadm-flags.env"));
    std::fs::write(&config, CONFIG).unwrap();
    std::fs::write(&flags, FLAGS).unwrap();

    // A dry run prints the change and writes nothing.
    let (code, out) = adopt(dir, &answering, &flags, &["--dry-run"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("- KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock")
            && out.contains(&format!("+ KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint={answering} --node-ip")),
        "{out}"
    );
    assert_eq!(read(&flags), FLAGS);
    assert!(!dir.join("backup").exists());

    // An endpoint that does not answer: nothing written.
    let dead = format!("unix://{}", dir.join("nobody.sock").display());
    let (code, out) = adopt(dir, &dead, &flags, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("does not answer") && out.contains("nothing changed"),
        "{out}"
    );
    assert_eq!(read(&flags), FLAGS);
    assert!(!dir.join("backup/adopt.json").exists());

    // The flag wins over the configuration file: the flag is changed.
    let (code, out) = adopt(dir, &answering, &flags, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("answers (containerd"), "{out}");
    assert_eq!(
        read(&flags),
        FLAGS.replace("unix:///var/run/containerd/containerd.sock", &answering)
    );
    assert_eq!(read(&config), CONFIG, "the configuration file untouched");
    let record: serde_json::Value =
        serde_json::from_str(&read(&dir.join("backup/adopt.json"))).unwrap();
    assert_eq!(record["old"], "unix:///var/run/containerd/containerd.sock");
    assert_eq!(read(Path::new(record["backup"].as_str().unwrap())), FLAGS);
    // Again: already in place.
    let (code, out) = adopt(dir, &answering, &flags, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("already dials"), "{out}");

    // Undo: byte for byte.
    let (code, out) = adopt(dir, &answering, &flags, &["--undo"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(read(&flags), FLAGS);
    assert!(!dir.join("backup/adopt.json").exists());
    let (code, out) = adopt(dir, &answering, &flags, &["--undo"]);
    assert_eq!(code, 1, "nothing left to undo: {out}");

    // No flag anywhere: the configuration file's key.
    std::fs::write(&flags, "KUBELET_KUBEADM_ARGS=\"--node-ip=10.0.0.5\"\n").unwrap();
    let (code, out) = adopt(dir, &answering, &flags, &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        read(&config),
        CONFIG.replace("unix:///run/containerd/containerd.sock", &answering)
    );
    let (code, out) = adopt(dir, &answering, &flags, &["--undo"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(read(&config), CONFIG);

    // A --config-dir drop-in that sets the key overrides the file: the last
    // such drop-in in name order is changed (named by the flags file here,
    // as a kubelet's EnvironmentFile would).
    let conf_d = dir.join("conf.d");
    std::fs::create_dir(&conf_d).unwrap();
    let early = "containerRuntimeEndpoint: unix:///early.sock\n";
    let late = "maxPods: 50\ncontainerRuntimeEndpoint: unix:///late.sock\n";
    std::fs::write(conf_d.join("10-early.conf"), early).unwrap();
    std::fs::write(conf_d.join("20-late.conf"), late).unwrap();
    std::fs::write(conf_d.join("30-other.conf"), "maxPods: 60\n").unwrap();
    std::fs::write(
        &flags,
        format!(
            "KUBELET_KUBEADM_ARGS=\"--config-dir={} --node-ip=10.0.0.5\"\n",
            conf_d.display()
        ),
    )
    .unwrap();
    let (code, out) = adopt(dir, &answering, &flags, &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        read(&conf_d.join("20-late.conf")),
        late.replace("unix:///late.sock", &answering)
    );
    assert_eq!(read(&conf_d.join("10-early.conf")), early);
    assert_eq!(read(&config), CONFIG, "the configuration file untouched");
    let (code, out) = adopt(dir, &answering, &flags, &["--undo"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(read(&conf_d.join("20-late.conf")), late);
}
