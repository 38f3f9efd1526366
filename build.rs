//! Compiles the C BPF programs in `bpf/` with clang and leaves the objects in
//! OUT_DIR, where `src/bpf/mod.rs` embeds them; generates the Rust side of
//! the BPF contract from `bpf/wallscope.h`: its types, enums and constants
//! with bindgen (`abi.rs`), and the `Stat` enum from its WS_STATS list
//! (`stats.rs`).

use std::{env, fmt::Write as _, fs, path::PathBuf, process::Command};

use anyhow::{bail, Context, Result};

const PROGRAMS: &[&str] = &["wallscope"];
const HEADER: &str = "bpf/wallscope.h";

fn main() -> Result<()> {
    let out = PathBuf::from(env::var("OUT_DIR")?);
    println!("cargo:rerun-if-changed=bpf");
    println!("cargo:rerun-if-env-changed=CLANG");
    compile_programs(&out)?;
    generate_abi(&out)?;
    let header = fs::read_to_string(HEADER).with_context(|| format!("reading {HEADER}"))?;
    fs::write(out.join("stats.rs"), stats_rs(&header)?)?;
    Ok(())
}

/// The `-D__TARGET_ARCH_*` bpf_tracing.h wants for the target's registers.
fn target_arch_define() -> Result<&'static str> {
    let arch = env::var("CARGO_CFG_TARGET_ARCH")?;
    Ok(match arch.as_str() {
        "x86_64" => "-D__TARGET_ARCH_x86",
        "aarch64" => "-D__TARGET_ARCH_arm64",
        other => bail!(
            "no BPF target architecture for Rust target arch {other}: build.rs knows \
             x86_64 and aarch64 (and bpf/arch.bpf.h says which the programs support)"
        ),
    })
}

fn compile_programs(out: &std::path::Path) -> Result<()> {
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    let arch = target_arch_define()?;
    for name in PROGRAMS {
        let src = format!("bpf/{name}.bpf.c");
        let obj = out.join(format!("{name}.bpf.o"));
        let status = Command::new(&clang)
            .args([
                "-g", "-O2", "-target", "bpf", arch,
                // v3: atomic exchange and compare-and-swap (kernel 5.12+).
                "-mcpu=v3", "-Wall", "-Werror",
            ])
            .args(["-I", "bpf", "-c", &src, "-o"])
            .arg(&obj)
            .status()
            .with_context(|| {
                format!(
                    "running `{clang}` to build {src}: install clang and libbpf-dev \
                     (`scripts/deps.sh` does it)"
                )
            })?;
        if !status.success() {
            bail!("clang failed on {src} ({status})");
        }
    }
    Ok(())
}

/// Rust types, enums and constants of `wallscope.h`, with bindgen's
/// compile-time layout assertions (size, alignment, every field offset).
fn generate_abi(out: &std::path::Path) -> Result<()> {
    let rustified = [
        "ws_state",
        "ws_stat",
        "ws_control",
        "ws_hist_kind",
        "ws_cfa_reg",
        "ws_rbp_rule",
        "ws_walk_kind",
        "ws_proc_event_kind",
        "ws_trace_kind",
        "ws_trace_target",
        "ws_py_entry",
    ];
    let mut builder = bindgen::Builder::default()
        .header(HEADER)
        .allowlist_type("ws_.*")
        .allowlist_var("WS_.*")
        .derive_default(true)
        .derive_debug(true)
        .derive_copy(true)
        .derive_hash(true)
        .derive_partialeq(true)
        .derive_eq(true)
        .layout_tests(true)
        .use_core()
        .generate_comments(true);
    for e in rustified {
        builder = builder.rustified_enum(e);
    }
    let bindings = builder.generate().map_err(|err| {
        anyhow::anyhow!(
            "bindgen on {HEADER}: {err} (bindgen needs libclang: install libclang-dev, \
             `scripts/deps.sh` does it)"
        )
    })?;
    bindings
        .write_to_file(out.join("abi.rs"))
        .context("writing abi.rs")?;
    Ok(())
}

