//! Every reader that takes a pod's cgroup (ranking, the `oom_score_adj`
//! adjuster, the pods' cgroup signal) run over fixture trees of both
//! drivers on both cgroup versions.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, RwLock};

use crate::cgroup::fs::{CgroupFs, Layout};
use crate::cgroup::path::*;
use crate::eviction::rank::Ranker;
use crate::model::{ContainerInfo, ContainerState, NodeModel, SandboxInfo, SandboxState};
use crate::oom::adjust::OomAdjuster;
use crate::signals::node::NodeSources;
use crate::signals::table::Signal;
use crate::signals::write_fixture as write;

const MI: u64 = 1 << 20;

/// The four ways a node can be set up.
const CASES: [(Layout, Driver); 4] = [
    (Layout::V1, Driver::Cgroupfs),
    (Layout::V1, Driver::Systemd),
    (Layout::V2, Driver::Cgroupfs),
    (Layout::V2, Driver::Systemd),
];

/// A pod's cgroup parent as the kubelet spells it for `driver`.
fn parent(driver: Driver, qos: Option<&str>, uid: &str) -> String {
    match (driver, qos) {
        (Driver::Cgroupfs, Some(q)) => format!("/kubepods/{q}/pod{uid}"),
        (Driver::Cgroupfs, None) => format!("/kubepods/pod{uid}"),
        (Driver::Systemd, Some(q)) => format!("kubepods-{q}-pod{uid}.slice"),
        (Driver::Systemd, None) => format!("kubepods-pod{uid}.slice"),
    }
}

/// A fixture cgroup tree laid out as the kernel lays it out.
struct Tree {
    root: std::path::PathBuf,
    layout: Layout,
}

impl Tree {
    fn new(root: &Path, layout: Layout) -> Self {
        if layout == Layout::V2 {
            write(root, "cgroup.controllers", "cpu io memory pids\n");
        }
        Self {
            root: root.to_owned(),
            layout,
        }
    }

    fn file(&self, c: Controller, cg: &str, name: &str, text: &str) {
        let d = dir(&self.root, self.layout, c, cg);
        write(&d, name, text);
    }

    /// Memory files with `usage` and `inactive` MiB and a limit.
    fn memory(&self, cg: &str, usage: u64, inactive: u64, limit: Option<u64>) {
        let (cur, max, stat_key) = match self.layout {
            Layout::V1 => (
                "memory.usage_in_bytes",
                "memory.limit_in_bytes",
                "total_inactive_file",
            ),
            Layout::V2 => ("memory.current", "memory.max", "inactive_file"),
        };
        let m = Controller::Memory;
        self.file(m, cg, cur, &format!("{}\n", usage * MI));
        self.file(
            m,
            cg,
            "memory.stat",
            &format!("{stat_key} {}\n", inactive * MI),
        );
        let lim = match (limit, self.layout) {
            (Some(l), _) => (l * MI).to_string(),
            (None, Layout::V1) => "9223372036854771712".into(),
            (None, Layout::V2) => "max".into(),
        };
        self.file(m, cg, max, &format!("{lim}\n"));
        self.file(m, cg, "cgroup.procs", "");
    }

    fn procs(&self, cg: &str, pids: &[i32]) {
        let text: String = pids.iter().map(|p| format!("{p}\n")).collect();
        self.file(Controller::Memory, cg, "cgroup.procs", &text);
    }

    fn tasks(&self, cg: &str, current: u64) {
        self.file(
            Controller::Pids,
            cg,
            "pids.current",
            &format!("{current}\n"),
        );
        self.file(Controller::Pids, cg, "pids.max", "max\n");
    }
}

