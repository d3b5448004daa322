//! Whether a delegate's runtime runs on the backend's thread pool or on the calling thread.
//!
//! XNNPACK splits each operator across the pool's threads, and every operator a pool runs costs
//! a wake of its workers. This XNNPACK splits even an operator of a few thousand multiply-adds
//! into 2-8 parts, so on a graph of such operators (a small decoder's token: 40 operators of at
//! most 4 Ki weights) the wakes take longer than the work: 0.31 ms a token on ExecuTorch's
//! pool against 0.09 ms on the calling thread, where ExecuTorch's backend, whose newer XNNPACK
//! gives such operators one part and so runs them on the calling thread, takes 0.13-0.20 ms.
//! A delegate whose every operator is that small runs on the calling thread; one operator
//! larger keeps the pool for the whole delegate.

use super::graph::{Values, constant_index};
use super::operators::GraphIo;

/// The most work (multiply-adds, or elements for an operator without weights) an operator of a
/// delegate that runs on the calling thread may have: about 10 us of one core.
pub(super) const ALONE_UP_TO: usize = 256 << 10;

/// Whether every operator of the graph of `values` is small enough ([`ALONE_UP_TO`]) that the delegate runs
/// faster on the calling thread than split across a pool. An operator whose operands cannot be
/// sized (a dynamic dimension, an unknown node or value) counts as large.
pub(super) fn runs_alone(values: &Values<'_>, io: &GraphIo) -> bool {
    if !values.all_known() {
        return false;
    }
    // Elements of a value, the last of its dimensions, and whether it is a constant. Read in
    // place: a Vec per value was most of this pass.
    let size = |id: u32| -> Option<(usize, usize, bool)> {
        let (_, t) = values.tensor(id)?;
        let dims = t.dims();
        let dims = dims.iter().flat_map(|d| d.iter().map(|x| x as usize));
        let elements = dims.clone().try_fold(1usize, |n, d| n.checked_mul(d))?;
        let last = dims.last().unwrap_or(1).max(1);
        Some((elements, last, constant_index(&t) != 0))
    };
    (0..values.graph().xnodes().map_or(0, |n| n.len())).all(|n| {
        let Some((reads, writes)) = io.node(n) else {
            return false;
        };
        // Each output element of an operator with weights takes weights / output channels
        // multiply-adds (a fully connected row's inputs, a convolution's window); any other
        // operator is as much work as its largest operand.
        let (mut weights, mut largest_read) = (None, 0);
        for &id in reads {
            let Some((elements, _, constant)) = size(id) else {
                return false;
            };
            if constant {
                weights = weights.max(Some(elements));
            }
            largest_read = largest_read.max(elements);
        }
        largest_read <= ALONE_UP_TO
            && writes.iter().all(|&id| {
                size(id).is_some_and(|(elements, channels, _)| {
                    let work = match weights {
                        Some(w) => elements.saturating_mul(w / channels),
                        None => elements,
                    };
                    work <= ALONE_UP_TO
                })
            })
    })
}
