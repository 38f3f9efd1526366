//! What a wait is, read from its state and stack: waiting for the GIL, at
//! rest (for work, a timer, an event loop: no one suffers), in a lock or
//! a join, on I/O or a downstream (a socket, a file, a pipe), or unknown;
//! and where it waits from (the application's frame, not the library's).

use serde::Serialize;

use crate::profile::{
    model::{state::State, GIL_FRAME},
    report::stuck::{self, is_java, is_machinery, plain},
};

/// What a thread waited on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitClass {
    /// For a Python interpreter's GIL.
    Gil,
    /// For new work, a timer or events: a thread at rest.
    Rest,
    /// For a lock, or for another thread's result (a join, a future).
    Lock,
    /// On a device or a peer.
    Io(Object),
    /// Blocked in a way the stack does not tell (not counted as lost).
    Other,
}

/// What an I/O wait waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Object {
    Socket,
    File,
    Pipe,
    /// A device the stack does not name (disk I/O in the kernel, say).
    Device,
}

impl Object {
    pub fn name(self) -> &'static str {
        match self {
            Object::Socket => "socket",
            Object::File => "file",
            Object::Pipe => "pipe",
            Object::Device => "device",
        }
    }
}

/// Syscalls a thread at rest blocks in: sleeps, event loops, waiting for
/// a child, a signal or a client.
const RESTING_SYSCALLS: [&str; 13] = [
    "nanosleep",
    "clock_nanosleep",
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
    "wait4",
    "waitid",
    "pause",
    "rt_sigtimedwait",
    "rt_sigsuspend",
    "accept",
    "accept4",
    "io_uring_enter",
];

/// Frames of a thread waiting for work or time to pass (Java, Python,
/// native).
const RESTING_FRAMES: [&str; 20] = [
    "ThreadPoolExecutor.getTask",
    "LinkedBlockingQueue.take",
    "LinkedBlockingQueue.poll",
    "ArrayBlockingQueue.take",
    "ArrayBlockingQueue.poll",
    "SynchronousQueue",
    "DelayedWorkQueue",
    "LinkedTransferQueue",
    "ForkJoinPool.awaitWork",
    "ReferenceQueue.remove",
    "Thread.sleep",
    "EPoll.wait",
    "pthread_cond_wait",
    "pthread_cond_timedwait",
    "pthread_cond_clockwait",
    "Condition.wait (",
    "Event.wait (",
    "Queue.get (",
    "select (",
    "sleep (",
];

/// Frames of a lock acquisition the stuck report does not list (Java
/// monitors, the JDK's locks).
const LOCK_FRAMES: [&str; 4] = [
    "ObjectSynchronizer::enter",
    "ObjectMonitor::enter",
    "AbstractQueuedSynchronizer.acquire",
    "lll_lock_wait",
];

/// Frames that name the object of an I/O wait, with it.
const OBJECT_FRAMES: [(&str, Object); 16] = [
    ("tcp_", Object::Socket),
    ("udp_", Object::Socket),
    ("unix_stream", Object::Socket),
    ("unix_dgram", Object::Socket),
    ("sock_", Object::Socket),
    ("inet_", Object::Socket),
    ("Socket", Object::Socket),
    ("socket.py", Object::Socket),
    ("ssl.py", Object::Socket),
    ("pipe_", Object::Pipe),
    ("FileDispatcher", Object::File),
    ("FileInputStream", Object::File),
    ("RandomAccessFile", Object::File),
    ("ext4_", Object::File),
    ("xfs_", Object::File),
    ("filemap_", Object::File),
];

/// Syscalls that name their object.
const SOCKET_SYSCALLS: [&str; 7] = [
    "recvfrom", "recvmsg", "recvmmsg", "sendto", "sendmsg", "connect", "recv",
];

/// Java packages of the platform: not the application's frames.
const JDK_PACKAGES: [&str; 5] = ["java.", "javax.", "jdk.", "sun.", "com.sun."];

/// Python files of the standard library a wait passes through.
const PYTHON_LIBRARY: [&str; 7] = [
    "(threading.py:",
    "(socket.py:",
    "(selectors.py:",
    "(queue.py:",
    "(ssl.py:",
    "(socketserver.py:",
    "(subprocess.py:",
];

/// The syscall of an off-CPU stack without a kernel stack
/// (`[syscall read]`), if named.
pub fn syscall(stack: &[impl AsRef<str>]) -> Option<&str> {
    stack.iter().rev().find_map(|f| {
        f.as_ref()
            .strip_prefix("[syscall ")
            .and_then(|s| s.strip_suffix(']'))
    })
}

/// What an I/O wait in `stack` waits on, if a frame or its syscall says.
fn object(stack: &[impl AsRef<str>], syscall: Option<&str>) -> Option<Object> {
    let named = stack.iter().rev().find_map(|f| {
        let f = f.as_ref();
        OBJECT_FRAMES
            .iter()
            .find(|(mark, _)| f.contains(mark))
            .map(|&(_, o)| o)
    });
    named.or_else(|| {
        syscall
            .filter(|s| SOCKET_SYSCALLS.contains(s))
            .map(|_| Object::Socket)
    })
}

