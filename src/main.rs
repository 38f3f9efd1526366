//! The `wallscope` command: `serve` runs the daemon, `record` profiles one
//! process once and writes a file, `explain` asks a running daemon why a
//! process is slow.

mod cli;

use std::{
    net::SocketAddr,
    path::Path,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::Parser;
use cli::{Cli, Command, OffcpuStacks, Push, Sampling, Security, Toggle, Unwind, Usage};
use wallscope::{
    api,
    bpf::ProbeOptions,
    budget::{self, Override, Part, Split},
    export::{
        push::Pusher,
        record::{self, RecordFormat},
    },
    pipeline::{Pipeline, PipelineOptions},
    priority::raise,
    process::live,
    profile::history::HistoryConfig,
    token,
};

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
