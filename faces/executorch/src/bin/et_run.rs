//! `xnnblob-et-run`: the runner is C++ (`src/runner.cc`, against ExecuTorch's `Module`); this is
//! its entry point, so cargo builds and installs it like any binary of the workspace.

use std::ffi::{CString, c_char, c_int};

unsafe extern "C" {
    fn xnnblob_et_run_main(argc: c_int, argv: *mut *mut c_char) -> c_int;
}

fn main() {
    let args: Vec<CString> = std::env::args_os()
        .map(|a| {
            CString::new(std::os::unix::ffi::OsStrExt::as_bytes(a.as_os_str()))
                .expect("arguments hold no NUL")
        })
        .collect();
    let mut argv: Vec<*mut c_char> = args.iter().map(|a| a.as_ptr().cast_mut()).collect();
    argv.push(std::ptr::null_mut());
    // SAFETY: argv holds argc NUL-terminated strings and a final null, alive for the call.
    let code = unsafe { xnnblob_et_run_main(args.len() as c_int, argv.as_mut_ptr()) };
    std::process::exit(code);
}
