//! x86-64: one bit per cpuinfo predicate that `hardware-config.c` reads, named after the
//! XNNPACK flags it feeds; then the CPU's vendor and signature, which cpuinfo decodes the
//! microarchitecture (`cpuinfo_get_core(0)->uarch`) from.

use super::{Names, TAG_SHIFT, TAG_X86_64};

/// SSSE3, `CPUID.1:ECX[9]`: `use_x86_ssse3`.
pub const SSSE3: u64 = 1 << 0;
/// SSE4.1, `CPUID.1:ECX[19]`: `use_x86_sse4_1`.
pub const SSE4_1: u64 = 1 << 1;
/// AVX, `CPUID.1:ECX[28]`, with YMM state enabled in XCR0: `use_x86_avx`.
pub const AVX: u64 = 1 << 2;
/// F16C, `CPUID.1:ECX[29]`, with YMM state: `use_x86_f16c`.
pub const F16C: u64 = 1 << 3;
/// FMA3, `CPUID.1:ECX[12]`, with YMM state: `use_x86_fma3` (and, with the model, Zen's 16s4
/// f32 GEMM).
pub const FMA3: u64 = 1 << 4;
/// AVX2, `CPUID.(7,0):EBX[5]`, with YMM state: `use_x86_avx2`.
pub const AVX2: u64 = 1 << 5;
/// AVX-512F, `CPUID.(7,0):EBX[16]`, with opmask and ZMM state enabled in XCR0:
/// `use_x86_avx512f`.
pub const AVX512F: u64 = 1 << 6;
/// AVX-512BW, `CPUID.(7,0):EBX[30]`, with ZMM state: part of `use_x86_avx512skx`.
pub const AVX512BW: u64 = 1 << 7;
/// AVX-512DQ, `CPUID.(7,0):EBX[17]`, with ZMM state: part of `use_x86_avx512skx`.
pub const AVX512DQ: u64 = 1 << 8;
/// AVX-512VL, `CPUID.(7,0):EBX[31]`, with ZMM state: part of `use_x86_avx512skx`.
pub const AVX512VL: u64 = 1 << 9;
/// AVX-512VBMI, `CPUID.(7,0):ECX[1]`, with ZMM state: `use_x86_avx512vbmi`.
pub const AVX512VBMI: u64 = 1 << 10;
/// AVX-512VNNI, `CPUID.(7,0):ECX[11]`, with ZMM state: `use_x86_avx512vnni`.
pub const AVX512VNNI: u64 = 1 << 11;
/// GFNI, `CPUID.(7,0):ECX[8]` (cpuinfo asks no OS state of it): `use_x86_avx512vnnigfni`,
/// `use_x86_avx256vnnigfni`.
pub const GFNI: u64 = 1 << 12;
/// AVX-512FP16, `CPUID.(7,0):EDX[23]`, with ZMM state: `use_x86_avx512fp16`.
pub const AVX512FP16: u64 = 1 << 13;
/// AMX-INT8, `CPUID.(7,0):EDX[25]`, with ZMM state (cpuinfo's test): `use_x86_avx512amx`,
/// `use_x86_amx_int8` (xnnblob's AMX kernel, patch 0035), and XNNPACK's stand-in for AVX10 in
/// `use_x86_avx256skx` and `use_x86_avx256vnni`.
pub const AMX_INT8: u64 = 1 << 14;
/// AMX-TILE, `CPUID.(7,0):EDX[24]`, with ZMM state. Not read by XNNPACK 4ea82e5; xnnblob's
/// patch 0035 reads it beside AMX-INT8 to choose its AMX kernel, which packs as the AVX512-VNNI
/// kernels do, so it stays out of a packing class.
pub const AMX_TILE: u64 = 1 << 15;
/// AMX-BF16, `CPUID.(7,0):EDX[22]`, with ZMM state. Not read by XNNPACK 4ea82e5.
pub const AMX_BF16: u64 = 1 << 16;
/// AMX-FP16, `CPUID.(7,1):EAX[21]`, with ZMM state. Not read by XNNPACK 4ea82e5.
pub const AMX_FP16: u64 = 1 << 17;
/// `XCR0[17]`: the OS saves the AMX tile configuration (XTILECFG).
pub const XTILECFG: u64 = 1 << 18;
/// `XCR0[18]`: the OS saves the AMX tile data (XTILEDATA), which Linux hands out on request.
pub const XTILEDATA: u64 = 1 << 19;
/// Linux granted this process AMX tile data: `arch_prctl(ARCH_REQ_XCOMP_PERM,
/// XFEATURE_XTILEDATA)` returned 0. XNNPACK makes that request when AVX512-SKX, -VNNI, GFNI
/// and AMX-INT8 are all present (where the compiler builds its AMX kernels; patch 0035 asks
/// under the same condition with AMX-TILE besides, for xnnblob's), and clears its AMX flags when
/// it is refused; so it is asked under the same condition, and set only then. Outside Linux XNNPACK asks nothing and
/// the bit is set with the CPU's.
pub const AMX_GRANTED: u64 = 1 << 20;
/// AVX-VNNI, `CPUID.(7,1):EAX[4]`, with YMM state: `use_x86_avxvnni`, `use_x86_avx256vnni`.
pub const AVXVNNI: u64 = 1 << 21;
/// AVX-VNNI-INT8, `CPUID.(7,1):EDX[4]`, with YMM state: `use_x86_avxvnniint8`.
pub const AVXVNNIINT8: u64 = 1 << 22;

