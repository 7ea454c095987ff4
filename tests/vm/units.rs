//! Scenario 1: criguard's units under systemd as PID 1, in front of the
//! machine's own containerd.service, installed by `hack/install.sh`.
//!
//! A CRI client talks to `criguard.socket`; after `systemctl kill -s KILL
//! criguard` a call made at once waits in the socket's backlog and is
//! served by the restarted criguard; `systemctl restart containerd` takes
//! criguard down and brings it back (`BindsTo=`,
//! `WantedBy=containerd.service`), and calls recover with the model
//! rebuilt; a bad configuration does not stop criguard: it fails open
//! (relays every call, names the key and value in the journal and in
//! `criguard status`), and `systemctl reload criguard` with the file fixed
//! starts the guardian in the same process; `systemctl restart criguard`
//! under calls hands over (the unit's `ExecStop=`: the new process serves
//! while the old one drains, the next start adopts it as the main process):
//! no call fails, systemd counts no crash, the journal shows the handoff
//! and no drain on SIGTERM;
//! `hack/install.sh --uninstall` takes it all away again.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::containerd::Clients;
use crate::common::pods::{remove_pods, run_pod, sleeper};
use crate::guest::{self, main_pid, sh, sh_status, show, wait_for};
use k8s_cri::v1 as cri;

const SOCKET: &str = "/run/criguard/criguard.sock";
const ADMIN: &str = "/run/criguard/admin.sock";
const CONFIG: &str = "/etc/criguard/config.toml";

fn active(unit: &str) -> bool {
    show(unit, "ActiveState") == "active"
}

/// ListPodSandbox through criguard's socket on a new connection.
async fn list_through_socket() -> Vec<String> {
    let mut c = Clients::new(Path::new(SOCKET));
    let call =
        c.rt.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None });
    let reply = tokio::time::timeout(Duration::from_secs(60), call)
        .await
        .expect("the call through criguard.socket was not answered within 60 s")
        .expect("the call through criguard.socket failed");
    reply.into_inner().items.into_iter().map(|s| s.id).collect()
}

/// Waits (at most 60 s) until criguard.service is active with a main
/// process other than `before` that serves the admin socket (a restart's
/// start adopts the process handed over to: the unit's MainPID passes by
/// the starting process first).
async fn serving_main(before: u32, what: &str) -> u32 {
    crate::common::poll_until(Duration::from_secs(60), what, || async move {
        let p = main_pid("criguard.service");
        let serving = criguard::admin::client::serving_pid(Path::new(ADMIN)).await;
        (active("criguard.service") && p != 0 && p != before && serving.ok() == Some(p))
            .then_some(p)
    })
    .await
}

async fn model_has(sandbox: &str) -> bool {
    criguard::admin::get_pods(Path::new(ADMIN))
        .await
        .is_ok_and(|pods| pods.iter().any(|p| p.sandbox_id == sandbox))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "inside the VM only: hack/vm.sh test"]
