//! Printing an error with its causes. As with `std::io`, each error's `Display` says only what
//! its own layer knows, and `source()` carries the cause: a report walks the chain once, so no
//! cause is printed twice.

use std::error::Error;
use std::fmt;

/// An error and its causes, shown as `what failed: why: the root cause`.
pub struct Report<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            write!(f, ": {error}")?;
            cause = error.source();
        }
        Ok(())
    }
}

/// What a caught panic said (its `&str` or `String` payload), for a face that turns panics
/// into errors at its boundary.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_string())
}

/// `error` and its causes as one line (see [`Report`]).
pub fn report(error: &(dyn Error + 'static)) -> String {
    Report(error).to_string()
}

/// How a command line ends with `result`: success, also when the reader of its stdout went away
/// (`| head`: everything else was done); otherwise `program: ` and the [`report`] on stderr, and
/// failure. Shared by `xnnblob` and `xnnblob-lab`.
pub fn exit_code(program: &str, result: Result<(), Box<dyn Error>>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{program}: {}", report(&*e));
            std::process::ExitCode::FAILURE
        }
    }
}
