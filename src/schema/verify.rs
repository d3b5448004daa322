//! A flatbuffer verifier built from a description of the schema ([`Shape`]s), for the buffer
//! read on every delegate init: the XNNPACK payload's graph ([`super::xnn_shape`]). Each
//! shape's checks are its fields written out in order ([`TableShape`]), so that every field's
//! slot, size and kind is a constant where it is checked.
//!
//! It checks what the `flatbuffers` crate's generated verifier checks, and accepts exactly what
//! that accepts (the `graph_verifier` fuzz target holds the two to it): every offset and
//! vtable in range and aligned, vectors and strings in range, strings UTF-8 and terminated,
//! a union's type and value present together, known variants checked and unknown ones left
//! (readers get `None` for them), deprecated fields unread, and the same limits on tables,
//! nesting and apparent size. The crate's verifier carries an error trace through the result
//! of every field, and on a small graph took about 4x the time of flatbuffers' C++ verifier
//! that ExecuTorch's backend runs; this one returns a two-word error and names the field
//! only when it fails.

// The only shapes are the XNNPACK payload's: without XNNPACK, no check is ever written out.
#![cfg_attr(not(feature = "xnnpack"), allow(dead_code))]

use std::fmt;

/// What one field of a table holds, as far as verifying it goes.
#[derive(Debug, Clone, Copy)]
pub enum Field {
    /// A scalar or an enum of this many bytes (1, 2, 4 or 8), aligned to its size.
    Scalar(u8),
    /// An offset to a vector of scalars of this many bytes each.
    Scalars(u8),
    /// An offset to a UTF-8 string.
    String,
    /// An offset to a table.
    Table(&'static Shape),
    /// An offset to a vector of offsets to tables.
    Tables(&'static Shape),
    /// A union's type byte: checked with the union's value, in the next slot.
    UnionType,
    /// A union's value: type `t` (from 1) is a table of `variants[t - 1]`. A type past them
    /// is not checked, as flatbuffers' verifier checks none: its readers return `None`.
    Union(&'static [&'static Shape]),
    /// A deprecated field: nothing reads it, so nothing checks it.
    Deprecated,
    /// A field that a view of its table (a shape that checks only what one reader reads, such
    /// as `xnn_shape`'s `GRAPH_NODE_TYPES`) leaves unread: nothing checks it.
    Unread,
}

/// A table of the schema: its fields in slot order (a union takes two slots, its type's and
/// its value's), and the checks of a table of its shape.
#[derive(Debug)]
pub struct Shape {
    /// The table's name in the schema.
    pub name: &'static str,
    /// Each slot's name and content.
    pub fields: &'static [(&'static str, Field)],
    /// The checks of a table of this shape: [`Check::of`] its [`TableShape`].
    pub check: Check,
}

/// A table's shape as a type whose checks are written out field by field, each field's slot,
/// size and kind a constant in them (see `xnn_shape`'s `table_shapes!`): a walk over the
/// fields as data, deciding each one's kind at run time, took three times the instructions of
/// flatbuffers' generated C++ verifier.
pub(crate) trait TableShape {
    /// Checks the table at `pos` (with [`Verifier::checked_table`]).
    fn check(v: &mut Verifier<'_, '_>, pos: usize) -> Checked;
}

/// The checks of the tables of one [`Shape`].
#[derive(Clone, Copy)]
pub struct Check(for<'b, 'o> fn(&mut Verifier<'b, 'o>, usize) -> Checked);

impl Check {
    /// The checks of tables of `T`'s shape.
    pub(crate) const fn of<T: TableShape>() -> Check {
        Check(T::check)
    }
}

impl fmt::Debug for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Check")
    }
}

