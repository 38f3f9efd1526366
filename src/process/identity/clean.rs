//! Text a process controls, made fit to show: bounded, one line, valid
//! UTF-8, with nothing a terminal would act on, and secrets masked.

/// Most bytes of a command line, executable path or program name shown
/// (the cut marked by `…`).
pub const MAX_SHOWN: usize = 512;

/// What a cut text ends with.
const CUT: char = '…';

/// What stands for the value of an argument that looks like a secret.
pub const MASKED: &str = "***";

/// Words that make an option's value a secret (`--password=x`,
/// `db.token=x`, `--api-key x`), compared in lower case.
const SECRET_WORDS: [&str; 8] = [
    "password",
    "passwd",
    "secret",
    "token",
    "apikey",
    "api-key",
    "api_key",
    "credential",
];

/// `raw` (NUL-separated arguments, as `/proc/PID/cmdline` holds them) as
/// one line of at most [`MAX_SHOWN`] bytes: arguments joined by spaces,
/// invalid UTF-8 replaced, control and bidirectional characters escaped,
/// secret-looking values masked ([`mask_secrets`]). `cut` says the raw
/// bytes were already cut short by their read.
pub fn command_line(raw: &[u8], cut: bool) -> String {
    let raw = raw.strip_suffix(b"\0").unwrap_or(raw);
    let args: Vec<String> = raw
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let args = mask_secrets(args);
    let mut out = String::new();
    for (i, arg) in args.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        escape_into(&mut out, arg);
        if out.len() > MAX_SHOWN {
            break;
        }
    }
    bounded(out, cut)
}

/// A text (a path, a name) as one line of at most [`MAX_SHOWN`] bytes,
/// escaped as [`command_line`] does.
pub fn text(s: &str) -> String {
    let mut out = String::new();
    escape_into(&mut out, s);
    bounded(out, false)
}

/// `s` cut at a character boundary to fit [`MAX_SHOWN`] with its `…`,
/// which it also ends with when `cut`.
fn bounded(mut s: String, cut: bool) -> String {
    if s.len() <= MAX_SHOWN && !cut {
        return s;
    }
    let mut end = s.len().min(MAX_SHOWN - CUT.len_utf8());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push(CUT);
    s
}

/// Appends `s`, each control character (C0, DEL, C1) and each
/// character that reorders text on screen (bidirectional controls)
/// written as an escape (`\n`, `\x1b`, `\u{202e}`), and a backslash as
/// `\\` so that an escape is never forged.
fn escape_into(out: &mut String, s: &str) {
    use std::fmt::Write as _;
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() || is_bidi(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
        // Escapes grow the text: stop well past the bound.
        if out.len() > 2 * MAX_SHOWN {
            return;
        }
    }
}

/// Characters that change the order text is shown in (as in "Trojan
/// Source"), or hide themselves.
fn is_bidi(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Whether an option's name looks like it holds a secret.
fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    SECRET_WORDS.iter().any(|w| key.contains(w))
}

/// The arguments with the value of each secret-looking one masked:
/// `KEY=VALUE` whose key names a secret (`--password=x`, `token=x`,
/// `-Ddb.password=x`) keeps `KEY=`; an option that names one without `=`
/// (`--password x`) masks the next argument.
pub fn mask_secrets(mut args: Vec<String>) -> Vec<String> {
    let mut mask_next = false;
    for arg in &mut args {
        if std::mem::take(&mut mask_next) {
            *arg = MASKED.to_string();
            continue;
        }
        match arg.split_once('=') {
            Some((key, value)) if is_secret_key(key) && !value.is_empty() => {
                *arg = format!("{key}={MASKED}");
            }
            Some(_) => {}
            None => mask_next = arg.starts_with("--") && is_secret_key(arg),
        }
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_become_one_clean_line() {
        let raw = b"python3\0-u\0/srv/app.py\0--port\08080\0";
        assert_eq!(
            command_line(raw, false),
            "python3 -u /srv/app.py --port 8080"
        );
        assert_eq!(command_line(b"", false), "");
        // Escapes a terminal would act on, forged escapes, line breaks,
        // bidirectional overrides, C1 controls.
        let hostile = "a\x1b[2J\nb\\x1b\u{202e}c\u{9b}d".as_bytes();
        assert_eq!(
            command_line(hostile, false),
            "a\\x1b[2J\\nb\\\\x1b\\u{202e}c\\u{9b}d"
        );
        // Invalid UTF-8 is replaced, NULs inside separate arguments.
        assert_eq!(
            command_line(b"x\xff\xfey\0\0z", false),
            "x\u{fffd}\u{fffd}y  z"
        );
        assert!(!command_line(&[0xc3, 0x28, 7, 0x7f], false)
            .chars()
            .any(char::is_control));
    }

    #[test]
    fn long_lines_are_cut_at_a_character_with_a_mark() {
        // A 1 MiB argument list of multi-byte characters.
        let huge = "é".repeat(512 * 1024) + "\0" + &"x".repeat(10);
        let line = command_line(huge.as_bytes(), false);
        assert!(
            line.len() <= MAX_SHOWN && line.ends_with('…'),
            "{}",
            line.len()
        );
        assert!(line.starts_with("éé"));
        // A million escapes stay bounded too.
        let escapes = vec![0x1bu8; 1 << 20];
        let line = command_line(&escapes, false);
        assert!(line.len() <= MAX_SHOWN && line.ends_with('…'));
        assert!(line.starts_with("\\x1b\\x1b"));
        // A line whose read was cut says so even when short.
        assert_eq!(command_line(b"java\0-cp", true), "java -cp…");
        assert_eq!(text("/usr/bin/\x07bell"), "/usr/bin/\\x07bell");
    }

    #[test]
    fn secret_looking_values_are_masked() {
        let raw = b"app\0--password=hunter2\0--db-token\0abc\0-Dapp.secret=s\0--user=bob\0token=\0";
        assert_eq!(
            command_line(raw, false),
            "app --password=*** --db-token *** -Dapp.secret=*** --user=bob token="
        );
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            mask_secrets(args(&["x", "--API-KEY", "k", "tail"])),
            args(&["x", "--API-KEY", MASKED, "tail"])
        );
    }
}
