//! The on-disk history's format, chosen by measurement: wallscope's
//! append-only segment files (`src/profile/history/`) against two embedded
//! stores, `redb` (a copy-on-write B-tree in one file) and `fjall` (an LSM
//! tree with a journal), on the same work: 3,600 one-second blocks of
//! 5–20 KB of incompressible bytes (what zstd leaves), keyed by time.
//!
//! Per store and sync cadence (every block, or every 5 blocks ≈ every 5 s
//! of one-second blocks): CPU and wall time to write, bytes passed to
//! `write` and bytes sent to the disk (`/proc/self/io`), bytes on disk; time
//! to open the store and to read the 1-hour range (all 3,600 blocks) with
//! the files dropped from the page cache (`POSIX_FADV_DONTNEED` on the
//! store's own files), and again warm. Then a kill -9 test: a child process
//! writes blocks, prints each sync it completed, and is killed with SIGKILL;
//! the store is reopened and checked (acknowledged blocks present, time to
//! reopen). The dependency weight is `cargo tree`'s crate count.
//!
//! Prints the report and writes `bench/results/history_disk.txt`. Runs as
//! any user, in a temporary directory under the target directory (a real
//! disk, not tmpfs).

use std::{
    fmt::Write as _,
    io::{BufRead, BufReader, Write as _},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context, Result};
use wallscope::profile::history::{BlockMeta, History, HistoryConfig};

const BLOCKS: u64 = 3_600;
const T0: u64 = 1_700_000_000;
const CHILD_ENV: &str = "WS_BENCH_HISTORY_CHILD";

fn payload(i: u64) -> Vec<u8> {
    let len = 5_000 + (i.wrapping_mul(7_919) % 15_001) as usize;
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn start_ns(i: u64) -> u64 {
    (T0 + i) * 1_000_000_000
}

fn time(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}

/// The three stores behind one face.
enum Store {
    Segments(Arc<History>),
    Redb(redb::Database),
    Fjall(fjall::Keyspace, fjall::PartitionHandle),
}

const REDB_TABLE: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("blocks");
const NAMES: [&str; 3] = ["segments", "redb", "fjall"];

impl Store {
    fn open(name: &str, dir: &Path) -> Result<Store> {
        Ok(match name {
            "segments" => Store::Segments(History::open(HistoryConfig {
                dir: dir.to_path_buf(),
                max_bytes: 1 << 30,
            })?),
            "redb" => {
                std::fs::create_dir_all(dir)?;
                Store::Redb(redb::Database::create(dir.join("history.redb"))?)
            }
            _ => {
                let ks = fjall::Config::new(dir).open()?;
                let part = ks.open_partition("blocks", fjall::PartitionCreateOptions::default())?;
                Store::Fjall(ks, part)
            }
        })
    }

    /// Writes block `i`; `sync` makes it (and all before it) durable.
    fn write(&mut self, i: u64, sync: bool) -> Result<()> {
        let data = payload(i);
        let (start, end) = (start_ns(i), start_ns(i + 1));
        match self {
            Store::Segments(h) => {
                let meta = BlockMeta {
                    start: time(start),
                    end: time(end),
                    step_s: 1,
                };
                h.submit(meta, data);
                // The queue holds 8 MiB: wait for the writer at least every
                // 64 blocks (1 MB), and at each sync.
                if (sync || i % 64 == 63) && !h.flush(Duration::from_secs(30)) {
                    bail!("flush timed out");
                }
            }
            Store::Redb(db) => {
                let mut tx = db.begin_write()?;
                let durability = if sync {
                    redb::Durability::Immediate
                } else {
                    redb::Durability::None
                };
                tx.set_durability(durability);
                let mut value = end.to_le_bytes().to_vec();
                value.extend_from_slice(&data);
                tx.open_table(REDB_TABLE)?.insert(start, value.as_slice())?;
                tx.commit()?;
            }
            Store::Fjall(ks, part) => {
                let mut value = end.to_le_bytes().to_vec();
                value.extend_from_slice(&data);
                part.insert(start.to_be_bytes(), value)?;
                if sync {
                    ks.persist(fjall::PersistMode::SyncData)?;
                }
            }
        }
        Ok(())
    }

    /// Reads every block starting in `[from, until)`: (count, payload bytes).
    fn read_range(&self, from: u64, until: u64) -> Result<(u64, u64)> {
        let (mut n, mut bytes) = (0, 0);
        match self {
            Store::Segments(h) => {
                for b in h.blocks(time(from), time(until)) {
                    bytes += h.read(&b)?.len() as u64;
                    n += 1;
                }
            }
            Store::Redb(db) => {
                let tx = db.begin_read()?;
                let table = tx.open_table(REDB_TABLE)?;
                for kv in table.range(from..until)? {
                    let (_, v) = kv?;
                    bytes += v.value().len() as u64 - 8;
                    n += 1;
                }
            }
            Store::Fjall(_, part) => {
                for kv in part.range(from.to_be_bytes()..until.to_be_bytes()) {
                    let (_, v) = kv?;
                    bytes += v.len() as u64 - 8;
                    n += 1;
                }
            }
        }
        Ok((n, bytes))
    }
}

/// (user + system CPU seconds of this process, bytes passed to write,
/// bytes sent to the disk).
fn usage() -> (f64, u64, u64) {
    // SAFETY: getrusage fills the struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    let field = |name: &str| {
        io.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0)
    };
    (
        secs(ru.ru_utime) + secs(ru.ru_stime),
        field("wchar:"),
        field("write_bytes:"),
    )
}

