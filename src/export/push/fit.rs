//! Keeping a profile within what Pyroscope takes: 16,000 samples
//! (`max_profile_stacktrace_samples`) and 4 MiB (`max_profile_size_bytes`,
//! which Pyroscope checks on the decompressed profile).
//! The lightest samples go first; their values move to one `[trimmed]`
//! sample per set of sample labels (per state), so totals, and each
//! state's total, are kept.

use std::collections::{HashMap, HashSet};

use prost::Message as _;

use crate::export::pprof::proto::{Function, Label, Line, Location, Profile, Sample};

/// Most samples a pushed profile holds.
pub const MAX_SAMPLES: usize = 16_000;
/// Largest pushed profile, encoded, before compression.
pub const MAX_BYTES: usize = 4 << 20;
/// The frame that carries the time of trimmed samples.
pub const TRIMMED: &str = "[trimmed]";
/// Fewest samples a profile is trimmed to for size: past it a profile
/// still over [`MAX_BYTES`] (giant frame names) is sent as it is and the
/// server says no.
const MIN_SAMPLES: usize = 64;

/// What fitting a profile took out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trimmed {
    /// Samples merged into `[trimmed]` ones.
    pub samples: u64,
    /// Their nanoseconds (the profile's `nanoseconds` value).
    pub ns: u64,
}

/// Trims `profile` to [`MAX_SAMPLES`], then further while it encodes to
/// more than [`MAX_BYTES`]; returns what was trimmed.
pub fn fit(profile: &mut Profile) -> Trimmed {
    let mut trimmed = Trimmed::default();
    let mut keep = MAX_SAMPLES;
    loop {
        if profile.sample.len() > keep {
            trim(profile, keep, &mut trimmed);
            compact(profile);
        }
        if profile.encoded_len() <= MAX_BYTES || keep <= MIN_SAMPLES {
            return trimmed;
        }
        keep = (keep.min(profile.sample.len()) / 2).max(MIN_SAMPLES);
    }
}

/// The index of the value trimming is counted in: the `nanoseconds` one,
/// else the last.
fn ns_index(profile: &Profile) -> usize {
    let unit = |i: i64| profile.string_table.get(i as usize).map(String::as_str);
    profile
        .sample_type
        .iter()
        .position(|t| unit(t.unit) == Some("nanoseconds"))
        .unwrap_or(profile.sample_type.len().saturating_sub(1))
}

/// Keeps the heaviest samples, `keep` in all with the `[trimmed]` ones.
fn trim(profile: &mut Profile, keep: usize, trimmed: &mut Trimmed) {
    let ns = ns_index(profile);
    let weight = |s: &Sample| s.value.get(ns).copied().unwrap_or(0);
    profile.sample.sort_by_key(|s| std::cmp::Reverse(weight(s)));
    let trimmed_loc = trimmed_location(profile);
    let is_trimmed = |s: &Sample| s.location_id == [trimmed_loc];
    // Each label set among the dropped samples takes one `[trimmed]`
    // sample (unless a kept one is there already): drop more until they fit.
    let mut kept = keep;
    loop {
        let (kept_samples, dropped) = profile.sample.split_at(kept);
        let have: HashSet<LabelKey> = kept_samples
            .iter()
            .filter(|s| is_trimmed(s))
            .map(|s| key(&s.label))
            .collect();
        let groups: HashSet<LabelKey> = dropped
            .iter()
            .map(|s| key(&s.label))
            .filter(|k| !have.contains(k))
            .collect();
        if kept + groups.len() <= keep || kept == 0 {
            break;
        }
        kept = keep.saturating_sub(groups.len()).min(kept - 1);
    }
    let dropped = profile.sample.split_off(kept);
    let mut sums: HashMap<LabelKey, (Vec<Label>, Vec<i64>)> = HashMap::new();
    for s in dropped {
        if !is_trimmed(&s) {
            trimmed.samples += 1;
            trimmed.ns += weight(&s).max(0) as u64;
        }
        let (_, sum) = sums
            .entry(key(&s.label))
            .or_insert_with(|| (s.label.clone(), vec![0; s.value.len()]));
        for (a, b) in sum.iter_mut().zip(&s.value) {
            *a += b;
        }
    }
    for (label, value) in sums.into_values() {
        match profile
            .sample
            .iter_mut()
            .find(|k| is_trimmed(k) && k.label == label)
        {
            Some(k) => k.value.iter_mut().zip(&value).for_each(|(a, b)| *a += b),
            None => profile.sample.push(Sample {
                location_id: vec![trimmed_loc],
                value,
                label,
            }),
        }
    }
}

