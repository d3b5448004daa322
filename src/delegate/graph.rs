//! Reading a payload's graph: datatypes, tensor values, their constants and external flags.

use super::error::DelegateError;
use crate::cache::BlobId;
use crate::schema::xnn as fb;
use crate::tensor::{MAX_DIMS, Shape};
use crate::xnn::Datatype;

pub(super) const XNN_FLAG_EXTERNAL_INPUT: u32 = 1;

pub(super) const XNN_FLAG_EXTERNAL_OUTPUT: u32 = 2;

pub(crate) fn datatype(raw: fb::XNNDatatype, value: usize) -> Result<Datatype, DelegateError> {
    Ok(match raw {
        fb::XNNDatatype::xnn_datatype_fp32 => Datatype::Fp32,
        fb::XNNDatatype::xnn_datatype_fp16 => Datatype::Fp16,
        fb::XNNDatatype::xnn_datatype_bf16 => Datatype::Bf16,
        fb::XNNDatatype::xnn_datatype_int32 => Datatype::Int32,
        fb::XNNDatatype::xnn_datatype_qint8 => Datatype::Qint8,
        fb::XNNDatatype::xnn_datatype_quint8 => Datatype::Quint8,
        fb::XNNDatatype::xnn_datatype_qint32 => Datatype::Qint32,
        fb::XNNDatatype::xnn_datatype_qcint8 => Datatype::Qcint8,
        fb::XNNDatatype::xnn_datatype_qcint32 => Datatype::Qcint32,
        fb::XNNDatatype::xnn_datatype_qcint4 => Datatype::Qcint4,
        fb::XNNDatatype::xnn_datatype_qdint8 => Datatype::Qdint8,
        fb::XNNDatatype::xnn_datatype_qbint4 => Datatype::Qbint4,
        other => {
            return Err(DelegateError::UnsupportedDatatype {
                value,
                datatype: other.0,
            });
        }
    })
}

/// A value's tensor part, and its quantization if any.
pub(crate) type Tensor<'g> = (TensorView<'g>, Option<fb::XNNQuantizedTensorValue<'g>>);

/// A tensor value with the fields every pass asks of it read once, when the graph's values are
/// (`Values::of`): the payload's accessors find a table's vtable again for each field, through
/// a call the compiler does not inline, and a warm init asked these of each value in pass after
/// pass. The rest of the table is read through it, as it is.
#[derive(Clone, Copy)]
pub(crate) struct TensorView<'g> {
    table: fb::XNNTensorValue<'g>,
    id_out: u32,
    flags: u32,
    external_id: u32,
    constant_buffer_idx: u32,
    datatype: fb::XNNDatatype,
}

impl<'g> TensorView<'g> {
    fn of(table: fb::XNNTensorValue<'g>) -> TensorView<'g> {
        TensorView {
            table,
            id_out: table.id_out(),
            flags: table.flags(),
            external_id: table.external_id(),
            constant_buffer_idx: table.constant_buffer_idx(),
            datatype: table.datatype(),
        }
    }

    /// The payload id the value defines.
    pub(crate) fn id_out(&self) -> u32 {
        self.id_out
    }

    /// Its flags (external input, external output).
    pub(crate) fn flags(&self) -> u32 {
        self.flags
    }

    /// Its external id, for an external input or output.
    pub(crate) fn external_id(&self) -> u32 {
        self.external_id
    }

    /// Its constant's index in the graph's constant data (0: none).
    pub(crate) fn constant_buffer_idx(&self) -> u32 {
        self.constant_buffer_idx
    }

    /// Its datatype, as the payload states it.
    pub(crate) fn datatype(&self) -> fb::XNNDatatype {
        self.datatype
    }
}

impl<'g> std::ops::Deref for TensorView<'g> {
    type Target = fb::XNNTensorValue<'g>;

    fn deref(&self) -> &fb::XNNTensorValue<'g> {
        &self.table
    }
}

