//! The `wallscope` command: `serve` runs the daemon, `record` profiles one
//! process once and writes a file, `explain` asks a running daemon why a
//! process is slow.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use wallscope::{
    api,
    bpf::ProbeOptions,
    budget::{self, Override, Part, Split},
    export::{
        otlp::Otlp,
        push::{self, squat, PushOptions, Pusher, SeriesLabels, Sink},
        record::{self, RecordFormat},
    },
    jvm::{agent::JvmMode, JvmFrames},
    pipeline::{Pipeline, PipelineOptions},
    priority::raise,
    process::live,
    profile::history::HistoryConfig,
    token,
};

#[derive(Parser)]
#[command(
    version,
    about = "Where does each thread's wall-clock time go? An eBPF profiler daemon."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct Sampling {
    /// On-CPU samples per second per CPU.
    #[arg(long, default_value_t = 99, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    frequency: u64,
    /// Also sample the idle task (pid 0).
    #[arg(long)]
    include_idle: bool,
    /// Off-CPU intervals shorter than this many microseconds get no stack in
    /// off-CPU flame graphs (fewer map rows); per-thread totals
    /// (`/threads`) still count every nanosecond.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=60_000_000))]
    offcpu_min_us: u64,
    /// Off-CPU and waker stacks are sampled by interval length: an interval
    /// of d microseconds gets a stack with probability min(1, d / this)
    /// and counts d / p in flame graphs (an unbiased estimate), so the
    /// stack-walk rate stays bounded whatever the switch rate; longer
    /// intervals always get one. 0: a stack for every interval. Per-thread
    /// totals are exact either way.
    #[arg(long, default_value_t = 50_000, value_parser = clap::value_parser!(u64).range(0..=4_000_000))]
    offcpu_sample_us: u64,
    /// Where off-CPU stacks are walked: `switch-in` (in the task, right
    /// after it gets the CPU back, only for the intervals drawn; needs the
    /// kernel's `sched_exit_tp` tracepoint, else falls back) or
    /// `switch-out` (at every switch-out, the costlier way older kernels
    /// need; for comparison).
    #[arg(long, value_enum, default_value_t = OffcpuStacks::SwitchIn)]
    offcpu_stacks: OffcpuStacks,
    /// `on`: note every run of every CPU, so that each runqueue wait is
    /// split among the processes that ran meanwhile (`/runqueue?pid=`
    /// `kept_off_cpu_by`); `off`: not (for comparison of its cost).
    #[arg(long, value_enum, default_value_t = Toggle::On)]
    culprits: Toggle,
    /// `auto`: have HotSpot JVMs (JDK 17+) write their perf map and report
    /// thread names, through the attach mechanism (as `jcmd` does); `off`:
    /// never signal or connect to a JVM, nor read or write its memory
    /// (Java frames come from the perf maps JVMs write themselves).
    #[arg(long, value_enum, default_value_t = JvmMode::Auto)]
    jvm: JvmMode,
    /// `full`: name Java frames from the JVM's own structures (methods
    /// inlined into compiled code `_[i]`, interpreted methods `_[0]`, C1
    /// `_[1]`, C2 `_[j]`), read from its memory; nothing is loaded into
    /// the JVM. `perf-map`: one frame per compiled method from its perf
    /// map, interpreted code as `Interpreter`.
    #[arg(long, value_enum, default_value_t = JvmFrames::Full)]
    jvm_frames: JvmFrames,
    /// `on`: read CPython 3.10-3.13 interpreters' frames and thread names
    /// from their memory (nothing is loaded into them; needs `--unwind
    /// tables`); `off`: Python processes show the interpreter's native
    /// frames only.
    #[arg(long, value_enum, default_value_t = Toggle::On)]
    python: Toggle,
    /// User stack walking: `tables` walks code without frame pointers (glibc,
    /// release builds) with unwind tables built from `.eh_frame`, and the
    /// frame-pointer chain elsewhere; `fp` uses frame pointers only.
    #[arg(long, value_enum, default_value_t = Unwind::Tables)]
    unwind: Unwind,
    /// Memory for unwind tables in MiB (12 bytes a row; glibc needs about
    /// 0.4 MiB), shared fairly among users. Default: 1 MiB per GiB of
    /// RAM, from 16 to 32.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    unwind_table_mb: Option<u64>,
}

