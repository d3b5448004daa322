//! IEEE half precision for tests that feed fp16 graphs.

/// The fp16 bits of `v`, rounded to nearest (ties to even), for values in fp16's normal range
/// or zero (what the tests' inputs and weights are); exact for values fp16 holds.
pub fn to_f16(v: f32) -> u16 {
    let b = v.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let magnitude = b & 0x7fff_ffff;
    if magnitude == 0 {
        return sign;
    }
    let exponent = (magnitude >> 23) as i32 - 127 + 15;
    assert!(
        (1..31).contains(&exponent),
        "{v} is outside fp16's normal range"
    );
    let mantissa = magnitude & 0x7f_ffff;
    let (kept, dropped) = (mantissa >> 13, mantissa & 0x1fff);
    let rounded = ((exponent as u32) << 10 | kept)
        + u32::from(dropped > 0x1000 || (dropped == 0x1000 && kept & 1 == 1));
    // A carry out of the largest exponent would be infinity: the assert above keeps below it
    // but for 65520 and up, which the tests never use.
    sign | rounded as u16
}

#[cfg(test)]
mod tests {
    use super::to_f16;

    #[test]
    fn halves_round_to_nearest_even_and_hold_exact_values() {
        assert_eq!(to_f16(1.0), 0x3c00);
        assert_eq!(to_f16(-2.0), 0xc000);
        assert_eq!(to_f16(0.0), 0);
        assert_eq!(to_f16(0.1), 0x2e66); // 0.0999755859375, the nearest half
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties go to the even 1.
        assert_eq!(to_f16(1.0 + f32::powi(2.0, -11)), 0x3c00);
        assert_eq!(to_f16(1.0 + 3.0 * f32::powi(2.0, -11)), 0x3c02);
        for bits in [0x3c00u16, 0x3555, 0xbbff, 0x0400, 0x7bff] {
            assert_eq!(to_f16(xnnblob::tensor::f16_to_f32(bits)), bits);
        }
    }
}
