//! The one place the BPF contract's thread states, histograms and
//! constants become the model's (`profile::model::state`): the model
//! keeps the contract's values and order, checked here at compile time
//! and in the tests below, so stored blocks keep their bytes.

use crate::bpf::abi;
use crate::profile::model::{
    state::{self, Hist, State},
    KeptOff,
};

/// The model's state for a contract state.
pub fn state(s: abi::State) -> State {
    match s {
        abi::State::Cpu => State::Cpu,
        abi::State::Runqueue => State::Runqueue,
        abi::State::Futex => State::Futex,
        abi::State::Io => State::Io,
        abi::State::Sleep => State::Sleep,
        abi::State::Throttled => State::Throttled,
    }
}

/// Decodes a raw state stored by BPF; `None` when not in the contract.
pub fn state_from_raw(raw: u32) -> Option<State> {
    abi::State::from_raw(raw).map(state)
}

/// The model's histogram for a drained one.
pub fn hist(h: &abi::Hist) -> Hist {
    Hist {
        slots: h.slots,
        ns: h.ns,
    }
}

// The model's constants are the contract's: a change of the header shows
// here, not as silently misread blocks.
const _: () = {
    assert!(state::HIST_SLOTS == abi::HIST_SLOTS);
    assert!(state::SLEEP_SLOTS == abi::SLEEP_SLOTS);
    assert!(state::STAT_COUNTERS == abi::Stat::COUNT);
    assert!(state::INTERRUPT_TID == abi::INTERRUPT_TID);
    assert!(state::MERGED_TID == abi::MERGED_TID);
    assert!(KeptOff::UNSEEN == abi::CULPRIT_UNSEEN);
    assert!(KeptOff::OTHERS == abi::CULPRIT_OTHERS);
    assert!(State::COUNT == abi::State::COUNT);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_keeps_its_value() {
        assert_eq!(abi::State::ALL.len(), State::ALL.len());
        for (a, m) in abi::State::ALL.into_iter().zip(State::ALL) {
            assert_eq!(state(a), m);
            assert_eq!(a as u32, m as u32, "{a:?}");
            assert_eq!(state_from_raw(a as u32), Some(m));
        }
        assert_eq!(state_from_raw(abi::WAKEUP_STATE), None);
    }

    #[test]
    fn a_histogram_keeps_its_slots() {
        let mut h = abi::Hist::default();
        for (i, s) in h.slots.iter_mut().enumerate() {
            *s = i as u64 * 3 + 1;
        }
        h.ns = 12_345;
        let m = hist(&h);
        assert_eq!(m.slots, h.slots);
        assert_eq!(m.ns, h.ns);
    }
}
