//! The two declarations `message.rs` is written in, `schema!` (a struct laid
//! out as fields) and `messages!` (the message types), and the helpers they
//! expand through. They are plumbing only: what a field's bytes mean and
//! which checks it gets is plain Rust in `field.rs` ([`Codec`], [`Presence`]).
//!
//! One line of a declaration:
//!
//! ```text
//! /// a note for the tag table (optional, any number)
//! TAG CONSTANT field: kind, presence;
//! field: flatten(Type);
//! ```
//!
//! `TAG` is a `u16` literal, `CONSTANT` the name the line defines for it,
//! `field` the struct field (or enum variant field) it fills. Kinds:
//! `u8` `u16` `u32` `u64`, `bool`, `array(N)` (exactly N bytes),
//! `str(MAX, "what")` and `str(MAX, "what", non_empty)`,
//! `bytes(MAX, "what")`, `nonzero("what")` (a u64), `u32s(MAX, "what")`
//! (packed in one field), `record(Type)`. Presences: `required`,
//! `optional` (an `Option`), `or_default` (absent is the default, which is
//! left out), `repeated(MAX, "what")` (a `Vec`, one field per element).
//! `MAX` is a constant's name: the table links it. `flatten(Type)` puts
//! `Type`'s declared fields inline, without a tag of its own.
//!
//! [`Codec`]: super::field::Codec
//! [`Presence`]: super::field::Presence

