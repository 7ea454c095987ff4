//! Shipping: the systemd units verify, and hack/install.sh installs,
//! re-installs and uninstalls cleanly.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn units_pass_systemd_analyze_verify() {
    let dir = tempfile::tempdir().unwrap();
    for unit in ["criguard.service", "criguard.socket"] {
        // Point ExecStart at the binary just built: verify checks it exists.
        let text = std::fs::read_to_string(repo().join("systemd").join(unit)).unwrap();
        let text = text.replace("/usr/local/bin/criguard", env!("CARGO_BIN_EXE_criguard"));
        std::fs::write(dir.path().join(unit), text).unwrap();
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(dir.path().join("criguard.socket"))
        .arg(dir.path().join("criguard.service"))
        .output()
        .expect("systemd-analyze (package systemd)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );
}

fn install(dest: &Path, args: &[&str]) -> String {
    let out = Command::new(repo().join("hack/install.sh"))
        .args(args)
        .env("DESTDIR", dest)
        .env("CRIGUARD_BIN", env!("CARGO_BIN_EXE_criguard"))
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "hack/install.sh {args:?}: {said}");
    said
}

#[test]
fn install_is_idempotent_keeps_edited_defaults_and_uninstalls() {
    let dest = tempfile::tempdir().unwrap();
    let d = dest.path();
    let said = install(d, &[]);
    assert!(
        said.contains("--container-runtime-endpoint=unix:///run/criguard/criguard.sock"),
        "{said}"
    );
    let bin = d.join("usr/local/bin/criguard");
    assert_eq!(
        std::fs::metadata(&bin).unwrap().permissions().mode() & 0o777,
        0o755
    );
    for f in [
        "etc/systemd/system/criguard.service",
        "etc/systemd/system/criguard.socket",
        "etc/default/criguard",
        "etc/criguard/config.toml",
        "usr/local/share/doc/criguard/admin.proto",
    ] {
        assert!(d.join(f).is_file(), "{f} missing");
    }
    // The shipped config is valid and is the kubelet's defaults.
    let config = d.join("etc/criguard/config.toml");
    let out = std::process::Command::new(&bin)
        .arg("check-config")
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("evictionHard: imagefs.available<15%, memory.available<100Mi, nodefs.available<10%, nodefs.inodesFree<5%"),
        "{text}"
    );
    std::fs::write(
        &config,
        "evictionHard = { \"memory.available\" = \"1Gi\" }\n",
    )
    .unwrap();
    let defaults = d.join("etc/default/criguard");
    std::fs::write(&defaults, "CRIGUARD_OPTS=\"--log-format json\"\n").unwrap();
    install(d, &[]);
    assert_eq!(
        std::fs::read_to_string(&defaults).unwrap(),
        "CRIGUARD_OPTS=\"--log-format json\"\n"
    );

    install(d, &["--uninstall"]);
    assert!(!bin.exists() && !d.join("etc/systemd/system/criguard.service").exists());
    assert!(
        defaults.exists(),
        "an operator's defaults survive uninstall"
    );
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        "evictionHard = { \"memory.available\" = \"1Gi\" }\n",
        "an operator's config survives reinstall and uninstall"
    );
    install(d, &["--uninstall"]); // twice is fine
}