/// The tensor part of a value, and its quantization if any.
pub(crate) fn tensor_of(v: fb::XValue<'_>, index: usize) -> Result<Tensor<'_>, DelegateError> {
    if let Some(t) = v.xvalue_union_as_xnntensor_value() {
        return Ok((TensorView::of(t), None));
    }
    if let Some(q) = v.xvalue_union_as_xnnquantized_tensor_value() {
        let t = q.tensor_value().ok_or_else(|| {
            DelegateError::BadGraph(format!("value {index}: quantized value without a tensor"))
        })?;
        return Ok((TensorView::of(t), Some(q)));
    }
    Err(DelegateError::BadGraph(format!(
        "value {index}: unknown value kind {}",
        v.xvalue_union_type().0
    )))
}

pub(super) fn constant_index(t: &TensorView<'_>) -> usize {
    t.constant_buffer_idx() as usize
}

/// A tensor's dimensions (see [`Dims`]).
pub(super) fn dims_of(t: &TensorView<'_>) -> Dims {
    let Some(dims) = t.dims() else {
        return Dims::Inline(Shape::default());
    };
    if dims.len() > MAX_DIMS {
        return Dims::Heap(dims.iter().map(|x| x as usize).collect());
    }
    let mut inline = [0; MAX_DIMS];
    for (d, x) in inline.iter_mut().zip(dims.iter()) {
        *d = x as usize;
    }
    Dims::Inline(Shape::new(&inline[..dims.len()]).expect("at most MAX_DIMS"))
}

/// A tensor's dimensions as `usize`, read from the payload without an allocation where there
/// are as many as XNNPACK takes (a [`Shape`]): read for every value at every launch, by several
/// passes. More (a payload XNNPACK will refuse) are held on the heap, to be refused with the
/// rest.
#[derive(Clone)]
pub(super) enum Dims {
    Inline(Shape),
    Heap(Vec<usize>),
}

impl std::ops::Deref for Dims {
    type Target = [usize];

    fn deref(&self) -> &[usize] {
        match self {
            Dims::Inline(shape) => shape.dims(),
            Dims::Heap(dims) => dims,
        }
    }
}

impl std::fmt::Debug for Dims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Something per payload id, for one pass over the graph: a table indexed by id where the ids
/// are dense (exporters number values 0..n), a map where a payload spreads them (the schema
/// allows any u32, and a crafted id must not make a table of 4 G slots).
#[derive(Debug, Clone)]
pub(super) enum ById<T> {
    Table(Vec<Option<T>>),
    Map(crate::fast_hash::FastMap<u32, T>),
}

impl<T> ById<T> {
    /// An empty one laid out as `other` is: a table as long, or a map.
    pub(super) fn like<U>(other: &ById<U>) -> ById<T> {
        match other {
            ById::Table(t) => ById::Table(std::iter::repeat_with(|| None).take(t.len()).collect()),
            ById::Map(_) => ById::Map(Default::default()),
        }
    }

    /// Room for ids up to `largest`, of which about `count` are expected.
    pub(super) fn new(largest: u32, count: usize) -> ById<T> {
        let slots = largest as usize + 1;
        if slots <= count.saturating_mul(2).saturating_add(1024) {
            ById::Table(std::iter::repeat_with(|| None).take(slots).collect())
        } else {
            ById::Map(Default::default())
        }
    }

    pub(super) fn get(&self, id: u32) -> Option<&T> {
        match self {
            ById::Table(t) => t.get(id as usize)?.as_ref(),
            ById::Map(m) => m.get(&id),
        }
    }

    pub(super) fn contains(&self, id: u32) -> bool {
        self.get(id).is_some()
    }

    /// Id `id`'s entry, made with `make` if it has none.
    pub(super) fn get_or_insert_with(&mut self, id: u32, make: impl FnOnce() -> T) -> &mut T {
        if matches!(self, ById::Table(t) if id as usize >= t.len()) {
            self.make_room(id);
        }
        match self {
            ById::Table(t) => slot(t, id).get_or_insert_with(make),
            ById::Map(m) => m.entry(id).or_insert_with(make),
        }
    }

    /// Sets id `id`'s entry, returning the one it replaces.
    pub(super) fn insert(&mut self, id: u32, value: T) -> Option<T> {
        if matches!(self, ById::Table(t) if id as usize >= t.len()) {
            self.make_room(id);
        }
        match self {
            ById::Table(t) => slot(t, id).replace(value),
            ById::Map(m) => m.insert(id, value),
        }
    }

    /// Turns a table into a map before an id far past its end would grow it: whoever inserts
    /// it, an id a payload crafted must not make a table of 4 G slots.
    #[cold]
    fn make_room(&mut self, id: u32) {
        let ById::Table(t) = self else {
            return;
        };
        if (id as usize) <= t.len().saturating_mul(2).saturating_add(1024) {
            return;
        }
        let held = std::mem::take(t)
            .into_iter()
            .enumerate()
            .filter_map(|(i, v)| Some((i as u32, v?)))
            .collect();
        *self = ById::Map(held);
    }

    /// Calls `f` with every entry.
    pub(super) fn for_each_mut(&mut self, f: impl FnMut(&mut T)) {
        match self {
            ById::Table(t) => t.iter_mut().flatten().for_each(f),
            ById::Map(m) => m.values_mut().for_each(f),
        }
    }

    /// Every id that has an entry, with it: by ascending id in a table, in no order in a map.
    pub(super) fn iter(&self) -> Box<dyn Iterator<Item = (u32, &T)> + '_> {
        match self {
            ById::Table(t) => Box::new(
                t.iter()
                    .enumerate()
                    .filter_map(|(i, v)| Some((i as u32, v.as_ref()?))),
            ),
            ById::Map(m) => Box::new(m.iter().map(|(&id, v)| (id, v))),
        }
    }
}

/// Id `id`'s slot of a table, grown to hold it where the caller's `largest` was short (never
/// wrong, only slower).
fn slot<T>(table: &mut Vec<Option<T>>, id: u32) -> &mut Option<T> {
    let i = id as usize;
    if i >= table.len() {
        table.resize_with(i + 1, || None);
    }
    &mut table[i]
}

