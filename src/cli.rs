//! The command line: subcommands and their flags, parsed by clap, and the
//! usage error (exit code 2) a bad flag becomes.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Result;
use clap::{Parser, Subcommand};
use wallscope::{
    api, budget,
    export::{
        otlp::Otlp,
        push::{self, squat, PushOptions, SeriesLabels, Sink},
    },
    jvm::{agent::JvmMode, JvmFrames},
    token,
};

#[derive(Parser)]
#[command(
    version,
    about = "Where does each thread's wall-clock time go? An eBPF profiler daemon."
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(clap::Args, Clone)]
pub(crate) struct Sampling {
    /// On-CPU samples per second per CPU.
    #[arg(long, default_value_t = 99, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub(crate) frequency: u64,
    /// Also sample the idle task (pid 0).
    #[arg(long)]
    pub(crate) include_idle: bool,
    /// Off-CPU intervals shorter than this many microseconds get no stack in
    /// off-CPU flame graphs (fewer map rows); per-thread totals
    /// (`/threads`) still count every nanosecond.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=60_000_000))]
    pub(crate) offcpu_min_us: u64,
    /// Off-CPU and waker stacks are sampled by interval length: an interval
    /// of d microseconds gets a stack with probability min(1, d / this)
    /// and counts d / p in flame graphs (an unbiased estimate), so the
    /// stack-walk rate stays bounded whatever the switch rate; longer
    /// intervals always get one. 0: a stack for every interval. Per-thread
    /// totals are exact either way.
    #[arg(long, default_value_t = 50_000, value_parser = clap::value_parser!(u64).range(0..=4_000_000))]
    pub(crate) offcpu_sample_us: u64,
    /// Where off-CPU stacks are walked: `switch-in` (in the task, right
    /// after it gets the CPU back, only for the intervals drawn; needs the
    /// kernel's `sched_exit_tp` tracepoint, else falls back) or
    /// `switch-out` (at every switch-out, the costlier way older kernels
    /// need; for comparison).
    #[arg(long, value_enum, default_value_t = OffcpuStacks::SwitchIn)]
    pub(crate) offcpu_stacks: OffcpuStacks,
    /// `on`: note every run of every CPU, so that each runqueue wait is
    /// split among the processes that ran meanwhile (`/runqueue?pid=`
    /// `kept_off_cpu_by`); `off`: not (for comparison of its cost).
    #[arg(long, value_enum, default_value_t = Toggle::On)]
    pub(crate) culprits: Toggle,
    /// `auto`: have HotSpot JVMs (JDK 17+) write their perf map and report
    /// thread names, through the attach mechanism (as `jcmd` does); `off`:
    /// never signal or connect to a JVM, nor read or write its memory
    /// (Java frames come from the perf maps JVMs write themselves).
    #[arg(long, value_enum, default_value_t = JvmMode::Auto)]
    pub(crate) jvm: JvmMode,
    /// `full`: name Java frames from the JVM's own structures (methods
    /// inlined into compiled code `_[i]`, interpreted methods `_[0]`, C1
    /// `_[1]`, C2 `_[j]`), read from its memory; nothing is loaded into
    /// the JVM. `perf-map`: one frame per compiled method from its perf
    /// map, interpreted code as `Interpreter`.
    #[arg(long, value_enum, default_value_t = JvmFrames::Full)]
    pub(crate) jvm_frames: JvmFrames,
    /// `on`: read CPython 3.10-3.13 interpreters' frames and thread names
    /// from their memory (nothing is loaded into them; needs `--unwind
    /// tables`); `off`: Python processes show the interpreter's native
    /// frames only.
    #[arg(long, value_enum, default_value_t = Toggle::On)]
    pub(crate) python: Toggle,
    /// User stack walking: `tables` walks code without frame pointers (glibc,
    /// release builds) with unwind tables built from `.eh_frame`, and the
    /// frame-pointer chain elsewhere; `fp` uses frame pointers only.
    #[arg(long, value_enum, default_value_t = Unwind::Tables)]
    pub(crate) unwind: Unwind,
    /// Memory for unwind tables in MiB (12 bytes a row; glibc needs about
    /// 0.4 MiB), shared fairly among users. Default: 1 MiB per GiB of
    /// RAM, from 16 to 32.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub(crate) unwind_table_mb: Option<u64>,
}

