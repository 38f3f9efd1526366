//! Reading the crate's source for the structure checks: each file's
//! module path and its text without test code and comments, the crate
//! paths it names, and its re-exports.

use std::{
    fs,
    path::{Path, PathBuf},
};

/// A source file: its module path and its text without test code and
/// comments, line numbers kept.
pub(super) struct Source {
    pub(super) path: PathBuf,
    pub(super) module: Vec<String>,
    pub(super) text: String,
}

pub(super) fn sources() -> Vec<Source> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    files
        .into_iter()
        .filter(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            // The binary (main.rs, cli.rs) uses the library by its name,
            // like any user; lib.rs only declares the modules.
            let binary = ["main.rs", "cli.rs", "lib.rs"].map(|f| src.join(f));
            !name.ends_with("tests.rs") && !binary.contains(p)
        })
        .map(|path| {
            let module = module_of(&src, &path);
            let text = without_comments(&without_tests(&fs::read_to_string(&path).unwrap()));
            Source { path, module, text }
        })
        .collect()
}

/// The module path of a file below `src` (a `mod.rs` is its directory).
pub(super) fn module_of(src: &Path, path: &Path) -> Vec<String> {
    let rel = path.strip_prefix(src).unwrap().with_extension("");
    let mut module: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_str().unwrap().to_string())
        .collect();
    if module.last().is_some_and(|m| m == "mod") {
        module.pop();
    }
    module
}

pub(super) fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text before an inline `#[cfg(test)] mod tests`.
pub(super) fn without_tests(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let end = (0..lines.len())
        .find(|&i| {
            lines[i].trim() == "#[cfg(test)]"
                && lines
                    .get(i + 1)
                    .is_some_and(|l| l.trim_start().starts_with("mod tests"))
        })
        .unwrap_or(lines.len());
    lines[..end].join("\n")
}

