//! The SQL surface in one table: every function the extension creates, who may call it, whether it names
//! one key (and so is delegated by Citus and forwarded by the router to that key's node), and where the
//! reference documents it.
//!
//! What reads it: Citus's list of delegated functions (`cluster::citus`) is made from it; a `#[pg_test]`
//! checks it against the catalog (every function of the extension is here and nothing else, with its
//! privileges as `sql/finalize.sql` grants them, a comment, and its key among its parameter names); the
//! integration tests check the PL/Proxy router's `calls()`, the untyped-parameter client test and the
//! reference's index against it. A new function is one entry here, and those tests say what else it needs.
//!
//! Plain Rust with no imports, so that the integration tests include this very file.

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

/// One function of the SQL surface.
#[derive(Clone, Copy, Debug)]
pub struct Function {
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
}

impl Function {
    /// Its signature as `name(types)`, the form the catalog check compares.
    pub fn signature(&self) -> String {
        format!("{}({})", self.name, self.arguments)
    }

    /// Its signature for SQL with `@extschema@` standing for the extension's schema, types without spaces
    /// (`rate_limit.take(text,text,integer)`), as Citus's `create_distributed_function` takes it.
    pub fn qualified_signature(&self) -> String {
        let schema = match self.schema {
            Schema::Extension => "@extschema@",
            Schema::RateLimit => "rate_limit",
        };
        format!(
            "{schema}.{}({})",
            self.name,
            self.arguments.replace(", ", ",")
        )
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
    }
}

