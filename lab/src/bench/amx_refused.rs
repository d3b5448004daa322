//! Launches with Linux's grant of AMX tile data refused, as on a kernel older than 5.16 or one
//! that refuses the process: XNNPACK (ExecuTorch's and xnnblob's) then keeps its AMX kernels off
//! and runs the AVX-512 ones. So an AMX machine also measures the AVX-512 class below it, on the
//! same cores, in the same run of the bench.
//!
//! The refusal is a seccomp filter, installed in the child between fork and exec, that answers
//! `arch_prctl(ARCH_REQ_XCOMP_PERM, ...)` with EPERM and lets every other system call through.

use std::process::Command;

/// `arch_prctl`'s request for permission to use an extended state component.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
const ARCH_REQ_XCOMP_PERM: u32 = 0x1023;

/// Makes `command`'s process (and its children) find AMX tile data refused.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub fn refuse_amx(command: &mut Command) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: the closure runs in the forked child before exec and only makes two prctl calls,
    // which allocate nothing and take no locks (async-signal-safe), on a filter owned by the
    // closure for as long as the calls run.
    unsafe {
        command.pre_exec(|| {
            let filter = seccomp_filter();
            let program = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr().cast_mut(),
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &program as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Elsewhere there is no grant to refuse: XNNPACK asks for none.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
pub fn refuse_amx(_command: &mut Command) {}

/// The filter: on x86-64, `arch_prctl(ARCH_REQ_XCOMP_PERM, ...)` fails with EPERM; everything
/// else is allowed. Offsets are those of `struct seccomp_data` (nr, arch, instruction pointer,
/// args), whose fields are host-endian: the low half of args[0] is at 16 on little-endian x86.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn seccomp_filter() -> [libc::sock_filter; 9] {
    const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
    const NR: u32 = 0;
    const ARCH: u32 = 4;
    const ARG0_LOW: u32 = 16;
    let load = |offset: u32| libc::sock_filter {
        code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
        jt: 0,
        jf: 0,
        k: offset,
    };
    // Skips `equal` instructions when the accumulator equals `value`, else `unequal`.
    let jump_if = |value: u32, equal: u8, unequal: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt: equal,
        jf: unequal,
        k: value,
    };
    let ret = |action: u32| libc::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k: action,
    };
    [
        load(ARCH),
        jump_if(AUDIT_ARCH_X86_64, 1, 0),
        ret(libc::SECCOMP_RET_ALLOW),
        load(NR),
        jump_if(libc::SYS_arch_prctl as u32, 0, 3),
        load(ARG0_LOW),
        jump_if(ARCH_REQ_XCOMP_PERM, 0, 1),
        ret(libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        ret(libc::SECCOMP_RET_ALLOW),
    ]
}

#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
mod tests {
    use super::*;

    /// The filtered child is refused the tiles (its request fails with EPERM) and runs as
    /// before otherwise; an unfiltered one is not refused on a kernel that knows the request.
    #[test]
    fn a_refused_child_is_denied_tile_data_and_runs_otherwise() {
        // Python asks the kernel itself, so the test needs no helper binary of its own.
        let ask = "import ctypes,os;r=ctypes.CDLL(None,use_errno=True).syscall(158,0x1023,18);\
                   print(r, ctypes.get_errno())";
        let run = |refused: bool| {
            let mut command = Command::new("python3");
            command.args(["-c", ask]);
            if refused {
                refuse_amx(&mut command);
            }
            let out = command.output().expect("python3 runs");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        let refused = format!("-1 {}", libc::EPERM);
        assert_eq!(run(true), refused);
        // Unfiltered: granted (0) on an AMX machine, and where the kernel or the CPU has no tile
        // data to grant, EINVAL or EOPNOTSUPP (by kernel version); never the filter's EPERM.
        let unfiltered = run(false);
        assert_ne!(
            unfiltered, refused,
            "the refusal reached an unfiltered child"
        );
    }
}
