//! What a runtime's launcher was asked to run, read from its command
//! line: a Java main class, jar or module (the `java` launcher), a Python
//! script or module (a `python` interpreter).

use serde::Serialize;

/// Options of the `java` launcher that take the next argument as their
/// value (so it is not the main class).
const JAVA_WITH_VALUE: [&str; 13] = [
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

/// Long options of `python` that take the next argument as their value.
const PYTHON_WITH_VALUE: [&str; 1] = ["--check-hash-based-pycs"];

/// Longest main class or jar name taken; a longer one is no class.
const MAX_MAIN: usize = 512;

/// What kind of program a launcher runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::IntoStaticStr, strum::EnumIter)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum EntryKind {
    JavaClass,
    JavaJar,
    JavaModule,
    PythonScript,
    PythonModule,
}

impl EntryKind {
    /// The API's name of the kind.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The kind of that name.
    pub fn parse(name: &str) -> Option<EntryKind> {
        use strum::IntoEnumIterator;
        EntryKind::iter().find(|k| k.name() == name)
    }
}

/// A launcher's program: its kind and its name as the command line gives
/// it (the class, the jar's path, the script's path, `-m module`),
/// not yet cleaned for showing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: EntryKind,
    pub name: String,
}

/// The program of a command line (NUL-separated, as in
/// `/proc/PID/cmdline`) whose launcher is `java` or a `python`.
pub fn of(cmdline: &[u8]) -> Option<Entry> {
    let mut args = cmdline.split(|b| *b == 0).map(String::from_utf8_lossy);
    let launcher = args.next()?;
    let base = launcher.rsplit('/').next().unwrap_or(&launcher);
    let mut rest = args.map(|a| a.into_owned());
    if base == "java" {
        java(&mut rest)
    } else if is_python(base) {
        python(&mut rest)
    } else {
        None
    }
}

/// A `python`, `python3`, `python3.11`, `pypy3` (no `python-config`).
fn is_python(base: &str) -> bool {
    let version = base
        .strip_prefix("python")
        .or_else(|| base.strip_prefix("pypy"));
    version.is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// The `java` launcher's main class (the first argument that is not an
/// option), its jar (`-jar`) or its module (`-m`).
fn java(args: &mut impl Iterator<Item = String>) -> Option<Entry> {
    let entry = |kind, name| Some(Entry { kind, name });
    loop {
        let arg = args.next()?;
        match &*arg {
            "-jar" => return entry(EntryKind::JavaJar, args.next()?),
            "-m" | "--module" => return entry(EntryKind::JavaModule, args.next()?),
            a if JAVA_WITH_VALUE.contains(&a) => {
                args.next()?;
            }
            a if a.starts_with('-') || a.starts_with('@') || a.is_empty() => {}
            _ if is_class_or_jar_name(&arg) => return entry(EntryKind::JavaClass, arg),
            _ => return None,
        }
    }
}

/// The script (the first argument that is not an option) or module
/// (`-m`) of a Python interpreter; none for `-c` or standard input.
fn python(args: &mut impl Iterator<Item = String>) -> Option<Entry> {
    loop {
        let arg = args.next()?;
        if arg == "--" {
            let script = args.next()?;
            return Some(Entry {
                kind: EntryKind::PythonScript,
                name: script,
            });
        }
        if PYTHON_WITH_VALUE.contains(&arg.as_str()) {
            args.next()?;
            continue;
        }
        if arg.starts_with("--") {
            continue;
        }
        let Some(flags) = arg.strip_prefix('-') else {
            return Some(Entry {
                kind: EntryKind::PythonScript,
                name: arg,
            });
        };
        // Short flags may be grouped (`-um app`); `m`, `c`, `W` and `X`
        // take the rest of the group, else the next argument.
        for (at, flag) in flags.char_indices() {
            let rest = &flags[at + flag.len_utf8()..];
            let value = |args: &mut dyn Iterator<Item = String>| match rest {
                "" => args.next(),
                r => Some(r.to_string()),
            };
            match flag {
                'm' => {
                    return Some(Entry {
                        kind: EntryKind::PythonModule,
                        name: format!("-m {}", value(args)?),
                    })
                }
                'c' => return None,
                'W' | 'X' => {
                    value(args)?;
                    break;
                }
                _ => {}
            }
        }
        if flags.is_empty() {
            // `-`: the script is standard input.
            return None;
        }
    }
}

/// A Java class or module name (identifiers joined by dots), or a jar's
/// file stem: no path, no spaces or controls, not too long.
pub fn is_class_or_jar_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_MAIN
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '.' | '_' | '$' | '-' | '+'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(args: &[&str]) -> Option<(EntryKind, String)> {
        of(args.join("\0").as_bytes()).map(|e| (e.kind, e.name))
    }

    fn is(kind: EntryKind, name: &str) -> Option<(EntryKind, String)> {
        Some((kind, name.to_string()))
    }

    #[test]
    fn java_classes_jars_and_modules() {
        use EntryKind::*;
        let cp = [
            "java",
            "-Xmx1g",
            "-cp",
            "a.jar:b",
            "-Dx=y",
            "com.example.Main",
            "arg",
        ];
        assert_eq!(entry(&cp), is(JavaClass, "com.example.Main"));
        let jar = [
            "/usr/bin/java",
            "-XX:+UseG1GC",
            "-jar",
            "/srv/shop-2.1.jar",
            "-x",
        ];
        assert_eq!(entry(&jar), is(JavaJar, "/srv/shop-2.1.jar"));
        let module = ["java", "--module-path", "mods", "-m", "app/org.app.Server"];
        assert_eq!(entry(&module), is(JavaModule, "app/org.app.Server"));
        assert_eq!(entry(&["java", "-version"]), None);
        assert_eq!(entry(&["java", "-cp"]), None);
        assert_eq!(entry(&["java", "/tmp/x/libjvm.so"]), None);
        assert_eq!(entry(&["./embedder", "com.example.Main"]), None);
    }

    #[test]
    fn python_scripts_and_modules() {
        use EntryKind::*;
        let script = [
            "/usr/bin/python3.11",
            "-u",
            "-X",
            "dev",
            "/srv/app.py",
            "--port",
            "1",
        ];
        assert_eq!(entry(&script), is(PythonScript, "/srv/app.py"));
        assert_eq!(
            entry(&["python3", "-Wignore", "-B", "a.py"]),
            is(PythonScript, "a.py")
        );
        assert_eq!(
            entry(&["python", "-m", "http.server", "80"]),
            is(PythonModule, "-m http.server")
        );
        assert_eq!(
            entry(&["pypy3", "-um", "celery", "x"]),
            is(PythonModule, "-m celery")
        );
        assert_eq!(
            entry(&["python3", "-mgunicorn"]),
            is(PythonModule, "-m gunicorn")
        );
        assert_eq!(
            entry(&["python3", "--", "-odd.py"]),
            is(PythonScript, "-odd.py")
        );
        assert_eq!(entry(&["python3", "-c", "print(1)", "x.py"]), None);
        assert_eq!(entry(&["python3", "-", "x.py"]), None);
        assert_eq!(entry(&["python3"]), None);
        assert_eq!(entry(&["python3-config", "x.py"]), None);
        assert_eq!(entry(&["bash", "x.py"]), None);
    }
}
