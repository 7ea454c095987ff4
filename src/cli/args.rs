//! The options of `serve` and `check-config`, by the kubelet's flag names
//! where it has them, and their parsing into configuration (the file's
//! keys first, flags over them key by key). Every error names its flag.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use criguard::signals::notify::v2::PsiSettings;
use criguard::{config, runtime};

use super::{DEFAULT_ADMIN, parse_seconds};

/// The eviction configuration: a file with the kubelet's keys, and the
/// kubelet's flags, which override it key by key.
#[derive(clap::Args, Debug, Clone)]
pub struct EvictionArgs {
    /// Configuration file (TOML with KubeletConfiguration's key names).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Hard thresholds, e.g. memory.available<100Mi,nodefs.available<10%
    /// (`none`: no hard threshold at all).
    #[arg(long)]
    pub eviction_hard: Option<String>,
    /// Soft thresholds, e.g. memory.available<1.5Gi.
    #[arg(long)]
    pub eviction_soft: Option<String>,
    /// Soft grace periods, e.g. memory.available=1m30s.
    #[arg(long)]
    pub eviction_soft_grace_period: Option<String>,
    /// Cap in seconds on a pod's grace period under soft eviction.
    #[arg(long, allow_negative_numbers = true)]
    pub eviction_max_pod_grace_period: Option<i64>,
    /// Minimum reclaim per signal, e.g. memory.available=0Mi,nodefs.available=500Mi.
    #[arg(long)]
    pub eviction_minimum_reclaim: Option<String>,
    /// How long a pressure condition outlives its thresholds, e.g. 5m.
    #[arg(long)]
    pub eviction_pressure_transition_period: Option<String>,
    /// Housekeeping interval, e.g. 10s.
    #[arg(long)]
    pub housekeeping_interval: Option<String>,
}

impl EvictionArgs {
    /// The configuration file's settings (all unset without a file).
    pub fn file(&self) -> Result<config::file::RawFile, config::ConfigError> {
        match &self.config {
            Some(path) => config::file::load(path),
            None => Ok(config::file::RawFile::default()),
        }
    }

    pub fn load(
        &self,
        file: config::RawEviction,
    ) -> Result<config::EvictionConfig, config::ConfigError> {
        use config::flags;
        let map =
            |key: &str, v: &Option<String>, f: fn(&str, &str) -> Result<_, config::ConfigError>| {
                v.as_deref().map(|t| f(key, t)).transpose()
            };
        let flags = config::RawEviction {
            hard: map(
                "--eviction-hard",
                &self.eviction_hard,
                flags::hard_thresholds,
            )?,
            soft: map("--eviction-soft", &self.eviction_soft, flags::thresholds)?
                .unwrap_or_default(),
            soft_grace_period: map(
                "--eviction-soft-grace-period",
                &self.eviction_soft_grace_period,
                flags::pairs,
            )?
            .unwrap_or_default(),
            max_pod_grace_period: self.eviction_max_pod_grace_period,
            minimum_reclaim: map(
                "--eviction-minimum-reclaim",
                &self.eviction_minimum_reclaim,
                flags::pairs,
            )?
            .unwrap_or_default(),
            pressure_transition_period: self.eviction_pressure_transition_period.clone(),
            housekeeping_interval: self.housekeeping_interval.clone(),
        };
        file.merge(flags).validate()
    }
}

/// `criguard check-config`'s options: the same settings as `serve`.
#[derive(clap::Args, Debug)]
pub struct CheckConfigCmd {
    #[command(flatten)]
    pub eviction: EvictionArgs,
    #[command(flatten)]
    pub gc: GcArgs,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// The optional Kubernetes API report (file keys `kubeconfig`, `nodeName`,
/// `kubeStatusTimeout`, `nodeTaints`; flags override them).
#[derive(clap::Args, Debug, Clone)]
pub struct KubeArgs {
    /// Report evictions to the Kubernetes API with this kubeconfig
    /// (`in-cluster`: the pod's service account) [default: no API report].
    #[arg(long)]
    pub kubeconfig: Option<String>,
    /// This node's name in the API [default: the hostname].
    #[arg(long)]
    pub node_name: Option<String>,
    /// How long an eviction waits for the pod status write [default: 250ms].
    #[arg(long)]
    pub kube_status_timeout: Option<String>,
    /// Taint the node NoSchedule (criguard.io/*-pressure) under pressure [default: true].
    #[arg(long, action = clap::ArgAction::Set)]
    pub node_taints: Option<bool>,
}

impl KubeArgs {
    pub fn raw(&self) -> config::kube::RawKube {
        config::kube::RawKube {
            kubeconfig: self.kubeconfig.clone(),
            node_name: self.node_name.clone(),
            status_timeout: self.kube_status_timeout.clone(),
            taints: self.node_taints,
        }
    }
}

/// The hostname, the kubelet's default node name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default()
}

