//! A fingerprint of the CPU features that decide which XNNPACK microkernels run, and so how
//! weights are packed: a cache file packed on one CPU is not trusted on another.

/// Feature bits of this CPU, tagged with the architecture in the top byte.
pub fn cpu_fingerprint() -> u64 {
    arch_fingerprint()
}

#[cfg(target_arch = "x86_64")]
fn arch_fingerprint() -> u64 {
    macro_rules! bits {
        ($($feature:tt),* $(,)?) => {{
            let mut bits = 0u64;
            let mut i = 0;
            $(
                if std::arch::is_x86_feature_detected!($feature) {
                    bits |= 1 << i;
                }
                i += 1;
            )*
            let _ = i;
            bits
        }};
    }
    let features = bits!(
        "sse2",
        "sse3",
        "ssse3",
        "sse4.1",
        "sse4.2",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512dq",
        "avx512vl",
        "avx512cd",
        "avx512vnni",
        "avx512bf16",
        "avx512fp16",
        "avx512vbmi",
        "avxvnni",
        "popcnt",
        "bmi2",
    );
    (1u64 << 56) | features
}

#[cfg(target_arch = "aarch64")]
fn arch_fingerprint() -> u64 {
    macro_rules! bits {
        ($($feature:tt),* $(,)?) => {{
            let mut bits = 0u64;
            let mut i = 0;
            $(
                if std::arch::is_aarch64_feature_detected!($feature) {
                    bits |= 1 << i;
                }
                i += 1;
            )*
            let _ = i;
            bits
        }};
    }
    let features = bits!("neon", "dotprod", "fp16", "i8mm", "bf16", "sve", "sve2", "fhm");
    (2u64 << 56) | features
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn arch_fingerprint() -> u64 {
    0xFF << 56
}

#[cfg(test)]
mod tests {
    #[test]
    fn fingerprint_is_stable_and_tagged() {
        let f = super::cpu_fingerprint();
        assert_eq!(f, super::cpu_fingerprint());
        assert_ne!(f >> 56, 0, "architecture tag");
    }
}
