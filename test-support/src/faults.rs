//! A [`Storage`] that fails on request, for showing that a durable write survives every failure
//! of every call it makes. It makes the real calls on a real directory, records each one, and at
//! the call a [`Fault`] names it returns an error, kills the "process" or cuts the "power":
//!
//! - a failed call ([`Fault::FailCall`]) has no effect, and the calls after it work;
//! - after a kill ([`Fault::KillBeforeCall`]) every call fails without effect, as nothing runs
//!   in a killed process; what was written before it stays (the kernel had it);
//! - after a power cut ([`Fault::PowerCutAfterCall`], [`Fault::TornWrite`]) every call fails
//!   without effect too, and each file created through this storage loses whatever was written
//!   to it after its last sync. Renames and creations done before the cut are kept: losing them
//!   as well only ever leaves an older state, which the same checks accept.

use parking_lot::Mutex;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use xnnblob::mmap::MappedFile;
use xnnblob::storage::{Storage, StorageFile};

/// One call made through a [`FaultyStorage`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// [`Storage::create_new`] of this path.
    Create(PathBuf),
    /// A write of this many bytes to a created file.
    Write(usize),
    /// A sync of a created file.
    Sync,
    /// An allocation of a created file up to this length (what a map then writes counts as
    /// written, and is lost at a power cut unless synced).
    Allocate(u64),
    /// A created file cut to this length.
    SetLen(u64),
    /// [`Storage::rename`] to this path.
    Rename(PathBuf),
    /// [`Storage::sync_directory`].
    SyncDirectory,
    /// [`Storage::map`] of this path.
    Map(PathBuf),
    /// [`Storage::lock_exclusive`].
    Lock,
    /// [`Storage::remove`] of this path.
    Remove(PathBuf),
}

/// What goes wrong, and at which call (counted from 0 over every call, as
/// [`FaultyStorage::calls`] lists them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Nothing: every call is made as asked (to learn how many calls an operation makes).
    None,
    /// Call `call` fails with the OS error `errno` (`libc::ENOSPC`, `libc::EIO`, ...), without
    /// effect; the calls after it work.
    FailCall {
        /// Which call.
        call: usize,
        /// The error it returns.
        errno: i32,
    },
    /// The disk is full from call `call` on: every write and every creation from there fails
    /// with `ENOSPC`, without effect (renames, syncs and removals still work, as on a full
    /// disk).
    FullFromCall {
        /// The first call that finds the disk full.
        call: usize,
    },
    /// The process is killed just before call `call`: it and every later call fail without
    /// effect. Nothing written before is lost.
    KillBeforeCall {
        /// Which call.
        call: usize,
    },
    /// The power is cut right after call `call` succeeds: unsynced writes are lost and every
    /// later call fails without effect.
    PowerCutAfterCall {
        /// Which call.
        call: usize,
    },
    /// Write call `call` reaches its file only in part, then the power is cut: the file keeps
    /// everything written to it before and the first half of this write (rounded down), and
    /// other files lose their unsynced bytes. A call that is not a write fails as in
    /// [`FailCall`](Fault::FailCall) with `EIO`.
    TornWrite {
        /// Which call.
        call: usize,
    },
}

/// A file created through the storage: where it is now and how much of it is durable.
struct Tracked {
    path: PathBuf,
    written: u64,
    synced: u64,
}

#[derive(Default)]
struct State {
    calls: Vec<Call>,
    /// Killed or powered off: nothing happens any more.
    gone: bool,
    /// The power was cut: when the storage and its files are dropped (the "process" ends),
    /// every file loses what it had not synced.
    power_cut: bool,
    files: Vec<Tracked>,
}

/// What a call may do, decided before it is made.
enum Verdict {
    Proceed,
    Fail(io::Error),
    /// Make the call, then cut the power.
    ProceedThenCut,
    /// Write half, then cut the power (writes only).
    Tear,
}

fn gone_error() -> io::Error {
    io::Error::other("injected fault: the process is gone (killed or powered off)")
}

