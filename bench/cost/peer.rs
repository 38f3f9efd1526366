//! The side-by-side part: wallscope and the OpenTelemetry eBPF profiler
//! at the same 99 Hz on the calm host (our services alone), one after the
//! other, two rounds of `COST_BENCH_PEER_SECONDS` (default 90) each, the
//! order swapped in the second round.
//!
//! The peer is built from the Go module proxy at the version pinned in
//! `bench/cost/peer/go.mod` (its BPF objects are prebuilt in the module;
//! one file replaced, see [`patched`]),
//! with the OTLP gRPC receiver it needs beside it (`bench/cost/peer/
//! main.go`: the profiler dials its collector before it starts, and the
//! receiver counts what it is sent). A peer that cannot be built or run
//! here is recorded (commands and errors) in the report, not an error.

use crate::common::{free_port, group::Group, log_tail, serve, table, verdict, wait_drains, ROOT};
use crate::load::Load;
use crate::measure::{self, Window};
use anyhow::{bail, Context, Result};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// The peer's module, and its flags: our sampling rate, no TLS to the
/// local receiver. Off-CPU stays off: it needs a kprobe.
pub const MODULE: &str = "go.opentelemetry.io/ebpf-profiler";
const PEER_FLAGS: [&str; 3] = ["-samples-per-second", "99", "-disable-tls"];
/// Time each profiler gets before its window: wallscope past its first
/// drains, the peer past its start (it loads its programs and reads every
/// process's mappings first).
const SETTLE: Duration = Duration::from_secs(15);
pub const ROUNDS: usize = 2;

/// The built peer: the profiler and its receiver, and the version.
pub struct Peer {
    pub profiler: PathBuf,
    pub sink: PathBuf,
    pub version: String,
}

/// One profiler's window in a round.
pub struct Round {
    pub round: usize,
    pub wallscope: bool,
    pub window: Window,
    /// The peer's receiver's count: OTLP requests and samples received.
    pub received: Option<(u64, u64)>,
}

/// The part's outcome.
pub enum Outcome {
    Ran {
        peer: Peer,
        rounds: Vec<Round>,
        secs: u64,
    },
    /// Why the peer could not be built or run, for the report.
    Failed(String),
}

/// The Go toolchain: `go` on `PATH` or Go's default install directory.
fn go() -> PathBuf {
    let default = PathBuf::from("/usr/local/go/bin/go");
    match crate::common::find_tool("go", "golang") {
        Ok(go) => go,
        Err(_) => default,
    }
}

/// `cmd` run to completion: `Ok` or the command and its output, for the
/// report.
fn run_recorded(cmd: &mut Command) -> Result<(), String> {
    let shown = format!("{cmd:?}");
    match cmd.output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "`{shown}` failed ({}):\n\n```\n{}{}```\n",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )),
        Err(e) => Err(format!("`{shown}` could not start: {e}\n")),
    }
}

/// Builds the peer and its receiver into `out` from the pinned module.
pub fn build(out: &Path) -> Result<Peer, String> {
    let dir = Path::new(ROOT).join("bench/cost/peer");
    let gomod = std::fs::read_to_string(dir.join("go.mod")).map_err(|e| e.to_string())?;
    let version = gomod
        .lines()
        .find_map(|l| l.trim().strip_prefix(MODULE)?.split_whitespace().next())
        .unwrap_or("?")
        .to_string();
    let profiler = out.join("ebpf-profiler");
    let sink = out.join("otlp-sink");
    let go = go();
    let modfile = patched(&go, &dir, &gomod, &version)?;
    let build = |target: &str, bin: &Path, modfile: Option<&Path>| {
        let mut cmd = Command::new(&go);
        cmd.arg("build");
        if let Some(m) = modfile {
            cmd.arg(format!("-modfile={}", m.display()));
        }
        cmd.arg("-o").arg(bin).arg(target).current_dir(&dir);
        run_recorded(&mut cmd)
    };
    build(MODULE, &profiler, Some(&modfile))?;
    build(".", &sink, None)?;
    Ok(Peer {
        profiler,
        sink,
        version,
    })
}

