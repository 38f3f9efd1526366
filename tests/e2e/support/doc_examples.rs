//! The documentation's examples as tests: every `curl` line inside a code
//! block of README.md and docs/*.md, with what the text around it says it
//! answers. The conventions (written up at the top of docs/http-api.md):
//!
//! - `<!-- doc-test: pending -->` or `<!-- doc-test: skip (reason) -->` on
//!   the line before a code block (or before a curl line inside one) leaves
//!   its examples out; a skip must give its reason.
//! - `<!-- doc-test: status NNN -->` there: the example answers NNN, not 200.
//! - A ```` ```json ```` block right after the code block is the answer of
//!   its last example: every top-level key it shows must be in the real
//!   answer (for a list, the keys of its first element).
//! - A ```` ```text ```` block there: the answer starts as its first line
//!   does, up to its first digit (pids, times and counts differ).

use std::path::Path;

/// One documented request.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    /// `FILE:LINE` of the curl line, for failure messages.
    pub place: String,
    /// Path and query after `localhost:7070`, placeholders still in.
    pub path: String,
    pub status: u16,
    pub shape: Shape,
}

/// What the documented answer looks like.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// Nothing shown: the answer must not be empty.
    Any,
    /// JSON with these keys (`list`: of the first element of an array).
    Json { list: bool, keys: Vec<String> },
    /// Text whose first line starts with this.
    Text(String),
}

/// What a code block or a line is marked with.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mark {
    Run(u16),
    Skip,
}

/// Every example of README.md and docs/*.md under `root`, or what is
/// malformed in them.
pub fn all(root: &Path) -> Result<Vec<Example>, Vec<String>> {
    let mut files = vec![root.join("README.md")];
    let mut pages: Vec<_> = std::fs::read_dir(root.join("docs"))
        .map_err(|e| vec![format!("docs/: {e}")])?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    files.extend(pages);
    let (mut examples, mut errors) = (Vec::new(), Vec::new());
    for file in files {
        let name = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        match std::fs::read_to_string(&file) {
            Ok(text) => match extract(&name, &text) {
                Ok(found) => examples.extend(found),
                Err(e) => errors.extend(e),
            },
            Err(e) => errors.push(format!("{name}: {e}")),
        }
    }
    if errors.is_empty() {
        Ok(examples)
    } else {
        Err(errors)
    }
}

/// The examples of one Markdown file named `file`.
pub fn extract(file: &str, text: &str) -> Result<Vec<Example>, Vec<String>> {
    let lines: Vec<&str> = text.lines().collect();
    let (mut examples, mut errors) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < lines.len() {
        if !is_fence(lines[i]) {
            i += 1;
            continue;
        }
        let block_mark = mark_before(file, &lines, i, &mut errors);
        let end = closing_fence(&lines, i);
        let mut found = Vec::new();
        let mut j = i + 1;
        while j < end {
            let start = j;
            let mut logical = lines[j].trim().to_string();
            while logical.ends_with('\\') && j + 1 < end {
                logical.pop();
                j += 1;
                logical.push(' ');
                logical.push_str(lines[j].trim());
            }
            j += 1;
            let command = logical.strip_prefix("$ ").unwrap_or(&logical);
            if !command.starts_with("curl ") {
                continue;
            }
            let line_mark = mark_before(file, &lines, start, &mut errors);
            let place = format!("{file}:{}", start + 1);
            let status = match line_mark.or(block_mark) {
                Some(Mark::Skip) => continue,
                Some(Mark::Run(status)) => status,
                None => 200,
            };
            match url_path(command) {
                Some(path) => found.push(Example {
                    place,
                    path,
                    status,
                    shape: Shape::Any,
                }),
                None => errors.push(format!("{place}: no localhost:7070 URL in {command:?}")),
            }
        }
        i = end + 1;
        if let (Some(last), Some((shape, next))) = (found.last_mut(), answer_after(&lines, i)) {
            last.shape = shape;
            i = next;
        }
        examples.extend(found);
    }
    if errors.is_empty() {
        Ok(examples)
    } else {
        Err(errors)
    }
}

fn is_fence(line: &str) -> bool {
    line.trim_start().starts_with("```")
}

/// Index of the fence closing the block opened at `open` (the end of the
/// file when it is not closed).
fn closing_fence(lines: &[&str], open: usize) -> usize {
    (open + 1..lines.len())
        .find(|&k| is_fence(lines[k]))
        .unwrap_or(lines.len())
}

/// The `doc-test` mark on the line before `at`, if any.
fn mark_before(file: &str, lines: &[&str], at: usize, errors: &mut Vec<String>) -> Option<Mark> {
    let line = lines.get(at.checked_sub(1)?)?.trim();
    let body = line
        .strip_prefix("<!-- doc-test:")?
        .strip_suffix("-->")?
        .trim();
    let place = format!("{file}:{at}");
    if body == "pending" {
        return Some(Mark::Skip);
    }
    if let Some(reason) = body.strip_prefix("skip") {
        let reason = reason.trim();
        let given = reason.starts_with('(') && reason.ends_with(')') && reason.len() > 2;
        if !given {
            errors.push(format!(
                "{place}: a doc-test skip needs a reason: `skip (why)`"
            ));
        }
        return Some(Mark::Skip);
    }
    if let Some(status) = body.strip_prefix("status") {
        match status.trim().parse::<u16>() {
            Ok(s) if (100..600).contains(&s) => return Some(Mark::Run(s)),
            _ => errors.push(format!("{place}: bad doc-test status {status:?}")),
        }
        return None;
    }
    errors.push(format!("{place}: unknown doc-test mark {body:?}"));
    None
}

