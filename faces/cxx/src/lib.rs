//! xnnblob's C++ face, for C++ delegate authors: a cxx bridge over the core
//! ([`ffi`]) and a small C++ API on top of it (`include/xnnblob/*.h`, `src/*.cc`):
//! named-data maps (a C++ map can be one), the backend and its models, delegates bound to C++
//! buffers, stateful programs over C++ memory banks, and whole programs.
//!
//! Every call catches panics and returns them as its error ([`guarded`]): C++ sees a
//! `rust::Error`, never an abort. `docs/delegate.md` is the guide.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

pub mod ffi;

pub use ffi::{Reported, guarded};