/// The pinned module as the Go proxy serves it, copied with one file
/// replaced (`bench/cost/peer/overlay/rlimit.go`: unpatched, the peer
/// exits at start where raising RLIMIT_MEMLOCK is not permitted, as in a
/// container without CAP_SYS_RESOURCE), and a go.mod that points at the
/// copy; returns that go.mod. In `target/cost-peer`, a fixed directory:
/// Go's build cache keys on it.
fn patched(go: &Path, dir: &Path, gomod: &str, version: &str) -> Result<PathBuf, String> {
    let work = Path::new(ROOT).join("target/cost-peer");
    let copy = work.join("ebpf-profiler");
    run_recorded(
        Command::new(go)
            .args(["mod", "download", MODULE])
            .current_dir(dir),
    )?;
    let out = Command::new(go).args(["env", "GOMODCACHE"]).output();
    let cache = out.map_err(|e| format!("go env GOMODCACHE: {e}"))?.stdout;
    let src = Path::new(String::from_utf8_lossy(&cache).trim()).join(format!("{MODULE}@{version}"));
    let sh = "rm -rf \"$1\" && mkdir -p \"$1\" && cp -r \"$2/.\" \"$1\" && chmod -R u+w \"$1\" \
              && cp \"$3\" \"$1/rlimit/rlimit.go\"";
    let mut cmd = Command::new("sh");
    cmd.args(["-c", sh, "sh"])
        .arg(&copy)
        .arg(&src)
        .arg(dir.join("overlay/rlimit.go"));
    run_recorded(&mut cmd)?;
    let modfile = work.join("go.mod");
    let text = format!("{gomod}\nreplace {MODULE} => {}\n", copy.display());
    std::fs::write(&modfile, text).map_err(|e| e.to_string())?;
    std::fs::copy(dir.join("go.sum"), work.join("go.sum")).map_err(|e| e.to_string())?;
    Ok(modfile)
}

/// Runs the rounds beside `services`; a peer that fails to run is an
/// [`Outcome::Failed`].
pub fn run(
    daemon: &Path,
    peer: Peer,
    services: &mut Load,
    secs: u64,
    dir: &Path,
) -> Result<Outcome> {
    let mut rounds = Vec::new();
    for round in 0..ROUNDS {
        let order = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for wallscope in order {
            eprintln!(
                "cost: side by side, round {}: {}",
                round + 1,
                name(wallscope)
            );
            let mut alive = || services.check_alive();
            let r = if wallscope {
                run_wallscope(daemon, secs, dir, &mut alive)
                    .map(|w| (w, None))
                    .map_err(|e| e.to_string())
            } else {
                run_peer(&peer, secs, dir, &mut alive)
            };
            match r {
                Ok((window, received)) => rounds.push(Round {
                    round,
                    wallscope,
                    window,
                    received,
                }),
                Err(why) if wallscope => bail!("wallscope in the side-by-side part: {why}"),
                Err(why) => return Ok(Outcome::Failed(why)),
            }
        }
    }
    Ok(Outcome::Ran { peer, rounds, secs })
}

fn name(wallscope: bool) -> &'static str {
    if wallscope {
        "wallscope"
    } else {
        "OpenTelemetry eBPF profiler"
    }
}

fn run_wallscope(
    daemon: &Path,
    secs: u64,
    dir: &Path,
    alive: &mut dyn FnMut() -> Result<()>,
) -> Result<Window> {
    let port = free_port()?;
    let mut d = serve(daemon, port, &[], &dir.join("wallscope-peer.log"))?;
    wait_drains(port, 3)?;
    sleep(SETTLE);
    let w = measure::window(d.pid(), Some(port), secs, alive)?;
    d.0.stop(libc::SIGTERM)?;
    Ok(w)
}