/// A graph with its values read once, for the passes that look them up by payload id (the node
/// checks, the folds, packing ahead): each value and its tensor by its
/// index in the payload, and the index of each id.
pub(super) struct Values<'g> {
    graph: fb::XNNGraph<'g>,
    /// By index: the value.
    raw: Vec<fb::XValue<'g>>,
    /// By index: the value's tensor and its quantization, read once for every pass; None for
    /// a value of a kind this delegate does not know.
    tensors: Vec<Option<Tensor<'g>>>,
    /// By payload id: the index of the last value that claims it.
    index: ById<usize>,
    /// Ids two values or more claim (no exporter writes such a graph).
    claimed_twice: crate::fast_hash::FastSet<u32>,
    /// The largest id a value claims (0 without any).
    largest: u32,
    /// By constant_data index: the named key, if any, and the content identity it states, read
    /// once for every pass (each asks of the constants it meets).
    keys: Vec<(Option<&'g str>, Option<BlobId>)>,
}

impl<'g> Values<'g> {
    pub(super) fn of(graph: &fb::XNNGraph<'g>) -> Values<'g> {
        let raw: Vec<fb::XValue<'g>> = graph.xvalues().iter().flatten().collect();
        let tensors: Vec<Option<Tensor<'g>>> = raw
            .iter()
            .enumerate()
            .map(|(i, &v)| tensor_of(v, i).ok())
            .collect();
        let largest = tensors
            .iter()
            .flatten()
            .map(|(t, _)| t.id_out())
            .max()
            .unwrap_or(0);
        let mut index = ById::new(largest, tensors.len());
        let mut claimed_twice = crate::fast_hash::FastSet::default();
        for (i, t) in tensors.iter().enumerate() {
            if let Some((t, _)) = t
                && index.insert(t.id_out(), i).is_some()
            {
                claimed_twice.insert(t.id_out());
            }
        }
        let keys = graph
            .constant_data()
            .iter()
            .flatten()
            .map(|c| {
                let key = c.named_key();
                (key, key.and_then(BlobId::from_named_key))
            })
            .collect();
        Values {
            graph: *graph,
            raw,
            tensors,
            index,
            claimed_twice,
            largest,
            keys,
        }
    }

    /// The graph.
    pub(super) fn graph(&self) -> fb::XNNGraph<'g> {
        self.graph
    }

    /// The largest id a value claims.
    pub(super) fn largest(&self) -> u32 {
        self.largest
    }

    /// Each value of a known kind, with its index.
    pub(super) fn tensors(&self) -> impl Iterator<Item = (usize, TensorView<'g>)> + '_ {
        self.tensors
            .iter()
            .enumerate()
            .filter_map(|(i, t)| Some((i, t.as_ref()?.0)))
    }

    /// How many entries the graph's constant data has (entry 0 stands for no constant).
    pub(super) fn constant_count(&self) -> usize {
        self.keys.len()
    }

    /// The named key of constant `index`, if it has one.
    pub(super) fn named_key(&self, index: usize) -> Option<&'g str> {
        self.keys.get(index)?.0
    }

    /// The content identity the named key of constant `index` states (as
    /// [`BlobId::from_named_key`] reads it), if it states one.
    pub(super) fn stated_id(&self, index: usize) -> Option<BlobId> {
        self.keys.get(index)?.1
    }

    /// How many values the graph has.
    pub(super) fn len(&self) -> usize {
        self.raw.len()
    }

    /// The tensor and quantization of the value at index `i`, as [`tensor_of`] reads them (its
    /// error for a value of a kind this delegate does not know).
    pub(super) fn tensor_at(&self, i: usize) -> Result<Tensor<'g>, DelegateError> {
        match self.tensors[i] {
            Some(t) => Ok(t),
            None => tensor_of(self.raw[i], i),
        }
    }

    /// Every value's tensor and quantization with its index, in payload order, as
    /// [`tensor_at`](Self::tensor_at) reads them.
    pub(super) fn each(
        &self,
    ) -> impl Iterator<Item = Result<(usize, Tensor<'g>), DelegateError>> + '_ {
        (0..self.len()).map(|i| Ok((i, self.tensor_at(i)?)))
    }

    /// The index of the value that id `id` names (the last, where two claim it).
    pub(super) fn index_of(&self, id: u32) -> Option<usize> {
        self.index.get(id).copied()
    }

    /// Id `id`'s value's tensor, with the value's index.
    pub(super) fn tensor(&self, id: u32) -> Option<(usize, TensorView<'g>)> {
        let i = self.index_of(id)?;
        Some((i, self.tensors[i]?.0))
    }

    /// Whether id `id`'s value is unquantized, and the only one that claims the id.
    pub(super) fn plain_and_alone(&self, id: u32) -> bool {
        self.index_of(id)
            .and_then(|i| self.tensors[i])
            .is_some_and(|(_, quantized)| quantized.is_none())
            && !self.claimed_twice.contains(&id)
    }
}
