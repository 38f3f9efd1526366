//! What a profile query measures (`kind`) and how it groups (`group`).

use crate::profile::model::state::State;

/// States in the order the pages draw them and `/processes` offers them:
/// on a CPU, wanting one, then waiting on something else.
pub const STATES_CPU_FIRST: [State; State::COUNT] = [
    State::Cpu,
    State::Runqueue,
    State::Throttled,
    State::Futex,
    State::Io,
    State::Sleep,
];

/// The `kind` of a profile: one state, a union of states, or wakeups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum Kind {
    /// Named as the state.
    State(State),
    /// Every off-CPU state (runqueue and throttled waits included).
    Offcpu,
    /// CPU and off-CPU, with the state as a frame under the root.
    Wall,
    /// Wakeups sent, by waker stack; values are the wakees' sleep time.
    Wakeup,
}

impl Kind {
    /// Every kind, in the order the API lists them: the states, then the
    /// unions and wakeups.
    pub const ALL: [Kind; State::COUNT + 3] = {
        let mut all = [Kind::Wakeup; State::COUNT + 3];
        let mut i = 0;
        while i < State::COUNT {
            all[i] = Kind::State(State::ALL[i]);
            i += 1;
        }
        all[i] = Kind::Offcpu;
        all[i + 1] = Kind::Wall;
        all
    };

    /// The API's name of the kind.
    pub fn name(self) -> &'static str {
        match self {
            Kind::State(s) => s.name(),
            other => other.into(),
        }
    }

    /// Names accepted by the API, in [`Kind::ALL`] order.
    pub fn names() -> [&'static str; State::COUNT + 3] {
        Kind::ALL.map(Kind::name)
    }

    /// Parses an API name.
    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether time in `state` belongs to this kind.
    pub fn includes(self, state: State) -> bool {
        match self {
            Kind::State(s) => s == state,
            Kind::Offcpu => state != State::Cpu,
            Kind::Wall => true,
            Kind::Wakeup => false,
        }
    }

    /// Words for titles: `CPU`, `futex wait`, ...
    pub fn describe(self) -> &'static str {
        match self {
            Kind::State(State::Cpu) => "CPU",
            Kind::State(State::Runqueue) => "runqueue latency",
            Kind::State(State::Futex) => "futex wait",
            Kind::State(State::Io) => "I/O wait",
            Kind::State(State::Sleep) => "sleep",
            Kind::State(State::Throttled) => "throttled (CPU quota spent)",
            Kind::Offcpu => "off-CPU",
            Kind::Wall => "wall clock",
            Kind::Wakeup => "wakeups sent (weighted by wakee sleep)",
        }
    }
}

/// What sits under the process frame.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, strum::EnumString, strum::IntoStaticStr, strum::VariantArray,
)]
#[strum(serialize_all = "lowercase")]
pub enum Group {
    Process,
    Thread,
    Pool,
}

impl Group {
    /// The API's name of the group.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// Names accepted by the API.
    pub fn names() -> Vec<&'static str> {
        <Group as strum::VariantArray>::VARIANTS
            .iter()
            .map(|g| g.name())
            .collect()
    }

    /// Parses an API name.
    pub fn parse(name: &str) -> Option<Group> {
        name.parse().ok()
    }
}

/// Thread name of a process's merged row (see
/// [`is_merged_tid`](crate::profile::model::state::is_merged_tid)).
pub const MERGED_THREADS: &str = "[merged threads]";

/// What the store's thread name of a pool's folded rows ends with (rows of
/// a pool's threads merged into one, past some age: see
/// [`crate::profile::model::store::merge`]).
pub const FOLDED_SUFFIX: &str = " (folded)";

/// The pool a thread belongs to: its name with the final number replaced by
/// `*` (`ForkJoinPool-1-worker-7` -> `ForkJoinPool-1-worker-*`). Names that
/// do not end in a number are their own pool; the store's folded rows
/// (`worker-* (folded)`) belong to the pool they were folded into.
pub fn pool_name(thread: &str) -> String {
    if let Some(pool) = thread.strip_suffix(FOLDED_SUFFIX) {
        return pool.to_string();
    }
    let stem = thread.trim_end_matches(|c: char| c.is_ascii_digit());
    if stem.len() == thread.len() || stem.is_empty() {
        thread.to_string()
    } else {
        format!("{stem}*")
    }
}

/// The frame that names a thread in `group=thread` graphs; a pool's
/// folded rows are named by the pool alone (their tid is no thread's).
pub fn thread_frame(name: &str, tid: u32) -> String {
    if crate::profile::model::store::merge::is_pool_tid(tid) {
        return name.to_string();
    }
    format!("{name} [tid {tid}]")
}

/// The frame that names a state in `kind=wall` graphs.
pub fn state_frame(state: State) -> String {
    format!("[{}]", state.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_strip_the_final_number() {
        assert_eq!(
            pool_name("ForkJoinPool-1-worker-7"),
            "ForkJoinPool-1-worker-*"
        );
        assert_eq!(pool_name("MutationStage-3"), "MutationStage-*");
        assert_eq!(pool_name("pool-2-thread-15"), "pool-2-thread-*");
        assert_eq!(pool_name("main"), "main");
        assert_eq!(pool_name("1234"), "1234");
        assert_eq!(pool_name("kworker/0:1"), "kworker/0:*");
        assert_eq!(pool_name("worker-* (folded)"), "worker-*");
        let pool = crate::profile::model::store::merge::POOL_TID | 7;
        assert_eq!(thread_frame("worker-* (folded)", pool), "worker-* (folded)");
        assert_eq!(thread_frame("worker-7", 7), "worker-7 [tid 7]");
    }

    #[test]
    fn kinds_parse_and_include_states() {
        // The API's names, in the order its errors list them.
        let names = Kind::names();
        let want = [
            "cpu",
            "runqueue",
            "futex",
            "io",
            "sleep",
            "throttled",
            "offcpu",
            "wall",
        ];
        assert_eq!(names[..8], want);
        assert_eq!(names[8], "wakeup");
        for name in names {
            assert_eq!(Kind::parse(name).map(Kind::name), Some(name));
        }
        assert_eq!(Kind::parse("futex"), Some(Kind::State(State::Futex)));
        assert!(Kind::parse("park").is_none());
        assert!(Kind::Offcpu.includes(State::Io) && !Kind::Offcpu.includes(State::Cpu));
        assert!(Kind::Wall.includes(State::Cpu) && !Kind::Wakeup.includes(State::Cpu));
        let throttled = Kind::parse("throttled");
        assert_eq!(throttled, Some(Kind::State(State::Throttled)));
        assert!(Kind::Offcpu.includes(State::Throttled) && Kind::Wall.includes(State::Throttled));
        assert_eq!(state_frame(State::Throttled), "[throttled]");
    }

    #[test]
    fn every_state_is_a_kind() {
        for state in State::ALL {
            assert_eq!(Kind::parse(state.name()), Some(Kind::State(state)));
            assert!(Kind::names().contains(&state.name()), "{}", state.name());
            assert!(STATES_CPU_FIRST.contains(&state), "{state:?}");
        }
    }

    #[test]
    fn groups_are_named_for_the_api() {
        assert_eq!(Group::names(), ["process", "thread", "pool"]);
        assert_eq!(Group::parse("pool"), Some(Group::Pool));
        assert_eq!(Group::parse("Pool"), None);
    }
}
