//! Python objects read from outside: strings, ints, dicts and instance
//! attributes, each bounded by a constant here whatever the process holds.

use std::ops::ControlFlow;

use super::{
    layout::{Keys, Layout, Managed, TPFLAGS_INLINE_VALUES, TPFLAGS_MANAGED_DICT},
    PyError,
};
use crate::process::remote::{uint_at, Remote};

/// Longest string kept, in bytes of UTF-8: longer ones are cut.
pub const MAX_STR_BYTES: usize = 256;
/// Longest string length (in characters) taken as a string at all.
pub const MAX_STR_LEN: u64 = 1 << 24;
/// Dict entries looked at, at most, per dict.
pub const MAX_DICT_ENTRIES: u64 = 1 << 15;
/// Dict entries read at once.
const DICT_CHUNK: u64 = 64;
/// Largest `tp_basicsize` or `tp_dictoffset` taken as plausible.
const MAX_OBJECT_SIZE: u64 = 1 << 16;
/// User addresses end below this.
const USER_END: u64 = 1 << 47;

/// `len` bytes at `addr`.
pub(super) fn read(mem: &Remote, addr: u64, len: usize) -> Result<Vec<u8>, PyError> {
    mem.bytes(addr, len)
        .map_err(|e| PyError::Read(format!("{len} bytes at {addr:#x}: {e}")))
}

/// The u64 at `addr`.
pub(super) fn read_u64(mem: &Remote, addr: u64) -> Result<u64, PyError> {
    mem.u64(addr)
        .map_err(|e| PyError::Read(format!("8 bytes at {addr:#x}: {e}")))
}

/// The u64 at `off` in `buf` (0 outside it).
pub(super) fn u64_in(buf: &[u8], off: u64) -> u64 {
    uint_at(buf, off as usize, 8)
}

/// `base + off`, refused when it wraps.
pub(super) fn add(base: u64, off: u64) -> Result<u64, PyError> {
    base.checked_add(off)
        .ok_or_else(|| PyError::Implausible(format!("{base:#x} + {off:#x} wraps")))
}

/// `value` as a pointer to an object or structure: non-null, a user
/// address, 8-byte aligned.
pub(super) fn pointer(value: u64, what: &str) -> Result<u64, PyError> {
    if value == 0 || value >= USER_END || !value.is_multiple_of(8) {
        return Err(PyError::Implausible(format!("{what} at {value:#x}")));
    }
    Ok(value)
}

/// What a thread or frame name may hold in a folded stack: `;`, line
/// breaks and control characters become `_`.
pub fn sanitize(c: char) -> char {
    if c == ';' || c.is_control() || c == '\u{2028}' || c == '\u{2029}' {
        '_'
    } else {
        c
    }
}

/// Addresses of the types objects are checked against (0: unknown).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Types {
    pub code: u64,
    pub str: u64,
    pub long: u64,
    pub dict: u64,
    pub module: u64,
}

/// Reads objects of one interpreter.
pub(super) struct Objects<'a> {
    pub mem: &'a Remote,
    pub layout: &'a Layout,
    pub types: &'a Types,
}

/// Where a dict's entries are and how to read them.
#[derive(Debug, Clone, Copy)]
pub(super) struct DictView {
    entries: u64,
    entry_size: u64,
    key_at: u64,
    value_at: u64,
    count: u64,
    /// A split table's values array (the values are there, by entry index).
    values: Option<u64>,
}