/// Bits 24..27: the vendor, as cpuinfo distinguishes the ones its microarchitectures belong
/// to (0: another vendor).
pub const VENDOR_SHIFT: u32 = 24;
pub const INTEL: u64 = 1;
pub const AMD: u64 = 2;
pub const HYGON: u64 = 3;
/// Bits 27..51: `CPUID.1:EAX[27:4]`, the signature without its stepping (model, family,
/// extended model and family, processor type), everything cpuinfo decodes a
/// microarchitecture from.
pub const SIGNATURE_SHIFT: u32 = 27;
pub const SIGNATURE_BITS: u32 = 24;

/// Every feature bit with its name, in bit order.
pub const NAMES: &Names = &[
    (SSSE3, "ssse3"),
    (SSE4_1, "sse4.1"),
    (AVX, "avx"),
    (F16C, "f16c"),
    (FMA3, "fma3"),
    (AVX2, "avx2"),
    (AVX512F, "avx512f"),
    (AVX512BW, "avx512bw"),
    (AVX512DQ, "avx512dq"),
    (AVX512VL, "avx512vl"),
    (AVX512VBMI, "avx512vbmi"),
    (AVX512VNNI, "avx512vnni"),
    (GFNI, "gfni"),
    (AVX512FP16, "avx512fp16"),
    (AMX_INT8, "amx-int8"),
    (AMX_TILE, "amx-tile"),
    (AMX_BF16, "amx-bf16"),
    (AMX_FP16, "amx-fp16"),
    (XTILECFG, "xcr0.xtilecfg"),
    (XTILEDATA, "xcr0.xtiledata"),
    (AMX_GRANTED, "amx-granted"),
    (AVXVNNI, "avx-vnni"),
    (AVXVNNIINT8, "avx-vnni-int8"),
];

/// The CPU model a fingerprint records, in words, with the microarchitecture XNNPACK treats
/// apart when it is one.
pub fn model(bits: u64) -> String {
    let vendor = match (bits >> VENDOR_SHIFT) & 0b111 {
        INTEL => "Intel",
        AMD => "AMD",
        HYGON => "Hygon",
        _ => "another vendor's",
    };
    let signature = ((bits >> SIGNATURE_SHIFT) & ((1 << SIGNATURE_BITS) - 1)) as u32;
    let (family, model) = family_and_model(signature << 4);
    let uarch = match uarch_xnnpack_reads((bits >> VENDOR_SHIFT) & 0b111, family, model) {
        Some(name) => format!(" ({name})"),
        None => String::new(),
    };
    format!("{vendor} family {family:#x} model {model:#x}{uarch}")
}

/// Zen-like f32 GEMM packing (`16s4`), in a packing class (where the vendor's bits are in a
/// fingerprint).
const ZEN_F32_GEMM: u64 = 1 << 24;

/// The bits no packing decision of the patched XNNPACK reads (AMX-TILE, which only picks a
/// kernel of the same packing, -BF16, -FP16 and the tile state in XCR0: AMX_GRANTED says what
/// XNNPACK's choice reads of them): left out of a packing class.
pub const UNREAD: u64 = AMX_TILE | AMX_BF16 | AMX_FP16 | XTILECFG | XTILEDATA;

/// The decisions XNNPACK makes from the CPU model that a packing class keeps (see
/// [`packing_class`](super::packing_class)), as bits above the features.
pub fn layout_decisions(bits: u64) -> u64 {
    let vendor = (bits >> VENDOR_SHIFT) & 0b111;
    let signature = ((bits >> SIGNATURE_SHIFT) & ((1 << SIGNATURE_BITS) - 1)) as u32;
    let (family, model) = family_and_model(signature << 4);
    match (vendor, family, model >> 4) {
        (AMD, 0x17, 0x0 | 0x1) | (HYGON, 0x00, _) => ZEN_F32_GEMM,
        _ => 0,
    }
}

/// Family and model as cpuinfo computes them from CPUID.1:EAX (`cpuinfo_x86_decode_model_info`:
/// the extended fields are added for every family).
pub fn family_and_model(eax: u32) -> (u32, u32) {
    let family = ((eax >> 8) & 0xF) + ((eax >> 20) & 0xFF);
    let model = ((eax >> 4) & 0xF) + (((eax >> 16) & 0xF) << 4);
    (family, model)
}

/// The microarchitectures XNNPACK 4ea82e5 asks cpuinfo about, as cpuinfo 877328f decodes
/// them (`src/x86/uarch.c`), for messages only: the fingerprint keeps the whole signature.
fn uarch_xnnpack_reads(vendor: u64, family: u32, model: u32) -> Option<&'static str> {
    let extended_model = model >> 4;
    match (vendor, family, extended_model) {
        (AMD, 0x17, 0x0 | 0x1) => Some("Zen: XNNPACK's f32 GEMM packs 16s4"),
        // cpuinfo 877328f matches Hygon's family 0, which Dhyana (family 0x18) never reports:
        // mirrored as written.
        (HYGON, 0x00, _) => Some("Dhyana: XNNPACK's f32 GEMM packs 16s4"),
        _ => None,
    }
}