/// A sample's labels as a hashable key.
type LabelKey = Vec<[i64; 4]>;

fn key(labels: &[Label]) -> LabelKey {
    labels
        .iter()
        .map(|l| [l.key, l.str, l.num, l.num_unit])
        .collect()
}

/// The id of the `[trimmed]` location, added if missing.
fn trimmed_location(profile: &mut Profile) -> u64 {
    let name = match profile.string_table.iter().position(|s| s == TRIMMED) {
        Some(i) => i as i64,
        None => {
            profile.string_table.push(TRIMMED.to_string());
            profile.string_table.len() as i64 - 1
        }
    };
    let function = match profile.function.iter().find(|f| f.name == name) {
        Some(f) => f.id,
        None => {
            let id = profile.function.iter().map(|f| f.id).max().unwrap_or(0) + 1;
            profile.function.push(Function {
                id,
                name,
                system_name: name,
                ..Function::default()
            });
            id
        }
    };
    let line = Line {
        function_id: function,
        line: 0,
    };
    if let Some(l) = profile.location.iter().find(|l| l.line == [line]) {
        return l.id;
    }
    let id = profile.location.iter().map(|l| l.id).max().unwrap_or(0) + 1;
    profile.location.push(Location {
        id,
        line: vec![line],
        ..Location::default()
    });
    id
}

/// Drops the locations, functions, mappings and strings no sample uses
/// any more, so that trimming shrinks the encoded profile.
fn compact(p: &mut Profile) {
    let locations: HashSet<u64> = p
        .sample
        .iter()
        .flat_map(|s| &s.location_id)
        .copied()
        .collect();
    p.location.retain(|l| locations.contains(&l.id));
    let functions: HashSet<u64> = p
        .location
        .iter()
        .flat_map(|l| &l.line)
        .map(|l| l.function_id)
        .collect();
    p.function.retain(|f| functions.contains(&f.id));
    let mappings: HashSet<u64> = p.location.iter().map(|l| l.mapping_id).collect();
    p.mapping.retain(|m| mappings.contains(&m.id));

    let old = std::mem::take(&mut p.string_table);
    let mut index: HashMap<i64, i64> = HashMap::new();
    let mut table = vec![String::new()];
    index.insert(0, 0);
    for_each_string(p, &mut |i| {
        let next = table.len() as i64;
        *i = *index.entry(*i).or_insert_with(|| {
            table.push(old.get(*i as usize).cloned().unwrap_or_default());
            next
        });
    });
    p.string_table = table;
}

