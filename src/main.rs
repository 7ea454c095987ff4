//! The `criguard` command.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use criguard::signals::events::{MemoryEvents, v2::PsiSettings};
use criguard::{admin, config, cri, listen, model, runtime};

/// A CRI proxy that guards the node against resource pressure.
#[derive(Parser, Debug)]
#[command(name = "criguard", version, about)]
struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "CRIGUARD_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the CRI proxy: the kubelet's --container-runtime-endpoint points here.
    Serve(Box<ServeCmd>),
    /// Validate the eviction configuration and print it as criguard will use it.
    CheckConfig(Box<CheckConfigCmd>),
    /// Print the eviction signals as criguard reads them now.
    Signals {
        #[command(flatten)]
        node: NodeArgs,
    },
    /// Print the evictions a running criguard made and the kernel OOM kills in pods it saw.
    Evictions {
        /// criguard's admin socket.
        #[arg(long, default_value = DEFAULT_ADMIN)]
        admin_socket: PathBuf,
        /// JSON instead of lines (with --watch: one JSON object per line).
        #[arg(long)]
        json: bool,
        /// Then keep printing each eviction as it is made, until criguard
        /// stops (evictions only, not kernel OOM kills).
        #[arg(long)]
        watch: bool,
    },
    /// Print per-pod disk and process usage as a running criguard reads it now.
    Usage {
        /// criguard's admin socket.
        #[arg(long, default_value = DEFAULT_ADMIN)]
        admin_socket: PathBuf,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print, for each signal, the order in which a running criguard would
    /// evict pods now (a dry run: nothing is stopped).
    Rank {
        /// criguard's admin socket.
        #[arg(long, default_value = DEFAULT_ADMIN)]
        admin_socket: PathBuf,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print the node model of a running criguard.
    Pods {
        /// criguard's admin socket.
        #[arg(long, default_value = DEFAULT_ADMIN)]
        admin_socket: PathBuf,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print criguard's version.
    Version,
}

/// The eviction configuration: a file with the kubelet's keys, and the
/// kubelet's flags, which override it key by key.
#[derive(clap::Args, Debug, Clone)]
struct EvictionArgs {
    /// Configuration file (TOML with KubeletConfiguration's key names).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Hard thresholds, e.g. memory.available<100Mi,nodefs.available<10%
    /// (`none`: no hard threshold at all).
    #[arg(long)]
    eviction_hard: Option<String>,
    /// Soft thresholds, e.g. memory.available<1.5Gi.
    #[arg(long)]
    eviction_soft: Option<String>,
    /// Soft grace periods, e.g. memory.available=1m30s.
    #[arg(long)]
    eviction_soft_grace_period: Option<String>,
    /// Cap in seconds on a pod's grace period under soft eviction.
    #[arg(long, allow_negative_numbers = true)]
    eviction_max_pod_grace_period: Option<i64>,
    /// Minimum reclaim per signal, e.g. memory.available=0Mi,nodefs.available=500Mi.
    #[arg(long)]
    eviction_minimum_reclaim: Option<String>,
    /// How long a pressure condition outlives its thresholds, e.g. 5m.
    #[arg(long)]
    eviction_pressure_transition_period: Option<String>,
    /// Housekeeping interval, e.g. 10s.
    #[arg(long)]
    housekeeping_interval: Option<String>,
}

impl EvictionArgs {
    /// The configuration file's settings (all unset without a file).
    fn file(&self) -> Result<config::file::RawFile, config::ConfigError> {
        match &self.config {
            Some(path) => config::file::load(path),
            None => Ok(config::file::RawFile::default()),
        }
    }

    fn load(
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
struct CheckConfigCmd {
    #[command(flatten)]
    eviction: EvictionArgs,
    #[command(flatten)]
    gc: GcArgs,
    #[command(flatten)]
    kube: KubeArgs,
}

/// The optional Kubernetes API report (file keys `kubeconfig`, `nodeName`,
/// `kubeStatusTimeout`, `nodeTaints`; flags override them).
#[derive(clap::Args, Debug, Clone)]
struct KubeArgs {
    /// Report evictions to the Kubernetes API with this kubeconfig
    /// (`in-cluster`: the pod's service account) [default: no API report].
    #[arg(long)]
    kubeconfig: Option<String>,
    /// This node's name in the API [default: the hostname].
    #[arg(long)]
    node_name: Option<String>,
    /// How long an eviction waits for the pod status write [default: 250ms].
    #[arg(long)]
    kube_status_timeout: Option<String>,
    /// Taint the node NoSchedule (criguard.io/*-pressure) under pressure [default: true].
    #[arg(long, action = clap::ArgAction::Set)]
    node_taints: Option<bool>,
}

impl KubeArgs {
    fn raw(&self) -> config::kube::RawKube {
        config::kube::RawKube {
            kubeconfig: self.kubeconfig.clone(),
            node_name: self.node_name.clone(),
            status_timeout: self.kube_status_timeout.clone(),
            taints: self.node_taints,
        }
    }
}

/// The hostname, the kubelet's default node name.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default()
}

/// `criguard serve`'s options.
#[derive(clap::Args, Debug)]
struct ServeCmd {
    /// Socket to listen on (ignored under systemd socket activation).
    #[arg(long, default_value = "/run/criguard/criguard.sock")]
    listen: PathBuf,
    /// The runtime to forward to.
    #[arg(long, default_value = "unix:///run/containerd/containerd.sock")]
    runtime_endpoint: String,
    /// How long calls in flight may finish after SIGTERM.
    #[arg(long, default_value = "10s", value_parser = parse_seconds)]
    drain: Duration,
    /// criguard's admin socket (`criguard pods` reads it).
    #[arg(long, default_value = DEFAULT_ADMIN)]
    admin_socket: PathBuf,
    /// containerd's snapshotter for CRI containers (its CRI plugin's
    /// `containerd.snapshotter`): where writable layers are looked up.
    #[arg(long, default_value = criguard::runtime::snapshots::DEFAULT_SNAPSHOTTER)]
    snapshotter: String,
    /// How often the node model is re-synced with the runtime (the safety
    /// net behind containerd's task events).
    #[arg(long, default_value = "10s", value_parser = parse_seconds)]
    sync_interval: Duration,
    /// Re-adjust running containers' oom_score_adj so that the kernel's
    /// OOM victim is criguard's first-ranked pod (false: the kubelet's
    /// static scores only).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    dynamic_oom_score_adj: bool,
    /// How often the dynamic oom_score_adj round runs.
    #[arg(long, default_value = "1s", value_parser = parse_seconds)]
    oom_adjust_interval: Duration,
    /// Where Prometheus metrics are served (`none`: not at all).
    #[arg(long, default_value = "127.0.0.1:9809")]
    metrics_address: String,
    #[command(flatten)]
    eviction: EvictionArgs,
    #[command(flatten)]
    node: NodeArgs,
    /// Decide and log evictions, stop nothing.
    #[arg(long)]
    dry_run: bool,
    /// Where criguard keeps what must survive a restart (image last-used times).
    #[arg(long, default_value = "/var/lib/criguard")]
    state_dir: PathBuf,
    #[command(flatten)]
    gc: GcArgs,
    #[command(flatten)]
    events: EventArgs,
    #[command(flatten)]
    kube: KubeArgs,
}

/// The runtime endpoint and the metrics address (`None`: no metrics).
type Endpoints = (runtime::RuntimeEndpoint, Option<std::net::SocketAddr>);

impl ServeCmd {
    /// `--runtime-endpoint` and `--metrics-address`, parsed, or the
    /// configuration error naming the flag.
    fn endpoints(&self) -> Result<Endpoints, config::ConfigError> {
        let endpoint = runtime::RuntimeEndpoint::parse(&self.runtime_endpoint).map_err(|e| {
            config::ConfigError {
                key: "--runtime-endpoint".into(),
                value: self.runtime_endpoint.clone(),
                rule: e.to_string(),
            }
        })?;
        let metrics = match self.metrics_address.as_str() {
            "none" => None,
            addr => Some(addr.parse().map_err(|_| config::ConfigError {
                key: "--metrics-address".into(),
                value: addr.into(),
                rule: "expected IP:port (e.g. 127.0.0.1:9809) or none".into(),
            })?),
        };
        Ok((endpoint, metrics))
    }
}

/// Memory events: eviction rounds between housekeeping ticks.
#[derive(clap::Args, Debug, Clone)]
struct EventArgs {
    /// Start an eviction round as soon as the kernel reports memory
    /// pressure (cgroup v1: memcg usage thresholds at each memory threshold;
    /// v2: PSI triggers and memory.events), not only on the housekeeping
    /// tick (false: the tick alone).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    memory_events: bool,
    /// cgroup v2: memory stall time within --memory-psi-window that fires
    /// the PSI trigger, e.g. 150ms.
    #[arg(long, default_value = "150ms")]
    memory_psi_stall: String,
    /// cgroup v2: the PSI trigger's window, 500ms to 10s (without
    /// CAP_SYS_RESOURCE the kernel wants a multiple of 2s).
    #[arg(long, default_value = "2s")]
    memory_psi_window: String,
}

impl EventArgs {
    /// The PSI settings when events are on, or the configuration error naming the flag.
    fn load(&self) -> Result<Option<PsiSettings>, config::ConfigError> {
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
struct GcArgs {
    /// Minimum age of a dead container before it is collected, e.g. 0s, 1m.
    #[arg(long, default_value = "0s")]
    minimum_container_ttl_duration: String,
    /// Dead instances kept per (pod, container name); negative: no limit.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    maximum_dead_containers_per_container: i32,
    /// Dead containers kept on the node; negative: no limit.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    maximum_dead_containers: i32,
    /// How often container GC runs (the kubelet's period is 1m).
    #[arg(long, default_value = "1m")]
    container_gc_interval: String,
    /// imagefs usage (%) at which image GC starts [default: 85].
    #[arg(long, allow_negative_numbers = true)]
    image_gc_high_threshold: Option<i64>,
    /// imagefs usage (%) image GC brings it down to [default: 80].
    #[arg(long, allow_negative_numbers = true)]
    image_gc_low_threshold: Option<i64>,
    /// Minimum age of an unused image before it is collected [default: 2m].
    #[arg(long)]
    minimum_image_ttl_duration: Option<String>,
    /// Unused images not used for this long are collected (0: off) [default: 0].
    #[arg(long)]
    image_maximum_gc_age: Option<String>,
    /// How often image GC runs (the kubelet's period is 5m).
    #[arg(long, default_value = "5m")]
    image_gc_interval: String,
}

fn positive(key: &str, v: &str) -> Result<Duration, config::ConfigError> {
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
struct Settings {
    eviction: config::EvictionConfig,
    /// `--dry-run` or the file's `dryRun`.
    dry_run: bool,
    container_gc: (criguard::policy::gc::GcPolicy, Duration),
    image_gc: (criguard::policy::image_gc::ImageGcPolicy, Duration),
    /// The Kubernetes API report, when one is configured.
    kube: Option<criguard::kube::KubeSettings>,
}

impl Settings {
    /// File and flags, validated; the first error names its key and value.
    fn load(
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
    fn describe(&self) -> String {
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

impl GcArgs {
    /// Image GC policy (file overridden by flags) and period.
    fn load_images(
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
    fn load(&self) -> Result<(criguard::policy::gc::GcPolicy, Duration), config::ConfigError> {
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
struct NodeArgs {
    /// The pods' cgroup (node allocatable), as the kubelet names it: a path
    /// or a systemd slice (`kubepods.slice`); the default is found under
    /// either driver (`/kubepods` or `/kubepods.slice`).
    #[arg(long, default_value = "/kubepods")]
    kubepods_cgroup: String,
    /// The kubelet's root directory: its filesystem is nodefs.
    #[arg(long, default_value = "/var/lib/kubelet")]
    nodefs: PathBuf,
    /// The runtime's root directory: its filesystem is imagefs.
    #[arg(long, default_value = "/var/lib/containerd")]
    imagefs: PathBuf,
    /// Node memory capacity in bytes [default: MemTotal of /proc/meminfo].
    #[arg(long)]
    node_memory_capacity: Option<i64>,
    /// Root of the cgroup filesystem.
    #[arg(long, default_value = "/sys/fs/cgroup")]
    cgroup_root: PathBuf,
}

impl NodeArgs {
    fn capacity(&self) -> anyhow::Result<i64> {
        match self.node_memory_capacity {
            Some(c) => Ok(c),
            None => std::fs::read_to_string("/proc/meminfo")
                .ok()
                .as_deref()
                .and_then(model::sync::mem_total)
                .context("read MemTotal from /proc/meminfo (or pass --node-memory-capacity)"),
        }
    }

    fn usage_sources(&self) -> criguard::signals::usage::UsageSources {
        criguard::signals::usage::UsageSources {
            nodefs: self.nodefs.clone(),
            imagefs: self.imagefs.clone(),
            cgroups: criguard::signals::memory::CgroupFs::detect(&self.cgroup_root),
        }
    }

    fn sources(&self) -> anyhow::Result<criguard::signals::node::NodeSources> {
        Ok(criguard::signals::node::NodeSources {
            cgroups: criguard::signals::memory::CgroupFs::detect(&self.cgroup_root),
            proc_root: PathBuf::from("/proc"),
            memory_capacity: self.capacity()? as u64,
            pods_cgroup: self.kubepods_cgroup.clone(),
            nodefs: self.nodefs.clone(),
            imagefs: self.imagefs.clone(),
        })
    }
}

/// The signals `criguard rank` orders pods for: one memory signal, pid,
/// and each disk signal that has a threshold.
fn rank_signals(c: &config::EvictionConfig) -> Vec<criguard::config::Signal> {
    use criguard::config::Signal;
    let mut with: Vec<Signal> = c.hard.iter().chain(&c.soft).map(|t| t.signal).collect();
    with.sort();
    with.dedup();
    let mut out = vec![Signal::MemoryAvailable, Signal::PidAvailable];
    out.extend(
        with.into_iter()
            .filter(|s| s.ranking() == criguard::signal::Ranking::Disk),
    );
    out
}

/// Exit code for a configuration error: systemd's RestartPreventExitStatus=2.
const EXIT_CONFIG: u8 = 2;

const DEFAULT_ADMIN: &str = "/run/criguard/admin.sock";

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let n = s.strip_suffix('s').unwrap_or(s);
    n.parse::<u64>()
        .map(Duration::from_secs)
        .map_err(|_| format!("{s:?} is not a whole number of seconds like 10s"))
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CRIGUARD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: draining"),
        _ = int.recv() => tracing::info!("SIGINT: draining"),
    }
}

/// Runs the proxy and its loops; `eviction`, `gc` and `psi` (memory events
/// on) are the validated forms of `cmd`'s settings.
async fn serve(
    activated: Option<std::os::unix::net::UnixListener>,
    (endpoint, metrics_address): Endpoints,
    cmd: ServeCmd,
    settings: Settings,
    psi: Option<PsiSettings>,
) -> anyhow::Result<()> {
    let Settings {
        eviction,
        container_gc: gc,
        image_gc,
        dry_run,
        kube,
    } = settings;
    let ServeCmd {
        listen: listen_path,
        drain,
        admin_socket,
        snapshotter,
        sync_interval,
        dynamic_oom_score_adj,
        oom_adjust_interval,
        node: node_args,
        state_dir,
        ..
    } = cmd;
    let sources = node_args.sources()?;
    let metrics_listener = match metrics_address {
        None => None,
        Some(sock) => {
            // First of the sockets, so that a refusal leaves none behind.
            let l = tokio::net::TcpListener::bind(sock).await.map_err(|e| {
                if e.kind() == std::io::ErrorKind::AddrNotAvailable {
                    // Not an address of this machine: configuration.
                    anyhow::Error::from(config::ConfigError {
                        key: "--metrics-address".into(),
                        value: sock.to_string(),
                        rule: format!("cannot bind: {e}"),
                    })
                } else {
                    anyhow::anyhow!("--metrics-address {sock}: bind: {e}")
                }
            })?;
            tracing::info!(address = %l.local_addr()?, "serving metrics");
            Some(l)
        }
    };
    let (listener, owned_path) = match activated {
        Some(l) => {
            tracing::info!("listening on the socket passed by systemd");
            let l = tokio::net::UnixListener::from_std(l)
                .context("socket activation: register fd 3")?;
            (l, None)
        }
        None => {
            let l = listen::bind(&listen_path)?;
            tracing::info!(path = %listen_path.display(), "listening");
            (l, Some(listen_path))
        }
    };
    let admin_listener = listen::bind(&admin_socket)?;
    let metrics = criguard::metrics::Metrics::new();
    let upstream = runtime::Upstream::new(endpoint);
    let capacity = sources.memory_capacity as i64;
    // The model is rebuilt from the runtime before the first call is served.
    // A runtime that is down must not keep the kubelet out: criguard then
    // serves anyway and the sync loop fills the model once the runtime is up.
    let node = match model::sync::rebuild(&upstream, capacity).await {
        Ok(m) => {
            let (s, c) = m.ids();
            tracing::info!(
                sandboxes = s.len(),
                containers = c.len(),
                "node model rebuilt from the runtime"
            );
            m
        }
        Err(err) => {
            tracing::warn!(%err, "node model not rebuilt yet; serving, the sync loop retries");
            model::NodeModel::new(capacity)
        }
    };
    let node = Arc::new(RwLock::new(node));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let evicted_store = criguard::reclaim::evicted::EvictedStore::new(&state_dir);
    let status = Arc::new(RwLock::new(evicted_store.initial_status()));
    let report = match &kube {
        Some(k) => Some(
            criguard::kube::KubeReport::start(k, metrics.kube.clone())
                .await
                .context("Kubernetes API report")?,
        ),
        None => None,
    };
    let usage = criguard::signals::usage::UsageReader::new(
        upstream.snapshots(&snapshotter),
        node_args.usage_sources(),
    )
    .with_content(upstream.content());
    let image_uses = criguard::reclaim::image_gc::ImageUses::default();
    let images = criguard::reclaim::image_gc::ImageGc::new(
        upstream.clone(),
        image_gc.0,
        node_args.imagefs.clone(),
        Some(state_dir.join("image-gc.json")),
        image_uses.clone(),
        metrics.reclaim.clone(),
    );
    let collector = criguard::reclaim::container_gc::ContainerGc::new(upstream.clone(), gc.0)
        .with_reclaim(
            vec![node_args.imagefs.clone(), node_args.nodefs.clone()],
            metrics.reclaim.clone(),
        );
    let ranks = Arc::new(std::sync::Mutex::new(
        criguard::policy::oom_kill::RankHistory::default(),
    ));
    let oom_kills = criguard::reclaim::oom_kills::OomKills::default();
    let admin_state = admin::AdminState {
        model: node.clone(),
        upstream: upstream.clone(),
        status: status.clone(),
        usage: usage.clone(),
        ranker: criguard::reclaim::rank::Ranker::new(
            node.clone(),
            sources.clone(),
            Some(usage.clone()),
        ),
        rank_signals: rank_signals(&eviction),
        oom_kills: oom_kills.clone(),
    };
    let events = psi.map(|psi| MemoryEvents::new(sources.clone(), &eviction, psi));
    let manager = criguard::reclaim::evict::EvictionManager::new(
        eviction,
        sources,
        node.clone(),
        upstream.clone(),
        status.clone(),
        dry_run,
    )
    .with_metrics(metrics.eviction.clone())
    .with_node_reclaim(collector.clone(), images.clone())
    .with_usage(usage)
    .with_evicted_store(evicted_store);
    let manager = match report {
        Some(r) => manager.with_report(r),
        None => manager,
    };
    let evict_task = tokio::spawn(manager.run(events, stopped()));
    let admin_task = tokio::spawn(admin::serve(admin_listener, admin_state, stopped()));
    let metrics_task = tokio::spawn({
        let (metrics, stopped) = (metrics.clone(), stopped());
        async move {
            if let Some(l) = metrics_listener {
                criguard::metrics::serve(l, metrics, stopped).await;
            }
        }
    });
    // The adjuster ranks every round (the kernel OOM kills are matched
    // against it); it writes scores only with --dynamic-oom-score-adj.
    let adjuster = {
        let a = criguard::reclaim::oom_adjust::OomAdjuster::new(
            node.clone(),
            node_args.cgroup_root.clone(),
            PathBuf::from("/proc"),
        )
        .with_metrics(metrics.oom.clone())
        .with_rank_history(ranks.clone());
        let a = if dynamic_oom_score_adj {
            a
        } else {
            a.rank_only()
        };
        Arc::new(std::sync::Mutex::new(a))
    };
    let task_events = model::events::TaskEvents::new(node.clone(), upstream.clone())
        .with_oom_kills(
            criguard::reclaim::oom_kills::OomKillWatcher::new(
                &node_args.cgroup_root,
                ranks,
                oom_kills,
            )
            .with_metrics(metrics.events.oom_kills.clone()),
        )
        .with_metrics(metrics.events.clone());
    let events_task = tokio::spawn(task_events.run(stopped()));
    let oom_stopped = stopped();
    let oom_task = tokio::spawn(async move {
        periodic(oom_adjust_interval, oom_stopped, move || {
            let a = adjuster.clone();
            // cgroupfs and procfs reads block briefly: off the proxy's thread.
            let round = move || a.lock().unwrap_or_else(|e| e.into_inner()).round();
            async move {
                let _ = tokio::task::spawn_blocking(round).await;
            }
        })
        .await;
    });
    let image_gc_task = tokio::spawn(periodic(image_gc.1, stopped(), move || {
        let images = images.clone();
        async move {
            images.round().await;
        }
    }));
    let gc_task = tokio::spawn(periodic(gc.1, stopped(), move || {
        let c = collector.clone();
        async move {
            c.round().await;
        }
    }));
    let sync_task = tokio::spawn(periodic(sync_interval, stopped(), {
        let (node, upstream) = (node.clone(), upstream.clone());
        move || {
            let (node, upstream) = (node.clone(), upstream.clone());
            async move {
                if let Err(err) = model::sync::sync(&node, &upstream).await {
                    tracing::warn!(%err, "node model sync failed");
                }
            }
        }
    }));

    tracing::info!(runtime = %upstream.endpoint(), "forwarding CRI calls");
    let proxy = cri::Proxy::new(&upstream)
        .with_observer(
            cri::observe::Observer::new(node)
                .with_admission(status, metrics.eviction.admission_refusals.clone())
                .with_image_uses(image_uses),
        )
        .with_metrics(metrics.cri.clone());
    let proxy = cri::server::ProxyThread::spawn(listener.into_std()?, proxy, drain)
        .context("start the proxy thread")?;
    shutdown_signal().await;
    proxy.stop().await;
    let _ = stop_tx.send(true);
    let _ = tokio::join!(
        admin_task,
        sync_task,
        events_task,
        oom_task,
        metrics_task,
        evict_task,
        gc_task,
        image_gc_task
    );
    for path in owned_path.iter().chain([&admin_socket]) {
        std::fs::remove_file(path).with_context(|| format!("remove socket {}", path.display()))?;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Runs `round` every `every` until `stopped` resolves; a round in progress
/// finishes first, and a slow round delays the next instead of piling up.
async fn periodic<F, Fut>(
    every: Duration,
    stopped: impl std::future::Future<Output = ()>,
    mut round: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    tokio::pin!(stopped);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => round().await,
            () = &mut stopped => return,
        }
    }
}

/// Runs a client command to completion; errors go to stderr.
fn run_client(f: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("criguard: start tokio runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(f) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("criguard: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn evictions(admin_socket: PathBuf, json: bool, watch: bool) -> anyhow::Result<()> {
    use futures::StreamExt;
    if !watch {
        let report = admin::get_evictions_report(&admin_socket).await?;
        if json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", admin::evictions_text(&report));
        }
        return Ok(());
    }
    let mut stream = std::pin::pin!(admin::watch_evictions(&admin_socket, true).await?);
    while let Some(e) = stream.next().await {
        let e = e?;
        if json {
            println!("{}", serde_json::to_string(&e)?);
        } else {
            println!("{}", admin::eviction_line(&e));
        }
    }
    Ok(())
}

async fn rank(admin_socket: PathBuf, json: bool) -> anyhow::Result<()> {
    let r = admin::get_rank(&admin_socket).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", admin::rank_table(&r));
    }
    Ok(())
}

async fn usage(admin_socket: PathBuf, json: bool) -> anyhow::Result<()> {
    let u = admin::get_usage(&admin_socket).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&u)?);
    } else {
        print!("{}", admin::usage_table(&u));
    }
    Ok(())
}

async fn pods(admin_socket: PathBuf, json: bool) -> anyhow::Result<()> {
    let pods = admin::get_pods(&admin_socket).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&pods)?);
    } else {
        print!("{}", admin::pods_table(&pods));
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Command::Version => {
            println!("criguard {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::CheckConfig(c) => match Settings::load(&c.eviction, &c.gc, &c.kube) {
            Ok(c) => {
                print!("{}", c.describe());
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("criguard: invalid configuration: {err}");
                ExitCode::from(EXIT_CONFIG)
            }
        },
        Command::Signals { node } => match node.sources() {
            Ok(src) => {
                let obs = src.observe();
                let ms = criguard::signals::unix_ms(obs.at);
                println!("read at {}.{:03} (Unix time, s)", ms / 1000, ms % 1000);
                println!("{:<28} {:>16} {:>16}", "SIGNAL", "AVAILABLE", "CAPACITY");
                for (sig, o) in obs.signals {
                    let show = |v: i64| {
                        if sig.is_bytes() && v >= 0 {
                            criguard::quantity::format_bytes(v as u64)
                        } else {
                            v.to_string()
                        }
                    };
                    println!(
                        "{:<28} {:>16} {:>16}",
                        sig.name(),
                        show(o.available),
                        show(o.capacity as i64)
                    );
                }
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("criguard: {err:#}");
                ExitCode::FAILURE
            }
        },
        Command::Evictions {
            admin_socket,
            json,
            watch,
        } => run_client(evictions(admin_socket, json, watch)),
        Command::Pods { admin_socket, json } => run_client(pods(admin_socket, json)),
        Command::Rank { admin_socket, json } => run_client(rank(admin_socket, json)),
        Command::Usage { admin_socket, json } => run_client(usage(admin_socket, json)),
        Command::Serve(cmd) => {
            // Refused before anything starts, with the exit code systemd
            // does not restart on.
            let loaded = Settings::load(&cmd.eviction, &cmd.gc, &cmd.kube)
                .and_then(|s| Ok((s, cmd.events.load()?)));
            let (mut settings, psi) = match loaded {
                Ok(c) => c,
                Err(err) => {
                    eprintln!("criguard: invalid configuration: {err}");
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            settings.dry_run |= cmd.dry_run;
            tracing::info!(config = %settings.describe().replace('\n', "; "), memory_events = psi.is_some(), "configuration");
            // The socket unit and the endpoints are configuration too.
            let checked = listen::from_systemd()
                .map_err(anyhow::Error::from)
                .and_then(|a| Ok((a, cmd.endpoints()?)));
            let (activated, endpoints) = match checked {
                Ok(c) => c,
                Err(err) => {
                    eprintln!("criguard: invalid configuration: {err}");
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            match criguard::limits::raise_nofile() {
                Ok(n) => tracing::info!(before = n.before, now = n.after, "open-file limit"),
                Err(err) => tracing::warn!(%err, "cannot raise the open-file limit"),
            }
            let run = || -> anyhow::Result<()> {
                // criguard's own loops (eviction, GC, sync, admin) share one
                // thread; the proxy relays on a thread of its own
                // (cri::server::ProxyThread), so they can never delay a call.
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .context("start tokio runtime")?;
                rt.block_on(serve(activated, endpoints, *cmd, settings, psi))
            };
            match run() {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    tracing::error!("{err:#}");
                    eprintln!("criguard: {err:#}");
                    // A configuration error found while starting (an
                    // address that is not this machine's) is still one.
                    if err.downcast_ref::<config::ConfigError>().is_some() {
                        ExitCode::from(EXIT_CONFIG)
                    } else {
                        ExitCode::FAILURE
                    }
                }
            }
        }
    }
}