/// `criguard serve`'s options.
#[derive(clap::Args, Debug)]
pub struct ServeCmd {
    /// Where criguard learns the container lifecycle: `proxy`, in the
    /// kubelet's CRI calls relayed on `--listen`; `nri`, from containerd as
    /// an NRI plugin on `--nri-socket` (containerd 2), out of the
    /// kubelet's call path.
    #[arg(long, value_enum, default_value_t = Mode::Proxy)]
    pub mode: Mode,
    /// The runtime's NRI socket (`--mode nri`).
    #[arg(long, default_value = criguard::nri::attach::DEFAULT_SOCKET)]
    pub nri_socket: PathBuf,
    /// criguard's NRI plugin index, two digits: plugins are called in
    /// ascending order of it (`--mode nri`).
    #[arg(long, default_value = "90", value_parser = parse_nri_index)]
    pub nri_index: String,
    /// Socket to listen on (ignored under systemd socket activation, and
    /// unbound in `--mode nri`: the kubelet dials the runtime).
    #[arg(long, default_value = "/run/criguard/criguard.sock")]
    pub listen: PathBuf,
    /// The runtime to forward to.
    #[arg(long, default_value = "unix:///run/containerd/containerd.sock")]
    pub runtime_endpoint: String,
    /// How long calls in flight may finish after SIGTERM (a slow
    /// RunPodSandbox on a loaded node can take over 10 s).
    #[arg(long, default_value = "30s", value_parser = parse_seconds)]
    pub drain: Duration,
    /// Kubelet connections served at once; a client past it gets
    /// `UNAVAILABLE: criguard: connection limit N reached`.
    #[arg(long, default_value_t = criguard::cri::proxy::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// criguard's admin socket (`criguard pods` reads it).
    #[arg(long, default_value = DEFAULT_ADMIN)]
    pub admin_socket: PathBuf,
    /// containerd's snapshotter for CRI containers (its CRI plugin's
    /// `containerd.snapshotter`): where writable layers are looked up.
    #[arg(long, default_value = criguard::runtime::snapshots::DEFAULT_SNAPSHOTTER)]
    pub snapshotter: String,
    /// How often the node model is re-synced with the runtime (the safety
    /// net behind containerd's task events).
    #[arg(long, default_value = "10s", value_parser = parse_seconds)]
    pub sync_interval: Duration,
    /// Re-adjust running containers' oom_score_adj so that the kernel's
    /// OOM victim is criguard's first-ranked pod (false: the kubelet's
    /// static scores only).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub dynamic_oom_score_adj: bool,
    /// How often the dynamic oom_score_adj round runs.
    #[arg(long, default_value = "1s", value_parser = parse_seconds)]
    pub oom_adjust_interval: Duration,
    /// Where Prometheus metrics are served (`none`: not at all).
    #[arg(long, default_value = "127.0.0.1:9809")]
    pub metrics_address: String,
    #[command(flatten)]
    pub eviction: EvictionArgs,
    #[command(flatten)]
    pub node: NodeArgs,
    /// Decide and log evictions, stop nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Where criguard keeps what must survive a restart (image last-used times).
    #[arg(long, default_value = "/var/lib/criguard")]
    pub state_dir: PathBuf,
    #[command(flatten)]
    pub gc: GcArgs,
    #[command(flatten)]
    pub events: EventArgs,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// Where `criguard serve` learns the container lifecycle.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The kubelet's CRI calls, relayed.
    Proxy,
    /// containerd's NRI, as a plugin.
    Nri,
}

