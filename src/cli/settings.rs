//! The settings `serve` runs with, validated once from the options
//! ([`super::args`]): [`Settings`], which gathers every validated part and
//! describes it the way `check-config` prints it, and [`Guardian`], the
//! settings a reload takes up.

use std::time::Duration;

use criguard::config;

use super::args::{EvictionArgs, GcArgs, KubeArgs, ServeCmd, hostname};

/// Every validated setting `serve` runs with.
#[derive(Clone, Debug)]
pub struct Settings {
    pub eviction: config::EvictionConfig,
    /// `--dry-run` or the file's `dryRun`.
    pub dry_run: bool,
    pub container_gc: (criguard::gc::container_policy::GcPolicy, Duration),
    pub image_gc: (criguard::config::image_gc::ImageGcPolicy, Duration),
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
    pub psi: Option<criguard::signals::notify::v2::PsiSettings>,
}

impl Guardian {
    /// Loads the guardian's settings from `cmd` (the file is read again).
    pub fn load(cmd: &ServeCmd) -> Result<Self, config::ConfigError> {
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
