//! The hostile mix, run as `nobody` beside the busy host (issue #40):
//! - a perf map of 30,000 unique 2 KB names, written anew with names never
//!   used before every 2 s, behind 20 sleeping threads;
//! - 20 threads sleeping behind ever-new random 127-frame stacks;
//! - a Python process that compiles a new code object every loop;
//! - hundreds of distinct short-lived binaries (distinct files, so
//!   distinct unwind tables and symbol files), 30 started a second.
//!
//! Everything runs from a directory in `/var/tmp` that `nobody` can use,
//! removed when the mix is dropped (the perf maps go with the [`Load`]).

use crate::common::{as_nobody, build_c, build_workload, ROOT};
use crate::load::{Built, Load};
use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use tempfile::TempDir;

/// `stacks_attacker` arguments: threads, chain depth, code regions, name
/// bytes, sleep (µs) and map rewrite period (ms). The first is the perf
/// map rewritten with unique names, the second the ever-new deep stacks.
pub const MAP_ATTACK: [&str; 6] = ["20", "4", "30000", "2000", "100000", "2000"];
pub const STACKS_ATTACK: [&str; 5] = ["20", "127", "3000", "64", "10000"];
/// Distinct short-lived binaries, how many start a second, and the
/// functions and CPU (ms) of each.
pub const BINARIES: usize = 300;
pub const BINARY_RATE: u32 = 30;
const FUNCTIONS: usize = 200;
const BINARY_MS: u32 = 10;

/// The running mix.
pub struct Hostile {
    pub load: Load,
    /// Removed after the load is killed (fields drop in order).
    _dir: TempDir,
}

/// Builds the attackers into a directory `nobody` can use and starts the
/// mix, each part as `nobody`, once each runs.
pub fn start(b: &Built) -> Result<Hostile> {
    let dir = tempfile::Builder::new()
        .prefix("wallscope-cost")
        .tempdir_in("/var/tmp")?;
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755))?;
    let d = dir.path();
    let attacker = d.join("stacks_attacker");
    build_workload(
        &Path::new(ROOT).join("tests/workloads/stacks_attacker.c"),
        &attacker,
    )?;
    let script = d.join("cost_codegen.py");
    fs::copy(
        Path::new(ROOT).join("bench/workloads/cost_codegen.py"),
        &script,
    )?;
    fs::set_permissions(&script, fs::Permissions::from_mode(0o644))?;
    let binaries = distinct_binaries(d)?;
    // The bench's own directory is root's alone.
    let spawner = d.join("soak_spawner");
    fs::copy(&b.spawner, &spawner)?;

    let mut load = Load::new(&b.dir);
    let mut hostile = |name: String, cmd: &mut std::process::Command, ready: bool| {
        // The attackers write their perf maps in /tmp, not here.
        load.spawn(&name, cmd.current_dir(d), ready)
    };
    let mut cmd = as_nobody(&attacker);
    let name = format!("stacks_attacker {}", MAP_ATTACK.join(" "));
    hostile(name, cmd.args(MAP_ATTACK), true)?;
    let mut cmd = as_nobody(&attacker);
    let name = format!("stacks_attacker {}", STACKS_ATTACK.join(" "));
    hostile(name, cmd.args(STACKS_ATTACK), true)?;
    let mut cmd = as_nobody(&b.python);
    hostile("cost_codegen.py".into(), cmd.arg(&script), true)?;
    let mut cmd = as_nobody(&spawner);
    cmd.arg(BINARY_RATE.to_string()).args(&binaries);
    let name = format!("soak_spawner {BINARY_RATE} over {BINARIES} distinct binaries");
    hostile(name, &mut cmd, false)?;
    Ok(Hostile { load, _dir: dir })
}

/// A C program of [`FUNCTIONS`] functions without frame pointers that
/// burns [`BINARY_MS`] ms of CPU through them and exits.
fn brief_source() -> String {
    let mut src = String::from(
        "#include <time.h>\n\
         __attribute__((noinline)) void sink(long *a) { __asm__ volatile(\"\" : : \"r\"(a) : \"memory\"); }\n",
    );
    for i in 0..FUNCTIONS {
        let _ = writeln!(
            src,
            "__attribute__((noinline)) long f{i}(long x) {{ long a[6]; \
             for (int i = 0; i < 6; i++) a[i] = x * i + {i}; sink(a); return a[2] + x; }}"
        );
    }
    src += "static long (*const fs[])(long) = {";
    for i in 0..FUNCTIONS {
        let _ = write!(src, "f{i},");
    }
    let _ = write!(
        src,
        "}};\nint main(void) {{\n\
         struct timespec t; long x = 1;\n\
         do {{ for (int i = 0; i < {FUNCTIONS}; i++) x = fs[i](x);\n\
         clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); }}\n\
         while (t.tv_nsec < {BINARY_MS} * 1000000L && t.tv_sec == 0);\n\
         return (int)(x & 1);\n}}\n"
    );
    src
}

/// Compiles [`brief_source`] once and copies it to [`BINARIES`] files of
/// `dir/bin`: distinct inodes, so distinct binaries to the daemon.
fn distinct_binaries(dir: &Path) -> Result<Vec<PathBuf>> {
    let bin = dir.join("bin");
    fs::create_dir(&bin)?;
    let src = dir.join("brief.c");
    fs::write(&src, brief_source())?;
    let first = bin.join("brief-000");
    build_c(&src, &first, &["-O2", "-fomit-frame-pointer"])?;
    let mut all = vec![first.clone()];
    for i in 1..BINARIES {
        let copy = bin.join(format!("brief-{i:03}"));
        fs::copy(&first, &copy).with_context(|| format!("copying to {copy:?}"))?;
        all.push(copy);
    }
    Ok(all)
}
