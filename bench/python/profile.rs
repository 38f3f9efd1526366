//! Profiles by function (inclusive and leaf shares) from py-spy's raw
//! stacks, wallscope's folded stacks and the workload's own account, and
//! how two of them compare.

use super::*;

/// Per-function shares (0..1) of one profile, by [`key`].
#[derive(Default)]
pub(super) struct Profile {
    /// The main thread's samples (py-spy), µs (wallscope) or ns (truth).
    pub(super) total: f64,
    /// Other threads' samples or µs: not in the shares.
    pub(super) other: f64,
    /// Of stacks containing the function.
    pub(super) inclusive: BTreeMap<String, f64>,
    /// Of stacks whose innermost Python frame it is.
    pub(super) leaf: BTreeMap<String, f64>,
    /// The longest name seen per key (a qualname when there is one).
    pub(super) names: BTreeMap<String, String>,
}

impl Profile {
    /// From stacks of Python qualnames (root first), their weights and
    /// whether they are the main thread's: only those count, the others'
    /// weight is kept in `other`.
    pub(super) fn from_stacks(
        stacks: impl IntoIterator<Item = (Vec<String>, f64, bool)>,
    ) -> Profile {
        let mut p = Profile::default();
        for (frames, weight, main) in stacks {
            if !main {
                p.other += weight;
                continue;
            }
            p.total += weight;
            let keys: BTreeSet<String> = frames.iter().map(|f| p.name(f)).collect();
            for k in keys {
                *p.inclusive.entry(k).or_default() += weight;
            }
            if let Some(leaf) = frames.last() {
                *p.leaf.entry(key(leaf)).or_default() += weight;
            }
        }
        p.normalise();
        p
    }

    pub(super) fn name(&mut self, qualname: &str) -> String {
        let k = key(qualname);
        let name = self.names.entry(k.clone()).or_default();
        if qualname.len() > name.len() {
            *name = qualname.to_string();
        }
        k
    }

    pub(super) fn normalise(&mut self) {
        let total = self.total.max(1e-9);
        self.inclusive.values_mut().for_each(|v| *v /= total);
        self.leaf.values_mut().for_each(|v| *v /= total);
    }

    /// The [`TOP`] keys by inclusive share (ties by name).
    pub(super) fn top(&self) -> Vec<String> {
        let mut all: Vec<(&String, &f64)> = self.inclusive.iter().collect();
        all.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
        all.into_iter().take(TOP).map(|(k, _)| k.clone()).collect()
    }

    pub(super) fn has_frames(&self) -> bool {
        !self.inclusive.is_empty()
    }
}

/// What functions are matched by: the qualname's innermost component
/// (`outer_a.<locals>.inner_a` -> `inner_a`), as py-spy and 3.10 name them.
pub(super) fn key(qualname: &str) -> String {
    qualname.rsplit('.').next().unwrap_or(qualname).to_string()
}

/// A wallscope frame's Python qualname: frames are named
/// `qualname (file.py:first_line)_[py]` (3.10: `co_name` in place of the
/// qualname), so `_[py]` and then the place are cut off; other frames
/// (native, kernel, `[GIL]`) are not Python functions. wallscope's own
/// markers (`[unknown]_[py]`, `[more Python frames]_[py]`) have no place
/// and are kept as they are.
pub(super) fn wallscope_frame(frame: &str) -> Option<&str> {
    Some(strip_place(frame.strip_suffix("_[py]")?))
}

/// A py-spy raw frame's qualname: `qualname (file.py:line)`.
pub(super) fn pyspy_frame(frame: &str) -> &str {
    strip_place(frame)
}

/// `name (place)` -> `name`; anything else unchanged. A qualname has no
/// ` (`, a file name may.
pub(super) fn strip_place(frame: &str) -> &str {
    match frame.split_once(" (") {
        Some((name, place)) if place.ends_with(')') => name,
        _ => frame,
    }
}

/// Folded text (`a;b;c N` lines) as frames and weights.
pub(super) fn folded(text: &str) -> impl Iterator<Item = (Vec<&str>, f64)> {
    text.lines().filter_map(|line| {
        let (stack, n) = line.rsplit_once(' ')?;
        Some((stack.split(';').collect(), n.trim().parse().ok()?))
    })
}

