//! aarch64: one bit per cpuinfo predicate that `hardware-config.c` reads and that can differ
//! between arm64 CPUs (vfpv3, neon, neon-fp16, neon-fma and neon-v8 are true on every one),
//! then a hash of the core types' MIDRs, which cpuinfo decodes core 0's and every cluster's
//! microarchitecture from.

use super::{Names, TAG_AARCH64, TAG_SHIFT};

/// FP16 arithmetic (cpuinfo's `fp16arith`): `use_arm_fp16_arith`,
/// `use_arm_neon_fp16_arith`.
pub const FP16_ARITH: u64 = 1 << 0;
/// SDOT/UDOT (cpuinfo's `dot`): `use_arm_neon_dot`.
pub const DOT: u64 = 1 << 1;
/// Int8 matrix multiply, HWCAP2_I8MM: `use_arm_neon_i8mm`.
pub const I8MM: u64 = 1 << 2;
/// BF16, HWCAP2_BF16 or HWCAP2_SVEBF16 (cpuinfo takes either): `use_arm_neon_bf16`.
pub const BF16: u64 = 1 << 3;
/// SVE, HWCAP_SVE: `use_arm_sve`.
pub const SVE: u64 = 1 << 4;
/// SVE2, HWCAP2_SVE2: `use_arm_sve2`.
pub const SVE2: u64 = 1 << 5;
/// SME, HWCAP2_SME: `use_arm_sme`.
pub const SME: u64 = 1 << 6;
/// SME2, HWCAP2_SME2: `use_arm_sme2`.
pub const SME2: u64 = 1 << 7;
/// FP16 multiply-accumulate into fp32, HWCAP_ASIMDFHM. Not read by XNNPACK 4ea82e5; kept from
/// the previous scheme.
pub const FHM: u64 = 1 << 8;

// What XNNPACK 4ea82e5 decides from cpuinfo's core 0 (the listed core type cpuinfo sorts
// first: the highest `midr_score_core`, so a big core where there is one) that changes a
// packed layout, not only `mr` or the assembly (`src/configs/gemm-config.c`,
// `dwconv-config.c`). Recorded apart from the core types' hash so that a packing class
// ([`packing_class`](super::packing_class)) can keep them and drop the hash.
/// Core 0 is an Exynos M1 or M2: the f32 GEMM is packed `8s4` (gemm-config.c:457-472).
pub const CORE0_F32_S4: u64 = 1 << 10;
/// Core 0 is a Cortex-A35, Kryo (Snapdragon 820/821), Cortex-A53, A55r0 or A55, and the CPU
/// has neither dot product nor i8mm: the qs8 GEMM is packed 16x1, not 8x8
/// (gemm-config.c:3159-3216).
pub const CORE0_QS8_16X1: u64 = 1 << 11;
/// Core 0 is a Cortex-A53, A55r0 or A55: the f32 3x3 depthwise convolution is packed 4
/// channels to a tile, not 8 (dwconv-config.c:240-268).
pub const CORE0_DWCONV_C4: u64 = 1 << 12;
/// Core types that cpuinfo ranks alike disagree on the decisions above: which is core 0
/// depends on their frequencies, which are not recorded, so no packing class is shared.
pub const CORE0_UNSURE: u64 = 1 << 13;

/// Bits 24..56: the low 32 bits of the XXH3-64 of the distinct MIDRs, sorted (0: none could be
/// read).
pub const MIDRS_SHIFT: u32 = 24;

/// Every feature bit with its name, in bit order.
pub const NAMES: &Names = &[
    (FP16_ARITH, "fp16-arith"),
    (DOT, "dot"),
    (I8MM, "i8mm"),
    (BF16, "bf16"),
    (SVE, "sve"),
    (SVE2, "sve2"),
    (SME, "sme"),
    (SME2, "sme2"),
    (FHM, "fhm"),
    (CORE0_F32_S4, "core0:f32-gemm-8s4"),
    (CORE0_QS8_16X1, "core0:qs8-gemm-16x1"),
    (CORE0_DWCONV_C4, "core0:dwconv-c4"),
    (CORE0_UNSURE, "core0:unsure"),
];

/// The bits XNNPACK 4ea82e5 does not read ([`FHM`]): left out of a packing class.
pub const UNREAD: u64 = FHM;

