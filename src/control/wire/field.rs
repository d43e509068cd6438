//! One field at a time: how a field sequence is written ([`Body`]) and read
//! ([`Fields`]), how a value is laid out ([`Codec`]), how often a field may
//! appear ([`Presence`]), and what a declaration in `message.rs` becomes
//! ([`Line`], [`Schema`]). Every check on hostile input lives here, once.

use std::marker::PhantomData;

use super::{Result, WireError};

#[cfg(test)]
use super::table::{Record, Row};

/// Bytes in a field header: tag and value length.
pub(super) const FIELD_HEADER_LEN: usize = 6;

// ---------------------------------------------------------------------------
// Writing and reading field sequences
// ---------------------------------------------------------------------------

/// Saturating because encoding is infallible by signature: a value past
/// 4 GiB cannot be framed, and a saturated length makes the peer reject the
/// frame instead of misreading it.
pub(super) fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// A field sequence under construction.
pub(super) struct Body(pub(super) Vec<u8>);

impl Body {
    pub(super) fn field(&mut self, tag: u16, value: &[u8]) {
        self.0.extend_from_slice(&tag.to_le_bytes());
        self.0
            .extend_from_slice(&len_u32(value.len()).to_le_bytes());
        self.0.extend_from_slice(value);
    }

    /// Writes a field whose value `fill` writes in place, and patches its
    /// length afterwards, so nested records cost no intermediate buffer.
    pub(super) fn record(&mut self, tag: u16, fill: impl FnOnce(&mut Body)) {
        self.0.extend_from_slice(&tag.to_le_bytes());
        let len_at = self.0.len();
        self.0.extend_from_slice(&[0; 4]);
        fill(self);
        self.patch_len(len_at);
    }

    /// Sets the u32 at `at` to the number of bytes that follow it.
    pub(super) fn patch_len(&mut self, at: usize) {
        let len = len_u32(self.0.len().saturating_sub(at + 4));
        if let Some(slot) = self.0.get_mut(at..at + 4) {
            slot.copy_from_slice(&len.to_le_bytes());
        }
    }
}

/// The fields of a body or record, in order. The enclosing frame is already
/// complete here, so a field running past its record is malformed, not
/// truncated: reporting it as `Truncated` could read as a clean close.
pub(super) struct Fields<'a>(pub(super) &'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u16, &'a [u8])>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let Some((head, after)) = self.0.split_first_chunk::<FIELD_HEADER_LEN>() else {
            let tag = match *self.0 {
                [a, b, ..] => u16::from_le_bytes([a, b]),
                _ => 0,
            };
            let reason = format!(
                "record ends inside a field header ({} of {FIELD_HEADER_LEN} bytes)",
                self.0.len()
            );
            self.0 = &[];
            return Some(Err(WireError::BadField { tag, reason }));
        };
        let [t0, t1, l0, l1, l2, l3] = *head;
        let tag = u16::from_le_bytes([t0, t1]);
        let len = u32::from_le_bytes([l0, l1, l2, l3]);
        let Some((value, rest)) = usize::try_from(len)
            .ok()
            .and_then(|n| after.split_at_checked(n))
        else {
            let reason = format!(
                "value of {len} bytes runs past the end of its record ({} left)",
                after.len()
            );
            self.0 = &[];
            return Some(Err(WireError::BadField { tag, reason }));
        };
        self.0 = rest;
        Some(Ok((tag, value)))
    }
}

/// Reads every field of `body` in order: `take` keeps a field it knows
/// (`Ok(true)`), every other one is skipped.
pub(super) fn read_fields(
    body: &[u8],
    mut take: impl FnMut(u16, &[u8]) -> Result<bool>,
) -> Result<()> {
    for field in Fields(body) {
        let (tag, v) = field?;
        if !take(tag, v)? {
            skip(tag);
        }
    }
    Ok(())
}

/// Decodes a body or record laid out by `T`'s declaration; `msg` names it in
/// [`WireError::MissingField`].
pub(super) fn decode_fields<T: Schema>(body: &[u8], msg: &'static str) -> Result<T> {
    let mut slots = T::slots();
    read_fields(body, |tag, v| T::take(&mut slots, tag, v))?;
    T::finish(slots, msg)
}

/// Unknown fields are how newer peers extend messages; a trace helps when
/// two versions disagree about what matters.
fn skip(tag: u16) {
    tracing::trace!(tag, "skipping unknown control field");
}

fn set_once<T>(slot: &mut Option<T>, tag: u16, parse: impl FnOnce() -> Result<T>) -> Result<()> {
    if slot.is_some() {
        return Err(WireError::DuplicateField { tag });
    }
    *slot = Some(parse()?);
    Ok(())
}

