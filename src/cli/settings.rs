//! The settings `serve` runs with, validated once: garbage collection
//! options, where the node's signals are read, and [`Settings`], which
//! gathers every validated part and describes it the way `check-config`
//! prints it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use criguard::{config, model};

use super::args::{EvictionArgs, KubeArgs, hostname};

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

/// Every validated setting `serve` runs with.
#[derive(Clone, Debug)]
pub struct Settings {
    pub eviction: config::EvictionConfig,
    /// `--dry-run` or the file's `dryRun`.
    pub dry_run: bool,
    pub container_gc: (criguard::policy::gc::GcPolicy, Duration),
    pub image_gc: (criguard::policy::image_gc::ImageGcPolicy, Duration),
    /// The Kubernetes API report, when one is configured.
    pub kube: Option<criguard::kube::KubeSettings>,
}

impl Settings {
    /// File and flags, validated; the first error names its key and value.
    pub fn load(
        eviction: &EvictionArgs,
        gc: &GcArgs,
        kube: &KubeArgs,
    ) -> Result<Self, config::ConfigError> {
        let file = eviction.file()?;
        let kube = file.kube.clone().merge(kube.raw()).validate(&hostname())?;
        if let Some(k) = &kube {
            criguard::kube::check(k)?;
        }
        Ok(Self {
            dry_run: file.dry_run.unwrap_or(false),
            eviction: eviction.load(file.eviction)?,
            container_gc: gc.load()?,
            image_gc: gc.load_images(file.image_gc)?,
            kube,
        })
    }

    /// The effective settings, one per line, in the kubelet's names.
    pub fn describe(&self) -> String {
        let (c, period) = &self.container_gc;
        let kube = match &self.kube {
            None => "kubeconfig: none (no API report)\n".to_owned(),
            Some(k) => format!(
                "kubeconfig: {}\nnodeName: {}\nkubeStatusTimeout: {}ms\nnodeTaints: {}\n",
                match &k.source {
                    criguard::kube::ApiSource::Kubeconfig(p) => p.display().to_string(),
                    criguard::kube::ApiSource::InCluster => "in-cluster".into(),
                },
                k.node_name,
                k.status_timeout.as_millis(),
                k.taints
            ),
        };
        format!(
            "dryRun: {}\n{}{}imageGCPeriod: {}\nminimumContainerTTLDuration: {}\nmaximumDeadContainersPerContainer: {}\nmaximumDeadContainers: {}\ncontainerGCPeriod: {}\n{kube}",
            self.dry_run,
            self.eviction.describe(),
            config::image_gc::describe(&self.image_gc.0),
            criguard::quantity::format_duration(self.image_gc.1),
            criguard::quantity::format_duration(c.min_age),
            c.max_per_pod_container,
            c.max_containers,
            criguard::quantity::format_duration(*period),
        )
    }
}

/// The guardian's settings as `serve` runs them: what the configuration
/// file and the flags say (`--dry-run` included), and the memory-event
/// settings. Loaded at start and again at each reload; a [`config::ConfigError`]
/// makes `serve` fail open (at start) or refuse the reload.
#[derive(Clone, Debug)]
pub struct Guardian {
    /// File and flags, validated.
    pub settings: Settings,
    /// Memory events' PSI trigger (`None`: `--memory-events=false`).
    pub psi: Option<criguard::signals::events::v2::PsiSettings>,
}

impl Guardian {
    /// Loads the guardian's settings from `cmd` (the file is read again).
    pub fn load(cmd: &super::args::ServeCmd) -> Result<Self, config::ConfigError> {
        let mut settings = Settings::load(&cmd.eviction, &cmd.gc, &cmd.kube)?;
        settings.dry_run |= cmd.dry_run;
        let psi = cmd.events.load()?;
        Ok(Self { settings, psi })
    }

    /// The settings, one per line, as `check-config` prints them, and
    /// whether memory events are on.
    pub fn describe(&self) -> String {
        format!(
            "{}memoryEvents: {}\n",
            self.settings.describe(),
            self.psi.is_some()
        )
    }
}

impl GcArgs {
    /// Image GC policy (file overridden by flags) and period.
    pub fn load_images(
        &self,
        file: config::image_gc::RawImageGc,
    ) -> Result<(criguard::policy::image_gc::ImageGcPolicy, Duration), config::ConfigError> {
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
    pub fn load(&self) -> Result<(criguard::policy::gc::GcPolicy, Duration), config::ConfigError> {
        let period = positive("--container-gc-interval", &self.container_gc_interval)?;
        let policy = criguard::policy::gc::GcPolicy {
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
                .and_then(model::sync::mem_total)
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
