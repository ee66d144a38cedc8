//! The SQL surface in one table: every function the extension creates, declared once. An entry says who
//! may call it, whether it names one key (and so is delegated by Citus and forwarded by the router to that
//! key's node), where the reference documents it, its SQL declaration (parameters, result, attributes, C
//! symbol), its comment, whether it takes tokens, and the version that first created it.
//!
//! What is made from it: Citus's list of delegated functions (`cluster::citus`); and, written by
//! `scripts/generate-surface.sh` and checked by the integration test `surface` (in the lint step), every
//! privilege and comment in `sql/finalize.sql` (which the unreleased upgrade script repeats), the CREATE
//! FUNCTION of each function new in the unreleased version (`sql/unreleased/000-new-functions.sql`) and the
//! PL/Proxy router's `calls()` (`router/plproxy.sql`). What checks it: a `#[pg_test]` compares every entry
//! with the catalog pgrx's schema made (name, schema, privileges, parameters, result, attributes, symbol,
//! comment, key); the integration tests check the untyped-parameter client test, the flood test's lists
//! and the reference's index against it. Adding a function is its Rust file, one entry here, the reference
//! and tests (docs/development.md).
//!
//! The table is in two files: [`calls`], the functions users call (and the trigger they attach), and
//! [`internal`], the extension's own triggers and what its views and statements call. Plain Rust that
//! imports nothing but its own children, so that the integration tests include these very files.

mod admin;
mod calls;
mod internal;

/// Who may execute a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Any role (EXECUTE granted to PUBLIC).
    Public,
    /// The extension's owner, superusers, and roles they grant EXECUTE (revoked from PUBLIC).
    Owner,
    /// As [`Access::Owner`], and members of `pg_monitor` (EXECUTE granted to it): the monitoring views'
    /// functions, which read counters and never change anything.
    Monitor,
}

/// What a function is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// Called by users: documented in the reference, called by the client test.
    Call,
    /// A trigger function users attach to their own tables: documented in the reference.
    UserTrigger,
    /// A trigger of the extension's own tables; a direct call is refused.
    OwnTrigger,
    /// Called only by the extension's own views and statements; its comment starts with "Internal:" or
    /// says whose rows it returns.
    Internal,
}

/// Where the PL/Proxy router runs a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// On the partition of its key argument ([`Function::key`]).
    KeysPartition,
    /// On the partition of the first of its keys (`take_many`).
    FirstKeysPartition,
    /// On every partition (policy management, purge).
    EveryPartition,
    /// On any one partition (pure functions).
    AnyPartition,
    /// Not forwarded: it answers for the node it runs on, or administers it.
    NotForwarded,
}

/// The schema a function lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schema {
    /// The schema the extension is created in (`public` by default): `rate_limiting_request` only.
    Extension,
    /// `rate_limit`.
    RateLimit,
}

/// How a function is defined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body {
    /// In the library, by pgrx (`#[pg_extern]` or `extension_sql!`): its C symbol, and its attributes as
    /// `VOLATILE|STABLE|IMMUTABLE [STRICT] [SECURITY DEFINER] PARALLEL SAFE|RESTRICTED|UNSAFE`.
    C {
        /// The symbol PostgreSQL calls (`prosrc`): pgrx's `<rust function>_wrapper`.
        symbol: &'static str,
        /// Volatility, strictness, security and parallel safety, in that order.
        attributes: &'static str,
    },
    /// In SQL or PL/pgSQL, written by hand in `sql/finalize.sql` (and an upgrade fragment).
    Sql,
}

/// What kind of routine an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A function (`SELECT`).
    Function,
    /// A procedure (`CALL`), which can commit between its steps: no result, never forwarded.
    Procedure,
}

/// One function of the SQL surface.
#[derive(Clone, Copy, Debug)]
pub struct Function {
    /// A function, or a procedure.
    pub kind: Kind,
    /// Its name.
    pub name: &'static str,
    /// Its argument types as `oidvectortypes(proargtypes)` prints them.
    pub arguments: &'static str,
    /// Its schema.
    pub schema: Schema,
    /// Who may execute it.
    pub access: Access,
    /// What it is for.
    pub purpose: Use,
    /// The parameter that names its one key, for a call whose every bucket belongs to that key: Citus
    /// delegates it to the key's node and the router forwards it to the key's partition.
    pub key: Option<&'static str>,
    /// Where the router runs it.
    pub route: Route,
    /// The anchor of its section in `docs/reference.md` (for [`Use::Call`] and [`Use::UserTrigger`]).
    pub doc: Option<&'static str>,
    /// Its parameters with names and defaults, as `pg_get_function_arguments` prints them.
    pub parameters: &'static str,
    /// Its result, as `pg_get_function_result` prints it.
    pub result: &'static str,
    /// How it is defined.
    pub body: Body,
    /// The version whose script first created it with these arguments: a function of the unreleased
    /// version (`Cargo.toml`'s) gets its CREATE FUNCTION in the upgrade script generated from this entry.
    pub since: &'static str,
    /// Whether a call takes tokens, and so may make buckets: the flood test floods with it, and a
    /// `fail_open` router answers it "allowed" while its partition is down (a call that only reads, or
    /// the owner's, always fails closed).
    pub takes_tokens: bool,
    /// Its comment (`COMMENT ON FUNCTION`).
    pub comment: &'static str,
}