/// What cpuinfo reads of an x86-64 CPU: the CPUID leaves and XCR0 behind its ISA predicates and
/// its microarchitecture. Leaves the CPU does not have, and XCR0 where the OS has not enabled
/// XSAVE, are zero (as cpuinfo takes them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct X86Cpuid {
    /// CPUID.0:EBX, EDX, ECX: the vendor string.
    pub vendor: [u8; 12],
    /// CPUID.1:EAX: the signature (stepping, model, family).
    pub leaf1_eax: u32,
    /// CPUID.1:ECX.
    pub leaf1_ecx: u32,
    /// CPUID.(7,0): EBX, ECX, EDX.
    pub leaf7: [u32; 3],
    /// CPUID.(7,1): EAX, EDX.
    pub leaf7_1: [u32; 2],
    /// CPUID.(0xD,0): EDX:EAX, the XCR0 bits the CPU supports.
    pub xcr0_supported: u64,
    /// XCR0 as XGETBV reads it: the register state the OS saves.
    pub xcr0: u64,
}

/// The x86-64 fingerprint of `cpu`. `amx_granted` asks the OS for AMX tile data, as XNNPACK
/// does; it is called only where XNNPACK would call it.
pub fn x86_fingerprint(cpu: &X86Cpuid, amx_granted: impl FnOnce() -> bool) -> u64 {
    let has = |word: u32, bit: u32| (word >> bit) & 1 == 1;
    // cpuinfo's `avx_regs` and `avx512_regs` (src/x86/isa.c): the CPU has XSAVE and the OS
    // enabled it (CPUID.1:ECX[26,27]), and XCR0 enables the state the CPU supports: YMM
    // (bits 1, 2), and for AVX-512 also opmask and both halves of ZMM (bits 5, 6, 7).
    let xsave = cpu.leaf1_ecx & 0x0C00_0000 == 0x0C00_0000;
    let saves = |mask: u64| xsave && cpu.xcr0_supported & mask == mask && cpu.xcr0 & mask == mask;
    let ymm = saves(0x06);
    let zmm = saves(0xE6);
    let [ebx7, ecx7, edx7] = cpu.leaf7;
    let [eax7_1, edx7_1] = cpu.leaf7_1;
    let ecx1 = cpu.leaf1_ecx;
    let features = [
        (SSSE3, has(ecx1, 9)),
        (SSE4_1, has(ecx1, 19)),
        (AVX, ymm && has(ecx1, 28)),
        (F16C, ymm && has(ecx1, 29)),
        (FMA3, ymm && has(ecx1, 12)),
        (AVX2, ymm && has(ebx7, 5)),
        (AVX512F, zmm && has(ebx7, 16)),
        (AVX512BW, zmm && has(ebx7, 30)),
        (AVX512DQ, zmm && has(ebx7, 17)),
        (AVX512VL, zmm && has(ebx7, 31)),
        (AVX512VBMI, zmm && has(ecx7, 1)),
        (AVX512VNNI, zmm && has(ecx7, 11)),
        (GFNI, has(ecx7, 8)),
        (AVX512FP16, zmm && has(edx7, 23)),
        (AMX_INT8, zmm && has(edx7, 25)),
        (AMX_TILE, zmm && has(edx7, 24)),
        (AMX_BF16, zmm && has(edx7, 22)),
        (AMX_FP16, zmm && has(eax7_1, 21)),
        (XTILECFG, xsave && (cpu.xcr0 >> 17) & 1 == 1),
        (XTILEDATA, xsave && (cpu.xcr0 >> 18) & 1 == 1),
        (AVXVNNI, ymm && has(eax7_1, 4)),
        (AVXVNNIINT8, ymm && has(edx7_1, 4)),
    ];
    let mut bits = features
        .iter()
        .filter(|(_, on)| *on)
        .fold(0, |bits, (mask, _)| bits | mask);
    // hardware-config.c: use_x86_avx512amx = avx512vnnigfni && amx_int8, then the request.
    let xnnpack_asks = AVX512F | AVX512BW | AVX512DQ | AVX512VL | AVX512VNNI | GFNI | AMX_INT8;
    if bits & xnnpack_asks == xnnpack_asks && amx_granted() {
        bits |= AMX_GRANTED;
    }
    let vendor = match &cpu.vendor {
        b"GenuineIntel" => INTEL,
        b"AuthenticAMD" => AMD,
        b"HygonGenuine" => HYGON,
        _ => 0,
    };
    let signature = u64::from(cpu.leaf1_eax >> 4) & ((1 << SIGNATURE_BITS) - 1);
    (TAG_X86_64 << TAG_SHIFT) | (signature << SIGNATURE_SHIFT) | (vendor << VENDOR_SHIFT) | bits
}
