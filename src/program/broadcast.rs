//! The one data movement the executor does outside XNNPACK: a tensor copied into another of a
//! shape it broadcasts to. It is ExecuTorch's `aten::copy_` (a mutable buffer's write-back) and
//! `aten::expand_copy.out` (which the XNNPACK partitioner leaves before a batched matrix
//! product), on bytes of any element type.

use crate::tensor::{MAX_DIMS, Shape};

/// How `from` does not broadcast to `to`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("shape {from} does not broadcast to {to}")]
pub struct NotBroadcastable {
    /// The source's shape.
    pub from: Shape,
    /// The shape asked for.
    pub to: Shape,
}

/// Whether `from` broadcasts to `to`: aligned at the last dimension, every dimension of `from`
/// is the one of `to` or 1, and `from` has no more dimensions.
pub fn check(from: &Shape, to: &Shape) -> Result<(), NotBroadcastable> {
    let (f, t) = (from.dims(), to.dims());
    let fits = f.len() <= t.len()
        && f.iter()
            .rev()
            .zip(t.iter().rev())
            .all(|(&a, &b)| a == b || a == 1);
    if fits {
        Ok(())
    } else {
        Err(NotBroadcastable {
            from: *from,
            to: *to,
        })
    }
}

/// The shape `aten::expand_copy` makes of `from` with `sizes`: -1 keeps the dimension of `from`
/// it lines up with (counted from the last), and dimensions `from` lacks are added in front.
pub fn expanded(from: &Shape, sizes: &[i64]) -> Option<Shape> {
    let f = from.dims();
    let lead = sizes.len().checked_sub(f.len())?;
    // On the stack: an execute allocates nothing.
    let mut dims = [0usize; MAX_DIMS];
    for (i, &s) in sizes.iter().enumerate() {
        *dims.get_mut(i)? = match (s, i.checked_sub(lead)) {
            (-1, Some(j)) => f[j],
            (s, _) => usize::try_from(s).ok()?,
        };
    }
    Shape::new(&dims[..sizes.len()]).ok()
}

/// Writes `src` (of shape `from`) broadcast to shape `to` into `dst`, elements of `elem`
/// bytes. The caller has checked that `from` broadcasts to `to` and that both slices hold
/// their shapes' bytes; the slices do not overlap.
pub fn copy(src: &[u8], from: &Shape, dst: &mut [u8], to: &Shape, elem: usize) {
    let t = to.dims();
    // `from`'s dimensions lined up with `to`'s, 1 where it has none (on the stack, as are the
    // index and strides: an execute allocates nothing).
    let mut f = [1usize; MAX_DIMS];
    f[t.len() - from.rank()..t.len()].copy_from_slice(from.dims());
    // The innermost dimensions that are not broadcast are copied as one run.
    let mut split = t.len();
    while split > 0 && f[split - 1] == t[split - 1] {
        split -= 1;
    }
    let run = t[split..].iter().product::<usize>() * elem;
    let outer: usize = t[..split].iter().product();
    if run == 0 || outer == 0 {
        return;
    }
    // Walks the outer index of `to`, keeping the matching offset into `src` (a broadcast
    // dimension does not move it).
    let mut index = [0usize; MAX_DIMS];
    let mut strides = [0usize; MAX_DIMS];
    let mut stride = run;
    for d in (0..split).rev() {
        strides[d] = if f[d] == 1 { 0 } else { stride };
        stride *= f[d];
    }
    let mut at = 0usize;
    for chunk in dst[..outer * run].chunks_exact_mut(run) {
        chunk.copy_from_slice(&src[at..at + run]);
        for d in (0..split).rev() {
            index[d] += 1;
            at += strides[d];
            if index[d] < t[d] {
                break;
            }
            at -= strides[d] * t[d];
            index[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(dims: &[usize]) -> Shape {
        Shape::new(dims).unwrap()
    }

    /// The broadcast of `src` to `to`, element by element, the slow way.
    fn by_index(src: &[u32], from: &[usize], to: &[usize]) -> Vec<u32> {
        let n: usize = to.iter().product();
        let lead = to.len() - from.len();
        (0..n)
            .map(|flat| {
                let mut rest = flat;
                let mut idx = vec![0; to.len()];
                for d in (0..to.len()).rev() {
                    idx[d] = rest % to[d];
                    rest /= to[d];
                }
                let mut at = 0;
                for (j, &fd) in from.iter().enumerate() {
                    at = at * fd + if fd == 1 { 0 } else { idx[lead + j] };
                }
                src[at]
            })
            .collect()
    }

    #[test]
    fn copies_every_broadcast_like_the_element_by_element_definition() {
        let cases: &[(&[usize], &[usize])] = &[
            (&[1, 2, 16, 6], &[1, 2, 16, 6]),
            (&[3], &[2, 3]),
            (&[2, 1], &[2, 4]),
            (&[1, 3, 1], &[2, 3, 5]),
            (&[1], &[4, 1, 3]),
            (&[], &[2, 2]),
            (&[2, 1, 3], &[2, 0, 3]),
        ];
        for &(from, to) in cases {
            let n: usize = from.iter().product();
            let src: Vec<u32> = (0..n as u32).map(|i| i * 7 + 1).collect();
            let src_bytes: Vec<u8> = src.iter().flat_map(|v| v.to_le_bytes()).collect();
            check(&shape(from), &shape(to)).unwrap();
            let m: usize = to.iter().product();
            let mut dst = vec![0u8; m * 4];
            copy(&src_bytes, &shape(from), &mut dst, &shape(to), 4);
            let got: Vec<u32> = dst
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(got, by_index(&src, from, to), "{from:?} -> {to:?}");
        }
    }

    #[test]
    fn refuses_shapes_that_do_not_broadcast() {
        assert!(check(&shape(&[2, 3]), &shape(&[3, 3])).is_err());
        assert!(check(&shape(&[2, 3]), &shape(&[3])).is_err());
        assert!(check(&shape(&[4]), &shape(&[2, 2])).is_err());
    }

    #[test]
    fn expands_sizes_with_kept_and_added_dimensions() {
        assert_eq!(
            expanded(&shape(&[2, 1]), &[3, -1, 4]),
            Some(shape(&[3, 2, 4]))
        );
        assert_eq!(expanded(&shape(&[2, 1]), &[-1]), None);
        assert_eq!(expanded(&shape(&[2]), &[-1, 2]), None);
        assert_eq!(expanded(&shape(&[2]), &[-2]), None);
    }
}
