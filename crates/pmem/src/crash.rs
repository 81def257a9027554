//! The eADR crash harness: kill a child process at a random moment.
//!
//! With pools mapped `MAP_SHARED` ([`crate::SimMode::Direct`]) every store a process made is in
//! the page cache the moment it is globally visible, and survives the process being SIGKILLed —
//! exactly the eADR guarantee (the CPU caches are in the persistence domain). So an eADR crash
//! test is: run the workload in a child process, SIGKILL it at a random moment, open the store in
//! the parent and check it.
//!
//! The child is the test binary itself, re-executed with a filter selecting one test and the
//! environment variable [`CHILD_ENV`] set; the test body asks [`child_role`] first and runs the
//! child side when it is set (the pattern of sled's `test_crash_recovery.rs`). What the child
//! acknowledged is recorded in a [`SideFile`] — a shared mapping that, like the pool, survives the
//! kill — so the parent knows what must be present.
//!
//! ```no_run
//! use numakv_pmem::crash::{child_role, KillHarness};
//! use std::time::Duration;
//!
//! #[test]
//! fn survives_kill() {
//!     if let Some(arg) = child_role() {
//!         // child: open the store named by `arg`, loop over operations forever.
//!         return;
//!     }
//!     let harness = KillHarness::new("survives_kill");
//!     let outcome = harness.run("/tmp/store", Duration::from_millis(50)).unwrap();
//!     // parent: open /tmp/store and check it against the side file.
//! }
//! ```

use std::fs::OpenOptions;
use std::io;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use crate::map::Mapping;

/// Environment variable that marks a child process and carries its argument.
pub const CHILD_ENV: &str = "NUMAKV_CRASH_CHILD";

/// Environment variable that scales stress and crash tests (rounds, keys, threads' work).
pub const SCALE_ENV: &str = "NUMAKV_TEST_SCALE";

/// The stress/crash test size factor: `NUMAKV_TEST_SCALE` (a positive integer), 1 when unset or
/// unparsable. CI runs with 1 (small, for 2 cores); soak runs use e.g. 20.
pub fn test_scale() -> usize {
    std::env::var(SCALE_ENV)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(1)
}

/// The argument of this process if it is a crash child, else `None`.
pub fn child_role() -> Option<String> {
    std::env::var(CHILD_ENV).ok()
}

/// How a child ended.
#[derive(Debug)]
pub enum KillOutcome {
    /// Killed with SIGKILL after running this long.
    Killed(Duration),
    /// Exited on its own before the kill (a child should loop until killed: treat this as a
    /// test failure unless the scenario expects it).
    Exited(ExitStatus),
}

/// Spawns the current test binary as a crash child running one test.
#[derive(Debug, Clone)]
pub struct KillHarness {
    test_path: String,
}

impl KillHarness {
    /// `test_path` is the test's full name as the test harness prints it (e.g. `crash_eadr` in an
    /// integration test file, `module::tests::name` for a unit test).
    pub fn new(test_path: impl Into<String>) -> KillHarness {
        KillHarness { test_path: test_path.into() }
    }

    /// Starts the child with `arg` in [`CHILD_ENV`]. Its output is discarded.
    pub fn spawn(&self, arg: &str) -> io::Result<Child> {
        let exe = std::env::current_exe()?;
        Command::new(exe)
            .args([self.test_path.as_str(), "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, arg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    }

    /// Runs a child with `arg` and SIGKILLs it after `after`; waits until it is gone.
    pub fn run(&self, arg: &str, after: Duration) -> io::Result<KillOutcome> {
        let mut child = self.spawn(arg)?;
        let start = Instant::now();
        while start.elapsed() < after {
            if let Some(status) = child.try_wait()? {
                return Ok(KillOutcome::Exited(status));
            }
            std::thread::sleep(Duration::from_millis(1).min(after));
        }
        kill(&mut child)?;
        Ok(KillOutcome::Killed(start.elapsed()))
    }

    /// Runs a child and kills it as soon as `ready` returns true (polled every millisecond) and
    /// then `extra` more time has passed, or after `timeout` in any case. Use it to kill only once
    /// the child has done some work (e.g. its side file shows progress).
    pub fn run_until(
        &self,
        arg: &str,
        mut ready: impl FnMut() -> bool,
        extra: Duration,
        timeout: Duration,
    ) -> io::Result<KillOutcome> {
        let mut child = self.spawn(arg)?;
        let start = Instant::now();
        while !ready() && start.elapsed() < timeout {
            if let Some(status) = child.try_wait()? {
                return Ok(KillOutcome::Exited(status));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(extra);
        if let Some(status) = child.try_wait()? {
            return Ok(KillOutcome::Exited(status));
        }
        kill(&mut child)?;
        Ok(KillOutcome::Killed(start.elapsed()))
    }
}

/// SIGKILLs `child` and reaps it.
pub fn kill(child: &mut Child) -> io::Result<()> {
    // Child::kill sends SIGKILL on Unix; an already-exited child is fine.
    match child.kill() {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => {}
        Err(e) => return Err(e),
    }
    child.wait().map(|_| ())
}

/// A file of 8-byte words shared between a crash child and its parent: the child's record of
/// what it acknowledged, which survives the kill because the mapping is `MAP_SHARED`.
#[derive(Debug)]
pub struct SideFile {
    map: Mapping,
    words: usize,
}

impl SideFile {
    /// Creates (or truncates) `path` with `words` zeroed words.
    pub fn create(path: &Path, words: usize) -> io::Result<SideFile> {
        let f = OpenOptions::new().create(true).truncate(true).read(true).write(true).open(path)?;
        f.set_len((words.max(1) * 8) as u64)?;
        let map = Mapping::shared(&f, words.max(1) * 8, false)?;
        Ok(SideFile { map, words })
    }

    /// Opens an existing side file.
    pub fn open(path: &Path) -> io::Result<SideFile> {
        let f = OpenOptions::new().read(true).write(true).open(path)?;
        let len = f.metadata()?.len() as usize;
        if len < 8 || len % 8 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "side file size is not a multiple of 8",
            ));
        }
        let map = Mapping::shared(&f, len, false)?;
        Ok(SideFile { map, words: len / 8 })
    }

    /// Number of words.
    pub fn len(&self) -> usize {
        self.words
    }

    /// True when the file has no words.
    pub fn is_empty(&self) -> bool {
        self.words == 0
    }

    /// Word `i`, `None` past the end.
    pub fn word(&self, i: usize) -> Option<&AtomicU64> {
        if i >= self.words {
            return None;
        }
        // SAFETY: `i < words`, the mapping is page aligned and `words * 8` long, and lives as
        // long as `self`; AtomicU64 has the size and alignment of u64.
        Some(unsafe { &*(self.map.ptr().add(i * 8) as *const AtomicU64) })
    }
}