/// Files under `dir`, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    files(dir)
        .iter()
        .filter_map(|p| p.metadata().ok())
        .map(|m| m.blocks() * 512)
        .sum()
}

/// Drops the store's own files from the page cache (they are synced).
fn drop_cache(dir: &Path) {
    for p in files(dir) {
        if let Ok(f) = std::fs::File::open(&p) {
            let _ = f.sync_all();
            // SAFETY: a valid descriptor; advice only.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

/// One store at one sync cadence: a report line.
fn run(name: &str, sync_every: u64, root: &Path) -> Result<String> {
    let dir = root.join(format!("{name}-{sync_every}"));
    let payload_bytes: u64 = (0..BLOCKS).map(|i| payload(i).len() as u64).sum();
    let (cpu0, w0, d0) = usage();
    let t = Instant::now();
    let mut store = Store::open(name, &dir)?;
    for i in 0..BLOCKS {
        store.write(i, i % sync_every == sync_every - 1)?;
    }
    drop(store); // closing writes what the store still holds
    let wall = t.elapsed().as_secs_f64();
    let (cpu1, w1, d1) = usage();
    let on_disk = disk_bytes(&dir);
    let cpu_us = (cpu1 - cpu0 - gen_cpu()) * 1e6 / BLOCKS as f64;

    drop_cache(&dir);
    let t = Instant::now();
    let store = Store::open(name, &dir)?;
    let open_cold = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let (n, bytes) = store.read_range(start_ns(0), start_ns(BLOCKS))?;
    let read_cold = t.elapsed().as_secs_f64();
    if (n, bytes) != (BLOCKS, payload_bytes) {
        bail!("{name}: read {n} blocks, {bytes} bytes; wrote {BLOCKS}, {payload_bytes}");
    }
    let t = Instant::now();
    store.read_range(start_ns(0), start_ns(BLOCKS))?;
    let read_warm = t.elapsed().as_secs_f64();
    drop(store);
    Ok(format!(
        "{name:<9} {sync_every:>5} {wall:>7.2} {cpu_us:>9.0} {:>9.1} {:>9.1} {:>8.1} {:>9.1} {:>9.1} {:>9.1}",
        mb(w1 - w0),
        mb(d1 - d0),
        mb(on_disk),
        open_cold * 1e3,
        read_cold * 1e3,
        read_warm * 1e3,
    ))
}

/// CPU seconds spent making the payloads of one run (subtracted).
fn gen_cpu() -> f64 {
    static GEN: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *GEN.get_or_init(|| {
        let t0 = usage().0;
        let n: usize = (0..BLOCKS).map(|i| payload(i).len()).sum();
        std::hint::black_box(n);
        usage().0 - t0
    })
}

/// The child of the kill test: writes blocks from 0, syncing every 5 and
/// printing `ACK n` after each sync (blocks below n are durable).
fn child(spec: &str) -> Result<()> {
    let (name, dir) = spec.split_once(':').context("child spec")?;
    let mut store = Store::open(name, Path::new(dir))?;
    let mut out = std::io::stdout().lock();
    for i in 0..100_000 {
        let sync = i % 5 == 4;
        store.write(i, sync)?;
        if sync {
            writeln!(out, "ACK {}", i + 1)?;
            out.flush()?;
        }
    }
    Ok(())
}

/// Kills a writing child at `ACK >= kill_at` plus a little: a report line.
fn kill_test(name: &str, root: &Path) -> Result<String> {
    let dir = root.join(format!("{name}-kill"));
    let mut child = Command::new(std::env::current_exe()?)
        .env(CHILD_ENV, format!("{name}:{}", dir.display()))
        .stdout(Stdio::piped())
        .spawn()?;
    let mut acked = 0u64;
    for line in BufReader::new(child.stdout.take().context("stdout")?).lines() {
        if let Some(n) = line?.strip_prefix("ACK ") {
            acked = n.parse()?;
        }
        if acked >= 500 {
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(3));
    child.kill()?; // SIGKILL
    child.wait()?;
    let t = Instant::now();
    let store = Store::open(name, &dir)?;
    let reopen = t.elapsed().as_secs_f64();
    let mut present = 0;
    while present < 100_000
        && store
            .read_range(start_ns(present), start_ns(present + 1))?
            .0
            == 1
    {
        present += 1;
    }
    let (total, _) = store.read_range(0, u64::MAX)?;
    let torn = match &store {
        Store::Segments(h) => h.stats().torn_blocks.to_string(),
        _ => "-".into(),
    };
    Ok(format!(
        "{name:<9} {acked:>6} {present:>8} {total:>6} {torn:>5} {:>9.1}",
        reopen * 1e3
    ))
}

/// Crates `pkg` brings (its dependencies, itself included).
fn weight(pkg: &str) -> String {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["tree", "--prefix", "none", "-p", pkg])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let mut crates: Vec<String> = String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().next().map(str::to_string))
                .collect();
            crates.sort();
            crates.dedup();
            format!("{pkg}: {} crates", crates.len())
        }
        _ => format!("{pkg}: cargo tree unavailable"),
    }
}

