//! The CPU identity a packed-weight cache file is recorded with: every input of XNNPACK's choice
//! of microkernels, so that a file packed on one CPU is never used on a CPU where XNNPACK would
//! pick other kernels, and so read the packed bytes in another layout (the AMX qd8 kernels pack
//! 64 columns to a tile where the AVX512-VNNI ones pack 16).
//!
//! XNNPACK 4ea82e5 chooses in two places, both from what cpuinfo reports:
//! - `src/configs/hardware-config.c` sets its `use_x86_*` / `use_arm_*` flags from cpuinfo's ISA
//!   predicates and, on Linux, asks the kernel for AMX tile data before it uses AMX;
//! - `src/configs/gemm-config.c` and `dwconv-config.c` also read the microarchitecture of core 0:
//!   AMD Zen and Hygon Dhyana get 16s4 f32 GEMM kernels (another packing), and on Arm each core
//!   type has its own kernels and tiles. (Its choice of qb4w kernels for Zen 4 is patched away:
//!   every AVX512-VNNI CPU runs xnnblob's, xnnpack-sys patch 0028.)
//!
//! The fingerprint records the inputs of those decisions as cpuinfo (Debian's snapshot 877328f,
//! the one XNNPACK is built with) derives them: one named bit per ISA predicate, and what the
//! microarchitecture is decoded from (x86-64: the vendor and the CPUID signature without its
//! stepping; aarch64: a hash of the core types' MIDRs). Recording inputs rather than XNNPACK's
//! resulting flags makes it finer than XNNPACK's decision, never coarser: two CPUs that XNNPACK
//! treats alike may differ (a file is then rebuilt needlessly), two that it treats differently
//! never match. `docs/cache-format.md` lists every bit.
//!
//! Detection is a pure function of what the CPU reports (`x86::X86Cpuid`, `arm::ArmIsa` and the
//! MIDRs), compiled on every architecture so that any host's tests can describe any CPU; only
//! reading the report touches the hardware.

use std::sync::OnceLock;

/// Bits 56..64: which architecture, and which scheme of bits below. The previous scheme tagged
/// x86-64 `0x01` and aarch64 `0x02` and gave the bits other meanings; new tags keep its files
/// from ever matching a fingerprint of this scheme.
const TAG_SHIFT: u32 = 56;
const TAG_X86_64: u64 = 0x11;
const TAG_AARCH64: u64 = 0x12;
const TAG_OTHER: u64 = 0xFF;

/// This CPU's fingerprint: its tag in the top byte, then the features and the microarchitecture
/// inputs that XNNPACK's kernel choice reads. Read once per process (XNNPACK too decides once).
pub fn cpu_fingerprint() -> u64 {
    static FINGERPRINT: OnceLock<u64> = OnceLock::new();
    *FINGERPRINT.get_or_init(detect)
}

/// A fingerprint in words: its architecture, the features it records and its CPU model, for
/// messages and tests.
pub fn describe_cpu_fingerprint(fingerprint: u64) -> String {
    let bits = fingerprint & !(0xFF << TAG_SHIFT);
    match fingerprint >> TAG_SHIFT {
        TAG_X86_64 => format!(
            "x86-64 [{}] {}",
            names(x86::NAMES, bits).join(" "),
            x86::model(bits)
        ),
        TAG_AARCH64 => format!(
            "aarch64 [{}] {}",
            names(arm::NAMES, bits).join(" "),
            arm::model(bits)
        ),
        TAG_OTHER => "an architecture xnnblob records no features of".to_string(),
        tag => format!("{fingerprint:#x} (tag {tag:#04x}: not this scheme's)"),
    }
}

/// What differs between the fingerprint a file was packed with and this CPU's, in words: the
/// features only one of them has, and the CPU models when they differ.
pub fn cpu_fingerprint_difference(file: u64, this: u64) -> String {
    let tag = file >> TAG_SHIFT;
    if tag != this >> TAG_SHIFT || !matches!(tag, TAG_X86_64 | TAG_AARCH64) {
        return format!(
            "the file's is {}, this CPU's {}",
            describe_cpu_fingerprint(file),
            describe_cpu_fingerprint(this)
        );
    }
    let (table, model): (&Names, fn(u64) -> String) = if tag == TAG_X86_64 {
        (x86::NAMES, x86::model)
    } else {
        (arm::NAMES, arm::model)
    };
    let mut parts = Vec::new();
    let only_file = names(table, file & !this);
    if !only_file.is_empty() {
        parts.push(format!("only the file's CPU has {}", only_file.join(" ")));
    }
    let only_this = names(table, this & !file);
    if !only_this.is_empty() {
        parts.push(format!("only this CPU has {}", only_this.join(" ")));
    }
    let features = table.iter().fold(0, |all, (mask, _)| all | mask);
    if (file ^ this) & !features & !(0xFF << TAG_SHIFT) != 0 {
        parts.push(format!(
            "CPU model {} in the file, {} here",
            model(file),
            model(this)
        ));
    }
    parts.join("; ")
}