/// Checks the count before decoding the element, so an over-long list is
/// refused at its first excess element.
fn push_bounded<T>(
    list: &mut Vec<T>,
    what: &'static str,
    max: usize,
    parse: impl FnOnce() -> Result<T>,
) -> Result<()> {
    if list.len() >= max {
        return Err(WireError::TooLarge {
            what,
            len: list.len() + 1,
            max,
        });
    }
    list.push(parse()?);
    Ok(())
}

fn required<T>(slot: Option<T>, msg: &'static str, tag: u16) -> Result<T> {
    slot.ok_or(WireError::MissingField { msg, tag })
}

fn fixed<const N: usize>(tag: u16, v: &[u8]) -> Result<[u8; N]> {
    <[u8; N]>::try_from(v).map_err(|_| WireError::BadField {
        tag,
        reason: format!("expected {N} bytes, got {}", v.len()),
    })
}

/// The limit is checked before anything is scanned or copied.
fn at_most(v: &[u8], what: &'static str, max: usize) -> Result<()> {
    if v.len() > max {
        return Err(WireError::TooLarge {
            what,
            len: v.len(),
            max,
        });
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Values: what the bytes of one field mean
// ---------------------------------------------------------------------------

/// How one value is laid out in a field's bytes, and checked when read.
pub(super) trait Codec {
    /// The value in Rust.
    type Value;
    /// Writes `v` as field `tag`.
    fn put(&self, b: &mut Body, tag: u16, v: &Self::Value);
    /// Reads field `tag`'s value bytes, making every check those bytes
    /// alone allow before anything is kept.
    fn get(&self, tag: u16, v: &[u8]) -> Result<Self::Value>;
    /// Checks a present value once the whole body is read, in declaration
    /// order with the presence checks (a descriptor's name is non-empty).
    fn check(&self, _tag: u16, _v: &Self::Value) -> Result<()> {
        Ok(())
    }
    /// The value's cell in the tag table.
    #[cfg(test)]
    fn doc(&self) -> String;
    /// The record a record value is, which the tag table lists too.
    #[cfg(test)]
    fn record(&self) -> Option<Record> {
        None
    }
}

/// An integer, little-endian and exactly its width.
pub(super) struct Int<T>(PhantomData<T>);

impl<T> Int<T> {
    pub(super) const NEW: Self = Int(PhantomData);
}

macro_rules! int_codec {
    ($($t:ty),*) => {$(
        impl Codec for Int<$t> {
            type Value = $t;

            fn put(&self, b: &mut Body, tag: u16, v: &$t) {
                b.field(tag, &v.to_le_bytes());
            }

            fn get(&self, tag: u16, v: &[u8]) -> Result<$t> {
                Ok(<$t>::from_le_bytes(fixed(tag, v)?))
            }

            #[cfg(test)]
            fn doc(&self) -> String {
                stringify!($t).into()
            }
        }
    )*};
}
int_codec!(u8, u16, u32, u64);

/// One byte, `0` or `1`; any other byte is refused.
pub(super) struct Bool;

impl Codec for Bool {
    type Value = bool;

    fn put(&self, b: &mut Body, tag: u16, v: &bool) {
        b.field(tag, &[u8::from(*v)]);
    }

    fn get(&self, tag: u16, v: &[u8]) -> Result<bool> {
        match fixed::<1>(tag, v)? {
            [0] => Ok(false),
            [1] => Ok(true),
            [b] => Err(WireError::BadField {
                tag,
                reason: format!("bool byte {b}, expected 0 or 1"),
            }),
        }
    }

    #[cfg(test)]
    fn doc(&self) -> String {
        "bool".into()
    }
}

/// Exactly `N` bytes.
pub(super) struct Array<const N: usize>;

impl<const N: usize> Codec for Array<N> {
    type Value = [u8; N];

    fn put(&self, b: &mut Body, tag: u16, v: &[u8; N]) {
        b.field(tag, v);
    }

    fn get(&self, tag: u16, v: &[u8]) -> Result<[u8; N]> {
        fixed(tag, v)
    }

    #[cfg(test)]
    fn doc(&self) -> String {
        format!("{N} bytes")
    }
}

/// A UTF-8 string of at most `max` bytes, named `what` in errors; with
/// `non_empty`, an empty one is refused once the body is read.
pub(super) struct Text {
    pub(super) max: usize,
    pub(super) what: &'static str,
    pub(super) non_empty: bool,
    /// `max`'s name, for the tag table.
    #[cfg(test)]
    pub(super) limit: &'static str,
}

impl Codec for Text {
    type Value = String;

    fn put(&self, b: &mut Body, tag: u16, v: &String) {
        b.field(tag, v.as_bytes());
    }

    fn get(&self, tag: u16, v: &[u8]) -> Result<String> {
        at_most(v, self.what, self.max)?;
        std::str::from_utf8(v)
            .map(str::to_owned)
            .map_err(|e| WireError::BadField {
                tag,
                reason: format!("invalid UTF-8: {e}"),
            })
    }

    fn check(&self, tag: u16, v: &String) -> Result<()> {
        if self.non_empty && v.is_empty() {
            return Err(WireError::BadField {
                tag,
                reason: format!("empty {}", self.what),
            });
        }
        Ok(())
    }

    #[cfg(test)]
    fn doc(&self) -> String {
        let empty = if self.non_empty { ", non-empty" } else { "" };
        format!("string ≤ [`{}`]{empty}", self.limit)
    }
}

/// Bytes, at most `max` of them, named `what` in errors.
pub(super) struct Blob {
    pub(super) max: usize,
    pub(super) what: &'static str,
    /// `max`'s name, for the tag table.
    #[cfg(test)]
    pub(super) limit: &'static str,
}

impl Codec for Blob {
    type Value = Vec<u8>;

    fn put(&self, b: &mut Body, tag: u16, v: &Vec<u8>) {
        b.field(tag, v);
    }

    fn get(&self, _tag: u16, v: &[u8]) -> Result<Vec<u8>> {
        at_most(v, self.what, self.max)?;
        Ok(v.to_vec())
    }

    #[cfg(test)]
    fn doc(&self) -> String {
        format!("bytes ≤ [`{}`]", self.limit)
    }
}

/// A u64 that is never 0 (an id, a sequence number), named `what` in errors.
pub(super) struct NonZero {
    pub(super) what: &'static str,
}

impl Codec for NonZero {
    type Value = u64;

    fn put(&self, b: &mut Body, tag: u16, v: &u64) {
        b.field(tag, &v.to_le_bytes());
    }

    fn get(&self, tag: u16, v: &[u8]) -> Result<u64> {
        match u64::from_le_bytes(fixed(tag, v)?) {
            0 => Err(WireError::BadField {
                tag,
                reason: format!("{} 0", self.what),
            }),
            n => Ok(n),
        }
    }

    #[cfg(test)]
    fn doc(&self) -> String {
        "u64, non-zero".into()
    }
}

/// u32s packed into one field, at most `max` of them, named `what` in errors.
pub(super) struct U32s {
    pub(super) max: usize,
    pub(super) what: &'static str,
    /// `max`'s name, for the tag table.
    #[cfg(test)]
    pub(super) limit: &'static str,
}

impl Codec for U32s {
    type Value = Vec<u32>;

    fn put(&self, b: &mut Body, tag: u16, v: &Vec<u32>) {
        b.record(tag, |b| {
            for k in v {
                b.0.extend_from_slice(&k.to_le_bytes());
            }
        });
    }

    fn get(&self, tag: u16, v: &[u8]) -> Result<Vec<u32>> {
        if v.len() % 4 != 0 || v.len() / 4 > self.max {
            return Err(WireError::BadField {
                tag,
                reason: format!(
                    "{} of {} bytes (want a multiple of 4, at most {} keys)",
                    self.what,
                    v.len(),
                    self.max
                ),
            });
        }
        Ok(v.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    #[cfg(test)]
    fn doc(&self) -> String {
        format!("u32 each, ≤ [`{}`]", self.limit)
    }
}

/// A record: a field sequence of its own, laid out by `T`'s declaration,
/// with the same rules as a message body (unknown tags skipped inside too).
pub(super) struct Rec<T>(PhantomData<T>);

impl<T> Rec<T> {
    pub(super) const NEW: Self = Rec(PhantomData);
}

impl<T: Schema> Codec for Rec<T> {
    type Value = T;

    fn put(&self, b: &mut Body, tag: u16, v: &T) {
        b.record(tag, |b| v.put(b));
    }

    fn get(&self, _tag: u16, v: &[u8]) -> Result<T> {
        decode_fields(v, T::NAME)
    }

    #[cfg(test)]
    fn doc(&self) -> String {
        format!("`{}` record", T::NAME)
    }

    #[cfg(test)]
    fn record(&self) -> Option<Record> {
        Some(Record {
            name: T::NAME,
            rows: T::rows,
        })
    }
}

// ---------------------------------------------------------------------------
// Presence: how often a field appears, and what its absence means
// ---------------------------------------------------------------------------

/// How often a field may appear and what its absence means.
pub(super) trait Presence<C: Codec> {
    /// What the decoder collects while it reads the body.
    type Slot: Default;
    /// What the struct holds.
    type Field;
    /// Takes one occurrence of the field.
    fn take(&self, c: &C, slot: &mut Self::Slot, tag: u16, v: &[u8]) -> Result<()>;
    /// The field's value once the whole body is read; `msg` names the
    /// message or record in [`WireError::MissingField`].
    fn finish(&self, c: &C, slot: Self::Slot, msg: &'static str, tag: u16)
    -> Result<Self::Field>;
    /// Writes the field (or nothing, or one field per element).
    fn put(&self, c: &C, b: &mut Body, tag: u16, field: &Self::Field);
    /// The presence's words in the tag table.
    #[cfg(test)]
    fn doc(&self) -> String;
}

/// Exactly once: absent is [`WireError::MissingField`], twice
/// [`WireError::DuplicateField`].
pub(super) struct Required;

impl<C: Codec> Presence<C> for Required {
    type Slot = Option<C::Value>;
    type Field = C::Value;

    fn take(&self, c: &C, slot: &mut Self::Slot, tag: u16, v: &[u8]) -> Result<()> {
        set_once(slot, tag, || c.get(tag, v))
    }

    fn finish(&self, c: &C, slot: Self::Slot, msg: &'static str, tag: u16) -> Result<C::Value> {
        let v = required(slot, msg, tag)?;
        c.check(tag, &v)?;
        Ok(v)
    }

    fn put(&self, c: &C, b: &mut Body, tag: u16, field: &C::Value) {
        c.put(b, tag, field);
    }

    #[cfg(test)]
    fn doc(&self) -> String {
        "required".into()
    }
}

/// At most once, an `Option`: `None` is left out.
pub(super) struct Optional;

impl<C: Codec> Presence<C> for Optional {
    type Slot = Option<C::Value>;
    type Field = Option<C::Value>;

    fn take(&self, c: &C, slot: &mut Self::Slot, tag: u16, v: &[u8]) -> Result<()> {
        set_once(slot, tag, || c.get(tag, v))
    }

    fn finish(&self, c: &C, slot: Self::Slot, _msg: &'static str, tag: u16) -> Result<Self::Field> {
        if let Some(v) = &slot {
            c.check(tag, v)?;
        }
        Ok(slot)
    }

    fn put(&self, c: &C, b: &mut Body, tag: u16, field: &Self::Field) {
        if let Some(v) = field {
            c.put(b, tag, v);
        }
    }

    #[cfg(test)]
    fn doc(&self) -> String {
        "optional".into()
    }
}

/// At most once; absent is the default value, which is left out, so a
/// field added this way keeps older messages' bytes as they were.
pub(super) struct OrDefault;

impl<C: Codec> Presence<C> for OrDefault
where
    C::Value: Default + PartialEq + std::fmt::Debug,
{
    type Slot = Option<C::Value>;
    type Field = C::Value;

    fn take(&self, c: &C, slot: &mut Self::Slot, tag: u16, v: &[u8]) -> Result<()> {
        set_once(slot, tag, || c.get(tag, v))
    }

    fn finish(&self, c: &C, slot: Self::Slot, _msg: &'static str, tag: u16) -> Result<C::Value> {
        let v = slot.unwrap_or_default();
        c.check(tag, &v)?;
        Ok(v)
    }

    fn put(&self, c: &C, b: &mut Body, tag: u16, field: &C::Value) {
        if *field != C::Value::default() {
            c.put(b, tag, field);
        }
    }

    #[cfg(test)]
    fn doc(&self) -> String {
        format!("absent = {:?}", C::Value::default())
    }
}

/// A list: each occurrence is one element, in order, at most `max` of them
/// ([`WireError::TooLarge`] naming `what` at the first one over).
pub(super) struct Repeated {
    pub(super) max: usize,
    pub(super) what: &'static str,
    /// `max`'s name, for the tag table.
    #[cfg(test)]
    pub(super) limit: &'static str,
}

impl<C: Codec> Presence<C> for Repeated {
    type Slot = Vec<C::Value>;
    type Field = Vec<C::Value>;

    fn take(&self, c: &C, slot: &mut Self::Slot, tag: u16, v: &[u8]) -> Result<()> {
        push_bounded(slot, self.what, self.max, || c.get(tag, v))
    }

    fn finish(&self, _c: &C, slot: Self::Slot, _msg: &'static str, _tag: u16) -> Result<Self::Field> {
        Ok(slot)
    }

    fn put(&self, c: &C, b: &mut Body, tag: u16, field: &Self::Field) {
        for v in field {
            c.put(b, tag, v);
        }
    }

    #[cfg(test)]
    fn doc(&self) -> String {
        format!("repeated ≤ [`{}`]", self.limit)
    }
}

// ---------------------------------------------------------------------------
// Declarations: what `schema!` and `messages!` put together
// ---------------------------------------------------------------------------

/// One line of a declaration (a [`Field`], or a group [`Flatten`]ed in):
/// what the decoder collects for it while it reads a body. Both have the
/// same four methods, `take`, `finish`, `put` and (tests) `rows`.
pub(super) trait Line {
    type Slot: Default;
}

/// A field: its tag, how its value is laid out, how often it appears.
pub(super) struct Field<C, P> {
    pub(super) tag: u16,
    pub(super) codec: C,
    pub(super) presence: P,
    /// The tag's constant, the struct field's name and the notes (`///`
    /// lines) of the declaration, for the tag table.
    #[cfg(test)]
    pub(super) constant: &'static str,
    #[cfg(test)]
    pub(super) name: &'static str,
    #[cfg(test)]
    pub(super) notes: &'static [&'static str],
}

impl<C: Codec, P: Presence<C>> Line for Field<C, P> {
    type Slot = P::Slot;
}

impl<C: Codec, P: Presence<C>> Field<C, P> {
    /// Takes field `tag` if it is this one (`Ok(true)`).
    pub(super) fn take(&self, slot: &mut P::Slot, tag: u16, v: &[u8]) -> Result<bool> {
        if tag != self.tag {
            return Ok(false);
        }
        self.presence.take(&self.codec, slot, tag, v)?;
        Ok(true)
    }

    /// The struct field's value once the whole body is read.
    pub(super) fn finish(&self, slot: P::Slot, msg: &'static str) -> Result<P::Field> {
        self.presence.finish(&self.codec, slot, msg, self.tag)
    }

    pub(super) fn put(&self, b: &mut Body, v: &P::Field) {
        self.presence.put(&self.codec, b, self.tag, v);
    }

    #[cfg(test)]
    pub(super) fn rows(&self) -> Vec<Row> {
        let mut value = vec![self.codec.doc()];
        value.extend(self.notes.iter().map(|n| n.trim().to_owned()));
        value.push(self.presence.doc());
        vec![Row {
            tag: self.tag,
            constant: self.constant,
            field: self.name,
            value: value.join(", "),
            record: self.codec.record(),
        }]
    }
}

/// `G`'s fields, inline in the enclosing body (not a record of their own):
/// a QP bootstrap inside `QpConnect` and `QpAccept`.
pub(super) struct Flatten<G>(PhantomData<G>);

impl<G: Schema> Line for Flatten<G> {
    type Slot = FlatSlots<G>;
}

/// A flattened record's slots, empty by default.
pub(super) struct FlatSlots<G: Schema>(G::Slots);

impl<G: Schema> Default for FlatSlots<G> {
    fn default() -> Self {
        FlatSlots(G::slots())
    }
}

impl<G: Schema> Flatten<G> {
    pub(super) const NEW: Self = Flatten(PhantomData);

    /// Takes field `tag` if it is one of `G`'s (`Ok(true)`).
    pub(super) fn take(&self, slot: &mut FlatSlots<G>, tag: u16, v: &[u8]) -> Result<bool> {
        G::take(&mut slot.0, tag, v)
    }

    pub(super) fn finish(&self, slot: FlatSlots<G>, msg: &'static str) -> Result<G> {
        G::finish(slot.0, msg)
    }

    pub(super) fn put(&self, b: &mut Body, v: &G) {
        v.put(b);
    }

    #[cfg(test)]
    pub(super) fn rows(&self) -> Vec<Row> {
        G::rows()
    }
}

/// A struct laid out as a field sequence, as `schema!` declares it.
pub(super) trait Schema: Sized {
    /// The struct's name, which names it as a record in errors.
    const NAME: &'static str;
    /// One slot per declaration line, in order (a tuple: `Default` only up
    /// to twelve, so [`Schema::slots`] makes it).
    type Slots;
    /// Every slot empty.
    fn slots() -> Self::Slots;
    /// Takes field `tag` if one of the lines knows it (`Ok(true)`).
    fn take(slots: &mut Self::Slots, tag: u16, v: &[u8]) -> Result<bool>;
    /// The struct, once the whole body is read: lines finished in order.
    fn finish(slots: Self::Slots, msg: &'static str) -> Result<Self>;
    /// Writes the fields, in declaration (tag) order.
    fn put(&self, b: &mut Body);
    /// The declaration's rows in the tag table.
    #[cfg(test)]
    fn rows() -> Vec<Row>;
}