/// py-spy's `--threads` output: each stack under `thread (ID): NAME`, ID
/// the kernel tid (3.11+: the main thread's is the pid) or, where py-spy
/// has no tid, `0x` and the pthread id; Python's name for the main thread
/// is `MainThread`.
pub(super) fn pyspy_profile(text: &str, pid: u32) -> Profile {
    let by_tid = format!("thread ({pid})");
    Profile::from_stacks(folded(text).map(|(frames, n)| {
        let (main, frames) = match frames.split_first() {
            Some((t, rest)) if t.starts_with("thread (") => {
                (t.ends_with("): MainThread") || t.starts_with(&by_tid), rest)
            }
            _ => (true, &frames[..]),
        };
        let py = frames.iter().map(|f| pyspy_frame(f).to_string());
        (py.collect(), n, main)
    }))
}

/// wallscope's `group=thread` output: each stack under `NAME [tid T]`;
/// the main thread's tid is the pid.
pub(super) fn wallscope_profile(text: &str, pid: u32) -> Profile {
    let main_thread = format!("[tid {pid}]");
    Profile::from_stacks(folded(text).map(|(frames, n)| {
        let main = frames.iter().take(3).any(|f| f.ends_with(&main_thread));
        let py = frames.iter().filter_map(|f| wallscope_frame(f));
        (py.map(str::to_string).collect(), n, main)
    }))
}

/// The workload's truth over a window: the difference of two of its
/// cumulative JSON reports.
pub(super) fn truth_profile(before: &Value, after: &Value) -> Result<Profile> {
    let ns = |v: &Value, field: &str, name: &str| v[field][name].as_f64().unwrap_or(0.0);
    let total = after["total_ns"].as_f64().context("no total_ns")?
        - before["total_ns"].as_f64().unwrap_or(0.0);
    ensure!(total > 0.0, "the workload used no CPU in the window");
    let mut p = Profile {
        total,
        ..Profile::default()
    };
    let names = after["inclusive"].as_object().context("no inclusive")?;
    for name in names.keys() {
        let k = p.name(name);
        let incl = ns(after, "inclusive", name) - ns(before, "inclusive", name);
        let own = ns(after, "functions", name) - ns(before, "functions", name);
        p.inclusive.insert(k.clone(), incl);
        p.leaf.insert(k, own);
    }
    p.normalise();
    Ok(p)
}

/// The normalisers on the frame forms each tool writes.
pub(super) fn check_normalisers() -> Result<()> {
    let ws = [
        (
            "outer_a.<locals>.inner_a (shares.py:57)_[py]",
            Some("inner_a"),
        ),
        ("inner_a (shares.py:57)_[py]", Some("inner_a")),
        ("Worker.crunch (shares.py:97)_[py]", Some("crunch")),
        (
            "main.<locals>.<lambda> (shares.py:201)_[py]",
            Some("<lambda>"),
        ),
        ("<module> (shares.py:1)_[py]", Some("<module>")),
        ("f (a (b).py:3)_[py]", Some("f")),
        ("[unknown]_[py]", Some("[unknown]")),
        ("[GIL]", None),
        ("_PyEval_EvalFrameDefault", None),
        ("MainThread [tid 42]", None),
    ];
    for (frame, want) in ws {
        let got = wallscope_frame(frame).map(key);
        ensure!(got.as_deref() == want, "wallscope {frame:?}: {got:?}");
    }
    let ps = [
        ("Worker.crunch (shares.py:97)", "crunch"),
        ("<module> (shares.py:234)", "<module>"),
        ("inner_a (/a b/shares.py:70)", "inner_a"),
        ("f (/tmp/a (b).py:3)", "f"),
    ];
    for (frame, want) in ps {
        let got = key(pyspy_frame(frame));
        ensure!(got == want, "py-spy {frame:?}: {got:?}");
    }
    Ok(())
}

// ---------------------------------------------------------------- accuracy

/// Functions the two top-10s share.
pub(super) fn overlap(a: &Profile, b: &Profile) -> usize {
    let b = b.top();
    a.top().iter().filter(|k| b.contains(k)).count()
}

/// Largest difference in inclusive share (points) over `keys`; `None` if
/// either profile has no Python frames.
pub(super) fn max_diff(a: &Profile, b: &Profile, keys: &[String]) -> Option<f64> {
    if !a.has_frames() || !b.has_frames() {
        return None;
    }
    let share = |p: &Profile, k: &String| p.inclusive.get(k).copied().unwrap_or(0.0);
    let diffs = keys
        .iter()
        .map(|k| (share(a, k) - share(b, k)).abs() * 100.0);
    diffs.reduce(f64::max)
}

// ---------------------------------------------------------------- overhead

/// Share (%) of a profile's weight on other threads than main.
pub(super) fn other_pct(p: &Profile) -> f64 {
    p.other * 100.0 / (p.total + p.other).max(1e-9)
}