/// The peer's window, with what its receiver got; or why it did not run.
fn run_peer(
    peer: &Peer,
    secs: u64,
    dir: &Path,
    alive: &mut dyn FnMut() -> Result<()>,
) -> Result<(Window, Option<(u64, u64)>), String> {
    let mut cmd = Command::new(&peer.sink);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut sink = Group::spawn(&mut cmd, libc::SIGKILL).map_err(|e| e.to_string())?;
    let port = sink_port(&mut sink).map_err(|e| format!("the OTLP receiver: {e:#}"))?;
    let log = dir.join("peer.log");
    let mut cmd = peer_command(&peer.profiler);
    cmd.args(PEER_FLAGS)
        .arg("-collection-agent")
        .arg(format!("127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).map_err(|e| e.to_string())?);
    let shown = format!("{cmd:?}");
    let mut p = Group::spawn(&mut cmd, libc::SIGTERM).map_err(|e| format!("{e:#}"))?;
    let died = |p: &mut Group| -> Option<String> {
        let status = p.0 .0.try_wait().ok()??;
        Some(format!(
            "`{shown}` exited with {status}; its log:\n\n```\n{}\n```\n",
            log_tail(&log, 40)
        ))
    };
    let settled = Instant::now() + SETTLE;
    while Instant::now() < settled {
        if let Some(why) = died(&mut p) {
            return Err(why);
        }
        sleep(Duration::from_millis(200));
    }
    let pid = p.pid();
    let mut alive = || -> Result<()> {
        if let Some(why) = died(&mut p) {
            bail!("{why}");
        }
        alive()
    };
    let w = measure::window(pid, None, secs, &mut alive).map_err(|e| format!("{e:#}"))?;
    p.0.stop(libc::SIGTERM).map_err(|e| e.to_string())?;
    // Its `requests N samples M` as it exits.
    let received = sink.stop_counts(["requests", "samples"]).ok();
    Ok((w, received))
}

/// Where the peer finds tracepoints' ids (cilium/ebpf reads tracefs to
/// attach its `sched_process_free` tracepoint).
const TRACEFS: &str = "/sys/kernel/tracing";

/// The command that starts the peer: the profiler itself, or, when the
/// host has no tracefs mounted, the profiler in a mount namespace of its
/// own where `unshare` mounts one (the host's mounts stay as they are;
/// `exec` keeps the pid, so it is the profiler's).
fn peer_command(profiler: &Path) -> Command {
    if Path::new(TRACEFS).join("events").exists() {
        return Command::new(profiler);
    }
    let mut cmd = Command::new("unshare");
    let script = format!("mount -t tracefs nodev {TRACEFS} && exec \"$0\" \"$@\"");
    cmd.args(["--mount", "--", "sh", "-c", &script])
        .arg(profiler);
    cmd
}

/// Reads the receiver's `ready PORT` line.
fn sink_port(sink: &mut Group) -> Result<u16> {
    let out = sink.0 .0.stdout.as_mut().context("no stdout")?;
    let mut line = Vec::new();
    let mut byte = [0u8];
    while out.read(&mut byte)? == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    let line = String::from_utf8_lossy(&line).to_string();
    let port = line
        .strip_prefix("ready ")
        .and_then(|p| p.trim().parse().ok());
    port.with_context(|| format!("said {line:?}"))
}

/// The part's section of the report.
pub fn render(outcome: &Outcome, services: &[String]) -> String {
    let mut out = format!(
        "\n## Side by side with the OpenTelemetry eBPF profiler (calm host)\n\n\
         - workload: {}\n\
         - wallscope: default flags (99 Hz, off-CPU on); the peer: `{MODULE}` built from the Go \
         module proxy (`bench/cost/peer/go.mod`), flags `{}` and `-collection-agent` a local OTLP \
         gRPC receiver that counts and drops (`bench/cost/peer/main.go`); off-CPU off (the peer's \
         needs a kprobe, which this host's kernel does not offer); built with `rlimit/rlimit.go` \
         replaced by `bench/cost/peer/overlay/rlimit.go` (unpatched it exits at start: raising \
         RLIMIT_MEMLOCK needs CAP_SYS_RESOURCE, which this host's root lacks)\n",
        services.join("; "),
        PEER_FLAGS.join(" ")
    );
    if !Path::new(TRACEFS).join("events").exists() {
        out += "- tracefs is not mounted on this host: the peer runs in a mount namespace of its \
                own where one is mounted (`unshare --mount`), to attach its tracepoint\n";
    }
    let (peer, rounds, secs) = match outcome {
        Outcome::Failed(why) => {
            return out + &format!("\nThe peer could not be built or run here:\n\n{why}\n");
        }
        Outcome::Ran { peer, rounds, secs } => (peer, rounds, secs),
    };
    out += &format!(
        "- version {}; {ROUNDS} rounds of {secs} s each, the order swapped in the second; each \
         measured after {} s\n\n",
        peer.version,
        SETTLE.as_secs()
    );
    let rows: Vec<Vec<String>> = rounds
        .iter()
        .map(|r| {
            let got = r.received.map_or(String::new(), |(req, s)| {
                format!(
                    "{req} requests, {s} samples ({:.0}/s)",
                    s as f64 / r.window.secs
                )
            });
            vec![
                format!("{} {}", r.round + 1, name(r.wallscope)),
                format!("{:.2}", r.window.cpu_pct()),
                format!("{:.1}", r.window.rss_mb()),
                format!("{:.1}", r.window.hwm_mb()),
                format!("{:.2}", r.window.host_busy),
                got,
            ]
        })
        .collect();
    out += &table(
        &[
            "round, profiler",
            "CPU, % of one CPU",
            "RSS median, MB",
            "VmHWM, MB",
            "host CPUs busy",
            "the receiver got",
        ],
        &rows,
    );
    let mean = |ws: bool, f: fn(&Window) -> f64| {
        let v: Vec<f64> = rounds
            .iter()
            .filter(|r| r.wallscope == ws)
            .map(|r| f(&r.window))
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let line = |what: &str, f: fn(&Window) -> f64| {
        let (w, p) = (mean(true, f), mean(false, f));
        let ok = w.zip(p).map(|(w, p)| w <= p);
        let ratio = w
            .zip(p)
            .map_or("n/a".into(), |(w, p)| format!("×{:.2}", w / p));
        vec![
            what.to_string(),
            w.map_or("n/a".into(), |v| format!("{v:.2}")),
            p.map_or("n/a".into(), |v| format!("{v:.2}")),
            ratio,
            verdict(ok).to_string(),
        ]
    };
    let rows = vec![
        line("CPU, % of one CPU (mean)", Window::cpu_pct),
        line("RSS median, MB (mean)", Window::rss_mb),
        line("VmHWM, MB (mean)", Window::hwm_mb),
    ];
    out +=
        "\nGoal (issue #40): wallscope's CPU and RSS at or below the peer's, with off-CPU on.\n\n";
    out += &table(
        &["figure", "wallscope", "peer", "wallscope / peer", "verdict"],
        &rows,
    );
    out
}
