//! Running a BPF task iterator again and again. aya 0.14 makes an
//! iterator's file once, consuming the link; the drainer needs a fresh file
//! from the same link at every drain, so the two `bpf(2)` commands are here;
//! and attaching a loaded `tp_btf` program for a while (aya keeps its links
//! inside the `Ebpf` object, out of reach of the API's threads).

use std::{
    fs::File,
    io::{self, Read},
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
};

/// `BPF_LINK_CREATE` (`enum bpf_cmd`).
const LINK_CREATE: libc::c_long = 28;
/// `BPF_ITER_CREATE` (`enum bpf_cmd`).
const ITER_CREATE: libc::c_long = 33;
/// `BPF_RAW_TRACEPOINT_OPEN` (`enum bpf_cmd`).
const RAW_TRACEPOINT_OPEN: libc::c_long = 17;
/// `BPF_TRACE_ITER` (`enum bpf_attach_type`).
const TRACE_ITER: u32 = 28;

/// The `link_create` member of `union bpf_attr`, for iterators.
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    /// Address of iterator options (none: every task).
    iter_info: u64,
    iter_info_len: u32,
    _pad: [u32; 9],
}

/// The `iter_create` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct IterCreateAttr {
    link_fd: u32,
    flags: u32,
}

/// The `raw_tracepoint` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct RawTracepointAttr {
    /// No name: a `tp_btf` program names its tracepoint itself.
    name: u64,
    prog_fd: u32,
    _pad: u32,
}

/// Attaches the loaded `tp_btf` program `prog` to its tracepoint until the
/// returned link is dropped.
pub fn attach_tp_btf(prog: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let mut attr = RawTracepointAttr {
        prog_fd: prog.as_raw_fd() as u32,
        ..Default::default()
    };
    let fd = bpf(RAW_TRACEPOINT_OPEN, &mut attr)?;
    // SAFETY: the kernel just returned this fd, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An attached iterator program.
#[derive(Debug)]
pub struct TaskIter {
    link: OwnedFd,
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<RawFd> {
    // SAFETY: `attr` is a live, fully initialised bpf_attr member of the
    // size passed; the kernel only reads it.
    let ret =
        unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, std::mem::size_of::<T>()) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as RawFd)
    }
}

impl TaskIter {
    /// Attaches the loaded iterator program `prog` to every task.
    pub fn attach(prog: BorrowedFd<'_>) -> io::Result<TaskIter> {
        let mut attr = LinkCreateAttr {
            prog_fd: prog.as_raw_fd() as u32,
            attach_type: TRACE_ITER,
            ..Default::default()
        };
        let fd = bpf(LINK_CREATE, &mut attr)?;
        // SAFETY: the kernel just returned this fd, owned by nobody else.
        Ok(TaskIter {
            link: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Runs the iterator once, appending its whole output to `out`.
    pub fn run(&self, out: &mut Vec<u8>) -> io::Result<()> {
        let mut attr = IterCreateAttr {
            link_fd: self.link.as_raw_fd() as u32,
            flags: 0,
        };
        let fd = bpf(ITER_CREATE, &mut attr)?;
        // SAFETY: as above.
        let mut file = unsafe { File::from_raw_fd(fd) };
        file.read_to_end(out)?;
        Ok(())
    }
}