impl State {
    fn decide(&mut self, call: Call, fault: Fault) -> Verdict {
        let n = self.calls.len();
        let is_write = matches!(call, Call::Write(_) | Call::Allocate(_));
        self.calls.push(call);
        if self.gone {
            return Verdict::Fail(gone_error());
        }
        match fault {
            Fault::FailCall { call, errno } if call == n => {
                Verdict::Fail(io::Error::from_raw_os_error(errno))
            }
            Fault::FullFromCall { call: from }
                if n >= from && (is_write || matches!(self.calls[n], Call::Create(_))) =>
            {
                Verdict::Fail(io::Error::from_raw_os_error(libc::ENOSPC))
            }
            Fault::KillBeforeCall { call } if call == n => {
                self.gone = true;
                Verdict::Fail(gone_error())
            }
            Fault::PowerCutAfterCall { call } if call == n => Verdict::ProceedThenCut,
            Fault::TornWrite { call } if call == n => {
                if is_write {
                    Verdict::Tear
                } else {
                    Verdict::Fail(io::Error::from_raw_os_error(libc::EIO))
                }
            }
            _ => Verdict::Proceed,
        }
    }

    /// Stops everything; every unsynced byte of every tracked file is lost once the process
    /// ends (this storage is dropped). Not before: the process goes on computing with what it
    /// has, and a file it has mapped (a draft of a cache file) must keep its length until then,
    /// as the pages a real power cut loses are lost with the process that mapped them.
    fn cut_power(&mut self) {
        self.gone = true;
        self.power_cut = true;
    }
}

impl Drop for State {
    fn drop(&mut self) {
        if !self.power_cut {
            return;
        }
        for f in &self.files {
            if f.written > f.synced {
                // A file removed or replaced meanwhile has nothing left to lose.
                if let Ok(file) = std::fs::OpenOptions::new().write(true).open(&f.path) {
                    let _ = file.set_len(f.synced);
                    let _ = file.sync_all();
                }
            }
        }
    }
}

/// A [`Storage`] over the real file system that injects one [`Fault`].
pub struct FaultyStorage {
    state: Arc<Mutex<State>>,
    fault: Fault,
    process_id: u32,
}

impl FaultyStorage {
    /// A storage that injects `fault`.
    pub fn new(fault: Fault) -> FaultyStorage {
        FaultyStorage {
            state: Arc::default(),
            fault,
            process_id: std::process::id(),
        }
    }

    /// Writes `pid` into temporary names instead of this process's id: a test plays a process
    /// that dies (give it the id of a process that has exited), so what it leaves behind is
    /// seen as abandoned by the next, real, launch.
    pub fn with_process_id(mut self, pid: u32) -> FaultyStorage {
        self.process_id = pid;
        self
    }

    /// Every call made so far, in order, including the one that failed and those after it.
    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().calls.clone()
    }

    /// Whether the fault killed the process or cut the power.
    pub fn is_gone(&self) -> bool {
        self.state.lock().gone
    }

    /// Decides `call`, and for a call that proceeds and then cuts the power, runs `make` first.
    fn run<T>(&self, call: Call, make: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let verdict = self.state.lock().decide(call, self.fault);
        match verdict {
            Verdict::Proceed => make(),
            Verdict::Fail(e) => Err(e),
            Verdict::ProceedThenCut => {
                let result = make();
                self.state.lock().cut_power();
                result
            }
            // Only writes tear (`decide` fails any other call asked to), and they do not come
            // here.
            Verdict::Tear => Err(io::Error::from_raw_os_error(libc::EIO)),
        }
    }
}

/// A file created through a [`FaultyStorage`].
struct FaultyFile {
    file: File,
    state: Arc<Mutex<State>>,
    fault: Fault,
    /// Index into `State::files`.
    tracked: usize,
}

