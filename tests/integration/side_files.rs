//! The files beside a cache file (`PATH.lock`, `PATH.checked`, a save's temporaries) and its
//! permissions (issue 38, items 4 and 5): whatever a user or another program put at a side
//! file's path, a launch ends with right outputs or a clean error, never blocks, never follows
//! a link out of the directory, never deletes a user's file; and a cache is never more readable
//! than the model it was packed from.
//!
//! A launch that could block (a FIFO at a side file's path) runs in a child process that is
//! killed, and the test failed, if it does not finish within a generous bound.

use crate::common;
use crate::packed_cache::{assert_matches_reference, launch, model, register};

use common::{dir, f32s, scratch};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use xnnblob::backend::{Backend, BackendOptions, WeightsCacheChoice};
use xnnblob::cache::{CacheError, CacheOptions, HeapFirst, PackedWeightsCache, VerifyPacked};
use xnnblob::program::Program;

/// Set for [`child_launch`]: the cache path of the launch it runs.
const CHILD_CACHE_VAR: &str = "XNNBLOB_SIDE_FILES_CACHE";

/// The most memory a child launch may have resident at its peak: several times what a launch of
/// [`model`] needs, far below what a read without bound reaches before [`CHILD_DATA_LIMIT`]
/// stops it.
const PEAK_BOUND_KIB: u64 = 256 << 10;

/// The child's data limit, a safety net should a side file ever be read without bound again:
/// the standard library's read fails cleanly at it, so the child's peak shows the bug, and the
/// machine keeps its memory.
const CHILD_DATA_LIMIT: u64 = 1 << 30;

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn mode_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

fn background() -> CacheOptions {
    CacheOptions {
        verify: VerifyPacked::Background,
        ..Default::default()
    }
}

/// Child mode: a launch of [`model`] on the cache in [`CHILD_CACHE_VAR`] with the background
/// check, as `xnnblob run` launches; prints whether the save succeeded and how many entries were
/// checked. Its outputs must be right.
#[test]
fn child_launch() {
    let Some(path) = std::env::var_os(CHILD_CACHE_VAR) else {
        return;
    };
    let limit = libc::rlimit {
        rlim_cur: CHILD_DATA_LIMIT,
        rlim_max: CHILD_DATA_LIMIT,
    };
    // SAFETY: `limit` is a valid rlimit that lives across the call; setrlimit only reads it.
    unsafe { libc::setrlimit(libc::RLIMIT_DATA, &limit) };
    let mlp = model();
    let cache = PackedWeightsCache::open_with(Path::new(&path), background()).unwrap();
    let out = launch(&cache, &mlp);
    assert_matches_reference(&mlp, &out);
    match cache.wait_saved() {
        Ok(()) => println!("launch: saved"),
        Err(e) => println!("launch: not saved: {}", xnnblob::report::report(&e)),
    }
    println!("launch: checked {}", cache.stats().checked);
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let peak = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .expect("VmHWM in /proc/self/status");
    println!("launch: peak {}", peak.trim());
}

