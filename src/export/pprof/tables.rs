//! The deduplicated tables of a pprof profile: strings, functions,
//! locations and mappings, each id handed out once and never 0 (pprof
//! reserves 0 for "none").

use std::collections::HashMap;

use super::proto::{Function, Label, Line, Location, Mapping, Profile};

/// What a frame's suffix says it is. pprof has no frame kinds: the suffix
/// leaves the function name, and the kind becomes the frame's mapping.
/// Declared in mapping id order: Native first, since pprof takes the
/// first mapping for the main binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::VariantArray)]
pub enum FrameKind {
    Native,
    Kernel,
    JavaInterpreted,
    JavaC1,
    JavaJit,
    JavaInlined,
    /// Frames wallscope adds (`[unattributed]`, `[wakes …]`, `[irq]`).
    Synthetic,
}

impl FrameKind {
    /// Every kind, in mapping id order.
    const ALL: &'static [FrameKind] = <FrameKind as strum::VariantArray>::VARIANTS;

    /// The suffix wallscope's frames carry for this kind.
    fn suffix(self) -> Option<&'static str> {
        match self {
            FrameKind::Kernel => Some("_[k]"),
            FrameKind::JavaInterpreted => Some("_[0]"),
            FrameKind::JavaC1 => Some("_[1]"),
            FrameKind::JavaJit => Some("_[j]"),
            FrameKind::JavaInlined => Some("_[i]"),
            FrameKind::Synthetic | FrameKind::Native => None,
        }
    }

    /// The mapping's file name: `[kernel.kallsyms]` as perf and pprof name
    /// the kernel; the others say what kind of code it is.
    pub fn mapping_name(self) -> &'static str {
        match self {
            FrameKind::Kernel => "[kernel.kallsyms]",
            FrameKind::JavaInterpreted => "[java interpreted]",
            FrameKind::JavaC1 => "[java c1]",
            FrameKind::JavaJit => "[java jit]",
            FrameKind::JavaInlined => "[java inlined]",
            FrameKind::Synthetic => "[wallscope]",
            FrameKind::Native => "[native]",
        }
    }

    /// The kind whose mapping is named `name` ([`FrameKind::mapping_name`]).
    pub fn of_mapping(name: &str) -> Option<FrameKind> {
        FrameKind::ALL
            .iter()
            .copied()
            .find(|k| k.mapping_name() == name)
    }

    /// The kind of `frame` and its name without the suffix.
    pub fn split(frame: &str) -> (FrameKind, &str) {
        for &kind in FrameKind::ALL {
            if let Some(name) = kind.suffix().and_then(|s| frame.strip_suffix(s)) {
                return (kind, name);
            }
        }
        // Bracketed names are wallscope's own ([unknown] aside: that is a
        // native frame nobody could name).
        if frame.starts_with('[') && frame.ends_with(']') && frame != "[unknown]" {
            (FrameKind::Synthetic, frame)
        } else {
            (FrameKind::Native, frame)
        }
    }

    fn mapping_id(self) -> u64 {
        FrameKind::ALL.iter().position(|k| *k == self).unwrap_or(0) as u64 + 1
    }
}

/// A profile's tables as they fill.
pub struct Tables {
    strings: HashMap<String, i64>,
    string_table: Vec<String>,
    functions: HashMap<i64, u64>,
    function_table: Vec<Function>,
    locations: HashMap<String, u64>,
    location_table: Vec<Location>,
    used_mappings: [bool; FrameKind::ALL.len()],
}

impl Default for Tables {
    fn default() -> Self {
        Tables {
            strings: HashMap::from([(String::new(), 0)]),
            string_table: vec![String::new()],
            functions: HashMap::new(),
            function_table: Vec::new(),
            locations: HashMap::new(),
            location_table: Vec::new(),
            used_mappings: [false; FrameKind::ALL.len()],
        }
    }
}

impl Tables {
    /// The index of `s` in the string table.
    pub fn string(&mut self, s: &str) -> i64 {
        if let Some(i) = self.strings.get(s) {
            return *i;
        }
        let i = self.string_table.len() as i64;
        self.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    /// The location id of one frame (one location per distinct frame).
    pub fn location(&mut self, frame: &str) -> u64 {
        if let Some(id) = self.locations.get(frame) {
            return *id;
        }
        let (kind, name) = FrameKind::split(frame);
        let name = self.string(name);
        let next_function = self.function_table.len() as u64 + 1;
        let function_id = *self.functions.entry(name).or_insert(next_function);
        if function_id == next_function {
            self.function_table.push(Function {
                id: function_id,
                name,
                system_name: name,
                filename: 0,
                start_line: 0,
            });
        }
        self.used_mappings[kind.mapping_id() as usize - 1] = true;
        let id = self.location_table.len() as u64 + 1;
        self.location_table.push(Location {
            id,
            mapping_id: kind.mapping_id(),
            address: 0,
            line: vec![Line {
                function_id,
                line: 0,
            }],
            is_folded: false,
        });
        self.locations.insert(frame.to_string(), id);
        id
    }

    /// A string label.
    pub fn label(&mut self, key: &str, value: &str) -> Label {
        Label {
            key: self.string(key),
            str: self.string(value),
            num: 0,
            num_unit: 0,
        }
    }

    /// A number label (pids and tids: `-tagfocus=pid=42` matches exactly).
    pub fn number(&mut self, key: &str, value: u64) -> Label {
        Label {
            key: self.string(key),
            str: 0,
            num: value as i64,
            num_unit: 0,
        }
    }

    /// Moves the tables into `profile`, with a mapping for each kind of
    /// frame used.
    pub fn fill(mut self, profile: &mut Profile) {
        for &kind in FrameKind::ALL {
            if !self.used_mappings[kind.mapping_id() as usize - 1] {
                continue;
            }
            let filename = self.string(kind.mapping_name());
            profile.mapping.push(Mapping {
                id: kind.mapping_id(),
                filename,
                has_functions: true,
                ..Mapping::default()
            });
        }
        profile.function = self.function_table;
        profile.location = self.location_table;
        profile.string_table = self.string_table;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_become_mappings() {
        assert_eq!(
            FrameKind::split("schedule_[k]"),
            (FrameKind::Kernel, "schedule")
        );
        assert_eq!(
            FrameKind::split("Inline.work_[i]"),
            (FrameKind::JavaInlined, "Inline.work")
        );
        assert_eq!(FrameKind::split("main"), (FrameKind::Native, "main"));
        assert_eq!(
            FrameKind::split("[unknown]"),
            (FrameKind::Native, "[unknown]")
        );
        assert_eq!(
            FrameKind::split("[unattributed]"),
            (FrameKind::Synthetic, "[unattributed]")
        );
        for &kind in FrameKind::ALL {
            assert_eq!(FrameKind::of_mapping(kind.mapping_name()), Some(kind));
        }
    }

    #[test]
    fn ids_are_shared_and_never_zero() {
        let mut t = Tables::default();
        let a = t.location("read_[k]");
        let b = t.location("read");
        assert_eq!(t.location("read_[k]"), a);
        assert!(a != 0 && b != 0 && a != b);
        assert_eq!(t.string(""), 0);
        let mut p = Profile::default();
        t.fill(&mut p);
        assert_eq!(p.function.len(), 1, "one function `read`, two locations");
        assert_eq!(p.mapping.len(), 2);
        assert!(p.mapping.iter().all(|m| m.id != 0 && m.has_functions));
        assert_eq!(p.string_table[0], "");
    }
}
