//! The bearer token of `--token-file`: read safely, compared in constant
//! time, never printed.

use std::{
    fmt,
    fs::File,
    io::Read,
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::Path,
};

use thiserror::Error;

/// Largest token file read: a token is a few dozen bytes, and the daemon
/// runs as root, so a wrong path must not make it read a huge file.
const MAX_FILE_BYTES: u64 = 4096;

/// Mode bits that let users other than the owner and group read or write
/// the file: with them, any local user could take or replace the token.
const OTHER_ACCESS: u32 = 0o006;

/// Why a token file was refused.
#[derive(Debug, Error)]
pub enum TokenFileError {
    #[error("cannot open it: {0}")]
    Open(#[source] std::io::Error),
    #[error("it is a symbolic link; give the file it points to")]
    Symlink,
    #[error("it is not a regular file")]
    NotRegular,
    #[error("its mode {mode:03o} lets other users read or write it (run `chmod o-rwx` on it)")]
    Exposed { mode: u32 },
    #[error("cannot read it: {0}")]
    Read(#[source] std::io::Error),
    #[error("it is larger than {MAX_FILE_BYTES} bytes")]
    TooLarge,
    #[error("it holds no token (empty or only whitespace)")]
    Empty,
    #[error("the token must be printable ASCII without spaces (it is sent in an HTTP header)")]
    BadCharacters,
}

/// A bearer token. `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Vec<u8>);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// A token from its text, which must be printable ASCII without spaces.
    pub fn new(text: &str) -> Result<Token, TokenFileError> {
        if text.is_empty() {
            return Err(TokenFileError::Empty);
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenFileError::BadCharacters);
        }
        Ok(Token(text.as_bytes().to_vec()))
    }

    /// Reads the token from `path`: whitespace around it is trimmed. The
    /// file is opened without following a symbolic link and without
    /// blocking (a FIFO would hang the start), and refused unless it is a
    /// regular file that other users can neither read nor write.
    pub fn from_file(path: &Path) -> Result<Token, TokenFileError> {
        let file = File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => TokenFileError::Symlink,
                _ => TokenFileError::Open(e),
            })?;
        // Checked on the open file, not the path: nothing can swap it between
        // the check and the read.
        let meta = file.metadata().map_err(TokenFileError::Read)?;
        if !meta.file_type().is_file() {
            return Err(TokenFileError::NotRegular);
        }
        if meta.mode() & OTHER_ACCESS != 0 {
            return Err(TokenFileError::Exposed {
                mode: meta.mode() & 0o777,
            });
        }
        let mut bytes = Vec::new();
        file.take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(TokenFileError::Read)?;
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(TokenFileError::TooLarge);
        }
        let text = std::str::from_utf8(&bytes).map_err(|_| TokenFileError::BadCharacters)?;
        Token::new(text.trim())
    }

    /// The token's text, to send it (printable ASCII: [`Token::new`]
    /// checks).
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// Whether `given` is the token, in time that depends only on the
    /// token's length, not on where `given` first differs: a timing
    /// difference would let a client guess the token byte by byte.
    pub fn matches(&self, given: &[u8]) -> bool {
        let mut diff = u8::from(given.len() != self.0.len());
        for (i, expected) in self.0.iter().enumerate() {
            let got = given.get(i).copied().unwrap_or(0);
            diff |= expected ^ got;
        }
        std::hint::black_box(diff) == 0
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn file_with(dir: &Path, name: &str, text: &str, mode: u32) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn matches_only_the_exact_token() {
        let t = Token::new("s3cret-token").unwrap();
        assert!(t.matches(b"s3cret-token"));
        for wrong in [
            &b""[..],
            b"s3cret-toke",
            b"s3cret-tokenX",
            b"S3cret-token",
            b"x",
        ] {
            assert!(!t.matches(wrong), "{wrong:?}");
        }
        assert_eq!(format!("{t:?}"), "Token(..)");
    }

    #[test]
    fn reads_a_private_file_and_trims_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_with(dir.path(), "t", "  abc123\n", 0o640);
        assert!(Token::from_file(&path).unwrap().matches(b"abc123"));
    }

    #[test]
    fn refuses_unsafe_or_useless_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let readable = file_with(d, "r", "abc", 0o644);
        assert!(matches!(
            Token::from_file(&readable),
            Err(TokenFileError::Exposed { mode: 0o644 })
        ));
        let writable = file_with(d, "w", "abc", 0o602);
        assert!(matches!(
            Token::from_file(&writable),
            Err(TokenFileError::Exposed { .. })
        ));
        let empty = file_with(d, "e", " \n\t", 0o600);
        assert!(matches!(
            Token::from_file(&empty),
            Err(TokenFileError::Empty)
        ));
        let spaced = file_with(d, "s", "two words", 0o600);
        assert!(matches!(
            Token::from_file(&spaced),
            Err(TokenFileError::BadCharacters)
        ));
        let big = file_with(d, "b", &"x".repeat(5000), 0o600);
        assert!(matches!(
            Token::from_file(&big),
            Err(TokenFileError::TooLarge)
        ));
        let link = d.join("link");
        std::os::unix::fs::symlink(file_with(d, "ok", "abc", 0o600), &link).unwrap();
        assert!(matches!(
            Token::from_file(&link),
            Err(TokenFileError::Symlink)
        ));
        assert!(matches!(
            Token::from_file(d),
            Err(TokenFileError::NotRegular)
        ));
        assert!(matches!(
            Token::from_file(&d.join("missing")),
            Err(TokenFileError::Open(_))
        ));
    }
}