/// Runs [`child_launch`] on `path` in a child process, and returns what it printed; fails if it
/// does not finish within `common::bounded`'s bound (it blocks), fails, or had more than [`PEAK_BOUND_KIB`]
/// resident (it read without bound).
fn launch_in_child(path: &Path) -> String {
    let printed = tempfile::NamedTempFile::new().unwrap();
    let mut child = common::this_test_binary()
        .args([
            "--exact",
            &common::test_path(module_path!(), "child_launch"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_CACHE_VAR, path)
        .stdout(printed.reopen().unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let status = common::bounded::wait(&mut child, &format!("a launch on {}", path.display()));
    let text = std::fs::read_to_string(printed.path()).unwrap();
    assert!(status.success(), "the launch failed ({status}): {text}");
    let peak_kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("launch: peak "))
        .and_then(|p| p.strip_suffix(" kB"))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("the child's peak: {text}"));
    assert!(
        peak_kib <= PEAK_BOUND_KIB,
        "the launch had {peak_kib} KiB resident: a side file was read without bound: {text}"
    );
    text
}

/// Issue 38: a cold launch blocked forever in the open of a FIFO at `PATH.lock`.
#[test]
fn a_fifo_at_the_lock_path_fails_the_save_cleanly_and_never_blocks() {
    let dir = scratch("fifo-lock");
    let path = dir.join("weights.xbc");
    let lock = sibling(&path, ".lock");
    mkfifo(&lock);
    let said = launch_in_child(&path);
    assert!(
        said.contains("launch: not saved")
            && said.contains("weights.xbc.lock")
            && said.contains("a FIFO, not a regular file"),
        "the save says why, with the path: {said}"
    );
    assert!(
        std::fs::symlink_metadata(&lock)
            .unwrap()
            .file_type()
            .is_fifo()
    );
    assert!(!path.exists(), "nothing was published without the lock");
}

/// Issue 38: a dangling symbolic link at `PATH.lock` made a save create its target, outside
/// the cache's directory.
#[test]
fn a_dangling_link_at_the_lock_path_creates_nothing_at_its_target() {
    let dir = scratch("dangling-lock");
    let elsewhere = scratch("dangling-lock-target");
    let target = elsewhere.join("made-by-a-save");
    let path = dir.join("weights.xbc");
    let lock = sibling(&path, ".lock");
    std::os::unix::fs::symlink(&target, &lock).unwrap();
    let mlp = model();
    let cache = PackedWeightsCache::open(&path).unwrap();
    let out = launch(&cache, &mlp);
    assert_matches_reference(&mlp, &out);
    let error = cache.wait_saved().expect_err("no lock, no save");
    assert!(
        matches!(&error, CacheError::NotARegularFile { path, kind: "a symbolic link" }
            if path.ends_with("weights.xbc.lock")),
        "a typed error naming the lock: {error:?}"
    );
    drop(cache);
    assert!(!target.exists(), "nothing created outside the directory");
    assert!(
        std::fs::symlink_metadata(&lock)
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

/// A cache file, made cold, then left unchanged long enough for a background check to be
/// recorded (2 s, `SETTLED` in `cache/checked.rs`): each warm launch on it checks and tries to
/// record.
fn settled_cache(dir: &Path) -> PathBuf {
    let path = dir.join("weights.xbc");
    crate::packed_cache::cold(&path, &model());
    std::thread::sleep(Duration::from_millis(2300));
    path
}

/// Issue 38: a warm launch blocked forever reading a FIFO at `PATH.checked`.
#[test]
fn a_fifo_at_the_checked_path_is_no_record_and_never_blocks_a_warm_launch() {
    let dir = scratch("fifo-checked");
    let path = settled_cache(&dir);
    let record = sibling(&path, ".checked");
    mkfifo(&record);
    for _ in 0..2 {
        let said = launch_in_child(&path);
        assert!(
            said.contains("launch: saved") && said.contains("launch: checked 3"),
            "no record trusted, none written: checked again each time: {said}"
        );
    }
    assert!(
        std::fs::symlink_metadata(&record)
            .unwrap()
            .file_type()
            .is_fifo()
    );
}

/// Issue 38: with `PATH.checked` a symbolic link to `/dev/zero`, each launch read until memory
/// ran out. Links elsewhere (to a file outside the directory, to nothing) are not followed
/// either: not read as a record, not written through.
#[test]
fn a_checked_path_that_is_a_link_is_never_followed() {
    let dir = scratch("linked-checked");
    let elsewhere = scratch("linked-checked-target");
    let path = settled_cache(&dir);
    let record = sibling(&path, ".checked");
    let outside = elsewhere.join("users-file");
    std::fs::write(&outside, b"the user's\n").unwrap();
    let nowhere = elsewhere.join("made-by-a-check");
    for target in [Path::new("/dev/zero"), &outside, &nowhere] {
        std::os::unix::fs::symlink(target, &record).unwrap();
        let said = launch_in_child(&path);
        assert!(
            said.contains("launch: checked 3"),
            "{}: no record read through the link: {said}",
            target.display()
        );
        assert!(
            std::fs::symlink_metadata(&record)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        std::fs::remove_file(&record).unwrap();
    }
    assert_eq!(std::fs::read(&outside).unwrap(), b"the user's\n");
    assert!(!nowhere.exists(), "nothing created outside the directory");
}

/// Issue 38: a user's `.NAME.tmp-1-notes` beside the cache was deleted by the next save.
#[test]
fn a_users_look_alike_temporary_survives_a_save() {
    let dir = scratch("look-alike");
    let path = dir.join("weights.xbc");
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    let users = [
        ".weights.xbc.tmp-1-notes".to_string(),
        format!(".weights.xbc.tmp-{gone_pid}-0"),
        format!(".weights.xbc.xnnblob-tmp-{gone_pid}-0-notes"),
        format!(".weights.xbc.xnnblob-tmp-{gone_pid}-0.bak"),
    ];
    for name in &users {
        std::fs::write(dir.join(name), b"the user's").unwrap();
    }
    // What a save killed midway leaves: reclaimed, as before.
    let abandoned = dir.join(format!(".weights.xbc.xnnblob-tmp-{gone_pid}-1"));
    std::fs::write(&abandoned, b"part").unwrap();
    let mlp = model();
    let cache = PackedWeightsCache::open(&path).unwrap();
    let out = launch(&cache, &mlp);
    cache.wait_saved().unwrap();
    drop(cache);
    assert_matches_reference(&mlp, &out);
    for name in &users {
        assert_eq!(
            std::fs::read(dir.join(name)).unwrap(),
            b"the user's",
            "{name}"
        );
    }
    assert!(
        !abandoned.exists(),
        "a killed save's temporary is reclaimed"
    );
}

/// What a writer of the cache file at `path` does before it makes a temporary or a draft beside
/// it: it moves the writer lock's modification time to now.
fn mark_writer_began(path: &Path) {
    let mut lock = path.as_os_str().to_owned();
    lock.push(".lock");
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(lock)
        .unwrap()
        .set_modified(std::time::SystemTime::now())
        .unwrap();
}

/// Issue 61: a warm launch reads the cache's directory only when a writer of the cache file
/// began since the file or its check record was written, and then reclaims what a killed save
/// left; the app's own files changing beside it never make it read the directory.
#[test]
fn a_warm_launch_reads_the_directory_only_after_a_writer_began() {
    let dir = scratch("warm-directory");
    let path = dir.join("weights.xbc");
    let mlp = model();
    let warm = || {
        let cache = PackedWeightsCache::open(&path).unwrap();
        assert_matches_reference(&mlp, &launch(&cache, &mlp));
        cache.wait_saved().unwrap();
    };
    warm();
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    // Timestamps move by clock ticks (up to 10 ms): each step waits one out, so that what it
    // changes is later than what came before.
    let tick = || std::thread::sleep(std::time::Duration::from_millis(30));
    let left = |n: u32| {
        let temporary = dir.join(format!(".weights.xbc.xnnblob-tmp-{gone_pid}-{n}"));
        std::fs::write(&temporary, b"part").unwrap();
        temporary
    };
    // What a save killed midway leaves: its mark, then its temporary.
    tick();
    mark_writer_began(&path);
    let first = left(1);
    tick();
    warm();
    assert!(!first.exists(), "a writer began since: reclaimed");
    // A temporary left with no mark since the file's last change (no writer of this file made
    // it) is not looked for, however the directory changes...
    let mode = std::fs::metadata(&path).unwrap().permissions();
    std::fs::set_permissions(&path, mode).unwrap();
    tick();
    let second = left(2);
    std::fs::write(dir.join("notes"), b"the user's").unwrap();
    tick();
    warm();
    assert!(second.exists(), "the directory was not read");
    // ...until a writer begins.
    mark_writer_began(&path);
    tick();
    warm();
    assert!(!second.exists(), "a writer began: reclaimed");
}

/// Issue 61: a launch that read the cache's directory (a writer began since the file was
/// written) and found nothing of a save left there says so in the check record's time, so the
/// launches after it do not read it again until a writer begins again; one that leaves a
/// temporary does not.
#[test]
fn a_launch_that_read_the_directory_spares_the_next_ones_until_a_writer_begins() {
    use std::os::unix::fs::MetadataExt;
    let dir = scratch("directory-read");
    let path = dir.join("weights.xbc");
    let record = dir.join("weights.xbc.checked");
    let lock = dir.join("weights.xbc.lock");
    let mlp = model();
    let launch_once = || {
        let options = CacheOptions {
            verify: VerifyPacked::Background,
            ..Default::default()
        };
        let cache = PackedWeightsCache::open_with(&path, options).unwrap();
        assert_matches_reference(&mlp, &launch(&cache, &mlp));
        cache.wait_saved().unwrap();
    };
    launch_once();
    assert!(record.exists(), "the save's bytes are recorded as checked");
    let changed = |p: &Path| {
        let m = std::fs::metadata(p).unwrap();
        (m.ctime(), m.ctime_nsec())
    };
    let modified = |p: &Path| {
        let m = std::fs::metadata(p).unwrap();
        (m.mtime(), m.mtime_nsec())
    };
    // Timestamps move by clock ticks (up to 10 ms): each step waits one out.
    let tick = || std::thread::sleep(std::time::Duration::from_millis(30));
    tick();
    mark_writer_began(&path);
    tick();
    assert!(changed(&record) < modified(&lock), "a writer began");
    launch_once();
    assert!(
        changed(&record) >= modified(&lock),
        "read once, the directory is not read again until a writer begins"
    );
    assert_eq!(
        std::fs::read_to_string(&record).unwrap().lines().count(),
        1,
        "the record's text is as it was"
    );
    // The app's own file beside the cache changes nothing.
    tick();
    let before = changed(&record);
    std::fs::write(dir.join("notes"), b"the user's").unwrap();
    tick();
    launch_once();
    assert_eq!(changed(&record), before, "the directory was not read");
    // A live writer's temporary (this process's) is left, and keeps the directory read.
    tick();
    mark_writer_began(&path);
    let live = dir.join(format!(".weights.xbc.xnnblob-tmp-{}-1", std::process::id()));
    std::fs::write(&live, b"part").unwrap();
    tick();
    launch_once();
    assert!(live.exists(), "a live writer's temporary is kept");
    assert!(
        changed(&record) < modified(&lock),
        "with a temporary left, the record says nothing of the directory"
    );
}

/// Issue 61: every writer marks the lock before it makes anything beside the file: a cold
/// launch's draft and a save's temporary alike, so that what either leaves when killed is
/// found by the next warm launch.
#[test]
fn a_cold_launch_marks_the_writer_lock_before_its_draft_and_its_save() {
    use std::os::unix::fs::MetadataExt;
    let dir = scratch("writer-mark");
    let path = dir.join("weights.xbc");
    let lock = dir.join("weights.xbc.lock");
    let mlp = model();
    let options = CacheOptions {
        heap_first: HeapFirst(0),
        ..Default::default()
    };
    let cache = PackedWeightsCache::open_with(&path, options).unwrap();
    let registrations = register(&cache, &mlp);
    let graph = mlp.subgraph(1).unwrap();
    let runtime = xnnblob::xnn::Runtime::new(&graph, Some(&*cache)).unwrap();
    drop(registrations);
    let draft_made = {
        let m = std::fs::metadata(&lock).expect("the draft's mark made the lock");
        (m.mtime(), m.mtime_nsec())
    };
    std::thread::sleep(std::time::Duration::from_millis(30));
    cache.finalize().unwrap();
    cache.wait_saved().unwrap();
    drop(runtime);
    assert!(path.exists(), "saved");
    let m = std::fs::metadata(&lock).unwrap();
    assert!(
        (m.mtime(), m.mtime_nsec()) > draft_made,
        "the save marked the lock again"
    );
}

fn mlp_pte() -> PathBuf {
    dir().join("mlp_xnn_external.pte")
}

/// Copies of the MLP fixture's `.pte` and `.ptd` into `into`, with permission bits `mode`.
fn model_files_with_mode(into: &Path, mode: u32) -> (PathBuf, PathBuf) {
    let pte = into.join("model.pte");
    let ptd = into.join("model.ptd");
    std::fs::copy(mlp_pte(), &pte).unwrap();
    std::fs::copy(dir().join("mlp_xnn_external.ptd"), &ptd).unwrap();
    for file in [&pte, &ptd] {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    (pte, ptd)
}

/// A launch through `Program::load` in a fresh backend (background check on, as `xnnblob run`):
/// its outputs, and the cache's `permissions_note` and excess bits.
fn program_launch(pte: &Path, ptd: &Path, cache: &Path) -> (Vec<f32>, Option<String>, u32) {
    let backend = Backend::new(BackendOptions {
        cache_options: background(),
        ..Default::default()
    })
    .unwrap();
    let program = Program::load(
        &backend,
        pte,
        &[ptd],
        Some(&WeightsCacheChoice::File(cache.to_path_buf())),
    )
    .unwrap();
    let input = f32s(&dir().join("mlp.input.f32"));
    let out = program
        .method("forward")
        .unwrap()
        .execute_f32(&[&input])
        .unwrap()
        .remove(0);
    let weights = program.weights_cache().unwrap().clone();
    weights.wait_saved().unwrap();
    let said = (
        weights.permissions_note(),
        weights.stats().excess_permissions,
    );
    drop(program);
    weights.wait_saved().unwrap();
    (out, said.0, said.1)
}

fn expected_mlp_outputs() -> Vec<f32> {
    f32s(&dir().join("mlp.output.f32"))
}

fn assert_close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (a, b) in got.iter().zip(want) {
        assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
    }
}

/// Issue 38: a private model's packed weights were saved world-readable (0644 under the usual
/// umask), and its lock too.
#[test]
fn a_private_model_gives_a_private_cache_lock_and_check_record() {
    let dir = scratch("private-model");
    let (pte, ptd) = model_files_with_mode(&dir, 0o600);
    let cache = dir.join("weights.xbc");
    let (out, note, excess) = program_launch(&pte, &ptd, &cache);
    assert_close(&out, &expected_mlp_outputs());
    assert_eq!(
        (note, excess),
        (None, 0),
        "a cache made here is not too readable"
    );
    // Settled, a warm launch checks the file in the background and records it.
    std::thread::sleep(Duration::from_millis(2300));
    let (out, note, _) = program_launch(&pte, &ptd, &cache);
    assert_close(&out, &expected_mlp_outputs());
    assert_eq!(note, None);
    let record = sibling(&cache, ".checked");
    assert!(record.is_file(), "the check was recorded");
    for file in [cache.clone(), sibling(&cache, ".lock"), record] {
        assert_eq!(
            mode_of(&file) & 0o077,
            0,
            "{}: no group or other bits ({:o})",
            file.display(),
            mode_of(&file)
        );
    }
}

/// The limit is the model's, not a blanket 0600: a model readable by its group gives a cache
/// readable by its group (less the umask), so one that is shared keeps working.
#[test]
fn a_cache_is_as_readable_as_its_model_and_no_more() {
    let dir = scratch("group-model");
    let (pte, ptd) = model_files_with_mode(&dir, 0o640);
    let cache = dir.join("weights.xbc");
    // The umask can only take bits away; what it lets through of 0640 is what is expected.
    // (Read, not set: setting it would race with the other tests' files.)
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let umask = status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .and_then(|m| u32::from_str_radix(m.trim(), 8).ok())
        .expect("the umask in /proc/self/status");
    program_launch(&pte, &ptd, &cache);
    assert_eq!(mode_of(&cache), 0o640 & !umask);
    assert_eq!(mode_of(&sibling(&cache, ".lock")), 0o640 & !umask);
}

/// A cache opened with no model known (the C ABI, a cache opened by hand) is its owner's alone.
#[test]
fn a_cache_with_no_model_known_is_created_private() {
    let dir = scratch("no-model");
    let path = dir.join("weights.xbc");
    let mlp = model();
    let cache = PackedWeightsCache::open(&path).unwrap();
    assert_eq!(cache.file_mode(), xnnblob::cache::PRIVATE_MODE);
    launch(&cache, &mlp);
    cache.wait_saved().unwrap();
    drop(cache);
    assert_eq!(mode_of(&path) & 0o077, 0);
    assert_eq!(mode_of(&sibling(&path, ".lock")) & 0o077, 0);
}

/// An existing cache file more readable than the model using it is said (it is used as it is:
/// a warm launch writes nothing).
#[test]
fn an_existing_cache_more_readable_than_its_model_is_reported() {
    let dir = scratch("too-readable");
    let (pte, ptd) = model_files_with_mode(&dir, 0o600);
    let cache = dir.join("weights.xbc");
    program_launch(&pte, &ptd, &cache);
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (out, note, excess) = program_launch(&pte, &ptd, &cache);
    assert_close(&out, &expected_mlp_outputs());
    assert_eq!(excess, 0o044);
    let note = note.expect("said");
    assert!(
        note.contains(&cache.display().to_string()) && note.contains("more readable"),
        "{note}"
    );
    // A model as readable as the file: nothing to say.
    let (pte, ptd) = model_files_with_mode(&dir, 0o644);
    let (_, note, excess) = program_launch(&pte, &ptd, &cache);
    assert_eq!((note, excess), (None, 0));
}