/// Who may use the HTTP API.
#[derive(clap::Args, Clone)]
struct Security {
    /// File holding a bearer token (whitespace trimmed): every endpoint but
    /// /healthz then requires `Authorization: Bearer <token>`. The file must
    /// be a regular file (not a symlink) that other users cannot read or
    /// write.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Accept this name in the Host header too (repeatable). Without it only
    /// IP addresses, localhost and this machine's host name are served,
    /// which stops DNS rebinding.
    #[arg(long = "allow-host", value_name = "NAME", value_parser = api::access::parse_allowed_host)]
    allow_host: Vec<String>,
    /// Allow --listen on a non-loopback address without --token-file, for
    /// when something else (a firewall, an authenticating proxy) guards it.
    #[arg(long)]
    insecure_listen: bool,
    /// Without --token-file, what a client on this host may read: `on`
    /// (the default) looks up the user owning the client's socket; root
    /// reads every process, another user only their own processes (host-wide
    /// answers and /metrics are refused). `off` lets every local user read
    /// every process.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = ["on", "off"])]
    local_auth: String,
}

/// Pushing profiles to Grafana Pyroscope and to OTLP receivers: the
/// interval, the processes and the grace apply to both.
#[derive(clap::Args, Clone)]
#[command(group(clap::ArgGroup::new("sink").args(["push_url", "otlp_url"]).multiple(true)))]
struct Push {
    /// Push profiles to the Pyroscope server at this URL (http or https)
    /// every --push-interval: `process_cpu` and `wallscope_offcpu` for the
    /// busiest processes. `https://USER@host` sends basic auth, with
    /// --push-token-file as the password.
    #[arg(long, value_name = "URL", value_parser = push::parse_url)]
    push_url: Option<url::Url>,
    /// Send the same profiles as OpenTelemetry profiles (OTLP/HTTP,
    /// protobuf, `v1development` of opentelemetry-proto 1.11) to the
    /// receiver at this URL (its base: they go to `URL/v1development/profiles`),
    /// every --push-interval; with or without --push-url.
    #[arg(long, value_name = "URL", value_parser = push::parse_url)]
    otlp_url: Option<url::Url>,
    /// Time between pushes (1s to 10m); each push holds the time since the
    /// previous one.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = push::parse_interval, requires = "sink")]
    push_interval: Duration,
    /// A label for every pushed series (repeatable); `service_name=NAME`
    /// replaces the process's, `hostname=` (empty) drops that label.
    /// Pyroscope only.
    #[arg(long = "push-label", value_name = "NAME=VALUE", value_parser = push::labels::parse_label, requires = "push_url")]
    push_label: Vec<(String, String)>,
    /// File holding the token sent to Pyroscope as `Authorization: Bearer
    /// TOKEN` (the password with a user in the URL); checked as
    /// --token-file is.
    #[arg(long, value_name = "FILE", requires = "push_url")]
    push_token_file: Option<PathBuf>,
    /// File holding the token sent to the OTLP receiver, as
    /// --push-token-file is to Pyroscope.
    #[arg(long, value_name = "FILE", requires = "otlp_url")]
    otlp_token_file: Option<PathBuf>,
    /// Processes pushed per interval: busiest (time on or waiting for a CPU,
    /// then wall time) first, each user a fair share.
    #[arg(long, value_name = "N", default_value_t = push::DEFAULT_TOP as u16, value_parser = clap::value_parser!(u16).range(1..=256), requires = "sink")]
    push_top: u16,
    /// On shutdown, how long to go on sending the last interval and what
    /// is queued (0s to 60s); a hung server cannot hold the exit longer.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = push::parse_grace, requires = "sink")]
    push_grace: Duration,
}

/// A token file given with `flag`, checked as --token-file is: a refused
/// one is a usage error.
fn push_token(flag: &str, path: Option<&PathBuf>) -> Result<Option<token::Token>> {
    path.map(|path| {
        token::Token::from_file(path)
            .map_err(|e| Usage(format!("{flag} {}: {e}", path.display())).into())
    })
    .transpose()
}

impl Push {
    /// The pusher's options, checked before anything is loaded: a bad
    /// label or token file is a usage error.
    fn options(&self) -> Result<Option<PushOptions>> {
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
enum OffcpuStacks {
    SwitchIn,
    SwitchOut,
}

/// A feature on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Toggle {
    On,
    Off,
}

/// How user stacks are walked (`--unwind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Unwind {
    Tables,
    Fp,
}

// Parsed once at start: the size of a variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
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

