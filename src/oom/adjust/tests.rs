//! The adjuster over a fixture cgroup v1 tree and a fixture procfs: what a
//! round reads, decides and writes as counters move or stand still.

use std::path::{Path, PathBuf};

use super::*;
use crate::model::{ContainerInfo, SandboxInfo, SandboxState};
use crate::signals::write_fixture as write;

const MI: i64 = 1 << 20;

/// A v1 tree: kubepods limited to 500 MiB; pods `be` (BestEffort, process
/// 101 at 1000) and `bu` (Burstable, kubelet score 900, process 202).
struct Node {
    _dir: tempfile::TempDir,
    cg: PathBuf,
    proc: PathBuf,
    model: Arc<RwLock<NodeModel>>,
}

fn memory(cg: &Path, rel: &str, usage_mib: i64) {
    let d = format!("memory/{rel}");
    write(
        cg,
        &format!("{d}/memory.usage_in_bytes"),
        &format!("{}\n", usage_mib * MI),
    );
    write(cg, &format!("{d}/memory.stat"), "total_inactive_file 0\n");
}

impl Node {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (cg, proc) = (dir.path().join("cg"), dir.path().join("proc"));
        write(
            &cg,
            "memory/kubepods/memory.limit_in_bytes",
            &format!("{}\n", 500 * MI),
        );
        let mut m = NodeModel::new(1000 * MI);
        for (id, qos, usage, pid, adj) in [
            ("be", "besteffort", 200, 101, 1000),
            ("bu", "burstable", 50, 202, 900),
        ] {
            let parent = format!("/kubepods/{qos}/pod{id}");
            memory(&cg, &parent, usage);
            memory(&cg, &format!("{parent}/c-{id}"), usage);
            write(
                &cg,
                &format!("memory{parent}/c-{id}/cgroup.procs"),
                &format!("{pid}\n"),
            );
            write(&proc, &format!("{pid}/oom_score_adj"), &format!("{adj}\n"));
            m.upsert_sandbox(SandboxInfo {
                id: id.into(),
                name: id.into(),
                uid: format!("uid-{id}"),
                cgroup_parent: parent,
                state: Some(SandboxState::Ready),
                ..Default::default()
            });
            m.upsert_container(ContainerInfo {
                id: format!("c-{id}"),
                sandbox_id: id.into(),
                name: "main".into(),
                oom_score_adj: adj,
                state: Some(ContainerState::Running),
                ..Default::default()
            });
        }
        Self {
            _dir: dir,
            cg,
            proc,
            model: Arc::new(RwLock::new(m)),
        }
    }

    fn adjuster(&self) -> OomAdjuster {
        OomAdjuster::new(self.model.clone(), self.cg.clone(), self.proc.clone())
    }

    /// Sets the usage of pod `id` and of its container.
    fn usage(&self, id: &str, qos: &str, mib: i64) {
        memory(&self.cg, &format!("/kubepods/{qos}/pod{id}"), mib);
        memory(&self.cg, &format!("/kubepods/{qos}/pod{id}/c-{id}"), mib);
    }

    fn score(&self, pid: i32) -> String {
        std::fs::read_to_string(self.proc.join(format!("{pid}/oom_score_adj")))
            .unwrap()
            .trim()
            .to_owned()
    }
}

#[test]
fn a_round_where_nothing_moved_decides_nothing_and_writes_nothing() {
    let n = Node::new();
    let mut a = n.adjuster();
    let first = a.round();
    assert_eq!(first.decided, Some(Why::First));
    assert_eq!(first.first_victim.as_deref(), Some("be"));
    // bu is bounded: 999 − ⌈1000 · 50 / 500⌉.
    assert_eq!(first.written, HashMap::from([("c-bu".to_owned(), 899)]));
    assert_eq!(n.score(202), "899");
    // Nothing moved: the decision stands; the stats a decision reads can
    // even be gone, and a process put back to another score stays so.
    std::fs::remove_file(n.cg.join("memory/kubepods/burstable/podbu/memory.stat")).unwrap();
    write(&n.proc, "202/oom_score_adj", "950\n");
    let second = a.round();
    assert_eq!(second.decided, None);
    assert_eq!(second.first_victim.as_deref(), Some("be"));
    assert!(second.written.is_empty());
    assert_eq!(n.score(202), "950");
}