impl Function {
    /// What an entry has before it states its declaration: the catalog check fails on any part left so.
    const UNDECLARED: Function = Function {
        kind: Kind::Function,
        name: "",
        arguments: "",
        schema: Schema::RateLimit,
        access: Access::Owner,
        purpose: Use::Internal,
        key: None,
        route: Route::NotForwarded,
        doc: None,
        parameters: "",
        result: "",
        body: Body::Sql,
        since: "",
        takes_tokens: false,
        comment: "",
    };

    /// The keyword SQL names it by in `GRANT`, `REVOKE` and `COMMENT ON`.
    pub fn sql_kind(&self) -> &'static str {
        match self.kind {
            Kind::Function => "FUNCTION",
            Kind::Procedure => "PROCEDURE",
        }
    }

    /// Its signature as `name(types)`, the form the catalog check compares.
    pub fn signature(&self) -> String {
        format!("{}({})", self.name, self.arguments)
    }

    /// Its name with its schema for SQL, `@extschema@` standing for the extension's schema.
    pub fn qualified_name(&self) -> String {
        match self.schema {
            Schema::Extension => format!("@extschema@.{}", self.name),
            Schema::RateLimit => format!("rate_limit.{}", self.name),
        }
    }

    /// Its signature for SQL with `@extschema@` standing for the extension's schema, types without spaces
    /// (`rate_limit.take(text,text,integer)`), as Citus's `create_distributed_function` takes it.
    pub fn qualified_signature(&self) -> String {
        format!(
            "{}({})",
            self.qualified_name(),
            self.arguments.replace(", ", ",")
        )
    }

    /// The names of its parameters, in order (`policy, key, cost`).
    pub fn parameter_names(&self) -> Vec<&'static str> {
        if self.parameters.is_empty() {
            return Vec::new();
        }
        self.parameters
            .split(", ")
            .map(|p| p.split(' ').next().unwrap_or(p))
            .collect()
    }

    /// States its parameters and result.
    const fn declared(self, parameters: &'static str, result: &'static str) -> Function {
        Function {
            parameters,
            result,
            ..self
        }
    }

    /// States that the library defines it, with its symbol and attributes.
    const fn in_c(self, symbol: &'static str, attributes: &'static str) -> Function {
        Function {
            body: Body::C { symbol, attributes },
            ..self
        }
    }

    /// States the version that first created it.
    const fn since(self, since: &'static str) -> Function {
        Function { since, ..self }
    }

    /// States that it is a procedure.
    const fn procedure(self) -> Function {
        Function {
            kind: Kind::Procedure,
            ..self
        }
    }

    /// States that a call takes tokens.
    const fn takes_tokens(self) -> Function {
        Function {
            takes_tokens: true,
            ..self
        }
    }

    /// States its comment.
    const fn commented(self, comment: &'static str) -> Function {
        Function { comment, ..self }
    }
}

const fn call(
    name: &'static str,
    arguments: &'static str,
    access: Access,
    route: Route,
    doc: &'static str,
) -> Function {
    Function {
        name,
        arguments,
        schema: Schema::RateLimit,
        access,
        purpose: Use::Call,
        key: None,
        route,
        doc: Some(doc),
        ..Function::UNDECLARED
    }
}

const fn keyed(
    name: &'static str,
    arguments: &'static str,
    access: Access,
    key: &'static str,
    doc: &'static str,
) -> Function {
    Function {
        key: Some(key),
        ..call(name, arguments, access, Route::KeysPartition, doc)
    }
}

const fn internal(name: &'static str, arguments: &'static str, access: Access) -> Function {
    Function {
        name,
        arguments,
        schema: Schema::RateLimit,
        access,
        purpose: Use::Internal,
        key: None,
        route: Route::NotForwarded,
        doc: None,
        ..Function::UNDECLARED
    }
}

/// Every function of the extension, the calls first (the `#[pg_test]` `the_surface_is_the_catalog`
/// checks that list against the catalog).
pub fn functions() -> impl Iterator<Item = &'static Function> {
    calls::CALLS
        .iter()
        .chain(admin::ADMIN)
        .chain(calls::TRIGGERS)
        .chain(internal::INTERNAL)
}

/// The functions that name one key: `(qualified signature, key parameter)`, for Citus's delegation.
pub fn keyed_functions() -> impl Iterator<Item = (String, &'static str)> {
    functions().filter_map(|f| f.key.map(|key| (f.qualified_signature(), key)))
}
