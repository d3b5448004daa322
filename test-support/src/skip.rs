//! A test that cannot run where it is says so: loudly on stderr for a developer, and as a
//! failure under CI, which sets [`MUST_RUN_VAR`] (`.ci/run`), so nothing passes there by not
//! running.

/// Set (to anything) where every test must run: a test that cannot is a failure.
pub const MUST_RUN_VAR: &str = "XNNBLOB_TESTS_MUST_RUN";

/// Reports that the calling test (or one case of it) cannot run here, and why: a panic under
/// [`MUST_RUN_VAR`], else a banner on stderr. The caller returns (or leaves the case out) after.
#[track_caller]
pub fn cannot_run(why: &str) {
    if std::env::var_os(MUST_RUN_VAR).is_some() {
        panic!("this test cannot run here, and {MUST_RUN_VAR} says every test must: {why}");
    }
    eprintln!(
        "\n*** SKIPPED at {}: {why} ***\n",
        std::panic::Location::caller()
    );
}