/// Who may use the HTTP API.
#[derive(clap::Args, Clone)]
pub(crate) struct Security {
    /// File holding a bearer token (whitespace trimmed): every endpoint but
    /// /healthz then requires `Authorization: Bearer <token>`. The file must
    /// be a regular file (not a symlink) that other users cannot read or
    /// write.
    #[arg(long, value_name = "FILE")]
    pub(crate) token_file: Option<PathBuf>,
    /// Accept this name in the Host header too (repeatable). Without it only
    /// IP addresses, localhost and this machine's host name are served,
    /// which stops DNS rebinding.
    #[arg(long = "allow-host", value_name = "NAME", value_parser = api::access::parse_allowed_host)]
    pub(crate) allow_host: Vec<String>,
    /// Allow --listen on a non-loopback address without --token-file, for
    /// when something else (a firewall, an authenticating proxy) guards it.
    #[arg(long)]
    pub(crate) insecure_listen: bool,
    /// Without --token-file, what a client on this host may read: `on`
    /// (the default) looks up the user owning the client's socket; root
    /// reads every process, another user only their own processes (host-wide
    /// answers and /metrics are refused). `off` lets every local user read
    /// every process.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = ["on", "off"])]
    pub(crate) local_auth: String,
}

/// Pushing profiles to Grafana Pyroscope and to OTLP receivers: the
/// interval, the processes and the grace apply to both.
#[derive(clap::Args, Clone)]
#[command(group(clap::ArgGroup::new("sink").args(["push_url", "otlp_url"]).multiple(true)))]
pub(crate) struct Push {
    /// Push profiles to the Pyroscope server at this URL (http or https)
    /// every --push-interval: `process_cpu` and `wallscope_offcpu` for the
    /// busiest processes. `https://USER@host` sends basic auth, with
    /// --push-token-file as the password.
    #[arg(long, value_name = "URL", value_parser = push::parse_url)]
    pub(crate) push_url: Option<url::Url>,
    /// Send the same profiles as OpenTelemetry profiles (OTLP/HTTP,
    /// protobuf, `v1development` of opentelemetry-proto 1.11) to the
    /// receiver at this URL (its base: they go to `URL/v1development/profiles`),
    /// every --push-interval; with or without --push-url.
    #[arg(long, value_name = "URL", value_parser = push::parse_url)]
    pub(crate) otlp_url: Option<url::Url>,
    /// Time between pushes (1s to 10m); each push holds the time since the
    /// previous one.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = push::parse_interval, requires = "sink")]
    pub(crate) push_interval: Duration,
    /// A label for every pushed series (repeatable); `service_name=NAME`
    /// replaces the process's, `hostname=` (empty) drops that label.
    /// Pyroscope only.
    #[arg(long = "push-label", value_name = "NAME=VALUE", value_parser = push::labels::parse_label, requires = "push_url")]
    pub(crate) push_label: Vec<(String, String)>,
    /// File holding the token sent to Pyroscope as `Authorization: Bearer
    /// TOKEN` (the password with a user in the URL); checked as
    /// --token-file is.
    #[arg(long, value_name = "FILE", requires = "push_url")]
    pub(crate) push_token_file: Option<PathBuf>,
    /// File holding the token sent to the OTLP receiver, as
    /// --push-token-file is to Pyroscope.
    #[arg(long, value_name = "FILE", requires = "otlp_url")]
    pub(crate) otlp_token_file: Option<PathBuf>,
    /// Processes pushed per interval: busiest (time on or waiting for a CPU,
    /// then wall time) first, each user a fair share.
    #[arg(long, value_name = "N", default_value_t = push::DEFAULT_TOP as u16, value_parser = clap::value_parser!(u16).range(1..=256), requires = "sink")]
    pub(crate) push_top: u16,
    /// On shutdown, how long to go on sending the last interval and what
    /// is queued (0s to 60s); a hung server cannot hold the exit longer.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = push::parse_grace, requires = "sink")]
    pub(crate) push_grace: Duration,
}

/// A token file given with `flag`, checked as --token-file is: a refused
/// one is a usage error.
pub(crate) fn push_token(flag: &str, path: Option<&PathBuf>) -> Result<Option<token::Token>> {
    path.map(|path| {
        token::Token::from_file(path)
            .map_err(|e| Usage(format!("{flag} {}: {e}", path.display())).into())
    })
    .transpose()
}

