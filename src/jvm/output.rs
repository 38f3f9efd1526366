//! Parsers for the text the JVM answers diagnostic commands with.

/// Java thread names by native thread id (as the JVM sees it, i.e. in its
/// own pid namespace) from `Thread.print`.
///
/// Header lines look like
/// `"main" #1 prio=5 os_prio=0 cpu=1ms elapsed=2s tid=0x7f.. nid=0x44d5 runnable`;
/// JDK 19+ print `nid` in decimal, older JDKs in hex. VM-internal threads
/// (`"VM Thread" os_prio=0 ... nid=...`) are listed too.
pub fn thread_names(dump: &str) -> Vec<(u32, String)> {
    dump.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix('"')?;
            let nid_at = rest.rfind(" nid=")?;
            // The name may itself hold quotes: it ends at the last `" `
            // before the fields.
            let name_end = rest[..nid_at].rfind("\" ")?;
            let nid = rest[nid_at + 5..].split_whitespace().next()?;
            let nid = match nid.strip_prefix("0x") {
                Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                None => nid.parse().ok()?,
            };
            Some((nid, rest[..name_end].to_string()))
        })
        .collect()
}

/// Whether `VM.flags` output shows `-XX:+PreserveFramePointer` (the flag is
/// off by default and listed only when set).
pub fn preserves_frame_pointer(flags: &str) -> bool {
    flags
        .split_whitespace()
        .any(|f| f == "-XX:+PreserveFramePointer")
}

/// The first line of `VM.version` that names the VM and its version.
pub fn version(text: &str) -> Option<String> {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.ends_with(':'))
        .map(|l| l.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_dump_headers_give_names_by_native_id() {
        let dump = r#"2026-11-22 01:01:23
Full thread dump OpenJDK 64-Bit Server VM (17.0.15+6-Debian-1deb12u1 mixed mode, sharing):

"main" #1 prio=5 os_prio=0 cpu=390.22ms elapsed=10.94s tid=0x00007fab38017f30 nid=0x44d5 waiting on condition  [0x00007fab3ebfe000]
   java.lang.Thread.State: TIMED_WAITING (sleeping)
	at java.lang.Thread.sleep(java.base@17.0.15/Native Method)

"Native-Transport-Requests-12" #31 daemon prio=5 os_prio=0 cpu=1.00ms elapsed=1.00s tid=0x00007fab38017f30 nid=0x10 runnable
"say "hi" there" #32 prio=5 os_prio=0 cpu=1.00ms elapsed=1.00s tid=0x1 nid=17 runnable
"VM Thread" os_prio=0 cpu=12.01ms elapsed=10.95s tid=0x00007fab380ec460 nid=0x44db runnable
"GC Thread#0" os_prio=0 cpu=1.2ms elapsed=11.0s tid=0x1 nid=0x44d7 runnable
"#
        .to_string()
            + "\"broken\" without fields\n";
        assert_eq!(
            thread_names(&dump),
            vec![
                (0x44d5, "main".to_string()),
                (0x10, "Native-Transport-Requests-12".to_string()),
                (17, "say \"hi\" there".to_string()),
                (0x44db, "VM Thread".to_string()),
                (0x44d7, "GC Thread#0".to_string()),
            ]
        );
    }

    #[test]
    fn flags_and_version() {
        assert!(preserves_frame_pointer(
            "123:\n-XX:CICompilerCount=2 -XX:+PreserveFramePointer -XX:+UseG1GC\n"
        ));
        assert!(!preserves_frame_pointer(
            "123:\n-XX:-PreserveFramePointer -XX:+UseG1GC\n"
        ));
        assert!(!preserves_frame_pointer("-XX:+UseG1GC"));
        assert_eq!(
            version("OpenJDK 64-Bit Server VM version 17.0.15+6\nJDK 17.0.15\n").as_deref(),
            Some("OpenJDK 64-Bit Server VM version 17.0.15+6")
        );
    }
}
