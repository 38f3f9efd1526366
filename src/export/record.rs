//! The file `wallscope record -o FILE` writes: one process's CPU profile
//! over what the store holds, as a flame graph, folded stacks or pprof,
//! chosen by the file's name. A pure function of the store's snapshot.

use std::{
    path::Path,
    time::{Duration, SystemTime},
};

use super::pprof::{self, Detail};
use crate::profile::{
    model::{kind::Group, store::Snapshot, window::Window},
    report::{
        query::{self, Filter},
        render::{self, GraphLabels},
    },
};

/// What `record` writes, by the output file's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordFormat {
    Svg,
    Folded,
    Pprof,
}

impl RecordFormat {
    /// The format `output`'s name asks for; `None` when it says none.
    pub fn of(output: &Path) -> Option<RecordFormat> {
        let name = output.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let ext = output.extension().and_then(|e| e.to_str());
        match ext {
            Some("svg") => Some(RecordFormat::Svg),
            Some("folded" | "txt") => Some(RecordFormat::Folded),
            _ if name.ends_with(".pb.gz") || ext == Some("pprof") => Some(RecordFormat::Pprof),
            _ => None,
        }
    }
}

/// A recorded profile, ready to write.
pub struct Recorded {
    pub bytes: Vec<u8>,
    pub stacks: usize,
    pub cpu_ns: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("no CPU samples for pid {pid} in {seconds:.1} s (was it idle?)")]
    NoSamples { pid: u32, seconds: f64 },
    #[error("drawing the flame graph: {0}")]
    Render(#[from] std::io::Error),
}

/// `pid`'s CPU profile over the last `held` of `snapshot`, recorded for
/// `recorded` (the flame graph's title says how long).
pub fn profile(
    snapshot: &Snapshot,
    pid: u32,
    held: Duration,
    recorded: Duration,
    format: RecordFormat,
) -> Result<Recorded, RecordError> {
    let window = Window::last(held.as_secs(), SystemTime::now());
    let filter = Filter::cpu(Some(pid), None, window);
    let folded = query::folded(snapshot, &filter);
    if folded.stacks.is_empty() {
        return Err(RecordError::NoSamples {
            pid,
            seconds: recorded.as_secs_f64(),
        });
    }
    let bytes = match format {
        RecordFormat::Pprof => {
            let by_thread = Filter {
                group: Group::Thread,
                ..filter
            };
            pprof::encode_gzip(&pprof::build(snapshot, &by_thread, Detail::Threads))
        }
        RecordFormat::Svg => {
            let name = folded
                .processes
                .get(&pid)
                .map(|n| n.to_string())
                .unwrap_or_default();
            let labels = GraphLabels {
                subject: format!("{name} (pid {pid})"),
                kind: filter.kind,
                group: filter.group,
                window: Window::last(recorded.as_secs().max(1), SystemTime::now()),
            };
            render::flamegraph_svg(&folded, &labels, false)?
        }
        RecordFormat::Folded => render::folded_text(&folded).into_bytes(),
    };
    Ok(Recorded {
        bytes,
        stacks: folded.stacks.len(),
        cpu_ns: folded.total_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_is_told_by_the_name() {
        let of = |n: &str| RecordFormat::of(Path::new(n));
        assert_eq!(of("a.svg"), Some(RecordFormat::Svg));
        assert_eq!(of("a.folded"), Some(RecordFormat::Folded));
        assert_eq!(of("a.txt"), Some(RecordFormat::Folded));
        assert_eq!(of("a.pb.gz"), Some(RecordFormat::Pprof));
        assert_eq!(of("a.pprof"), Some(RecordFormat::Pprof));
        assert_eq!(of("a.png"), None);
        assert_eq!(of("a"), None);
    }
}
