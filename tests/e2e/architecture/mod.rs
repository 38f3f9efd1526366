//! The crate's structure, checked from its source: modules import only
//! modules below them in one declared order, no item is re-exported under
//! a second path (`pub use crate::…`, nor a module or glob of a child),
//! every `/proc` path is in the host layer (`src/process/`) or the opener
//! of other users' files (`src/untrusted/`), only the host layer reads a process's `/proc`
//! files (every other stage asks the process table, or makes its
//! deliberate live re-checks through `process::live`), the profile model
//! and reports (`src/profile/`) never name the BPF contract, and reports
//! (`src/profile/report/`) ask the live host only through their
//! `host_facts` port, and the runtimes' callers (the symbolizer, the
//! unwind registry) name no runtime (`runtime::Runtime`). Test code (`#[cfg(test)] mod tests`, files named
//! `*tests.rs`) may read anything for ground truth and is not checked.

mod source;

use std::{fs, path::Path};

use source::{
    aliases, crate_paths, module_of, module_reexports, sources, walk, without_comments,
    without_tests,
};

/// The layers, top first: a module may use its own layer and those after
/// it. A layer is a module path; a file belongs to the longest layer its
/// path starts with.
const LAYERS: &[&str] = &[
    "api",
    "export",
    "pipeline",
    "state",
    "trace",
    "symbolize",
    // The runtimes wallscope ships, as one set.
    "runtimes",
    "profile::report",
    "jvm",
    "python",
    "perfmap",
    "otelctx",
    "unwind",
    // The one runtime interface: below its callers and its implementations.
    "runtime",
    "collect",
    "profile::model",
    "profile",
    "caps",
    "priority",
    "process",
    "held",
    "hostname",
    "token",
    // CPU budgets count their refusals with the other refusals.
    "budget::cpu",
    "untrusted",
    "bpf",
    "budget",
];

/// Where `/proc` may be named.
const PROC_HOMES: &[&str] = &["process", "untrusted"];

/// The per-pid `/proc` readers, by crate path: called from `src/process/`
/// only (which re-exports the live re-checks in `process::live`).
const PROC_READERS: &[&str] = &[
    "process::status",
    "process::tasks",
    "process::files::exec_mappings",
    "process::maps::regions",
];
/// Readers called as methods or through a `process` path (not seen as a
/// crate path).
const PROC_READER_TEXTS: &[&str] = &["ProcMaps::read(", "process::status::", "process::tasks::"];

/// The layer of a module path: the longest layer it starts with.
fn layer_of(module: &[String]) -> Option<usize> {
    LAYERS
        .iter()
        .enumerate()
        .filter(|(_, l)| {
            let parts: Vec<&str> = l.split("::").collect();
            parts.len() <= module.len() && parts.iter().zip(module).all(|(a, b)| a == b)
        })
        .max_by_key(|(_, l)| l.split("::").count())
        .map(|(i, _)| i)
}

/// Layers listed below a layer that holds them (`a::b` after `a`): a
/// module carved out of its parent so that layers between the two may use
/// it, which hides a cycle. A part listed above its parent is a sub-layer
/// (`profile::model` above `profile`): its parent uses it, not it the
/// parent.
fn carve_outs<'a>(layers: &[&'a str]) -> Vec<(&'a str, &'a str)> {
    let mut found = Vec::new();
    for (i, inner) in layers.iter().enumerate() {
        for outer in &layers[..i] {
            if inner.starts_with(&format!("{outer}::")) {
                found.push((*outer, *inner));
            }
        }
    }
    found
}

#[test]
fn no_layer_is_carved_out_of_another() {
    let found = carve_outs(LAYERS);
    assert!(
        found.is_empty(),
        "carve-outs in LAYERS (move the module instead): {found:?}"
    );
}

