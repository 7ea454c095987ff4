//! `criguard serve` as an operator runs it: with a configuration file, its
//! log in a file and metrics on a loopback port, in front of a private
//! containerd. Ended (SIGKILL, by its own child handle) when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::containerd::{Clients, PrivateContainerd, unique};
use super::metrics::{free_port, parse, scrape, value};

/// A running `criguard serve --config FILE`.
pub struct Served {
    /// The process.
    pub child: Child,
    /// Its CRI socket.
    pub socket: PathBuf,
    /// Its admin socket.
    pub admin: PathBuf,
    /// Its configuration file.
    pub config: PathBuf,
    /// Its stderr.
    pub log: PathBuf,
    /// Its metrics port on 127.0.0.1.
    pub port: u16,
    /// The runtime endpoint it forwards to.
    pub runtime: String,
}

impl Served {
    /// Starts criguard in front of `ctrd` with `config` as its file (its
    /// files in a new directory named after `prefix`, `env` added to its
    /// environment) and waits until its CRI and admin sockets accept.
    pub async fn start(
        ctrd: &PrivateContainerd,
        prefix: &str,
        config: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let dir = ctrd.dir.join(unique(prefix));
        std::fs::create_dir_all(&dir).unwrap();
        let (socket, admin) = (dir.join("criguard.sock"), dir.join("admin.sock"));
        let (file, log) = (dir.join("config.toml"), dir.join("criguard.log"));
        std::fs::write(&file, config).unwrap();
        let port = free_port();
        let runtime = format!("unix://{}", ctrd.socket.display());
        let child = Command::new(crate::criguard_bin())
            .arg("serve")
            .arg("--listen")
            .arg(&socket)
            .arg("--admin-socket")
            .arg(&admin)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--config")
            .arg(&file)
            .args(["--metrics-address", &format!("127.0.0.1:{port}")])
            .args(["--runtime-endpoint", &runtime])
            .envs(env.iter().copied())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .expect("spawn criguard");
        let me = Self {
            child,
            socket,
            admin,
            config: file,
            log,
            port,
            runtime,
        };
        super::poll_until(Duration::from_secs(20), "criguard's sockets", || async {
            let cri = tokio::net::UnixStream::connect(&me.socket).await.ok();
            let admin = criguard::admin::get_status(&me.admin).await.ok();
            cri.and(admin).map(|_| ())
        })
        .await;
        me
    }

    /// CRI clients through it.
    pub fn clients(&self) -> Clients {
        Clients::new(&self.socket)
    }

    /// `criguard ARGS --admin-socket ...`: exit code and stdout.
    pub fn cli(&self, args: &[&str]) -> (i32, String) {
        let out = Command::new(crate::criguard_bin())
            .args(args)
            .arg("--admin-socket")
            .arg(&self.admin)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    /// Its configuration status, from the admin API.
    pub async fn status(&self) -> criguard::admin::ConfigStatus {
        criguard::admin::get_status(&self.admin).await.unwrap()
    }

    /// Polls the admin API until `done` holds for the configuration status.
    pub async fn status_until(
        &self,
        what: &str,
        done: impl Fn(&criguard::admin::ConfigStatus) -> bool,
    ) -> criguard::admin::ConfigStatus {
        super::poll_until(Duration::from_secs(20), what, || async {
            let s = self.status().await;
            done(&s).then_some(s)
        })
        .await
    }

    /// One sample of its metrics, scraped now.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        value(&parse(&scrape(self.port)), name, labels)
    }

    /// Replaces its configuration file.
    pub fn write_config(&self, text: &str) {
        std::fs::write(&self.config, text).unwrap();
    }

    /// SIGHUP: reload the configuration.
    pub fn hangup(&self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    }

    /// Sends SIGUSR2: a handoff to a new process.
    pub fn hand_over(&self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR2).unwrap();
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// criguard is still the process the test started, and running.
    pub fn assert_running(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "criguard exited: {}",
            self.log()
        );
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