impl Objects<'_> {
    /// `addr` checked to be an object of type `ty` (when known).
    fn check_type(&self, addr: u64, ty: u64, what: &str) -> Result<(), PyError> {
        pointer(addr, what)?;
        if ty != 0 && read_u64(self.mem, addr + 8)? != ty {
            return Err(PyError::Implausible(format!(
                "{what} at {addr:#x}: not one"
            )));
        }
        Ok(())
    }

    /// The `str` at `addr` (compact strings only: names and file names
    /// always are), cut at [`MAX_STR_BYTES`], sanitized.
    pub fn string(&self, addr: u64) -> Result<String, PyError> {
        let l = self.layout;
        pointer(addr, "string")?;
        let head = read(self.mem, addr, l.ascii_size as usize)?;
        if self.types.str != 0 && u64_in(&head, 8) != self.types.str {
            return Err(PyError::Implausible(format!("{addr:#x}: not a str")));
        }
        let length = u64_in(&head, l.str_length);
        if length > MAX_STR_LEN {
            return Err(PyError::Implausible(format!("str of {length} characters")));
        }
        let state = uint_at(&head, l.str_state as usize, 4);
        let kind = (state >> 2) & 7;
        let compact = state & (1 << 5) != 0;
        let ascii = state & (1 << 6) != 0;
        let ready = !l.str_ready_bit || state & (1 << 7) != 0;
        if !compact || !ready || !matches!(kind, 1 | 2 | 4) || (ascii && kind != 1) {
            return Err(PyError::Implausible(format!(
                "{addr:#x}: str state {state:#x} not compact"
            )));
        }
        let data = addr + if ascii { l.ascii_size } else { l.compact_size };
        // Each character is at least one byte of UTF-8: more than
        // MAX_STR_BYTES characters are never needed.
        let chars = length.min(MAX_STR_BYTES as u64) as usize;
        let raw = read(self.mem, data, chars * kind as usize)?;
        let mut out = String::new();
        for unit in raw.chunks_exact(kind as usize) {
            let code = uint_at(unit, 0, kind as usize) as u32;
            let c = match char::from_u32(code) {
                Some(c) if !ascii || c.is_ascii() => sanitize(c),
                _ => '_',
            };
            if out.len() + c.len_utf8() > MAX_STR_BYTES {
                break;
            }
            out.push(c);
        }
        Ok(out)
    }

    /// Whether the object at `addr` is the compact ASCII `str` `name`
    /// (one read).
    pub fn string_is(&self, addr: u64, name: &str) -> Result<bool, PyError> {
        let l = self.layout;
        pointer(addr, "string")?;
        let buf = read(self.mem, addr, l.ascii_size as usize + name.len())?;
        let state = uint_at(&buf, l.str_state as usize, 4);
        let compact_ascii = state & (3 << 5) == 3 << 5;
        Ok(compact_ascii
            && (self.types.str == 0 || u64_in(&buf, 8) == self.types.str)
            && u64_in(&buf, l.str_length) == name.len() as u64
            && &buf[l.ascii_size as usize..] == name.as_bytes())
    }

    /// The non-negative `int` at `addr` that fits a u64 (three 30-bit
    /// digits at most are read).
    pub fn uint(&self, addr: u64) -> Result<u64, PyError> {
        let l = self.layout;
        pointer(addr, "int")?;
        let head = read(self.mem, addr, l.long_digits as usize)?;
        if self.types.long != 0 && u64_in(&head, 8) != self.types.long {
            return Err(PyError::Implausible(format!("{addr:#x}: not an int")));
        }
        let size = u64_in(&head, l.long_size);
        let digits = if l.long_tag {
            // lv_tag: digits << 3 | sign (0 positive, 1 zero, 2 negative).
            match size & 3 {
                0 => size >> 3,
                1 => 0,
                _ => return Err(PyError::Implausible("negative int".into())),
            }
        } else if (size as i64) < 0 {
            return Err(PyError::Implausible("negative int".into()));
        } else {
            size
        };
        if digits > 3 {
            return Err(PyError::Implausible(format!("int of {digits} digits")));
        }
        let raw = read(self.mem, addr + l.long_digits, digits as usize * 4)?;
        let mut value: u128 = 0;
        for (i, d) in raw.chunks_exact(4).enumerate() {
            value |= u128::from(uint_at(d, 0, 4) as u32 & 0x3fff_ffff) << (30 * i);
        }
        u64::try_from(value).map_err(|_| PyError::Implausible("int over 64 bits".into()))
    }

    /// The entries of the dict at `addr`.
    pub fn dict(&self, addr: u64) -> Result<DictView, PyError> {
        self.check_type(addr, self.types.dict, "dict")?;
        let l = self.layout;
        let buf = read(self.mem, addr, (l.ma_values + 8) as usize)?;
        let values = u64_in(&buf, l.ma_values);
        let values = if values == 0 {
            None
        } else {
            Some(add(pointer(values, "dict values")?, l.values_at)?)
        };
        self.keys(u64_in(&buf, l.ma_keys), values)
    }

    /// The entries of the keys object at `addr`, with their values in
    /// `values` (split tables) or in the entries.
    pub fn keys(&self, addr: u64, values: Option<u64>) -> Result<DictView, PyError> {
        pointer(addr, "dict keys")?;
        let l = self.layout;
        let bad = |what: String| PyError::Implausible(format!("dict keys at {addr:#x}: {what}"));
        match l.keys {
            Keys::V10 => {
                // dk_refcnt, dk_size, dk_lookup, dk_usable, dk_nentries,
                // then the indices.
                let buf = read(self.mem, addr, 40)?;
                let size = u64_in(&buf, 8);
                let count = u64_in(&buf, 32);
                if !size.is_power_of_two() || size > 1 << 40 || count > size {
                    return Err(bad(format!("{count} entries of {size}")));
                }
                let index_bytes = match size {
                    0..=0xff => 1,
                    0x100..=0xffff => 2,
                    0x1_0000..=0xffff_ffff => 4,
                    _ => 8,
                };
                Ok(DictView {
                    entries: add(addr, 40 + size * index_bytes)?,
                    entry_size: 24,
                    key_at: 8,
                    value_at: 16,
                    count,
                    values,
                })
            }
            Keys::V11 => {
                // dk_refcnt, dk_log2_size, dk_log2_index_bytes, dk_kind,
                // dk_version, dk_usable, dk_nentries, then the indices.
                let buf = read(self.mem, addr, 32)?;
                let (log2_size, log2_index, kind) = (buf[8], buf[9], buf[10]);
                let count = u64_in(&buf, 24);
                if log2_size > 40
                    || !(log2_size..=log2_size + 3).contains(&log2_index)
                    || count > 1 << log2_size
                {
                    return Err(bad(format!("{count} entries, log2 size {log2_size}")));
                }
                let (entry_size, key_at, value_at) = match kind {
                    0 => (24, 8, 16),
                    1 | 2 => (16, 0, 8),
                    _ => return Err(bad(format!("kind {kind}"))),
                };
                Ok(DictView {
                    entries: add(addr, 32 + (1u64 << log2_index))?,
                    entry_size,
                    key_at,
                    value_at,
                    count,
                    values,
                })
            }
        }
    }

    /// Calls `f(key, value)` for each live entry of `dict` in order, the
    /// first [`MAX_DICT_ENTRIES`] at most, until it breaks.
    pub fn each<B>(
        &self,
        dict: &DictView,
        mut f: impl FnMut(u64, u64) -> ControlFlow<B>,
    ) -> Result<Option<B>, PyError> {
        let count = dict.count.min(MAX_DICT_ENTRIES);
        let mut first = 0;
        while first < count {
            let n = DICT_CHUNK.min(count - first);
            let entries = read(
                self.mem,
                add(dict.entries, first * dict.entry_size)?,
                (n * dict.entry_size) as usize,
            )?;
            let values = match dict.values {
                Some(at) => Some(read(self.mem, add(at, first * 8)?, n as usize * 8)?),
                None => None,
            };
            for i in 0..n {
                let key = u64_in(&entries, i * dict.entry_size + dict.key_at);
                let value = match &values {
                    Some(v) => u64_in(v, i * 8),
                    None => u64_in(&entries, i * dict.entry_size + dict.value_at),
                };
                if key == 0 || value == 0 {
                    continue;
                }
                if let ControlFlow::Break(b) = f(key, value) {
                    return Ok(Some(b));
                }
            }
            first += n;
        }
        Ok(None)
    }

    /// The value of the ASCII `str` key `name` in `dict`.
    pub fn get(&self, dict: &DictView, name: &str) -> Result<Option<u64>, PyError> {
        let mut failed = None;
        let found = self.each(dict, |key, value| match self.string_is(key, name) {
            Ok(true) => ControlFlow::Break(value),
            Ok(false) => ControlFlow::Continue(()),
            // A key that cannot be read is not the one: go on, but a spent
            // budget ends it.
            Err(e) => {
                if self.mem.exhausted() {
                    failed = Some(e);
                    ControlFlow::Break(0)
                } else {
                    ControlFlow::Continue(())
                }
            }
        })?;
        match failed {
            Some(e) => Err(e),
            None => Ok(found),
        }
    }

    /// The attribute `name` of the instance at `obj` as its `__dict__`
    /// (or, 3.11+, its managed values) holds it.
    pub fn attribute(&self, obj: u64, name: &str) -> Result<Option<u64>, PyError> {
        let l = self.layout;
        pointer(obj, "instance")?;
        let ty = pointer(read_u64(self.mem, obj + 8)?, "type")?;
        let tp = read(self.mem, ty, l.type_span())?;
        let flags = u64_in(&tp, l.tp_flags);
        // Words before the object (3.11+: -4 values or weakrefs, -3 dict).
        let before = |words: u64| {
            obj.checked_sub(8 * words)
                .ok_or_else(|| PyError::Implausible("instance at the bottom".into()))
        };
        let cached_keys = || pointer(u64_in(&tp, l.ht_cached_keys), "cached keys");
        let view = if l.managed == Managed::DictOffset || flags & TPFLAGS_MANAGED_DICT == 0 {
            let off = u64_in(&tp, l.tp_dictoffset) as i64;
            if off <= 0 || off as u64 > MAX_OBJECT_SIZE {
                return Ok(None);
            }
            match read_u64(self.mem, obj + off as u64)? {
                0 => return Ok(None),
                dict => self.dict(dict)?,
            }
        } else {
            match l.managed {
                Managed::DictOffset => unreachable!("handled above"),
                Managed::Values11 => {
                    let values = read_u64(self.mem, before(4)?)?;
                    let dict = read_u64(self.mem, before(3)?)?;
                    if values != 0 {
                        self.keys(cached_keys()?, Some(pointer(values, "values")?))?
                    } else if dict != 0 {
                        self.dict(dict)?
                    } else {
                        return Ok(None);
                    }
                }
                Managed::Tagged12 => match read_u64(self.mem, before(3)?)? {
                    0 => return Ok(None),
                    v if v & 1 == 1 => {
                        let values = pointer(v.wrapping_add(1), "values")?;
                        self.keys(cached_keys()?, Some(values))?
                    }
                    dict => self.dict(dict)?,
                },
                Managed::Inline13 => {
                    let dict = read_u64(self.mem, before(3)?)?;
                    if dict != 0 {
                        self.dict(dict)?
                    } else if flags & TPFLAGS_INLINE_VALUES != 0 {
                        let size = u64_in(&tp, l.tp_basicsize);
                        if size == 0 || size > MAX_OBJECT_SIZE {
                            return Err(PyError::Implausible(format!("basicsize {size}")));
                        }
                        // capacity, size, embedded, valid, then the values.
                        let values = obj + size;
                        let head = read(self.mem, values, 4)?;
                        if head[3] == 0 {
                            return Ok(None);
                        }
                        let mut view = self.keys(cached_keys()?, Some(values + l.values_at))?;
                        view.count = view.count.min(u64::from(head[0]));
                        view
                    } else {
                        return Ok(None);
                    }
                }
            }
        };
        self.get(&view, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::layout;

    /// A 3.12 str object in our own memory: header words, then `data`
    /// (at 40 for ASCII, 56 for others).
    fn str_object(length: u64, state: u32, data: &[u8]) -> Vec<u64> {
        let mut words = vec![1, 0, length, 0, u64::from(state)];
        if state & ASCII != ASCII {
            words.extend([0, 0]);
        }
        let mut bytes = data.to_vec();
        bytes.resize(data.len().div_ceil(8) * 8, 0);
        words.extend(
            bytes
                .chunks(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap())),
        );
        words
    }

    /// compact, ascii, kind 1 / compact, kind `kind`.
    const ASCII: u32 = 1 << 6 | 1 << 5 | 1 << 2;
    fn compact(kind: u32) -> u32 {
        1 << 5 | kind << 2
    }

    #[test]
    fn strings_are_cut_sanitized_and_bounded() {
        let layout = layout::table(12).unwrap();
        let types = Types::default();
        let mem = Remote::new(std::process::id());
        let objects = Objects {
            mem: &mem,
            layout: &layout,
            types: &types,
        };
        // 3.12: ASCII data at 40, other compact data at 56.
        let read = |words: &Vec<u64>| objects.string(words.as_ptr() as u64);
        let ascii = |text: &[u8]| str_object(text.len() as u64, ASCII, text);
        assert_eq!(read(&ascii(b"a;b\nc")).unwrap(), "a_b_c");
        assert_eq!(read(&ascii(b"")).unwrap(), "");
        assert_eq!(read(&ascii(&[b'x'; 1000])).unwrap(), "x".repeat(256));
        assert!(objects
            .string_is(ascii(b"_name").as_ptr() as u64, "_name")
            .unwrap());
        assert!(!objects
            .string_is(ascii(b"_nam").as_ptr() as u64, "_name")
            .unwrap());
        // UCS2: two-byte characters, cut at 256 bytes of UTF-8; a lone
        // surrogate is replaced.
        let e: Vec<u8> = "é"
            .repeat(200)
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .collect();
        assert_eq!(
            read(&str_object(200, compact(2), &e)).unwrap(),
            "é".repeat(128)
        );
        let lone = [0x00, 0xd8, b'a', 0];
        assert_eq!(read(&str_object(2, compact(2), &lone)).unwrap(), "_a");
        // UCS4.
        let smile = 0x1f600u32.to_le_bytes();
        assert_eq!(read(&str_object(1, compact(4), &smile)).unwrap(), "😀");
        // Absurd lengths, kinds and layouts: refused before reading data.
        for (length, state) in [
            (1 << 40, ASCII),
            (u64::MAX, ASCII),
            (4, 1 << 6 | 1 << 2),
            (4, compact(3)),
            (4, 1 << 6 | compact(2)),
        ] {
            let w = str_object(length, state, b"abcd");
            assert!(
                matches!(read(&w), Err(PyError::Implausible(_))),
                "{length} {state:#x}"
            );
        }
        assert!(objects.string(0).is_err());
        assert!(objects.string(8).is_err());
    }

    #[test]
    fn ints_of_3_10_and_3_12() {
        let mem = Remote::new(std::process::id());
        let types = Types::default();
        let ident: u64 = 0x7f12_3456_789a;
        let digits = [ident & 0x3fff_ffff, (ident >> 30) & 0x3fff_ffff];
        let digit_word = digits[0] | digits[1] << 32;
        for minor in [10, 12] {
            let layout = layout::table(minor).unwrap();
            let objects = Objects {
                mem: &mem,
                layout: &layout,
                types: &types,
            };
            let (two, negative, zero, huge) = if minor == 12 {
                (2 << 3, 2 << 3 | 2, 1, 9 << 3)
            } else {
                (2, -2i64 as u64, 0, 9)
            };
            let int = |size: u64| vec![1, 0, size, digit_word];
            assert_eq!(objects.uint(int(two).as_ptr() as u64), Ok(ident));
            assert_eq!(objects.uint(int(zero).as_ptr() as u64), Ok(0));
            assert!(objects.uint(int(negative).as_ptr() as u64).is_err());
            assert!(objects.uint(int(huge).as_ptr() as u64).is_err());
        }
    }

    #[test]
    fn sanitizing_keeps_folded_stacks_whole() {
        let s: String = "a;b\nc\td\u{7f}e\u{2028}é".chars().map(sanitize).collect();
        assert_eq!(s, "a_b_c_d_e_é");
    }

    #[test]
    fn pointers_are_user_aligned_and_not_null() {
        assert!(pointer(0, "x").is_err());
        assert!(pointer(0x1001, "x").is_err());
        assert!(pointer(1 << 47, "x").is_err());
        assert_eq!(pointer(0x7f00_0000_1000, "x"), Ok(0x7f00_0000_1000));
    }
}