/// One counter of WS_STATS: `X(NAME, "metric", EVENT|LOSS) /* doc */`.
struct StatDef {
    c_name: String,
    metric: String,
    loss: bool,
    doc: String,
}

/// The entries of `#define WS_STATS(X)`, in order.
fn parse_stats(header: &str) -> Result<Vec<StatDef>> {
    let mut lines = header
        .lines()
        .skip_while(|l| !l.starts_with("#define WS_STATS(X)"));
    if lines.next().is_none() {
        bail!("{HEADER}: no `#define WS_STATS(X)`");
    }
    let mut stats = Vec::new();
    for line in lines {
        let continued = line.trim_end().ends_with('\\');
        let entry = line.trim().trim_end_matches('\\').trim();
        let Some(args) = entry.strip_prefix("X(") else {
            bail!("{HEADER}: WS_STATS entry `{line}` is not X(...)");
        };
        let (args, rest) = args
            .split_once(')')
            .with_context(|| format!("{HEADER}: `{line}`"))?;
        let parts: Vec<&str> = args.split(',').map(str::trim).collect();
        let [c_name, metric, kind] = parts[..] else {
            bail!("{HEADER}: `{line}` needs X(NAME, \"metric\", EVENT|LOSS)");
        };
        let loss = match kind {
            "LOSS" => true,
            "EVENT" => false,
            _ => bail!("{HEADER}: `{line}`: kind is EVENT or LOSS"),
        };
        let doc = rest
            .trim()
            .strip_prefix("/*")
            .and_then(|d| d.strip_suffix("*/"))
            .unwrap_or("")
            .trim();
        stats.push(StatDef {
            c_name: c_name.to_string(),
            metric: metric.trim_matches('"').to_string(),
            loss,
            doc: doc.to_string(),
        });
        if !continued {
            break;
        }
    }
    Ok(stats)
}

/// `USER_STACK_FAILED` -> `UserStackFailed`.
fn camel(c_name: &str) -> String {
    c_name
        .split('_')
        .map(|w| {
            let mut cs = w.chars();
            cs.next()
                .map(|f| f.to_string() + &cs.as_str().to_lowercase())
                .unwrap_or_default()
        })
        .collect()
}

/// The Rust `Stat`: variants valued by the generated `ws_stat`, so the C
/// enum and this one cannot disagree.
fn stats_rs(header: &str) -> Result<String> {
    let stats = parse_stats(header)?;
    let mut s = String::new();
    s += "/// Indexes of the per-CPU `stats` array (`enum ws_stat`, from WS_STATS\n";
    s += "/// in bpf/wallscope.h).\n";
    s += "#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]\n#[repr(u32)]\npub enum Stat {\n";
    for st in &stats {
        writeln!(s, "    /// {}", st.doc.replace('`', "'"))?;
        writeln!(
            s,
            "    {} = ws_stat::WS_STAT_{} as u32,",
            camel(&st.c_name),
            st.c_name
        )?;
    }
    s += "}\n\nimpl Stat {\n";
    s += "    /// Number of counters (`WS_STAT_COUNT`).\n";
    s += "    pub const COUNT: usize = ws_stat::WS_STAT_COUNT as usize;\n";
    s += "    /// Every counter, in enum order.\n";
    s += "    pub const ALL: [Stat; Stat::COUNT] = [\n";
    for st in &stats {
        writeln!(s, "        Stat::{},", camel(&st.c_name))?;
    }
    s += "    ];\n\n";
    s += "    /// snake_case name used in `/healthz` and metrics.\n";
    s += "    pub fn name(self) -> &'static str {\n        match self {\n";
    for st in &stats {
        writeln!(
            s,
            "            Stat::{} => {:?},",
            camel(&st.c_name),
            st.metric
        )?;
    }
    s += "        }\n    }\n\n";
    s += "    /// Whether the counter counts something lost or degraded (as opposed\n";
    s += "    /// to events seen).\n";
    s += "    pub fn is_loss(self) -> bool {\n        match self {\n";
    for st in &stats {
        writeln!(s, "            Stat::{} => {},", camel(&st.c_name), st.loss)?;
    }
    s += "        }\n    }\n}\n";
    Ok(s)
}
