//! criguard's integration tests, one binary, so that criguard, tokio, tonic
//! and containerd-client are linked once. Run one module with a filter on its path:
//! `cargo test --test it -- eviction::` (a substring: `eviction::` also
//! matches `disk_eviction::` and `pid_eviction::`; `--exact` or a longer
//! path narrows it). `hack/test.sh` lists its groups as such filters.
//!
//! The modules share one process, so each keeps to its own:
//! - Descriptors: [`fds`] opens 400 sockets from this process; it raises
//!   the soft `RLIMIT_NOFILE` to the hard limit first
//!   ([`common::raise_nofile`]).
//! - No test sets environment variables, the working directory, the umask
//!   or signal handlers; each test's files, sockets, cgroups, ports and
//!   containerd are its own (`common::containerd::unique`,
//!   `common::metrics::free_port`).
//! - No test asserts on a whole-host figure another test could move:
//!   nodefs, imagefs and the pods' memory and pids of the pressure tests
//!   are a tmpfs, a directory and a cgroup of the test's own. (Tests that
//!   leave criguard's nodefs and imagefs at their defaults, the host's
//!   `/var/lib/kubelet` and `/var/lib/containerd`, see the host's disk:
//!   a host under the default thresholds refuses their pods.)
//! - The cluster tiers ([`cluster`], [`cluster_vm`]) are modules too;
//!   `hack/test.sh` runs them in a second process of this binary, beside
//!   the rest.
//!
//! `tests/vm/` stays a binary of its own: it is what runs inside the VM
//! (`hack/vm.sh`). So does `tests/bounds.rs`, which exhausts connections
//! and descriptors on purpose and must run alone (its header says why).
//! `tests/clients/` holds the Go and Python clients that [`clients`] runs.

use criguard_test_kit as common;

mod admin;
mod adopt;
mod cli;
mod cli_display;
mod clients;
mod cluster;
mod cluster_vm;
mod crictl;
mod crio;
mod critest;
mod deploy;
mod disk_eviction;
mod drain;
mod events;
mod evicted;
mod eviction;
mod fds;
mod frozen_runtime;
mod fuzz_corpus;
mod gc;
mod hung_fs;
mod image_gc;
mod install;
mod kill;
mod kube;
mod lifecycle;
mod lograte;
mod metrics;
mod model;
mod nri;
mod oom;
mod package;
mod pid_eviction;
mod relay;
mod reload;
mod restart;
mod state_full;
mod task_events;
mod transparency;
mod usage;
