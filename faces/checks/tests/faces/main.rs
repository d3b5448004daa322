//! xnnblob's C and C++ faces driven from their own languages, in one binary: the C ABI from C,
//! the C++ delegate API and its documented example from C++, programs and stateful programs
//! from C++, and each face's panic policy.

use xnnblob_test_support as common;

mod c_abi;
mod cpp_delegate;
mod cpp_programs;
mod cpp_stateful;
mod cxx_bridge;