impl Write for FaultyFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut state = self.state.lock();
        match state.decide(Call::Write(buf.len()), self.fault) {
            Verdict::Fail(e) => Err(e),
            Verdict::Proceed => {
                let n = self.file.write(buf)?;
                state.files[self.tracked].written += n as u64;
                Ok(n)
            }
            Verdict::ProceedThenCut => {
                let n = self.file.write(buf)?;
                state.files[self.tracked].written += n as u64;
                state.cut_power();
                Ok(n)
            }
            Verdict::Tear => {
                let half = buf.len() / 2;
                self.file.write_all(&buf[..half])?;
                // The disk got this file up to the middle of the write (the kernel had flushed
                // it): the file ends in a partial write. Other files lose their unsynced bytes.
                let t = &mut state.files[self.tracked];
                t.written += half as u64;
                t.synced = t.written;
                state.cut_power();
                Err(gone_error())
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl FaultyFile {
    /// Makes call `call` on the file with `change`, which returns the file's new length; a cut
    /// of the power after it, or a torn one, loses what was not synced.
    fn resize(
        &mut self,
        call: Call,
        change: impl FnOnce(&File) -> io::Result<u64>,
    ) -> io::Result<()> {
        let mut state = self.state.lock();
        let verdict = state.decide(call, self.fault);
        let apply = |state: &mut State| -> io::Result<()> {
            let len = change(&self.file)?;
            let t = &mut state.files[self.tracked];
            t.written = len;
            t.synced = t.synced.min(len);
            Ok(())
        };
        match verdict {
            Verdict::Proceed => apply(&mut state),
            Verdict::Fail(e) => Err(e),
            Verdict::ProceedThenCut => {
                let r = apply(&mut state);
                state.cut_power();
                r
            }
            Verdict::Tear => {
                state.cut_power();
                Err(gone_error())
            }
        }
    }
}

impl StorageFile for FaultyFile {
    fn allocate(&mut self, len: u64) -> io::Result<()> {
        self.resize(Call::Allocate(len), |file| {
            xnnblob::storage::allocate(file, len)?;
            Ok(file.metadata()?.len())
        })
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.resize(Call::SetLen(len), |file| {
            file.set_len(len)?;
            Ok(len)
        })
    }

    fn file(&self) -> &File {
        &self.file
    }

    fn sync(&mut self) -> io::Result<()> {
        let mut state = self.state.lock();
        let verdict = state.decide(Call::Sync, self.fault);
        let sync = |state: &mut State, file: &File| -> io::Result<()> {
            file.sync_all()?;
            let t = &mut state.files[self.tracked];
            t.synced = t.written;
            Ok(())
        };
        match verdict {
            Verdict::Proceed => sync(&mut state, &self.file),
            Verdict::Fail(e) => Err(e),
            Verdict::ProceedThenCut => {
                let r = sync(&mut state, &self.file);
                state.cut_power();
                r
            }
            Verdict::Tear => Err(io::Error::from_raw_os_error(libc::EIO)),
        }
    }
}

impl Storage for FaultyStorage {
    fn create_new(&self, path: &Path, mode: u32) -> io::Result<Box<dyn StorageFile>> {
        let file = self.run(Call::Create(path.to_path_buf()), || {
            xnnblob::storage::create_side_file(path, mode)
        })?;
        let mut state = self.state.lock();
        state.files.push(Tracked {
            path: path.to_path_buf(),
            written: 0,
            synced: 0,
        });
        Ok(Box::new(FaultyFile {
            file,
            state: self.state.clone(),
            fault: self.fault,
            tracked: state.files.len() - 1,
        }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.run(Call::Rename(to.to_path_buf()), || {
            std::fs::rename(from, to)?;
            let mut state = self.state.lock();
            for f in &mut state.files {
                if f.path == from {
                    f.path = to.to_path_buf();
                }
            }
            Ok(())
        })
    }

    fn sync_directory(&self, dir: &Path) -> io::Result<()> {
        self.run(Call::SyncDirectory, || File::open(dir)?.sync_all())
    }

    fn map(&self, path: &Path) -> io::Result<MappedFile> {
        self.run(Call::Map(path.to_path_buf()), || {
            MappedFile::open_watched(path)
        })
    }

    fn lock_exclusive(&self, path: &Path, mode: u32) -> io::Result<File> {
        self.run(Call::Lock, || {
            xnnblob::storage::OsStorage.lock_exclusive(path, mode)
        })
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.run(Call::Remove(path.to_path_buf()), || {
            std::fs::remove_file(path)
        })
    }

    fn process_id(&self) -> u32 {
        self.process_id
    }
}