/// Blanks `//` comments (doc comments too), keeping string literals and
/// line numbers.
pub(super) fn without_comments(text: &str) -> String {
    text.lines()
        .map(|line| {
            let mut in_str = false;
            let bytes = line.as_bytes();
            for i in 0..bytes.len() {
                match bytes[i] {
                    b'"' if i == 0 || bytes[i - 1] != b'\\' => in_str = !in_str,
                    b'/' if !in_str && bytes.get(i + 1) == Some(&b'/') => return &line[..i],
                    _ => {}
                }
            }
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The crate paths a text names, each with its line: `crate::a::b` and
/// every path of a `crate::{a::b, c::{d, e}}` group, and `super::` paths
/// resolved against `module`.
pub(super) fn crate_paths(text: &str, module: &[String]) -> Vec<(usize, Vec<String>)> {
    let mut found = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        let start = if rest.starts_with(b"crate::") && !ident_before(bytes, i) {
            Some((Vec::new(), "crate::".len()))
        } else if rest.starts_with(b"super::") && !ident_before(bytes, i) {
            // `super` is the module's parent (a `mod.rs` is its directory).
            let mut base: Vec<String> = module.to_vec();
            let mut len = 0;
            while bytes[i + len..].starts_with(b"super::") {
                len += "super::".len();
                base.pop();
            }
            Some((base, len))
        } else {
            None
        };
        let Some((base, len)) = start else {
            i += 1;
            continue;
        };
        let line = text[..i].matches('\n').count() + 1;
        let (paths, used) = parse_tree(&text[i + len..]);
        for p in paths {
            let mut full = base.clone();
            full.extend(p);
            found.push((line, full));
        }
        i += len + used.max(1);
    }
    found
}

pub(super) fn ident_before(bytes: &[u8], i: usize) -> bool {
    i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b':')
}

/// Parses `a::b::c` or `a::{b, c::d}` at the start of `s`: the paths and
/// the bytes used.
pub(super) fn parse_tree(s: &str) -> (Vec<Vec<String>>, usize) {
    let mut at = 0;
    let paths = tree(s.as_bytes(), &mut at);
    (paths, at)
}

pub(super) fn skip_space(b: &[u8], at: &mut usize) {
    while *at < b.len() && b[*at].is_ascii_whitespace() {
        *at += 1;
    }
}

pub(super) fn tree(b: &[u8], at: &mut usize) -> Vec<Vec<String>> {
    skip_space(b, at);
    if b.get(*at) == Some(&b'{') {
        *at += 1;
        let mut paths = Vec::new();
        loop {
            skip_space(b, at);
            match b.get(*at) {
                None => return paths,
                Some(b'}') => {
                    *at += 1;
                    return paths;
                }
                Some(b',') => *at += 1,
                // A glob: every item of the path so far.
                Some(b'*') => {
                    *at += 1;
                    paths.push(Vec::new());
                }
                Some(c) if c.is_ascii_alphanumeric() || *c == b'_' || *c == b'{' => {
                    paths.extend(tree(b, at));
                    // `as name`, or anything else up to the next item.
                    while *at < b.len() && b[*at] != b',' && b[*at] != b'}' {
                        *at += 1;
                    }
                }
                Some(_) => *at += 1,
            }
        }
    }
    let start = *at;
    while *at < b.len() && (b[*at].is_ascii_alphanumeric() || b[*at] == b'_') {
        *at += 1;
    }
    if *at == start {
        return vec![Vec::new()];
    }
    let ident = String::from_utf8_lossy(&b[start..*at]).into_owned();
    if ident == "self" {
        return vec![Vec::new()];
    }
    if b[*at..].starts_with(b"::") {
        *at += 2;
        return tree(b, at)
            .into_iter()
            .map(|mut p| {
                p.insert(0, ident.clone());
                p
            })
            .collect();
    }
    vec![vec![ident]]
}

/// The lines of a text that re-export another module's items under a
/// second path (`pub use crate::…`, any `pub(…)` too), with their numbers.
/// A module's curated face (`pub use child::…`) is not one.
pub(super) fn aliases(text: &str) -> Vec<(usize, &str)> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| {
            let Some(rest) = line.trim_start().strip_prefix("pub") else {
                return false;
            };
            let rest = match rest.strip_prefix('(') {
                Some(vis) => vis.split_once(')').map_or("", |(_, r)| r),
                None => rest,
            };
            rest.starts_with(char::is_whitespace) && rest.trim_start().starts_with("use crate::")
        })
        .map(|(n, line)| (n + 1, line.trim()))
        .collect()
}

/// The re-exports of a text (of `module`) that give a module of the crate
/// a second path, or every item of one (a glob, `pub use child::*`), with
/// their lines: `pub use model::{kind, *}` in `profile` keeps
/// `profile::kind` beside `profile::model::kind`. `modules` are the
/// crate's modules. Naming a private child's items (a module's curated
/// face) is none.
pub(super) fn module_reexports(
    text: &str,
    module: &[String],
    modules: &[Vec<String>],
) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut offset = 0;
    for (n, line) in text.lines().enumerate() {
        let start = offset;
        offset += line.len() + 1;
        let Some(rest) = line.trim_start().strip_prefix("pub") else {
            continue;
        };
        let rest = match rest.strip_prefix('(') {
            Some(vis) => vis.split_once(')').map_or("", |(_, r)| r),
            None => rest,
        };
        let Some(used) = rest.trim_start().strip_prefix("use ") else {
            continue;
        };
        let at = start + line.len() - used.len();
        let mut tail = text[at..].trim_start();
        let mut base: Vec<String> = module.to_vec();
        if let Some(t) = tail.strip_prefix("crate::") {
            base.clear();
            tail = t;
        }
        while let Some(t) = tail.strip_prefix("super::") {
            base.pop();
            tail = t;
        }
        tail = tail.strip_prefix("self::").unwrap_or(tail);
        for p in parse_tree(tail).0 {
            let mut full = base.clone();
            full.extend(p);
            if !module.starts_with(&full) && modules.contains(&full) {
                found.push((n + 1, full.join("::")));
            }
        }
    }
    found
}