/// The answer shown right after a code block ending before `from` (blank
/// lines between), and the index past it.
fn answer_after(lines: &[&str], from: usize) -> Option<(Shape, usize)> {
    let open = (from..lines.len()).find(|&k| !lines[k].trim().is_empty())?;
    let lang = lines[open].trim().strip_prefix("```")?.trim();
    let end = closing_fence(lines, open);
    let body = &lines[open + 1..end];
    let shape = match lang {
        "json" => json_shape(&body.join("\n")),
        "text" => Shape::Text(text_prefix(body.first()?)),
        _ => return None,
    };
    Some((shape, end + 1))
}

/// The part of a documented first line that every answer shares: up to
/// its first digit.
fn text_prefix(line: &str) -> String {
    let cut = line
        .find(|c: char| c.is_ascii_digit())
        .unwrap_or(line.len());
    line[..cut].to_string()
}

/// The top-level keys of a documented JSON answer, which may elide with
/// `...` and so need not parse: the strings followed by `:` at the depth of
/// the outer object (or of the first object in an outer array).
pub fn json_shape(doc: &str) -> Shape {
    let list = doc.trim_start().starts_with('[');
    let want = if list { 2 } else { 1 };
    let (mut depth, mut keys) = (0usize, Vec::new());
    let mut chars = doc.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                if list && depth == 1 {
                    break;
                }
            }
            '"' => {
                let mut end = at + 1;
                let mut escaped = false;
                for (k, s) in chars.by_ref() {
                    end = k;
                    if escaped {
                        escaped = false;
                    } else if s == '\\' {
                        escaped = true;
                    } else if s == '"' {
                        break;
                    }
                }
                let followed_by_colon = doc[end + 1..].trim_start().starts_with(':');
                if depth == want && followed_by_colon {
                    keys.push(doc[at + 1..end].to_string());
                }
            }
            _ => {}
        }
    }
    Shape::Json { list, keys }
}

/// The path and query of a curl command's `localhost:7070` URL.
fn url_path(command: &str) -> Option<String> {
    words(command)
        .into_iter()
        .take_while(|w| !matches!(w.as_str(), "|" | ">" | "&&" | ";") && !w.starts_with('#'))
        .find_map(|w| {
            let (_, rest) = w.split_once("localhost:7070")?;
            Some(if rest.is_empty() {
                "/".into()
            } else {
                rest.into()
            })
        })
}

/// A command line split as a shell would, for the quoting docs use.
fn words(command: &str) -> Vec<String> {
    let (mut out, mut word, mut quote, mut in_word) = (Vec::new(), String::new(), None, false);
    for c in command.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(word);
    }
    out
}

/// `path` with the docs' placeholders replaced: `PID` (also `$PID`,
/// `<pid>`) by `pid`, `SERVICE` by `service`, the name of that process.
pub fn with_placeholders(path: &str, pid: u32, service: &str) -> String {
    let pid = pid.to_string();
    path.replace("$PID", &pid)
        .replace("<pid>", &pid)
        .replace("PID", &pid)
        .replace("SERVICE", service)
}

/// What is wrong with `body`, answered with `status`, as the answer of
/// `example`; `None` when it answers as documented.
pub fn mismatch(example: &Example, status: u16, body: &[u8]) -> Option<String> {
    let what = format!("{} `{}`", example.place, example.path);
    let text = String::from_utf8_lossy(body);
    if status != example.status {
        let start: String = text.chars().take(300).collect();
        return Some(format!(
            "{what}: status {status}, documented {}: {start}",
            example.status
        ));
    }
    if body.is_empty() {
        return Some(format!("{what}: empty answer"));
    }
    match &example.shape {
        Shape::Any => None,
        Shape::Text(prefix) => {
            let first = text.lines().next().unwrap_or("");
            (!first.starts_with(prefix.as_str()))
                .then(|| format!("{what}: first line {first:?} does not start with {prefix:?}"))
        }
        Shape::Json { list, keys } => {
            let value: serde_json::Value = match serde_json::from_slice(body) {
                Ok(v) => v,
                Err(e) => return Some(format!("{what}: not JSON ({e})")),
            };
            let object = if *list {
                match value.as_array() {
                    Some(items) if items.is_empty() => return None,
                    Some(items) => &items[0],
                    None => {
                        return Some(format!("{what}: documented a list, got {}", brief(&value)))
                    }
                }
            } else {
                &value
            };
            let Some(object) = object.as_object() else {
                return Some(format!(
                    "{what}: documented an object, got {}",
                    brief(object)
                ));
            };
            let missing: Vec<&String> = keys.iter().filter(|k| !object.contains_key(*k)).collect();
            (!missing.is_empty()).then(|| format!("{what}: documented keys missing: {missing:?}"))
        }
    }
}

/// The start of `value` as JSON, for a message.
fn brief(value: &serde_json::Value) -> String {
    value.to_string().chars().take(80).collect()
}
