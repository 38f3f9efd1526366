//! Compiles the C BPF programs in `bpf/` with clang and leaves the objects in
//! OUT_DIR, where `src/bpf/mod.rs` embeds them.

use std::{env, path::PathBuf, process::Command};

use anyhow::{bail, Context, Result};

const PROGRAMS: &[&str] = &["wallscope"];

fn main() -> Result<()> {
    let out = PathBuf::from(env::var("OUT_DIR")?);
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    println!("cargo:rerun-if-changed=bpf");
    println!("cargo:rerun-if-env-changed=CLANG");
    for name in PROGRAMS {
        let src = format!("bpf/{name}.bpf.c");
        let obj = out.join(format!("{name}.bpf.o"));
        let status = Command::new(&clang)
            .args([
                "-g",
                "-O2",
                "-target",
                "bpf",
                "-D__TARGET_ARCH_x86",
                // v3: atomic exchange and compare-and-swap (kernel 5.12+).
                "-mcpu=v3",
                "-Wall",
                "-Werror",
            ])
            .args(["-I", "bpf", "-c", &src, "-o"])
            .arg(&obj)
            .status()
            .with_context(|| {
                format!(
                    "running `{clang}` to build {src}: install clang and libbpf-dev \
                     (`./dev deps` does it)"
                )
            })?;
        if !status.success() {
            bail!("clang failed on {src} ({status})");
        }
    }
    Ok(())
}
