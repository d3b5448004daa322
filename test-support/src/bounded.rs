//! Waiting for a child process that might block forever (a launch stuck opening a FIFO, say, or
//! a whole suite under qemu) without hanging the suite: the bound is generous, a count of polls
//! rather than a reading of the clock, and only a process that never ends fails it, with what it
//! printed so far.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread::JoinHandle;
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

/// Runs `command` to its end and returns its output, as [`Command::output`] does; kills it and
/// fails the test, naming `what` and showing the end of what it printed, if it is still running
/// after `limit`. For the long runs (a suite under qemu): a hang fails in minutes, with the test
/// that hung on screen, instead of taking the whole CI run with it.
pub fn output(command: &mut Command, limit: Duration, what: &str) -> Output {
    // A process group of its own, so that a kill reaches the children it started too (which
    // hold its pipes open).
    let mut child = command
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let stdout = drain(child.stdout.take().expect("piped"));
    let stderr = drain(child.stderr.take().expect("piped"));
    let polls = (limit.as_millis() / POLL.as_millis()).max(1);
    let mut status = None;
    for _ in 0..polls {
        if let Some(done) = child.try_wait().unwrap() {
            status = Some(done);
            break;
        }
        std::thread::sleep(POLL);
    }
    let timed_out = status.is_none();
    if timed_out {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", child.id())])
            .status();
        let _ = child.kill();
    }
    let status = status.unwrap_or_else(|| child.wait().unwrap());
    let stdout = stdout.join().expect("a reader thread");
    let stderr = stderr.join().expect("a reader thread");
    if timed_out {
        let text = String::from_utf8_lossy(&stdout) + String::from_utf8_lossy(&stderr);
        let tail: String = {
            let chars: Vec<char> = text.chars().collect();
            chars[chars.len().saturating_sub(6000)..].iter().collect()
        };
        panic!(
            "{what} did not finish in {} s and was killed; the end of its output:\n{tail}",
            limit.as_secs()
        );
    }
    Output {
        status,
        stdout,
        stderr,
    }
}

/// Reads a child's pipe to its end on a thread of its own, so that neither pipe fills while the
/// other is read.
fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        bytes
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_child_gives_its_status_and_both_outputs() {
        let out = output(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(60),
            "sh",
        );
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
    }

    #[test]
    #[should_panic(
        expected = "did not finish in 1 s and was killed; the end of its output:\nstarted"
    )]
    fn a_child_past_its_limit_is_killed_with_its_own_children_and_its_output_shown() {
        // The grandchild `sleep` holds the pipes open: only a kill of the whole group ends them.
        output(
            Command::new("sh").args(["-c", "sleep 600 & echo started; wait"]),
            Duration::from_secs(1),
            "sh",
        );
    }
}
