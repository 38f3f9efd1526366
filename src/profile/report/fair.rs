//! Fair report slots (`/metrics` per-process series, processes pushed to
//! Pyroscope): processes are ranked by time wanting or using a CPU, then
//! by wall time, and each user gets a fair share of the slots, so that one
//! user's many idle processes (or threads) cannot push another user's
//! busy process out.

use std::collections::HashMap;

use crate::untrusted::refusals::{self, Reason, What};

/// Ranked processes looked at for their users: past these, the rest are
/// left out (each look-up may read `/proc/PID/status`, see
/// [`crate::process::status::user_of`]).
pub const MAX_LOOKED_AT: usize = 4096;

/// Up to `n` of `ranked` (best first), taking turns by user: each round
/// gives every user that still has processes its best remaining one, users
/// in the order of those processes' ranks, so no user gets more than an
/// even share of the slots while another wants more. The result keeps the
/// ranking's order. Processes a plain ranking would have given a slot and
/// fairness did not are counted (`share`/`too_many_entries`).
pub fn top(ranked: &[u32], n: usize, mut user: impl FnMut(u32) -> Option<u32>) -> Vec<u32> {
    let ranked = &ranked[..ranked.len().min(MAX_LOOKED_AT)];
    if ranked.len() <= n {
        return ranked.to_vec();
    }
    // Each user's processes by rank, and users by their best rank.
    let mut by_user: Vec<Vec<usize>> = Vec::new();
    let mut index: HashMap<Option<u32>, usize> = HashMap::new();
    for (rank, &pid) in ranked.iter().enumerate() {
        let u = *index.entry(user(pid)).or_insert_with(|| {
            by_user.push(Vec::new());
            by_user.len() - 1
        });
        by_user[u].push(rank);
    }
    let mut chosen: Vec<usize> = Vec::with_capacity(n);
    'rounds: for round in 0.. {
        let mut this_round: Vec<usize> = by_user
            .iter()
            .filter_map(|r| r.get(round).copied())
            .collect();
        if this_round.is_empty() {
            break;
        }
        this_round.sort_unstable();
        for rank in this_round {
            if chosen.len() == n {
                break 'rounds;
            }
            chosen.push(rank);
        }
    }
    chosen.sort_unstable();
    for (rank, &pid) in ranked.iter().enumerate().take(n) {
        if chosen.binary_search(&rank).is_err() {
            refusals::count_for(What::Share, Reason::TooManyEntries, pid);
        }
    }
    chosen.into_iter().map(|rank| ranked[rank]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_user_with_many_processes_leaves_room_for_the_others() {
        // 21 processes of user 65534 ranked before user 0's two.
        let mut ranked: Vec<u32> = (100..121).collect();
        ranked.extend([7, 8]);
        let user = |pid: u32| Some(if pid >= 100 { 65534 } else { 0 });
        let before = refusals::get(What::Share, Reason::TooManyEntries);
        let top = top(&ranked, 20, user);
        assert_eq!(top.len(), 20);
        assert!(top.contains(&7) && top.contains(&8), "{top:?}");
        assert_eq!(top[..18], ranked[..18], "ranking order kept");
        assert_eq!(
            refusals::get(What::Share, Reason::TooManyEntries),
            before + 2,
            "the two ranked processes left out counted"
        );
    }

    #[test]
    fn shares_are_even_while_others_want_slots_and_spare_slots_go_round() {
        // Users 1, 2, 3 with 10, 1 and 10 processes, ranked interleaved.
        let ranked: Vec<u32> = (0..21).collect();
        let user = |pid: u32| {
            Some(match pid {
                5 => 2,
                p if p % 2 == 0 => 1,
                _ => 3,
            })
        };
        let top = top(&ranked, 7, user);
        let count = |u| top.iter().filter(|p| user(**p) == Some(u)).count();
        assert_eq!((count(1), count(2), count(3)), (3, 1, 3), "{top:?}");
        // Fewer processes than slots: all of them.
        assert_eq!(super::top(&ranked[..3], 7, user), ranked[..3]);
    }
}