/// Every function of the extension (the `#[pg_test]` `the_surface_is_the_catalog` checks that list).
pub const FUNCTIONS: &[Function] = &[
    Function {
        name: "rate_limiting_request",
        arguments: "text, integer, integer",
        schema: Schema::Extension,
        access: Access::Public,
        purpose: Use::Call,
        key: Some("id"),
        route: Route::KeysPartition,
        doc: Some("#rate_limiting_request"),
    },
    keyed(
        "peek_request",
        "text, integer, integer",
        Access::Public,
        "id",
        "#rate_limitpeek_request-rate_limittokens",
    ),
    keyed(
        "tokens",
        "text, integer, integer",
        Access::Public,
        "id",
        "#rate_limitpeek_request-rate_limittokens",
    ),
    keyed("reset_request", "text", Access::Owner, "id", "#resets"),
    keyed(
        "take",
        "text, text, integer",
        Access::Public,
        "key",
        "#rate_limittake",
    ),
    call(
        "take_many",
        "text[], text[], integer",
        Access::Public,
        Route::FirstKeysPartition,
        "#rate_limittake_many",
    ),
    call(
        "take_batch",
        "text, text[], integer[], boolean",
        Access::Public,
        Route::NotForwarded,
        "#rate_limittake_batch",
    ),
    keyed(
        "take_ad_hoc",
        "text, bigint, interval, bigint, integer",
        Access::Public,
        "key",
        "#rate_limittake_ad_hoc",
    ),
    keyed("peek", "text, text", Access::Public, "key", "#rate_limitpeek"),
    keyed(
        "wait",
        "text, text, integer, interval",
        Access::Public,
        "key",
        "#rate_limitwait",
    ),
    keyed(
        "charge",
        "text, text, bigint",
        Access::Public,
        "key",
        "#rate_limitcharge",
    ),
    keyed(
        "acquire",
        "text, text",
        Access::Public,
        "key",
        "#rate_limitacquire-rate_limitrelease",
    ),
    keyed(
        "release",
        "text, text, bigint",
        Access::Public,
        "key",
        "#rate_limitacquire-rate_limitrelease",
    ),
    keyed(
        "refund",
        "text, text, bigint",
        Access::Owner,
        "key",
        "#rate_limitrefund",
    ),
    keyed("reset", "text, text", Access::Owner, "key", "#resets"),
    keyed("reset_ad_hoc", "text", Access::Owner, "key", "#resets"),
    keyed(
        "block",
        "text, text, interval",
        Access::Owner,
        "key",
        "#blocks-rate_limitblock-rate_limitunblock",
    ),
    keyed(
        "unblock",
        "text, text",
        Access::Owner,
        "key",
        "#blocks-rate_limitblock-rate_limitunblock",
    ),
    call(
        "headers",
        "rate_limit.decision, text",
        Access::Public,
        Route::AnyPartition,
        "#rate_limitheaders",
    ),
    call(
        "create_policy",
        "text, bigint, interval, bigint, text, text, boolean, bigint, text, timestamp without time zone, \
         bigint, interval, jsonb",
        Access::Owner,
        Route::EveryPartition,
        "#policies",
    ),
    call(
        "alter_policy",
        "text, bigint, interval, bigint, text, boolean, bigint, text, timestamp without time zone, bigint, \
         interval, jsonb",
        Access::Owner,
        Route::EveryPartition,
        "#policies",
    ),
    call(
        "drop_policy",
        "text",
        Access::Owner,
        Route::EveryPartition,
        "#policies",
    ),
    call(
        "set_override",
        "text, text, bigint, interval, bigint, text, timestamp with time zone, text",
        Access::Owner,
        Route::EveryPartition,
        "#per-key-overrides",
    ),
    call(
        "clear_override",
        "text, text",
        Access::Owner,
        Route::EveryPartition,
        "#per-key-overrides",
    ),
    call(
        "purge",
        "",
        Access::Owner,
        Route::EveryPartition,
        "#rate_limitbuckets-rate_limitpurge",
    ),
    call(
        "clock_shift",
        "",
        Access::Public,
        Route::NotForwarded,
        "#rate_limitclock_shift",
    ),
    call(
        "memory_usage",
        "",
        Access::Public,
        Route::NotForwarded,
        "#rate_limitmemory_usage",
    ),
    call(
        "memory_shares",
        "",
        Access::Owner,
        Route::NotForwarded,
        "#rate_limitmemory_usage",
    ),
    call(
        "reset_stats",
        "",
        Access::Owner,
        Route::NotForwarded,
        "#rate_limitstats-rate_limittop_limited-rate_limitreset_stats",
    ),
    call(
        "reset_stats",
        "text",
        Access::Owner,
        Route::NotForwarded,
        "#rate_limitstats-rate_limittop_limited-rate_limitreset_stats",
    ),
    call(
        "distribute",
        "integer",
        Access::Owner,
        Route::NotForwarded,
        "#rate_limitdistribute",
    ),
    call(
        "nodes_of",
        "text[]",
        Access::Public,
        Route::NotForwarded,
        "#rate_limitnodes_of",
    ),
    call(
        "node_stats_rows",
        "",
        Access::Owner,
        Route::NotForwarded,
        "#rate_limitdistribute",
    ),
    call(
        "node_top_limited_rows",
        "",
        Access::Owner,
        Route::NotForwarded,
        "#rate_limitdistribute",
    ),
    call(
        "node_memory_buckets",
        "",
        Access::Owner,
        Route::NotForwarded,
        "#rate_limitdistribute",
    ),
    Function {
        name: "limit_writes",
        arguments: "",
        schema: Schema::RateLimit,
        access: Access::Public,
        purpose: Use::UserTrigger,
        key: None,
        route: Route::NotForwarded,
        doc: Some("#rate_limitlimit_writes"),
    },
    Function {
        name: "policies_changed",
        arguments: "",
        schema: Schema::RateLimit,
        access: Access::Owner,
        purpose: Use::OwnTrigger,
        key: None,
        route: Route::NotForwarded,
        doc: None,
    },
    Function {
        name: "policies_dropped",
        arguments: "",
        schema: Schema::RateLimit,
        access: Access::Owner,
        purpose: Use::OwnTrigger,
        key: None,
        route: Route::NotForwarded,
        doc: None,
    },
    internal("memory_buckets", "", Access::Owner),
    internal("stats_rows", "", Access::Owner),
    internal("metrics_rows", "", Access::Monitor),
    internal("node_metrics_rows", "", Access::Monitor),
    internal("leases_held_rows", "", Access::Monitor),
    internal("purge_rows", "", Access::Monitor),
    internal("metrics_top_keys_rows", "", Access::Monitor),
    internal("top_limited_rows", "", Access::Owner),
    internal(
        "state_after_take",
        "bigint, timestamp with time zone, text, bigint, bigint, bigint, text, bigint, bigint, bigint, \
         timestamp with time zone, timestamp with time zone, bigint, timestamp with time zone",
        Access::Owner,
    ),
    internal(
        "state_tokens",
        "bigint, timestamp with time zone, text, bigint, bigint, bigint, timestamp with time zone",
        Access::Owner,
    ),
    internal(
        "state_is_full",
        "bigint, timestamp with time zone, text, bigint, bigint, bigint, timestamp with time zone",
        Access::Owner,
    ),
];

/// The functions that name one key: `(qualified signature, key parameter)`, for Citus's delegation.
pub fn keyed_functions() -> impl Iterator<Item = (String, &'static str)> {
    FUNCTIONS
        .iter()
        .filter_map(|f| f.key.map(|key| (f.qualified_signature(), key)))
}
