//! Stack traces read once per generation, and the rotation of generations.

use std::collections::HashMap;

use aya::maps::{Array, MapData};

use super::{CollectError, RawStack};
use crate::bpf::{
    abi::{Control, NO_STACK, STACK_GENERATIONS},
    StackMap,
};

/// Stacks stored in a generation at which we move to the next one: half of
/// `WS_STACKS_ENTRIES`, so the map does not fill up before the rotation
/// (which waits two drains).
const ROTATE_AT_STORED: u64 = crate::bpf::abi::STACKS_ENTRIES as u64 / 2;

/// Stacks read so far, by (generation, id).
#[derive(Default)]
pub struct StackCache {
    stacks: HashMap<(u32, i32), Option<RawStack>>,
    generation: u32,
    drains_since_rotation: u32,
    stored_since_rotation: u64,
}

impl StackCache {
    /// The stack `id` of generation `gen`: `Ok(None)` when no stack was
    /// taken, `Err(())` when the id is not in the map.
    pub fn get(&mut self, maps: &[StackMap; 3], gen: u32, id: i32) -> Result<Option<RawStack>, ()> {
        if id == NO_STACK || id < 0 {
            return Ok(None);
        }
        let map = &maps[(gen % STACK_GENERATIONS) as usize];
        let entry = self.stacks.entry((gen, id)).or_insert_with(|| {
            map.get(&(id as u32), 0)
                .ok()
                .map(|stack| stack.frames().to_vec().into())
        });
        entry.clone().map(Some).ok_or(())
    }

    /// Moves BPF to the next generation when the current one fills up
    /// (`stored`: stacks BPF stored since the last call).
    /// The map the next generation reuses held generation g-2, which BPF
    /// stopped accepting at the previous rotation; two drains since then
    /// have emptied every buffer that could still refer to it.
    pub fn maybe_rotate(
        &mut self,
        maps: &mut [StackMap; 3],
        control: &mut Array<MapData, u32>,
        stored: u64,
    ) -> Result<(), CollectError> {
        self.drains_since_rotation += 1;
        self.stored_since_rotation += stored;
        if self.stored_since_rotation < ROTATE_AT_STORED || self.drains_since_rotation < 2 {
            return Ok(());
        }
        let next = self.generation.wrapping_add(1);
        let slot = (next % STACK_GENERATIONS) as usize;
        let ids: Vec<u32> = maps[slot].keys().filter_map(Result::ok).collect();
        for id in ids {
            let _ = maps[slot].remove(&id);
        }
        self.stacks
            .retain(|(g, _), _| g % STACK_GENERATIONS != next % STACK_GENERATIONS);
        control
            .set(Control::Generation as u32, next, 0)
            .map_err(CollectError::Control)?;
        self.generation = next;
        self.drains_since_rotation = 0;
        self.stored_since_rotation = 0;
        Ok(())
    }
}
