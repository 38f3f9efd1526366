//! Capping one folded line: a stack of 254 frames of 2 KiB names (a JIT
//! can name its code anything) folds to half a megabyte of text. Past the
//! cap the middle frames give way to one `[… N frames]` frame: the
//! root-most frames (process, thread, outer calls) and the leaf-most ones
//! (where the time went) are what a reader needs.

/// The cut a line gets: how many frames it keeps from each end, and its
/// length once joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Frames kept from the root end.
    pub front: usize,
    /// Frames kept from the leaf end (0 when nothing is elided).
    pub back: usize,
    /// Frames left out (0: the line is whole).
    pub elided: usize,
    /// Bytes of the joined line.
    pub len: usize,
}

impl Plan {
    /// Frames of the line written: those kept and the marker.
    pub fn frames(&self) -> usize {
        self.front + self.back + usize::from(self.elided > 0)
    }
}

/// Room the marker may take: `[… N frames]` with N of at most 20 digits.
const MARKER_MAX: usize = "[… 18446744073709551615 frames]".len();

/// The frame that stands for `n` elided frames.
pub fn marker(n: usize) -> String {
    format!("[… {n} frames]")
}

/// How `frames` (root first) fit in `cap` bytes once joined with `;`:
/// whole when they fit, else the root-most frames up to half the room, the
/// leaf-most ones in what is left, then root-most ones again. A frame
/// larger than the room is elided with its neighbours.
pub fn plan(frames: &[&str], cap: usize) -> Plan {
    let n = frames.len();
    let whole = frames.iter().map(|f| f.len()).sum::<usize>() + n.saturating_sub(1);
    if whole <= cap {
        return Plan {
            front: n,
            back: 0,
            elided: 0,
            len: whole,
        };
    }
    let room = cap.saturating_sub(MARKER_MAX);
    // Each kept frame brings its separator from the marker's side.
    let cost = |i: usize| frames[i].len() + 1;
    let (mut front, mut back, mut used) = (0, 0, 0);
    while front < n && used + cost(front) <= room / 2 {
        used += cost(front);
        front += 1;
    }
    while back < n - front && used + cost(n - 1 - back) <= room {
        used += cost(n - 1 - back);
        back += 1;
    }
    while front < n - back && used + cost(front) <= room {
        used += cost(front);
        front += 1;
    }
    let elided = n - front - back;
    Plan {
        front,
        back,
        elided,
        len: used + marker(elided).len(),
    }
}

/// The line `plan` (from [`plan`] over the same `frames`) describes.
pub fn render(frames: &[&str], plan: Plan) -> String {
    let mut line = String::with_capacity(plan.len);
    let marker = (plan.elided > 0).then(|| marker(plan.elided));
    let kept = frames[..plan.front]
        .iter()
        .copied()
        .chain(marker.as_deref())
        .chain(frames[frames.len() - plan.back..].iter().copied());
    for (i, frame) in kept.enumerate() {
        if i > 0 {
            line.push(';');
        }
        line.push_str(frame);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(frames: &[&str], cap: usize) -> String {
        let p = plan(frames, cap);
        let text = render(frames, p);
        assert_eq!(text.len(), p.len, "{text}");
        text
    }

    #[test]
    fn a_line_within_the_cap_is_whole() {
        let frames = ["app", "main", "work"];
        assert_eq!(line(&frames, 13), "app;main;work");
        assert_eq!(plan(&frames, 13).elided, 0);
        assert_eq!(line(&[], 0), "");
    }

    #[test]
    fn middle_frames_give_way_to_a_marker_within_the_cap() {
        let names: Vec<String> = (0..127)
            .map(|i| format!("f{i:03}{}", "x".repeat(2000)))
            .collect();
        let mut frames: Vec<&str> = vec!["attacker"];
        frames.extend(names.iter().map(String::as_str));
        frames.push("[wakes t [tid 7]]");
        let cap = 32 << 10;
        let text = line(&frames, cap);
        assert!(text.len() <= cap, "{}", text.len());
        let parts: Vec<&str> = text.split(';').collect();
        assert_eq!(parts[0], "attacker", "the root stays");
        assert_eq!(
            *parts.last().unwrap(),
            "[wakes t [tid 7]]",
            "the leaf stays"
        );
        assert!(parts[1].starts_with("f000") && parts[parts.len() - 2].starts_with("f126"));
        let p = plan(&frames, cap);
        assert_eq!(p.front + p.back + p.elided, frames.len());
        assert!(text.contains(&format!(";[… {} frames];", p.elided)));
        assert!(p.front > 1 && p.back > 1, "{p:?}");
    }

    #[test]
    fn a_frame_larger_than_the_room_is_elided_with_its_neighbours() {
        let huge = "y".repeat(5000);
        let frames = ["root", huge.as_str(), "leaf"];
        let text = line(&frames, 100);
        assert_eq!(text, "root;[… 1 frames];leaf");
    }
}
