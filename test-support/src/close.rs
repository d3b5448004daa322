//! One way to say "these outputs match": same length, no NaN, every difference within a
//! tolerance. `f32::max` drops a NaN, so a fold with it scores an unwritten, NaN-seeded output
//! as a perfect match; here a NaN, or a length that differs, is an infinite difference.

/// What a difference is measured against.
#[derive(Debug, Clone, Copy)]
pub enum Tolerance {
    /// The largest |got - expected|.
    Absolute(f32),
    /// The largest |got - expected| over the range (max - min) of `expected`.
    OfRange(f32),
}

/// The largest |got - expected|; infinite if the lengths differ or any value is NaN.
pub fn max_abs_difference(got: &[f32], expected: &[f32]) -> f32 {
    if got.len() != expected.len() {
        return f32::INFINITY;
    }
    got.iter()
        .zip(expected)
        .map(|(a, b)| (a - b).abs())
        .map(|d| if d.is_nan() { f32::INFINITY } else { d })
        .fold(0.0, f32::max)
}

/// The range (max - min) of `values`, at least the smallest normal f32.
pub fn range_of(values: &[f32]) -> f32 {
    let (lo, hi) = values
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), &v| {
            (l.min(v), h.max(v))
        });
    (hi - lo).max(f32::MIN_POSITIVE)
}

/// [`max_abs_difference`] over the range of `expected`.
pub fn relative_difference(got: &[f32], expected: &[f32]) -> f32 {
    max_abs_difference(got, expected) / range_of(expected)
}

/// Panics, naming `what`, unless `got` has `expected`'s length, no NaN, and every difference
/// within `tolerance`. An empty `expected` is refused too: nothing would be checked.
pub fn assert_close(got: &[f32], expected: &[f32], tolerance: Tolerance, what: &str) {
    assert!(!expected.is_empty(), "{what}: nothing to compare");
    assert_eq!(got.len(), expected.len(), "{what}: output lengths");
    let (difference, limit) = match tolerance {
        Tolerance::Absolute(limit) => (max_abs_difference(got, expected), limit),
        Tolerance::OfRange(limit) => (relative_difference(got, expected), limit),
    };
    assert!(
        difference <= limit,
        "{what}: difference {difference} over {tolerance:?}"
    );
}