/// An NRI plugin index: exactly two ASCII digits, as NRI requires.
fn parse_nri_index(s: &str) -> Result<String, String> {
    if s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit()) {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "an NRI plugin index is two digits, like 90, not {s:?}"
        ))
    }
}

impl ServeCmd {
    /// `--runtime-endpoint`, parsed, or the configuration error naming the
    /// flag. A relay essential: without it there is nothing to relay to.
    pub fn runtime_endpoint(&self) -> Result<runtime::RuntimeEndpoint, config::ConfigError> {
        runtime::RuntimeEndpoint::parse(&self.runtime_endpoint).map_err(|e| config::ConfigError {
            key: "--runtime-endpoint".into(),
            value: self.runtime_endpoint.clone(),
            rule: e.to_string(),
        })
    }

    /// `--metrics-address` (`None`: no metrics), or the configuration error
    /// naming the flag. Not a relay essential: a bad one makes criguard
    /// fail open without metrics.
    pub fn metrics_address(&self) -> Result<Option<std::net::SocketAddr>, config::ConfigError> {
        match self.metrics_address.as_str() {
            "none" => Ok(None),
            addr => addr.parse().map(Some).map_err(|_| config::ConfigError {
                key: "--metrics-address".into(),
                value: addr.into(),
                rule: "expected IP:port (e.g. 127.0.0.1:9809) or none".into(),
            }),
        }
    }
}

/// Memory events: eviction rounds between housekeeping ticks.
#[derive(clap::Args, Debug, Clone)]
pub struct EventArgs {
    /// Start an eviction round as soon as the kernel reports memory
    /// pressure (cgroup v1: memcg usage thresholds at each memory threshold;
    /// v2: PSI triggers and memory.events), not only on the housekeeping
    /// tick (false: the tick alone).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub memory_events: bool,
    /// cgroup v2: memory stall time within --memory-psi-window that fires
    /// the PSI trigger, e.g. 150ms.
    #[arg(long, default_value = "150ms")]
    pub memory_psi_stall: String,
    /// cgroup v2: the PSI trigger's window, 500ms to 10s (without
    /// CAP_SYS_RESOURCE the kernel wants a multiple of 2s).
    #[arg(long, default_value = "2s")]
    pub memory_psi_window: String,
}

impl EventArgs {
    /// The PSI settings when events are on, or the configuration error naming the flag.
    pub fn load(&self) -> Result<Option<PsiSettings>, config::ConfigError> {
        let (stall, window) = ("--memory-psi-stall", "--memory-psi-window");
        let psi = PsiSettings::new(
            config::duration(stall, &self.memory_psi_stall)?,
            config::duration(window, &self.memory_psi_window)?,
            stall,
            window,
        )?;
        Ok(self.memory_events.then_some(psi))
    }
}

/// Dead-container garbage collection, with the kubelet's flag names.
#[derive(clap::Args, Debug, Clone)]
pub struct GcArgs {
    /// Minimum age of a dead container before it is collected, e.g. 0s, 1m.
    #[arg(long, default_value = "0s")]
    pub minimum_container_ttl_duration: String,
    /// Dead instances kept per (pod, container name); negative: no limit.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub maximum_dead_containers_per_container: i32,
    /// Dead containers kept on the node; negative: no limit.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub maximum_dead_containers: i32,
    /// How often container GC runs (the kubelet's period is 1m).
    #[arg(long, default_value = "1m")]
    pub container_gc_interval: String,
    /// imagefs usage (%) at which image GC starts [default: 85].
    #[arg(long, allow_negative_numbers = true)]
    pub image_gc_high_threshold: Option<i64>,
    /// imagefs usage (%) image GC brings it down to [default: 80].
    #[arg(long, allow_negative_numbers = true)]
    pub image_gc_low_threshold: Option<i64>,
    /// Minimum age of an unused image before it is collected [default: 2m].
    #[arg(long)]
    pub minimum_image_ttl_duration: Option<String>,
    /// Unused images not used for this long are collected (0: off) [default: 0].
    #[arg(long)]
    pub image_maximum_gc_age: Option<String>,
    /// How often image GC runs (the kubelet's period is 5m).
    #[arg(long, default_value = "5m")]
    pub image_gc_interval: String,
}

