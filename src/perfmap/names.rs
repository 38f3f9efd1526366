//! Frame names for JIT code from perf map entries, HotSpot's written the
//! way Java profilers name them.

/// Frame for an address in anonymous executable memory of a JVM that its
/// perf map does not cover (compiled since the map was written, or the map
/// is not there yet).
pub const NOT_IN_PERF_MAP: &str = "[jvm code not in perf map]";

/// Names one perf map entry as a frame.
///
/// HotSpot writes compiled methods as `RET pkg.Class.method(ARGS)`: they
/// become `pkg.Class.method_[j]`, the shape async-profiler and FlameGraph
/// users know (overloads share a frame). The interpreter stays
/// `Interpreter`, other code blobs of a JVM are stubs (`[jvm stub]
/// StubRoutines (1)`). Entries of other runtimes (V8, perf-map-agent...)
/// keep their name, marked `_[j]`.
pub fn frame_name(entry: &str, in_jvm: bool) -> String {
    if let Some(method) = hotspot_method(entry) {
        return format!("{}_[j]", stable_name(method));
    }
    if !in_jvm {
        return format!("{entry}_[j]");
    }
    if entry == "Interpreter" {
        entry.to_string()
    } else {
        format!("[jvm stub] {entry}")
    }
}

/// The name with what changes from run to run taken out, as async-profiler
/// does: hidden classes' addresses (`Foo$$Lambda/0x0000…`, `+0x…` inside
/// the VM) and lambdas' sequence numbers (`Foo$$Lambda$14`), so that the
/// same code has one name across runs and hosts.
pub fn stable_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(c) = rest.chars().next() {
        if (c == '/' || c == '+') && rest[1..].starts_with("0x") {
            let hex = rest[3..]
                .find(|c: char| !c.is_ascii_hexdigit())
                .unwrap_or(rest.len() - 3);
            if hex > 0 {
                rest = &rest[3 + hex..];
                continue;
            }
        }
        if let Some(after) = rest.strip_prefix("$$Lambda$") {
            let digits = after
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(after.len());
            if digits > 0 {
                out.push_str("$$Lambda");
                rest = &after[digits..];
                continue;
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// `pkg.Class.method` from `RET pkg.Class.method(ARGS)`.
fn hotspot_method(entry: &str) -> Option<&str> {
    let open = entry.find('(')?;
    if !entry.ends_with(')') {
        return None;
    }
    let head = &entry[..open];
    let (_ret, qualified) = head.rsplit_once(' ')?;
    let (class, method) = qualified.rsplit_once('.')?;
    let plausible = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_alphanumeric() || "_$.<>/-".contains(c))
    };
    (plausible(class) && plausible(method)).then_some(qualified)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hotspot_entries_become_methods_interpreter_or_stubs() {
        let cases = [
            ("void Churn.tinyTask(int)", true, "Churn.tinyTask_[j]"),
            (
                "java.lang.Object java.lang.invoke.MethodHandle.linkToStatic(java.lang.Object, java.lang.invoke.MemberName)",
                true,
                "java.lang.invoke.MethodHandle.linkToStatic_[j]",
            ),
            ("void java.lang.Object.<init>()", true, "java.lang.Object.<init>_[j]"),
            (
                "void Pools$$Lambda$14/0x0000000800c03000.run()",
                true,
                "Pools$$Lambda.run_[j]",
            ),
            ("Interpreter", true, "Interpreter"),
            ("StubRoutines (1)", true, "[jvm stub] StubRoutines (1)"),
            ("I2C/C2I adapters", true, "[jvm stub] I2C/C2I adapters"),
            ("LazyCompile:*fib /app/x.js:3", false, "LazyCompile:*fib /app/x.js:3_[j]"),
            ("StubRoutines (1)", false, "StubRoutines (1)_[j]"),
        ];
        for (entry, jvm, want) in cases {
            assert_eq!(frame_name(entry, jvm), want, "{entry}");
        }
    }

    #[test]
    fn hidden_class_addresses_and_lambda_numbers_go() {
        let cases = [
            (
                "Pools$$Lambda$2/0x00007f005c000c30.run",
                "Pools$$Lambda.run",
            ),
            ("Pools$$Lambda+0x00007f005c000c30.run", "Pools$$Lambda.run"),
            ("Pools$$Lambda/0x000000080100a000.run", "Pools$$Lambda.run"),
            (
                "java.lang.invoke.LambdaForm$MH/0x0000000801004c00.invoke",
                "java.lang.invoke.LambdaForm$MH.invoke",
            ),
            ("a.B$$Lambda$.x", "a.B$$Lambda$.x"),
            ("a.B/0xzz.x", "a.B/0xzz.x"),
            ("Plain.method", "Plain.method"),
        ];
        for (name, want) in cases {
            assert_eq!(stable_name(name), want, "{name}");
        }
    }
}
