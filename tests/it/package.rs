//! The Debian package hack/deb.sh builds, inspected with dpkg-deb: what it
//! installs and where, its conffiles and control fields, its maintainer
//! scripts (the socket and service enabled, the kubelet never touched, the
//! state directory kept on purge unless asked), and the man pages and
//! completions generated from the binary's own CLI definition, one page
//! per subcommand. The test binary is packaged as is (debug build, debug
//! info stripped by the script), with gzip for speed. Installing, upgrading
//! and removing it on a systemd machine is the VM tier's (tests/vm/).

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// hack/deb.sh run on the test binary into `out`; the .deb's path.
fn build(out: &Path, version: &str) -> PathBuf {
    let stdout = run(Command::new(repo().join("hack/deb.sh"))
        .arg(out)
        .env("CRIGUARD_BIN", env!("CARGO_BIN_EXE_criguard"))
        .env("CRIGUARD_DEB_VERSION", version)
        .env("CRIGUARD_DEB_COMPRESS", "none"));
    PathBuf::from(stdout.lines().last().unwrap())
}

/// The visible subcommands, from `criguard --help`.
fn subcommands() -> Vec<String> {
    let help = run(Command::new(env!("CARGO_BIN_EXE_criguard")).arg("--help"));
    help.split("Commands:")
        .nth(1)
        .unwrap()
        .split("\n\n")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

fn gunzip(path: &Path) -> String {
    let out = run(Command::new("gzip").arg("-dc").arg(path));
    out.to_string()
}

#[test]
fn the_package_holds_the_binary_units_conffiles_docs_man_pages_and_completions() {
    let dir = tempfile::tempdir().unwrap();
    let deb = build(dir.path(), "0.1.0-7");
    assert!(
        deb.file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("criguard_0.1.0-7_"),
        "{deb:?}"
    );

    // Contents: paths and modes.
    let listing = run(Command::new("dpkg-deb").arg("-c").arg(&deb));
    let files: BTreeSet<String> = listing
        .lines()
        .filter(|l| l.starts_with('-'))
        .map(|l| {
            let path = l.split_whitespace().nth(5).unwrap();
            path.trim_start_matches('.').to_owned()
        })
        .collect();
    let mut expected = vec![
        "/usr/bin/criguard".to_owned(),
        "/lib/systemd/system/criguard.service".into(),
        "/lib/systemd/system/criguard.socket".into(),
        "/etc/criguard/config.toml".into(),
        "/etc/default/criguard".into(),
        "/usr/share/doc/criguard/README.md".into(),
        "/usr/share/doc/criguard/operations.md".into(),
        "/usr/share/doc/criguard/rbac.yaml".into(),
        "/usr/share/doc/criguard/copyright".into(),
        "/usr/share/doc/criguard/changelog.Debian.gz".into(),
        "/usr/share/doc/criguard/prometheus/criguard-alerts.yaml".into(),
        "/usr/share/doc/criguard/grafana/criguard-dashboard.json".into(),
        "/usr/share/man/man1/criguard.1.gz".into(),
        "/usr/share/bash-completion/completions/criguard".into(),
        "/usr/share/zsh/vendor-completions/_criguard".into(),
        "/usr/share/fish/vendor_completions.d/criguard.fish".into(),
    ];
    let subs = subcommands();
    assert!(subs.len() >= 9, "{subs:?}");
    expected.extend(
        subs.iter()
            .map(|s| format!("/usr/share/man/man1/criguard-{s}.1.gz")),
    );
    for path in &expected {
        assert!(
            files.contains(path),
            "{path} not in the package:\n{listing}"
        );
    }
    assert!(
        listing
            .lines()
            .any(|l| l.starts_with("-rwxr-xr-x root/root") && l.ends_with("./usr/bin/criguard")),
        "{listing}"
    );
    assert!(
        !listing.contains("/usr/local/"),
        "nothing under /usr/local:\n{listing}"
    );

    // Control fields and conffiles.
    let info = run(Command::new("dpkg-deb").arg("-I").arg(&deb));
    for field in [
        "Package: criguard",
        "Version: 0.1.0-7",
        "Depends: libc6 (>= 2.",
        "conffiles",
        "postinst",
        "prerm",
        "postrm",
    ] {
        assert!(info.contains(field), "{field}:\n{info}");
    }
    let control = tempfile::tempdir().unwrap();
    run(Command::new("dpkg-deb")
        .arg("-e")
        .arg(&deb)
        .arg(control.path()));
    let read = |name: &str| std::fs::read_to_string(control.path().join(name)).unwrap();
    assert_eq!(
        read("conffiles"),
        "/etc/criguard/config.toml\n/etc/default/criguard\n"
    );

    // Maintainer scripts: enable and start the socket and the service, hand
    // over to the new binary on an upgrade;
    // the kubelet only ever named in what they print or say in comments;
    // /var/lib/criguard removed on purge only when asked.
    let postinst = read("postinst");
    assert!(
        postinst.contains("systemctl enable criguard.socket criguard.service"),
        "{postinst}"
    );
    // An upgrade hands over (reload), restarting only a version that
    // does not.
    assert!(
        postinst.contains("systemctl reload criguard.service")
            && postinst.contains("systemctl restart criguard.service"),
        "{postinst}"
    );
    for name in ["postinst", "prerm", "postrm"] {
        for line in read(name).lines() {
            let l = line.trim_start();
            if l.contains("kubelet") {
                assert!(
                    l.starts_with('#') || l.starts_with("echo "),
                    "{name} acts on the kubelet: {line}"
                );
            }
        }
    }
    let postrm = read("postrm");
    let purge_state = postrm
        .lines()
        .position(|l| l.contains("rm -rf /var/lib/criguard"))
        .expect("postrm can remove the state directory");
    assert!(
        postrm
            .lines()
            .nth(purge_state - 1)
            .unwrap()
            .contains("CRIGUARD_PURGE_STATE:-no}\" = yes"),
        "{postrm}"
    );
    // The scripts are valid sh.
    for name in ["postinst", "prerm", "postrm"] {
        run(Command::new("sh").arg("-n").arg(control.path().join(name)));
    }

    // Extracted: the units run the packaged binary, the configuration is
    // one criguard accepts, the man pages document each subcommand.
    let root = tempfile::tempdir().unwrap();
    run(Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(root.path()));
    let r = root.path();
    let service = std::fs::read_to_string(r.join("lib/systemd/system/criguard.service")).unwrap();
    assert!(
        service.contains("ExecStart=/usr/bin/criguard serve"),
        "{service}"
    );
    assert!(!service.contains("/usr/local"), "{service}");
    let bin = r.join("usr/bin/criguard");
    let version = run(Command::new(&bin).arg("version"));
    assert!(version.starts_with("criguard "), "{version}");
    run(Command::new(&bin)
        .arg("check-config")
        .arg("--config")
        .arg(r.join("etc/criguard/config.toml")));
    let mut elf = [0u8; 4];
    std::fs::File::open(&bin)
        .unwrap()
        .read_exact(&mut elf)
        .unwrap();
    assert_eq!(&elf, b"\x7fELF");
    let main_page = gunzip(&r.join("usr/share/man/man1/criguard.1.gz"));
    for s in &subs {
        assert!(
            main_page.contains(&format!("criguard\\-{}", s.replace('-', "\\-"))),
            "criguard.1 lacks {s}"
        );
        let page = gunzip(&r.join(format!("usr/share/man/man1/criguard-{s}.1.gz")));
        assert!(page.contains(".TH criguard-"), "{s}: {page}");
    }
    let serve = gunzip(&r.join("usr/share/man/man1/criguard-serve.1.gz"));
    assert!(serve.contains("\\-\\-runtime\\-endpoint"), "{serve}");
    let bash =
        std::fs::read_to_string(r.join("usr/share/bash-completion/completions/criguard")).unwrap();
    for s in &subs {
        assert!(bash.contains(s.as_str()), "bash completion lacks {s}");
    }
}
