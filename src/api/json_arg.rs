//! A `jsonb` argument read as its text, so that the extension parses it itself. pgrx's `JsonB` parses the
//! text with `serde_json` and panics (XX000, "a text version of jsonb must be a valid json") on what
//! `serde_json` refuses but `jsonb` holds: values nested deeper than 128 levels and numbers beyond an
//! `f64` (`1e400`). [`JsonbText`] only turns the value into its text (`jsonb_out`, which cannot fail on a
//! valid `jsonb`); [`crate::policies::options::parse`] then checks depth and numbers, with 22023.

use pgrx::callconv::{Arg, ArgAbi};
use pgrx::nullable::Nullable;
use pgrx::pg_sys;
use pgrx::{direct_function_call, FromDatum};

/// The text of a `jsonb` argument, as `jsonb_out` writes it.
#[derive(Debug)]
pub struct JsonbText(pub String);

impl FromDatum for JsonbText {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<JsonbText> {
        if is_null {
            return None;
        }
        // SAFETY: the caller passes a datum of type jsonb (the argument's declared type); jsonb_out detoasts
        // it and returns a palloc'd, NUL-terminated string of valid UTF-8 (the database encoding's text of
        // a jsonb is JSON, which jsonb_in checked), which is copied before it is freed.
        unsafe {
            let text = direct_function_call::<&core::ffi::CStr>(pg_sys::jsonb_out, &[Some(datum)])?;
            let owned = String::from_utf8_lossy(text.to_bytes()).into_owned();
            pg_sys::pfree(text.as_ptr().cast_mut().cast());
            Some(JsonbText(owned))
        }
    }
}

// SAFETY: unboxes only a non-null argument of the function's declared type jsonb, through FromDatum above.
unsafe impl<'fcx> ArgAbi<'fcx> for JsonbText {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        // SAFETY: pgrx calls this for a non-null argument only (Option<JsonbText> handles NULL).
        unsafe { arg.unbox_arg_using_from_datum() }.unwrap_or_else(|| JsonbText(String::new()))
    }

    unsafe fn unbox_nullable_arg(arg: Arg<'_, 'fcx>) -> Nullable<Self> {
        // SAFETY: as above; a NULL argument is reported as such.
        unsafe { arg.unbox_arg_using_from_datum() }.into()
    }
}

// The type is jsonb in SQL, which is what FromDatum above reads; it is only ever an argument.
pgrx::impl_sql_translatable!(JsonbText, arg_only = "jsonb");