/// jemalloc rather than glibc's malloc. The daemon keeps long-lived history
/// beside short bursts (a drain's rows, an ELF file's symbols parsed and let
/// go): with glibc, freed memory stayed in the arenas, fragmented, and
/// `malloc_trim` gave none of it back (the soak: 135 MB in use, 240 MB
/// held). jemalloc's size classes keep the bursts apart, and its
/// background thread returns pages unused for a second to the kernel.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its first allocation: two arenas (a few
/// threads allocate), dirty pages purged after 1 s by a background thread.
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: &[u8] =
    b"narenas:2,background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve {
            listen,
            security,
            retention,
            memory_mb,
            max_memory_mb,
            user_cpu_ms,
            history_dir,
            history_disk_mb,
            pod_logs_dir,
            sampling,
            push,
        } => install_budget(memory_mb, max_memory_mb).and_then(|()| {
            if !budget::cpu::install(user_cpu_ms) {
                bail!("the CPU budget was read before it was set");
            }
            wallscope::process::container::set_pod_logs_dir(&pod_logs_dir);
            let history = History {
                retention: Duration::from_secs(retention * 60),
                max_bytes: budget::bytes(Part::Store),
                disk: history_dir.map(|dir| HistoryConfig {
                    dir,
                    max_bytes: history_disk_mb << 20,
                }),
            };
            serve(listen, &security, history, &sampling, &push)
        }),
        Command::Record {
            pid,
            duration,
            output,
            sampling,
        } => record(pid, duration, &output, &sampling),
        Command::Explain { url, asked } => explain(&url, &asked),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("wallscope: {err:#}");
            ExitCode::from(err.downcast_ref::<Usage>().map_or(1, |_| 2))
        }
    }
}

/// Prints the daemon's `/explain` answer; a question it refuses (a bad
/// parameter, an unknown pid) is a usage error.
fn explain(url: &str, asked: &api::client::Question) -> Result<()> {
    match api::client::explain(url, asked) {
        Ok(answer) => {
            print!("{answer}");
            Ok(())
        }
        Err(api::client::ClientError::Refused(why)) => bail!(Usage(why)),
        Err(e) => Err(e.into()),
    }
}

/// A mistake in how the command was called: exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Usage(String);

/// Splits `--memory-mb` among the holders, `--max-memory-mb` taken for the
/// store, before anything reads a bound: one that does not fit is a usage
/// error.
fn install_budget(memory_mb: u64, store_mb: Option<u64>) -> Result<()> {
    let overrides: Vec<Override> = store_mb
        .map(|mb| Override {
            part: Part::Store,
            bytes: mb << 20,
            flag: "--max-memory-mb",
        })
        .into_iter()
        .collect();
    let split =
        Split::new(memory_mb, &budget::bases(), &overrides).map_err(|e| Usage(e.to_string()))?;
    let parts: Vec<String> = split
        .split
        .iter()
        .map(|s| format!("{} {} MiB", s.part.name(), s.bytes >> 20))
        .collect();
    tracing::info!("memory budget {memory_mb} MiB: {}", parts.join(", "));
    if !budget::install(split) {
        bail!("the memory budget was read before it was set");
    }
    wallscope::api::answers::BUDGET.set_total(budget::bytes(Part::Answers) as u64);
    Ok(())
}

/// What the store keeps: `--retention`, its bytes, and on disk.
struct History {
    retention: Duration,
    max_bytes: usize,
    disk: Option<HistoryConfig>,
}

fn pipeline_options(sampling: &Sampling, history: History) -> PipelineOptions {
    PipelineOptions {
        probes: ProbeOptions {
            frequency_hz: sampling.frequency,
            include_idle: sampling.include_idle,
            offcpu_min_ns: sampling.offcpu_min_us * 1000,
            offcpu_sample_ns: sampling.offcpu_sample_us * 1000,
            stacks_at_switch_in: sampling.offcpu_stacks == OffcpuStacks::SwitchIn,
            culprits: sampling.culprits == Toggle::On,
            live_min_ns: 100_000_000,
            unwind_tables: sampling.unwind == Unwind::Tables,
            unwind_rows: (unwind_table_mb(sampling) * 1024 * 1024
                / std::mem::size_of::<wallscope::bpf::abi::UnwindRow>() as u64)
                as u32,
            host_threads: wallscope::process::own::host_threads(),
        },
        drain_interval: Duration::from_secs(1),
        retention: history.retention,
        store_max_bytes: history.max_bytes,
        history: history.disk,
        jvm: sampling.jvm,
        jvm_frames: sampling.jvm_frames,
        python: sampling.python == Toggle::On,
    }
}

/// `--unwind-table-mb`, or the host's default.
fn unwind_table_mb(sampling: &Sampling) -> u64 {
    use wallscope::unwind::sizing;
    sampling
        .unwind_table_mb
        .unwrap_or_else(|| sizing::default_table_mb(sizing::host_ram_bytes()))
}