/// Lays out structs as field sequences. For each struct, one line per
/// field, in tag order (a test holds them to it); it defines the tag
/// constants and implements [`Schema`](super::field::Schema): slots,
/// decoder, encoder and table rows.
///
/// Once the body is read, the fields are finished (presence and late
/// checks) in declaration order, and the first failure is the error;
/// `Type check_order(field, ...)` names another order, every field once.
/// `Type => build` decodes through `build(field, ...)` (the finished fields,
/// in declaration order) instead of a struct literal, for a type whose
/// constructor checks it.
macro_rules! schema {
    ($(
        $(#[$meta:meta])*
        $ty:ident $(check_order($($order:ident),* $(,)?))? $(=> $build:path)? { $($lines:tt)* }
    )*) => {$(
        schema_lines!(@parse
            [@impl [$(#[$meta])*] $ty [$($($order)*)?] [$($build)?]]
            $($lines)*
        );
    )*};
}

/// Declares the message types: `number CONSTANT Variant { lines }` for a
/// variant with fields of its own, `number CONSTANT Variant(Type)` for one
/// whose body is a `schema!` struct. Defines the `TYPE_` constants and
/// `Message::{type_code, name}`, and the frame code's `known_type`,
/// `put_body` and `decode_body`.
macro_rules! messages {
    ($(
        $(#[$meta:meta])*
        $num:literal $konst:ident $variant:ident $shape:tt
    )*) => {
        $(
            $(#[$meta])*
            pub(super) const $konst: u16 = $num;
            schema_message!(@consts $shape);
        )*

        /// The highest type this side knows.
        #[cfg(test)]
        pub(super) const TYPE_LAST: u16 = {
            let types = [$($konst),*];
            let (mut last, mut i) = (0, 0);
            while i < types.len() {
                if types[i] > last {
                    last = types[i];
                }
                i += 1;
            }
            last
        };

        impl Message {
            /// The `msg_type` this message has on the wire.
            pub(crate) fn type_code(&self) -> u16 {
                match self {
                    $(Message::$variant { .. } => $konst,)*
                }
            }

            /// The variant's name, for logs and protocol errors.
            pub(crate) fn name(&self) -> &'static str {
                match self {
                    $(Message::$variant { .. } => stringify!($variant),)*
                }
            }
        }

        /// Whether `msg_type` is a type this side knows.
        pub(super) fn known_type(msg_type: u16) -> bool {
            matches!(msg_type, $($konst)|*)
        }

        /// Writes `msg`'s fields (the frame's body).
        pub(super) fn put_body(msg: &Message, b: &mut $crate::control::wire::field::Body) {
            match msg {
                $(schema_message!(@pattern inner $variant $shape) => {
                    schema_message!(@put b inner $shape)
                })*
            }
        }

        /// Decodes the body of a frame of type `msg_type`.
        pub(super) fn decode_body(
            msg_type: u16,
            body: &[u8],
        ) -> $crate::control::wire::Result<Message> {
            match msg_type {
                $($konst => schema_message!(@decode body $variant $shape),)*
                other => Err($crate::control::wire::WireError::UnknownMessage(other)),
            }
        }

        /// Each message's name, type and rows, in declaration order.
        #[cfg(test)]
        pub(super) fn message_rows() -> Vec<(&'static str, u16, Vec<$crate::control::wire::table::Row>)> {
            vec![$((stringify!($variant), $konst, schema_message!(@rows $shape)),)*]
        }
    };
}

/// One message of `messages!`: a variant's own lines, or a `schema!` body.
macro_rules! schema_message {
    (@consts ($body:ty)) => {};
    (@consts { $($lines:tt)* }) => {
        schema_lines!(@parse [@consts] $($lines)*);
    };

    (@pattern $inner:ident $variant:ident ($body:ty)) => {
        Message::$variant($inner)
    };
    (@pattern $inner:ident $variant:ident { $($lines:tt)* }) => {
        schema_lines!(@parse [@pattern $variant] $($lines)*)
    };

    (@put $b:ident $inner:ident ($body:ty)) => {
        $crate::control::wire::field::Schema::put($inner, $b)
    };
    (@put $b:ident $inner:ident { $($lines:tt)* }) => {
        schema_lines!(@parse [@put $b] $($lines)*)
    };

    (@decode $body:ident $variant:ident ($ty:ty)) => {
        Ok(Message::$variant($crate::control::wire::field::decode_fields::<$ty>(
            $body,
            stringify!($variant),
        )?))
    };
    (@decode $body:ident $variant:ident { $($lines:tt)* }) => {
        schema_lines!(@parse [@decode $body $variant] $($lines)*)
    };

    (@rows ($body:ty)) => {
        <$body as $crate::control::wire::field::Schema>::rows()
    };
    (@rows { $($lines:tt)* }) => {
        schema_lines!(@parse [@rows] $($lines)*)
    };
}

/// A declaration's lines: parsed once (`@parse`, the only place that knows
/// the line syntax) into `field [line]` pairs, then handed to the rule
/// named in brackets.
macro_rules! schema_lines {
    (@parse [$($then:tt)*] $(
        $(#[doc = $note:literal])*
        $($tag:literal $konst:ident)? $field:ident : $kind:ident $(($($karg:tt)*))?
        $(, $pres:ident $(($($parg:tt)*))?)? ;
    )*) => {
        schema_lines! { $($then)* [$(
            $field [[$($tag $konst)?] [$kind $(($($karg)*))?] [$($pres $(($($parg)*))?)?] [$($note)*]]
        )*] }
    };

    (@impl [$(#[$meta:meta])*] $ty:ident $order:tt [$($build:path)?] [$($field:ident $line:tt)*]) => {
        $(schema_line!(@const $line);)*

        $(#[$meta])*
        impl $crate::control::wire::field::Schema for $ty {
            const NAME: &'static str = stringify!($ty);
            type Slots = ($(
                <schema_line!(@ty $line) as $crate::control::wire::field::Line>::Slot,
            )*);

            fn slots() -> Self::Slots {
                ($(
                    <schema_line!(@ty $line) as $crate::control::wire::field::Line>::Slot::default(),
                )*)
            }

            fn take(
                slots: &mut Self::Slots,
                tag: u16,
                v: &[u8],
            ) -> $crate::control::wire::Result<bool> {
                let ($($field,)*) = slots;
                $(if schema_line!(@new $field $line).take($field, tag, v)? {
                    return Ok(true);
                })*
                Ok(false)
            }

            fn finish(
                slots: Self::Slots,
                msg: &'static str,
            ) -> $crate::control::wire::Result<Self> {
                let ($($field,)*) = slots;
                schema_lines!(@finish msg $order [$($field $line)*]);
                schema_lines!(@build $ty [$($build)?] $($field)*)
            }

            fn put(&self, b: &mut $crate::control::wire::field::Body) {
                let $ty { $($field),* } = self;
                $(schema_line!(@new $field $line).put(b, $field);)*
            }

            #[cfg(test)]
            fn rows() -> Vec<$crate::control::wire::table::Row> {
                std::iter::empty()
                    $(.chain(schema_line!(@new $field $line).rows()))*
                    .collect()
            }
        }
    };
    // Each slot becomes its field's value, shadowing it.
    (@finish $msg:ident [] [$($field:ident $line:tt)*]) => {
        $(let $field = schema_line!(@new $field $line).finish($field, $msg)?;)*
    };
    (@finish $msg:ident [$($order:ident)*] [$($field:ident $line:tt)*]) => {
        $(let $field = (schema_line!(@new $field $line), $field);)*
        $(let $order = $order.0.finish($order.1, $msg)?;)*
    };
    (@build $ty:ident [] $($field:ident)*) => {
        Ok($ty { $($field),* })
    };
    (@build $ty:ident [$build:path] $($field:ident)*) => {
        $build($($field),*)
    };

    (@consts [$($field:ident $line:tt)*]) => {
        $(schema_line!(@const $line);)*
    };

    (@pattern $variant:ident [$($field:ident $line:tt)*]) => {
        Message::$variant { $($field),* }
    };

    (@put $b:ident [$($field:ident $line:tt)*]) => {{
        $(schema_line!(@new $field $line).put($b, $field);)*
    }};

    // The same steps as `Schema::take` and `Schema::finish` above, for a
    // variant's own fields (a variant is no type to implement `Schema` on).
    (@decode $body:ident $variant:ident []) => {{
        $crate::control::wire::field::read_fields($body, |_, _| Ok(false))?;
        Ok(Message::$variant {})
    }};
    (@decode $body:ident $variant:ident [$($field:ident $line:tt)*]) => {{
        let mut slots: ($(
            <schema_line!(@ty $line) as $crate::control::wire::field::Line>::Slot,
        )*) = Default::default();
        $crate::control::wire::field::read_fields($body, |tag, v| {
            let ($($field,)*) = &mut slots;
            $(if schema_line!(@new $field $line).take($field, tag, v)? {
                return Ok(true);
            })*
            Ok(false)
        })?;
        let ($($field,)*) = slots;
        $(let $field = schema_line!(@new $field $line).finish($field, stringify!($variant))?;)*
        Ok(Message::$variant { $($field),* })
    }};

    (@rows [$($field:ident $line:tt)*]) => {{
        std::iter::empty()
            $(.chain(schema_line!(@new $field $line).rows()))*
            .collect::<Vec<_>>()
    }};
}

/// One parsed line: its tag constant, its [`Line`] type and value.
///
/// [`Line`]: super::field::Line
macro_rules! schema_line {
    (@const [[] [flatten($group:ty)] [] []]) => {};
    (@const [[$tag:literal $konst:ident] $($rest:tt)*]) => {
        pub(super) const $konst: u16 = $tag;
    };

    (@ty [[] [flatten($group:ty)] [] []]) => {
        $crate::control::wire::field::Flatten<$group>
    };
    (@ty [[$tag:literal $konst:ident] [$($kind:tt)*] [$($pres:tt)*] $notes:tt]) => {
        $crate::control::wire::field::Field<
            schema_codec!(@ty $($kind)*),
            schema_presence!(@ty $($pres)*),
        >
    };

    (@new $field:ident [[] [flatten($group:ty)] [] []]) => {
        $crate::control::wire::field::Flatten::<$group>::NEW
    };
    (@new $field:ident [[$tag:literal $konst:ident] [$($kind:tt)*] [$($pres:tt)*] [$($note:literal)*]]) => {
        $crate::control::wire::field::Field {
            tag: $konst,
            codec: schema_codec!(@new $($kind)*),
            presence: schema_presence!(@new $($pres)*),
            #[cfg(test)]
            constant: stringify!($konst),
            #[cfg(test)]
            name: stringify!($field),
            #[cfg(test)]
            notes: &[$($note),*],
        }
    };
}

/// A kind's [`Codec`](super::field::Codec): its type and its value.
macro_rules! schema_codec {
    (@ty bool) => { $crate::control::wire::field::Bool };
    (@new bool) => { $crate::control::wire::field::Bool };

    (@ty array($n:expr)) => { $crate::control::wire::field::Array<{ $n }> };
    (@new array($n:expr)) => { $crate::control::wire::field::Array::<{ $n }> };

    (@ty str($($args:tt)*)) => { $crate::control::wire::field::Text };
    (@new str($max:ident, $what:literal $(, $non_empty:ident)?)) => {
        $crate::control::wire::field::Text {
            max: $max,
            what: $what,
            non_empty: schema_codec!(@flag non_empty $($non_empty)?),
            #[cfg(test)]
            limit: stringify!($max),
        }
    };
    (@flag non_empty) => { false };
    (@flag non_empty non_empty) => { true };

    (@ty bytes($($args:tt)*)) => { $crate::control::wire::field::Blob };
    (@new bytes($max:ident, $what:literal)) => {
        $crate::control::wire::field::Blob {
            max: $max,
            what: $what,
            #[cfg(test)]
            limit: stringify!($max),
        }
    };

    (@ty nonzero($($args:tt)*)) => { $crate::control::wire::field::NonZero };
    (@new nonzero($what:literal)) => { $crate::control::wire::field::NonZero { what: $what } };

    (@ty u32s($($args:tt)*)) => { $crate::control::wire::field::U32s };
    (@new u32s($max:ident, $what:literal)) => {
        $crate::control::wire::field::U32s {
            max: $max,
            what: $what,
            #[cfg(test)]
            limit: stringify!($max),
        }
    };

    (@ty record($t:ty)) => { $crate::control::wire::field::Rec<$t> };
    (@new record($t:ty)) => { $crate::control::wire::field::Rec::<$t>::NEW };

    (@ty $int:ident) => { $crate::control::wire::field::Int<$int> };
    (@new $int:ident) => { $crate::control::wire::field::Int::<$int>::NEW };
}

/// A presence's [`Presence`](super::field::Presence): its type and value.
macro_rules! schema_presence {
    (@ty required) => { $crate::control::wire::field::Required };
    (@new required) => { $crate::control::wire::field::Required };
    (@ty optional) => { $crate::control::wire::field::Optional };
    (@new optional) => { $crate::control::wire::field::Optional };
    (@ty or_default) => { $crate::control::wire::field::OrDefault };
    (@new or_default) => { $crate::control::wire::field::OrDefault };
    (@ty repeated($($args:tt)*)) => { $crate::control::wire::field::Repeated };
    (@new repeated($max:ident, $what:literal)) => {
        $crate::control::wire::field::Repeated {
            max: $max,
            what: $what,
            #[cfg(test)]
            limit: stringify!($max),
        }
    };
}