/// The part of a fingerprint that decides how XNNPACK lays packed weights out: two CPUs of one
/// packing class get byte-identical packed weights from it, though their fingerprints differ
/// (another model of the same kernel class). A read-only layer made ahead of time for a class
/// (`xnnblob prepack`) serves every CPU of it.
///
/// It keeps the architecture tag and every feature bit XNNPACK 4ea82e5 reads (each selects
/// kernels, and with them packers and layouts), and replaces the CPU model with the decisions
/// XNNPACK makes from it that change a layout, not only a kernel's `mr` or its assembly:
/// - x86-64: Zen (AMD family 0x17, models 0x00-0x1F) and Hygon's family 0 get the f32 GEMM
///   packed `16s4` instead of `16` (`gemm-config.c:692-716`).
/// - aarch64: core 0's Exynos M1/M2 f32 GEMM, A35/Kryo/A53/A55 qs8 GEMM and A53/A55 depthwise
///   tiles (the `core0:` bits); core types whose rank leaves core 0 unknown keep their hash.
pub fn packing_class(fingerprint: u64) -> u64 {
    let tag = fingerprint >> TAG_SHIFT;
    match tag {
        TAG_X86_64 => {
            let features = x86::NAMES.iter().fold(0, |all, (mask, _)| all | mask) & !x86::UNREAD;
            (tag << TAG_SHIFT) | (fingerprint & features) | x86::layout_decisions(fingerprint)
        }
        TAG_AARCH64 if fingerprint & arm::CORE0_UNSURE != 0 => fingerprint & !arm::UNREAD,
        TAG_AARCH64 => {
            let features = arm::NAMES.iter().fold(0, |all, (mask, _)| all | mask) & !arm::UNREAD;
            (tag << TAG_SHIFT) | (fingerprint & features)
        }
        _ => fingerprint,
    }
}

/// What XNNPACK decides from an x86-64 CPU's model, beyond its features, that lays packed weights
/// out differently from every other CPU with those features (see [`packing_class`]), said in
/// words; None for other CPUs and architectures. A read-only layer for a kernel class
/// (`xnnblob prepack`) packed on such a CPU would hold layouts the class's other CPUs never look
/// up, so it is packed on an emulated CPU of the class instead.
pub fn x86_model_layout(fingerprint: u64) -> Option<&'static str> {
    if fingerprint >> TAG_SHIFT != TAG_X86_64 || x86::layout_decisions(fingerprint) == 0 {
        return None;
    }
    Some("its f32 GEMM is packed 16s4 (AMD Zen, Hygon Dhyana)")
}

/// Each feature bit of an architecture with its name, in bit order.
type Names = [(u64, &'static str)];

/// The names of the features set in `bits`, in the table's order.
fn names(table: &Names, bits: u64) -> Vec<&'static str> {
    table
        .iter()
        .filter(|(mask, _)| bits & mask != 0)
        .map(|(_, name)| *name)
        .collect()
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
mod x86;

#[cfg_attr(
    not(all(
        target_arch = "aarch64",
        any(target_os = "linux", target_os = "android")
    )),
    allow(dead_code)
)]
mod arm;

#[cfg(target_arch = "x86_64")]
fn detect() -> u64 {
    x86::x86_fingerprint(&read_x86_cpuid(), request_amx_tile_data)
}