fn any_frame(stack: &[impl AsRef<str>], marks: &[&str]) -> bool {
    stack
        .iter()
        .any(|f| marks.iter().any(|m| f.as_ref().contains(m)))
}

/// What a wait in `state` with `stack` (outermost frame first) is.
pub fn classify(state: State, stack: &[impl AsRef<str>]) -> WaitClass {
    if stack.iter().any(|f| f.as_ref() == GIL_FRAME) {
        return WaitClass::Gil;
    }
    let syscall = syscall(stack);
    let object = object(stack, syscall);
    match state {
        State::Io => WaitClass::Io(object.unwrap_or(Object::Device)),
        State::Futex => {
            let innermost_first: Vec<String> =
                stack.iter().rev().map(|f| f.as_ref().to_string()).collect();
            if stuck::held_up(state, &innermost_first) || any_frame(stack, &LOCK_FRAMES) {
                WaitClass::Lock
            } else if any_frame(stack, &RESTING_FRAMES) {
                WaitClass::Rest
            } else {
                WaitClass::Other
            }
        }
        State::Sleep => {
            if syscall.is_some_and(|s| RESTING_SYSCALLS.contains(&s)) {
                return WaitClass::Rest;
            }
            match object {
                Some(o) => WaitClass::Io(o),
                // A sleep nothing names is a thread at rest: most are.
                None => WaitClass::Rest,
            }
        }
        State::Cpu | State::Runqueue | State::Throttled => WaitClass::Other,
    }
}

/// Whether a wait of this class is time lost: for the GIL, a lock or
/// I/O. A wait the stack does not explain (a condition variable, a park)
/// is most often a thread at rest, and does not count.
pub fn suffers(class: WaitClass) -> bool {
    matches!(class, WaitClass::Gil | WaitClass::Lock | WaitClass::Io(_))
}

fn is_python(frame: &str) -> bool {
    frame.ends_with("_[py]")
}

/// The frame a thread waits from, as its author would name it: the
/// innermost application frame (in a Java thread, the innermost Java
/// frame outside the JDK; in a Python thread, the innermost Python frame
/// outside the standard library; else the innermost frame that is not
/// wait machinery), without its kind mark.
pub fn app_frame(stack: &[impl AsRef<str>]) -> Option<String> {
    let frames = || stack.iter().rev().map(AsRef::as_ref);
    let java = |f: &&str| is_java(f) && !is_machinery(f);
    let python = |f: &&str| is_python(f) && *f != GIL_FRAME && !f.starts_with('[');
    let found = if frames().any(is_java) {
        frames()
            .filter(java)
            .find(|f| !JDK_PACKAGES.iter().any(|p| plain(f).starts_with(p)))
            .or_else(|| frames().find(java))
    } else if frames().any(is_python) {
        frames()
            .filter(python)
            .find(|f| !PYTHON_LIBRARY.iter().any(|l| f.contains(l)))
            .or_else(|| frames().find(python))
    } else {
        frames().find(|f| !is_machinery(f))
    };
    found.map(|f| plain(f).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_read_from_their_stacks() {
        let gil = ["Thread.run_[py]", "handle (app.py:3)_[py]", GIL_FRAME];
        assert_eq!(classify(State::Futex, &gil), WaitClass::Gil);
        let java_read = [
            "Thread.run_[j]",
            "Client.call_[j]",
            "java.net.Socket$SocketInputStream.read_[j]",
            "sun.nio.ch.NioSocketImpl.read_[j]",
            "read",
            "[syscall read]",
        ];
        assert_eq!(
            classify(State::Sleep, &java_read),
            WaitClass::Io(Object::Socket)
        );
        assert_eq!(app_frame(&java_read).as_deref(), Some("Client.call"));
        let taking = [
            "java.util.concurrent.ThreadPoolExecutor.getTask_[j]",
            "java.util.concurrent.LinkedBlockingQueue.take_[j]",
            "jdk.internal.misc.Unsafe.park_[j]",
            "[syscall futex]",
        ];
        assert_eq!(classify(State::Futex, &taking), WaitClass::Rest);
        let mutex = [
            "main",
            "take_in_order",
            "pthread_mutex_lock",
            "[syscall futex]",
        ];
        assert_eq!(classify(State::Futex, &mutex), WaitClass::Lock);
        assert_eq!(app_frame(&mutex).as_deref(), Some("pthread_mutex_lock"));
        let napping = ["main", "nap", "[syscall clock_nanosleep]"];
        assert_eq!(classify(State::Sleep, &napping), WaitClass::Rest);
        let unnamed_read = ["main", "[syscall read]"];
        assert_eq!(classify(State::Sleep, &unnamed_read), WaitClass::Rest);
        let disk = ["main", "write_log", "ext4_file_write_iter_[k]"];
        assert_eq!(classify(State::Io, &disk), WaitClass::Io(Object::File));
        assert_eq!(syscall(&java_read), Some("read"));
        let py = [
            "Thread.run (threading.py:1)_[py]",
            "fetch (svc.py:9)_[py]",
            "SocketIO.readinto (socket.py:7)_[py]",
            "[syscall recvfrom]",
        ];
        assert_eq!(classify(State::Sleep, &py), WaitClass::Io(Object::Socket));
        assert_eq!(app_frame(&py).as_deref(), Some("fetch (svc.py:9)"));
    }
}
