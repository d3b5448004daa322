//! Errors like `std::io`'s: each one's `Display` says only its own layer, and `source()` carries
//! the rest, walked for every variant of xnnblob's errors that has a cause. (Here, outside the
//! crate: a test inside `report` would tie the lowest layer to every error of the layers above.)

use std::error::Error;
use xnnblob::backend::BackendError;
use xnnblob::cache::CacheError;
use xnnblob::delegate::DelegateError;
use xnnblob::named_data::{FormatError, NamedDataError, StoreError};
use xnnblob::program::{InputError, ProgramError};
use xnnblob::report::report;
use xnnblob::shared_data::SharedDataCache;
use xnnblob::state::StateError;
use xnnblob::xnn::{Status, XnnError};

const ROOT: &str = "the root cause 7f3a";

fn io() -> std::io::Error {
    std::io::Error::other(ROOT)
}

fn xnn() -> XnnError {
    XnnError::Call {
        call: "xnn_create_runtime_v4",
        status: Status::OutOfMemory,
    }
}

fn named() -> NamedDataError {
    NamedDataError::Io {
        map: "weights.ptd".into(),
        error: io(),
    }
}

fn cache() -> CacheError {
    CacheError::Io {
        path: "weights.cache".into(),
        error: io(),
    }
}

fn delegate() -> DelegateError {
    DelegateError::Cache(cache())
}

/// Every variant of xnnblob's errors that has a cause (or wraps an error transparently):
/// its own message must not hold the text of any of its causes, and the report must hold
/// the root cause exactly once.
fn with_causes() -> Vec<Box<dyn Error + 'static>> {
    let shared = SharedDataCache::new();
    let init_failed = shared
        .get_or_init("k", || Err::<xnnblob::named_data::DataBuffer, _>(named()))
        .expect_err("the init fails");
    vec![
        Box::new(named()),
        Box::new(NamedDataError::Format {
            map: "weights.ptd".into(),
            error: FormatError::Truncated {
                what: "FH01 header",
                needed: 64,
                len: 3,
            },
        }),
        Box::new(StoreError::Io {
            path: "out.ptd".into(),
            error: io(),
        }),
        Box::new(cache()),
        Box::new(init_failed.clone()),
        Box::new(DelegateError::MissingConstant {
            key: "w".into(),
            source: init_failed,
        }),
        Box::new(DelegateError::UnreadConstant {
            key: "w".into(),
            source: Box::new(io()),
        }),
        Box::new(delegate()),
        Box::new(DelegateError::Xnn {
            what: "node 3 (XNNConv2d)".into(),
            error: xnn(),
        }),
        Box::new(BackendError::Xnn(xnn())),
        Box::new(BackendError::Cache(cache())),
        Box::new(ProgramError::NamedData(named())),
        Box::new(ProgramError::Format {
            path: "model.pte".into(),
            error: FormatError::Truncated {
                what: "file identifier",
                needed: 8,
                len: 2,
            },
        }),
        Box::new(ProgramError::Delegate {
            method: "forward".into(),
            error: delegate(),
        }),
        Box::new(ProgramError::Backend(BackendError::Cache(cache()))),
        Box::new(ProgramError::BadInput {
            method: "forward".into(),
            error: InputError::Count {
                expected: 1,
                given: 2,
            },
        }),
        Box::new(StateError::NamedData(named())),
        Box::new(StateError::Delegate {
            method: "forward".into(),
            error: delegate(),
        }),
    ]
}

#[test]
fn no_error_prints_a_cause_its_source_carries() {
    for error in with_causes() {
        let own = error.to_string();
        let mut cause = error.source();
        while let Some(c) = cause {
            let text = c.to_string();
            assert!(!own.contains(&text), "{own:?} repeats its cause {text:?}");
            cause = c.source();
        }
        let full = report(&*error);
        assert_eq!(full.matches(ROOT).count().max(1), 1, "{full}");
    }
}

#[test]
fn a_report_names_every_layer_once() {
    let e = ProgramError::Delegate {
        method: "forward".into(),
        error: delegate(),
    };
    assert_eq!(
        report(&e),
        format!("method \"forward\": packed-weight cache weights.cache: {ROOT}")
    );
}