/// cpuinfo's ranking of a core type (`midr_score_core`, `src/arm/midr.h`): big cores first.
fn score(midr: u32) -> u32 {
    match midr & 0xFF00_FFF0 {
        0x5300_0030 | 0x5300_0040 | 0x4100_D440 | 0x4100_D480 | 0x4100_D4E0 => 6,
        0x4100_D080 | 0x4100_D090 | 0x4100_D0A0 | 0x4100_D0B0 | 0x4100_D0D0 | 0x4100_D0E0
        | 0x4100_D410 | 0x4100_D470 | 0x4100_D4D0 | 0x4800_D400 | 0x4E00_0030 | 0x5100_2050
        | 0x5100_8000 | 0x5100_8020 | 0x5100_8040 | 0x5300_0010 | 0x5300_0020 => 5,
        0x4100_D070 => 4,
        0x4100_D060 | 0x4100_D030 | 0x4100_D050 | 0x4100_D460 => 2,
        0x4100_D040 | 0x5100_8050 | 0x5100_8030 | 0x5100_8010 | 0x5100_2110 | 0x5100_2010 => 1,
        _ => 3,
    }
}

/// The layout decisions XNNPACK makes on a core 0 with this MIDR (cpuinfo's
/// `cpuinfo_arm_decode_vendor_uarch`, `src/arm/uarch.c`, for the core types they name).
fn decisions_of(midr: u32, isa: &ArmIsa) -> u64 {
    let exynos = midr & 0xFFF0_FFF0;
    let m1_or_m2 = exynos == 0x5310_0010 || exynos == 0x5340_0010;
    let (a35_or_kryo, a53_or_a55) = match midr & 0xFF00_FFF0 {
        0x4100_D040 => (true, false),
        0x5100_2010 | 0x5100_2050 | 0x5100_2110 => (true, false),
        0x4100_D030 | 0x4100_D050 | 0x5100_8010 | 0x5100_8030 | 0x5100_8050 => (false, true),
        _ => (false, false),
    };
    let mut bits = 0;
    if m1_or_m2 {
        bits |= CORE0_F32_S4;
    }
    if (a35_or_kryo || a53_or_a55) && !isa.dot && !isa.i8mm {
        bits |= CORE0_QS8_16X1;
    }
    if a53_or_a55 {
        bits |= CORE0_DWCONV_C4;
    }
    bits
}

/// The layout decisions of cpuinfo's core 0 among `midrs` (see [`CORE0_UNSURE`]).
pub fn core0_decisions(midrs: &[u32], isa: &ArmIsa) -> u64 {
    let Some(best) = midrs.iter().map(|&m| score(m)).max() else {
        return 0;
    };
    let mut firsts = midrs
        .iter()
        .filter(|&&m| score(m) == best)
        .map(|&m| decisions_of(m, isa));
    let first = firsts.next().unwrap_or(0);
    if firsts.all(|d| d == first) {
        first
    } else {
        CORE0_UNSURE
    }
}

/// The core types a fingerprint records, in words.
pub fn model(bits: u64) -> String {
    match (bits >> MIDRS_SHIFT) as u32 {
        0 => "no core types read".to_string(),
        hash => format!("core types #{hash:08x}"),
    }
}

/// The arm64 ISA predicates of cpuinfo that XNNPACK reads (`cpuinfo_has_arm_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArmIsa {
    pub fp16_arith: bool,
    pub dot: bool,
    pub i8mm: bool,
    pub bf16: bool,
    pub sve: bool,
    pub sve2: bool,
    pub sme: bool,
    pub sme2: bool,
    pub fhm: bool,
}

/// Linux's arm64 HWCAP and HWCAP2 bits that cpuinfo reads (`src/arm/linux/api.h`).
pub mod hwcap {
    // AT_HWCAP.
    pub const FPHP: u64 = 1 << 9;
    pub const ASIMDHP: u64 = 1 << 10;
    pub const ASIMDDP: u64 = 1 << 20;
    pub const SVE: u64 = 1 << 22;
    pub const ASIMDFHM: u64 = 1 << 23;
    // AT_HWCAP2.
    pub const SVE2: u64 = 1 << 1;
    pub const SVEBF16: u64 = 1 << 12;
    pub const I8MM: u64 = 1 << 13;
    pub const BF16: u64 = 1 << 14;
    pub const SME: u64 = 1 << 23;
    pub const SME2: u64 = 1 << 37;
}

