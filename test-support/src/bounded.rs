//! Waiting for a child process that might block forever (a launch stuck opening a FIFO, say)
//! without hanging the suite: the bound is generous, a count of polls rather than a reading of
//! the clock, and only a process that never ends fails it.

use std::process::{Child, ExitStatus};
use std::time::Duration;

/// How often the child is polled.
const POLL: Duration = Duration::from_millis(50);

/// Polls: 120 s of them, far past what any launch here takes.
const POLLS: u32 = 2400;

/// Waits for `child`; kills it and fails the test, naming `what`, if it is still running after
/// [`POLLS`] polls.
pub fn wait(child: &mut Child, what: &str) -> ExitStatus {
    for _ in 0..POLLS {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(POLL);
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!(
        "{what} did not finish in {} s: it blocks",
        (POLL * POLLS).as_secs()
    );
}