#[test]
fn usage_moving_less_than_a_step_is_no_change_and_more_is() {
    let n = Node::new();
    let mut a = n.adjuster();
    a.round();
    // One step is 500 MiB / 1000 = 0.5 MiB: 50 MiB + 256 KiB is within it.
    write(
        &n.cg,
        "memory/kubepods/burstable/podbu/memory.usage_in_bytes",
        &format!("{}\n", 50 * MI + MI / 4),
    );
    assert_eq!(a.round().decided, None);
    n.usage("bu", "burstable", 60);
    let r = a.round();
    assert_eq!(r.decided, Some(Why::Usage("bu".into())));
    // 999 − ⌈1000 · 60 / 500⌉ = 879: lower than the 899 set, so written.
    assert_eq!(r.written, HashMap::from([("c-bu".to_owned(), 879)]));
}

#[test]
fn a_model_change_decides_again_and_an_unchanged_target_is_not_rewritten() {
    let n = Node::new();
    let mut a = n.adjuster();
    a.round();
    n.model
        .write()
        .unwrap()
        .set_container_state("c-be", ContainerState::Exited);
    let r = a.round();
    assert_eq!(r.decided, Some(Why::Model));
    // be is still first (its sandbox runs); bu's target is the same 899.
    assert_eq!(r.first_victim.as_deref(), Some("be"));
    assert!(r.written.is_empty(), "{r:?}");
}

#[test]
fn a_bound_no_longer_needed_is_restored_once_and_then_left_alone() {
    let n = Node::new();
    let mut a = n.adjuster();
    assert_eq!(n.score(202), "900");
    a.round();
    assert_eq!(n.score(202), "899");
    // At 40 MiB the bound is 999 − 80 = 919, above the kubelet's 900: no
    // bound needed, so criguard gives the kubelet's score back.
    n.usage("bu", "burstable", 40);
    let r = a.round();
    assert_eq!(r.written, HashMap::from([("c-bu".to_owned(), 900)]));
    assert_eq!(n.score(202), "900");
    // criguard no longer owns that score: a later decision leaves it alone.
    write(&n.proc, "202/oom_score_adj", "700\n");
    n.usage("bu", "burstable", 30);
    let r = a.round();
    assert!(r.decided.is_some() && r.written.is_empty(), "{r:?}");
    assert_eq!(n.score(202), "700");
}

#[test]
fn the_first_victim_changing_rewrites_both_pods() {
    let n = Node::new();
    let mut a = n.adjuster();
    a.round();
    // be's sandbox stops: bu becomes first and gets 1000 exactly.
    n.model
        .write()
        .unwrap()
        .set_sandbox_state("be", SandboxState::NotReady);
    let r = a.round();
    assert_eq!(r.first_victim.as_deref(), Some("bu"));
    assert_eq!(r.written, HashMap::from([("c-bu".to_owned(), 1000)]));
    assert_eq!(n.score(202), "1000");
}

#[test]
fn ranking_only_still_records_and_writes_nothing() {
    let n = Node::new();
    let ranks = Arc::new(Mutex::new(RankHistory::default()));
    let mut a = n.adjuster().rank_only().with_rank_history(ranks.clone());
    let r = a.round();
    assert_eq!(r.first_victim.as_deref(), Some("be"));
    assert!(r.written.is_empty());
    assert_eq!(n.score(202), "900");
    // A round that decides nothing still records the standing first pod.
    assert_eq!(a.round().decided, None);
    assert_eq!(ranks.lock().unwrap().first_at(u64::MAX), Some("be"));
}

#[test]
fn every_score_is_verified_at_the_first_round_then_every_verify_period() {
    let t0 = Instant::now();
    assert!(verify_due(None, t0));
    assert!(!verify_due(
        Some(t0),
        t0 + VERIFY - Duration::from_millis(1)
    ));
    assert!(verify_due(Some(t0), t0 + VERIFY));
    // A clock read before the last verification is no reason to verify.
    assert!(!verify_due(Some(t0 + VERIFY), t0));
}
