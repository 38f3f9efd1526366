//! Parsers for the text the JVM answers diagnostic commands with.

use crate::untrusted::refusals::{self, Reason, What};

/// Longest Java thread name kept (cut, ending in `…`): real ones are a
/// few dozen characters; the name shows in every row of the thread.
pub const MAX_THREAD_NAME_BYTES: usize = 256;
/// Most thread names taken from one thread dump.
pub const MAX_THREAD_NAMES: usize = 32_768;
/// Most bytes of thread names taken from one thread dump.
pub const MAX_THREAD_NAME_TOTAL: usize = 2 << 20;

/// Java thread names by native thread id (as the JVM sees it, i.e. in its
/// own pid namespace) from JVM `pid`'s `Thread.print`, cleaned like frame
/// names (no `;`, no control characters, at most
/// [`MAX_THREAD_NAME_BYTES`]), and at most [`MAX_THREAD_NAMES`] of them
/// and [`MAX_THREAD_NAME_TOTAL`] bytes in all (the rest left out, counted
/// as `names`/`budget` for `pid`).
///
/// Header lines look like
/// `"main" #1 prio=5 os_prio=0 cpu=1ms elapsed=2s tid=0x7f.. nid=0x44d5 runnable`;
/// JDK 19+ print `nid` in decimal, older JDKs in hex. VM-internal threads
/// (`"VM Thread" os_prio=0 ... nid=...`) are listed too.
pub fn thread_names(pid: u32, dump: &str) -> Vec<(u32, String)> {
    let mut names = Vec::new();
    let mut bytes = 0;
    for (nid, name) in dump.lines().filter_map(header) {
        let name = crate::untrusted::text::clean_to(name, MAX_THREAD_NAME_BYTES);
        if names.len() == MAX_THREAD_NAMES || bytes + name.len() > MAX_THREAD_NAME_TOTAL {
            refusals::count_for(What::Names, Reason::Budget, pid);
            break;
        }
        bytes += name.len();
        names.push((nid, name.into_owned()));
    }
    names
}

/// The native id and name of a thread dump's header line.
fn header(line: &str) -> Option<(u32, &str)> {
    let rest = line.strip_prefix('"')?;
    let nid_at = rest.rfind(" nid=")?;
    // The name may itself hold quotes: it ends at the last `" ` before the
    // fields.
    let name_end = rest[..nid_at].rfind("\" ")?;
    let nid = rest[nid_at + 5..].split_whitespace().next()?;
    let nid = match nid.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok()?,
        None => nid.parse().ok()?,
    };
    Some((nid, &rest[..name_end]))
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
            thread_names(1, &dump),
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
    fn thread_names_are_cleaned_cut_and_capped() {
        let line =
            |nid: usize, name: &str| format!("\"{name}\" #1 prio=5 tid=0x1 nid={nid} runnable\n");
        let dump = line(1, "pool;main;evil\tframe") + &line(2, &"x".repeat(8 << 20));
        let names = thread_names(1, &dump);
        assert_eq!(names[0], (1, "pool:main:evil frame".to_string()));
        assert!(names[1].1.len() <= MAX_THREAD_NAME_BYTES && names[1].1.ends_with('…'));

        let before = refusals::get(What::Names, Reason::Budget);
        let many: String = (0..MAX_THREAD_NAMES + 10).map(|i| line(i, "t")).collect();
        assert_eq!(thread_names(1, &many).len(), MAX_THREAD_NAMES);
        let long: String = (0..20_000).map(|i| line(i, &"y".repeat(1000))).collect();
        let kept = thread_names(1, &long);
        assert!(kept.iter().map(|(_, n)| n.len()).sum::<usize>() <= MAX_THREAD_NAME_TOTAL);
        assert!(refusals::get(What::Names, Reason::Budget) >= before + 2);
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