fn main() -> Result<()> {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        return child(&spec);
    }
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    std::fs::create_dir_all(&target)?;
    let root = tempfile::Builder::new()
        .prefix("history-disk-")
        .tempdir_in(&target)?;
    let mut report = String::new();
    let now = chrono_like_now();
    let build = if cfg!(debug_assertions) {
        "dev profile (wallscope at opt-level 0, its dependencies at 2)"
    } else {
        "release build"
    };
    writeln!(
        report,
        "# On-disk history: segment files vs redb vs fjall\n\n{now}; {build}; {BLOCKS} blocks of \
         5-20 KB (incompressible), keys = start times; dir {} (on the target dir's file system). \
         sync/ = a sync every N blocks; cpu_us/blk = process CPU (all threads) per block, payload \
         making excluded; write()MB = bytes passed to write(), disk_io_MB = bytes sent to the disk \
         (/proc/self/io); open = reopening with the files out of the page cache; read1h = reading \
         all {BLOCKS} blocks back. Written by `cargo bench --bench history_disk` \
         (`--profile dev` skips the release build).\n",
        root.path().display()
    )?;
    writeln!(
        report,
        "store     sync/  write_s cpu_us/blk  write()MB  disk_io_MB  on_disk_MB open_ms   read1h_cold_ms read1h_warm_ms"
    )?;
    for sync_every in [1, 5] {
        for name in NAMES {
            let line = run(name, sync_every, root.path()).with_context(|| name.to_string())?;
            println!("{line}");
            writeln!(report, "{line}")?;
        }
    }
    writeln!(
        report,
        "\nkill -9 after >= 500 acknowledged (synced) blocks, then reopen:\nstore      acked  prefix  total  torn reopen_ms"
    )?;
    for name in NAMES {
        let line = kill_test(name, root.path()).with_context(|| name.to_string())?;
        println!("{line}");
        writeln!(report, "{line}")?;
    }
    writeln!(
        report,
        "\ndependency weight (cargo tree -p, the crate included):"
    )?;
    for pkg in ["crc32fast", "redb", "fjall"] {
        let line = weight(pkg);
        println!("{line}");
        writeln!(report, "  {line}")?;
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results/history_disk.txt");
    std::fs::write(&path, &report)?;
    println!("\n{report}\nwritten to {}", path.display());
    Ok(())
}

/// The date, from `date -u` (no date crate needed for one line).
fn chrono_like_now() -> String {
    Command::new("date")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
