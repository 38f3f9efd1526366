//! How the kernel's lifecycle events (fork, exec, exit, rename) change
//! the table: what a child inherits, what an exec keeps, and the maps
//! reads they schedule.

use std::{cmp::Reverse, sync::Arc, time::Instant};

use super::{Image, ProcessTable, SECOND_LOOK, SETTLE};
use crate::{
    bpf::abi::{comm_str, proc_event, ProcEvent},
    process::changes::ChangeKind,
};

impl ProcessTable {
    /// Applies one lifecycle event.
    pub fn apply(&self, event: &ProcEvent, now: Instant) {
        let name = comm_str(&event.comm);
        let (pid, start) = (event.pid, event.start_ns);
        let mut inner = self.lock();
        match event.kind {
            proc_event::FORK => {
                inner.stats.forks += 1;
                let parent = inner.live(event.parent).cloned();
                let mut child = Image::new(pid, start, name, now);
                child.parent = event.parent;
                child.cgroup = parent.as_ref().and_then(|p| p.cgroup.clone());
                child.cgroups_v1 = parent.as_ref().and_then(|p| p.cgroups_v1.clone());
                match parent {
                    // The child starts with its parent's address space.
                    Some(p) if p.maps_read.is_some() => {
                        child.maps = p.maps.clone();
                        child.jvm = p.jvm;
                        child.maps_read = p.maps_read;
                    }
                    _ => inner.due.push(Reverse((now + SETTLE, pid, start))),
                }
                let child = inner.push(child, now);
                inner.publisher.publish(child.key(), ChangeKind::New);
            }
            proc_event::EXEC => {
                inner.stats.execs += 1;
                if let Some(slot) = inner.live_mut(pid) {
                    if let Some(old) = slot.renamed_from.clone().filter(|_| slot.name == name) {
                        *slot = Arc::new(Image {
                            name: old,
                            renamed_from: None,
                            ..(**slot).clone()
                        });
                    }
                }
                let before = inner.live(pid).filter(|i| i.start_ns == start);
                let exec = before.map_or(1, |i| i.exec + 1);
                // An exec keeps the process's parent and cgroups.
                let image = Image {
                    exec,
                    parent: before.map_or(0, |i| i.parent),
                    cgroup: before.and_then(|i| i.cgroup.clone()),
                    cgroups_v1: before.and_then(|i| i.cgroups_v1.clone()),
                    ..Image::new(pid, start, name, now)
                };
                let image = inner.push(image, now);
                inner.publisher.publish(image.key(), ChangeKind::Exec);
                // Once the loader has mapped the libraries, and again once
                // the program has loaded its own (a JVM's libjvm is
                // dlopen'd by the `java` launcher after a few ms).
                inner.due.push(Reverse((now + SETTLE, pid, start)));
                inner.due.push(Reverse((now + SECOND_LOOK, pid, start)));
            }
            proc_event::EXIT => {
                inner.stats.exits += 1;
                inner.end(pid, now);
            }
            proc_event::RENAME => {
                inner.stats.renames += 1;
                if let Some(slot) = inner.live_mut(pid) {
                    *slot = Arc::new(Image {
                        renamed_from: Some(slot.name.clone()),
                        name,
                        ..(**slot).clone()
                    });
                }
            }
            _ => {}
        }
    }
}
