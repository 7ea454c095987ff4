//! The resolver's rules as tables (the readers that take a pod's cgroup run
//! over fixture trees of both drivers and versions in
//! `oom/cgroup_drivers_tests.rs`).

use super::*;

#[test]
fn slice_names_expand_the_way_systemd_and_runc_expand_them() {
    for (name, want) in [
        ("kubepods.slice", Some("/kubepods.slice")),
        (
            "kubepods-burstable-pod12_34.slice",
            Some("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice"),
        ),
        (
            "kubepods-pod9.slice",
            Some("/kubepods.slice/kubepods-pod9.slice"),
        ),
        ("-.slice", Some("/")),
        ("kube--pods.slice", None),
        ("-kubepods.slice", None),
        ("kubepods-.slice", None),
        ("kubepods", None),
        ("a/b.slice", None),
    ] {
        assert_eq!(expand_slice(name).as_deref(), want, "{name}");
    }
}

#[test]
fn a_pods_cgroup_for_either_driver() {
    for (parent, want) in [
        // cgroupfs: the path, normalised.
        ("/kubepods/burstable/pod1", Some("/kubepods/burstable/pod1")),
        ("/kubepods/pod1/", Some("/kubepods/pod1")),
        ("/custom//kubepods/pod1", Some("/custom/kubepods/pod1")),
        // systemd: the slice expanded; a parent spelled as a path keeps
        // only its last component, as containerd does.
        (
            "kubepods-besteffort-podab_cd.slice",
            Some("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podab_cd.slice"),
        ),
        (
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice",
            Some("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice"),
        ),
        ("", None),
        ("/", None),
        ("kubepods--x.slice", None),
    ] {
        assert_eq!(pod(parent).as_deref(), want, "{parent:?}");
    }
    assert_eq!(driver_of("kubepods-pod1.slice"), Driver::Systemd);
    assert_eq!(driver_of("/kubepods/pod1"), Driver::Cgroupfs);
}

#[test]
fn a_containers_cgroup_is_its_id_or_its_scope() {
    assert_eq!(
        container("/kubepods/burstable/pod1", "abc").as_deref(),
        Some("/kubepods/burstable/pod1/abc")
    );
    assert_eq!(
        container("kubepods-burstable-pod1.slice", "abc").as_deref(),
        Some(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-abc.scope"
        )
    );
    assert_eq!(container("", "abc"), None);
}

#[test]
fn the_pods_cgroup_flag_takes_paths_and_slice_names() {
    for (flag, want) in [
        ("/kubepods", "/kubepods"),
        ("kubepods", "/kubepods"),
        ("kubepods.slice", "/kubepods.slice"),
        ("/kubepods.slice", "/kubepods.slice"),
        ("node-kubepods.slice", "/node.slice/node-kubepods.slice"),
        ("/system.slice/x.slice", "/system.slice/x.slice"),
        ("/x/kubepods/", "/x/kubepods"),
    ] {
        assert_eq!(kubepods(flag), want, "{flag}");
    }
    assert_eq!(
        kubepods_candidates("/kubepods"),
        ["/kubepods", "/kubepods.slice"]
    );
    assert_eq!(kubepods_candidates("kubepods.slice"), ["/kubepods.slice"]);
}

#[test]
fn the_kubepods_ancestor_in_both_drivers() {
    for (cg, want) in [
        ("/x/kubepods/burstable/pod1", Some("/x/kubepods")),
        (
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice",
            Some("/kubepods.slice"),
        ),
        (
            "/n.slice/n-kubepods.slice/n-kubepods-pod1.slice",
            Some("/n.slice/n-kubepods.slice"),
        ),
        ("/k8s.io", None),
    ] {
        assert_eq!(kubepods_of(cg).as_deref(), want, "{cg}");
    }
}