/// Two running pods, each with one container: `be` (BestEffort, 200 MiB
/// working set, 3 tasks, process 101) and `bu` (Burstable, request about
/// 100 MiB, 50 MiB working set, 9 tasks, process 202).
fn node(tree: &Tree, driver: Driver) -> NodeModel {
    let kubepods = match driver {
        Driver::Cgroupfs => "/kubepods",
        Driver::Systemd => "/kubepods.slice",
    };
    tree.memory(kubepods, 300, 0, Some(500));
    let mut m = NodeModel::new(1000 * MI as i64);
    for (id, qos, ws, tasks, pid, adj) in [
        ("be", Some("besteffort"), 200, 3, 101, 1000),
        ("bu", Some("burstable"), 50, 9, 202, 900),
    ] {
        let parent = parent(driver, qos, &format!("uid_{id}"));
        let pod_cg = pod(&parent).unwrap();
        tree.memory(&pod_cg, ws + 10, 10, None);
        tree.tasks(&pod_cg, tasks);
        let c_cg = container(&parent, &format!("c-{id}")).unwrap();
        tree.memory(&c_cg, ws, 0, None);
        tree.procs(&c_cg, &[pid]);
        tree.tasks(&c_cg, tasks - 1);
        m.upsert_sandbox(SandboxInfo {
            id: id.into(),
            name: id.into(),
            namespace: "default".into(),
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
    m
}

fn sources(root: &Path, proc_root: &Path) -> NodeSources {
    NodeSources {
        cgroups: CgroupFs::detect(root),
        proc_root: proc_root.to_owned(),
        memory_capacity: 1000 * MI,
        // The default name: on a systemd-driver node it must find kubepods.slice.
        pods_cgroup: "/kubepods".into(),
        nodefs: root.to_owned(),
        imagefs: root.to_owned(),
    }
}

#[test]
fn ranking_finds_every_pods_cgroup_under_both_drivers_and_versions() {
    for (layout, driver) in CASES {
        let t = tempfile::tempdir().unwrap();
        let tree = Tree::new(t.path(), layout);
        let model = Arc::new(RwLock::new(node(&tree, driver)));
        let ranker = Ranker::new(model, sources(t.path(), t.path()), None);
        let case = format!("{layout:?} {driver:?}");

        let memory = ranker.memory_blocking(&BTreeSet::new());
        let got: Vec<(&str, Option<i64>)> = memory
            .iter()
            .map(|v| (v.pod.sandbox_id.as_str(), v.usage))
            .collect();
        let mi = MI as i64;
        assert_eq!(
            got,
            [("be", Some(200 * mi)), ("bu", Some(50 * mi))],
            "{case}"
        );
        let heaviest = memory[0].heaviest.clone().map(|(_, u, _)| u);
        assert_eq!(heaviest, Some(200 * mi), "{case}: container cgroup");

        let pids = ranker.pids_blocking(&BTreeSet::new());
        let got: Vec<(&str, Option<i64>)> = pids
            .iter()
            .map(|v| (v.pod.sandbox_id.as_str(), v.usage))
            .collect();
        assert_eq!(got, [("bu", Some(9)), ("be", Some(3))], "{case}");
    }
}

#[test]
fn the_adjuster_writes_the_first_ranked_pods_processes_under_both_drivers() {
    for (layout, driver) in CASES {
        let t = tempfile::tempdir().unwrap();
        let (cg, proc_root) = (t.path().join("cg"), t.path().join("proc"));
        let tree = Tree::new(&cg, layout);
        let model = Arc::new(RwLock::new(node(&tree, driver)));
        write(&proc_root, "101/oom_score_adj", "1000\n");
        write(&proc_root, "202/oom_score_adj", "900\n");
        let mut adj = OomAdjuster::new(model, cg.clone(), proc_root.clone());
        let round = adj.round();
        let case = format!("{layout:?} {driver:?}");
        assert_eq!(round.first_victim.as_deref(), Some("be"), "{case}");
        // bu is kept below be: its score falls to 999 − ⌈1000·50/500⌉ (the
        // kubepods limit, not the node's 1000 MiB, is the total: 949 would
        // not be below its 900), which proves both its cgroup and
        // kubepods' were found.
        assert_eq!(
            round.written,
            HashMap::from([("c-bu".to_owned(), 899)]),
            "{case}"
        );
        let score = std::fs::read_to_string(proc_root.join("202/oom_score_adj")).unwrap();
        assert_eq!(score, "899", "{case}");
    }
}

#[test]
fn the_default_pods_cgroup_is_kubepods_slice_on_a_systemd_node() {
    for (layout, driver) in CASES {
        let t = tempfile::tempdir().unwrap();
        let tree = Tree::new(t.path(), layout);
        node(&tree, driver);
        let src = sources(t.path(), t.path());
        let want = match driver {
            Driver::Cgroupfs => "/kubepods",
            Driver::Systemd => "/kubepods.slice",
        };
        assert_eq!(src.kubepods(), want, "{layout:?} {driver:?}");
        let obs = src.observe();
        let alloc = obs
            .get(&Signal::AllocatableMemoryAvailable)
            .unwrap_or_else(|| panic!("{layout:?} {driver:?}: allocatable not observed"));
        assert_eq!(alloc.available, 200 * MI as i64, "{layout:?} {driver:?}");
        // A slice spelled as such is found too, and a name that exists
        // nowhere is kept (and simply not observed).
        let slice = NodeSources {
            pods_cgroup: "kubepods.slice".into(),
            ..src.clone()
        };
        let found = driver == Driver::Systemd;
        assert_eq!(
            slice
                .observe()
                .get(&Signal::AllocatableMemoryAvailable)
                .is_some(),
            found
        );
    }
}