/// cpuinfo's arm64 predicates on Linux (`cpuinfo_arm64_linux_decode_isa_from_proc_cpuinfo`):
/// the kernel's HWCAPs, except that FP16 arithmetic and dot products are also taken from the
/// MIDR of the last core `/proc/cpuinfo` lists, for cores whose old kernels do not report them.
/// (cpuinfo also turns FP16 arithmetic off on the Exynos 9810 by its chipset name; the 9810's
/// Exynos M3 cores are in the MIDR hash, so its fingerprint differs anyway.)
pub fn arm_isa_of_linux(hwcap: u64, hwcap2: u64, last_midr: u32) -> ArmIsa {
    // Implementer and part number (MIDR_EL1 bits 24..32 and 4..16).
    let core = last_midr & 0xFF00_FFF0;
    let variant = (last_midr >> 20) & 0xF;
    let fp16_arith = match core {
        0x4100_D050 | 0x4100_D060 | 0x4100_D0A0 | 0x4100_D0B0 | 0x4100_D0C0 | 0x4100_D0D0
        | 0x4100_D0E0 | 0x4100_D400 | 0x4100_D490 | 0x4100_D4F0 | 0x4800_D400 | 0x5100_8020
        | 0x5100_8030 | 0x5100_8040 | 0x5100_8050 | 0x5300_0030 | 0x5300_0040 => true,
        _ => hwcap & (hwcap::FPHP | hwcap::ASIMDHP) == hwcap::FPHP | hwcap::ASIMDHP,
    };
    let dot = match core {
        0x4100_D060 | 0x4100_D0B0 | 0x4100_D0C0 | 0x4100_D0D0 | 0x4100_D0E0 | 0x4100_D400
        | 0x4100_D490 | 0x4100_D4A0 | 0x4100_D4F0 | 0x4800_D400 | 0x5100_8040 | 0x5100_8050
        | 0x5300_0030 | 0x5300_0040 => true,
        // Cortex-A55 from r1, Cortex-A75 from r2.
        0x4100_D050 => variant >= 1,
        0x4100_D0A0 => variant >= 2,
        _ => hwcap & hwcap::ASIMDDP != 0,
    };
    ArmIsa {
        fp16_arith,
        dot,
        i8mm: hwcap2 & hwcap::I8MM != 0,
        bf16: hwcap2 & (hwcap::BF16 | hwcap::SVEBF16) != 0,
        sve: hwcap & hwcap::SVE != 0,
        sve2: hwcap2 & hwcap::SVE2 != 0,
        sme: hwcap2 & hwcap::SME != 0,
        sme2: hwcap2 & hwcap::SME2 != 0,
        fhm: hwcap & hwcap::ASIMDFHM != 0,
    }
}

/// The aarch64 fingerprint of a CPU with `isa` whose cores have the MIDRs `midrs` (any order,
/// repeats allowed: one per listed core).
pub fn arm_fingerprint(isa: &ArmIsa, midrs: &[u32]) -> u64 {
    let features = [
        (FP16_ARITH, isa.fp16_arith),
        (DOT, isa.dot),
        (I8MM, isa.i8mm),
        (BF16, isa.bf16),
        (SVE, isa.sve),
        (SVE2, isa.sve2),
        (SME, isa.sme),
        (SME2, isa.sme2),
        (FHM, isa.fhm),
    ];
    let bits = features
        .iter()
        .filter(|(_, on)| *on)
        .fold(0, |bits, (mask, _)| bits | mask);
    // The set of core types, not the list: cores taken offline (common on phones) leave
    // /proc/cpuinfo but usually leave a core of their type behind, and cpuinfo infers their
    // type from it, so XNNPACK's choice does not change with them.
    let mut types = midrs.to_vec();
    types.sort_unstable();
    types.dedup();
    let hash = if types.is_empty() {
        0
    } else {
        let bytes: Vec<u8> = types.iter().flat_map(|m| m.to_le_bytes()).collect();
        crate::cache::checksum::checksum64(&bytes) & 0xFFFF_FFFF
    };
    (TAG_AARCH64 << TAG_SHIFT) | (hash << MIDRS_SHIFT) | bits | core0_decisions(midrs, isa)
}

/// The MIDR of each core `/proc/cpuinfo` lists, in its order, from the fields cpuinfo composes
/// it of (`CPU implementer`, `CPU variant`, `CPU part`, `CPU revision`). A core without an
/// implementer or a part is left out.
pub fn midrs_of_proc_cpuinfo(text: &str) -> Vec<u32> {
    #[derive(Default)]
    struct Core {
        implementer: Option<u32>,
        variant: u32,
        part: Option<u32>,
        revision: u32,
    }
    fn number(value: &str) -> Option<u32> {
        match value
            .strip_prefix("0x")
            .or_else(|| value.strip_prefix("0X"))
        {
            Some(hex) => u32::from_str_radix(hex, 16).ok(),
            None => value.parse().ok(),
        }
    }
    fn finish(core: Core, into: &mut Vec<u32>) {
        if let (Some(implementer), Some(part)) = (core.implementer, core.part) {
            into.push(
                (implementer & 0xFF) << 24
                    | (core.variant & 0xF) << 20
                    | (part & 0xFFF) << 4
                    | (core.revision & 0xF),
            );
        }
    }
    let mut midrs = Vec::new();
    let mut core = Core::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "processor" => finish(std::mem::take(&mut core), &mut midrs),
            "CPU implementer" => core.implementer = number(value),
            "CPU variant" => core.variant = number(value).unwrap_or(0),
            "CPU part" => core.part = number(value),
            "CPU revision" => core.revision = number(value).unwrap_or(0),
            _ => {}
        }
    }
    finish(core, &mut midrs);
    midrs
}
