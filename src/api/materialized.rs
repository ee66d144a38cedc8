//! Rows of a set-returning function handed to the executor all at once, in a tuplestore
//! (`SFRM_Materialize`), for a function that returns many rows computed in one go (`take_batch`).
//!
//! pgrx's `TableIterator` returns one row per call (`SFRM_ValuePerCall`): the executor calls the function
//! again for every row, and each call of a SECURITY DEFINER function goes through `fmgr_security_definer`
//! (a user switch, statistics of the call) and pgrx's guard. For 100 000 rows that costs more than the
//! decisions themselves; a materialized result costs one tuple copy per row.

use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::PgSqlErrorCode;

/// The tuplestore and row type of a materialized result, set up in the query's memory.
pub struct Materialized {
    store: *mut pg_sys::Tuplestorestate,
    desc: pg_sys::TupleDesc,
}

impl Materialized {
    /// Sets up the result of the call `fcinfo`: a tuplestore of its declared row type, handed to the
    /// executor as the call's result, that keeps up to `memory_kb` kilobytes of rows in memory before it
    /// spills to a temporary file. 0A000 when the caller cannot take a materialized set.
    ///
    /// # Safety
    /// `fcinfo` is the call's `FunctionCallInfo`, as PostgreSQL passes it to a V1 function whose declared
    /// result is a composite (`RETURNS TABLE`).
    pub unsafe fn begin(
        fcinfo: pg_sys::FunctionCallInfo,
        function: &'static str,
        memory_kb: i32,
    ) -> Result<Materialized, ErrorReport> {
        // SAFETY: PostgreSQL passes a valid fcinfo; resultinfo is NULL or points at a Node, whose first
        // field is its tag (funcapi's InitMaterializedSRF checks it the same way).
        let rsinfo = unsafe { (*fcinfo).resultinfo }.cast::<pg_sys::ReturnSetInfo>();
        let materialize = pg_sys::SetFunctionReturnMode::SFRM_Materialize as i32;
        // SAFETY: as above; allowedModes is a plain int of the ReturnSetInfo.
        let accepts = !rsinfo.is_null()
            && unsafe { (*rsinfo).type_ } == pg_sys::NodeTag::T_ReturnSetInfo
            && unsafe { (*rsinfo).allowedModes } & materialize != 0;
        if !accepts {
            return Err(ErrorReport::new(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                format!("{function} returns a set: call it in FROM"),
                function,
            )
            .set_hint("SELECT * FROM rate_limit.take_batch(policy, keys)."));
        }
        let mut desc: pg_sys::TupleDesc = std::ptr::null_mut();
        // SAFETY: rsinfo is a valid ReturnSetInfo (checked above) whose econtext is the calling
        // expression's, live for the query; the tuplestore and the descriptor copy are made in its
        // per-query memory, as the executor reads them after this call returns; get_call_result_type
        // reads the function's declared result type from its fcinfo.
        unsafe {
            let kind = pg_sys::get_call_result_type(fcinfo, std::ptr::null_mut(), &mut desc);
            if kind != pg_sys::TypeFuncClass::TYPEFUNC_COMPOSITE || desc.is_null() {
                return Err(crate::error::bug(
                    function,
                    "its result type is not a row type",
                ));
            }
            let old = pg_sys::MemoryContextSwitchTo((*(*rsinfo).econtext).ecxt_per_query_memory);
            let random = (*rsinfo).allowedModes
                & pg_sys::SetFunctionReturnMode::SFRM_Materialize_Random as i32
                != 0;
            let store = pg_sys::tuplestore_begin_heap(random, false, memory_kb);
            let desc = pg_sys::CreateTupleDescCopy(desc);
            pg_sys::MemoryContextSwitchTo(old);
            (*rsinfo).returnMode = pg_sys::SetFunctionReturnMode::SFRM_Materialize;
            (*rsinfo).setResult = store;
            (*rsinfo).setDesc = desc;
            Ok(Materialized { store, desc })
        }
    }

    /// Appends one row. `values` and `nulls` have one entry per column of the row type; a by-reference
    /// value must stay valid until this returns (the row is copied into the tuplestore).
    pub fn push(&mut self, values: &mut [pg_sys::Datum], nulls: &mut [bool]) {
        // SAFETY: the tuplestore and descriptor were made by `begin` for this call and live in the
        // query's memory; the caller passes one value and one null flag per column of that descriptor,
        // which tuplestore_putvalues reads and copies.
        unsafe {
            debug_assert_eq!(values.len(), (*self.desc).natts as usize);
            pg_sys::tuplestore_putvalues(
                self.store,
                self.desc,
                values.as_mut_ptr(),
                nulls.as_mut_ptr(),
            );
        }
    }
}