/// The API's access rules from the flags. Checked before anything is
/// loaded: a daemon that would expose every process's stacks to the network
/// must not start at all.
fn access(listen: SocketAddr, security: &Security) -> Result<api::Access> {
    let token = match &security.token_file {
        Some(path) => Some(
            token::Token::from_file(path)
                .map_err(|e| Usage(format!("--token-file {}: {e}", path.display())))?,
        ),
        None => None,
    };
    let exposed = !listen.ip().to_canonical().is_loopback() && token.is_none();
    if exposed && !security.insecure_listen {
        bail!(Usage(format!(
            "refusing to listen on {listen}, which is not a loopback address, without \
             --token-file: anyone who can reach it could read every process's stacks. \
             Give --token-file FILE, or --insecure-listen if something else guards the port"
        )));
    }
    if exposed {
        tracing::warn!(%listen, "--insecure-listen: serving every process's stacks without a token");
    }
    let local_auth = security.local_auth == "on";
    if !local_auth && token.is_none() {
        tracing::warn!("--local-auth=off: every local user may read every process's stacks");
    }
    Ok(api::Access::new(security.allow_host.clone(), token).with_local_auth(local_auth))
}

fn serve(
    listen: SocketAddr,
    security: &Security,
    history: History,
    sampling: &Sampling,
    push: &Push,
) -> Result<()> {
    let access = access(listen, security)?;
    let push = push.options()?;
    let grace = push.as_ref().map_or(Duration::ZERO, |p| p.grace);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(|| {
            raise::worker(raise::API_NICE);
        })
        .build()
        .context("starting the async runtime")?;
    // Bind first: a taken port should fail before anything is loaded.
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(listen))
        .map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
                " (is another wallscope running? pick another with --listen)"
            } else {
                ""
            };
            anyhow::anyhow!("cannot listen on {listen}: {e}{hint}")
        })?;
    wallscope::caps::check().map_err(anyhow::Error::msg)?;
    let pipeline = Pipeline::start(&pipeline_options(sampling, history))?;
    let pusher = push
        .map(|opts| Pusher::start(pipeline.shared(), opts))
        .transpose()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    tracing::info!(%listen, frequency = sampling.frequency, "wallscope serving on http://{listen}/");
    // The pipeline's last drain runs while the server gives its requests
    // their grace, not after: one after the other they took over a second.
    let shared = pipeline.shared();
    let (signalled, signal) = std::sync::mpsc::channel::<Instant>();
    let stopper = std::thread::Builder::new()
        .name("ws-stop".into())
        .spawn(move || {
            // A server that failed drops the sender: stop as well.
            let since = signal.recv().unwrap_or_else(|_| Instant::now());
            pipeline.stop();
            since
        })
        .context("starting the stop thread")?;
    let served = runtime.block_on(api::serve(listener, shared, access, move || {
        let _ = signalled.send(Instant::now());
    }));
    // A flame graph still rendering on a blocking thread (or a recording)
    // must not hold the exit: its client is gone.
    runtime.shutdown_background();
    let stopping = match stopper.join() {
        Ok(since) => since,
        Err(_) => bail!("the pipeline's stop panicked"),
    };
    // The pusher's last interval ends with the pipeline's last drain. A
    // hung server holds the exit at most --push-grace.
    if let Some(pusher) = pusher {
        pusher.stop(grace);
    }
    tracing::info!(took = ?stopping.elapsed(), "pipeline stopped");
    served.context("serving HTTP")
}

fn record(pid: u32, duration: Duration, output: &Path, sampling: &Sampling) -> Result<()> {
    let Some(format) = RecordFormat::of(output) else {
        bail!(Usage(format!(
            "cannot tell the output type of {}: use a .svg, .folded or .pb.gz file name",
            output.display()
        )));
    };
    if !live::exists(pid) {
        bail!(Usage(format!("no process with pid {pid}")));
    }
    let retention = duration + Duration::from_secs(60);
    let history = History {
        retention,
        max_bytes: budget::bytes(Part::Store),
        disk: None,
    };
    wallscope::caps::check().map_err(anyhow::Error::msg)?;
    let pipeline = Pipeline::start(&pipeline_options(sampling, history))?;
    let started = Instant::now();
    while started.elapsed() < duration && live::exists(pid) {
        std::thread::sleep(
            Duration::from_millis(100).min(duration.saturating_sub(started.elapsed())),
        );
    }
    let shared = pipeline.shared();
    // Nothing waits on us here: give the last drain and its symbolization
    // time to reach the store.
    pipeline.stop_within(Duration::from_secs(10));
    let snapshot = shared
        .store
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .snapshot();
    let recorded = record::profile(&snapshot, pid, retention, started.elapsed(), format)?;
    std::fs::write(output, &recorded.bytes)
        .with_context(|| format!("writing {}", output.display()))?;
    eprintln!(
        "wallscope: wrote {} ({} stacks, {:.1} ms of CPU)",
        output.display(),
        recorded.stacks,
        recorded.cpu_ns as f64 / 1e6
    );
    Ok(())
}
