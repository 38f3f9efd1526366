//! `service_name` for a process: a JVM's main class (or jar, or module),
//! since every JVM's command name is `java`; otherwise its command name.
//! Kernel threads get none: they are not pushed (as Alloy's process
//! discovery leaves them out), else hundreds of mostly idle `kworker`s,
//! each a process of its own, would take the places of services.

use std::{collections::HashMap, io::Read};

/// Most of `/proc/PID/cmdline` read: the JVM options before the main class
/// are rarely longer, and a longer command line falls back to the name.
const MAX_CMDLINE: u64 = 16 * 1024;

/// Options of the `java` launcher that take the next argument as their
/// value (so it is not the main class).
const WITH_VALUE: [&str; 13] = [
    "-cp",
    "-classpath",
    "--class-path",
    "-p",
    "--module-path",
    "--upgrade-module-path",
    "--add-modules",
    "--limit-modules",
    "--add-reads",
    "--add-exports",
    "--add-opens",
    "--patch-module",
    "--enable-native-access",
];

/// The main class of a `java` command line (NUL-separated, as in
/// `/proc/PID/cmdline`): the first argument that is not an option, the
/// jar's file stem for `-jar`, the class (or module) for `-m`.
pub fn java_main(cmdline: &[u8]) -> Option<String> {
    let mut args = cmdline
        .split(|b| *b == 0)
        .skip(1)
        .map(String::from_utf8_lossy);
    while let Some(arg) = args.next() {
        match &*arg {
            "-jar" => {
                let jar = args.next()?;
                let file = jar.rsplit('/').next().unwrap_or(&jar);
                return Some(file.strip_suffix(".jar").unwrap_or(file).to_string());
            }
            "-m" | "--module" => {
                let module = args.next()?;
                let class = module.split_once('/').map_or(&*module, |(_, c)| c);
                return Some(class.to_string());
            }
            a if WITH_VALUE.contains(&a) => {
                args.next()?;
            }
            a if a.starts_with('-') || a.starts_with('@') || a.is_empty() => {}
            main => return Some(main.to_string()),
        }
    }
    None
}

fn read_cmdline(pid: u32) -> Option<Vec<u8>> {
    // The kernel's file (it reads the process's memory, as the JVM
    // symbolizer does): no symlink or FIFO to fear, and bounded here.
    let file = std::fs::File::open(format!("/proc/{pid}/cmdline")).ok()?;
    let mut bytes = Vec::new();
    file.take(MAX_CMDLINE).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// Service names by pid, for the processes looked at by the last push
/// only: a process is looked up once, not every interval.
#[derive(Default)]
pub struct ServiceNames {
    /// pid -> its command name and service name (`None`: a kernel thread).
    known: HashMap<u32, (String, Option<String>)>,
}

impl ServiceNames {
    /// The service name of `pid` named `comm`, `None` for a kernel thread;
    /// `is_jvm` says whether to look for a main class.
    pub fn get(&mut self, pid: u32, comm: &str, is_jvm: bool) -> Option<String> {
        if let Some((c, name)) = self.known.get(&pid) {
            // A reused pid runs another program under another name.
            if c == comm {
                return name.clone();
            }
        }
        let name = if crate::procinfo::is_kernel_thread(pid) {
            None
        } else {
            let main = is_jvm.then(|| read_cmdline(pid).and_then(|c| java_main(&c)));
            Some(main.flatten().unwrap_or_else(|| comm.to_string()))
        };
        self.known.insert(pid, (comm.to_string(), name.clone()));
        name
    }

    /// Forgets every pid not in `pids` (the processes just looked at).
    pub fn keep_only(&mut self, pids: &[u32]) {
        self.known.retain(|pid, _| pids.contains(pid));
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
    }

    #[test]
    fn names_fall_back_to_the_command_and_follow_pid_reuse() {
        let mut names = ServiceNames::default();
        // Not a JVM: the command name, whatever its command line says.
        let me = std::process::id();
        assert_eq!(names.get(me, "worker", false).unwrap(), "worker");
        assert_eq!(names.get(me, "other", false).unwrap(), "other");
        names.keep_only(&[]);
        assert!(names.known.is_empty());
        // A "JVM" whose command line has no main class keeps its name.
        assert_eq!(names.get(u32::MAX, "worker", true).unwrap(), "worker");
        // kthreadd is not pushed.
        assert_eq!(names.get(2, "kthreadd", false), None);
    }
}