impl GcArgs {
    /// Image GC policy (file overridden by flags) and period.
    pub fn load_images(
        &self,
        file: config::image_gc::RawImageGc,
    ) -> Result<(criguard::config::image_gc::ImageGcPolicy, Duration), config::ConfigError> {
        let flags = config::image_gc::RawImageGc {
            high_percent: self.image_gc_high_threshold,
            low_percent: self.image_gc_low_threshold,
            min_age: self.minimum_image_ttl_duration.clone(),
            max_age: self.image_maximum_gc_age.clone(),
        };
        let policy = file.merge(flags).validate()?;
        Ok((
            policy,
            positive("--image-gc-interval", &self.image_gc_interval)?,
        ))
    }

    /// The policy and period, or the configuration error naming the flag.
    pub fn load(
        &self,
    ) -> Result<(criguard::gc::container_policy::GcPolicy, Duration), config::ConfigError> {
        let period = positive("--container-gc-interval", &self.container_gc_interval)?;
        let policy = criguard::gc::container_policy::GcPolicy {
            min_age: config::duration(
                "--minimum-container-ttl-duration",
                &self.minimum_container_ttl_duration,
            )?,
            max_per_pod_container: self.maximum_dead_containers_per_container,
            max_containers: self.maximum_dead_containers,
        };
        Ok((policy, period))
    }
}

/// A duration that must not be zero, or the error naming `key`.
pub fn positive(key: &str, v: &str) -> Result<Duration, config::ConfigError> {
    let d = config::duration(key, v)?;
    if d.is_zero() {
        return Err(config::ConfigError {
            key: key.into(),
            value: v.into(),
            rule: "must be positive".into(),
        });
    }
    Ok(d)
}

/// Where the node's signals are read.
#[derive(clap::Args, Debug, Clone)]
pub struct NodeArgs {
    /// The pods' cgroup (node allocatable), as the kubelet names it: a path
    /// or a systemd slice (`kubepods.slice`); the default is found under
    /// either driver (`/kubepods` or `/kubepods.slice`).
    #[arg(long, default_value = "/kubepods")]
    pub kubepods_cgroup: String,
    /// The kubelet's root directory: its filesystem is nodefs.
    #[arg(long, default_value = "/var/lib/kubelet")]
    pub nodefs: PathBuf,
    /// The runtime's root directory: its filesystem is imagefs.
    #[arg(long, default_value = "/var/lib/containerd")]
    pub imagefs: PathBuf,
    /// Node memory capacity in bytes [default: MemTotal of /proc/meminfo].
    #[arg(long)]
    pub node_memory_capacity: Option<i64>,
    /// Root of the cgroup filesystem.
    #[arg(long, default_value = "/sys/fs/cgroup")]
    pub cgroup_root: PathBuf,
}

impl NodeArgs {
    pub fn capacity(&self) -> anyhow::Result<i64> {
        match self.node_memory_capacity {
            Some(c) => Ok(c),
            None => std::fs::read_to_string("/proc/meminfo")
                .ok()
                .as_deref()
                .and_then(criguard::signals::node::mem_total)
                .context("read MemTotal from /proc/meminfo (or pass --node-memory-capacity)"),
        }
    }

    pub fn usage_sources(&self) -> criguard::signals::usage::UsageSources {
        criguard::signals::usage::UsageSources {
            nodefs: self.nodefs.clone(),
            imagefs: self.imagefs.clone(),
            cgroups: criguard::cgroup::fs::CgroupFs::detect(&self.cgroup_root),
        }
    }

    pub fn sources(&self) -> anyhow::Result<criguard::signals::node::NodeSources> {
        Ok(criguard::signals::node::NodeSources {
            cgroups: criguard::cgroup::fs::CgroupFs::detect(&self.cgroup_root),
            proc_root: PathBuf::from("/proc"),
            memory_capacity: self.capacity()? as u64,
            pods_cgroup: self.kubepods_cgroup.clone(),
            nodefs: self.nodefs.clone(),
            imagefs: self.imagefs.clone(),
        })
    }
}