/// Why a buffer was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    /// A value not aligned to its size, relative to the buffer's start.
    Unaligned,
    /// A value, vector or string running past the buffer's end.
    OutOfRange,
    /// A table's offset to its vtable leading outside the buffer.
    VtableOutOfRange,
    /// A string that is not UTF-8.
    NotUtf8,
    /// A string without its terminating zero byte.
    MissingTerminator,
    /// A union with a type and no value, or a value and no type.
    InconsistentUnion,
    /// More tables than the verifier's options allow.
    TooManyTables,
    /// Tables nested deeper than the options allow.
    TooDeep,
    /// More bytes, counted as a tree of the buffer's references, than the options allow.
    TooLarge,
}

/// A refused buffer: what was wrong, where, and in which field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyError {
    /// What was wrong.
    pub problem: Problem,
    /// The byte of the buffer where it was found.
    pub position: usize,
    /// The innermost table and field being checked (`("", "")` for the root offset).
    pub field: (&'static str, &'static str),
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.problem {
            Problem::Unaligned => "a value is not aligned to its size",
            Problem::OutOfRange => "a value runs past the buffer's end",
            Problem::VtableOutOfRange => "a table's vtable lies outside the buffer",
            Problem::NotUtf8 => "a string is not UTF-8",
            Problem::MissingTerminator => "a string has no terminating zero",
            Problem::InconsistentUnion => "a union has a type or a value but not both",
            Problem::TooManyTables => "too many tables",
            Problem::TooDeep => "tables nested too deep",
            Problem::TooLarge => "the buffer's references add up to too many bytes",
        };
        write!(f, "{what} at byte {}", self.position)?;
        match self.field {
            ("", _) => Ok(()),
            (table, field) => write!(f, " (in {table}.{field})"),
        }
    }
}

impl std::error::Error for VerifyError {}

/// A refusal inside a table, before the table names its field: one word, so that the results
/// passed back at every step of the walk stay in registers (a position past 4 GiB, which no
/// flatbuffer's offsets reach, is reported as `u32::MAX`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fail {
    problem: Problem,
    position: u32,
}

pub(crate) type Checked<T = ()> = Result<T, Fail>;

#[cold]
#[inline(never)]
fn fail<T>(problem: Problem, position: usize) -> Checked<T> {
    Err(Fail {
        problem,
        position: u32::try_from(position).unwrap_or(u32::MAX),
    })
}

/// Verifies `buf` as a flatbuffer whose root table is `root`, under flatbuffers' `opts`.
pub fn verify(
    buf: &[u8],
    root: &'static Shape,
    opts: &flatbuffers::VerifierOptions,
) -> Result<(), VerifyError> {
    let mut v = Verifier {
        buf,
        opts,
        depth: 0,
        tables: 0,
        apparent: 0,
        failed_in: ("", ""),
    };
    v.follow(0)
        .and_then(|table| (root.check.0)(&mut v, table))
        .map_err(|f| VerifyError {
            problem: f.problem,
            position: f.position as usize,
            field: v.failed_in,
        })
}

/// A walk over one buffer (see [`verify`]).
pub(crate) struct Verifier<'b, 'o> {
    buf: &'b [u8],
    opts: &'o flatbuffers::VerifierOptions,
    depth: usize,
    tables: usize,
    /// Bytes checked so far, each time they are reached (flatbuffers' "apparent size").
    apparent: usize,
    /// The innermost table and field a refusal was found in.
    failed_in: (&'static str, &'static str),
}