async fn units_run_under_systemd() {
    guest::require();
    let _t = guest::Timer::start("units");
    guest::node_containerd().await;

    // Install: the binary built on the host, the units, the config; the
    // socket and the service enabled and started.
    sh(&format!(
        "cd {} && CRIGUARD_BIN={} hack/install.sh",
        env!("CARGO_MANIFEST_DIR"),
        env!("CARGO_BIN_EXE_criguard")
    ));
    wait_for(Duration::from_secs(60), "criguard.service active", || {
        active("criguard.service").then_some(())
    });
    assert!(active("criguard.socket"));
    let first = main_pid("criguard.service");
    let adj = std::fs::read_to_string(format!("/proc/{first}/oom_score_adj")).unwrap();
    assert_eq!(adj.trim(), "-999", "OOMScoreAdjust of criguard.service");

    // A CRI client through the socket: the kubelet's calls.
    let mut c = Clients::new(Path::new(SOCKET));
    let v =
        c.rt.version(cri::VersionRequest::default())
            .await
            .unwrap()
            .into_inner();
    assert_eq!(v.runtime_name, "containerd");
    let pod = guest::pod("units-web", 0, sleeper("web"));
    let (sandbox, _) = run_pod(&mut c.rt, &pod, None).await;
    crate::common::poll_until(
        Duration::from_secs(20),
        "the pod in criguard's model",
        || {
            let s = sandbox.clone();
            async move { model_has(&s).await.then_some(()) }
        },
    )
    .await;

    // SIGKILL: the socket keeps the next call waiting until systemd has
    // started criguard again (RestartSec=1), and it is served.
    let restarts = show("criguard.service", "NRestarts");
    sh("systemctl kill -s KILL criguard.service");
    let t0 = Instant::now();
    let listed = list_through_socket().await;
    let waited = t0.elapsed();
    assert!(listed.contains(&sandbox), "{listed:?}");
    let second = main_pid("criguard.service");
    assert!(second != 0 && second != first, "criguard was not restarted");
    let now: u32 = show("criguard.service", "NRestarts").parse().unwrap();
    assert_eq!(now, restarts.parse::<u32>().unwrap() + 1);
    guest::report(&format!(
        "units: a call made right after SIGKILL was served by the restarted criguard after {} ms",
        waited.as_millis()
    ));

    // containerd restarts: criguard goes down with it and comes back by
    // itself (no call needed; its restart job hands over, see below), with
    // the model rebuilt from containerd.
    sh("systemctl restart containerd.service");
    let t0 = Instant::now();
    let third = serving_main(second, "criguard running again after containerd's restart").await;
    // Its model comes back from containerd: at start when containerd's CRI
    // already answers, else at the next sync (10 s).
    crate::common::poll_until(Duration::from_secs(30), "the model rebuilt", || {
        let s = sandbox.clone();
        async move { model_has(&s).await.then_some(()) }
    })
    .await;
    let back = t0.elapsed();
    assert!(list_through_socket().await.contains(&sandbox));
    assert_eq!(main_pid("criguard.service"), third);
    guest::report(&format!(
        "units: after systemctl restart containerd, criguard ran again with its model rebuilt within {} ms",
        back.as_millis()
    ));

    // A bad configuration: criguard fails open, it does not exit.
    let good = std::fs::read_to_string(CONFIG).unwrap();
    let bad = good.replace(
        r#""memory.available" = "100Mi""#,
        r#""memory.available" = "lots""#,
    );
    assert_ne!(bad, good, "the shipped config sets memory.available");
    std::fs::write(CONFIG, bad).unwrap();
    let (code, _, _) = sh_status("systemctl restart criguard.service");
    assert_eq!(code, 0, "systemctl restart with a bad configuration");
    let open_pid = serving_main(third, "criguard restarted").await;
    let status = wait_for(Duration::from_secs(30), "criguard failing open", || {
        let (code, out, _) = sh_status(&format!(
            "/usr/local/bin/criguard status --admin-socket {ADMIN}"
        ));
        (code == 2).then_some(out)
    });
    assert!(
        status.contains("INVALID") && status.contains("memory.available=lots"),
        "criguard status names the key and the value: {status}"
    );
    // It relays: the kubelet's calls are answered as containerd alone would.
    assert!(list_through_socket().await.contains(&sandbox));
    let line = wait_for(Duration::from_secs(20), "the error in the journal", || {
        sh("journalctl -b -u criguard.service -o cat --no-pager | grep 'invalid configuration' || true")
            .lines()
            .last()
            .map(str::to_owned)
    });
    assert!(
        line.contains("memory.available") && line.contains("lots") && line.contains("failing open"),
        "the error names the key and the value: {line}"
    );
    // The file fixed, a reload (SIGHUP) starts the guardian in the same process.
    std::fs::write(CONFIG, &good).unwrap();
    let (code, _, err) = sh_status("systemctl reload criguard.service");
    assert_eq!(code, 0, "systemctl reload: {err}");
    let status = wait_for(
        Duration::from_secs(20),
        "the guardian started by the reload",
        || {
            let (code, out, _) = sh_status(&format!(
                "/usr/local/bin/criguard status --admin-socket {ADMIN}"
            ));
            (code == 0).then_some(out)
        },
    );
    assert!(
        status.contains("configuration: valid") && status.contains("1 applied"),
        "{status}"
    );
    assert_eq!(
        main_pid("criguard.service"),
        open_pid,
        "reloaded, not restarted"
    );
    assert!(list_through_socket().await.contains(&sandbox));
    guest::report(&format!(
        "units: bad config -> criguard kept running and relaying (failing open), journal: {line}; fixed and reloaded in the same process"
    ));

    restarts_hand_over().await;

    // Put things back, leave the pod gone, and uninstall: the units go
    // and containerd no longer brings criguard back.
    assert!(active("criguard.service"));
    let mut c = Clients::new(Path::new(SOCKET));
    remove_pods(&mut c.rt, [sandbox]).await;
    sh(&format!(
        "cd {} && hack/install.sh --uninstall",
        env!("CARGO_MANIFEST_DIR")
    ));
    assert!(!active("criguard.service") && !active("criguard.socket"));
    assert!(!Path::new("/usr/local/bin/criguard").exists());
}

/// `systemctl restart criguard` three times under calls: each a handoff.
async fn restarts_hand_over() {
    const RESTARTS: usize = 3;
    let since = sh("date +%s");
    let calling = guest::Calling::start(SOCKET);
    calling.until_more(10, "calls before the restarts").await;
    let mut took = Vec::new();
    for i in 0..RESTARTS {
        let before = main_pid("criguard.service");
        let t0 = Instant::now();
        let (code, _, err) = sh_status("systemctl restart criguard.service");
        assert_eq!(code, 0, "systemctl restart {i}: {err}");
        took.push(t0.elapsed().as_millis());
        serving_main(before, "a new main process").await;
        calling.until_more(10, "calls after a restart").await;
    }
    let (calls, retried, errors) = calling.stop().await;
    let journal = sh(&format!(
        "journalctl -u criguard.service --since @{} -o cat --no-pager",
        since.trim()
    ));
    assert!(
        errors.is_empty(),
        "calls failed across the restarts: {errors:?}\n{journal}"
    );
    let count = |s: &str| journal.matches(s).count();
    assert_eq!(
        (
            count("SIGUSR1: handing over to a new process for a restart"),
            count("handoff: the criguard a restart handed over to serves"),
            count("SIGTERM: draining"),
        ),
        (RESTARTS, RESTARTS, 0),
        "{journal}"
    );
    assert_eq!(show("criguard.service", "NRestarts"), "0", "{journal}");
    // A plain stop still stops, and a start serves again.
    sh("systemctl stop criguard.service");
    assert!(!active("criguard.service"));
    assert_eq!(guest::processes("criguard"), "", "nothing of criguard left");
    sh("systemctl start criguard.service");
    assert!(active("criguard.service"));
    guest::report(&format!(
        "units: {RESTARTS} systemctl restarts handed over: {calls} calls, 0 failed, {retried} refused by GOAWAY before being taken up and retried; systemctl restart took {took:?} ms"
    ));
}