#[test]
fn items_have_one_path() {
    let sources = sources();
    let modules: Vec<Vec<String>> = sources.iter().map(|s| s.module.clone()).collect();
    let mut wrong = Vec::new();
    for s in &sources {
        for (line, text) in aliases(&s.text) {
            wrong.push(format!("{}:{line}: {text}", s.path.display()));
        }
        for (line, what) in module_reexports(&s.text, &s.module, &modules) {
            wrong.push(format!("{}:{line}: re-exports {what}", s.path.display()));
        }
    }
    assert!(
        wrong.is_empty(),
        "re-exports keep a second path alive (use the item where it is defined):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn modules_use_only_layers_below_them() {
    let mut wrong = Vec::new();
    for s in sources() {
        let Some(mine) = layer_of(&s.module) else {
            wrong.push(format!(
                "{}: module {} is in no layer: place it in LAYERS",
                s.path.display(),
                s.module.join("::")
            ));
            continue;
        };
        for (line, path) in crate_paths(&s.text, &s.module) {
            let Some(theirs) = layer_of(&path) else {
                continue;
            };
            if theirs < mine {
                wrong.push(format!(
                    "{}:{line}: {} ({}) uses {} ({}), a layer above it",
                    s.path.display(),
                    s.module.join("::"),
                    LAYERS[mine],
                    path.join("::"),
                    LAYERS[theirs]
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
}

#[test]
fn only_the_host_layer_names_proc() {
    let mut wrong = Vec::new();
    for s in sources() {
        if PROC_HOMES.contains(&s.module[0].as_str()) {
            continue;
        }
        for (n, line) in s.text.lines().enumerate() {
            if line.contains("\"/proc/") || line.contains("\"/proc\"") {
                wrong.push(format!("{}:{}: {}", s.path.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "/proc outside src/process and src/untrusted:\n{}",
        wrong.join("\n")
    );
}

/// The calls into per-pid `/proc` readers in `text` of `module`, by
/// line (one each): none in the host layer itself.
fn reader_calls(module: &[String], text: &str) -> Vec<(usize, String)> {
    if module.first().is_some_and(|m| m == "process") {
        return Vec::new();
    }
    let mut found = std::collections::BTreeMap::new();
    for (line, path) in crate_paths(text, module) {
        let path = path.join("::");
        let reader = |r: &&str| path == *r || path.starts_with(&format!("{r}::"));
        if PROC_READERS.iter().any(reader) {
            found.entry(line).or_insert(path);
        }
    }
    for (n, line) in text.lines().enumerate() {
        if let Some(t) = PROC_READER_TEXTS.iter().find(|t| line.contains(**t)) {
            found.entry(n + 1).or_insert_with(|| t.to_string());
        }
    }
    found.into_iter().collect()
}

#[test]
fn only_the_host_layer_reads_a_process() {
    let mut wrong = Vec::new();
    for s in sources() {
        for (line, what) in reader_calls(&s.module, &s.text) {
            wrong.push(format!("{}:{line}: {what}", s.path.display()));
        }
    }
    assert!(
        wrong.is_empty(),
        "per-pid /proc readers outside src/process (ask the process table, or          process::live for a re-check before acting on a process):\n{}",
        wrong.join("\n")
    );
}

/// What a report may name of the host layer: its types, never a reader
/// (the live host's answers come through `report::host_facts`).
const REPORT_HOST_TYPES: &[&str] = &["process::container"];

/// Where `text` (of `module`) reads the host: a `process` path other than
/// [`REPORT_HOST_TYPES`], or the file system (`fs`), each with its line.
fn host_reads(text: &str, module: &[String]) -> Vec<(usize, String)> {
    let allowed = |p: &str| {
        REPORT_HOST_TYPES
            .iter()
            .any(|t| p == *t || p.starts_with(&format!("{t}::")))
    };
    let mut found: Vec<(usize, String)> = crate_paths(text, module)
        .into_iter()
        .filter(|(_, p)| p.first().is_some_and(|f| f == "process"))
        .map(|(line, p)| (line, p.join("::")))
        .filter(|(_, p)| !allowed(p))
        .collect();
    for (n, line) in text.lines().enumerate() {
        let mut words = line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
        if words.any(|w| w == "fs") {
            found.push((n + 1, line.trim().to_string()));
        }
    }
    found
}

#[test]
fn reports_read_no_host() {
    let mut wrong = Vec::new();
    for s in sources() {
        if !s
            .module
            .starts_with(&["profile".to_string(), "report".to_string()])
        {
            continue;
        }
        for (line, what) in host_reads(&s.text, &s.module) {
            wrong.push(format!("{}:{line}: {what}", s.path.display()));
        }
    }
    assert!(
        wrong.is_empty(),
        "reports reading the host (ask report::host_facts::HostFacts):\n{}",
        wrong.join("\n")
    );
}

/// The modules that call the language runtimes (through
/// `runtime::Runtime`): they name none of them.
const RUNTIME_CALLERS: &[&str] = &["symbolize", "unwind::registry", "unwind::procs"];
/// What names a runtime in code (lowercased): adding one is adding its
/// module, never a case in its callers.
const RUNTIME_NAMES: &[&str] = &["java", "jvm", "hotspot", "python", "perfmap", "perf_map"];

/// The lines of `text` naming a runtime.
fn runtime_names(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let l = l.to_lowercase();
            RUNTIME_NAMES.iter().any(|n| l.contains(n))
        })
        .map(|(n, l)| (n + 1, l.trim().to_string()))
        .collect()
}

#[test]
fn runtime_callers_name_no_runtime() {
    let mut wrong = Vec::new();
    for s in sources() {
        let caller = RUNTIME_CALLERS.iter().any(|c| {
            let parts: Vec<&str> = c.split("::").collect();
            parts.len() <= s.module.len() && parts.iter().zip(&s.module).all(|(a, b)| a == b)
        });
        if !caller {
            continue;
        }
        for (line, what) in runtime_names(&s.text) {
            wrong.push(format!("{}:{line}: {what}", s.path.display()));
        }
    }
    assert!(
        wrong.is_empty(),
        "a runtime named by its callers (ask crate::runtime::Runtimes):\n{}",
        wrong.join("\n")
    );
}

/// Where `text` (of `module`) names the BPF contract (`crate::bpf`), each
/// with its line: the profile model and its reports have their own types,
/// which the collector converts into (`collect::convert`).
fn bpf_names(text: &str, module: &[String]) -> Vec<(usize, String)> {
    crate_paths(text, module)
        .into_iter()
        .filter(|(_, p)| p.first().is_some_and(|f| f == "bpf"))
        .map(|(line, p)| (line, p.join("::")))
        .collect()
}

#[test]
fn profiles_name_no_bpf() {
    // Every file, test code too: tests build the model's rows as the
    // collector does, from the model's types.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src.join("profile"), &mut files);
    let mut wrong = Vec::new();
    for path in files {
        let module = module_of(&src, &path);
        let text = without_comments(&fs::read_to_string(&path).unwrap());
        for (line, what) in bpf_names(&text, &module) {
            wrong.push(format!("{}:{line}: {what}", path.display()));
        }
    }
    assert!(
        wrong.is_empty(),
        "the profile model and reports naming the BPF contract (use profile::model::state; convert in collect::convert):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_checks_see_what_they_check() {
    // A group, a nested group, `self` and `super` paths.
    let module = vec![
        "profile".to_string(),
        "report".to_string(),
        "threads".to_string(),
    ];
    let text = "use crate::{api::x, process::{self, tasks::Y}};\nuse super::super::model::Z;\n// crate::api::commented";
    let paths: Vec<String> = crate_paths(&without_comments(text), &module)
        .into_iter()
        .map(|(_, p)| p.join("::"))
        .collect();
    assert_eq!(
        paths,
        [
            "api::x",
            "process",
            "process::tasks::Y",
            "profile::model::Z"
        ]
    );
    assert_eq!(layer_of(&["api".into(), "queries".into()]), Some(0));
    assert_eq!(layer_of(&["nowhere".into()]), None);
    // A report naming a host reader or the file system, beside a type.
    let report: Vec<String> = vec!["profile".into(), "report".into(), "groups".into()];
    let planted = "use crate::process::{container::Container, tasks};\nlet t = std::fs::read(p);\nlet c: Container;";
    let reads: Vec<usize> = host_reads(planted, &report)
        .into_iter()
        .map(|(line, _)| line)
        .collect();
    assert_eq!(reads, [1, 2]);
    assert!(host_reads("use crate::process::container::Container;", &report).is_empty());
    let with_tests = "a\n#[cfg(test)]\nmod tests {\n\"/proc\"\n}";
    assert_eq!(without_tests(with_tests), "a");
    // Re-exports of another module's items, not a module's own face.
    let reexports = "pub use crate::a::B;\n  pub(crate) use crate::{c, d};\npub use self::x::Y;\npub use child::Z;\nuse crate::e;\npub(super) use crate::f;";
    let lines: Vec<usize> = aliases(reexports).into_iter().map(|(n, _)| n).collect();
    assert_eq!(lines, [1, 2, 6]);
    // Re-exports of modules and globs: the paths from before a split.
    let profile = vec!["profile".to_string()];
    let modules: Vec<Vec<String>> = [
        "profile::model",
        "profile::model::kind",
        "profile::report::rows",
    ]
    .iter()
    .map(|m| m.split("::").map(String::from).collect())
    .collect();
    let planted = "pub use model::{kind, *};\n\
                   pub use model::Sample;\n\
                   pub(crate) use report::{\n    rows,\n};\n\
                   pub use self::model::kind as k;\n\
                   use model::kind;";
    let found: Vec<(usize, String)> = module_reexports(planted, &profile, &modules);
    let found: Vec<(usize, &str)> = found.iter().map(|(n, p)| (*n, p.as_str())).collect();
    assert_eq!(
        found,
        [
            (1, "profile::model::kind"),
            (1, "profile::model"),
            (3, "profile::report::rows"),
            (6, "profile::model::kind")
        ]
    );
    let sibling = vec![
        "profile".to_string(),
        "model".to_string(),
        "kind".to_string(),
    ];
    assert_eq!(
        module_reexports("pub use super::super::report::rows;", &sibling, &modules).len(),
        1
    );
    // The carve-out this file once had, and a sub-layer, which is none.
    let layers = [
        "export",
        "state",
        "export::push::stats",
        "budget::cpu",
        "budget",
    ];
    assert_eq!(carve_outs(&layers), [("export", "export::push::stats")]);
    // Planted per-pid readers: a `use` group, a full path, a method, a
    // path through `process`; none through `live`, the table or in the
    // host layer.
    let jit = vec!["symbolize".to_string(), "jit".to_string()];
    let planted = "use crate::process::{status, ProcKey};\n\
                   let s = status::Status::read(pid);\n\
                   let t = crate::process::tasks::tids(pid);\n\
                   let m = ProcMaps::read(pid);\n\
                   let c = process::status::cmdline(pid, 10);\n\
                   use crate::process::files::{exec_mappings, FileKey};";
    let lines: Vec<usize> = reader_calls(&jit, planted)
        .into_iter()
        .map(|(line, _)| line)
        .collect();
    assert_eq!(lines, [1, 3, 4, 5, 6]);
    let allowed = "use crate::process::{live, files::FileKey};\n\
                   let s = live::Status::read(pid);\n\
                   let f = table.facts(key);";
    assert!(reader_calls(&jit, allowed).is_empty());
    let host = vec!["process".to_string(), "live".to_string()];
    assert!(reader_calls(&host, planted).is_empty());
    // A runtime named by a caller, in a path, a field or a type.
    let planted = "use crate::jvm::Jvms;\nlet x = 1;\nself.python.part(pid);\nlet m: PerfMaps;";
    let lines: Vec<usize> = runtime_names(planted).into_iter().map(|(n, _)| n).collect();
    assert_eq!(lines, [1, 3, 4]);
    assert!(
        runtime_names("self.runtimes.first(|r| r.anonymous(&proc, a, leaf, names))").is_empty()
    );
    // The model naming the BPF contract: a group, a full path, `super`
    // paths up to the crate root; its own state module is no violation.
    let model = vec![
        "profile".to_string(),
        "model".to_string(),
        "store".to_string(),
    ];
    let planted = "use crate::{bpf::abi::State, profile::model::state::Hist};\n\
                   let n = crate::bpf::abi::HIST_SLOTS;\n\
                   use super::super::super::bpf::abi::Stat;\n\
                   use super::state::State;";
    let lines: Vec<usize> = bpf_names(planted, &model)
        .into_iter()
        .map(|(line, _)| line)
        .collect();
    assert_eq!(lines, [1, 2, 3]);
}