#[cfg(target_arch = "x86_64")]
fn read_x86_cpuid() -> x86::X86Cpuid {
    use std::arch::x86_64::__cpuid_count;
    let leaf0 = __cpuid_count(0, 0);
    let max_leaf = leaf0.eax;
    let mut vendor = [0u8; 12];
    vendor[..4].copy_from_slice(&leaf0.ebx.to_le_bytes());
    vendor[4..8].copy_from_slice(&leaf0.edx.to_le_bytes());
    vendor[8..].copy_from_slice(&leaf0.ecx.to_le_bytes());
    let mut cpu = x86::X86Cpuid {
        vendor,
        ..x86::X86Cpuid::default()
    };
    if max_leaf >= 1 {
        let leaf1 = __cpuid_count(1, 0);
        cpu.leaf1_eax = leaf1.eax;
        cpu.leaf1_ecx = leaf1.ecx;
    }
    if max_leaf >= 7 {
        let l = __cpuid_count(7, 0);
        cpu.leaf7 = [l.ebx, l.ecx, l.edx];
        let l = __cpuid_count(7, 1);
        cpu.leaf7_1 = [l.eax, l.edx];
    }
    if cpu.leaf1_ecx & 0x0C00_0000 == 0x0C00_0000 {
        if max_leaf >= 0xD {
            let l = __cpuid_count(0xD, 0);
            cpu.xcr0_supported = (u64::from(l.edx) << 32) | u64::from(l.eax);
        }
        // SAFETY: CPUID.1:ECX says the CPU has XSAVE (bit 26) and the OS has enabled it (bit 27,
        // OSXSAVE), which is what makes XGETBV available in user mode; it reads XCR0 only.
        cpu.xcr0 = unsafe { std::arch::x86_64::_xgetbv(0) };
    }
    cpu
}

/// Asks Linux for AMX tile data, as XNNPACK's `init_hardware_config` does, and says whether it
/// was granted. The grant is per process and permanent, so asking first changes nothing
/// XNNPACK then sees; and the answer can differ between processes of one machine (the kernel
/// refuses a process whose signal stacks are too small for the tile state), which is why it is
/// part of the fingerprint.
#[cfg(all(
    target_arch = "x86_64",
    any(target_os = "linux", target_os = "android")
))]
fn request_amx_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl(ARCH_REQ_XCOMP_PERM, feature) takes two integers and touches no memory
    // of this process; it only permits the process to use the feature's register state.
    let status = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    status == 0
}

/// Outside Linux XNNPACK asks nothing: the CPU's AMX bits decide alone.
#[cfg(all(
    target_arch = "x86_64",
    not(any(target_os = "linux", target_os = "android"))
))]
fn request_amx_tile_data() -> bool {
    true
}

#[cfg(all(
    target_arch = "aarch64",
    any(target_os = "linux", target_os = "android")
))]
fn detect() -> u64 {
    // SAFETY: getauxval only reads the auxiliary vector the kernel gave the process.
    let (hwcap, hwcap2) = unsafe {
        (
            libc::getauxval(libc::AT_HWCAP),
            libc::getauxval(libc::AT_HWCAP2),
        )
    };
    // Unreadable (a sandbox): no core types, as under user-mode emulation.
    let midrs = std::fs::read_to_string("/proc/cpuinfo")
        .map(|text| arm::midrs_of_proc_cpuinfo(&text))
        .unwrap_or_default();
    let last = midrs.last().copied().unwrap_or(0);
    arm::arm_fingerprint(&arm::arm_isa_of_linux(hwcap, hwcap2, last), &midrs)
}