impl Push {
    /// The pusher's options, checked before anything is loaded: a bad
    /// label or token file is a usage error.
    pub(crate) fn options(&self) -> Result<Option<PushOptions>> {
        let mut sinks = Vec::new();
        if let Some(url) = &self.push_url {
            squat::warn_if_squattable("--push-url", url);
            let token = push_token("--push-token-file", self.push_token_file.as_ref())?;
            let labels = SeriesLabels::for_this_host(self.push_label.clone())
                .map_err(|e| Usage(format!("--push-label: {e}")))?;
            sinks.push(Sink::pyroscope(url.clone(), labels, token));
        }
        if let Some(url) = &self.otlp_url {
            squat::warn_if_squattable("--otlp-url", url);
            let token = push_token("--otlp-token-file", self.otlp_token_file.as_ref())?;
            sinks.push(Otlp::sink(url.clone(), token));
        }
        if sinks.is_empty() {
            return Ok(None);
        }
        Ok(Some(PushOptions {
            interval: self.push_interval,
            top: usize::from(self.push_top),
            grace: self.push_grace,
            sinks,
        }))
    }
}

/// Where off-CPU stacks are walked (`--offcpu-stacks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum OffcpuStacks {
    SwitchIn,
    SwitchOut,
}

/// A feature on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Toggle {
    On,
    Off,
}

/// How user stacks are walked (`--unwind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Unwind {
    Tables,
    Fp,
}

// Parsed once at start: the size of a variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub(crate) enum Command {
    /// Run the profiler daemon and serve its HTTP API.
    Serve {
        /// Address to listen on. A non-loopback address needs --token-file
        /// (or --insecure-listen).
        #[arg(long, default_value = "127.0.0.1:7070")]
        listen: SocketAddr,
        #[command(flatten)]
        security: Security,
        /// Minutes of history kept in memory.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1440))]
        retention: u64,
        /// The daemon's memory budget in MiB: every holder's bound (history,
        /// frame names, ELF symbols, unwind tables, JVM code, process
        /// table, query answers, push outbox, drained batches) is a fixed
        /// share of it (see docs/resource-bounds.md; /healthz
        /// `memory.budget`). The default fits the unit's MemoryMax=512M
        /// with a margin for the kernel's share (BPF maps).
        #[arg(long, default_value_t = budget::DEFAULT_MB, value_parser = clap::value_parser!(u64).range(budget::MIN_MB..=65_536))]
        memory_mb: u64,
        /// Bound, in MiB, of the history's estimated size, instead of its
        /// share of --memory-mb (the other holders share the rest; refused
        /// if it leaves them less than half their share): past it the
        /// oldest seconds are dropped (counted in /healthz and /metrics),
        /// so less than --retention may be kept on a busy host.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=65_536))]
        max_memory_mb: Option<u64>,
        /// CPU ms per second for work done on processes' behalf (perf maps,
        /// JVM and CPython memory, JVM attach), all users but root sharing
        /// it and root as much again (docs/cpu-budget.md; /healthz `user_cpu`).
        #[arg(long, default_value_t = budget::cpu::DEFAULT_MS_PER_S, value_parser = clap::value_parser!(u64).range(1..=1000))]
        user_cpu_ms: u64,
        /// A directory (root's, not a link) to keep history on disk in:
        /// every second is written there in the background, windows
        /// reaching past what memory holds read it, across restarts.
        /// Without it, history is kept in memory only.
        #[arg(long)]
        history_dir: Option<PathBuf>,
        /// Bound, in MiB, of the disk history: the oldest seconds are
        /// deleted to stay within it.
        #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
        history_disk_mb: u64,
        /// The kubelet's pod log directory, where pod and container names
        /// are read (`NAMESPACE_POD_UID/CONTAINER/`).
        #[arg(long, default_value = "/var/log/pods")]
        pod_logs_dir: PathBuf,
        #[command(flatten)]
        sampling: Sampling,
        #[command(flatten)]
        push: Push,
    },
    /// Profile one process for a while and write a flame graph or folded stacks.
    Record {
        /// Process to profile.
        #[arg(long)]
        pid: u32,
        /// How long to record, e.g. `10s`, `1m` (stops early if the process exits).
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        duration: Duration,
        /// Output file; `.svg` writes a flame graph, `.folded` (or `.txt`) folded
        /// stacks, `.pb.gz` a pprof profile (samples labelled by thread).
        #[arg(short, long)]
        output: PathBuf,
        #[command(flatten)]
        sampling: Sampling,
    },
    /// Ask a running daemon why a process is slow: its findings, ranked,
    /// each with the call that shows its evidence (`/explain`). Without
    /// --pid, the processes that lost the most time waiting.
    Explain {
        /// The daemon's address.
        #[arg(long, default_value = "http://127.0.0.1:7070")]
        url: String,
        #[command(flatten)]
        asked: api::client::Question,
    },
}

/// A mistake in how the command was called: exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Usage(pub(crate) String);
