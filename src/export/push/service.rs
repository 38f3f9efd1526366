//! `service_name` for a process: a JVM's main class (or jar, or module),
//! since every JVM's command name is `java`, but only when the `java`
//! launcher started it and names a real class or jar (a program that
//! embeds a JVM has its own arguments); otherwise its executable's name.
//! Kernel threads get none: they are not pushed (as Alloy's process
//! discovery leaves them out), else hundreds of mostly idle `kworker`s,
//! each a process of its own, would take the places of services.

use std::{collections::HashMap, sync::Arc, time::Instant};

use crate::process::{ChangeKind, Facts, ProcKey, ProcessTable, Subscription};

/// Longest executable name taken.
const MAX_MAIN: usize = 512;

/// The main class of a `java` launcher's command line (NUL-separated, as
/// in `/proc/PID/cmdline`; see [`crate::process::identity::entry`]): the
/// class, the jar's file stem for `-jar`, the class (or module) for `-m`.
/// `None` when the program is not the `java` launcher or what it names is
/// not a class, module or jar name.
pub fn java_main(cmdline: &[u8]) -> Option<String> {
    use crate::process::identity::{entry, is_class_or_jar_name, EntryKind};
    let e = entry::of(cmdline)?;
    let main = match e.kind {
        EntryKind::JavaClass => e.name,
        EntryKind::JavaJar => {
            let file = e.name.rsplit('/').next().unwrap_or(&e.name);
            file.strip_suffix(".jar").unwrap_or(file).to_string()
        }
        EntryKind::JavaModule => e
            .name
            .split_once('/')
            .map_or(&*e.name, |(_, c)| c)
            .to_string(),
        EntryKind::PythonScript | EntryKind::PythonModule => return None,
    };
    is_class_or_jar_name(&main).then_some(main)
}

/// The name of the process's executable when `comm` is the kernel's
/// 15-byte cut of it; else `comm` (a process may have renamed itself).
fn executable_name(facts: Option<&Facts>, comm: &str) -> String {
    const COMM_BYTES: usize = 15;
    if comm.len() < COMM_BYTES {
        return comm.to_string();
    }
    let file = facts
        .and_then(|f| f.executable.as_ref())
        .and_then(|p| p.file_name())
        .map(|f| f.to_string_lossy());
    match file {
        Some(f) if f.starts_with(comm) && f.len() <= MAX_MAIN => f.to_string(),
        _ => comm.to_string(),
    }
}

/// Service names the pusher holds at most (processes pushed and not yet
/// ended); past it they start over.
const MAX_KNOWN: usize = 65_536;

/// Service names by process (pid and start time), each looked up once,
/// not every interval, and forgotten by the process table's rule (see
/// [`crate::process::Subscription`]): a reused pid is another process,
/// looked up anew.
pub struct ServiceNames {
    /// `None`: a kernel thread.
    known: HashMap<ProcKey, Option<String>>,
    changes: Subscription,
}

impl ServiceNames {
    /// Names for the processes of `table`.
    pub fn new(table: &Arc<ProcessTable>) -> ServiceNames {
        ServiceNames {
            known: HashMap::new(),
            changes: table.subscribe(),
        }
    }

    /// The service name of `pid`, named `comm` in the store, as it ran at
    /// some time since `since`; `None` for a kernel thread.
    pub fn get(&mut self, pid: u32, comm: &str, since: Instant) -> Option<String> {
        let image = self.changes.table().lookup(pid, comm, since);
        let key = image.as_ref().map_or(ProcKey::of_pid(pid), |i| i.key());
        if let Some(name) = self.known.get(&key) {
            return name.clone();
        }
        let table = self.changes.table();
        let facts = match image {
            Some(_) => table.facts(key),
            None => table.facts_of(pid),
        };
        let name = if pid == 0 || facts.as_ref().is_some_and(|f| f.kernel_thread) {
            None
        } else {
            // A JVM as its maps tell (whatever it calls itself): its main
            // class, from the command line the table read while it ran
            // (`MAX_CMDLINE` bytes at most: the JVM options before the
            // main class are rarely longer, and a longer command line
            // falls back to the name).
            let is_jvm = image.as_ref().is_some_and(|i| i.jvm && i.ended.is_none());
            let cmdline = facts.as_ref().and_then(|f| f.cmdline.as_deref());
            let main = cmdline.filter(|_| is_jvm).and_then(java_main);
            Some(main.unwrap_or_else(|| executable_name(facts.as_deref(), comm)))
        };
        if self.known.len() >= MAX_KNOWN {
            self.known.clear();
        }
        if image.is_some() {
            self.known.insert(key, name.clone());
        }
        name
    }

    /// Forgets the processes that ended (once a push), and those found to
    /// be JVMs since they were named (a JVM is named by its main class).
    pub fn forget_ended(&mut self) {
        let due = self.changes.poll(Instant::now());
        let jvms = due
            .changes
            .iter()
            .filter(|c| c.kind == ChangeKind::JvmFound);
        for key in due.forget.iter().chain(jvms.map(|c| &c.key)) {
            self.known.remove(key);
        }
        if due.check_all {
            let table = self.changes.table().clone();
            self.known.retain(|k, _| table.knows(*k));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn main_of(args: &[&str]) -> Option<String> {
        java_main(args.join("\0").as_bytes())
    }

    #[test]
    fn main_classes_jars_and_modules() {
        let cp = [
            "java",
            "-Xmx1g",
            "-cp",
            "a.jar:b",
            "-Dx=y",
            "com.example.Main",
            "arg",
        ];
        assert_eq!(main_of(&cp).as_deref(), Some("com.example.Main"));
        let jar = [
            "/usr/bin/java",
            "-XX:+UseG1GC",
            "-jar",
            "/srv/app/shop-2.1.jar",
            "--port=1",
        ];
        assert_eq!(main_of(&jar).as_deref(), Some("shop-2.1"));
        let module = ["java", "--module-path", "mods", "-m", "app/org.app.Server"];
        assert_eq!(main_of(&module).as_deref(), Some("org.app.Server"));
        assert_eq!(main_of(&["java", "-version"]), None);
        assert_eq!(main_of(&["java", "-cp"]), None);
        // Not the launcher: a program embedding a JVM, whatever its
        // arguments; nor a path or text that names no class.
        assert_eq!(main_of(&["./embedder", "com.example.Main"]), None);
        assert_eq!(main_of(&["/tmp/x/runner", "/tmp/x/libjvm.so"]), None);
        assert_eq!(main_of(&["java", "/tmp/x/libjvm.so"]), None);
        assert_eq!(main_of(&["java", "a b"]), None);
        assert_eq!(
            main_of(&["/usr/lib/jvm/java-17/bin/java", "-Xss1m", "Main$Inner"]).as_deref(),
            Some("Main$Inner")
        );
    }

    #[test]
    fn names_fall_back_to_the_command_and_follow_the_process() {
        let table = Arc::new(ProcessTable::default());
        let mut names = ServiceNames::new(&table);
        let now = Instant::now();
        // Not a JVM: the command name, whatever its command line says.
        let me = std::process::id();
        assert_eq!(names.get(me, "worker", now).unwrap(), "worker");
        assert_eq!(
            names.get(me, "other", now).unwrap(),
            "worker",
            "looked up once"
        );
        assert_eq!(names.known.len(), 1);
        // A process the table does not know: its name, not kept.
        assert_eq!(names.get(u32::MAX, "gone", now).unwrap(), "gone");
        assert_eq!(names.known.len(), 1);
        // kthreadd is not pushed.
        assert_eq!(names.get(2, "kthreadd", now), None);
    }
}
