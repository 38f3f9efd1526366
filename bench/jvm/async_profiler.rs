//! async-profiler, the reference the bench compares wallscope against:
//! fetching its agent library (the Maven Central jar, downloaded once into
//! `target/bench-tools/`, SHA-256 checked, the Linux x64 `.so` extracted and
//! checked to be ELF) and reading what it wrote during a run (its `loop`
//! files of the steady window, parsed into a `Profile`).

use crate::common::{check, find_tool, ROOT};
use crate::profile::{parse, Profile, Tool};
use crate::WARMUP_S;
use anyhow::{ensure, Context, Result};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub const AP_VERSION: &str = "4.6";
/// SHA-256 of `async-profiler-4.6.jar` as published on Maven Central.
const AP_SHA256: &str = "a5d3d9f4582c2033fa9db518046e73ef97219801f3e7542b82e3e09261ebe493";
const AP_SO: &str = "linux-x64/libasyncProfiler.so";

/// async-profiler's agent library, downloaded (checksum checked) and
/// extracted into `target/bench-tools/` the first time.
pub fn async_profiler() -> Result<PathBuf> {
    let dir = Path::new(ROOT)
        .join("target/bench-tools")
        .join(format!("async-profiler-{AP_VERSION}"));
    let so = dir.join(AP_SO);
    if is_elf(&so) {
        return Ok(so);
    }
    fs::create_dir_all(&dir)?;
    let jar = dir.join(format!("async-profiler-{AP_VERSION}.jar"));
    if !jar.exists() || sha256(&jar)? != AP_SHA256 {
        let url = format!(
            "https://repo1.maven.org/maven2/tools/profiler/async-profiler/\
             {AP_VERSION}/async-profiler-{AP_VERSION}.jar"
        );
        eprintln!("downloading {url}");
        let part = dir.join("download.part");
        download(&url, &part).with_context(|| format!("downloading {url}"))?;
        let sum = sha256(&part)?;
        ensure!(
            sum == AP_SHA256,
            "{url}: SHA-256 {sum}, expected {AP_SHA256}"
        );
        fs::rename(&part, &jar)?;
    }
    let mut magic = [0u8; 4];
    fs::File::open(&jar)?.read_exact(&mut magic)?;
    ensure!(&magic == b"PK\x03\x04", "{}: not a zip", jar.display());
    let jar_tool = find_tool("jar", "openjdk-17-jdk-headless")?;
    let list = Command::new(&jar_tool).arg("tf").arg(&jar).output()?;
    let list = String::from_utf8_lossy(&list.stdout);
    ensure!(
        list.lines().any(|l| l == AP_SO),
        "{} has no {AP_SO}",
        jar.display()
    );
    check(
        Command::new(&jar_tool)
            .arg("xf")
            .arg(&jar)
            .arg(AP_SO)
            .current_dir(&dir),
    )?;
    ensure!(is_elf(&so), "{}: not an ELF file", so.display());
    Ok(so)
}

/// Downloads `url` to `dest` with curl, which trusts the system's CA store
/// (proxies that re-sign TLS), or with ureq (webpki roots) without curl.
fn download(url: &str, dest: &Path) -> Result<()> {
    if let Ok(curl) = find_tool("curl", "curl") {
        let args = ["-fsSL", "--retry", "2", "--max-time", "300", "-o"];
        return check(Command::new(curl).args(args).arg(dest).arg(url));
    }
    let response = ureq::get(url).timeout(Duration::from_secs(300)).call()?;
    let mut out = fs::File::create(dest)?;
    std::io::copy(&mut response.into_reader(), &mut out)?;
    Ok(())
}

fn is_elf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    let read = fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic));
    read.is_ok() && &magic == b"\x7fELF"
}

fn sha256(path: &Path) -> Result<String> {
    let out = Command::new(find_tool("sha256sum", "coreutils")?)
        .arg(path)
        .output()?;
    ensure!(out.status.success(), "sha256sum {} failed", path.display());
    let out = String::from_utf8_lossy(&out.stdout);
    Ok(out
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

/// async-profiler's profile of the steady window: its loop files 1..=N.
pub fn ap_profile(dir: &Path, steady_s: u64, messages: &[String]) -> Result<Profile, String> {
    if let Some(error) = messages.iter().find(|m| m.starts_with("[ERROR]")) {
        return Err(error.clone());
    }
    let mut text = String::new();
    for n in 1..=steady_s / WARMUP_S {
        let file = dir.join(format!("ap-{n}.collapsed"));
        match fs::read_to_string(&file) {
            Ok(t) => text += &t,
            Err(e) => {
                let got = fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
                return Err(format!(
                    "{}: {e} ({got} files written; messages: {messages:?})",
                    file.display()
                ));
            }
        }
    }
    let profile = parse(&text, Tool::AsyncProfiler);
    if profile.java == 0.0 {
        return Err(format!(
            "no Java frames in {} rows (messages: {messages:?})",
            profile.rows
        ));
    }
    Ok(profile)
}