/// Calls `f` on every string index in `p`.
fn for_each_string(p: &mut Profile, f: &mut impl FnMut(&mut i64)) {
    for t in p.sample_type.iter_mut().chain(p.period_type.as_mut()) {
        f(&mut t.r#type);
        f(&mut t.unit);
    }
    for l in p.sample.iter_mut().flat_map(|s| &mut s.label) {
        f(&mut l.key);
        f(&mut l.str);
        f(&mut l.num_unit);
    }
    for m in &mut p.mapping {
        f(&mut m.filename);
        f(&mut m.build_id);
    }
    for func in &mut p.function {
        f(&mut func.name);
        f(&mut func.system_name);
        f(&mut func.filename);
    }
    for i in p.comment.iter_mut().chain([
        &mut p.drop_frames,
        &mut p.keep_frames,
        &mut p.default_sample_type,
    ]) {
        f(i);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use prost::Message;

    use super::*;
    use crate::export::pprof::proto::ValueType;

    /// A profile of `n` one-frame samples, sample `i` weighing `i + 1` ns
    /// and labelled `state` = futex (even) or sleep (odd), frame names
    /// `pad` characters long.
    pub fn synthetic(n: usize, pad: usize) -> Profile {
        let mut strings: Vec<String> = ["", "samples", "count", "wall", "nanoseconds"]
            .map(String::from)
            .into();
        strings.extend(["state", "futex", "sleep"].map(String::from));
        let base = strings.len() as i64;
        let mut p = Profile {
            sample_type: vec![
                ValueType { r#type: 1, unit: 2 },
                ValueType { r#type: 3, unit: 4 },
            ],
            period_type: Some(ValueType { r#type: 3, unit: 4 }),
            ..Profile::default()
        };
        for i in 0..n {
            let id = i as u64 + 1;
            strings.push(format!("f{i}_{}", "x".repeat(pad)));
            p.function.push(Function {
                id,
                name: base + i as i64,
                ..Function::default()
            });
            p.location.push(Location {
                id,
                line: vec![Line {
                    function_id: id,
                    line: 0,
                }],
                ..Location::default()
            });
            let state = if i % 2 == 0 { 6 } else { 7 };
            p.sample.push(Sample {
                location_id: vec![id],
                value: vec![1, i as i64 + 1],
                label: vec![Label {
                    key: 5,
                    str: state,
                    ..Label::default()
                }],
            });
        }
        p.string_table = strings;
        p
    }

    /// Nanoseconds by state label.
    pub fn by_state(p: &Profile) -> HashMap<String, i64> {
        let mut out = HashMap::new();
        for s in &p.sample {
            let state = p.string_table[s.label[0].str as usize].clone();
            *out.entry(state).or_default() += s.value[1];
        }
        out
    }

    #[test]
    fn small_profiles_are_untouched() {
        let mut p = synthetic(100, 0);
        let before = p.clone();
        assert_eq!(fit(&mut p), Trimmed::default());
        assert_eq!(p, before);
    }

    #[test]
    fn many_samples_are_trimmed_keeping_each_states_total() {
        let n = MAX_SAMPLES + 1000;
        let mut p = synthetic(n, 0);
        let totals = by_state(&p);
        let trimmed = fit(&mut p);
        assert_eq!(p.sample.len(), MAX_SAMPLES);
        assert_eq!(by_state(&p), totals);
        // The lightest went: 1002 of them (two states take two samples).
        assert_eq!(trimmed.samples, 1002);
        assert_eq!(trimmed.ns, (1..=1002).sum::<u64>());
        let trimmed_loc = trimmed_location(&mut p);
        let lightest_kept = p
            .sample
            .iter()
            .filter(|s| s.location_id != [trimmed_loc])
            .map(|s| s.value[1])
            .min();
        assert_eq!(lightest_kept, Some(1003));
        // Unused functions and names are gone.
        assert_eq!(p.function.len(), MAX_SAMPLES - 2 + 1);
        assert_eq!(p.string_table.len(), 8 + MAX_SAMPLES - 2 + 1);
    }

    #[test]
    fn large_profiles_are_trimmed_under_the_size_bound() {
        // 2,000 samples of 4 KiB names: 8 MiB uncompressed.
        let mut p = synthetic(2000, 4096);
        let totals = by_state(&p);
        let trimmed = fit(&mut p);
        let bytes = p.encode_to_vec();
        assert!(bytes.len() <= MAX_BYTES, "{}", bytes.len());
        assert!(trimmed.samples >= 1000, "{trimmed:?}");
        assert_eq!(by_state(&Profile::decode(&bytes[..]).unwrap()), totals);
        // A second fit finds nothing to do.
        assert_eq!(fit(&mut p), Trimmed::default());
    }

    #[test]
    fn trimming_twice_keeps_one_trimmed_sample_per_state() {
        // Over both bounds: 20,000 samples of ~300-byte names (6 MB).
        let mut p = synthetic(MAX_SAMPLES + 4000, 300);
        let totals = by_state(&p);
        let trimmed = fit(&mut p);
        assert!(p.encoded_len() <= MAX_BYTES && p.sample.len() < MAX_SAMPLES);
        assert_eq!(by_state(&p), totals);
        let loc = trimmed_location(&mut p);
        let merged = p.sample.iter().filter(|s| s.location_id == [loc]).count();
        assert_eq!(merged, 2);
        assert_eq!(
            trimmed.samples as usize,
            MAX_SAMPLES + 4000 - (p.sample.len() - 2)
        );
    }
}