impl<'b> Verifier<'b, '_> {
    #[inline]
    fn aligned(&self, pos: usize, align: usize) -> Checked {
        // Sizes are powers of two (1 to 8): a mask, where `%` of a size known only at run time
        // would divide.
        debug_assert!(align.is_power_of_two());
        if pos & (align - 1) == 0 {
            Ok(())
        } else {
            fail(Problem::Unaligned, pos)
        }
    }

    #[inline]
    fn range(&mut self, pos: usize, size: usize) -> Checked {
        if pos.saturating_add(size) > self.buf.len() {
            return fail(Problem::OutOfRange, pos);
        }
        // Compared with the limit once per table (`apparent_size_within`): the count only
        // grows, so a buffer that passes at the end passed at every step.
        self.apparent = self.apparent.saturating_add(size);
        Ok(())
    }

    #[inline]
    fn apparent_size_within(&self, pos: usize) -> Checked {
        if self.apparent > self.opts.max_apparent_size {
            return fail(Problem::TooLarge, pos);
        }
        Ok(())
    }

    /// The `N` bytes at `pos`, checked aligned to `N` and in range.
    #[inline]
    fn bytes<const N: usize>(&mut self, pos: usize) -> Checked<[u8; N]> {
        self.aligned(pos, N)?;
        self.range(pos, N)?;
        let mut out = [0; N];
        out.copy_from_slice(&self.buf[pos..pos + N]);
        Ok(out)
    }

    /// Where the offset at `pos` leads.
    #[inline]
    fn follow(&mut self, pos: usize) -> Checked<usize> {
        let offset = u32::from_le_bytes(self.bytes(pos)?);
        Ok((offset as usize).saturating_add(pos))
    }

    /// The start and end of the vector at `pos`, of elements of `size` bytes aligned to it.
    #[inline]
    fn vector(&mut self, pos: usize, size: usize) -> Checked<(usize, usize)> {
        let len = u32::from_le_bytes(self.bytes(pos)?) as usize;
        let start = pos.saturating_add(4);
        self.aligned(start, size)?;
        let bytes = len.saturating_mul(size);
        self.range(start, bytes)?;
        Ok((start, start.saturating_add(bytes)))
    }

    fn string(&mut self, pos: usize) -> Checked {
        let (start, end) = self.vector(pos, 1)?;
        let text = &self.buf[start..end];
        // A payload's strings are its constants' keys, hex digits: ASCII is checked a word at a
        // time, where UTF-8's check reads a byte at a time.
        if !text.is_ascii() && std::str::from_utf8(text).is_err() {
            return fail(Problem::NotUtf8, start);
        }
        if !self.opts.ignore_missing_null_terminator && self.buf.get(end) != Some(&0) {
            return fail(Problem::MissingTerminator, end);
        }
        Ok(())
    }

    /// Checks the table at `pos` as one of `shape`, whose fields `fields` checks, each with
    /// [`next_field`](Self::next_field) in slot order.
    #[inline(always)]
    pub(crate) fn checked_table(
        &mut self,
        pos: usize,
        shape: &'static Shape,
        fields: impl FnOnce(&mut Self, &Table<'b>, &mut usize) -> Checked,
    ) -> Checked {
        let soffset = i32::from_le_bytes(self.bytes(pos)?);
        let vtable = if soffset > 0 {
            pos.checked_sub(soffset.unsigned_abs() as usize)
        } else {
            pos.checked_add(soffset.unsigned_abs() as usize)
        }
        .filter(|&at| at < self.buf.len());
        let Some(vtable) = vtable else {
            return fail(Problem::VtableOutOfRange, pos);
        };
        let vtable_len = usize::from(u16::from_le_bytes(self.bytes(vtable)?));
        self.aligned(vtable.saturating_add(vtable_len), 2)?;
        self.range(vtable, vtable_len)?;
        self.tables += 1;
        if self.tables > self.opts.max_tables {
            return fail(Problem::TooManyTables, pos);
        }
        self.depth += 1;
        if self.depth > self.opts.max_depth {
            return fail(Problem::TooDeep, pos);
        }
        let buf = self.buf;
        let table = Table {
            pos,
            // In range and aligned (checked above); none where it is shorter than its lengths.
            entries: buf
                .get(vtable.saturating_add(4)..vtable + vtable_len)
                .unwrap_or(&[]),
        };
        let mut slot = 0;
        if let Err(f) = fields(self, &table, &mut slot) {
            if self.failed_in.0.is_empty() {
                let name = shape.fields.get(slot).map_or("", |&(name, _)| name);
                self.failed_in = (shape.name, name);
            }
            return Err(f);
        }
        self.depth -= 1;
        self.apparent_size_within(pos)
    }

    /// Checks the field in slot `slot` of `table`, of kind `field`, and moves `slot` past it.
    /// Slots past the vtable are absent (flatbuffers asks the first of them, as the value of a
    /// union whose type is the vtable's last entry; absent here too, whichever is asked).
    #[inline(always)]
    pub(crate) fn next_field(
        &mut self,
        table: &Table<'_>,
        slot: &mut usize,
        field: Field,
    ) -> Checked {
        self.field(table, *slot, field)?;
        *slot += 1;
        Ok(())
    }

    /// Where slot `slot`'s field of `table` is, if it is present. Cannot fail: the whole
    /// vtable was checked in range and aligned, and an entry is two bytes at an even offset
    /// below its length (flatbuffers checks each entry again, which counts in its apparent
    /// size: counted here the same).
    #[inline]
    fn slot(&mut self, table: &Table<'_>, slot: usize) -> Option<usize> {
        let Some(&[low, high]) = table.entries.get(2 * slot..2 * slot + 2) else {
            return None;
        };
        self.apparent = self.apparent.saturating_add(2);
        let offset = u16::from_le_bytes([low, high]);
        // A table's position lies inside the buffer (its offset to its vtable was read there),
        // and a slice is at most isize::MAX bytes: this sum, and a scalar's size added to it,
        // cannot overflow.
        (offset > 0).then(|| table.pos + usize::from(offset))
    }

    #[inline(always)]
    fn field(&mut self, table: &Table<'_>, slot: usize, field: Field) -> Checked {
        let pos = match field {
            Field::Deprecated | Field::Unread | Field::UnionType => return Ok(()),
            Field::Union(variants) => return self.union(table, slot, variants),
            _ => match self.slot(table, slot) {
                Some(pos) => pos,
                None => return Ok(()),
            },
        };
        match field {
            Field::Scalar(size) => {
                let size = usize::from(size);
                self.aligned(pos, size)?;
                // `pos` is a slot's (see `slot`): no saturation needed.
                if pos + size > self.buf.len() {
                    return fail(Problem::OutOfRange, pos);
                }
                self.apparent = self.apparent.saturating_add(size);
                Ok(())
            }
            Field::Scalars(size) => {
                let at = self.follow(pos)?;
                self.vector(at, usize::from(size)).map(drop)
            }
            Field::String => {
                let at = self.follow(pos)?;
                self.string(at)
            }
            Field::Table(shape) => {
                let at = self.follow(pos)?;
                (shape.check.0)(self, at)
            }
            Field::Tables(shape) => {
                let at = self.follow(pos)?;
                let (start, end) = self.vector(at, 4)?;
                for element in (start..end).step_by(4) {
                    let at = self.follow(element)?;
                    (shape.check.0)(self, at)?;
                }
                Ok(())
            }
            Field::Deprecated | Field::Unread | Field::UnionType | Field::Union(_) => Ok(()),
        }
    }

    /// The union whose value is in slot `slot` and whose type is in the slot before it.
    fn union(
        &mut self,
        table: &Table<'_>,
        slot: usize,
        variants: &'static [&'static Shape],
    ) -> Checked {
        // flatbuffers looks the value up first; the order shows only in the apparent size.
        let value = self.slot(table, slot);
        let kind = match slot.checked_sub(1) {
            Some(before) => self.slot(table, before),
            None => None,
        };
        match (kind, value) {
            (None, None) => Ok(()),
            (Some(kind), Some(value)) => {
                let [t] = self.bytes::<1>(kind)?;
                match usize::from(t).checked_sub(1).and_then(|i| variants.get(i)) {
                    Some(shape) => {
                        let at = self.follow(value)?;
                        (shape.check.0)(self, at)
                    }
                    None => Ok(()),
                }
            }
            (Some(at), None) | (None, Some(at)) => fail(Problem::InconsistentUnion, at),
        }
    }
}

/// A table being checked: where it is, and its vtable's entries.
pub(crate) struct Table<'b> {
    pos: usize,
    /// The vtable's entries, past its two lengths.
    entries: &'b [u8],
}