/// Outside Linux (Apple, Windows) cpuinfo asks the OS for features, as the standard library
/// does; there are no MIDRs to read.
#[cfg(all(
    target_arch = "aarch64",
    not(any(target_os = "linux", target_os = "android"))
))]
fn detect() -> u64 {
    use std::arch::is_aarch64_feature_detected as has;
    let isa = arm::ArmIsa {
        fp16_arith: has!("fp16"),
        dot: has!("dotprod"),
        i8mm: has!("i8mm"),
        bf16: has!("bf16"),
        sve: has!("sve"),
        sve2: has!("sve2"),
        sme: false,
        sme2: false,
        fhm: has!("fhm"),
    };
    arm::arm_fingerprint(&isa, &[])
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect() -> u64 {
    TAG_OTHER << TAG_SHIFT
}

#[cfg(test)]
mod tests {
    use super::arm::{
        self, ArmIsa, arm_fingerprint, arm_isa_of_linux, hwcap, midrs_of_proc_cpuinfo,
    };
    use super::x86::{self, X86Cpuid, x86_fingerprint};
    use super::*;

    /// A Sapphire Rapids Xeon as cpuinfo reads it: every x86 feature XNNPACK 4ea82e5 reads, with
    /// the OS saving YMM, ZMM and AMX state.
    fn sapphire_rapids() -> X86Cpuid {
        X86Cpuid {
            vendor: *b"GenuineIntel",
            // Family 6, model 0x8F, stepping 8.
            leaf1_eax: 0x0008_06F8,
            leaf1_ecx: (1 << 9) | (1 << 19) | (1 << 28) | (1 << 29) | (1 << 12) | 0x0C00_0000,
            leaf7: [
                (1 << 5) | (1 << 16) | (1 << 30) | (1 << 17) | (1 << 31),
                (1 << 1) | (1 << 11) | (1 << 8),
                (1 << 23) | (1 << 25) | (1 << 24) | (1 << 22),
            ],
            leaf7_1: [(1 << 21) | (1 << 4), 1 << 4],
            xcr0_supported: 0x6_00E7,
            xcr0: 0x6_00E7,
        }
    }

    fn granted() -> bool {
        true
    }

    /// Takes one CPUID or XCR0 bit out of a report.
    type ClearBit = fn(&mut X86Cpuid);

    /// Each x86 feature's name, and how to take its CPUID or XCR0 bit out of a report.
    fn x86_sources() -> Vec<(&'static str, ClearBit)> {
        vec![
            ("ssse3", |c| c.leaf1_ecx &= !(1 << 9)),
            ("sse4.1", |c| c.leaf1_ecx &= !(1 << 19)),
            ("avx", |c| c.leaf1_ecx &= !(1 << 28)),
            ("f16c", |c| c.leaf1_ecx &= !(1 << 29)),
            ("fma3", |c| c.leaf1_ecx &= !(1 << 12)),
            ("avx2", |c| c.leaf7[0] &= !(1 << 5)),
            ("avx512f", |c| c.leaf7[0] &= !(1 << 16)),
            ("avx512bw", |c| c.leaf7[0] &= !(1 << 30)),
            ("avx512dq", |c| c.leaf7[0] &= !(1 << 17)),
            ("avx512vl", |c| c.leaf7[0] &= !(1 << 31)),
            ("avx512vbmi", |c| c.leaf7[1] &= !(1 << 1)),
            ("avx512vnni", |c| c.leaf7[1] &= !(1 << 11)),
            ("gfni", |c| c.leaf7[1] &= !(1 << 8)),
            ("avx512fp16", |c| c.leaf7[2] &= !(1 << 23)),
            ("amx-int8", |c| c.leaf7[2] &= !(1 << 25)),
            ("amx-tile", |c| c.leaf7[2] &= !(1 << 24)),
            ("amx-bf16", |c| c.leaf7[2] &= !(1 << 22)),
            ("amx-fp16", |c| c.leaf7_1[0] &= !(1 << 21)),
            ("xcr0.xtilecfg", |c| c.xcr0 &= !(1 << 17)),
            ("xcr0.xtiledata", |c| c.xcr0 &= !(1 << 18)),
            ("avx-vnni", |c| c.leaf7_1[0] &= !(1 << 4)),
            ("avx-vnni-int8", |c| c.leaf7_1[1] &= !(1 << 4)),
        ]
    }

    #[test]
    fn every_x86_feature_xnnpack_reads_changes_the_fingerprint_alone() {
        let full = x86_fingerprint(&sapphire_rapids(), granted);
        assert_eq!(
            names(x86::NAMES, full).len(),
            x86::NAMES.len(),
            "{}",
            describe_cpu_fingerprint(full)
        );
        let sources = x86_sources();
        // Every named feature but the OS grant (below) has its CPUID or XCR0 bit.
        assert_eq!(sources.len() + 1, x86::NAMES.len());
        for (name, clear) in sources {
            let mut cpu = sapphire_rapids();
            clear(&mut cpu);
            let without = x86_fingerprint(&cpu, granted);
            let difference = cpu_fingerprint_difference(full, without);
            // Clearing an AMX-request input also takes the grant, which is not asked then.
            let expected = if [
                "avx512f",
                "avx512bw",
                "avx512dq",
                "avx512vl",
                "avx512vnni",
                "gfni",
                "amx-int8",
            ]
            .contains(&name)
            {
                format!("only the file's CPU has {name} amx-granted")
            } else {
                format!("only the file's CPU has {name}")
            };
            assert_eq!(difference, expected);
        }
    }

    #[test]
    fn a_refused_amx_grant_changes_the_fingerprint() {
        let cpu = sapphire_rapids();
        let refused = x86_fingerprint(&cpu, || false);
        let full = x86_fingerprint(&cpu, granted);
        assert_eq!(
            cpu_fingerprint_difference(full, refused),
            "only the file's CPU has amx-granted"
        );
    }

    #[test]
    fn amx_is_requested_only_where_xnnpack_requests_it() {
        // XNNPACK asks only with AVX512-SKX, -VNNI, GFNI and AMX-INT8; so does the fingerprint,
        // and a CPU without them never records a grant.
        for (name, clear) in x86_sources() {
            let mut cpu = sapphire_rapids();
            clear(&mut cpu);
            let mut asked = false;
            x86_fingerprint(&cpu, || {
                asked = true;
                true
            });
            let xnnpack_asks = !matches!(
                name,
                "avx512f"
                    | "avx512bw"
                    | "avx512dq"
                    | "avx512vl"
                    | "avx512vnni"
                    | "gfni"
                    | "amx-int8"
            );
            assert_eq!(asked, xnnpack_asks, "without {name}");
        }
    }

    #[test]
    fn vector_features_count_only_when_the_os_saves_their_registers() {
        // The CPU reports AVX-512 and AMX, but the OS saves no ZMM state (XCR0 = x87|SSE|YMM):
        // cpuinfo, and so XNNPACK, sees AVX2 and no AVX-512 or AMX.
        let mut cpu = sapphire_rapids();
        cpu.xcr0 = 0x7;
        let f = x86_fingerprint(&cpu, granted);
        let got = names(x86::NAMES, f);
        assert!(
            got.contains(&"avx2") && got.contains(&"avx-vnni"),
            "{got:?}"
        );
        assert!(
            !got.iter()
                .any(|n| n.starts_with("avx512") || n.starts_with("amx"))
        );
        // GFNI needs no OS state in cpuinfo's test.
        assert!(got.contains(&"gfni"));
        // Without OSXSAVE, XCR0 is not read at all: no AVX either.
        let mut cpu = sapphire_rapids();
        cpu.leaf1_ecx &= !(1 << 27);
        let got = names(x86::NAMES, x86_fingerprint(&cpu, granted));
        assert_eq!(got, ["ssse3", "sse4.1", "gfni"]);
    }

    #[test]
    fn the_cpu_model_is_recorded_without_its_stepping() {
        let cpu = sapphire_rapids();
        let f = x86_fingerprint(&cpu, granted);
        let mut stepping = cpu;
        stepping.leaf1_eax ^= 0x7;
        assert_eq!(x86_fingerprint(&stepping, granted), f);
        let mut model = cpu;
        model.leaf1_eax = 0x0006_06A6;
        assert_eq!(
            cpu_fingerprint_difference(f, x86_fingerprint(&model, granted)),
            "CPU model Intel family 0x6 model 0x8f in the file, Intel family 0x6 model 0x6a here"
        );
        let mut vendor = cpu;
        vendor.vendor = *b"AuthenticAMD";
        assert_ne!(x86_fingerprint(&vendor, granted), f);
    }

    /// An AMD CPU of `family` and `model` with AVX2 and FMA3 (the Zen path of XNNPACK's f32 GEMM).
    fn amd(family: u32, model: u32) -> u64 {
        let (base_family, extended_family) = if family >= 0xF {
            (0xF, family - 0xF)
        } else {
            (family, 0)
        };
        let cpu = X86Cpuid {
            vendor: *b"AuthenticAMD",
            leaf1_eax: (extended_family << 20)
                | ((model >> 4) << 16)
                | (base_family << 8)
                | ((model & 0xF) << 4),
            leaf1_ecx: (1 << 12) | (1 << 28) | 0x0C00_0000,
            leaf7: [1 << 5, 0, 0],
            xcr0_supported: 0x7,
            xcr0: 0x7,
            ..X86Cpuid::default()
        };
        x86_fingerprint(&cpu, granted)
    }

    #[test]
    fn zen_is_named_and_zen_and_zen_4_are_told_apart_from_their_neighbours() {
        // Zen (0x17, models 0x00-0x1F) gets XNNPACK's 16s4 f32 GEMM; Zen 2 (0x17, 0x31) does not.
        let zen = amd(0x17, 0x01);
        let zen2 = amd(0x17, 0x31);
        assert_ne!(zen, zen2);
        let why = cpu_fingerprint_difference(zen, zen2);
        assert!(
            why.contains("model 0x1 (Zen: XNNPACK's f32 GEMM packs 16s4)"),
            "{why}"
        );
        // Zen 3 (0x19, 0x21) and Zen 4 (0x19, 0x61): told apart by the model alone, which
        // XNNPACK (patched: xnnpack-sys 0028) no longer reads for them.
        let why = cpu_fingerprint_difference(amd(0x19, 0x21), amd(0x19, 0x61));
        assert!(why.ends_with("AMD family 0x19 model 0x61 here"), "{why}");
        assert!(!why.contains("only"), "same features: {why}");
    }

    #[test]
    fn fingerprints_of_the_previous_scheme_never_match() {
        // The previous scheme tagged x86-64 1 and aarch64 2, with other bit meanings.
        let f = x86_fingerprint(&sapphire_rapids(), granted);
        assert_eq!(f >> TAG_SHIFT, TAG_X86_64);
        let arm = arm_fingerprint(&ArmIsa::default(), &[]);
        assert_eq!(arm >> TAG_SHIFT, TAG_AARCH64);
        for old_tag in [1u64, 2] {
            let old = (old_tag << TAG_SHIFT) | (f & 0xFF_FFFF);
            assert_ne!(old, f);
            assert!(cpu_fingerprint_difference(old, f).contains("not this scheme's"));
        }
    }

    /// Linux HWCAPs of an arm64 core with every feature XNNPACK reads.
    const HWCAP_ALL: u64 =
        hwcap::FPHP | hwcap::ASIMDHP | hwcap::ASIMDDP | hwcap::SVE | hwcap::ASIMDFHM;
    const HWCAP2_ALL: u64 = hwcap::SVE2 | hwcap::I8MM | hwcap::BF16 | hwcap::SME | hwcap::SME2;
    /// A Neoverse V2 (Arm 0xD4F, r0p1).
    const NEOVERSE_V2: u32 = 0x410F_D4F1;

    #[test]
    fn every_arm_feature_xnnpack_reads_changes_the_fingerprint_alone() {
        let midrs = [NEOVERSE_V2];
        let full = arm_fingerprint(&arm_isa_of_linux(HWCAP_ALL, HWCAP2_ALL, 0), &midrs);
        let features = arm::NAMES
            .iter()
            .filter(|(_, n)| !n.starts_with("core0:"))
            .count();
        assert_eq!(names(arm::NAMES, full).len(), features);
        let cases: [(&str, u64, u64); 9] = [
            ("fp16-arith", hwcap::FPHP, 0),
            ("dot", hwcap::ASIMDDP, 0),
            ("i8mm", 0, hwcap::I8MM),
            ("bf16", 0, hwcap::BF16),
            ("sve", hwcap::SVE, 0),
            ("sve2", 0, hwcap::SVE2),
            ("sme", 0, hwcap::SME),
            ("sme2", 0, hwcap::SME2),
            ("fhm", hwcap::ASIMDFHM, 0),
        ];
        for (name, cap, cap2) in cases {
            let isa = arm_isa_of_linux(HWCAP_ALL & !cap, HWCAP2_ALL & !cap2, 0);
            assert_eq!(
                cpu_fingerprint_difference(full, arm_fingerprint(&isa, &midrs)),
                format!("only the file's CPU has {name}")
            );
        }
        // Either of cpuinfo's two BF16 HWCAPs is BF16.
        let sve_bf16 = arm_isa_of_linux(0, hwcap::SVEBF16, 0);
        assert!(sve_bf16.bf16);
    }

    #[test]
    fn cpuinfo_takes_fp16_and_dot_from_the_core_type_where_old_kernels_omit_them() {
        // A Cortex-A76 whose kernel reports neither: cpuinfo, so XNNPACK, uses both.
        let a76 = arm_isa_of_linux(0, 0, 0x413F_D0B0);
        assert!(a76.fp16_arith && a76.dot);
        // Cortex-A55 r0 has FP16 but no dot product; r1 has both.
        let a55r0 = arm_isa_of_linux(0, 0, 0x410F_D050);
        assert!(a55r0.fp16_arith && !a55r0.dot);
        let a55r1 = arm_isa_of_linux(0, 0, 0x411F_D050);
        assert!(a55r1.dot);
        // Cortex-A75: dot from r2 only.
        assert!(!arm_isa_of_linux(0, 0, 0x411F_D0A0).dot);
        assert!(arm_isa_of_linux(0, 0, 0x412F_D0A0).dot);
        // A core type cpuinfo has no rule for: the HWCAPs alone; FP16 needs scalar and vector.
        let a53 = 0x410F_D034;
        assert!(!arm_isa_of_linux(hwcap::FPHP, 0, a53).fp16_arith);
        assert!(arm_isa_of_linux(hwcap::FPHP | hwcap::ASIMDHP, 0, a53).fp16_arith);
    }

    #[test]
    fn core_types_are_recorded_as_a_set() {
        let isa = arm_isa_of_linux(HWCAP_ALL, 0, 0);
        let a55 = 0x411F_D051;
        let a78 = 0x411F_D410;
        let big_little = arm_fingerprint(&isa, &[a55, a55, a78, a78]);
        // Order and the number of cores of a type do not matter (cores go offline)...
        assert_eq!(arm_fingerprint(&isa, &[a78, a55]), big_little);
        // ...a core type does: XNNPACK's kernels follow core 0's (the biggest).
        let little_only = arm_fingerprint(&isa, &[a55]);
        assert_ne!(little_only, big_little);
        let why = cpu_fingerprint_difference(big_little, little_only);
        assert!(
            why.starts_with("only this CPU has core0:dwconv-c4; CPU model core types #"),
            "{why}"
        );
        // The revision counts too (cpuinfo tells Cortex-A55 r0p0 from later ones by it).
        assert_ne!(arm_fingerprint(&isa, &[a55 & !0xF]), little_only);
        assert_eq!(
            arm_fingerprint(&isa, &[]) >> arm::MIDRS_SHIFT,
            TAG_AARCH64 << (TAG_SHIFT - arm::MIDRS_SHIFT),
            "no MIDR read: a zero hash"
        );
    }

    #[test]
    fn core_0_is_the_core_type_cpuinfo_ranks_first_and_its_layout_decisions_are_recorded() {
        let dot = arm_isa_of_linux(HWCAP_ALL, 0, 0);
        let no_dot = ArmIsa::default();
        let (a53, a55, a510, a72, a78) = (
            0x410F_D034,
            0x411F_D051,
            0x410F_D461,
            0x410F_D080,
            0x411F_D410,
        );
        let core0 = |isa: &ArmIsa, midrs: &[u32]| arm::core0_decisions(midrs, isa);
        // A big core first: none of the little cores' layouts.
        assert_eq!(core0(&dot, &[a55, a78]), 0);
        assert_eq!(core0(&no_dot, &[a53, a72]), 0);
        // Little cores alone: their depthwise tiles, and without dot products their qs8 GEMM.
        assert_eq!(core0(&dot, &[a55]), arm::CORE0_DWCONV_C4);
        assert_eq!(
            core0(&no_dot, &[a53]),
            arm::CORE0_DWCONV_C4 | arm::CORE0_QS8_16X1
        );
        // Cortex-A35 and Kryo: the qs8 GEMM only.
        assert_eq!(core0(&no_dot, &[0x410F_D040]), arm::CORE0_QS8_16X1);
        // Exynos M1 (the Exynos 8890's MIDR) and M2: the f32 GEMM packed 8s4.
        assert_eq!(core0(&dot, &[0x531F_0011, a53]), arm::CORE0_F32_S4);
        assert_eq!(core0(&dot, &[0x534F_0010]), arm::CORE0_F32_S4);
        // Ranked alike, deciding apart: which is core 0 is not known.
        assert_eq!(core0(&dot, &[a55, a510]), arm::CORE0_UNSURE);
        // None read (user-mode emulation): XNNPACK's default, as cpuinfo knows no core either.
        assert_eq!(core0(&dot, &[]), 0);
    }

    #[test]
    fn a_packing_class_keeps_what_changes_a_layout_and_drops_the_cpu_model() {
        let isa = arm_isa_of_linux(HWCAP_ALL, 0, 0);
        let (a55, a76, a78) = (0x411F_D051, 0x414F_D0B0, 0x411F_D410);
        let phone = arm_fingerprint(&isa, &[a55, a76]);
        let other_phone = arm_fingerprint(&isa, &[a55, a78]);
        assert_ne!(phone, other_phone);
        assert_eq!(packing_class(phone), packing_class(other_phone));
        // ...and as emulated, with no core type read.
        assert_eq!(
            packing_class(phone),
            packing_class(arm_fingerprint(&isa, &[]))
        );
        // A little core 0 packs depthwise convolutions otherwise.
        assert_ne!(
            packing_class(phone),
            packing_class(arm_fingerprint(&isa, &[a55]))
        );
        // A feature XNNPACK reads splits classes; one it does not read (FHM) does not.
        let no_fhm = arm_isa_of_linux(HWCAP_ALL & !hwcap::ASIMDFHM, 0, 0);
        assert_eq!(
            packing_class(phone),
            packing_class(arm_fingerprint(&no_fhm, &[a76]))
        );
        let no_dot = arm_isa_of_linux(HWCAP_ALL & !hwcap::ASIMDDP, 0, 0);
        assert_ne!(
            packing_class(phone),
            packing_class(arm_fingerprint(&no_dot, &[a76]))
        );

        // x86-64: two models of one vendor and features share a class; Zen 1 does not share
        // Zen 2's (its f32 GEMM is packed 16s4).
        let x86 = |vendor: u64, signature: u64, features: u64| {
            (TAG_X86_64 << TAG_SHIFT)
                | (vendor << x86::VENDOR_SHIFT)
                | (signature << x86::SIGNATURE_SHIFT)
                | features
        };
        let avx2 = x86::SSSE3 | x86::SSE4_1 | x86::AVX | x86::F16C | x86::FMA3 | x86::AVX2;
        // CPUID.1:EAX >> 4 of Haswell (family 6, model 0x3C) and Skylake (model 0x5E).
        let (haswell, skylake) = (0x0306C, 0x0506E);
        assert_eq!(
            packing_class(x86(x86::INTEL, haswell, avx2)),
            packing_class(x86(x86::INTEL, skylake, avx2))
        );
        // Zen 1 (family 0x17, model 0x01) and Zen 2 (model 0x31).
        let (zen1, zen2) = (0x800F1, 0x830F1);
        assert_ne!(
            packing_class(x86(x86::AMD, zen1, avx2)),
            packing_class(x86(x86::AMD, zen2, avx2))
        );
        assert_eq!(
            packing_class(x86(x86::AMD, zen2, avx2)),
            packing_class(x86(x86::INTEL, haswell, avx2))
        );
        // AMX's tile features are not read; whether the OS granted AMX is.
        let amx = avx2 | x86::AVX512F | x86::AMX_INT8 | x86::AMX_GRANTED;
        assert_eq!(
            packing_class(x86(x86::INTEL, 0x806F8 >> 4, amx)),
            packing_class(x86(
                x86::INTEL,
                0x806F8 >> 4,
                amx | x86::AMX_TILE | x86::XTILEDATA
            ))
        );
        assert_ne!(
            packing_class(x86(x86::INTEL, 0x806F8 >> 4, amx)),
            packing_class(x86(x86::INTEL, 0x806F8 >> 4, amx & !x86::AMX_GRANTED))
        );
    }

    #[test]
    fn midrs_are_read_from_each_core_of_proc_cpuinfo() {
        let text = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd\n\
                    CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x1\n\
                    CPU part\t: 0xd05\nCPU revision\t: 0\n\n\
                    processor\t: 1\nCPU implementer\t: 0x41\nCPU architecture: 8\n\
                    CPU variant\t: 0x3\nCPU part\t: 0xd0b\nCPU revision\t: 1\n\n\
                    processor\t: 2\nFeatures\t: fp\n";
        assert_eq!(midrs_of_proc_cpuinfo(text), [0x4110_D050, 0x4130_D0B1]);
        // An x86 /proc/cpuinfo (what user-mode emulation shows) has none.
        assert!(midrs_of_proc_cpuinfo("processor\t: 0\nvendor_id\t: AuthenticAMD\n").is_empty());
    }

    #[test]
    fn any_fingerprint_can_be_described() {
        // A crafted file's header can hold any value; its rejection message must still form.
        let mut value = 0x9E37_79B9_7F4A_7C15u64;
        for tag in [0, 1, 2, TAG_X86_64, TAG_AARCH64, TAG_OTHER, 0x7F] {
            for _ in 0..64 {
                value = value.rotate_left(17).wrapping_mul(0x2545_F491_4F6C_DD1D);
                let f = (tag << TAG_SHIFT) | (value >> 8);
                assert!(!describe_cpu_fingerprint(f).is_empty());
                assert!(!cpu_fingerprint_difference(f, cpu_fingerprint()).is_empty());
                assert!(!cpu_fingerprint_difference(f, f ^ 1).is_empty());
            }
        }
    }

    #[test]
    fn this_cpus_fingerprint_is_stable_and_tagged() {
        let f = cpu_fingerprint();
        assert_eq!(f, cpu_fingerprint());
        assert_eq!(f, detect(), "detecting again gives the same answer");
        let tag = f >> TAG_SHIFT;
        if cfg!(target_arch = "x86_64") {
            assert_eq!(tag, TAG_X86_64);
        } else if cfg!(target_arch = "aarch64") {
            assert_eq!(tag, TAG_AARCH64);
        }
        println!("this CPU: {f:#x} {}", describe_cpu_fingerprint(f));
    }
}
