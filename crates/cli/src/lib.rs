//! The `numakv` command-line tool, as a library: [`args`] is the syntax (clap derive),
//! [`commands`] does the work on a [`numakv::Store`], [`main`] ties them to a process (parsing,
//! `error: ...` on stderr, exit status). `src/main.rs` only calls [`main`].
//!
//! Exit status: [`Exit`]. Adding a subcommand is a variant of [`args::Command`] and its arm in
//! [`commands::run`].

use std::ffi::OsString;
use std::fmt;
use std::io::{self, Write};
use std::process::ExitCode;

use clap::Parser;

pub mod args;
pub mod bench;
mod bytes;
pub mod commands;
mod output;
pub mod serve;

pub use args::Cli;

/// The process exit status of a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// 0: the command did what was asked.
    Ok,
    /// 1: the key was absent (get, del, put --if-present) or present (put --if-absent).
    NotFound,
    /// 2: bad arguments (clap's own usage errors use 2 as well).
    Usage,
    /// 3: the store could not be used: no store, locked, I/O, out of space, engine mismatch.
    Store,
    /// 4: the store is damaged: bad header or node file, or a violated invariant.
    Corrupted,
}

impl Exit {
    /// The numeric exit status.
    pub fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::NotFound => 1,
            Exit::Usage => 2,
            Exit::Store => 3,
            Exit::Corrupted => 4,
        }
    }
}

/// A command's failure: what to print after `error: ` and the exit status.
#[derive(Debug)]
pub enum CliError {
    /// Arguments that parse but make no sense together (e.g. a bad engine option).
    Usage(String),
    /// The store failed.
    Store(numakv::Error),
    /// The benchmark driver failed (bad flags, an unknown engine or workload, a write).
    Bench(numakv_bench::BenchError),
    /// Writing the output failed (other than a closed pipe, which ends the command quietly).
    Output(io::Error),
    /// `serve` could not start (e.g. the address is in use) or stop.
    Serve(numakv_server::ServerError),
}

impl CliError {
    /// The exit status this failure maps to.
    pub fn exit(&self) -> Exit {
        use numakv::{Error, IndexError, PoolError};
        match self {
            CliError::Usage(_) => Exit::Usage,
            CliError::Output(_) => Exit::Store,
            CliError::Serve(_) => Exit::Store,
            CliError::Bench(e) => {
                use numakv_bench::BenchError as B;
                match e {
                    B::Config(_)
                    | B::UnknownTarget { .. }
                    | B::UnknownWorkload { .. }
                    | B::UnknownRepro { .. } => Exit::Usage,
                    _ => Exit::Store,
                }
            }
            CliError::Store(e) if e.is_corruption() => Exit::Corrupted,
            CliError::Store(e) => match e {
                Error::BadEngineOption { .. }
                | Error::OptionsMismatch { .. }
                | Error::UnknownEngine { .. }
                | Error::Index(IndexError::InvalidKey(_))
                | Error::Index(IndexError::EmptyKey { .. })
                | Error::Index(IndexError::TooLarge { .. })
                | Error::Index(IndexError::InvalidOptions(_))
                | Error::Index(IndexError::Unsupported(_))
                | Error::Index(IndexError::Pool(PoolError::InvalidArgument(_))) => Exit::Usage,
                _ => Exit::Store,
            },
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage(m) => f.write_str(m),
            CliError::Store(e) => write!(f, "{e}"),
            CliError::Bench(e) => write!(f, "{e}"),
            CliError::Output(e) => write!(f, "writing output: {e}"),
            CliError::Serve(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for CliError {}

impl From<numakv::Error> for CliError {
    fn from(e: numakv::Error) -> Self {
        CliError::Store(e)
    }
}

impl From<numakv::IndexError> for CliError {
    fn from(e: numakv::IndexError) -> Self {
        CliError::Store(e.into())
    }
}

impl From<numakv_bench::BenchError> for CliError {
    fn from(e: numakv_bench::BenchError) -> Self {
        CliError::Bench(e)
    }
}

impl From<numakv_server::ServerError> for CliError {
    fn from(e: numakv_server::ServerError) -> Self {
        match e {
            numakv_server::ServerError::Store(e) => CliError::Store(e),
            e => CliError::Serve(e),
        }
    }
}

impl From<io::Error> for CliError {
    fn from(e: io::Error) -> Self {
        CliError::Output(e)
    }
}

/// Runs the tool on `args` (program name first), writing results to `stdout` and diagnostics to
/// `stderr`; returns the exit status.
pub fn run_with<I, T>(args: I, stdout: &mut dyn Write, stderr: &mut dyn Write) -> Exit
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are "errors" that print to stdout and succeed.
            let code = if e.use_stderr() { Exit::Usage } else { Exit::Ok };
            let rendered = e.render().to_string();
            let sink: &mut dyn Write = if e.use_stderr() { stderr } else { stdout };
            let _ = sink.write_all(rendered.as_bytes());
            return code;
        }
    };
    match commands::run(&cli, stdout, stderr) {
        Ok(exit) => exit,
        Err(CliError::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => Exit::Ok,
        Err(e) => {
            let _ = writeln!(stderr, "error: {e}");
            e.exit()
        }
    }
}

/// The process entry point: the real arguments, stdout and stderr.
pub fn main() -> ExitCode {
    // Unlocked handles (each write takes the lock): a held `stderr().lock()` would make any
    // other thread that writes to stderr, a panicking worker's message included, wait forever.
    let mut out = io::BufWriter::new(io::stdout());
    let mut err = io::stderr();
    let mut exit = run_with(std::env::args_os(), &mut out, &mut err);
    if let Err(e) = out.flush() {
        if e.kind() != io::ErrorKind::BrokenPipe {
            let _ = writeln!(err, "error: writing output: {e}");
            exit = Exit::Store;
        }
    }
    ExitCode::from(exit.code())
}
